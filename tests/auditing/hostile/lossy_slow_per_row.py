"""Lossy AND slow: examples/buggy_bonus.py (the bonus token drawn from q_{K−1}) behind a sleep of
2 ms per row, ~500 rows/s: a few hundred times slower than the reference rule, as a per-row Python
loop over a real model's vocabulary can be."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from buggy_bonus import verify as lossy_verify  # noqa: E402

SECONDS_PER_ROW = 0.002


def verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    time.sleep(SECONDS_PER_ROW * draft_tokens.shape[0])
    return lossy_verify(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
