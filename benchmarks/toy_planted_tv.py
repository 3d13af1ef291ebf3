"""The TV a planted catalog rule causes on the endpoint toy server, as each endpoint check sees it.

Run: ``PYTHONPATH=$PWD python3 benchmarks/toy_planted_tv.py [RULE] [REQUESTS]`` (default
``draft_temperature_in_acceptance``, 2 500 requests: ~4 min on 2 cores).  In process (the toy's own
``generate``, no HTTP), the endpoint level's sampling prompts and settings:

- ``pit-T1-top8`` / ``pit-T0.7-top8``: the TV between the binned PIT values (10 equal cells plus
  "outside the top k") of the candidate's sampled tokens under the target's law and the uniform
  law: the deviation those checks are sized against (quick detects 0.1, standard 0.05);
- ``two-sample-top-p``: the TV between the candidate's and the baseline's joint law of the first
  2 tokens at T = 0.8, top-p 0.9, per prompt, on all cells (the check pools them into ≤ 16 cells,
  which can only lower it; quick detects 0.2, standard 0.1).

Both are plug-in estimates; their upward bias under no difference is printed beside them.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from specverify.auditing.endpoint.battery import PIT_TOKENS, SAMPLING_PROMPTS, TWO_SAMPLE_TOKENS
from specverify.auditing.endpoint.checks import PIT_BINS
from specverify.auditing.endpoint.pit import pit_value, processed_law, uniform_bins
from specverify.auditing.sampler.catalog import CATALOG
from specverify.testing.toy_server import ALPHABET, ToyConfig, ToyLM, ToyState, generate, tokenize


def _state(rule) -> ToyState:
    config = ToyConfig(speculative=rule is not None, rule=rule)
    return ToyState(config, ToyLM(0), ToyLM(0, scale=1.2, induction=1.5, noise=1.0))


def pit_tv(rule, temperature: float, requests: int) -> tuple[float, int]:
    state, uniforms, values = _state(rule), np.random.default_rng(1), []
    settings = {"temperature": temperature, "top_k": 8, "top_p": 1.0, "min_p": 0.0}
    for r in range(requests):
        context = tokenize(SAMPLING_PROMPTS[r % len(SAMPLING_PROMPTS)].text)
        for token in generate(state, list(context), PIT_TOKENS, settings, 10_000 + r,
                              {"draft_n": 0, "draft_n_accepted": 0}):
            law = state.target.logprobs(context)
            top = {ALPHABET[i]: float(law[i]) for i in np.argsort(-law)[:8]}
            u = pit_value(processed_law(top, temperature=temperature, top_k=8), ALPHABET[token], uniforms.random(),
                          tie_tolerance=1e-4)
            values.append(2.0 if u is None else u)
            context.append(token)
    values = np.array(values)
    counts = np.append(uniform_bins(values[values <= 1.0], PIT_BINS), int((values > 1.0).sum()))
    expected = np.append(np.full(PIT_BINS, 1.0 / PIT_BINS), 0.0) * len(values)
    return 0.5 * float(np.abs(counts - expected).sum()) / len(values), len(values)


def joint_tv(rule, requests: int) -> tuple[float, int]:
    laws = []
    for which, current in ((0, rule), (10**7, None)):
        state, law = _state(current), Counter()
        for r in range(requests):
            p = r % len(SAMPLING_PROMPTS)
            out = generate(state, tokenize(SAMPLING_PROMPTS[p].text), TWO_SAMPLE_TOKENS,
                           {"temperature": 0.8, "top_p": 0.9}, 77 + r + which, {"draft_n": 0, "draft_n_accepted": 0})
            law[(p, tuple(out))] += 1
        laws.append(law)
    cells = laws[0].keys() | laws[1].keys()
    return 0.5 * sum(abs(laws[0][c] - laws[1][c]) for c in cells) / requests, len(cells)


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "draft_temperature_in_acceptance"
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 2500
    rule = CATALOG[name].fn
    for temperature in (1.0, 0.7):
        tv, n = pit_tv(rule, temperature, requests)
        null, _ = pit_tv(None, temperature, requests)
        print(f"{name}: pit-T{temperature:g}-top8 binned-u TV {tv:.4f} (n = {n}; lossless candidate: {null:.4f})",
              flush=True)
    tv, cells = joint_tv(rule, 16 * requests)
    null, _ = joint_tv(None, 16 * requests)
    print(f"{name}: two-sample-top-p joint TV of the first {TWO_SAMPLE_TOKENS} tokens {tv:.4f} "
          f"({16 * requests} requests per server, {cells} cells; lossless candidate: {null:.4f})")


if __name__ == "__main__":
    main()
