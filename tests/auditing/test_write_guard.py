"""The worker's write guard (specverify/auditing/isolation/write_guard.py): a covered span is
read-only, a write into it lands and is recorded, a fault elsewhere is not the guard's, and the
audit compares inputs byte for byte exactly where the guard cannot vouch for them."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from specverify.auditing.defaults import EXIT_FAIL, EXIT_PASS
from specverify.auditing.isolation import presentation, write_guard
from specverify.auditing.isolation.guarded import GUARD_AUDIT_EVERY, guard_audited
from specverify.auditing.runner import audit

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = Path(__file__).resolve().parent / "hostile"
FAULTY = ROOT / "examples" / "faulty.py"
FEW = dict(budget=600, checks=["randomness-source", "step-K2", "decoding-loop-order1", "inputs-unchanged"])

needs_guard = pytest.mark.skipif(sys.platform != "linux" or write_guard.library() is None,
                                 reason="the write guard needs Linux and a C compiler")

SPAN = """
import mmap, torch
from specverify.auditing.isolation.write_guard import PAGE_BYTES, WriteGuard
buffer = mmap.mmap(-1, 8 * PAGE_BYTES)
pages = torch.frombuffer(buffer, dtype=torch.uint8)
guard = WriteGuard()
"""


def run_span(body: str) -> subprocess.CompletedProcess:
    """``body`` after :data:`SPAN`, in a fresh interpreter (the guard installs a signal handler)."""
    return subprocess.run([sys.executable, "-c", SPAN + textwrap.dedent(body)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@needs_guard
def test_a_write_into_the_covered_span_lands_and_is_recorded_reads_and_writes_elsewhere_are_not():
    result = run_span("""
        assert guard.cover(pages.data_ptr(), 4 * PAGE_BYTES)
        assert int(pages[: 4 * PAGE_BYTES].sum()) == 0 and guard.untouched()
        pages[6 * PAGE_BYTES] = 1
        assert guard.untouched()
        pages[: 4 * PAGE_BYTES].view(torch.int32).add_(5)          # every page, torch's threads
        assert not guard.untouched() and bool((pages[: 4 * PAGE_BYTES].view(torch.int32) == 5).all())
        assert not guard.cover(pages.data_ptr(), 4 * PAGE_BYTES) and guard.untouched()
        assert guard.cover(pages.data_ptr(), 4 * PAGE_BYTES)           # the next request: clean again
        guard.release()
        pages[0] = 3
        assert guard.cover(pages.data_ptr() + PAGE_BYTES, 2 * PAGE_BYTES)  # another span
        pages[0] = 4
        assert guard.untouched()
        pages[PAGE_BYTES] = 4
        assert not guard.untouched()
        print("ok")
    """)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@needs_guard
def test_a_fault_outside_the_covered_span_still_ends_the_process_with_sigsegv():
    result = run_span("""
        import ctypes
        assert guard.cover(pages.data_ptr(), 4 * PAGE_BYTES)
        ctypes.string_at(8)
    """)
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr)


def test_a_span_off_the_page_grid_is_refused():
    with pytest.raises(ValueError, match="page size"):
        write_guard.WriteGuard().cover(write_guard.PAGE_BYTES + 8, write_guard.PAGE_BYTES)


def settled_with_comparison(monkeypatch) -> collections.Counter:
    """How many inputs the audit settled with (True) and without (False) a byte comparison."""
    counts: collections.Counter = collections.Counter()
    settle = presentation.Presenter.settle

    def counting(self, slot, tensor, *, compare=True):
        counts[compare] += 1
        return settle(self, slot, tensor, compare=compare)

    monkeypatch.setattr(presentation.Presenter, "settle", counting)
    return counts


def test_the_guarded_requests_compared_all_the_same_are_the_first_ones_and_then_one_in_every_64():
    audited = [request for request in range(1, 400) if guard_audited(request)]
    assert GUARD_AUDIT_EVERY == 64 and audited == [1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320, 384]


@needs_guard
def test_the_audit_reads_inputs_again_only_where_the_guard_cannot_vouch_for_them(monkeypatch):
    counts = settled_with_comparison(monkeypatch)
    report = audit("reference", **FEW)
    assert report.exit_code == EXIT_PASS, report.summary
    compared, trusted = counts[True], counts[False]
    audited = sum(guard_audited(request) for request in range(1, compared + trusted + 1))
    assert trusted > 0 and compared <= 3 * audited, counts
    counts.clear()
    report = audit(f"{FAULTY}:mutates_inputs", **FEW)
    assert report.exit_code == EXIT_FAIL and report.checks[-1].verdict == "fail", report.summary
    assert counts[False] == 0 and counts[True] > 0, counts


@needs_guard
def test_a_write_the_guard_does_not_see_is_found_by_the_requests_compared_all_the_same():
    report = audit(f"{HOSTILE / 'unguards_and_mutates'}.py:verify", **FEW)
    verdicts = {check.name: check.verdict for check in report.checks}
    assert report.exit_code == EXIT_FAIL and verdicts["inputs-unchanged"] == "fail", report.summary
    assert "draft_tokens" in report.checks[-1].message


def test_without_a_compiler_every_input_is_compared(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-compiler"))
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    counts = settled_with_comparison(monkeypatch)
    report = audit(f"{FAULTY}:mutates_inputs", **FEW)
    assert report.exit_code == EXIT_FAIL and report.checks[-1].verdict == "fail", report.summary
    counts.clear()
    assert audit("reference", budget=600, checks=["step-K2"]).exit_code == EXIT_PASS
    assert counts[False] == 0 and counts[True] > 0, counts
