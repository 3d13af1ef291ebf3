"""Strided presentation: inputs reach the function as views of wider buffers whose padding holds a
valid decoy, in the audit's own process and in a worker, so a function that ignores strides emits
wrong tokens instead of crashing."""

from __future__ import annotations

import sys

import pytest
import torch

from specverify.auditing.isolation.faults import Fault
from specverify.auditing.isolation.guarded import GuardedFunction, GuardedTreeFunction
from specverify.auditing.isolation.presentation import STRIDE_PAD, decoy_value, presented
from specverify.auditing.sampler.battery import positional_family_bank
from specverify.core.rules import verify as reference
from specverify.core.tree_rules import verify_tree
from specverify.testing.harness import propose


def test_a_presented_input_is_a_view_of_a_wider_buffer_with_decoy_padding():
    tensor = torch.rand(3, 4, 5)
    view = presented(tensor, device=torch.device("cpu"), strided=True, decoy=decoy_value("target_probs", 5))
    assert torch.equal(view, tensor) and not view.is_contiguous()
    assert view.stride() == (5 * (5 + STRIDE_PAD), 5 + STRIDE_PAD, 1)
    wide = view.as_strided((3, 5, 5 + STRIDE_PAD), view.stride())
    assert torch.all(wide[:, 4] == 0.2) and torch.all(wide[:, :, 5:] == 0.2)


def contiguity_of_inputs(target_probs, draft_probs, draft_tokens, generator):
    """Emits the reference's tokens, then records in slot K whether every input was contiguous
    (-1 padding elsewhere is kept): a probe of what the function received."""
    emitted = reference(target_probs, draft_probs, draft_tokens, generator)
    contiguous = all(t.is_contiguous() for t in (target_probs, draft_probs, draft_tokens))
    return emitted if not contiguous else emitted.fill_(-7)  # -7: malformed on purpose


def reads_as_if_contiguous(target_probs, draft_probs, draft_tokens, generator):
    """A kernel (no input validation, like most) that indexes its inputs with the strides of
    contiguous tensors."""
    from tests.auditing.precision_rules import float32_rule

    def flat(tensor):
        return torch.as_strided(tensor, tensor.shape, torch.empty(tensor.shape).stride())
    return float32_rule(flat(target_probs), flat(draft_probs), flat(draft_tokens), generator)


def _proposal(rows=64, vocab=6, num_draft=3):
    bank = positional_family_bank("presentation", "random", vocab, num_draft, 2)
    return propose(bank, bank.initial_state(torch.arange(rows) % 2), num_draft, torch.Generator().manual_seed(3))


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_the_function_receives_strided_views(isolation):
    function = GuardedFunction(f"{__file__}:contiguity_of_inputs" if isolation == "process" else contiguity_of_inputs,
                               timeout_s=60, isolation=isolation)
    try:
        proposal = _proposal()
        emitted, _ = function(proposal, function.generator(1), where="strided", strided=True)
        expected, _ = function(proposal, function.generator(1), where="strided again", strided=True)
        assert torch.equal(emitted, expected) and bool((emitted >= -1).all())
        assert not function.log.mutations
    finally:
        function.close()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_stride_ignoring_function_is_caught_as_a_loss_not_a_crash(isolation):
    # It reads other rows' drafts and laws: its tokens are impossible (a loss, exit 1), where the
    # contiguous presentation lets it pass.
    target = f"{__file__}:reads_as_if_contiguous" if isolation == "process" else reads_as_if_contiguous
    function = GuardedFunction(target, timeout_s=60, isolation=isolation)
    try:
        proposal = _proposal(rows=512)
        function(proposal, function.generator(5), where="contiguous")
        with pytest.raises(Fault) as caught:
            function(proposal, function.generator(5), where="strided", strided=True)
        assert caught.value.kind == "impossible" and "accepted slot" in caught.value.message
    finally:
        function.close()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_tree_inputs_can_be_strided_too(isolation):
    from specverify.testing.tree_harness import TreeProposal

    function = GuardedTreeFunction("specverify.core.tree_rules:verify_tree" if isolation == "process" else verify_tree,
                                   timeout_s=60, isolation=isolation)
    try:
        batch, nodes, vocab = 8, 3, 5
        target = torch.softmax(torch.randn(batch, nodes + 1, vocab, generator=torch.Generator().manual_seed(0)), -1)
        draft = torch.softmax(torch.randn(batch, nodes, vocab, generator=torch.Generator().manual_seed(1)), -1)
        tokens = torch.tensor([[1, 2, 3]] * batch)
        parents = torch.tensor([[-1, -1, 0]] * batch)
        proposal = TreeProposal(target, draft, tokens, parents)
        a = function(proposal, function.generator(2), where="contiguous")[0]
        b = function(proposal, function.generator(2), where="strided", strided=True)[0]
        assert torch.equal(a, b)
    finally:
        function.close()


