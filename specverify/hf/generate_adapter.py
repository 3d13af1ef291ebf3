"""SPEC §2 adapters for Hugging Face transformers' assisted generation (``model.generate``).

- :func:`generate` — ``target.generate(input_ids, assistant_model=draft, ...)``: the draft model
  proposes tokens, the target verifies them (greedy matching at temperature 0, the
  speculative-sampling rule of ``_speculative_sampling`` when sampling);
- :func:`generate_prompt_lookup` — ``target.generate(input_ids, prompt_lookup_num_tokens=...)``:
  n-gram drafts copied from the context (the ``draft`` model is not used); when sampling,
  transformers samples the target at every drafted position and keeps drafts up to the first
  mismatch (a point-mass draft verified by sampling).

How SPEC §2 maps onto ``generate``:

- ``temperature == 0`` → ``do_sample=False`` (greedy); otherwise ``do_sample=True`` with the
  given temperature, ``top_k`` (``None`` → 0, i.e. off: transformers' default is 50) and
  ``top_p`` (``None`` → 1.0);
- fixed length: ``eos_token_id=[]``, so no token ends generation, even when the model's own
  config names an EOS, and exactly ``max_new_tokens`` tokens come out.  (``min_new_tokens`` is not
  used: it would work by banning the EOS id, i.e. by changing the law being sampled.)
  ``pad_token_id`` is set because ``generate`` asks for one; it is never emitted (batch size 1);
- a fresh ``GenerationConfig`` is passed, so a checkpoint's own generation defaults (sampling
  flags, penalties) cannot leak in; transformers' assisted-generation defaults stay as they are
  (up to 20 draft tokens per step, ``assistant_confidence_threshold`` 0.4);
- randomness: transformers samples from the *global* torch RNG, so the call runs inside
  ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``: the output is a function of
  ``seed`` alone and the caller's RNG state is untouched.

Built-in decoder-level targets ``hf-transformers`` and ``hf-transformers-prompt-lookup``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch

DEFAULT_PROMPT_LOOKUP_TOKENS = 4


class GeneratingModel(Protocol):
    """A transformers model with ``generate``: a ``PreTrainedModel`` that is a ``GenerationMixin``
    (e.g. ``LlamaForCausalLM``)."""

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def generate(self, *args: Any, **kwargs: Any) -> Any: ...


def generate(
    target: GeneratingModel,
    draft: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
) -> torch.Tensor:
    """SPEC §2 by ``target.generate(input_ids, assistant_model=draft, ...)``: ``max_new_tokens``
    new tokens, int64 ``[max_new_tokens]``."""
    return _generate(target, input_ids, seed, _sampling_config(max_new_tokens, temperature, top_k, top_p),
                     assistant_model=draft)


def generate_prompt_lookup(
    target: GeneratingModel,
    draft: torch.nn.Module | None,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS,
) -> torch.Tensor:
    """SPEC §2 by ``target.generate(input_ids, prompt_lookup_num_tokens=...)`` (prompt lookup
    decoding; ``draft`` is ignored).  Extension: ``prompt_lookup_num_tokens`` (default 4)."""
    config = _sampling_config(max_new_tokens, temperature, top_k, top_p)
    config.prompt_lookup_num_tokens = prompt_lookup_num_tokens
    return _generate(target, input_ids, seed, config)


def _sampling_config(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> Any:
    """A fresh ``GenerationConfig`` for SPEC §2's settings (see the module docstring)."""
    from transformers import GenerationConfig

    fixed_length = dict(max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=0)
    if temperature == 0:
        return GenerationConfig(do_sample=False, **fixed_length)
    return GenerationConfig(do_sample=True, temperature=float(temperature), top_k=0 if top_k is None else int(top_k),
                            top_p=1.0 if top_p is None else float(top_p), **fixed_length)


@torch.no_grad()
def _generate(target: GeneratingModel, input_ids: torch.Tensor, seed: int, config: Any,
              **assisted: Any) -> torch.Tensor:
    """Run ``target.generate`` with the global RNG seeded from ``seed`` inside a fork; return the new tokens."""
    device = next(target.parameters()).device
    prompt = input_ids.to(device)
    forked = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        sequences = target.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config,
                                    **assisted)
    return sequences[0, prompt.shape[1]:].to(input_ids.device)
