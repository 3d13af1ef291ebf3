"""SGLang's verification code as SPEC §1 / §3 targets (built-ins ``sglang``, ``sglang-one-hot``,
``sglang-greedy``, ``sglang-triton``, ``sglang-triton-one-hot``, ``sglang-chain-triton``,
``sglang-chain-block-triton``; at the tree level ``sglang-tree-greedy-triton``).

Audited, in SGLang 0.5.23 (:data:`AUDITED_VERSION`), unmodified and in SGLang's own layout:

- ``sglang.kernels.ops.speculative.dspark.blockwise_rejection`` — DSpark's block-wise
  (vocabulary-parallel) rejection sampler.  ``BlockwiseRejection.execute`` dispatches CPU inputs to
  its torch path ``blockwise_rejection_torch`` (``sglang``, ``sglang-one-hot``) and CUDA inputs to
  ``blockwise_rejection_triton`` (``sglang-triton``, ``sglang-triton-one-hot``: its Triton kernels
  called directly; without a GPU only the one-hot branch runs under ``TRITON_INTERPRET=1``, the
  draft-logits branch calls ``libdevice.log1p``, which the interpreter lacks).  Inputs: ``candidates [B, K+1]``
  (column 0 the current token, then
  the drafts), ``target_logits [B·(K+1), V]`` request-major, ``draft_logits [B, K, V]``
  pre-temperature or ``None`` for a one-hot (greedy) draft, per-request temperatures (1 here:
  the audit's laws are already processed), and a ``RejectionNoise`` — its key and step counter
  seed SGLang's counter-based draws; the adapter takes a fresh key from the audit's generator at
  every call, so the draws are a function of the generator.  Returns ``(correct_len, bonus,
  cap_trim_lens)``: the emitted tokens are ``candidates[b, 1:1+correct_len]`` then ``bonus``.
- ``sglang.kernels.ops.speculative.dflash.compute_dflash_correct_drafts_and_bonus``
  (``sglang-greedy``): the greedy rule of DFlash/DSpark verification (what
  ``dspark_accept.accept_greedy``, the torch path of ``AcceptGreedy``, runs after its row argmax;
  ``dspark_accept`` itself imports SGLang's scheduler, which needs torchvision), on target
  predictions drawn from each position's law (:func:`specverify.engines.environment.target_draws`),
  what the argmax of Gumbel-perturbed logits would give, at less cost.
- ``sglang.kernels.ops.speculative.reject_sampling.chain_speculative_sampling_triton`` — the
  pure-Triton chain sampler EAGLE verification uses with ``--speculative-use-rejection-sampling``
  (``sglang-chain-triton``) and, with ``block_verification=True``, block verification (Sun et al.
  2024, ``sglang-chain-block-triton``).  Layout as ``dspark_accept._accept_sampling_core`` builds
  it: ``retrive_index = arange(B·(K+1))``, ``predicts [B·(K+1)]`` int32, ``accept_index [B, K+1]``,
  float32 coins ``[B, K]`` and ``[B]``.  The classic kernel takes its coins as tensors and follows
  the uniform convention of SPEC §1 (accept iff ``u·q < p``; final token: first ``t`` with
  ``cumsum(r)[t] > u·Σr``), so ``sglang-chain-triton`` accepts ``uniforms=`` and the audit's exact
  check applies (the float64 uniforms are rounded to float32 coins, clamped below 1 as SGLang's
  seeded coins are: the rule is exact up to float32 rounding).
- ``sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton`` (tree level; the Triton
  kernel SGLang's XPU path runs for EAGLE greedy tree verification), in SGLang's linked tree
  layout (:func:`specverify.core.tree_layouts.to_sglang_layout`), with a target prediction drawn
  from every node's law.
"""

from __future__ import annotations

import torch

from specverify.core.tree_layouts import to_sglang_layout
from specverify.engines.environment import prepare_engine_import, require_engine, target_draws

require_engine("sglang")
INTERPRETED = prepare_engine_import()

from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus  # noqa: E402
from sglang.kernels.ops.speculative.dspark.blockwise_rejection import (  # noqa: E402
    BlockwiseRejection,
    RejectionNoise,
    blockwise_rejection_triton,
)
from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton  # noqa: E402

