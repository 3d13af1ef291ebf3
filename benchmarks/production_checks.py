"""The sampler audit's production-shape checks against the copy bandwidth of their own inputs.

    PYTHONPATH=. python benchmarks/production_checks.py --budget quick [--isolation none|process]

For each production-shape check of the sampler battery (``reference``, its plan in the whole
battery: Bonferroni over every statistical check, as in ``specverify audit``) it runs the check
alone and prints, in CPU seconds (this process and, with ``--isolation process``, the worker,
reaped before it is read, its start included), so that the figures mean something on a shared
machine:

- ``rows/CPU-s``: the rows (samples) the check pushed through the function per CPU second of the
  whole check (harness, transport, function, completion, statistics);
- ``copy rows/CPU-s``: the rows per CPU second of ``copy_()`` of one call's target and draft
  probabilities (their dtype and shape, contiguous, into buffers allocated before timing): what
  reading and writing the inputs once costs;
- ``of copy``: the ratio of the two (1.0: the check runs at the copy bandwidth of its inputs);
- ``function``: the share of the check's CPU spent inside the function (``--isolation none``
  only: the function is timed in this process);
- ``wall-s`` and ``rows/wall-s``: the check's wall seconds, and rows per wall second, in which
  the audit's work overlaps the function's (:meth:`GuardedFunction.call_each`, the identity
  designs made while a look draws) where CPU seconds add both.

``exact-large-vocabulary`` has no rows of its own size; its CPU seconds are printed alone.  The
package under test is whatever ``PYTHONPATH`` points to (another checkout: the "before" figures).
OpenMP's idle threads sleep (``OMP_WAIT_POLICY=PASSIVE`` unless set), as in ``specverify audit``:
threads spinning while the process waits for its worker would count as CPU seconds of the check.
With ``--isolation process`` this process runs each check on the audit's own intra-op threads
(:data:`specverify.auditing.isolation.process.AUDIT_THREADS`, where the checkout has them), as
``specverify audit`` does while the function runs in a worker.
"""

from __future__ import annotations

import argparse
import inspect
import os
import resource
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as ``specverify audit`` sets it, before torch loads

import torch  # noqa: E402

try:  # glibc's allocator as ``specverify audit`` sets it, in a checkout that does
    from specverify.auditing.isolation import allocator
except ImportError:
    allocator = None

try:  # the audit's own intra-op threads while its function runs in a worker, in a checkout that sets them
    from specverify.auditing.isolation.process import use_audit_threads
except ImportError:
    use_audit_threads = None

PRODUCTION = ("production-qwen-K1", "production-gpt2-K4", "production-K32", "production-K12", "production-batch-1024",
              "exact-large-vocabulary")


def cpu_seconds() -> float:
    """CPU seconds of this process and of its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class TimedFunction:
    """``reference`` with the CPU seconds spent inside it (in this process)."""

    def __init__(self) -> None:
        from specverify.core.rules import verify

        self.verify, self.seconds = verify, 0.0
        self.__signature__ = inspect.signature(verify)

    def __getattr__(self, name: str) -> Any:  # what the function declares (arithmetic, input_dtypes)
        return getattr(self.verify, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self.verify(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - started


def copy_rows_per_cpu_s(check: Any, repeats: int = 5) -> float:
    """Rows per CPU second of ``copy_()`` of one call's probability inputs at the check's shape."""
    bank = check.bank
    rows, k, vocab = check.rows_per_call, bank.num_draft, bank.vocab_size
    dtype = getattr(torch, check.dtype)
    sources = [torch.rand(rows, k + 1, vocab).to(dtype), torch.rand(rows, k, vocab).to(dtype)]
    targets = [torch.empty_like(source) for source in sources]
    for source, target in zip(sources, targets):
        target.copy_(source)
    started = time.process_time()
    for _ in range(repeats):
        for source, target in zip(sources, targets):
            target.copy_(source)
    return rows * repeats / (time.process_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--isolation", choices=("none", "process"), default="none")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    if allocator is not None:
        allocator.apply()

    from specverify.auditing.isolation.process import preserved_process_state
    from specverify.auditing.runner import load_battery, plan_checks

    battery = load_battery("sampler")
    budget = battery.resolve_budget(arguments.budget)
    timed = TimedFunction()
    probe = battery.open_session(timed, device="cpu", timeout_s=600, isolation="none")
    checks = battery.checks(probe)
    plans = dict(zip((c.name for c in checks), plan_checks(checks, budget, 1e-3, arguments.seed, "sampler")[0]))
    print(f"budget {arguments.budget}, isolation {arguments.isolation}, torch threads {torch.get_num_threads()}, "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}; CPU seconds")
    print(f"{'check':24s} {'n':>7s} {'CPU-s':>7s} {'rows/CPU-s':>11s} {'copy rows/CPU-s':>16s} {'of copy':>8s} "
          f"{'function':>9s} {'wall-s':>7s} {'rows/wall-s':>12s}")
    total = 0.0
    for check in checks:
        if check.name not in PRODUCTION:
            continue
        target: Any = "reference" if arguments.isolation == "process" else timed
        session = battery.open_session(target, device="cpu", timeout_s=600, isolation=arguments.isolation)
        timed.seconds = 0.0
        with preserved_process_state():
            if use_audit_threads is not None and session.function.runs_in_worker():
                use_audit_threads()
            started, began = cpu_seconds(), time.perf_counter()
            try:
                result = check.run(session, plans[check.name])
                wall = time.perf_counter() - began
            finally:
                session.function.close()
        seconds = cpu_seconds() - started
        total += seconds
        if check.name == "exact-large-vocabulary":
            print(f"{check.name:24s} {'':>7s} {seconds:7.2f} {'':>50s} {wall:7.2f}   ({result.verdict.value}, exact)")
            continue
        rows = session.function.log.rows
        copy = copy_rows_per_cpu_s(check)
        inside = f"{timed.seconds / seconds:9.2f}" if arguments.isolation == "none" else f"{'':>9s}"
        print(f"{check.name:24s} {rows:7d} {seconds:7.2f} {rows / seconds:11.0f} {copy:16.0f} "
              f"{rows / seconds / copy:8.3f} {inside} {wall:7.2f} {rows / wall:12.0f}   ({result.verdict.value})")
    print(f"{'all six':24s} {'':>7s} {total:7.2f}")


if __name__ == "__main__":
    main()
