"""The target string and the replay command of an audit, written so that they run where the audit ran.

An audit started from Python (``assert_lossless(my_engine.sampling.verify)`` in a test) prints a
``specverify audit TARGET --seed S --budget B`` line that must reproduce it when pasted into a
shell in the same directory.  :func:`target_name` picks the form of ``TARGET``:

- a function from a file loaded by path (or from ``__main__``): the file's path;
- a function from ``package.module``: ``package.module:qualname`` when that module is found from
  the current directory or from the installed ``sys.path`` (site-packages, ``PYTHONPATH``), which
  :func:`specverify.auditing.loading.load_target` searches; otherwise — a module importable only
  because a test runner put its folder on ``sys.path`` — the path of the module's file, relative
  to the current directory when it lies under it (the loader puts the file's folder on
  ``sys.path``, so its own imports of modules next to it still work).
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_MODULE_PREFIX = "_specverify_target_"
"""The private module names :mod:`specverify.auditing.loading` gives ``.py`` files."""

DEFAULTS = {"level": "sampler", "alpha": 1e-3, "device": "cpu", "isolation": "process"}
"""Options left out of the replay line when they have these values (the CLI's defaults)."""

LEVEL_FLAGS = {"baseline": "--baseline", "model": "--model", "concurrency": "--concurrency",
               "deadline_s": "--deadline", "seeded_determinism": "--seeded-determinism",
               "context_length": "--context-length", "request_space": "--no-request-space",
               "request_space_only": "--request-space-only"}
"""The command-line flag of each keyword a level's battery takes (the endpoint level's)."""

LEVEL_DEFAULTS = {"baseline": None, "model": None, "concurrency": 4, "deadline_s": None, "seeded_determinism": False,
                  "context_length": None, "request_space": True, "request_space_only": False}
"""A level keyword with this value is left out of the replay line (the CLI's defaults)."""


def _installed_roots() -> list[Path]:
    """``sys.path`` entries a fresh ``specverify`` process also has: the interpreter's library
    and site folders and ``PYTHONPATH`` (not the folders a test runner inserted)."""
    roots = [sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    roots += list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    roots += [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return [Path(root).resolve() for root in roots if root]


def _module_root(module_name: str, module_file: Path) -> Path | None:
    """The ``sys.path`` entry ``module_file`` was imported from as ``module_name`` (None if it does not fit)."""
    parts = module_name.split(".")
    folder = module_file.parent if module_file.name != "__init__.py" else module_file.parent.parent
    for _ in parts[:-1]:
        folder = folder.parent
    expected = folder.joinpath(*parts)
    if module_file.with_suffix("") == expected or module_file.parent == expected:
        return folder
    return None


def _display_path(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def target_name(fn: Callable[..., Any] | str) -> str:
    """A target string for ``fn`` that :func:`~specverify.auditing.loading.load_target` resolves
    from the current directory (see the module docstring); strings are returned unchanged."""
    if isinstance(fn, str):
        return fn
    module_name = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", type(fn).__name__)
    module = sys.modules.get(module_name)
    module_file = getattr(module, "__file__", None)
    if module_file is None:
        return f"{module_name}:{qualname}"
    path = Path(module_file).resolve()
    if module_name.startswith(FILE_MODULE_PREFIX) or module_name == "__main__":
        return f"{_display_path(path)}:{qualname}"
    root = _module_root(module_name, path)
    if root is not None and (root == Path.cwd().resolve() or root in _installed_roots()
                             or any(root.is_relative_to(installed) for installed in _installed_roots()
                                    if installed.name in ("site-packages", "dist-packages"))):
        return f"{module_name}:{qualname}"
    if root is not None and _importable_through_pth(module_name):
        return f"{module_name}:{qualname}"
    return f"{_display_path(path)}:{qualname}"


def _importable_through_pth(module_name: str) -> bool:
    """Whether the top-level package is found through an installed ``.pth`` path (editable installs)."""
    top = module_name.split(".")[0]
    for installed in _installed_roots():
        for pth in installed.glob("*.pth") if installed.is_dir() else ():
            try:
                lines = pth.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                entry = Path(line.strip())
                if line.strip() and not line.startswith(("#", "import")) and (
                        (entry / top).is_dir() or (entry / f"{top}.py").is_file()):
                    return True
    # Editable installs through a finder module (setuptools' __editable__ finders) map the name directly.
    return any(type(finder).__name__.startswith("_EditableFinder") and finder.find_spec(top, None) is not None
               for finder in sys.meta_path if hasattr(finder, "find_spec"))


def replay_command(target: str, *, level: str, seed: int, budget: str, alpha: float,
                   checks: tuple[str, ...] | None = None, fail_fast: bool | None = None,
                   allow_underpowered: bool = False, device: str = "cpu", timeout_s: float | None = None,
                   isolation: str = "process", level_options: dict[str, Any] | None = None) -> str:
    """``specverify audit TARGET [--level L] --seed S --budget B [--alpha A] [--device D]
    [--timeout T] [--isolation none] [the level's options] [--checks C1,C2] [--fail-fast |
    --no-fail-fast] [--allow-underpowered]``: every option that changes what the audit does, each
    left out where it has the CLI's default (fail-fast: the budget's default); numbers written
    with the digits they need to round-trip."""
    from specverify.auditing.defaults import DEFAULT_TIMEOUT_S, default_fail_fast

    parts = ["specverify", "audit", _quoted(target)]
    if level != DEFAULTS["level"]:
        parts += ["--level", level]
    parts += ["--seed", str(seed), "--budget", budget]
    if alpha != DEFAULTS["alpha"]:
        parts += ["--alpha", _number(alpha)]
    if device != DEFAULTS["device"]:
        parts += ["--device", _quoted(device)]
    if timeout_s is not None and timeout_s != DEFAULT_TIMEOUT_S:
        parts += ["--timeout", _number(timeout_s)]
    if isolation != DEFAULTS["isolation"]:
        parts += ["--isolation", isolation]
    for keyword, value in (level_options or {}).items():
        if keyword not in LEVEL_FLAGS:
            raise ValueError(f"level_options: {keyword!r} has no command-line flag; known: {', '.join(LEVEL_FLAGS)}")
        if value == LEVEL_DEFAULTS[keyword]:
            continue
        flag = LEVEL_FLAGS[keyword]
        text = _number(value) if isinstance(value, float) else str(value)
        parts += [flag] if isinstance(value, bool) else [flag, _quoted(text)]  # a switch: its non-default value
    if checks is not None:
        parts += ["--checks", _quoted(",".join(checks))]
    if fail_fast is not None and fail_fast != default_fail_fast(budget):
        parts.append("--fail-fast" if fail_fast else "--no-fail-fast")
    if allow_underpowered:
        parts.append("--allow-underpowered")
    return " ".join(parts)


def _number(value: float) -> str:
    """``value`` with the digits it needs to round-trip."""
    return f"{value:g}" if float(f"{value:g}") == value else repr(value)


def _quoted(text: str) -> str:
    import shlex

    return shlex.quote(text)


def import_code(target: str, level: str = "sampler") -> tuple[str, str]:
    """``(code, name)``: Python lines that bind the function of ``target`` to ``name`` the way the
    user's own test would, without specverify's loader: ``from my_engine.sampling import verify``
    for ``my_engine.sampling:verify``; :mod:`importlib` from the file for ``path/file.py:verify``
    (its folder first on ``sys.path``, as the audit's loader does); the defining module of a
    built-in name; the catalog's table for ``catalog:NAME``."""
    from specverify.auditing.loading import BUILTINS, catalog_key

    if target in BUILTINS.get(level, {}):
        target = BUILTINS[level][target]
    if target.startswith("catalog:"):
        table = ("specverify.auditing.tree.catalog", "TREE_CATALOG") if level == "tree" else \
            ("specverify.auditing.sampler.catalog", "CATALOG")
        key = target.split(":", 1)[1] if level == "tree" else catalog_key(target.split(":", 1)[1])
        return f"from {table[0]} import {table[1]}\n\nverify = {table[1]}[{key!r}].fn", "verify"
    location, attribute = target.rsplit(":", 1)
    if location.endswith(".py") or "/" in location or "\\" in location:
        folder = str(Path(location).parent) or "."
        return (f"import importlib.util\nimport sys\n\n"
                f"sys.path.insert(0, {folder!r})  # the modules next to it import, as when the audit loaded it\n"
                f"_spec = importlib.util.spec_from_file_location({Path(location).stem!r}, {location!r})\n"
                f"_module = importlib.util.module_from_spec(_spec)\n"
                f"_spec.loader.exec_module(_module)\n"
                f"{_python_name(attribute)} = _module.{attribute}", _python_name(attribute))
    if attribute.isidentifier():
        return f"from {location} import {attribute}", attribute
    return f"import {location}\n\nverify = {location}.{attribute}", "verify"


def _python_name(attribute: str) -> str:
    return attribute if attribute.isidentifier() else "verify"
