"""The reference rule re-implemented in a lower precision, as engine kernels compute it: inputs,
coins, accept tests, residual and cumulative sums all in ``dtype`` (float32 or bfloat16).

Correct rules, whose exact law differs from the target's by rounding only; the exact check must
call that rounding, not a loss (tests/auditing/test_exact_rounding.py)."""

from __future__ import annotations

import torch


def rule_in(dtype: torch.dtype, *, declare: str | None = None):
    """A SPEC §1 rule with ``uniforms=`` computing in ``dtype``; ``declare`` sets its ``arithmetic``
    attribute (None: no declaration)."""

    def verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
        batch, positions, vocab = target_probs.shape
        num_draft = positions - 1
        p, q = target_probs.to(dtype), draft_probs.to(dtype)
        if uniforms is None:
            uniforms = torch.rand(batch, positions, generator=generator, dtype=torch.float64)
        coins = uniforms.to(dtype)
        tokens = draft_tokens.unsqueeze(-1)
        accept = coins[:, :num_draft] * q.gather(-1, tokens)[..., 0] < p[:, :num_draft].gather(-1, tokens)[..., 0]
        accepted = accept.long().cumprod(dim=-1).sum(dim=-1)
        rows = torch.arange(batch)
        final_p = p[rows, accepted]
        rejected = (accepted < num_draft).unsqueeze(-1)
        final_q = q[rows, accepted.clamp(max=num_draft - 1)] * rejected
        residual = (final_p - final_q).clamp(min=0)
        residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, final_p)
        cdf = residual.cumsum(dim=-1)
        threshold = coins[:, num_draft] * cdf[:, -1]
        final = (cdf <= threshold.unsqueeze(-1)).sum(dim=-1).clamp(max=vocab - 1)
        emitted = torch.full((batch, positions), -1, dtype=torch.int64)
        slots = torch.arange(num_draft).unsqueeze(0) < accepted.unsqueeze(-1)
        emitted[:, :num_draft] = torch.where(slots, draft_tokens, torch.full_like(draft_tokens, -1))
        emitted[rows, accepted] = final
        return emitted

    if declare is not None:
        verify.arithmetic = declare
    return verify


float32_rule = rule_in(torch.float32)
float32_rule_declared = rule_in(torch.float32, declare="float32")
float32_rule_claiming_float64 = rule_in(torch.float32, declare="float64")
bfloat16_rule = rule_in(torch.bfloat16, declare="bfloat16")
