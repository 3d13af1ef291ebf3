"""Real serving engines' verification code, unmodified, as built-in audit targets.

One module per engine, each an adapter from SPEC §1 (or §3) to the engine's own data layout that
calls the engine's function as the engine calls it, and re-implements none of its rule:

- :mod:`specverify.engines.vllm_engine` — vLLM 0.33.0, ``RejectionSampler.forward`` with a real
  ``Sampler`` for the bonus (Triton kernels);
- :mod:`specverify.engines.sglang_engine` — SGLang 0.5.23, DSpark's block-wise rejection (torch
  and Triton), the Triton chain sampler (classic and block verification), DFlash's greedy rule,
  the Triton greedy tree verifier;
- :mod:`specverify.engines.lmdeploy_engine` — lmdeploy 0.18.0, the portable
  ``DefaultRejectionSamplingImpl``.

Install an engine with the pure-Python packages its import chain needs (``engines.txt``, exact
pins, ``--no-deps``: the engines declare other torch versions, which a resolver would install over
yours)::

    pip install --no-deps -r engines.txt          # all three, with triton
    pip install specverify[vllm]                  # or: one engine's import chain, then
    pip install --no-deps vllm==0.33.0 triton==3.9.0

Without a GPU the Triton kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set by
:mod:`specverify.engines.environment`), at 18–230 rows per second in an audit instead of thousands: they get
the audit plan in :data:`AUDIT_PLANS` (the exact check where the kernel takes its coins as
tensors, otherwise a stated subset of checks at a stated sample count, whose detectable TV the
report prints).  With ``--device cuda`` the same targets run the compiled kernels and take the
full audit.
"""

from __future__ import annotations

from dataclasses import dataclass

# Engine distribution -> the version the adapters were written against and audited.
AUDITED_VERSIONS: dict[str, str] = {"vllm": "0.33.0", "sglang": "0.5.23", "lmdeploy": "0.18.0"}

# Engine -> what installs it and its import chain (pins: engines.txt, pyproject's extras).
INSTALL_HINTS: dict[str, str] = {
    "vllm": "pip install specverify[vllm] && pip install --no-deps vllm==0.33.0 triton==3.9.0",
    "sglang": "pip install specverify[sglang] && pip install --no-deps sglang==0.5.23 triton==3.9.0",
    "lmdeploy": "pip install specverify[lmdeploy] && pip install --no-deps lmdeploy==0.18.0",
}

# The checks a Triton path gets under the interpreter: a first draft, its correction and the
# bonus jointly (step-K2), the correction deep in a chain (correction-position), the bonus alone
# (bonus-position), decoding loops with K changing per call and sequences at different stages
# (decoding-loop-order1), the coupling bound (acceptance-rate), and the contract checks.
TRITON_CHECKS: tuple[str, ...] = ("randomness-source", "step-K2", "correction-position", "bonus-position",
                                  "decoding-loop-order1", "acceptance-rate", "inputs-unchanged")
# Samples per statistical check on an interpreted Triton path (TV 0.105-0.135 detectable at power 0.99).
TRITON_SAMPLES = 2000
# Interpreted kernels run one program at a time (~10-40 ms each): a call of 512 rows can take
# minutes on a loaded machine, so the per-call deadline is raised for them.
TRITON_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class AuditPlan:
    """How CI audits one built-in engine target without a GPU.

    ``budget``: ``quick`` or samples per check; ``checks``: None for the whole battery;
    ``interpreted``: its kernels are Triton run by the interpreter; ``runs_interpreted``: False
    when the interpreter cannot run it at all (the reason in ``note``); ``in_ci``: within CI's time
    share for engine audits (docs/setup.md, "What CI runs"); the others run with ``pytest -m engines``, CI's
    ``-m "(server or engines) and not slow"`` leaves them out, and each is covered in CI by a target of the same
    engine path that is in it (named in ``note``).  ``production_shapes_in_ci``: False where CI runs
    the plan without its production-shape checks (:attr:`specverify.auditing.checks.Check.production_shape`,
    minutes each on an engine's torch path at V = 151,936) because another target of the same engine
    runs them in CI (named in ``note``); the whole plan then runs with ``pytest -m engines``."""

    target: str
    engine: str
    level: str
    path: str
    budget: str | int
    checks: tuple[str, ...] | None
    interpreted: bool
    note: str = ""
    runs_interpreted: bool = True
    in_ci: bool = True
    production_shapes_in_ci: bool = True


