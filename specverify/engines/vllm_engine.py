"""vLLM's V1 rejection sampler as SPEC §1 targets (built-ins ``vllm``, ``vllm-no-draft-probs``,
``vllm-greedy``, ``vllm-mixed``).

Audited: ``vllm.v1.sample.rejection_sampler.RejectionSampler.forward`` of vLLM 0.33.0
(:data:`AUDITED_VERSION`), with a real ``vllm.v1.sample.sampler.Sampler`` drawing the bonus
tokens, called unmodified in vLLM's own layout, as ``GPUModelRunner`` calls it:

- ``logits [num_tokens + B, V]``: for each request its ``k_b`` draft positions, then its bonus
  position (the audit's ``target_probs`` flattened, the padding of ragged rows dropped; ``log p``,
  so that the sampler's temperature-1 ``softmax`` gives back ``p``);
- ``SpecDecodeMetadata`` as ``GPUModelRunner._calc_spec_decode_metadata`` builds it
  (:func:`spec_decode_metadata`): flattened ``draft_token_ids`` (int32), ``num_draft_tokens``,
  ``cu_num_draft_tokens``, ``cu_num_sampled_tokens``, ``target_logits_indices``,
  ``bonus_logits_indices``, ``logits_indices``; every target declares ``num_draft_tokens=``
  (docs/spec.md §1), which becomes vLLM's ragged ``num_draft_tokens`` (K for every request without it);
- ``draft_probs [num_tokens, V]`` or ``None`` (n-gram and other drafters without probabilities:
  each draft is then a point mass, accepted with probability ``p(x)``, lossless for any drafts);
- ``SamplingMetadata`` with per-request ``temperature`` (1 random, 0 greedy; no top-k/top-p:
  the audit's laws are already processed) and per-request ``generators`` — every request gets
  the audit's generator, so vLLM's draws (uniforms, then the exponential race of the recovered
  tokens, then the bonus sampler's noise) come from it, one request after another.

Returns ``SamplerOutput.sampled_token_ids [B, K+1]`` (int32, ``-1`` placeholders).  Its kernels
are Triton: without a GPU they run under ``TRITON_INTERPRET=1``
(:mod:`specverify.engines.environment`).  Greedy requests get Gumbel-perturbed logits
(:func:`specverify.engines.environment.gumbel_perturbed_logits`): vLLM's argmax of them is a
draw from the target, so the greedy path is lossless exactly when it is right.
"""

from __future__ import annotations

import numpy as np
import torch

from specverify.engines.environment import prepare_engine_import, require_engine, with_greedy_rows_perturbed

require_engine("vllm")
prepare_engine_import()

from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.rejection_sampler import RejectionSampler  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402

AUDITED_VERSION = "0.33.0"
_REJECTION_SAMPLER = RejectionSampler(Sampler())


def spec_decode_metadata(draft_token_ids: torch.Tensor, num_draft_tokens: list[int]) -> SpecDecodeMetadata:
    """``SpecDecodeMetadata`` for requests that were each scheduled their drafts plus one token, with
    the index arithmetic of ``GPUModelRunner._calc_spec_decode_metadata`` (request ``i``'s logits
    rows: its ``num_draft_tokens[i]`` draft positions, then its bonus position)."""
    device = draft_token_ids.device
    drafts = np.asarray(num_draft_tokens, dtype=np.int32)
    sampled = drafts + 1
    cu_num_sampled = np.cumsum(sampled, dtype=np.int32)
    cu_num_draft = np.cumsum(drafts, dtype=np.int32)
    first_sampled = cu_num_sampled - sampled
    logits_indices = np.arange(int(cu_num_sampled[-1]), dtype=np.int32)  # every row is sampled here
    bonus_logits_indices = cu_num_sampled - 1
    offsets_in_request = np.arange(int(cu_num_draft[-1]), dtype=np.int32) - np.repeat(cu_num_draft - drafts, drafts)
    target_logits_indices = np.repeat(first_sampled, drafts) + offsets_in_request

    def tensor(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values)).to(device)

    return SpecDecodeMetadata(
        draft_token_ids=draft_token_ids.to(torch.int32).contiguous(),
        num_draft_tokens=[int(n) for n in drafts],
        cu_num_draft_tokens=tensor(cu_num_draft),
        cu_num_sampled_tokens=tensor(cu_num_sampled),
        target_logits_indices=tensor(target_logits_indices),
        bonus_logits_indices=tensor(bonus_logits_indices),
        logits_indices=tensor(logits_indices),
    )