AUDITED_VERSION = "0.5.23"
_MAX_COIN = 1.0 - 2**-24  # the largest float32 below 1 (SGLang's clamp of its seeded coins)


def _candidates(draft_tokens: torch.Tensor) -> torch.Tensor:
    """``[B, K+1]``: column 0 the current token (not read by the samplers; 0 here), then the drafts."""
    current = torch.zeros((draft_tokens.shape[0], 1), dtype=torch.int64, device=draft_tokens.device)
    return torch.cat([current, draft_tokens.long()], dim=1)


def _emitted(candidates: torch.Tensor, correct_len: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """The accepted drafts ``candidates[b, 1:1+correct_len]``, then ``bonus``, then ``-1``."""
    batch, width = candidates.shape
    columns = torch.arange(width, device=candidates.device)
    accepted = columns[None, :] < correct_len.long()[:, None]
    emitted = torch.where(accepted, torch.roll(candidates, -1, dims=1), torch.full_like(candidates, -1))
    emitted[torch.arange(batch, device=candidates.device), correct_len.long()] = bonus.long()
    return emitted


def _noise(generator: torch.Generator | None, device: torch.device) -> RejectionNoise:
    """A fresh ``RejectionNoise`` whose key comes from the audit's generator (counter 0)."""
    key = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=device).item())
    return RejectionNoise(key=key, counter=torch.zeros(1, dtype=torch.int64, device=device))


def _blockwise(target_probs, draft_probs, draft_tokens, generator, *, one_hot: bool, triton: bool) -> torch.Tensor:
    batch, positions, vocab = target_probs.shape
    device = target_probs.device
    candidates = _candidates(draft_tokens)
    ones = torch.ones(batch, dtype=torch.float32, device=device)
    arguments = dict(
        candidates=candidates,
        target_logits=torch.log(target_probs.float()).reshape(batch * positions, vocab),
        draft_logits=None if one_hot else torch.log(draft_probs.float()).contiguous(),
        target_temperatures=ones,
        draft_temperatures=ones,
        noise=_noise(generator, device),
    )
    if triton:
        correct_len, bonus, _ = blockwise_rejection_triton(**arguments)
    else:
        correct_len, bonus, _ = BlockwiseRejection.execute(**arguments)
    return _emitted(candidates, correct_len, bonus)


def verify(target_probs, draft_probs, draft_tokens, generator):
    """Block-wise rejection, torch path (what ``BlockwiseRejection.execute`` runs on CPU), with draft logits."""
    return _blockwise(target_probs, draft_probs, draft_tokens, generator, one_hot=False, triton=False)


def verify_one_hot(target_probs, draft_probs, draft_tokens, generator):
    """Block-wise rejection, torch path, one-hot draft (``draft_logits=None``, a greedy drafter)."""
    return _blockwise(target_probs, draft_probs, draft_tokens, generator, one_hot=True, triton=False)


def verify_triton(target_probs, draft_probs, draft_tokens, generator):
    """Block-wise rejection, Triton kernels, with draft logits (GPU only: its residual calls
    ``libdevice.log1p``, which Triton 3.9's interpreter does not implement)."""
    if INTERPRETED:
        raise RuntimeError("sglang-triton: the residual kernel calls libdevice.log1p, which Triton's interpreter "
                           "(TRITON_INTERPRET=1) does not implement; audit it with --device cuda, or audit "
                           "sglang-triton-one-hot (the one-hot branch runs interpreted)")
    return _blockwise(target_probs, draft_probs, draft_tokens, generator, one_hot=False, triton=True)


def verify_triton_one_hot(target_probs, draft_probs, draft_tokens, generator):
    """Block-wise rejection, Triton kernels (interpreted without a GPU), one-hot draft."""
    return _blockwise(target_probs, draft_probs, draft_tokens, generator, one_hot=True, triton=True)


def verify_greedy(target_probs, draft_probs, draft_tokens, generator):
    """DFlash's greedy rule on target predictions drawn from each position's target law
    (``target_predict [B, K+1]``, :func:`specverify.engines.environment.target_draws`)."""
    candidates = _candidates(draft_tokens)
    correct_len, bonus = compute_dflash_correct_drafts_and_bonus(candidates=candidates,
                                                                 target_predict=target_draws(target_probs, generator))
    return _emitted(candidates, correct_len, bonus)


