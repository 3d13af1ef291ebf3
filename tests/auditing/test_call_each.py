"""GuardedFunction.call_each and call_each_in_groups: the audit's work overlaps the function's
calls, and nothing else changes.  The calls, their arguments and their outputs are those of one
call (or one call_groups) per proposal, in a worker and in-process; a fault in one call, or a
caller that stops early, leaves the worker idle for the next call (the request still in flight is
awaited, not answered to someone else)."""

from __future__ import annotations

import pytest
import torch

from specverify.auditing.isolation.faults import Fault
from specverify.auditing.isolation.guarded import GuardedFunction
from specverify.auditing.sampler.battery import positional_family_bank
from specverify.core.rules import verify as reference
from specverify.testing.harness import propose

CALLS = [0]


def out_of_range_on_third_call(target_probs, draft_probs, draft_tokens, generator):
    """The reference, except that its third call emits the id V (found by the audit's own
    validation of the output, after the next call was sent)."""
    CALLS[0] += 1
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    if CALLS[0] == 3:
        emitted[:, 0] = target_probs.shape[-1]
    return emitted


def _proposals(count: int, rows: int = 48) -> list:
    bank = positional_family_bank("partition", "random", 4, 2, 3)
    generator = torch.Generator().manual_seed(7)
    return [propose(bank, bank.initial_state(torch.arange(rows) % 3), 2, generator) for _ in range(count)]


def _function(isolation: str, name: str = "reference") -> GuardedFunction:
    target = f"{__file__}:{name}" if isolation == "process" and name != "reference" else "reference"
    return GuardedFunction(target if isolation == "process" else reference, timeout_s=60, isolation=isolation)


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_call_each_makes_the_calls_of_one_call_per_proposal(isolation):
    proposals = _proposals(6)
    one_by_one, overlapped = _function(isolation), _function(isolation)
    try:
        generator = one_by_one.generator(3)
        expected = [one_by_one(proposal, generator, where="one by one") for proposal in proposals]
        got = list(overlapped.call_each(enumerate(proposals), overlapped.generator(3), where="overlapped"))
        assert [tag for tag, _, _ in got] == list(range(6))
        for (emitted, lengths), (_, got_emitted, got_lengths) in zip(expected, got):
            assert torch.equal(emitted, got_emitted) and torch.equal(lengths, got_lengths)
        assert overlapped.log.calls == one_by_one.log.calls == 6
        assert overlapped.log.rows == one_by_one.log.rows == 6 * 48
        assert not overlapped.log.mutations and not overlapped.log.losses
    finally:
        one_by_one.close()
        overlapped.close()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_call_each_in_groups_makes_the_calls_of_call_groups_on_each_proposal(isolation):
    """Groups of 1 to 5 rows, a different partition for each proposal: the same outputs, calls and
    rows as one call_groups per proposal, one request per proposal in a worker."""
    proposals = _proposals(4, rows=15)
    partitions = [[1] * 15, [5, 5, 5], [2, 3, 4, 6], [15]]
    one_by_one, overlapped = _function(isolation), _function(isolation)
    try:
        generator = one_by_one.generator(3)
        expected = [one_by_one.call_groups(proposal, generator, sizes, where="one by one")
                    for proposal, sizes in zip(proposals, partitions)]
        got = list(overlapped.call_each_in_groups(
            ((number, proposal, sizes) for number, (proposal, sizes) in enumerate(zip(proposals, partitions))),
            overlapped.generator(3), where="overlapped"))
        assert [tag for tag, _, _ in got] == list(range(4))
        for (emitted, lengths), (_, got_emitted, got_lengths) in zip(expected, got):
            assert torch.equal(emitted, got_emitted) and torch.equal(lengths, got_lengths)
        assert overlapped.log.calls == one_by_one.log.calls == sum(len(sizes) for sizes in partitions)
        assert overlapped.log.rows == one_by_one.log.rows == 4 * 15
        with pytest.raises(ValueError, match="sizes: expected positive group sizes summing to 15"):
            list(overlapped.call_each_in_groups([(0, proposals[0], [7, 7])], overlapped.generator(4), where="bad"))
    finally:
        one_by_one.close()
        overlapped.close()


def test_call_each_builds_the_next_proposal_before_awaiting_the_current_call():
    """The order of events: proposal i+1 is taken from the caller's iterator before call i's
    output is handed back, so the caller's work on it overlaps the function's."""
    events: list[str] = []
    proposals = _proposals(3)

    def items():
        for number, proposal in enumerate(proposals):
            events.append(f"built {number}")
            yield number, proposal

    function = _function("process")
    try:
        for number, _, _ in function.call_each(items(), function.generator(0), where="order"):
            events.append(f"output {number}")
    finally:
        function.close()
    assert events == ["built 0", "built 1", "output 0", "built 2", "output 1", "output 2"]


def test_a_fault_in_one_call_leaves_the_worker_idle_for_the_next():
    proposals = _proposals(5)
    function = _function("process", "out_of_range_on_third_call")
    try:
        seen = []
        with pytest.raises(Fault) as fault:
            for number, _, _ in function.call_each(enumerate(proposals), function.generator(0), where="faulty"):
                seen.append(number)
        assert fault.value.kind == "malformed" and "outside [0, 4)" in str(fault.value) and seen == [0, 1]
        assert function.log.calls == 4  # call 3 was in flight when call 2's output failed validation
        emitted, _ = function(proposals[4], function.generator(1), where="after the fault")
        expected, _ = _function("none")(proposals[4], torch.Generator().manual_seed(1), where="expected")
        assert torch.equal(emitted, expected) and function.log.restarts == 0
    finally:
        function.close()


def test_a_caller_that_stops_early_leaves_the_worker_idle_for_the_next_call():
    proposals = _proposals(4)
    function = _function("process")
    try:
        calls = function.call_each(enumerate(proposals), function.generator(0), where="stopped early")
        for number, _, _ in calls:
            if number == 1:
                break
        calls.close()
        assert function.log.calls == 3  # calls 0 and 1, and call 2, in flight when the caller stopped
        emitted, _ = function(proposals[3], function.generator(5), where="after stopping")
        assert emitted.shape == (48, 3) and function.log.calls == 4 and function.log.restarts == 0
    finally:
        function.close()
