"""Turn saved pytest-benchmark JSON into the tables and figures under ``benchmarks/results/``.

Usage::

    python benchmarks/report.py RUN.json [RUN.json ...] [--out benchmarks/results]

Several files (repeated runs of the same suites) are pooled: each benchmark's time is the median
over runs of its per-run median, each recorded figure the median over runs, and the tables say how
many runs each figure pools.  Writes ``results.md`` (one table per suite, under the machine it came
from), compact copies of the runs (``runs/``), and the figures ``bandwidth_fraction.png``
(fraction of copy bandwidth by V) and ``speedup_vs_batch.png`` (measured and predicted speedup vs
batch size, with the no-speedup line), each titled with the machine.

Definitions (see the benchmark files):
- bandwidth fraction of a verification variant = ``t(copy) / t(variant)`` on the same inputs:
  N / t(variant) over N / t(copy), N = bytes of target + draft probabilities;
- tokens/s = rows · new tokens / median time;
- sweep speedup = t(plain) / t(reference); predicted = ``specverify.core.speedup.speedup`` with the
  measured effective α by position, ``c`` and ``v`` (module docstring of test_bench_batch_sweep).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Record:
    """One benchmark pooled over runs: ``median_s`` is the median of the runs' medians."""

    name: str
    group: str
    extra: dict[str, Any]
    median_s: float
    run_medians: tuple[float, ...]
    machines: tuple[str, ...] = field(default=())

    @property
    def runs(self) -> int:
        return len(self.run_medians)

    @property
    def spread(self) -> float:
        """(max − min) / median of the runs' medians: how much contention moved the figure."""
        return (max(self.run_medians) - min(self.run_medians)) / self.median_s if self.median_s else 0.0


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def machine_line(machine_info: dict[str, Any]) -> str:
    """One line naming the machine: platform, CPU, CPU count, torch and its threads, CUDA device,
    allocator setting, clock (the load average is per run, see :func:`run_line`)."""
    ours = machine_info.get("specverify", {})
    cpu = machine_info.get("cpu", {}) or {}
    brand = cpu.get("brand_raw") or ours.get("processor") or machine_info.get("processor", "?")
    parts = [
        ours.get("platform") or f"{machine_info.get('system', '?')} {machine_info.get('release', '')}".strip(),
        brand,
        f"{ours.get('cpu_count', '?')} CPUs",
        f"torch {ours.get('torch_version', '?')} ({ours.get('torch_threads', '?')} threads)",
    ]
    if ours.get("cuda_device"):
        parts.append(ours["cuda_device"])
    if ours.get("thp_mem_alloc_enable"):
        parts.append(f"THP_MEM_ALLOC_ENABLE={ours['thp_mem_alloc_enable']}")
    if ours.get("clock"):
        parts.append(f"clock {ours['clock']}")
    return ", ".join(str(part) for part in parts)


def run_line(name: str, data: dict[str, Any]) -> str:
    """``run1.json (2024-…, load 4.9)``: when a run was taken and how busy the machine was."""
    load = data.get("machine_info", {}).get("specverify", {}).get("load_average_at_start")
    when = data.get("datetime", "")[:16]
    return f"{name} ({when}{', ' if when else ''}1-min load average at start {load[0]:.1f})" if load else name


