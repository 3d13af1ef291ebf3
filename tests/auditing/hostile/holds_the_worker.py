"""The reference rule, whose first call leaves a thread that never yields the GIL: after that
call returns, the worker's main thread never runs again, so the worker cannot answer a request to
stop (only a kill ends it)."""
import sys
import threading

from specverify.core.rules import verify as reference

STARTED = []


def _spin():
    sys.setswitchinterval(10**6)  # this thread keeps the GIL for as long as it runs Python code
    while True:
        pass


def verify(target_probs, draft_probs, draft_tokens, generator):
    if not STARTED:
        STARTED.append(threading.Thread(target=_spin, daemon=True))
        STARTED[0].start()
    return reference(target_probs, draft_probs, draft_tokens, generator)
