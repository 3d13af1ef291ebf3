"""A SPEC §1 verifier written as a Python loop over rows and positions (a direct port of a
single-sequence implementation).  Correct, but one row at a time: the audit's timing reference
for slow implementations::

    specverify audit examples/loop_verify.py:verify --budget quick
"""

import torch


def verify(target_probs, draft_probs, draft_tokens, generator):
    batch, positions, _ = target_probs.shape
    num_draft = positions - 1
    emitted = torch.full((batch, positions), -1, dtype=torch.int64)
    uniforms = torch.rand(batch, positions, generator=generator, dtype=torch.float64,
                          device=target_probs.device).tolist()
    p_at_draft = target_probs[:, :num_draft].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).tolist()
    q_at_draft = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).tolist()
    tokens = draft_tokens.tolist()
    for row in range(batch):
        for position in range(num_draft):
            if uniforms[row][position] * q_at_draft[row][position] < p_at_draft[row][position]:
                emitted[row, position] = tokens[row][position]
                continue
            weights = (target_probs[row, position].double() - draft_probs[row, position].double()).clamp(min=0)
            emitted[row, position] = _inverse_cdf(weights, uniforms[row][num_draft])
            break
        else:
            emitted[row, num_draft] = _inverse_cdf(target_probs[row, num_draft].double(), uniforms[row][num_draft])
    return emitted.to(target_probs.device)


def _inverse_cdf(weights, u):
    cumulative = weights.cumsum(dim=0)
    token = int(torch.searchsorted(cumulative, torch.tensor([u * float(cumulative[-1])], dtype=cumulative.dtype),
                                   right=True))
    return min(token, weights.shape[0] - 1)
