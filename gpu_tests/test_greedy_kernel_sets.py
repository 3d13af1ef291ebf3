"""Greedy identity in bfloat16 and float16 on CPU under every kernel set torch can pick.

Torch picks its CPU kernels (``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``, ``avx512``) once, at
import, and reduced-precision rounding depends on them: on an AVX-512 machine the decoder that
accepts every draft unchecked once diverged at a near-tie (margin 0.125 nats) under the AVX-512
kernels only.  So each case runs :mod:`gpu_tests.identity_power` in a subprocess with
``ATEN_CPU_CAPABILITY`` set: τ is calibrated on those kernels (plain greedy decoding against itself,
teacher-forced in the dtype and in float32), the lossless reference decoder must pass and every
planted bug (accept every draft, logits one position late, a stale KV entry) must fail.  A
capability the CPU lacks (torch then picks another) skips with the reason.

Cost (SmolLM2-135M, one thread, measured on an AVX-512 EPYC): bfloat16, 4 prompts × 32 tokens,
the four decoders: 30-36 CPU-s per kernel set; float16, 2 prompts × 24 tokens, the lossless decoder
and accept-every-draft: ~22 CPU-s (AVX2, AVX-512).  float16 under the scalar ``default`` kernels
costs ~10× more (a 64-token forward pass 20 s, against 2.3 s with AVX-512: 58 CPU-s for one prompt
of 16 tokens), so the default run has one prompt of 16 tokens there; ``-m slow`` runs the larger
variants of every case (8 prompts × 64 tokens, all decoders; float16 on ``default``: 2 × 32).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_tests import identity_power

ROOT = Path(__file__).resolve().parent.parent
ALL = tuple(identity_power.BUGS)
FAST_FP16 = ("lossless", "accept-every-draft")


def kernel_cases():
    """(capability, dtype, prompts, tokens, decoders) with the marks of the default run or ``slow``.

    The default run forces the scalar kernel set (``default``), the one furthest from what torch
    picks itself on any x86 CPU; the forced AVX2 and AVX-512 cases run with ``-m slow`` (on a CPU
    that has them, torch's own pick is one of them and the default run's other greedy identity
    tests, ``test_greedy_identity.py``, run on it)."""
    for capability in ("default", "avx2", "avx512"):
        beyond_default_run = [] if capability == "default" else [pytest.mark.slow]
        yield pytest.param(capability, "bfloat16", 4, 32, ALL, id=f"{capability}-bfloat16", marks=beyond_default_run)
        yield pytest.param(capability, "bfloat16", 8, 64, ALL, id=f"{capability}-bfloat16-8x64", marks=pytest.mark.slow)
        if capability == "default":
            # The scalar fp16 kernels are ~10x slower: the default run takes one prompt of 16 tokens.
            yield pytest.param(capability, "float16", 1, 16, FAST_FP16, id=f"{capability}-float16")
            yield pytest.param(capability, "float16", 2, 32, ALL, id=f"{capability}-float16-2x32",
                               marks=pytest.mark.slow)
        else:
            yield pytest.param(capability, "float16", 2, 24, FAST_FP16, id=f"{capability}-float16",
                               marks=beyond_default_run)
            yield pytest.param(capability, "float16", 8, 64, ALL, id=f"{capability}-float16-8x64",
                               marks=pytest.mark.slow)


@pytest.mark.parametrize("capability,dtype,prompts,tokens,decoders", list(kernel_cases()))
def test_greedy_identity_under_each_kernel_set(model_specs, identity_log, capability, dtype, prompts, tokens, decoders):
    target, _ = model_specs["default"]
    command = [sys.executable, "-m", "gpu_tests.identity_power", "--capability", capability, "--target", target,
               "--dtype", dtype, "--prompts", str(prompts), "--tokens", str(tokens), "--decoders", *decoders]
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "unsupported" in result:
        pytest.skip(result["unsupported"])
    identity_log({"test": f"kernel-set-{capability}-{dtype}", "calibration": result["calibration"]})
    for name, record in result["decoders"].items():
        identity_log({"decoder": name, "dtype": dtype, "capability": result["capability"],
                      **{k: v for k, v in record.items() if k != "report"}})
    verdicts = {name: record["passed"] for name, record in result["decoders"].items()}
    assert verdicts == {name: name == "lossless" for name in decoders}, "\n".join(
        f"{name}:\n{record['report']}" for name, record in result["decoders"].items())
