"""Is killed by a signal (SIGKILL, as the out-of-memory killer does) on its first call."""
import os
import signal


def verify(target_probs, draft_probs, draft_tokens, generator):
    os.kill(os.getpid(), signal.SIGKILL)
