"""A SPEC §3 verify_tree that disables SIGALRM, then hangs."""
import signal
import time


def verify_tree(target_probs, draft_probs, tree_tokens, parents, generator):
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.alarm(0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    while True:
        time.sleep(1)
