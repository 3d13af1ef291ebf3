"""The audit's defaults, levels and exit statuses, importable without torch (the CLI's parser
reads them; :mod:`specverify.auditing.runner` re-exports every name)."""

from __future__ import annotations

from enum import StrEnum

LEVELS: dict[str, str] = {
    "sampler": "specverify.auditing.sampler.battery:SamplerBattery",
    "decoder": "specverify.auditing.decoder.battery:DecoderBattery",
    "tree": "specverify.auditing.tree.battery:TreeBattery",
    "endpoint": "specverify.auditing.endpoint.battery:EndpointBattery",
}
"""Audit level -> ``module:class`` of its battery (instantiated without arguments)."""

DEFAULT_ALPHA = 1e-3
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUDGET = "standard"
BUDGET_ENV = "SPECVERIFY_BUDGET"
"""Environment variable naming the budget of an audit called without ``budget=`` (CLI, Python and
the pytest plugin's fixtures when ``--specverify-budget`` is not given); specverify only reads it."""
VERBOSE_ENV = "SPECVERIFY_VERBOSE"
"""Set to 1 for the long ``AssertionError`` of ``assert_lossless`` (every finding with its inputs,
n, p-value and TV); the pytest plugin sets it under ``pytest -vv``."""

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


class AuditVerdict(StrEnum):
    """An audit's verdict: its value is the phrase the reports print, :attr:`exit_code` the exit
    status of ``specverify audit`` (0 pass, 1 a loss or a broken contract, 2 no verdict)."""

    NO_LOSS_DETECTED = "no loss detected"
    LOSS_DETECTED = "loss detected"
    CONTRACT_VIOLATED = "contract violated"
    UNDERPOWERED = "underpowered"
    COULD_NOT_AUDIT = "could not audit"

    @property
    def exit_code(self) -> int:
        if self is AuditVerdict.NO_LOSS_DETECTED:
            return EXIT_PASS
        if self in (AuditVerdict.LOSS_DETECTED, AuditVerdict.CONTRACT_VIOLATED):
            return EXIT_FAIL
        return EXIT_ERROR


POWER_CEILING_TV: dict[str, float] = {"sampler": 0.25, "tree": 0.25, "decoder": 0.25, "endpoint": 0.25}
"""Per level: the largest TV a passing audit may be unable to detect (every statistical check must
detect TV ≤ this with power 0.99, :mod:`specverify.auditing.power`).  A fixed budget that falls
short ends in exit 2 ("underpowered") unless ``--allow-underpowered``.  The quick budget of every
level is within it (sampler and tree 0.05, decoder 0.05 per position, endpoint 0.1 / 0.2)."""

FAIL_FAST_BUDGETS = frozenset({"quick", "standard"})
"""Budgets whose audits stop at the first failing check unless told otherwise (``fail_fast=``,
``--no-fail-fast``): a gate wants the verdict, not the whole pattern.  ``thorough`` and fixed
budgets (N samples per check) run every check, which the diagnosis needs."""

FAIL_FAST_SKIP = "not run: the audit stopped at the first failing check"
"""How a check skipped by fail-fast begins its message (the diagnosis and the reports read it)."""

LOCATING_CUT_SKIP = "not run: the locating checks' share of the post-verdict time was spent"
"""How a locating check begins its message when fail-fast ran it after the first failure but its
share of the post-verdict budget (:mod:`specverify.auditing.post_verdict`) ran out first."""


MALFORMED_SKIP = "not run: the audit stopped at the first malformed output"
"""How a check skipped after a malformed output begins its message: an output that breaks the
level's layout (docs/spec.md) is a bug of the adapter, the same in every later check, and leaves
nothing to judge, so the audit stops there with that one message (exit 2)."""


def default_fail_fast(budget_name: str) -> bool:
    """Whether an audit with the budget named ``budget_name`` stops at its first failing check by default."""
    return budget_name in FAIL_FAST_BUDGETS
