"""glibc's allocator keeps large freed blocks in the worker (environment) and in the audit's own
process (mallopt): a fresh tensor of tens of MB then reuses pages instead of faulting them in."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from specverify.auditing.isolation import allocator, spawn

GLIBC = platform.libc_ver()[0] == "glibc"


def test_the_worker_starts_with_the_settings():
    for name, value in allocator.environment().items():
        assert spawn.WORKER_ENVIRONMENT[name] == value


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_large_fresh_tensor_reuses_freed_pages_once_applied():
    """Minor page faults per allocation of a fresh 42 MB tensor, filled, over ten allocations after
    twenty: about all its pages (10,753) each time by default, almost none with the settings
    applied (the heap's pages, once touched, are the next tensors')."""
    script = """
import resource, sys, torch
torch.set_num_threads(1)
from specverify.auditing.isolation import allocator
if sys.argv[1] == "applied":
    assert allocator.apply()
for _ in range(20):
    torch.empty(42 << 18).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(42 << 18).fill_(1.0)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 10)
"""
    faults = {}
    for mode in ("default", "applied"):
        run = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        faults[mode] = int(run.stdout.split()[-1])
    assert faults["default"] > 5_000 and faults["applied"] < 1_000, faults
