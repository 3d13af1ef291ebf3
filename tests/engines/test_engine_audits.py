"""`pytest -m engines`: every built-in engine target audited with its CI plan
(specverify.engines.AUDIT_PLANS; `python -m specverify.engines` prints them as commands).

Torch paths take the whole quick battery; Triton paths, run by Triton's interpreter without a GPU,
take the exact check where the kernel takes its coins as tensors and otherwise the stated subset at
the stated sample count (the report gives each check's detectable TV).  Plans outside CI's time
share (``in_ci=False``) are also marked ``slow``: CI runs ``-m "engines and not slow"``.  A target whose engine is not
installed skips with the install command; with CUDA the Triton targets run the compiled kernels."""

from __future__ import annotations

import pytest
import torch

from specverify.auditing.runner import audit
from specverify.engines import AUDIT_PLANS, AUDITED_VERSIONS, TRITON_TIMEOUT_S
from specverify.engines.environment import INSTALL_HINTS, installed_version

pytestmark = pytest.mark.engines


@pytest.mark.parametrize("plan", [pytest.param(plan, id=plan.target, marks=() if plan.in_ci else pytest.mark.slow)
                                  for plan in AUDIT_PLANS])
def test_engine_target_passes_its_audit(plan):
    version = installed_version(plan.engine)
    if version is None:
        pytest.skip(f"{plan.engine} is not installed ({INSTALL_HINTS[plan.engine]})")
    if version != AUDITED_VERSIONS[plan.engine]:
        pytest.skip(f"{plan.engine} {version} is installed; its plan is for {AUDITED_VERSIONS[plan.engine]}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not plan.runs_interpreted:
        pytest.skip(f"{plan.target}: {plan.note}")
    report = audit(plan.target, level=plan.level, budget=plan.budget, checks=plan.checks, device=device,
                   timeout_s=TRITON_TIMEOUT_S if plan.interpreted else 60.0)
    assert report.exit_code == 0, report.explain()
