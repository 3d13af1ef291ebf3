"""Smoke test of benchmarks/: every benchmark function runs once on tiny sizes, and the report
script turns what they recorded into its tables and figures.

The benchmark functions are called directly with :class:`OnceBenchmark` standing in for
pytest-benchmark's fixture (it runs the timed function once and records its time as the median)
and with a tiny random Llama target (``specverify.hf.tiny_models``) in place of SmolLM2, so the test
needs no provisioned model and takes seconds.  It checks that each benchmark records the figures
the report reads, that every greedy speculative decoder reproduces plain greedy decoding (the
decoders are lossless, so a mismatch is a bug in the benchmark wiring or in a decoder), and that
the report renders every section.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import (
    report,
    test_bench_audit,
    test_bench_batch_sweep,
    test_bench_decoders,
    test_bench_model_step,
    test_bench_tree_verify,
    test_bench_verify,
)
from benchmarks.workloads import ModelUnderTest
from specverify.hf.tiny_models import tiny_target_and_draft

VOCAB = 48


class OnceBenchmark:
    """Stand-in for the ``benchmark`` fixture: runs the function once, keeps its time and extra_info."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.group: str | None = None
        self.extra_info: dict[str, Any] = {}
        self.seconds = 0.0

    def __call__(self, fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.seconds = time.perf_counter() - start
        return result

    def pedantic(self, fn, args=(), kwargs=None, setup=None, rounds=1, warmup_rounds=0, iterations=1):
        return self(fn, *args, **(kwargs or {}))

    def as_json(self) -> dict[str, Any]:
        """The fields of a pytest-benchmark JSON entry that benchmarks/report.py reads."""
        return {"fullname": self.name, "group": self.group, "extra_info": self.extra_info,
                "stats": {"median": max(self.seconds, 1e-9)}}


@pytest.fixture(scope="module")
def tiny_unit() -> ModelUnderTest:
    """A 2-layer random target with a separate 1-layer draft; prompts of 20–30 tokens with repeats
    (so that prompt lookup finds matches)."""
    target, draft = tiny_target_and_draft(vocab_size=VOCAB, hidden_size=16)
    generator = torch.Generator().manual_seed(0)
    motifs = [torch.randint(0, VOCAB, (length,), generator=generator) for length in (10, 12, 14, 15)]
    prompts = tuple(torch.cat([motif, motif[:-3], motif[:4]]) for motif in motifs)
    return ModelUnderTest(name="tiny-llama", model=target, prompts=prompts, early_exit_layers=1, draft_model=draft)


def run(function, name: str, *args, **kwargs) -> OnceBenchmark:
    bench = OnceBenchmark(name)
    function(bench, *args, **kwargs)
    return bench


@pytest.fixture(scope="module")
def runs(tiny_unit: ModelUnderTest) -> dict[str, OnceBenchmark]:
    """Every benchmark function, run once on tiny sizes (in one fixture, so that the report test
    sees all of them even when pytest-xdist spreads this module's tests over workers)."""
    benches = []
    for dtype in (torch.float32, torch.bfloat16):
        for variant in test_bench_verify.VARIANTS:
            benches.append(run(test_bench_verify.test_verification_step, f"verify-{variant}-{dtype}",
                               variant, 2, 3, 64, dtype, "cpu"))
        for variant in test_bench_tree_verify.VARIANTS:
            benches.append(run(test_bench_tree_verify.test_tree_verification_step, f"tree-{variant}-{dtype}",
                               variant, 2, 4, 64, dtype))
    for rule in test_bench_model_step.RULES:
        benches.append(run(test_bench_model_step.test_verification_share_of_step, f"model-step-{rule}",
                           tiny_unit, 2, rule, rounds=1))
    benches.append(run(test_bench_audit.test_audit_fixed_samples, "audit-fixed", samples=200))
    benches.append(run(test_bench_audit.test_audit_budget, "audit-budget", 200))
    for method in test_bench_decoders.METHODS:
        benches.append(run(test_bench_decoders.test_decoder, f"decoder-{method}", tiny_unit, 0, method,
                           max_new_tokens=8))
    for method in test_bench_decoders.QWEN_METHODS:
        benches.append(run(test_bench_decoders.test_decoder_qwen, f"decoder-qwen-{method}", tiny_unit, 0, method,
                           max_new_tokens=8))
    for method in test_bench_batch_sweep.DECODERS:
        benches.append(run(test_bench_batch_sweep.test_sweep_decoder, f"sweep-{method}", tiny_unit, 2, method,
                           max_new_tokens=6))
    for width in test_bench_batch_sweep.PASS_WIDTHS:
        benches.append(run(test_bench_batch_sweep.test_sweep_target_pass, f"sweep-pass-{width}", tiny_unit, 2,
                           width, rounds=1))
    return {bench.name: bench for bench in benches}


def test_verification_step_records_bytes(runs: dict[str, OnceBenchmark]) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for variant in test_bench_verify.VARIANTS:
            bench = runs[f"verify-{variant}-{dtype}"]
            assert bench.extra_info["probability_bytes"] == (2 * 4 + 2 * 3) * 64 * dtype.itemsize
            assert bench.group.startswith("verify B=2 K=3 V=64")


def test_model_step_records_phase_fractions(runs: dict[str, OnceBenchmark]) -> None:
    for rule in test_bench_model_step.RULES:
        info = runs[f"model-step-{rule}"].extra_info
        assert 0 < info["verify_fraction"] < 1
        assert info["forward_s"] > 0


def test_audit_benchmarks_record_throughput(runs: dict[str, OnceBenchmark]) -> None:
    for name in ("audit-fixed", "audit-budget"):
        info = runs[name].extra_info
        assert info["verdict"] == "no loss detected"
        assert info["trials_per_s"] > 0


def test_decoder_methods_reproduce_plain_greedy(runs: dict[str, OnceBenchmark]) -> None:
    names = ([f"decoder-{m}" for m in test_bench_decoders.METHODS]
             + [f"decoder-qwen-{m}" for m in test_bench_decoders.QWEN_METHODS])
    for name in names:
        method = runs[name].extra_info["method"]
        info = runs[name].extra_info
        assert info["matches_plain"], f"{method} differs from plain greedy decoding"
        assert info["new_tokens"] == 8 and info["target_calls"] >= 1
        if method != "plain":
            assert 0 <= info["accepted_per_draft_slot"] <= 1, method


def test_speculative_decoders_count_fewer_target_passes_on_repetitive_prompts(runs: dict[str, OnceBenchmark]) -> None:
    plain = runs["decoder-plain"].extra_info["target_calls"]
    assert runs["decoder-reference-draft-model"].extra_info["target_calls"] < plain
    assert runs["decoder-hf-draft-model"].extra_info["target_calls"] < plain


def test_batch_sweep_records_costs(runs: dict[str, OnceBenchmark]) -> None:
    for method in test_bench_batch_sweep.DECODERS:
        assert runs[f"sweep-{method}"].extra_info["rows"] == 2
    for width in test_bench_batch_sweep.PASS_WIDTHS:
        assert runs[f"sweep-pass-{width}"].extra_info["pass_s"] > 0


def test_report_renders_every_section(runs: dict[str, OnceBenchmark], tmp_path: Path) -> None:
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({
        "machine_info": {"specverify": {"platform": "test", "cpu_count": 2, "torch_version": torch.__version__}},
        "benchmarks": [bench.as_json() for bench in runs.values()],
    }))
    markdown = report.write_report([run_file], tmp_path / "out").read_text()
    for heading in ("## 1.", "## 1b.", "## 2.", "## 3.", "## 4.", "## 5."):
        assert heading in markdown
    assert (tmp_path / "out" / "bandwidth_fraction.png").stat().st_size > 0
    assert (tmp_path / "out" / "speedup_vs_batch.png").stat().st_size > 0
