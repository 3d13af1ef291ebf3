"""Disables SIGALRM, then hangs."""
import signal
import time


def verify(target_probs, draft_probs, draft_tokens, generator):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.alarm(0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    while True:
        time.sleep(1)