def _chain(target_probs, draft_probs, draft_tokens, generator, uniforms, *, block_verification: bool) -> torch.Tensor:
    batch, positions, vocab = target_probs.shape
    num_draft = positions - 1
    device = target_probs.device
    candidates = _candidates(draft_tokens)
    if uniforms is None:
        coins = torch.rand((batch, num_draft), generator=generator, device=device, dtype=torch.float32)
        coins_final = torch.rand((batch,), generator=generator, device=device, dtype=torch.float32)
    else:
        rounded = uniforms.to(device=device, dtype=torch.float32).clamp_(max=_MAX_COIN)
        coins, coins_final = rounded[:, :num_draft].contiguous(), rounded[:, num_draft].contiguous()
    retrive_index = torch.arange(batch * positions, dtype=torch.int64, device=device).view(batch, positions)
    retrive_next_token = torch.arange(1, positions + 1, dtype=torch.int64, device=device).repeat(batch, 1)
    retrive_next_token[:, -1] = -1
    retrive_next_sibling = torch.full((batch, positions), -1, dtype=torch.int64, device=device)
    predicts = torch.zeros(batch * positions, dtype=torch.int32, device=device)
    accept_index = torch.full((batch, positions), -1, dtype=torch.int32, device=device)
    accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
    chain_speculative_sampling_triton(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
        candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
        retrive_next_sibling=retrive_next_sibling, uniform_samples=coins,
        uniform_samples_for_final_sampling=coins_final,
        target_probs=target_probs.float().contiguous(), draft_probs=draft_probs.float().contiguous(),
        threshold_single=1.0, threshold_acc=1.0, deterministic=True,
        block_verification=block_verification,
    )
    columns = torch.arange(positions, device=device)
    kept = columns[None, :] <= accept_token_num.long()[:, None]
    tokens = predicts[accept_index.clamp_min(0).long()].long()
    return torch.where(kept, tokens, torch.full_like(tokens, -1))


def verify_chain_triton(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    """``chain_speculative_sampling_triton``, classic rejection sampling (coins as tensors: exact check)."""
    return _chain(target_probs, draft_probs, draft_tokens, generator, uniforms, block_verification=False)


verify_chain_triton.arithmetic = "float32"  # type: ignore[attr-defined]  # declared on the function (rounding.py)


def verify_chain_block_triton(target_probs, draft_probs, draft_tokens, generator):
    """``chain_speculative_sampling_triton(block_verification=True)``: block verification (Sun et al. 2024)."""
    return _chain(target_probs, draft_probs, draft_tokens, generator, None, block_verification=True)


def verify_tree_greedy_triton(target_probs, draft_probs, tree_tokens, parents, generator):
    """SPEC §3: ``verify_tree_greedy_triton`` in SGLang's linked layout on target predictions drawn from
    each node's target law (:func:`specverify.engines.environment.target_draws`)."""
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton as sglang_tree_greedy

    batch, nodes_plus_root, _ = target_probs.shape
    device = target_probs.device
    candidates, retrive_index, next_token, next_sibling = (
        tensor.to(device) for tensor in to_sglang_layout(tree_tokens.cpu(), parents.cpu()))
    target_predict = target_draws(target_probs, generator)
    max_depth = nodes_plus_root  # accept_index holds the root and up to N accepted nodes
    predicts = torch.zeros(batch * nodes_plus_root, dtype=torch.int32, device=device)
    accept_index = torch.full((batch, max_depth), -1, dtype=torch.int32, device=device)
    accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
    sglang_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                       next_token, next_sibling, target_predict)
    columns = torch.arange(max_depth, device=device)
    kept = columns[None, :] <= accept_token_num.long()[:, None]
    tokens = predicts[accept_index.clamp_min(0).long()].long()
    return torch.where(kept, tokens, torch.full_like(tokens, -1))
# EAGLE drafts top-k children
verify_tree_greedy_triton.draft_schemes = ("deterministic",)  # type: ignore[attr-defined]  # declared on the function