def pooled_extra(extras: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``extra_info`` pooled over runs: numbers (and equal-length lists of numbers) by their median,
    anything else from the first run (the suites record the same settings in every run)."""
    pooled = dict(extras[0])
    for key, first in extras[0].items():
        values = [extra.get(key) for extra in extras]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            pooled[key] = statistics.median(values)
        elif all(isinstance(v, list) and len(v) == len(first) for v in values) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for v in values for x in v
        ):
            pooled[key] = [statistics.median(column) for column in zip(*values)]
    return pooled


def load_runs(paths: Iterable[Path]) -> tuple[list[Record], list[str], list[str]]:
    """Pool the benchmarks of every JSON file by name; return the records, the machine lines and
    one line per run."""
    medians: dict[str, list[float]] = defaultdict(list)
    extras: dict[str, list[dict[str, Any]]] = defaultdict(list)
    first: dict[str, dict[str, Any]] = {}
    machines: dict[str, list[str]] = defaultdict(list)
    machine_lines: list[str] = []
    run_lines: list[str] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        line = machine_line(data.get("machine_info", {}))
        machine_lines.append(line)
        run_lines.append(run_line(Path(path).name, data))
        for bench in data.get("benchmarks", []):
            medians[bench["fullname"]].append(float(bench["stats"]["median"]))
            extras[bench["fullname"]].append(bench.get("extra_info", {}))
            first.setdefault(bench["fullname"], bench)
            machines[bench["fullname"]].append(line)
    records = [
        Record(name=name, group=first[name].get("group") or "", extra=pooled_extra(extras[name]),
               median_s=statistics.median(values), run_medians=tuple(values), machines=tuple(machines[name]))
        for name, values in medians.items()
    ]
    return records, machine_lines, run_lines


def header(*columns: str) -> list[str]:
    """A markdown table header; a column named ``>name`` is right-aligned (numbers)."""
    names = [column.removeprefix(">") for column in columns]
    aligns = ["---:" if column.startswith(">") else "---" for column in columns]
    return ["| " + " | ".join(names) + " |", "|" + "|".join(aligns) + "|"]


def wrapped(text: str, width: int = 110) -> str:
    """``text`` broken into lines of at most ``width`` characters (figure titles)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def ratio_range(fast: Record, slow: Record) -> str:
    """``t(slow) / t(fast)`` pooled (median of the runs' medians), then its range over the runs
    (run i of one against run i of the other: the two were measured side by side)."""
    pooled = slow.median_s / fast.median_s
    per_run = [s / f for s, f in zip(slow.run_medians, fast.run_medians)]
    if len(per_run) < 2:
        return f"{pooled:.2f}"
    return f"{pooled:.2f} ({min(per_run):.2f}–{max(per_run):.2f})"


def of_suite(records: Sequence[Record], suite: str) -> list[Record]:
    return [record for record in records if record.extra.get("suite") == suite]


# --------------------------------------------------------------------------------------------
# 1. Verification bandwidth
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BandwidthRow:
    batch: int
    num_draft: int
    vocab: int
    dtype: str
    device: str
    megabytes: float
    copy_s: float
    copy_gb_per_s: float
    copy_into_s: float | None
    verify_s: float
    verify_fraction: float
    validate_s: float
    validate_fraction: float
    runs: int
    before_s: float | None = None
    before_validate_s: float | None = None
    torch_s: float | None = None
    torch_validate_s: float | None = None

    @property
    def verify_fraction_into(self) -> float | None:
        """Fraction of the steady-state copy bandwidth (``copy-into``)."""
        return self.copy_into_s / self.verify_s if self.copy_into_s else None

    @property
    def validate_fraction_into(self) -> float | None:
        return self.copy_into_s / self.validate_s if self.copy_into_s else None

    @property
    def before_validate_fraction_into(self) -> float | None:
        """``copy-into`` bandwidth fraction of the rule before issue 12 (with validation)."""
        return self.copy_into_s / self.before_validate_s if self.copy_into_s and self.before_validate_s else None

    @property
    def torch_validate_fraction_into(self) -> float | None:
        """``copy-into`` bandwidth fraction of today's rule on its torch code (with validation)."""
        return self.copy_into_s / self.torch_validate_s if self.copy_into_s and self.torch_validate_s else None


def bandwidth_rows(records: Sequence[Record], suite: str = "verify") -> list[BandwidthRow]:
    """One row per input size: copy, verify and verify+validate side by side.  A suite without a
    ``copy`` variant (the tree suite) uses ``copy-into`` in its place."""
    by_key: dict[tuple, dict[str, Record]] = defaultdict(dict)
    for record in of_suite(records, suite):
        e = record.extra
        by_key[(e["device"], e["dtype"], e["vocab"], e["batch"], e["num_draft"])][e["variant"]] = record
    rows = []
    for (device, dtype, vocab, batch, num_draft), variants in sorted(by_key.items()):
        if "copy" not in variants and "copy-into" in variants:
            variants = {**variants, "copy": variants["copy-into"]}
        if not {"copy", "verify", "verify+validate"} <= variants.keys():
            continue
        copy, verify, validate = variants["copy"], variants["verify"], variants["verify+validate"]
        copy_into, before, before_validate, torch_only, torch_validate = (
            variants.get(v) for v in ("copy-into", "before", "before+validate", "torch", "torch+validate"))
        nbytes = copy.extra["probability_bytes"]
        rows.append(BandwidthRow(
            batch=batch, num_draft=num_draft, vocab=vocab, dtype=dtype, device=device, megabytes=nbytes / 1e6,
            copy_s=copy.median_s, copy_gb_per_s=nbytes / copy.median_s / 1e9,
            copy_into_s=copy_into.median_s if copy_into else None,
            verify_s=verify.median_s, verify_fraction=copy.median_s / verify.median_s,
            validate_s=validate.median_s, validate_fraction=copy.median_s / validate.median_s,
            runs=min(copy.runs, verify.runs, validate.runs),
            before_s=before.median_s if before else None,
            before_validate_s=before_validate.median_s if before_validate else None,
            torch_s=torch_only.median_s if torch_only else None,
            torch_validate_s=torch_validate.median_s if torch_validate else None,
        ))
    return rows


def _fraction(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def bandwidth_table(rows: Sequence[BandwidthRow]) -> list[str]:
    lines = header("device", "dtype", ">V", ">B", ">K", ">MB read", ">copy ms", ">copy GB/s", ">copy-into ms",
                   ">verify ms", ">× copy bw", ">× copy-into bw", ">verify+validate ms", ">× copy bw",
                   ">× copy-into bw", ">runs")
    for r in rows:
        into = "—" if r.copy_into_s is None else f"{r.copy_into_s * 1e3:.3g}"
        lines.append(
            f"| {r.device} | {r.dtype} | {r.vocab} | {r.batch} | {r.num_draft} | {r.megabytes:.3g} | "
            f"{r.copy_s * 1e3:.3g} | {r.copy_gb_per_s:.3g} | {into} | {r.verify_s * 1e3:.3g} | "
            f"{r.verify_fraction:.2f} | {_fraction(r.verify_fraction_into)} | {r.validate_s * 1e3:.3g} | "
            f"{r.validate_fraction:.2f} | "
            f"{_fraction(r.validate_fraction_into)} | {r.runs} |"
        )
    return lines


def bandwidth_goal_lines(rows: Sequence[BandwidthRow]) -> list[str]:
    """Median fraction of copy bandwidth per device, dtype and V, against the goal."""
    lines = header("device", "dtype", ">V", ">median × copy bw, verify", ">median × copy bw, verify+validate",
                   ">goal", ">min, verify+validate", ">largest B median, verify+validate",
                   ">median × copy-into bw, verify+validate")
    groups: dict[tuple, list[BandwidthRow]] = defaultdict(list)
    for r in rows:
        groups[(r.device, r.dtype, r.vocab)].append(r)
    for (device, dtype, vocab), members in sorted(groups.items()):
        goal = "—" if vocab < 32_768 else ("≥ 0.50" if device == "cpu" else "≥ 0.60")
        largest = [m.validate_fraction for m in members if m.batch == max(r.batch for r in members)]
        into = [m.validate_fraction_into for m in members if m.validate_fraction_into is not None]
        lines.append(
            f"| {device} | {dtype} | {vocab} | {statistics.median(m.verify_fraction for m in members):.2f} | "
            f"{statistics.median(m.validate_fraction for m in members):.2f} | {goal} | "
            f"{min(m.validate_fraction for m in members):.2f} | {statistics.median(largest):.2f} | "
            f"{_fraction(statistics.median(into) if into else None)} |"
        )
    return lines


def before_after_lines(rows: Sequence[BandwidthRow], rule: str = "Rule", size: str = "K") -> list[str]:
    """The rule before and after issue 12, side by side (same run), against ``copy-into``: the goal
    is a median >= 0.5 over B, K, V >= 32k and both dtypes, with validation.  ``rule`` names the
    rule in the title, ``size`` the column of draft positions (``K``; ``N`` nodes for trees)."""
    rows = [r for r in rows if r.before_validate_s is not None and r.copy_into_s is not None]
    if not rows:
        return []
    with_torch = any(r.torch_validate_s is not None for r in rows)
    lines = [f"{rule} before vs after issue 12, with validation, × `copy-into` bandwidth (same run, same inputs):", "",
             *header("device", "scope", ">points", ">median before", ">median after", ">median speedup",
                     ">min after", ">max after", *([">median torch path"] if with_torch else []))]
    scopes: dict[tuple, list[BandwidthRow]] = defaultdict(list)
    for r in rows:
        if r.vocab >= 32_768:
            scopes[(r.device, "all V ≥ 32k, fp32 + bf16")].append(r)
        scopes[(r.device, f"{r.dtype}, V = {r.vocab}")].append(r)
    for (device, scope), members in sorted(scopes.items()):
        after = [m.validate_fraction_into for m in members]
        lines.append(
            f"| {device} | {scope} | {len(members)} | "
            f"{statistics.median(m.before_validate_fraction_into for m in members):.2f} | "
            f"{statistics.median(after):.2f} | "
            f"{statistics.median(m.before_validate_s / m.validate_s for m in members):.2f}× | "
            f"{min(after):.2f} | {max(after):.2f} |"
            + (f" {_median_or_dash([m.torch_validate_fraction_into for m in members])} |" if with_torch else "")
        )
    lines += ["", *header("device", "dtype", ">V", ">B", f">{size}", ">copy-into ms", ">before ms", ">after ms",
                          ">before+validate ms", ">after+validate ms", ">× copy-into before", ">× copy-into after",
                          ">speedup", *([">torch+validate ms", ">× copy-into torch"] if with_torch else []))]
    for r in rows:
        lines.append(
            f"| {r.device} | {r.dtype} | {r.vocab} | {r.batch} | {r.num_draft} | {r.copy_into_s * 1e3:.3g} | "
            f"{_ms(r.before_s)} | {r.verify_s * 1e3:.3g} | {_ms(r.before_validate_s)} | {r.validate_s * 1e3:.3g} | "
            f"{_fraction(r.before_validate_fraction_into)} | {_fraction(r.validate_fraction_into)} | "
            f"{r.before_validate_s / r.validate_s:.2f}× |"
            + (f" {_ms(r.torch_validate_s)} | {_fraction(r.torch_validate_fraction_into)} |" if with_torch else "")
        )
    return lines


def _median_or_dash(values: Sequence[float | None]) -> str:
    present = [v for v in values if v is not None]
    return _fraction(statistics.median(present)) if present else "—"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g}"


def plot_bandwidth(rows: Sequence[BandwidthRow], machine: str, path: Path) -> None:
    """Fraction of copy bandwidth by V: one point per (B, K), median line per variant and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    batches = sorted({r.batch for r in rows})
    markers = dict(zip(batches, "o^sDv"))
    shift = dict(zip(batches, (0.85, 1.0, 1.18, 1.4, 1.65)))  # spread the batch sizes apart on the log axis
    for axis, variant in zip(axes, ("verify", "verify+validate")):
        for dtype, color in (("float32", "tab:blue"), ("bfloat16", "tab:orange")):
            members = [r for r in rows if r.dtype == dtype and r.device == "cpu"]
            if not members:
                continue
            fraction = [(r.verify_fraction if variant == "verify" else r.validate_fraction) for r in members]
            for batch in batches:
                points = [(r.vocab * shift[batch], f) for r, f in zip(members, fraction) if r.batch == batch]
                axis.scatter(*zip(*points), marker=markers[batch], color=color, alpha=0.55,
                             label=f"{dtype}, B = {batch} (each K)")
            vocabs = sorted({r.vocab for r in members})
            medians = [statistics.median(f for r, f in zip(members, fraction) if r.vocab == v) for v in vocabs]
            axis.plot(vocabs, medians, color=color, label=f"{dtype}, median over B, K")
        axis.axhline(0.5, color="red", linestyle="--", label="goal ≥ 0.5 (CPU, V ≥ 32k)")
        axis.axhline(1.0, color="gray", linestyle=":", label="copy bandwidth")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("vocabulary size V")
        axis.set_title(f"rejection_sample, {'validate=False' if variant == 'verify' else 'validate=True'}")
    axes[0].set_ylabel("effective bandwidth / copy bandwidth")
    axes[1].legend(fontsize=6, ncol=2)
    title = "Verification step vs memory copy (clone), same inputs, same run (CPU)"
    fig.suptitle(title + "\n" + wrapped(machine), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# 2. Verification share of a model step
# --------------------------------------------------------------------------------------------


def model_step_table(records: Sequence[Record]) -> list[str]:
    lines = header("model", ">B", "rule", ">context", ">step ms", ">forward ms", ">probs ms", ">verify ms",
                   ">verify share", ">probs share", ">runs")
    for record in sorted(of_suite(records, "model-step"), key=lambda r: (r.extra["batch"], r.extra["rule"])):
        e = record.extra
        lines.append(
            f"| {e['model']} | {e['batch']} | {e['rule']} | {e['context_length']} | {record.median_s * 1e3:.1f} | "
            f"{e['forward_s'] * 1e3:.1f} | {e['probs_s'] * 1e3:.2f} | {e['verify_s'] * 1e3:.2f} | "
            f"{e['verify_fraction']:.1%} | {e['probs_fraction']:.1%} | {record.runs} |"
        )
    return lines


# --------------------------------------------------------------------------------------------
# 3. Audit
# --------------------------------------------------------------------------------------------


def audit_table(records: Sequence[Record]) -> list[str]:
    lines = header("budget", "verdict", ">checks", ">trials", ">time s (benchmark clock)", ">trials/s",
                   ">wall s (audit's own clock)", ">share of wall time inside the sampler",
                   "slowest check (wall, first run)", ">runs")
    for record in sorted(of_suite(records, "audit"), key=lambda r: r.median_s):
        e = record.extra
        slowest = e.get("slowest_checks") or [["—", 0.0]]
        inside = e["function_s"] / e["total_s"] if e.get("function_s") and e.get("total_s") else None
        lines.append(
            f"| {e['budget']} | {e['verdict']} | {e['checks']} | {e['rows']:,.0f} | {record.median_s:.1f} | "
            f"{e['rows'] / record.median_s:,.0f} | {e['total_s']:.1f} | {'—' if inside is None else f'{inside:.0%}'} | "
            f"{slowest[0][0]} ({slowest[0][1]:.1f} s) | {record.runs} |"
        )
    return lines


# --------------------------------------------------------------------------------------------
# 4. Decoders
# --------------------------------------------------------------------------------------------


def decoder_table(records: Sequence[Record]) -> list[str]:
    """Per prompt and method: tokens/s, speedup over plain on the same prompt, tokens per target
    pass, accepted drafts per draft slot, greedy identity."""
    decoders = of_suite(records, "decoders")
    plain = {r.extra["prompt_index"]: r for r in decoders if r.extra["method"] == "plain"}
    lines = header(">prompt", "method", ">tokens/s", ">× plain (range over runs)", ">tokens / target pass",
                   ">accepted / draft slot",
                   "α by position (reference)", "= plain greedy", ">runs")
    for record in sorted(decoders, key=lambda r: (r.extra["prompt_index"], r.extra["method"])):
        e = record.extra
        base = plain.get(e["prompt_index"])
        ratio = ratio_range(record, base) if base else "—"
        accepted = e.get("accepted_per_draft_slot")
        alphas = e.get("acceptance_by_position")
        lines.append(
            f"| {e['prompt_index']} | {e['method']} | {e['rows'] * e['new_tokens'] / record.median_s:.2f} | {ratio} | "
            f"{e['tokens_per_target_pass']:.2f} | {'—' if accepted is None else f'{accepted:.2f}'} | "
            f"{'—' if alphas is None else _rates(alphas)} | {e['matches_plain']} | {record.runs} |"
        )
    return lines


def _rates(values: Sequence[float]) -> str:
    """Rates as ``0.52, 0.31``; a position never reached (NaN) as ``—``."""
    return ", ".join("—" if value != value else f"{value:.2f}" for value in values)


def decoder_summary(records: Sequence[Record]) -> list[str]:
    """Geometric-mean speedup of each method over plain, and of each reference method over its
    HF counterpart (same drafter, same work), across prompts."""
    decoders = of_suite(records, "decoders")
    times: dict[str, dict[int, float]] = defaultdict(dict)
    for record in decoders:
        times[record.extra["method"]][record.extra["prompt_index"]] = record.median_s

    def geomean_ratio(numerator: str, denominator: str) -> str:
        shared = sorted(times.get(numerator, {}).keys() & times.get(denominator, {}).keys())
        if not shared:
            return "—"
        product = 1.0
        for prompt in shared:
            product *= times[denominator][prompt] / times[numerator][prompt]
        return f"{product ** (1 / len(shared)):.2f}"

    lines = header("method", ">× plain (geomean over prompts)", ">reference × HF same work",
                   ">reference × HF defaults")
    for method in sorted(times):
        if method == "plain":
            continue
        drafter = method.partition("-")[2]
        vs_hf = geomean_ratio(method, f"hf-{drafter}") if method.startswith("reference-") else ""
        vs_defaults = geomean_ratio(method, f"hf-{drafter}-defaults") if method.startswith("reference-") else ""
        lines.append(f"| {method} | {geomean_ratio(method, 'plain')} | {vs_hf} | {vs_defaults} |")
    return lines


# --------------------------------------------------------------------------------------------
# 5. Batch sweep
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepRow:
    """One batch size of the sweep.

    row_tokens_per_pass: ``1 + Σ_j Π_{i≤j} α_i`` with the α pooled over rows (what one request
    gains per pass); batch_tokens_per_pass: ``max_new_tokens / speculative passes of the batch``
    (the batch runs until its slowest row is done, so stragglers lower it).
    """

    batch: int
    plain_s: float
    reference_s: float
    measured_speedup: float
    measured_text: str
    alphas: tuple[float, ...]
    row_tokens_per_pass: float
    batch_tokens_per_pass: float
    draft_cost: float
    verify_cost: float
    predicted_speedup: float
    predicted_batch: float
    predicted_with_overhead: float


def sweep_rows(records: Sequence[Record]) -> list[SweepRow]:
    """Measured and predicted speedup for each batch size with every input present.

    ``predicted_speedup``: ``specverify.core.speedup.speedup(α, γ, c, v)`` with the pooled α.
    ``predicted_batch``: the same cost model with the batch's measured tokens per pass instead of
    the α-based expectation (it includes the straggler effect).  ``predicted_with_overhead``: that,
    plus what the model leaves out and the reference's statistics measure: its per-pass target-side
    time beyond a bare γ+1-token target pass (probabilities, verification, cache bookkeeping).
    Speculative passes of the batch = target forward calls − 1 (the prefill).
    """
    from specverify.core.speedup import expected_tokens_per_pass_by_position, speedup

    sweep = of_suite(records, "sweep")
    by_batch: dict[int, dict[str, Record]] = defaultdict(dict)
    for record in sweep:
        e = record.extra
        key = e["method"] if e["kind"] == "decoder" else f"pass-{e['width']}"
        by_batch[e["batch"]][key] = record
    rows = []
    for batch, parts in sorted(by_batch.items()):
        reference, plain = parts.get("reference-prompt-lookup"), parts.get("plain")
        gamma = (reference or plain).extra["gamma"] if (reference or plain) else None
        one, wide = parts.get("pass-1"), parts.get(f"pass-{gamma + 1}") if gamma else None
        if not (reference and plain and one and wide):
            continue
        e = reference.extra
        passes = e["target_calls"] - 1
        step = one.extra["pass_s"]
        to_clock = reference.median_s / e["wall_s"]  # the reference's statistics are wall-clock
        verify_cost = max(0.0, (wide.extra["pass_s"] - step) / (gamma * step))
        draft_cost = e["draft_seconds"] * to_clock / (passes * gamma) / step
        cost = gamma * draft_cost + 1 + gamma * verify_cost
        alphas = tuple(e["effective_alphas"])
        batch_tokens = e["new_tokens"] / passes
        overhead = max(0.0, e["target_seconds"] * to_clock / passes - wide.extra["pass_s"]) / step
        rows.append(SweepRow(
            batch=batch, plain_s=plain.median_s, reference_s=reference.median_s,
            measured_speedup=plain.median_s / reference.median_s, measured_text=ratio_range(reference, plain),
            alphas=alphas,
            row_tokens_per_pass=expected_tokens_per_pass_by_position(list(alphas)), batch_tokens_per_pass=batch_tokens,
            draft_cost=draft_cost, verify_cost=verify_cost,
            predicted_speedup=speedup(list(alphas), gamma, draft_cost, verify_cost).speedup,
            predicted_batch=batch_tokens / cost, predicted_with_overhead=batch_tokens / (cost + overhead),
        ))
    return rows


def sweep_table(rows: Sequence[SweepRow]) -> list[str]:
    lines = header(">B", ">plain s", ">reference s", ">measured × plain (range over runs)",
                   "α by position (pooled over rows)",
                   ">row tokens / pass", ">batch tokens / pass", ">c", ">v", ">predicted × plain (α)",
                   ">predicted × plain (batch tokens / pass)", ">… incl. per-pass overhead")
    for r in rows:
        lines.append(
            f"| {r.batch} | {r.plain_s:.2f} | {r.reference_s:.2f} | {r.measured_text} | {_rates(r.alphas)} | "
            f"{r.row_tokens_per_pass:.2f} | {r.batch_tokens_per_pass:.2f} | {r.draft_cost:.3f} | {r.verify_cost:.3f} | "
            f"{r.predicted_speedup:.2f} | {r.predicted_batch:.2f} | {r.predicted_with_overhead:.2f} |"
        )
    return lines


def plot_sweep(rows: Sequence[SweepRow], machine: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(7, 4.5))
    batches = [r.batch for r in rows]
    axis.plot(batches, [r.measured_speedup for r in rows], marker="o",
              label="measured: reference (prompt lookup) vs plain")
    axis.plot(batches, [r.predicted_speedup for r in rows], marker="s", linestyle="--",
              label="speedup model (measured α pooled over rows, c, v)")
    axis.plot(batches, [r.predicted_batch for r in rows], marker="v", linestyle="--",
              label="speedup model with the batch's tokens per pass (stragglers)")
    axis.plot(batches, [r.predicted_with_overhead for r in rows], marker="^", linestyle=":",
              label="… + measured per-pass overhead of the reference")
    axis.axhline(1.0, color="red", linewidth=1, label="no speedup")
    axis.set_xscale("log", base=2)
    axis.set_xticks(batches, [str(b) for b in batches])
    axis.set_xlabel("batch size B")
    axis.set_ylabel("speedup over plain greedy decoding")
    axis.legend(fontsize=7)
    fig.suptitle("Speculative decoding speedup vs batch size (greedy, γ = 4)\n" + wrapped(machine), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def save_compact_runs(paths: Sequence[Path], folder: Path) -> None:
    """Copy each run into ``folder`` without the per-round timings (``stats.data``, tens of MB for
    the auto-calibrated benchmarks), so that the tables can be regenerated from what is committed:
    ``python benchmarks/report.py benchmarks/results/runs/*.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in paths:
        data = json.loads(Path(path).read_text())
        for bench in data.get("benchmarks", []):
            bench.get("stats", {}).pop("data", None)
        (folder / Path(path).name).write_text(json.dumps(data, indent=1))


def write_report(paths: Sequence[Path], out: Path) -> Path:
    """Write ``results.md``, the figures and compact copies of the runs (``runs/``) for the runs
    in ``paths`` into ``out``; return the markdown's path."""
    records, machines, runs = load_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    save_compact_runs(paths, out / "runs")
    machine = machines[0] if len(set(machines)) == 1 else " | ".join(sorted(set(machines)))
    lines = ["# specverify benchmark results", "",
             f"Machine: {machine}", "",
             f"Pooled runs ({len(paths)}): {'; '.join(runs)}.  Each time is the median over runs of the per-run "
             "median, each recorded figure (phase times, passes, …) the median over runs.", ""]
    bandwidth = bandwidth_rows(records)
    if bandwidth:
        plot_bandwidth(bandwidth, machine, out / "bandwidth_fraction.png")
        lines += ["## 1. Verification step vs memory copy", "", "![bandwidth](bandwidth_fraction.png)", "",
                  *bandwidth_goal_lines(bandwidth), "", *before_after_lines(bandwidth), "",
                  *bandwidth_table(bandwidth), ""]
    tree = bandwidth_rows(records, suite="verify-tree")
    if tree:
        lines += ["## 1b. Tree verification step vs memory copy", "",
                  *before_after_lines(tree, rule="Tree rule", size="N"), ""]
    if of_suite(records, "model-step"):
        lines += ["## 2. Verification share of a decoding step", "", *model_step_table(records), ""]
    if of_suite(records, "audit"):
        lines += ["## 3. Audit harness", "", *audit_table(records), ""]
    if of_suite(records, "decoders"):
        lines += ["## 4. Decoders (greedy, batch 1)", "", *decoder_summary(records), "", *decoder_table(records), ""]
    sweep = sweep_rows(records)
    if sweep:
        plot_sweep(sweep, machine, out / "speedup_vs_batch.png")
        lines += ["## 5. Batch-size sweep", "", "![speedup](speedup_vs_batch.png)", "", *sweep_table(sweep), ""]
    markdown = out / "results.md"
    markdown.write_text("\n".join(lines))
    return markdown


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON files (repeated runs are pooled)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    print(write_report(args.runs, args.out))


if __name__ == "__main__":
    main()
