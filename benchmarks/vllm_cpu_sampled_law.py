"""Direct Monte Carlo: the law of sampled tokens on a vLLM CPU draft-model candidate vs its baseline.

Starts a baseline vLLM CPU server and a draft-model candidate over the tiny target
(:mod:`specverify.testing.vllm_servers`, :mod:`specverify.hf.server_checkpoints`), sends each the same
N requests (one prompt, ``temperature`` 1, no top-k or top-p, ``max_tokens`` 3, request i seeded
with i) and compares, position by position, the law of the completion's token: χ² homogeneity over
the 12 tokens most frequent on either server plus the rest in one cell (scipy's
``chi2_contingency``).  Token 1 comes from the plain sampler on both servers (the step after the
prefill has no drafts); tokens 2 and 3 go through the candidate's rejection sampler.  Writes the
counts, the tests and the candidate's ``spec_decode`` counters to OUT as JSON.

    python benchmarks/vllm_cpu_sampled_law.py --samples 600 --out /tmp/vllm-sampled-law.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROMPT = "The history of the printing press begins in"
TOKENS = 3
CELLS = 12


def completion_tokens(url: str, seed: int) -> list[str]:
    import httpx

    body = {"model": "model", "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 1.0, "seed": seed, "logprobs": 1}
    response = httpx.post(url + "/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["logprobs"]["tokens"]


def homogeneity(baseline: collections.Counter, candidate: collections.Counter, samples: int) -> dict[str, object]:
    """χ² homogeneity of two token counts over the most frequent tokens plus one cell for the rest."""
    from scipy.stats import chi2_contingency

    tokens = [token for token, _ in (baseline + candidate).most_common(CELLS)]
    rows = [
        [counts[token] for token in tokens] + [samples - sum(counts[token] for token in tokens)]
        for counts in (baseline, candidate)
    ]
    columns = [column for column in zip(*rows) if sum(column) > 0]
    statistic, p_value, dof, _ = chi2_contingency([list(row) for row in zip(*columns)])
    return {
        "chi2": round(float(statistic), 1),
        "dof": int(dof),
        "p": float(p_value),
        "baseline_top": baseline.most_common(4),
        "candidate_top": candidate.most_common(4),
    }


def main() -> int:
    from specverify.hf.server_checkpoints import write_tiny_target_and_draft
    from specverify.testing.vllm_servers import draft_model_config, vllm_servers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    target, draft = write_tiny_target_and_draft(Path(tempfile.gettempdir()) / "specverify-tiny-server-models")
    result: dict[str, object] = {"samples": args.samples, "prompt": PROMPT}
    with vllm_servers(target, {"baseline": None, "draft_model": draft_model_config(draft)}) as urls:
        drawn = {}
        for name, url in urls.items():
            started = time.monotonic()
            with ThreadPoolExecutor(4) as pool:
                drawn[name] = list(pool.map(lambda seed, url=url: completion_tokens(url, seed), range(args.samples)))
            result[f"{name}_wall_s"] = round(time.monotonic() - started, 1)
        for position in range(TOKENS):
            baseline, candidate = (
                collections.Counter(tokens[position] for tokens in drawn[name]) for name in ("baseline", "draft_model")
            )
            result[f"token{position + 1}"] = homogeneity(baseline, candidate, args.samples)
        import httpx

        metrics = httpx.get(urls["draft_model"].removesuffix("/v1") + "/metrics", timeout=30).text
        result["spec_decode"] = [
            line
            for line in metrics.splitlines()
            if line.startswith("vllm:spec_decode_num_") and "_total{" in line and "per_pos" not in line
        ]
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
