"""A LOSSY verifier for demonstrations and tests: when every draft is accepted it samples the bonus
token from the last *draft* distribution q_{K−1} instead of the target's p_K (a bug class seen in
engines that reuse the draft's last distribution for the extra token).  Everything else is correct,
so only checks that reach the bonus position can see it::

    specverify audit examples/buggy_bonus.py:verify     # exit status 1
"""

import torch


def verify(target_probs, draft_probs, draft_tokens, generator=None, *, uniforms=None):
    batch, positions, vocab = target_probs.shape
    num_draft = positions - 1
    rows = torch.arange(batch, device=target_probs.device)
    if uniforms is None:
        uniforms = torch.rand(batch, positions, generator=generator, dtype=torch.float64, device=target_probs.device)
    index = draft_tokens.unsqueeze(-1)
    p_at_draft = target_probs[:, :num_draft].gather(-1, index).squeeze(-1).double()
    q_at_draft = draft_probs.gather(-1, index).squeeze(-1).double()
    num_accepted = (uniforms[:, :num_draft] * q_at_draft < p_at_draft).long().cumprod(dim=-1).sum(dim=-1)

    rejected = (num_accepted < num_draft).unsqueeze(-1)
    p_final = target_probs[rows, num_accepted.clamp(max=num_draft - 1)].double()
    q_final = draft_probs[rows, num_accepted.clamp(max=num_draft - 1)].double()
    weights = torch.where(rejected, (p_final - q_final).clamp(min=0), q_final)  # BUG: bonus from q_{K-1}
    cumulative = weights.cumsum(dim=-1)
    final_token = torch.searchsorted(cumulative, uniforms[:, num_draft:] * cumulative[:, -1:], right=True)
    final_token = final_token.clamp(max=vocab - 1).squeeze(-1)

    emitted = torch.full((batch, positions), -1, dtype=torch.int64, device=target_probs.device)
    keep = torch.arange(num_draft, device=target_probs.device) < num_accepted.unsqueeze(-1)
    emitted[:, :num_draft] = torch.where(keep, draft_tokens, -1)
    emitted[rows, num_accepted] = final_token
    return emitted
