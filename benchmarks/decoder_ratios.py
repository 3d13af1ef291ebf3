"""The reference decoder against Hugging Face on the same work: a speed ratio per prompt and its geomean.

Reads pytest-benchmark JSON files of ``benchmarks/test_bench_decoders.py`` and prints a markdown
table: for every model and comparison (reference method, Hugging Face method with the same
drafter and γ), per prompt the reference's and HF's time, the ratio ``t(HF) / t(reference)``
(> 1: the reference is faster) and both decoders' tokens per target pass, then the geometric mean
of the ratios over the prompts.  Several files are pooled per benchmark by the median of their
medians (runs of one machine at different moments).

    python benchmarks/decoder_ratios.py run-a.json run-b.json run-c.json > table.md
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

COMPARISONS = (
    ("prompt lookup, reference default policy", "reference-prompt-lookup", "hf-prompt-lookup"),
    ("prompt lookup, earliest (HF's drafts)", "reference-prompt-lookup-earliest", "hf-prompt-lookup"),
    ("prompt lookup, latest", "reference-prompt-lookup-latest", "hf-prompt-lookup"),
    ("prompt lookup, longest", "reference-prompt-lookup-longest", "hf-prompt-lookup"),
    ("draft model", "reference-draft-model", "hf-draft-model"),
    ("early exit", "reference-early-exit", "hf-early-exit"),
)
"""(label, reference method, Hugging Face method): pairs that do the same work."""


def pooled_runs(paths: Sequence[Path]) -> tuple[dict[tuple[str, int, str], dict], list[str]]:
    """``{(model, prompt, method): {"seconds", "tokens_per_pass", "matches_plain", "runs"}}`` and one
    line per file (its load average at the start and its clock)."""
    times: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    extras: dict[tuple[str, int, str], dict] = {}
    machines = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        machine = data.get("machine_info", {}).get("specverify", {})
        load = machine.get("load_average_at_start")
        machines.append(f"{Path(path).name}: load average at start {load}, clock {machine.get('clock')}, "
                        f"{machine.get('cpu_count')} CPUs, torch threads {machine.get('torch_threads')}")
        for bench in data["benchmarks"]:
            extra = bench["extra_info"]
            if extra.get("suite") != "decoders":
                continue
            key = (extra["model"], int(extra["prompt_index"]), extra["method"])
            times[key].append(bench["stats"]["median"])
            extras[key] = extra
    pooled = {
        key: {"seconds": statistics.median(values), "tokens_per_pass": extras[key]["tokens_per_target_pass"],
              "matches_plain": extras[key]["matches_plain"], "runs": len(values)}
        for key, values in times.items()
    }
    return pooled, machines


def ratio_table(pooled: dict[tuple[str, int, str], dict]) -> list[str]:
    """The markdown rows: one per (model, comparison, prompt) and a geomean row per (model, comparison)."""
    lines = ["| model | comparison | prompt | reference s | HF s | HF s / reference s | reference tokens/pass | "
             "HF tokens/pass | both equal plain greedy | runs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    models = sorted({model for model, _, _ in pooled})
    for model in models:
        prompts = sorted({prompt for m, prompt, _ in pooled if m == model})
        for label, reference, hf in COMPARISONS:
            ratios = []
            for prompt in prompts:
                ours, theirs = pooled.get((model, prompt, reference)), pooled.get((model, prompt, hf))
                if ours is None or theirs is None:
                    continue
                ratio = theirs["seconds"] / ours["seconds"]
                ratios.append(ratio)
                equal = "yes" if ours["matches_plain"] and theirs["matches_plain"] else "NO"
                lines.append(f"| {model} | {label} | {prompt} | {ours['seconds']:.3f} | {theirs['seconds']:.3f} | "
                             f"{ratio:.3f} | {ours['tokens_per_pass']:.3f} | {theirs['tokens_per_pass']:.3f} | "
                             f"{equal} | {min(ours['runs'], theirs['runs'])} |")
            if ratios:
                geomean = math.exp(statistics.fmean(math.log(r) for r in ratios))
                lines.append(f"| {model} | {label} | **geomean** | | | **{geomean:.3f}** | | | | |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON files of test_bench_decoders.py")
    args = parser.parse_args(argv)
    pooled, machines = pooled_runs(args.runs)
    print("\n".join([*(f"- {line}" for line in machines), "", *ratio_table(pooled)]))


if __name__ == "__main__":
    main()
