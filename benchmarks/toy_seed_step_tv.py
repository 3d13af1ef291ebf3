"""The deviation the endpoint toy's ``seed_bug="step"`` causes, exactly, per context.

Run: ``PYTHONPATH=$PWD python3 benchmarks/toy_seed_step_tv.py`` (a few seconds).

With generators re-created from (seed, step), a step's draft i is drawn by inverse CDF (tokens in
vocabulary order) with the uniform c_i, and the acceptance test of draft i uses the same c_i:
accept iff c_i · q(x) < p(x).  For the first position of a step, with Q(x−) and Q(x) the ends of
x's CDF interval under the draft law q, the accepted mass of x is

    A(x) = |[Q(x−), Q(x)) ∩ [0, p(x)/q(x))|

instead of min(q(x), p(x)) (the residual token uses the step's last uniform, which drew no draft),
so the emitted law is A + (1 − Σ A) · r with r = (p − q)+ / Σ (p − q)+.  This prints its TV from p
at the contexts the endpoint checks sample (each prompt and the prefixes a sample of the target
reaches), for the settings they use.  The PIT pools those contexts by rank, where the signs of
these deviations differ from context to context; ``context-law-T1-top4`` counts per context.
"""

from __future__ import annotations

import numpy as np

from specverify.auditing.endpoint.battery import PROMPTS
from specverify.core.seeding import derive_seed
from specverify.testing.toy_server import ToyLM, V, process, tokenize


def first_position_tv(target: ToyLM, draft: ToyLM, context: list[int], temperature: float, top_k: int | None) -> float:
    """TV between the bug's law of a step's first emitted token and the target's processed law."""
    p = process(target.logprobs(context), temperature, top_k, None, None)
    q = process(draft.logprobs(context), temperature, top_k, None, None)
    upper = np.cumsum(q)
    lower = upper - q
    ratio = np.divide(p, q, out=np.zeros(V), where=q > 0)
    accepted = np.clip(np.minimum(upper, ratio) - lower, 0.0, None) * (q > 0)
    residual = np.clip(p - q, 0.0, None)
    emitted = accepted + (1.0 - accepted.sum()) * residual / residual.sum()
    return 0.5 * float(np.abs(emitted - p).sum())


def main() -> None:
    target, draft = ToyLM(0), ToyLM(0, scale=1.2, induction=1.5, noise=1.0)
    rng = np.random.default_rng(derive_seed("toy-seed-step-tv"))
    for temperature, top_k in ((1.0, 8), (0.7, 8), (1.0, 4)):
        values = []
        for prompt in PROMPTS:
            context = tokenize(prompt.text)
            for _ in range(20):
                values.append(first_position_tv(target, draft, context, temperature, top_k))
                law = process(target.logprobs(context), temperature, top_k, None, None)
                context = context + [int(rng.choice(V, p=law))]
        print(f"T={temperature:g}, top-k {top_k}: TV of a step's first token, over {len(values)} contexts: "
              f"mean {np.mean(values):.3f}, median {np.median(values):.3f}, max {np.max(values):.3f}")


if __name__ == "__main__":
    main()
