"""The one validator of what a verification step, a tree step or a decoder returns (SPEC §1, §3 and §2).

Every consumer of emitted tokens (the audit's guarded calls, the exact integrator, the property
suite) validates through this module and gets one of two exception types, each listing *every*
violation of one output at once (a float tensor of the wrong shape reports both its dtype and its
shape):

- :class:`MalformedOutput`: the output breaks the layout (type, dtype, shape, NaN, ids outside
  ``[0, V)``, tokens after padding, an empty row): there is nothing to judge;
- :class:`ImpossibleOutput`: the layout is right but the tokens are impossible under *any*
  lossless rule: a token other than the row's draft in an accepted slot (or, for a tree, accepted
  tokens that are no root-to-node path of the row's tree), or a token its target law gives
  probability 0 (:func:`zero_probability_tokens`).  Such a function did produce tokens, and they
  prove a loss: a verifier that reads another row's drafts or ignores the target's zeros emits
  exactly this.

SPEC §1 layout of ``emitted [B, K+1]``: row b holds ``m_b ≥ 1`` tokens in ``[0, V)``, then only
``-1``; its first ``m_b − 1`` tokens (the accepted slots) are the row's draft tokens, the last one
the correction-or-bonus token.  ``m_b`` is the row's emitted length.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specverify.errors import SpecverifyError


class MalformedOutput(SpecverifyError, ValueError):
    """An output that breaks the SPEC layout; ``violations`` lists every problem found."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(violations))


class ImpossibleOutput(SpecverifyError, ValueError):
    """An output of the right layout whose tokens no lossless rule can emit; ``violations`` lists them."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(violations))


def emitted_tensor(result: Any) -> torch.Tensor:
    """The ``emitted`` tensor of a return value: the tensor itself, or the ``emitted`` field of a
    result object such as :class:`specverify.core.rules.VerifyResult`."""
    if isinstance(result, torch.Tensor):
        return result
    emitted = getattr(result, "emitted", None)
    if isinstance(emitted, torch.Tensor):
        return emitted
    raise MalformedOutput([f"returned a {type(result).__name__}, expected an int64 tensor [B, K+1] of emitted tokens"])


def _tensor_format(tensor: torch.Tensor, shape: tuple[int, ...], shape_name: str) -> list[str]:
    """Violations of the tensor's storage (layout, device), dtype and shape, all at once."""
    problems = []
    if tensor.layout != torch.strided:
        problems.append(f"returned a tensor in the {tensor.layout} layout, expected a dense (strided) tensor "
                        "(call .to_dense())")
    if tensor.device.type == "meta":
        problems.append("returned a meta tensor, which holds no values (compute the tokens on a real device)")
    if tensor.dtype != torch.int64:
        problems.append(f"returned dtype {tensor.dtype}, expected torch.int64 (integer) "
                        "token ids (convert with .long())")
    if tuple(tensor.shape) != shape:
        problems.append(f"returned shape {tuple(tensor.shape)}, expected {shape_name} = {list(shape)}")
    return problems


