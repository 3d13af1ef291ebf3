"""specverify.core.outputs: the one validator of emitted tokens reports every violation at once."""

from __future__ import annotations

import pytest
import torch

from specverify.core.outputs import ImpossibleOutput, MalformedOutput, validate_emitted, validate_new_tokens

DRAFTS = torch.tensor([[1, 2], [3, 0]])


def test_valid_output_gives_emitted_and_lengths():
    emitted, lengths = validate_emitted(torch.tensor([[1, 2, 3], [0, -1, -1]]), DRAFTS, 4)
    assert emitted.tolist() == [[1, 2, 3], [0, -1, -1]] and lengths.tolist() == [3, 1]


def test_wrong_dtype_and_wrong_shape_are_reported_together():
    with pytest.raises(MalformedOutput) as error:
        validate_emitted(torch.zeros(2, 5), DRAFTS, 4)
    assert len(error.value.violations) == 2
    assert "dtype torch.float32" in str(error.value) and "shape (2, 5)" in str(error.value)


def test_every_content_violation_is_listed():
    with pytest.raises(MalformedOutput) as error:
        validate_emitted(torch.tensor([[9, 2, 3], [-1, 1, -1]]), DRAFTS, 4)
    text = str(error.value)
    assert "outside [0, 4)" in text and "after -1 padding" in text and "no token in row 1" in text


def test_a_non_draft_token_in_an_accepted_slot_is_impossible_not_malformed():
    with pytest.raises(ImpossibleOutput, match="accepted slot 0 of row 0"):
        validate_emitted(torch.tensor([[2, 2, -1], [3, -1, -1]]), DRAFTS, 4)


def test_a_layout_violation_is_malformed_even_when_a_slot_is_also_impossible():
    with pytest.raises(MalformedOutput, match="outside"):
        validate_emitted(torch.tensor([[2, 9, -1], [3, -1, -1]]), DRAFTS, 4)


def test_a_token_of_target_probability_zero_is_impossible():
    target = torch.full((2, 3, 4), 0.25)
    target[1, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])  # row 1 slot 0: tokens 2 and 3 forbidden
    output = torch.tensor([[1, 2, 3], [3, -1, -1]])
    with pytest.raises(ImpossibleOutput, match="slot 0 of row 1 .*target probability 0"):
        validate_emitted(output, DRAFTS, 4, target_probs=target)
    validate_emitted(torch.tensor([[1, 2, 3], [1, -1, -1]]), DRAFTS, 4, target_probs=target)


def test_a_tree_token_of_target_probability_zero_is_impossible_at_its_node():
    from specverify.core.outputs import validate_tree_emitted

    target = torch.full((1, 4, 4), 0.25)
    target[0, 3] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # after node 2 (path 2 -> 1) only token 0
    validate_tree_emitted(torch.tensor([[2, 1, 0, -1]]), TREE_TOKENS, PARENTS, 4, target)
    with pytest.raises(ImpossibleOutput, match="slot 2 of row 0"):
        validate_tree_emitted(torch.tensor([[2, 1, 3, -1]]), TREE_TOKENS, PARENTS, 4, target)


@pytest.mark.parametrize(("output", "message"), [
    (torch.zeros(2, 3, device="meta", dtype=torch.int64), "meta tensor"),
    (torch.tensor([[1, 2, 3], [0, -1, -1]]).to_sparse(), "layout"),
    ([[1, 2, 3]], "returned a list"),
])
def test_outputs_without_values_are_malformed(output, message):
    with pytest.raises(MalformedOutput, match=message):
        validate_emitted(output, DRAFTS, 4)


def test_new_tokens_report_dtype_and_shape_together():
    with pytest.raises(MalformedOutput) as error:
        validate_new_tokens(torch.zeros(1, 3), 3, 8)
    assert len(error.value.violations) == 2 and "batch dimension" in str(error.value)


# SPEC §3: tree steps (root children 0 and 1 with tokens 2 and 3; node 2, token 1, under node 0)
TREE_TOKENS = torch.tensor([[2, 3, 1]])
PARENTS = torch.tensor([[-1, -1, 0]])


def test_a_tree_output_along_a_path_gives_its_last_node():
    from specverify.core.outputs import validate_tree_emitted

    emitted, lengths, last = validate_tree_emitted(torch.tensor([[2, 1, 0, -1]]), TREE_TOKENS, PARENTS, 4)
    assert lengths.tolist() == [3] and last.tolist() == [2]


def test_a_tree_output_off_the_tree_and_a_bad_layout_are_malformed():
    from specverify.core.outputs import validate_tree_emitted

    with pytest.raises(ImpossibleOutput, match="not a root-to-node path"):
        validate_tree_emitted(torch.tensor([[3, 1, 0, -1]]), TREE_TOKENS, PARENTS, 4)  # 1 is not under node 1
    with pytest.raises(MalformedOutput) as error:
        validate_tree_emitted(torch.zeros(1, 3), TREE_TOKENS, PARENTS, 4)
    assert len(error.value.violations) == 2
