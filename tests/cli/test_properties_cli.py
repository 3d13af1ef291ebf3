"""``specverify properties``: scoped to the tests that call the target, in parallel, with an estimate
from the measured durations, which cover every such test."""

from __future__ import annotations

import ast
from pathlib import Path

from specverify.cli import main
from specverify.cli.properties import SCOPED, WHOLE, command
from specverify.properties.timings import MEASURED_S, estimate

SUITE = Path(__file__).resolve().parents[2] / "specverify" / "properties"


def _pytest_option(words: list[str], option: str) -> list[str]:
    """The values of ``option`` in a ``python -m pytest ...`` command line (after ``pytest``)."""
    words = words[words.index("pytest") + 1 :]
    return [words[i + 1] for i, word in enumerate(words) if word == option]


def test_the_default_run_is_the_tests_that_call_the_target_on_workers():
    words = command("my.py:verify", workers=3)
    assert _pytest_option(words, "-m") == [SCOPED] and SCOPED == "uses_impl and not slow"
    assert _pytest_option(words, "-n") == ["3"] and "--specverify-impl=my.py:verify" in words
    assert _pytest_option(command("my.py:verify", workers=1), "-n") == []
    assert _pytest_option(command("my.py:verify", whole_suite=True), "-m") == [WHOLE]
    assert _pytest_option(command("my.py:verify", extra=["-m", "slow"]), "-m") == ["slow"]


def test_options_after_the_target_are_the_subcommands_and_after_dashes_pytests(monkeypatch):
    ran = []
    monkeypatch.setattr("subprocess.call", lambda words: ran.append(words) or 0)
    assert main(["properties", "my.py:verify", "-n", "1", "--whole-suite", "--", "-x", "-k", "bonus"]) == 0
    assert _pytest_option(ran[0], "-m") == [WHOLE] and ran[0][-3:] == ["-x", "-k", "bonus"]
    assert _pytest_option(ran[0], "-n") == []


def _tests_calling_the_target() -> set[str]:
    """``file::name`` of every test function in the suite that takes ``specverify_impl`` or ``uniform_rule``."""
    found = set()
    for path in SUITE.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                arguments = {a.arg for a in node.args.args}
                if arguments & {"specverify_impl", "uniform_rule"}:
                    found.add(f"{path.name}::{node.name}")
    return found


def test_the_measured_durations_cover_every_test_that_calls_the_target():
    measured = {name.split("[", 1)[0] for name in MEASURED_S}
    assert _tests_calling_the_target() <= measured, _tests_calling_the_target() - measured
    for name in measured:
        file, function = name.split("::")
        assert f"def {function}(" in (SUITE / file).read_text(encoding="utf-8"), name


def test_the_estimate_divides_the_tests_over_the_workers():
    one, four = estimate(1), estimate(4)
    assert one.startswith(f"estimate: {len(MEASURED_S)} tests call the implementation")
    assert float(four.split("~")[1].split(" min")[0]) < float(one.split("~")[1].split(" min")[0])


def test_other_subcommands_refuse_arguments_after_dashes(capsys):
    import pytest

    with pytest.raises(SystemExit) as exited:
        main(["audit", "reference", "--", "-x"])
    assert exited.value.code == 2 and "only `specverify properties` takes them" in capsys.readouterr().err