def sampling_metadata(temperature: torch.Tensor, generator: torch.Generator | None) -> SamplingMetadata:
    """Per-request temperatures (0 greedy), no top-k/top-p/penalties/logprobs, every request seeded
    with ``generator``."""
    batch = temperature.shape[0]
    greedy = temperature == 0
    return SamplingMetadata(
        temperature=temperature,
        all_greedy=bool(greedy.all()),
        all_random=bool((~greedy).all()),
        top_p=None,
        top_k=None,
        generators={} if generator is None else {request: generator for request in range(batch)},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch, device=temperature.device),
        presence_penalties=torch.zeros(batch, device=temperature.device),
        repetition_penalties=torch.ones(batch, device=temperature.device),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _forward(target_probs, draft_probs, draft_tokens, generator, num_draft_tokens, *, greedy_rows: torch.Tensor,
             with_draft_probs: bool) -> torch.Tensor:
    """One ``RejectionSampler.forward`` on the flattened layout: request b's ``k_b`` drafts
    (``num_draft_tokens``, K for every row when None) and its ``k_b + 1`` target rows, the padding
    dropped; the ``[B, max k_b + 1]`` output is padded with -1 to ``[B, K+1]``."""
    batch, positions, vocab = target_probs.shape
    counts = torch.full((batch,), positions - 1) if num_draft_tokens is None else num_draft_tokens.cpu()
    columns = torch.arange(positions)
    in_draft = (columns[None, :-1] < counts[:, None]).to(target_probs.device)
    in_target = (columns[None, :] <= counts[:, None]).to(target_probs.device)
    logits = torch.log(target_probs.float())
    logits = with_greedy_rows_perturbed(logits, target_probs, greedy_rows, generator)
    metadata = spec_decode_metadata(draft_tokens[in_draft], counts.tolist())
    temperature = torch.where(greedy_rows, 0.0, 1.0).to(device=target_probs.device, dtype=torch.float32)
    output = _REJECTION_SAMPLER(
        metadata,
        draft_probs[in_draft].float().contiguous() if with_draft_probs else None,
        logits[in_target].contiguous(),
        sampling_metadata(temperature, generator),
    )
    sampled = output.sampled_token_ids.long()
    return torch.cat([sampled, sampled.new_full((batch, positions - sampled.shape[1]), -1)], dim=1)


def _rows(target_probs: torch.Tensor, greedy: str) -> torch.Tensor:
    index = torch.arange(target_probs.shape[0], device=target_probs.device)
    return {"none": index < 0, "all": index >= 0, "even": index % 2 == 0}[greedy]


def verify(target_probs, draft_probs, draft_tokens, generator, *, num_draft_tokens=None):
    """All-random batch with the draft's probabilities (a draft model or EAGLE keeping its probabilities)."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, num_draft_tokens,
                    greedy_rows=_rows(target_probs, "none"), with_draft_probs=True)


def verify_no_draft_probs(target_probs, draft_probs, draft_tokens, generator, *, num_draft_tokens=None):
    """All-random batch with ``draft_probs=None`` (vLLM's path for drafters without probabilities)."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, num_draft_tokens,
                    greedy_rows=_rows(target_probs, "none"), with_draft_probs=False)


def verify_greedy(target_probs, draft_probs, draft_tokens, generator, *, num_draft_tokens=None):
    """All-greedy batch (temperature 0: ``all_greedy``) on Gumbel-perturbed logits."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, num_draft_tokens,
                    greedy_rows=_rows(target_probs, "all"), with_draft_probs=True)


def verify_mixed(target_probs, draft_probs, draft_tokens, generator, *, num_draft_tokens=None):
    """Mixed batch: even requests greedy (Gumbel-perturbed logits), odd requests random with draft probabilities."""
    return _forward(target_probs, draft_probs, draft_tokens, generator, num_draft_tokens,
                    greedy_rows=_rows(target_probs, "even"), with_draft_probs=True)
