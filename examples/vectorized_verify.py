"""A vectorised SPEC §1 verifier, written the way an engine would: one pass over the batch.

Modified rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2):
accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection n emit a
token from normalize(max(0, p_n − q_n)); if every draft is accepted emit a bonus token from p_K.

It also accepts ``uniforms=`` (the convention of docs/ARCHITECTURE.md), which lets
``specverify audit`` integrate one step exactly on top of its statistical checks::

    specverify audit examples/vectorized_verify.py:verify
"""

import torch


def verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    batch, positions, vocab = target_probs.shape
    num_draft = positions - 1
    rows = torch.arange(batch, device=target_probs.device)
    if uniforms is None:
        uniforms = torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)

    # Accept x_i iff u_i · q_i(x_i) < p_i(x_i); n = number of leading accepts.
    index = draft_tokens.unsqueeze(-1)
    p_at_draft = target_probs[:, :num_draft].gather(-1, index).squeeze(-1).double()
    q_at_draft = draft_probs.gather(-1, index).squeeze(-1).double()
    accepted = uniforms[:, :num_draft] * q_at_draft < p_at_draft
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)

    # Final token: the residual max(0, p_n − q_n) after a rejection, the bonus law p_K otherwise.
    p_final = target_probs[rows, num_accepted].double()
    q_final = draft_probs[rows, num_accepted.clamp(max=num_draft - 1)].double()
    rejected = (num_accepted < num_draft).unsqueeze(-1)
    weights = torch.where(rejected, (p_final - q_final).clamp(min=0), p_final)
    cumulative = weights.cumsum(dim=-1)
    threshold = uniforms[:, num_draft:] * cumulative[:, -1:]
    final_token = torch.searchsorted(cumulative, threshold, right=True).clamp(max=vocab - 1).squeeze(-1)

    emitted = torch.full((batch, positions), -1, dtype=torch.int64, device=target_probs.device)
    keep = torch.arange(num_draft, device=target_probs.device) < num_accepted.unsqueeze(-1)
    emitted[:, :num_draft] = torch.where(keep, draft_tokens, -1)
    emitted[rows, num_accepted] = final_token
    return emitted
