"""Lossy, then very slow: examples/buggy_bonus.py (the bonus token drawn from q_{K−1}) at full speed
until the file named by $SPECVERIFY_TEST_SLOW_MARKER exists, then a sleep of 30 s before every call.
A test creates the file when the audit announces its post-verdict steps, so every call after the
verdict outlasts any post-verdict budget."""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))

from buggy_bonus import verify as lossy_verify  # noqa: E402

SLOW_CALL_S = 30.0


def verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    marker = os.environ.get("SPECVERIFY_TEST_SLOW_MARKER")
    if marker and os.path.exists(marker):
        time.sleep(SLOW_CALL_S)
    return lossy_verify(target_probs, draft_probs, draft_tokens, generator, uniforms=uniforms)
