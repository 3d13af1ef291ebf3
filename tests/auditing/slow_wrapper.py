"""A correct, per-call-drawing SPEC §1 function made slow and of varying speed: the worked example
examples/vllm_style_adapter.py (which, like every engine, draws the whole batch's bonus tokens first,
so its tokens depend on which rows share a call) behind a sleep of random length drawn from the OS
(it changes the timing, never the output)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from vllm_style_adapter import verify as fast_verify  # noqa: E402

_entropy = random.SystemRandom()

SLEEP_S = 0.004
"""Upper end of the per-call sleep (uniform in [0, SLEEP_S]) plus SLEEP_PER_ROW_S per row."""

SLEEP_PER_ROW_S = 2e-6


def verify(target_probs, draft_probs, draft_tokens, generator):
    time.sleep(_entropy.uniform(0.0, SLEEP_S) + SLEEP_PER_ROW_S * target_probs.shape[0] * _entropy.random())
    return fast_verify(target_probs, draft_probs, draft_tokens, generator)
