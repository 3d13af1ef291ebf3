"""`pytest -m engines`: every built-in engine target audited with its CI plan
(specverify.engines.AUDIT_PLANS; `python -m specverify.engines` prints them as commands).

Torch paths take the whole quick battery; Triton paths, run by Triton's interpreter without a GPU,
take the exact check where the kernel takes its coins as tensors and otherwise the stated subset at
the stated sample count (the report gives each check's detectable TV).  Plans outside CI's time
share (``in_ci=False``) are also marked ``slow``: CI runs ``-m "(server or engines) and not slow"``;
a plan whose production-shape checks CI leaves to another target of its engine
(``production_shapes_in_ci=False``) runs without them in CI and whole under ``slow``.  A target whose engine is not
installed skips with the install command; with CUDA the Triton targets run the compiled kernels."""

from __future__ import annotations

import pytest
import torch

from specverify.auditing.runner import audit
from specverify.engines import AUDIT_PLANS, AUDITED_VERSIONS, TRITON_TIMEOUT_S, checks_without_production_shapes
from specverify.engines.environment import INSTALL_HINTS, installed_version

pytestmark = pytest.mark.engines


def _plan_params() -> list:
    """Every plan whole, and the plans CI runs without their production-shape checks, longest
    first: the interpreted Triton plans, then the torch plans, then those without production
    shapes (seconds each), so that CI's workers (`-n 3 --dist loadgroup`) end together."""
    whole, partial = [], []
    for plan in sorted(AUDIT_PLANS, key=lambda plan: not plan.interpreted):
        whole_in_ci = plan.in_ci and plan.production_shapes_in_ci
        whole.append(pytest.param(plan, False, id=plan.target, marks=() if whole_in_ci else pytest.mark.slow))
        if plan.in_ci and not plan.production_shapes_in_ci:
            partial.append(pytest.param(plan, True, id=f"{plan.target}-without-production-shapes"))
    return whole + partial


@pytest.mark.parametrize(("plan", "without_production_shapes"), _plan_params())
def test_engine_target_passes_its_audit(plan, without_production_shapes):
    version = installed_version(plan.engine)
    if version is None:
        pytest.skip(f"{plan.engine} is not installed ({INSTALL_HINTS[plan.engine]})")
    if version != AUDITED_VERSIONS[plan.engine]:
        pytest.skip(f"{plan.engine} {version} is installed; its plan is for {AUDITED_VERSIONS[plan.engine]}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not plan.runs_interpreted:
        pytest.skip(f"{plan.target}: {plan.note}")
    checks = checks_without_production_shapes(plan.target) if without_production_shapes else plan.checks
    report = audit(plan.target, level=plan.level, budget=plan.budget, checks=checks, device=device,
                   timeout_s=TRITON_TIMEOUT_S if plan.interpreted else 60.0)
    assert report.exit_code == 0, report.explain()
