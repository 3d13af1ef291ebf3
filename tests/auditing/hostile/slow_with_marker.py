"""Correct but slow (1 ms per row); touches $SPECVERIFY_TEST_MARKER on its first call, so a test
knows the audit is running its checks."""
import os
import time
from pathlib import Path

from specverify.core.rules import verify as reference


def verify(target_probs, draft_probs, draft_tokens, generator):
    marker = os.environ.get("SPECVERIFY_TEST_MARKER")
    if marker and not os.path.exists(marker):
        Path(marker).write_text("called")
    time.sleep(0.001 * draft_tokens.shape[0])
    return reference(target_probs, draft_probs, draft_tokens, generator)
