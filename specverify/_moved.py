"""Old import paths of modules that moved when the package was grouped by purpose (0.2).

``import specverify.rules`` and ``from specverify.battery import CheckResult`` keep working: a
meta-path finder resolves each old name in :data:`MOVED` to the module at its new path and
registers that very module object under the old name as well, so both names share one module
(its classes, its state, ``isinstance`` checks).  New code should use the new paths, listed in
docs/ARCHITECTURE.md.

``specverify.audit`` is the function :func:`specverify.auditing.runner.audit`; the old *module*
path ``specverify.audit`` (``from specverify.audit import AuditReport``) resolves to a callable
alias of :mod:`specverify.auditing.runner`, so that importing it never shadows the function.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

MOVED: dict[str, str] = {
    "specverify.rules": "specverify.core.rules",
    "specverify.processing": "specverify.core.processing",
    "specverify.chains": "specverify.core.chains",
    "specverify.exact": "specverify.core.exact",
    "specverify.stats": "specverify.core.stats",
    "specverify.speedup": "specverify.core.speedup",
    "specverify.seeding": "specverify.core.seeding",
    "specverify.strategies": "specverify.testing.strategies",
    "specverify.harness": "specverify.testing.harness",
    "specverify.pytest_plugin": "specverify.testing.pytest_plugin",
    "specverify.battery": "specverify.auditing.sampler",
    "specverify.decoder_battery": "specverify.auditing.decoder",
    "specverify.faults": "specverify.auditing.faults",
    "specverify.catalog": "specverify.auditing.catalog",
    "specverify.loading": "specverify.auditing.loading",
    "specverify.report_terminal": "specverify.auditing.report_terminal",
    "specverify.report_json": "specverify.auditing.report_json",
    "specverify.report_html": "specverify.auditing.report_html",
    "specverify.cli_audit": "specverify.cli.audit",
    "specverify.cli_models": "specverify.cli.models",
    "specverify.cli_speedup": "specverify.cli.speedup",
    "specverify.adapters": "specverify.hf",
    "specverify.adapters.hf_sampler": "specverify.hf.sampler_adapter",
    "specverify.adapters.hf_generate": "specverify.hf.generate_adapter",
    "specverify.tiny_models": "specverify.hf.tiny_models",
    "specverify.models": "specverify.hf.packaged",
    "specverify.divergence": "specverify.hf.divergence",
    "specverify.audit": "specverify.auditing.runner",
}
"""Old module path -> new module path."""


class _CallableModule(types.ModuleType):
    """The old ``specverify.audit`` module: a module that is also the ``audit`` function."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.audit(*args, **kwargs)


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.new_name)
        if spec.name == "specverify.audit":
            alias = _CallableModule(spec.name, module.__doc__)
            alias.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
            return alias
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the new module is already executed."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(MOVED[fullname]))


def install() -> None:
    """Register the finder once (idempotent)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