AUDIT_PLANS: tuple[AuditPlan, ...] = (
    AuditPlan("lmdeploy", "lmdeploy", "sampler", "torch, random, draft probabilities", "quick", None, False,
              "random rows in CI through lmdeploy-mixed", in_ci=False),
    AuditPlan("lmdeploy-one-hot", "lmdeploy", "sampler", "torch, random, draft_probs=None", "quick", None, False,
              "production shapes in CI through lmdeploy-mixed", production_shapes_in_ci=False),
    AuditPlan("lmdeploy-greedy", "lmdeploy", "sampler", "torch, forward_greedy", "quick", None, False,
              "greedy rows in CI through lmdeploy-mixed", in_ci=False),
    AuditPlan("lmdeploy-mixed", "lmdeploy", "sampler", "torch, mixed greedy/random batch", "quick", None, False),
    AuditPlan("sglang", "sglang", "sampler", "torch, block-wise rejection, draft logits", "quick", None, False),
    AuditPlan("sglang-one-hot", "sglang", "sampler", "torch, block-wise rejection, one-hot draft", "quick", None,
              False, "production shapes in CI through sglang", production_shapes_in_ci=False),
    AuditPlan("sglang-greedy", "sglang", "sampler", "torch, DFlash greedy rule", "quick", None, False),
    AuditPlan("sglang-chain-triton", "sglang", "sampler", "Triton, chain sampler (coins as tensors)", TRITON_SAMPLES,
              ("exact-step",) + TRITON_CHECKS, True,
              "exact check: the kernel takes its coins as tensors; 864 s interpreted: the same kernel with block "
              "verification in CI through sglang-chain-block-triton", in_ci=False),
    AuditPlan("sglang-chain-block-triton", "sglang", "sampler", "Triton, chain sampler, block verification",
              TRITON_SAMPLES, TRITON_CHECKS, True),
    AuditPlan("sglang-triton-one-hot", "sglang", "sampler", "Triton, block-wise rejection, one-hot draft",
              TRITON_SAMPLES, TRITON_CHECKS, True,
              "504 s interpreted: the block-wise one-hot rule in CI through its torch path, sglang-one-hot",
              in_ci=False),
    AuditPlan("sglang-triton", "sglang", "sampler", "Triton, block-wise rejection, draft logits", "quick", None, True,
              "GPU only: its residual kernel calls libdevice.log1p, which Triton 3.9's interpreter lacks", False),
    AuditPlan("sglang-tree-greedy-triton", "sglang", "tree", "Triton, greedy tree verification", TRITON_SAMPLES,
              None, True),
    AuditPlan("vllm", "vllm", "sampler", "Triton, random, draft probabilities", TRITON_SAMPLES, TRITON_CHECKS, True,
              "random rows with draft probabilities in CI through vllm-mixed", in_ci=False),
    AuditPlan("vllm-no-draft-probs", "vllm", "sampler", "Triton, random, draft_probs=None", TRITON_SAMPLES,
              TRITON_CHECKS, True),
    AuditPlan("vllm-greedy", "vllm", "sampler", "Triton, all greedy", "quick", TRITON_CHECKS, True,
              "one light kernel program per request: the Triton checks at the quick budget; 309 s: greedy rows in "
              "CI through vllm-mixed", in_ci=False),
    AuditPlan("vllm-mixed", "vllm", "sampler", "Triton, mixed greedy/random batch", TRITON_SAMPLES, TRITON_CHECKS,
              True),
)


def checks_without_production_shapes(target: str) -> tuple[str, ...]:
    """The names of the sampler battery's checks for ``target`` that do not run at production shapes
    (the battery depends on what the function declares, so it is built for the function itself)."""
    from specverify.auditing.loading import load_target
    from specverify.auditing.sampler.battery import SamplerBattery

    battery = SamplerBattery()
    session = battery.open_session(load_target(target, "sampler"), device="cpu", timeout_s=60.0)
    try:
        return tuple(check.name for check in battery.checks(session) if not check.production_shape)
    finally:
        session.close()


def audit_command(plan: AuditPlan) -> str:
    """The ``specverify audit`` command line that runs ``plan``."""
    parts = ["specverify audit", plan.target]
    if plan.level != "sampler":
        parts.append(f"--level {plan.level}")
    parts.append(f"--budget {plan.budget}")
    if plan.checks is not None:
        parts.append("--checks " + ",".join(plan.checks))
    if plan.interpreted:
        parts.append(f"--timeout {TRITON_TIMEOUT_S:g}")
    return " ".join(parts)
