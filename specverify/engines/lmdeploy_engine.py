"""lmdeploy's portable rejection sampler as SPEC §1 targets (built-ins ``lmdeploy``, ``lmdeploy-one-hot``,
``lmdeploy-greedy``, ``lmdeploy-mixed``).

Audited: ``lmdeploy.pytorch.backends.default.rejection_sampling.DefaultRejectionSamplingImpl``
of lmdeploy 0.18.0 (:data:`AUDITED_VERSION`), the torch implementation that lmdeploy's Ascend,
MACA and Cambricon backends inherit, called unmodified in lmdeploy's layout, as
``lmdeploy.pytorch.spec_decode.reject_sampler.RejectionSampler.forward`` calls it:

- ``target_logits [B, K, V]``: the processed target logits of the K draft positions (here
  ``log p``, float32; its ``softmax`` gives back ``p``), ``draft_token_ids [B, K]``,
  ``bonus_token_ids [B]`` sampled beforehand from the bonus position, ``draft_probs [B, K, V]``
  or ``None`` (lmdeploy's drafters propose argmax tokens and pass ``None``: the draft is then a
  point mass, accepted with probability ``p(x)``, the correction drawn from ``p`` without
  ``x``, lossless for any drafts);
- it returns ``(output_token_ids [B, K+1] with -1 padding, num_rejected, last_token_ids)``.

It draws its uniforms and its exponential race from the *global* torch RNG; the adapter seeds
that RNG from the audit's generator inside :func:`torch.random.fork_rng`, so each call's
randomness is a function of the generator and the caller's RNG state is left as it was.  The
bonus token comes from lmdeploy's portable multinomial kernel
(``lmdeploy.pytorch.kernels.default.multinomial_sampling``) on the bonus position's law, under
the same seed.  The greedy rows of a mixed batch get Gumbel-perturbed logits
(:func:`specverify.engines.environment.gumbel_perturbed_logits`), whose argmax is a draw from the
target, and ``forward_greedy`` gets target token ids drawn from the target
(:func:`specverify.engines.environment.target_draws`): lossless when the greedy path is right.
"""

from __future__ import annotations

import torch

from specverify.engines.environment import (
    prepare_engine_import,
    require_engine,
    target_draws,
    with_greedy_rows_perturbed,
)

require_engine("lmdeploy")
prepare_engine_import()

from lmdeploy.pytorch.backends.default.rejection_sampling import DefaultRejectionSamplingImpl  # noqa: E402
from lmdeploy.pytorch.kernels.default.multinomial_sampling import multinomial_sampling  # noqa: E402

AUDITED_VERSION = "0.18.0"
_IMPL = DefaultRejectionSamplingImpl()


def _global_seed(generator: torch.Generator | None, device: torch.device) -> int:
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())


def _bonus_tokens(bonus_probs: torch.Tensor) -> torch.Tensor:
    """lmdeploy's portable multinomial kernel on the bonus position's law (scores and their token ids)."""
    indices = torch.arange(bonus_probs.shape[-1], device=bonus_probs.device).expand(bonus_probs.shape[0], -1)
    return multinomial_sampling(bonus_probs, None, None, indices)


def _forward(target_probs, draft_probs, draft_tokens, generator, *, with_draft_probs: bool,
             greedy_rows: torch.Tensor | None) -> torch.Tensor:
    num_draft = draft_tokens.shape[1]
    device = target_probs.device
    logits = torch.log(target_probs.float())
    if greedy_rows is not None:  # greedy rows see logits whose argmax is a draw from p
        logits = with_greedy_rows_perturbed(logits, target_probs, greedy_rows, generator)
    seed = _global_seed(generator, device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        bonus = _bonus_tokens(target_probs[:, num_draft].float())
        if greedy_rows is not None:
            bonus = torch.where(greedy_rows, logits[:, num_draft].argmax(-1), bonus)
        output, _, _ = _IMPL.forward(
            logits[:, :num_draft].contiguous(),
            draft_tokens.contiguous(),
            bonus,
            is_greedy=greedy_rows,
            draft_probs=draft_probs.float().contiguous() if with_draft_probs else None,
        )
    return output.long()


def verify(target_probs, draft_probs, draft_tokens, generator):
    """Random batch with the draft's probabilities (``draft_probs`` given)."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, with_draft_probs=True, greedy_rows=None)


def verify_one_hot(target_probs, draft_probs, draft_tokens, generator):
    """Random batch without draft probabilities (``draft_probs=None``, as lmdeploy's argmax drafters call it)."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, with_draft_probs=False, greedy_rows=None)


def verify_mixed(target_probs, draft_probs, draft_tokens, generator):
    """Mixed batch: even rows greedy (``is_greedy`` mask), odd rows random with the draft's probabilities."""
    greedy_rows = torch.arange(target_probs.shape[0], device=target_probs.device) % 2 == 0
    return _forward(target_probs, draft_probs, draft_tokens, generator, with_draft_probs=True, greedy_rows=greedy_rows)


def verify_greedy(target_probs, draft_probs, draft_tokens, generator):
    """All-greedy batch: ``forward_greedy`` on target token ids drawn from each position's law
    (:func:`specverify.engines.environment.target_draws`)."""
    output, _, _ = _IMPL.forward_greedy(target_draws(target_probs, generator), draft_tokens.contiguous())
    return output.long()