def test_a_kept_storage_is_written_again_only_after_a_change():
    from specverify.auditing.isolation.presentation import Presenter, padding_of, same_bits, storage_shape

    law = torch.rand(2, 7)
    expanded = law.unsqueeze(0).expand(3, -1, -1)
    presenter = Presenter()
    slot = presenter.slot("target_probs", storage_shape((3, 2, 7), True), law.dtype, torch.device("cpu"))
    first = presenter.present(slot, expanded, 0.25)
    assert torch.equal(first, expanded) and all(same_bits(part, 0.25) for part in padding_of(slot.storage, (3, 2, 7)))
    assert not presenter.settle(slot, expanded)
    padding = padding_of(slot.storage, (3, 2, 7))[0]
    padding.fill_(9.0)  # what the slot holds is trusted: the same tensor is not written again
    presenter.present(slot, expanded, 0.25)
    assert padding.eq(9.0).all()
    assert not presenter.settle(slot, expanded)  # padding changed: not a mutation, but written next time
    presenter.present(slot, expanded, 0.25)
    assert padding.eq(0.25).all()
    first[1, 0, 3] += 1.0  # the function modifies its input: reported, and written again next time
    assert presenter.settle(slot, expanded)
    again = presenter.present(slot, expanded, 0.25)
    assert torch.equal(again, expanded) and not presenter.settle(slot, expanded)
    presenter.present(slot, expanded, 0.25)  # a call that raised is never settled: written again
    first[0, 0, 0] = -1.0
    presenter.present(slot, expanded, 0.25)
    assert torch.equal(first, expanded)
    other = expanded.clone()  # another tensor with the same values is written (nothing is assumed)
    assert torch.equal(presenter.present(slot, other, 0.25), other) and not presenter.settle(slot, other)


def test_a_new_input_of_the_same_shape_is_written_into_the_block_only_when_the_padding_was_kept():
    from specverify.auditing.isolation.presentation import Presenter, padding_of, same_bits, storage_shape

    presenter = Presenter()
    slot = presenter.slot("target_probs", storage_shape((3, 2, 7), True), torch.float32, torch.device("cpu"))
    first = torch.rand(3, 2, 7)
    presenter.present(slot, first, 0.25)
    assert not presenter.settle(slot, first)
    padding = padding_of(slot.storage, (3, 2, 7))[0]
    padding.fill_(9.0)  # the settled padding is trusted: a new block of the same shape leaves it alone
    second = torch.rand(3, 2, 7)
    assert torch.equal(presenter.present(slot, second, 0.25), second) and padding.eq(9.0).all()
    assert not presenter.settle(slot, second)  # padding changed: not a mutation, but written next time
    third = torch.rand(3, 2, 7)
    assert torch.equal(presenter.present(slot, third, 0.25), third) and padding.eq(0.25).all()
    assert not presenter.settle(slot, third)
    smaller = torch.rand(2, 2, 7)  # another shape: another padding, written whole
    padding.fill_(9.0)
    presenter.present(slot, smaller, 0.25)
    assert all(same_bits(part, 0.25) for part in padding_of(slot.storage, (2, 2, 7)))
    assert not presenter.settle(slot, smaller)
    presenter.present(slot, third, 0.5)  # another decoy: written whole
    assert all(same_bits(part, 0.5) for part in padding_of(slot.storage, (3, 2, 7)))


