"""The reference rule, after starting a non-daemon thread that never ends."""
import threading
import time

from specverify.core.rules import verify as reference

STARTED = []


def verify(target_probs, draft_probs, draft_tokens, generator):
    if not STARTED:
        STARTED.append(threading.Thread(target=lambda: time.sleep(10**6), daemon=False))
        STARTED[0].start()
    return reference(target_probs, draft_probs, draft_tokens, generator)
