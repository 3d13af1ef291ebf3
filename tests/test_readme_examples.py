"""The README's examples, read from README.md and run exactly as printed.

- the CI example (the ```python block calling ``specverify.assert_lossless``) must use a fast
  stated budget, and passes as a test file of a project whose ``my_engine.sampling.verify`` is
  the reference rule;
- the printed first failure is what the CI example gives on a lossy rule (the diagnosis and a
  minimal failing case in the first message);
- the replay line of the printed failure (``replay with `specverify audit my_engine...```) runs,
  pasted in that project's root, as the installed console script would run it (the current
  directory is not on ``sys.path``) and reports the same failing checks (exit 1), not an import
  error;
- the README is a quick start: at most 150 lines, every ``docs/`` page it links exists;
- the set-up's main job (``specverify audit reference --html audit-report.html``) exits 0 and
  writes the page.

The runs take minutes, so they are ``slow``; the default run checks that the examples are there
and say what they cost.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = Path(os.environ.get("SPECVERIFY_README",
                             ROOT / "README.md")).read_text(encoding="utf-8")  # override: try proposed text
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("SPECVERIFY_BUDGET", None)


def fenced_blocks(language: str) -> list[str]:
    """The fenced code blocks of README.md whose info string is ``language`` ("" for plain ones)."""
    blocks, current, tag = [], None, None
    for line in README.splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current, tag = [], line[3:].strip()
            else:
                if tag == language:
                    blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def ci_example() -> str:
    blocks = [b for b in fenced_blocks("python") if "specverify.assert_lossless(" in b]
    if not blocks:
        pytest.fail("README.md has no ```python block calling specverify.assert_lossless")
    return blocks[0]


def replay_line() -> str:
    match = re.search(r"replay with `(specverify audit my_engine\.[^`]+)`", README)
    if match is None:
        pytest.skip("README.md does not show the first-failure excerpt with its replay line yet "
                    "(proposed in NOTES-newuser.md)")
    return match.group(1)


def main_job() -> str:
    for block in fenced_blocks("bash"):
        for line in block.splitlines():
            if "specverify audit reference --html" in line:
                command = line[line.index("specverify audit reference"):]
                return command.split(" #")[0].strip()  # without the line's comment (its time)
    pytest.fail("README.md's set-up has no `specverify audit reference --html ...` main job")


def make_project(root: Path) -> None:
    (root / "my_engine").mkdir(parents=True)
    (root / "my_engine" / "__init__.py").write_text("")
    (root / "my_engine" / "sampling.py").write_text(textwrap.dedent("""
        from specverify.auditing.sampler.catalog import CATALOG
        from specverify.core.rules import verify


        def verify_lossy(target_probs, draft_probs, draft_tokens, generator):
            return CATALOG["residual_is_target"].fn(target_probs, draft_probs, draft_tokens, generator)
    """))


def run_as_console_script(command: str, cwd: Path) -> subprocess.CompletedProcess:
    script = cwd.parent / "bin" / "specverify"
    script.parent.mkdir(exist_ok=True)
    script.write_text("import sys\nfrom specverify.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    words = shlex.split(command)
    assert words[0] == "specverify"
    return subprocess.run([sys.executable, str(script), *words[1:]], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=3000)


def test_ci_example_states_a_fast_budget():
    example = ci_example()
    compile(example, "README.md", "exec")
    if 'budget="quick"' not in example:
        pytest.skip("README.md's CI example does not show budget=\"quick\" yet (proposed in NOTES-newuser.md)")
    assert re.search(r"TV|detect", example), "the CI example should state the TV its budget detects"


@pytest.mark.slow
def test_ci_example_runs_as_printed(tmp_path):
    project = tmp_path / "project"
    make_project(project)
    (project / "test_readme_ci.py").write_text("import my_engine.sampling\n" + ci_example())
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_ci.py"],
                               capture_output=True, text=True, cwd=project, env=ENV, timeout=3000)
    assert completed.returncode == 0, completed.stdout[-3000:]


def first_failure() -> str:
    blocks = [b for b in fenced_blocks("") if "LOSS DETECTED" in b]
    if not blocks:
        pytest.fail("README.md shows no first-failure excerpt (a ``` block with LOSS DETECTED)")
    return blocks[0]


def test_readme_is_a_quick_start():
    assert len(README.splitlines()) <= 150
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / page).is_file(), page


@pytest.mark.slow
def test_first_failure_is_what_the_ci_example_prints(tmp_path):
    project = tmp_path / "project"
    make_project(project)
    example = ci_example().replace("my_engine.sampling.verify,", "my_engine.sampling.verify_lossy,")
    (project / "test_readme_ci.py").write_text("import my_engine.sampling\n" + example)
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_ci.py"],
                               capture_output=True, text=True, cwd=project, env=ENV, timeout=3000)
    assert completed.returncode == 1, completed.stdout[-3000:]
    printed = first_failure()
    headline, diagnosis = printed.splitlines()[0], printed.splitlines()[1]
    assert headline.split(": ", 1)[1] in completed.stdout
    assert diagnosis.split(" (Read from")[0] in completed.stdout.replace("\nE       ", " ")
    assert "minimal failing case" in completed.stdout and "def test_" in completed.stdout


@pytest.mark.slow
def test_replay_line_runs_where_the_test_ran(tmp_path):
    command = replay_line()
    project = tmp_path / "project"
    make_project(project)
    completed = run_as_console_script(command, project)
    assert completed.returncode == 1, completed.stdout[-2000:] + completed.stderr[-2000:]
    failed = command.split("--checks ")[1].split()[0]
    assert f"failed: {failed.replace(',', ', ')}" in completed.stdout  # the same checks fail again


@pytest.mark.slow
def test_main_job_runs_as_printed(tmp_path):
    command = main_job()
    completed = run_as_console_script(command, tmp_path)
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    page = shlex.split(command)[shlex.split(command).index("--html") + 1]
    assert (tmp_path / page).is_file()
