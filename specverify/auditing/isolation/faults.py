"""Guarded calls of an implementation under audit: deadline, exception capture, output validation
and global-RNG detection (input mutation: :class:`specverify.auditing.isolation.presentation.Presenter`).

An audit must survive whatever the function does.  Everything that goes wrong inside one call is
turned into a :class:`Fault` (an exception carrying a ``kind`` and a readable message) that the
audit records against the check that made the call; it never propagates as the function's own
exception and never ends the audit process.

Fault kinds and what the audit does with them (the exit status of ``specverify audit``):

==================  ===================================================================  ====
kind                meaning                                                              exit
==================  ===================================================================  ====
``exception``       the function raised                                                     2
``timeout``         one call ran longer than the per-call deadline                          2
``malformed``       the output breaks SPEC §1's layout (type, shape, dtype, NaN, id         2
                    range, padding)
``impossible``      the layout is right but no lossless rule emits these tokens (a          1
                    non-draft token in an accepted slot, a path off the tree, a token
                    of target probability 0): a loss, proved by one output
``mutation``        the function modified one of its input tensors in place                1
``global-rng``      randomness not taken from ``generator``'s stream: the output changes      1
                    with the global RNG seeds (or between equal runs) while the
                    generator's seed is fixed, or repeats although the generator advanced
``aliasing``        the output is a view of a buffer the function overwrites on its next       1
                    call, so a caller keeping one step's output sees it change
==================  ===================================================================  ====

An ``exception`` also covers a worker process that ended abnormally (an exit call, a signal, a
lost pipe; :mod:`specverify.auditing.isolation.process` names which).  The first three make the audit
"could not audit" (there is no output to judge); ``impossible`` fails the check as a loss (the
tokens are well formed, and impossible under the law: a kernel that mixes requests or ignores the
target's zeros, not a broken adapter); the last three are
contract violations judged as failures, because the function did produce outputs and they break
the contract every engine relies on (inputs are shared buffers; seeded generation must be
reproducible; outputs are kept across steps).
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from specverify.core import outputs
from specverify.errors import SpecverifyError


class FaultKind(StrEnum):
    """What went wrong in one call (the module table).  The first three leave nothing to judge
    ("could not audit"); ``impossible`` is a loss; the last three are contract violations judged
    as failures."""

    EXCEPTION = "exception"
    TIMEOUT = "timeout"
    MALFORMED = "malformed"
    IMPOSSIBLE = "impossible"
    MUTATION = "mutation"
    GLOBAL_RNG = "global-rng"
    ALIASING = "aliasing"

    @property
    def violates_contract(self) -> bool:
        """True when the function did produce output, and that output breaks the contract."""
        return self in (FaultKind.MUTATION, FaultKind.GLOBAL_RNG, FaultKind.ALIASING)

    @property
    def fails_check(self) -> bool:
        """True when the fault is itself a verdict against the function: a loss (``impossible``)
        or a contract violation; False when it leaves nothing to judge."""
        return self is FaultKind.IMPOSSIBLE or self.violates_contract


class Fault(SpecverifyError):
    """Something the implementation under audit did wrong in one call (see the module table)."""

    def __init__(self, kind: FaultKind | str, message: str) -> None:
        try:
            kind = FaultKind(kind)
        except ValueError:
            raise ValueError(f"kind: expected one of {[k.value for k in FaultKind]}, got {kind!r}") from None
        super().__init__(message)
        self.kind = kind
        self.message = message


class CutOff(BaseException):
    """A call not started, or stopped, at the caller's cutoff (a deadline of the audit's own, such as
    the post-verdict budget of :mod:`specverify.auditing.post_verdict`), not of the function: no
    fault of the function.  A BaseException, so that no handler of the function's errors
    (``except Exception``) turns it into one."""


class _DeadlineExceeded(BaseException):
    """Raised inside the function by the alarm signal; a BaseException so that a function's own
    ``except Exception`` cannot swallow it."""


# --------------------------------------------------------------------------------------------
# Deadline and exception capture
# --------------------------------------------------------------------------------------------


def call_with_deadline(fn: Callable[..., Any], args: tuple, timeout_s: float, *, what: str = "the function") -> Any:
    """Return ``fn(*args)``, or raise a :class:`Fault` of kind ``timeout`` or ``exception``.

    In the main thread of a Unix process the deadline is an interval timer (``SIGALRM``): the
    call is interrupted at the next Python bytecode after ``timeout_s`` seconds.  Elsewhere the
    call runs in a daemon worker thread that the caller stops waiting for at the deadline (the
    thread cannot be killed and is abandoned; the audit stops calling the function after that).
    A :class:`Fault` raised inside (by a guard around an inner call) passes through unchanged.
    A call that blocks inside C code without returning to Python is only interrupted when it does.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        return _call_with_alarm(fn, args, timeout_s, what)
    return _call_in_thread(fn, args, timeout_s, what)


def _timeout_fault(timeout_s: float, what: str) -> Fault:
    return Fault("timeout", f"{what} did not return within the per-call timeout of {timeout_s:g} s "
                            "(raise it with --timeout / timeout_s= if the function is just slow)")


def _exception_fault(error: BaseException, what: str) -> Fault:
    return Fault("exception", f"{what} raised {type(error).__name__}: {error}")


