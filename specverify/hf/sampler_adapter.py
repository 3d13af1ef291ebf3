"""SPEC §1 adapter for the verification step of Hugging Face transformers' assisted generation.

transformers (5.x) verifies a draft of one sequence in
``transformers.generation.utils._speculative_sampling(candidate_input_ids, candidate_logits,
candidate_length, new_logits)`` (Leviathan et al. 2023, Algorithm 1):

- ``q = softmax(candidate_logits)`` ``[1, K, V]`` and ``p = softmax(new_logits)`` ``[1, K+1, V]``
  (both logits already processed by temperature / top-k / top-p);
- draft ``i`` passes iff ``r_i <= p_i(x_i) / q_i(x_i)`` with ``r = torch.rand_like(...)`` from the
  *global* torch RNG; ``n`` = the length of the leading run of passes;
- if ``n < K`` the last token is drawn by ``torch.multinomial`` (global RNG again) from
  ``norm(max(0, p_n − q_n))``, otherwise from the bonus row ``p_K``.

The adapter maps SPEC §1 onto it, row by row (the function handles batch size 1 only):

- logits = ``log(probs)`` in float32: ``softmax(log p) = p / Σ p``, so the function sees the
  laws it is given (``log 0 = −inf`` is a banned token, as after HF's own top-k/top-p);
- randomness: one 63-bit seed is drawn from ``generator`` per call and the rows run inside
  ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``, so the output is a function of
  ``generator`` alone and the caller's global RNG state is left untouched.  Without this, the
  function draws from the global RNG and the audit reports a contract violation (``global-rng``).

Built-in sampler-level target ``hf-transformers``.
"""

from __future__ import annotations

import torch

SEED_BOUND = 2**63 - 1


def verify(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """SPEC §1: one verification step by transformers' ``_speculative_sampling``, row by row.

    Returns ``emitted [B, K+1]`` int64: each row's accepted drafts, its correction-or-bonus token,
    then ``-1`` padding.
    """
    from transformers.generation.utils import _speculative_sampling

    batch, num_draft = draft_tokens.shape
    target_logits = target_probs.float().log()
    draft_logits = draft_probs.float().log()
    emitted = torch.full((batch, num_draft + 1), -1, dtype=torch.int64, device=draft_tokens.device)
    seed = int(torch.randint(SEED_BOUND, (1,), generator=generator, device=generator.device))
    forked = [target_probs.device] if target_probs.device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        for row in range(batch):
            rows = slice(row, row + 1)
            tokens, _ = _speculative_sampling(draft_tokens[rows], draft_logits[rows], num_draft, target_logits[rows])
            emitted[row, : tokens.shape[1]] = tokens[0]
    return emitted