def _integral_values(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as int64 on the CPU when its values are whole numbers, else None."""
    values = tensor.detach().cpu()
    if values.is_floating_point():
        if not bool(torch.isfinite(values).all()) or not bool((values == values.round()).all()):
            return None
    elif values.is_complex() or values.dtype == torch.bool:
        return None
    return values.to(torch.int64)


def validate_emitted(result: Any, draft_tokens: torch.Tensor | None, vocab_size: int,
                     *, num_positions: int | None = None,
                     target_probs: torch.Tensor | None = None,
                     num_draft_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Check one step's output against the SPEC §1 layout and return ``(emitted, lengths)`` on the CPU.

    ``draft_tokens [B, K]``: the row's draft tokens, which the accepted slots must repeat (None
    skips that check, for tree steps whose accepted slots are path tokens checked elsewhere; then
    ``num_positions`` gives K+1 and B is taken from the output).  Raises :class:`MalformedOutput`
    with every layout violation found, each naming the first offending row; an output of the right
    layout with a non-draft token in an accepted slot, or (given ``target_probs [B, K+1, V]``) a
    token of target probability 0, raises :class:`ImpossibleOutput`; so does, given
    ``num_draft_tokens [B]`` (ragged rows, docs/spec.md §1), a row with ``k_b`` drafts that emits
    more than ``k_b + 1`` tokens (it accepted padding).
    """
    tensor = emitted_tensor(result)
    if draft_tokens is not None:
        batch, num_draft = draft_tokens.shape
        width = num_draft + 1
    else:
        if num_positions is None:
            raise ValueError("num_positions: required when draft_tokens is None")
        batch, width = (tensor.shape[0] if tensor.dim() else 0), num_positions
    problems = _tensor_format(tensor, (batch, width), "[B, K+1]")
    if tensor.layout != torch.strided or tensor.device.type == "meta":
        raise MalformedOutput(problems)
    if tensor.is_floating_point() and bool(torch.isnan(tensor).any()):
        first = tuple(torch.isnan(tensor).nonzero()[0].tolist())
        problems.append(f"returned NaN token ids (first at index {first})")
    emitted = _integral_values(tensor) if tuple(tensor.shape) == (batch, width) else None
    if emitted is None:
        raise MalformedOutput(problems)
    values = emitted.numpy()  # the layout checks below are a few small vector operations: numpy's are cheaper
    padding = values == -1
    out_of_range = ~padding & ((values < 0) | (values >= vocab_size))
    if out_of_range.any():
        row, col = (int(i) for i in np.argwhere(out_of_range)[0])
        problems.append(f"returned token id {int(values[row, col])} outside [0, {vocab_size}) (row {row}, slot "
                        f"{col}; -1 is the only allowed padding)")
    first_padding = np.where(padding.any(axis=-1), padding.argmax(axis=-1), width)
    after_padding = ~padding & (np.arange(width) >= first_padding[:, None])
    if after_padding.any():
        row = int(np.argwhere(after_padding.any(axis=-1))[0, 0])
        problems.append(f"emitted a token after -1 padding (row {row}: {values[row].tolist()})")
    if (first_padding == 0).any():
        row = int(np.argwhere(first_padding == 0)[0, 0])
        problems.append(f"emitted no token in row {row} (every step emits at least the correction-or-bonus token)")
    if problems:
        raise MalformedOutput(problems)
    if draft_tokens is not None:
        accepted_slot = np.arange(width - 1)[None, :] < (first_padding[:, None] - 1)
        wrong_slot = accepted_slot & (values[:, : width - 1] != draft_tokens.cpu().numpy())
        if wrong_slot.any():
            rows = int(wrong_slot.any(axis=-1).sum())
            row, col = (int(i) for i in np.argwhere(wrong_slot)[0])
            raise ImpossibleOutput([
                f"emitted {int(values[row, col])} in accepted slot {col} of row {row}, but the draft token there "
                f"is {int(draft_tokens[row, col])} ({rows} of {batch} rows hold a non-draft token in an "
                "accepted slot): only the row's own accepted draft tokens may precede its one correction-or-bonus "
                "token; a rule that reads another row's drafts (or shifts them) emits exactly this"])
    if num_draft_tokens is not None:
        too_long = first_padding > num_draft_tokens.cpu().numpy() + 1
        if too_long.any():
            row = int(np.argwhere(too_long)[0, 0])
            raise ImpossibleOutput([
                f"emitted {int(first_padding[row])} tokens in row {row}, which has num_draft_tokens = "
                f"{int(num_draft_tokens[row])} ({int(too_long.sum())} of {batch} rows too long): a row with k_b drafts "
                "emits at most k_b + 1 tokens; a rule that reads the padding after a row's drafts as drafts emits "
                "exactly this"])
    lengths = torch.from_numpy(first_padding.astype(np.int64))
    if target_probs is not None:
        impossible = zero_probability_tokens(emitted, lengths, target_probs)
        if impossible is not None:
            raise impossible
    return emitted, lengths


def zero_probability_tokens(emitted: torch.Tensor, lengths: torch.Tensor, target_probs: torch.Tensor,
                            law_index: torch.Tensor | None = None) -> ImpossibleOutput | None:
    """The violation (or None) of emitted tokens that their target law gives probability 0.

    Slot j of row b was drawn from the target law ``target_probs[b, law_index[b, j]]`` (chain
    steps: ``law_index[b, j] = j``, the default; tree steps: 1 + the node the path reached before
    slot j, 0 at the root).  Under any lossless rule an accepted draft x has probability
    min(1, p(x)/q(x)) = 0 of acceptance when p(x) = 0, and the correction and bonus laws
    normalize(max(0, p − q)) and p put no mass where p = 0: such a token is impossible.
    """
    batch, width = emitted.shape
    used = torch.arange(width)[None, :] < lengths[:, None]
    tokens = emitted.clamp(min=0)
    laws = target_probs.detach().cpu()
    if law_index is None and laws.shape[1] == width:
        mass = laws.gather(2, tokens.unsqueeze(-1)).squeeze(-1)
    else:
        if law_index is None:
            law_index = torch.arange(width).expand(batch, width)
        rows = torch.arange(batch)[:, None].expand(batch, width)
        mass = laws[rows, law_index.clamp(min=0, max=laws.shape[1] - 1), tokens]
    zero = used & (mass == 0)
    if not bool(zero.any()):
        return None
    row, slot = (int(i) for i in zero.nonzero()[0])
    kind = "accepted draft" if slot < int(lengths[row]) - 1 else "correction-or-bonus token"
    return ImpossibleOutput([
        f"emitted token {int(emitted[row, slot])} in slot {slot} of row {row} (its {kind}), of target probability 0 "
        f"in that slot ({int(zero.sum())} such tokens in {int(zero.any(dim=-1).sum())} of {batch} rows): no lossless "
        "rule emits a token the target forbids"])


def validate_tree_emitted(result: Any, tree_tokens: torch.Tensor, parents: torch.Tensor, vocab_size: int,
                          target_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check one tree step's output against SPEC §3; return ``(emitted, lengths, last_node)`` on the CPU.

    The layout is SPEC §1's with ``K+1 = N+1`` slots (:func:`validate_emitted` without draft
    tokens); in addition the first ``m_b − 1`` tokens of row b must be the tokens of a
    root-to-node path of the row's tree (``tree_tokens``, ``parents [B, N]``).  With duplicate
    sibling tokens any matching child may continue the path; ``last_node`` is the lowest-index
    node ending a matching path (-1 when nothing was accepted).  Raises :class:`MalformedOutput`
    for a broken layout and :class:`ImpossibleOutput` for accepted tokens off the tree or (given
    ``target_probs [B, N+1, V]``) a token of target probability 0 along the path.
    """
    batch, width = tree_tokens.shape
    emitted, lengths = validate_emitted(result, None, vocab_size, num_positions=width + 1)
    if emitted.shape[0] != batch:
        raise MalformedOutput([f"returned shape {tuple(emitted.shape)}, expected [B, N+1] = [{batch}, {width + 1}]"])
    tree_tokens, parents = tree_tokens.cpu(), parents.cpu()
    # Candidate nodes after j accepted tokens (column 0: the root); with duplicate sibling tokens
    # a token can match several children, so every matching path is followed.
    present = tree_tokens >= 0
    reached = torch.zeros(batch, width + 1, dtype=torch.bool)
    reached[:, 0] = True
    current = torch.full((batch,), -1, dtype=torch.int64)
    law_index = torch.zeros(batch, width + 1, dtype=torch.int64)  # slot j's law: 1 + the node before it
    steps = min(width, int(lengths.max()) - 1)  # slots past the longest accepted path check nothing
    for j in range(steps):
        law_index[:, j] = current + 1
        on_path = j < lengths - 1
        match = present & reached.gather(-1, parents + 1) & (tree_tokens == emitted[:, j:j + 1])
        broken = on_path & ~match.any(-1)
        if bool(broken.any()):
            row = int(broken.nonzero()[0, 0])
            raise ImpossibleOutput([(
                f"row {row}: emitted {emitted[row].tolist()}, whose accepted tokens are not a root-to-node path of "
                f"the tree (slot {j}: token {int(emitted[row, j])} is not a child of the path so far; tree_tokens "
                f"{tree_tokens[row].tolist()}, parents {parents[row].tolist()}): only the tokens of an accepted "
                "path may precede the correction-or-bonus token")])
        current = torch.where(on_path, match.to(torch.int64).argmax(-1), current)
        reached = torch.where(on_path[:, None], torch.cat([torch.zeros(batch, 1, dtype=torch.bool), match], 1), reached)
    law_index[:, steps:] = (current + 1)[:, None]
    if target_probs is not None:
        impossible = zero_probability_tokens(emitted, lengths, target_probs, law_index)
        if impossible is not None:
            raise impossible
    return emitted, lengths, current


def validate_new_tokens(result: Any, max_new_tokens: int, vocab_size: int) -> torch.Tensor:
    """Check a SPEC §2 output and return it on the CPU: an int64 tensor ``[max_new_tokens]`` of
    ids in ``[0, V)``.  Raises :class:`MalformedOutput` with every violation found."""
    if not isinstance(result, torch.Tensor):
        raise MalformedOutput([f"returned a {type(result).__name__}, expected an int64 tensor [max_new_tokens]"])
    problems = _tensor_format(result, (max_new_tokens,), "[max_new_tokens]")
    if problems and tuple(result.shape) != (max_new_tokens,
                                            ) and (result.dim() != 1 or result.numel() != max_new_tokens):
        problems[-1] += " (return only the new tokens, without the prompt or a batch dimension)"
    if result.layout != torch.strided or result.device.type == "meta":
        raise MalformedOutput(problems)
    if result.is_floating_point() and bool(torch.isnan(result).any()):
        problems.append(f"returned NaN token ids: {result.tolist()}")
    tokens = _integral_values(result) if tuple(result.shape) == (max_new_tokens,) else None
    if tokens is None:
        raise MalformedOutput(problems)
    outside = (tokens < 0) | (tokens >= vocab_size)
    if bool(outside.any()):
        position = int(outside.nonzero()[0, 0])
        problems.append(f"returned token id {int(tokens[position])} at position {position}, outside the "
                        f"vocabulary [0, {vocab_size})")
    if problems:
        raise MalformedOutput(problems)
    return tokens