def _call_with_alarm(fn: Callable[..., Any], args: tuple, timeout_s: float, what: str) -> Any:
    armed = [True]  # an alarm landing after the call returned must not raise in the caller's code

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise _DeadlineExceeded

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_timer = signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        result = fn(*args)
        armed[0] = False
        return result
    except _DeadlineExceeded:
        raise _timeout_fault(timeout_s, what) from None
    except Fault:
        raise
    except (Exception, SystemExit) as error:  # KeyboardInterrupt still stops the audit
        raise _exception_fault(error, what) from error
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_timer[0] > 0:  # someone else's timer was running: give it back its remainder
            signal.setitimer(signal.ITIMER_REAL, *previous_timer)


def _call_in_thread(fn: Callable[..., Any], args: tuple, timeout_s: float, what: str) -> Any:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as error:  # reported to the caller below
            outcome["error"] = error

    worker = threading.Thread(target=target, name="specverify-audit-call", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _timeout_fault(timeout_s, what)
    if isinstance(outcome.get("error"), (Fault, CutOff)):
        raise outcome["error"]
    if "error" in outcome:
        raise _exception_fault(outcome["error"], what) from outcome["error"]
    return outcome["value"]


# --------------------------------------------------------------------------------------------
# Output validation (SPEC §1, §2): specverify.core.outputs, as faults
# --------------------------------------------------------------------------------------------


def _malformed_as_fault(validate: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return validate(*args, **kwargs)
    except outputs.MalformedOutput as error:
        raise Fault(FaultKind.MALFORMED, str(error)) from None
    except outputs.ImpossibleOutput as error:
        raise Fault(FaultKind.IMPOSSIBLE, f"impossible output: {error}") from None


def validate_emitted(result: Any, draft_tokens: torch.Tensor, vocab_size: int,
                     target_probs: torch.Tensor | None = None,
                     num_draft_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specverify.core.outputs.validate_emitted` for a guarded call: the violations of the
    output become one :class:`Fault`, of kind ``malformed`` (layout) or ``impossible`` (tokens no
    lossless rule emits; ``target_probs`` adds the zero-probability test, ``num_draft_tokens`` the
    ragged rows' lengths)."""
    return _malformed_as_fault(outputs.validate_emitted, result, draft_tokens, vocab_size, target_probs=target_probs,
                               num_draft_tokens=num_draft_tokens)


def validate_tree_emitted(result: Any, tree_tokens: torch.Tensor, parents: torch.Tensor, vocab_size: int,
                          target_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`specverify.core.outputs.validate_tree_emitted` for a guarded call (SPEC §3)."""
    return _malformed_as_fault(outputs.validate_tree_emitted, result, tree_tokens, parents, vocab_size,
                               target_probs=target_probs)


def validate_new_tokens(result: Any, max_new_tokens: int, vocab_size: int) -> torch.Tensor:
    """:func:`specverify.core.outputs.validate_new_tokens` for a guarded call (SPEC §2)."""
    return _malformed_as_fault(outputs.validate_new_tokens, result, max_new_tokens, vocab_size)


# --------------------------------------------------------------------------------------------
# Global RNG
# --------------------------------------------------------------------------------------------


@contextmanager
def preserved_global_rng() -> Iterator[None]:
    """Save the global torch (CPU and CUDA), numpy and ``random`` RNG states and restore them on exit,
    so that reseeding them for an audit leaves the caller's process untouched."""
    torch_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    numpy_state = np.random.get_state()
    python_state = random.getstate()
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        np.random.set_state(numpy_state)
        random.setstate(python_state)


def seed_global_rng(seed: int) -> None:
    """Seed every global RNG a function could reach for: torch (all devices), numpy and ``random``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


@dataclass(frozen=True)
class RngProbe:
    """Outcome of :func:`probe_randomness`.

    repeatable: two runs with equal generator seeds and equal global seeds agreed.
    independent_of_global: a run with the same generator seed but other global seeds agreed too.
    advances: a second call with the same (already used) generator gave a different output.
    """

    repeatable: bool
    independent_of_global: bool
    advances: bool

    @property
    def uses_only_generator(self) -> bool:
        return self.repeatable and self.independent_of_global and self.advances


def probe_randomness(run: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]], generator_seed: int,
                     global_seeds: tuple[int, int]) -> RngProbe:
    """Detect randomness that does not come from the generator's stream.

    ``run(generator_seed, global_seed)`` seeds the global RNGs with ``global_seed``, creates one
    generator seeded with ``generator_seed``, calls the function twice with it on the same fixed
    inputs (whose outputs are random for a lossless rule) and returns both outputs.

    - A function that draws only from its generator repeats its first output for every global seed.
    - One that draws from the global torch/numpy/``random`` RNG changes with the global seed.
    - One that draws from elsewhere (the OS, the clock) changes even between two equal runs.
    - One that reseeds (or ignores) the generator repeats itself on the second call, although the
      generator has advanced: successive steps then reuse the same randomness.
    """
    first_seed, second_seed = global_seeds
    with preserved_global_rng():
        first, second = run(generator_seed, first_seed)
        repeat, _ = run(generator_seed, first_seed)
        other, _ = run(generator_seed, second_seed)
    return RngProbe(torch.equal(first, repeat), torch.equal(first, other), not torch.equal(first, second))
