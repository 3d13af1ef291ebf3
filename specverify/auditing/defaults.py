"""The audit's defaults, levels and exit statuses, importable without torch (the CLI's parser
reads them; :mod:`specverify.auditing.runner` re-exports every name)."""

from __future__ import annotations

LEVELS: dict[str, str] = {
    "sampler": "specverify.auditing.sampler:SamplerBattery",
    "decoder": "specverify.auditing.decoder:DecoderBattery",
    "tree": "specverify.auditing.tree:TreeBattery",
    "endpoint": "specverify.auditing.endpoint.battery:EndpointBattery",
}
"""Audit level -> ``module:class`` of its battery (instantiated without arguments)."""

DEFAULT_ALPHA = 1e-3
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUDGET = "standard"
BUDGET_ENV = "SPECVERIFY_BUDGET"
"""Environment variable naming the budget of an audit called without ``budget=`` (CLI and Python;
the pytest plugin's ``--specverify-budget`` sets it for the run)."""

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