def test_a_negative_zero_written_over_a_zero_is_no_mutation_but_is_written_again():
    from specverify.auditing.isolation.presentation import Presenter

    tensor = torch.zeros(2, 3)
    presenter = Presenter()
    slot = presenter.slot("draft_probs", (2, 3), tensor.dtype, torch.device("cpu"))
    view = presenter.present(slot, tensor, 0.5)
    view[0, 0] = -0.0
    assert not presenter.settle(slot, tensor) and slot.source is None
    presenter.present(slot, tensor, 0.5)
    assert not torch.signbit(view[0, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_same_bits_compares_broadcast_views_and_scalars(dtype):
    from specverify.auditing.isolation.presentation import same_bits

    row = (torch.arange(300) % 7).to(dtype)
    wide = row.expand(1000, 300)
    copy = wide.clone()
    assert same_bits(copy, wide) and same_bits(copy[:, :0], wide[:, :0])
    copy[999, 299] = 8
    assert not same_bits(copy, wide)
    assert same_bits(torch.full((5, 4), 3, dtype=dtype), 3) and not same_bits(torch.full((5, 4), 3, dtype=dtype), 2)


def layout_and_padding(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    """What a direct call received: each input's shape, strides and storage offset, and the
    entries its storage holds past the view (the decoy padding of a strided presentation)."""
    def seen(tensor):
        wide = tensor.as_strided((tensor.numel() + (tensor.stride()[0] if tensor.dim() > 1 else 0),), (1,),
                                 tensor.storage_offset())
        return (tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(), wide.double().sum().item())
    return [seen(t) for t in (target_probs, draft_probs, draft_tokens)] + [None if uniforms is None else
                                                                          uniforms.sum().item()]


def test_a_direct_call_in_a_worker_gets_its_inputs_with_their_layout():
    proposal = _proposal(rows=8)
    vocab = proposal.target_probs.shape[-1]
    inputs = [presented(t, device=torch.device("cpu"), strided=True, decoy=decoy_value(name, vocab))
              for name, t in zip(("target_probs", "draft_probs", "draft_tokens"), proposal)]
    shifted = torch.rand(20, dtype=torch.float64)[4:]  # a view at a storage offset
    expected = layout_and_padding(*inputs, None, uniforms=shifted)
    function = GuardedFunction(f"{__file__}:layout_and_padding", timeout_s=60, isolation="process")
    try:
        assert function.raw(*inputs, None, uniforms=shifted) == expected
        assert not inputs[0].is_contiguous() and expected[0][2] == 0 and shifted.storage_offset() == 4
    finally:
        function.close()


def sums_then_doubles(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    """What a direct call received (the sum of each input), after which it doubles every input in place."""
    seen = [float(t.double().sum()) for t in (target_probs, draft_probs, draft_tokens, uniforms)]
    for tensor in (target_probs, draft_probs, draft_tokens, uniforms):
        tensor.mul_(2)
    return seen


def sums(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    return [float(t.double().sum()) for t in (target_probs, draft_probs, draft_tokens, uniforms)]


@pytest.mark.parametrize("name", ["sums", "sums_then_doubles"])
def test_direct_calls_on_the_same_inputs_present_them_once_unless_the_function_wrote_them(name, monkeypatch):
    from specverify.auditing.isolation import presentation, write_guard

    proposal = _proposal(rows=8)
    inputs = [presented(t, device=torch.device("cpu"), strided=True, decoy=0.0) for t in proposal]
    uniforms = torch.rand(8, 4, dtype=torch.float64)
    writes = []  # the inputs the audit wrote into the shared buffer
    fill = presentation.fill_storage
    monkeypatch.setattr(presentation, "fill_storage", lambda storage, tensor, decoy: writes.append(1) or
                        fill(storage, tensor, decoy))
    expected = sums(*inputs, None, uniforms=uniforms)
    function = GuardedFunction(f"{__file__}:{name}", timeout_s=60, isolation="process")
    try:
        seen = [function.raw(*(t[:8] for t in inputs), None, uniforms=uniforms) for _ in range(4)]
    finally:
        function.close()
    assert seen == [expected] * 4  # every call gets its inputs as the audit holds them
    guarded = sys.platform == "linux" and write_guard.library() is not None
    assert len(writes) == (4 if name == "sums" and guarded else 16), writes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_same_bits_sees_one_changed_entry_in_long_rows(dtype):
    from specverify.auditing.isolation.presentation import MEMCMP_ROW_BYTES, same_bits

    vocab = MEMCMP_ROW_BYTES  # rows long enough for the row-by-row comparison
    law = torch.rand(1, 2, vocab).to(dtype)
    block = presented(law.expand(5, -1, -1), device=torch.device("cpu"), strided=True, decoy=0.25)
    assert same_bits(block, law.expand(5, -1, -1)) and not block.is_contiguous()
    wide = block.as_strided((5, 3, vocab + STRIDE_PAD), block.stride())
    assert same_bits(wide[:, :, vocab:], 0.25) and same_bits(wide[:, 2], 0.25)
    for row, position, token in ((0, 0, 0), (4, 1, vocab - 1), (2, 1, vocab // 2)):
        changed = block.clone()
        changed[row, position, token] = -changed[row, position, token] if changed[row, position, token] else 1.0
        assert not same_bits(changed, law.expand(5, -1, -1)), (row, position, token)
    wide[3, 2, 7] = 0.5
    assert not same_bits(wide[:, 2], 0.25)
    negative_zero = torch.zeros(2, vocab, dtype=dtype)
    assert not same_bits(-negative_zero, negative_zero)  # bits, not values


def test_direct_calls_on_leading_rows_of_the_same_inputs_present_them_once(monkeypatch):
    """A direct call on the leading rows of inputs the last call presented passes them within
    the span their slot holds: calls of 8, 5, 3 and 8 rows copy the inputs once, and each call
    sees exactly its rows."""
    from specverify.auditing.isolation import presentation, write_guard

    if sys.platform != "linux" or write_guard.library() is None:
        pytest.skip("the write guard needs Linux and a C compiler: unguarded, every call's inputs are written")
    proposal = _proposal(rows=8)
    inputs = [presented(t, device=torch.device("cpu"), strided=True, decoy=0.0) for t in proposal]
    uniforms = torch.rand(8, 4, dtype=torch.float64)
    writes = []
    fill = presentation.fill_storage
    monkeypatch.setattr(presentation, "fill_storage", lambda storage, tensor, decoy: writes.append(1) or
                        fill(storage, tensor, decoy))
    rows = (8, 5, 3, 8)
    expected = [sums(*(t[:r] for t in inputs), None, uniforms=uniforms[:r]) for r in rows]
    function = GuardedFunction(f"{__file__}:sums", timeout_s=60, isolation="process")
    try:
        seen = [function.raw(*(t[:r] for t in inputs), None, uniforms=uniforms[:r]) for r in rows]
    finally:
        function.close()
    assert seen == expected and len(writes) == 4, (seen, writes)


def test_a_region_keeps_its_content_only_while_every_call_has_it_at_the_same_place():
    from specverify.auditing.isolation.presentation import Presenter

    buffer, law = torch.zeros(64), torch.rand(16)
    presenter = Presenter()

    def present(key, start, size, regions, name="buffer"):
        presenter.use_regions(name, regions)
        slot = presenter.adopt(key, buffer[start:start + size])
        presenter.present(slot, law[:size], 0.0)
        presenter.settle(slot, law[:size], compare=False)

    present("a", 0, 16, {"a": (0, 16)})
    present("b", 16, 8, {"a": (0, 16), "b": (16, 8)})
    assert presenter.kept("a") is not None and presenter.kept("b") is not None
    presenter.use_regions("buffer", {"a": (0, 16), "c": (16, 32)})  # b's place taken by another region
    assert presenter.kept("a") is not None and presenter.kept("b") is None
    presenter.use_regions("buffer", {"a": (0, 8)})  # a at another place: its content is not trusted
    assert presenter.kept("a") is None
    present("a", 0, 16, {"a": (0, 16)})
    presenter.use_regions("another buffer", {"a": (0, 16)})
    assert presenter.kept("a") is None
