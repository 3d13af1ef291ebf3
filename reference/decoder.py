"""The reference speculative decoder, for any Hugging Face causal LM target.

0. **prefill**: ONE target pass over each prompt fills the target's KV cache and gives ``p_0``, the
   processed target law after the whole prompt; the first new token is drawn from it, ``y ~ p_0``,
   exactly as plain sampling from the target draws it (at temperature 0: the target's greedy
   token).  The prefill emits a token, as plain decoding's does; the first step starts from
   ``prompt + y``.

Then one step (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), repeated until every
request has ``max_new_tokens`` tokens or has emitted EOS:

1. **draft**: the drafter proposes up to γ tokens per row, ``x_1 .. x_γ``, each drawn from a known
   law ``q_i`` (or deterministically: a point mass);
2. **score**: ONE target forward pass over ``[last committed token, x_1 .. x_γ]`` gives
   ``p_1 .. p_{γ+1}``, where ``p_i`` is the target's next-token law after the context and
   ``x_1 .. x_{i-1}``;
3. **verify**: ``specverify.core.rules`` accepts a prefix of the drafts and emits one correction-or-bonus
   token: modified rejection sampling for sampled drafts, its point-mass form for deterministic
   drafts, greedy matching at temperature 0.  Each emitted token is distributed exactly as the
   target's (Leviathan et al. Theorem 1), so the whole output is;
4. **roll back**: both KV caches forget the rejected drafts (the target's keeps the last token and
   the accepted drafts; the newly emitted token is fed at the start of the next step).

Temperature, top-k, top-p and min-p are applied to draft and target logits by the same function,
``specverify.core.processing.SamplingParams.apply``, so ``q`` is the law the draft was drawn from and
``p`` the law SPEC §2 asks to sample from.

Randomness is per request: row b has its own ``torch.Generator`` on the target's device, and every
random number of row b (the one uniform of its first token ``y``, then per step its draft tokens
and its ``γ + 1`` verification uniforms, in ``specverify.core.rules``' convention) comes from it alone.  ``seed`` is either one seed per row (a
list: a request keeps its seed wherever it sits in the batch) or an int ``s``, which seeds row b
with :func:`request_seed` ``(s, b)``: distinct rows get independent streams, and request 0 decoded
alone with ``s`` equals row 0 of any batch decoded with ``s``.  Same inputs and seeds, same tokens;
and a request's tokens do not depend on the other rows of its batch.

Batches: rows advance by different numbers of tokens per step.  Each model keeps one KV cache for
the batch with per-row validity masks and explicit per-row position ids (``reference/kv.py``), so
a row's law never depends on another row, and neither do its random numbers (per-row generators).
Finished rows keep riding along until the whole batch is done (their extra tokens are discarded):
the loop needs no row bookkeeping, at the price of computing those rows.  Cost of the ragged
cache: see ``reference/kv.py``.  The number of draws a row takes per step is fixed (γ + 1, plus γ
for a model drafter), so neither the other rows nor a finished row's extra steps shift its stream.

:func:`generate` is the SPEC §2 adapter (built-in decoder ``reference`` of ``specverify audit``);
:func:`speculative_generate` is the full interface (batches, drafters, EOS, statistics).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch

from reference.drafters import Draft, Drafter, ModelDrafter, PromptLookupDrafter, model_device, vocab_size
from reference.kv import RaggedCache
from reference.request_stats import BatchStats, StatsRecorder
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams
from specverify.core.rules import VerifyResult, greedy_verify, point_mass_verify, rejection_sample
from specverify.core.sampling import inverse_cdf
from specverify.core.seeding import derive_seed

DEFAULT_GAMMA = 4


class Generation(NamedTuple):
    """Result of :func:`speculative_generate`.

    tokens: int64 ``[B, max_new_tokens]``, the new tokens of each request; a row that emitted
        ``eos_token_id`` ends with it and is padded with -1 after it.
    num_tokens: int64 ``[B]``, the number of real tokens of each row.
    stats: per request, tokens per target pass, acceptance by draft position, draft/target time
        (``stats.request(b)`` is row b's :class:`RequestStats`).
    """

    tokens: torch.Tensor
    num_tokens: torch.Tensor
    stats: BatchStats


@torch.no_grad()
def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter,
    prompts: torch.Tensor | Sequence[torch.Tensor],
    *,
    max_new_tokens: int,
    gamma: int = DEFAULT_GAMMA,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    seed: int | Sequence[int] = 0,
    eos_token_id: int | None = None,
) -> Generation:
    """Generate up to ``max_new_tokens`` tokens for each prompt by speculative decoding.

    ``prompts``: an int64 tensor ``[B, T]`` or a list of 1-D int64 tensors of different lengths.
    ``gamma``: draft tokens per step (γ).  ``temperature == 0`` is greedy decoding (the output then
    equals the target's own greedy output).  ``seed``: one int per prompt (row b's generator is
    seeded with ``seed[b]``), or an int ``s`` for rows seeded ``request_seed(s, b)``.  Raises
    ``ValueError`` before any model runs when an argument is invalid.
    """
    prompts = list(prompts)
    params = check_inputs(target, drafter, prompts, max_new_tokens=max_new_tokens, gamma=gamma, seed=seed,
                          eos_token_id=eos_token_id, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    gamma, max_new_tokens = int(gamma), int(max_new_tokens)
    eos_token_id = None if eos_token_id is None else int(eos_token_id)
    device = model_device(target)
    generators = [torch.Generator(device=device).manual_seed(s) for s in request_seeds(seed, len(prompts))]
    sequences = TokenSequences(prompts, device)
    target_kv, first_law = prefill(target, sequences, params)  # 0. prefill: y ~ p_0
    first = first_token(first_law, params, generators)
    sequences.append(first[:, None], torch.ones_like(first))
    drafter.start(sequences)
    recorder = StatsRecorder(len(prompts), gamma, device)
    finished = request_done(sequences, first[:, None], max_new_tokens, eos_token_id)

    while not bool(finished.all()):
        with Stopwatch(device) as draft_clock:  # 1. draft
            draft = drafter.propose(sequences, gamma, params, generators)
        with Stopwatch(device) as target_clock:  # 2. score, 3. verify
            target_probs = score_drafts(target_kv, sequences.last(), draft, params)
            result = verify(target_probs, draft, params, generators)
        target_kv.forget(draft.num_draft - result.num_accepted)  # 4. roll back: keep last + accepted drafts
        drafter.accepted(result.num_accepted)
        sequences.append(result.emitted, result.num_accepted + 1)
        recorder.record_pass(~finished, draft.num_draft, result.num_accepted, draft_clock.seconds, target_clock.seconds)
        finished = finished | request_done(sequences, result.emitted, max_new_tokens, eos_token_id)

    tokens, num_tokens = new_tokens(sequences, max_new_tokens, eos_token_id)
    return Generation(tokens, num_tokens, recorder.finish())


def request_seed(seed: int, row: int) -> int:
    """The seed of row ``row`` of a batch decoded with the int ``seed``: a 63-bit hash of both, so the
    rows' generators are independent and row 0 gets the same seed whatever the batch size."""
    return derive_seed("reference.decoder request", int(seed), row)


def request_seeds(seed: int | Sequence[int], batch_size: int) -> list[int]:
    """One seed per row: ``seed`` itself if it is a sequence, else ``request_seed(seed, b)`` for row b."""
    if is_integer(seed):
        return [request_seed(seed, row) for row in range(batch_size)]
    return [int(s) for s in seed]


def prefill(target: torch.nn.Module, sequences: TokenSequences, params: SamplingParams) -> tuple[RaggedCache, torch.Tensor]:
    """ONE target pass over every prompt: ``(target_kv, p_0 [B, V])``.

    ``target_kv`` holds every prompt token; ``p_0[b] = params.apply(logits at row b's last prompt
    token)`` is the processed target law of row b's first new token, the law plain sampling
    draws it from (the first token needs no draft: a prefill pass is made either way).
    """
    target_kv = RaggedCache(target, sequences.tokens.shape[0], sequences.tokens.device)
    block, counts = sequences.tail(torch.zeros_like(sequences.lengths))
    logits = target_kv.extend(block, counts)
    rows = torch.arange(block.shape[0], device=block.device)
    return target_kv, params.apply(logits[rows, counts - 1].float())


def first_token(first_law: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """The first new token of every row, ``y [B] ~ p_0 [B, V]``: the argmax at temperature 0 (no
    randomness, as greedy verification), else the inverse CDF (``specverify.core.sampling``) of
    one uniform from row b's generator, the way the rules draw their correction-or-bonus token."""
    if params.temperature == 0:
        return first_law.argmax(-1)
    return inverse_cdf(first_law, step_uniforms(generators, 1, first_law.device)[:, 0])


def score_drafts(target_kv: RaggedCache, last: torch.Tensor, draft: Draft, params: SamplingParams) -> torch.Tensor:
    """ONE target pass over ``[last, x_1 .. x_m]``, ``m = max_b num_draft[b]``: ``target_probs [B, γ+1, V]``
    after processing.  Row b feeds ``1 + num_draft[b]`` real tokens; ``target_probs[b, i]`` for
    ``i <= num_draft[b]`` is the processed law of the token after the context and ``x_1 .. x_i``.
    Only the ``1 + m`` columns that hold a real token in some row are scored (a pass where prompt
    lookup found nothing scores 1 token, not γ + 1); the later positions, which the rules ignore,
    repeat the last scored row so that the rules see the usual ``γ + 1`` positions.
    """
    width = 1 + int(draft.num_draft.max())
    block = torch.cat([last[:, None], draft.tokens[:, : width - 1]], dim=1)
    logits = target_kv.extend(block, draft.num_draft + 1)
    probs = params.apply(logits.float())
    padding = draft.tokens.shape[1] + 1 - width
    if padding:
        probs = torch.cat([probs, probs[:, -1:].expand(-1, padding, -1)], dim=1)
    return probs


def verify(
    target_probs: torch.Tensor, draft: Draft, params: SamplingParams, generators: Sequence[torch.Generator]
) -> VerifyResult:
    """Pick the lossless rule for the draft: greedy at temperature 0 (no randomness), point-mass for
    deterministic drafts, modified rejection sampling otherwise; the sampled rules get each row's
    uniforms from its own generator (:func:`step_uniforms`)."""
    if params.temperature == 0:
        return greedy_verify(target_probs, draft.tokens, num_draft=draft.num_draft)
    uniforms = step_uniforms(generators, draft.tokens.shape[1] + 1, target_probs.device)
    if draft.probs is None:
        return point_mass_verify(target_probs, draft.tokens, uniforms=uniforms, num_draft=draft.num_draft)
    return rejection_sample(target_probs, draft.probs, draft.tokens, uniforms=uniforms, num_draft=draft.num_draft)


def step_uniforms(generators: Sequence[torch.Generator], width: int, device: torch.device) -> torch.Tensor:
    """One step's uniforms ``u [B, K+1]`` (``width = K + 1``), float64 in ``[0, 1)``: row b is
    ``torch.rand(K+1, generator=generators[b])``.  ``specverify.core.rules``' convention: column ``i < K``
    is draft i's accept test, column ``K`` the inverse CDF of the correction-or-bonus token."""
    return torch.stack(
        [torch.rand(width, generator=generator, dtype=torch.float64, device=device) for generator in generators]
    )


def request_done(
    sequences: TokenSequences, emitted: torch.Tensor, max_new_tokens: int, eos_token_id: int | None
) -> torch.Tensor:
    """Rows that now have ``max_new_tokens`` new tokens or emitted EOS among this pass's ``emitted
    [B, n]`` tokens (-1 padded), bool ``[B]``."""
    done = sequences.lengths - sequences.prompt_lengths >= max_new_tokens
    if eos_token_id is not None:
        done = done | (emitted == eos_token_id).any(1)
    return done


def new_tokens(
    sequences: TokenSequences, max_new_tokens: int, eos_token_id: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``max_new_tokens`` tokens after each prompt, -1 after a row's first EOS:
    ``(tokens [B, max_new_tokens], num_tokens [B])``."""
    index = sequences.prompt_lengths[:, None] + torch.arange(max_new_tokens, device=sequences.tokens.device)
    tokens = sequences.tokens.gather(1, index.clamp(max=sequences.tokens.shape[1] - 1))  # clamped: past an EOS
    if eos_token_id is None:
        return tokens, torch.full_like(sequences.lengths, max_new_tokens)
    is_eos = tokens == eos_token_id
    after_eos = (is_eos.cumsum(1) - is_eos.to(torch.int64)) > 0
    return tokens.masked_fill(after_eos, -1), max_new_tokens - after_eos.sum(1)


class Stopwatch:
    """Wall time of a ``with`` block, synchronising CUDA so that queued kernels are counted."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._synchronize()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._synchronize()
        self.seconds = time.perf_counter() - self.start

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def check_inputs(
    target: torch.nn.Module,
    drafter: Drafter,
    prompts: list[torch.Tensor],
    *,
    max_new_tokens: int,
    gamma: int,
    seed: int | Sequence[int],
    eos_token_id: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
) -> SamplingParams:
    """Raise ``ValueError`` naming the argument for invalid input; return the sampling parameters."""
    if not isinstance(target, torch.nn.Module) or getattr(target, "get_output_embeddings", lambda: None)() is None:
        raise ValueError("target: expected a Hugging Face causal LM (a torch.nn.Module with an output head)")
    if target.training:
        raise ValueError("target: the model is in training mode (dropout would change its law); call target.eval()")
    if not is_integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
    if not is_integer(gamma) or gamma < 1:
        raise ValueError(f"gamma: expected an int >= 1 draft tokens per step, got {gamma!r}")
    if not is_integer(seed) and not (isinstance(seed, (list, tuple)) and all(is_integer(s) for s in seed)):
        raise ValueError(f"seed: expected an int or a list of ints (one per prompt), got {type(seed).__name__}")
    vocabulary = vocab_size(target)
    if eos_token_id is not None and not (is_integer(eos_token_id) and 0 <= eos_token_id < vocabulary):
        raise ValueError(f"eos_token_id: expected None or an id in [0, {vocabulary}), got {eos_token_id!r}")
    if not prompts:
        raise ValueError("prompts: expected at least one prompt")
    if not is_integer(seed) and len(seed) != len(prompts):
        raise ValueError(f"seed: got {len(seed)} seeds for {len(prompts)} prompts; pass one per prompt, or one int")
    for row, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor) or prompt.dtype != torch.int64 or prompt.dim() != 1:
            raise ValueError(f"prompts: row {row} must be a 1-D int64 tensor (or pass an int64 tensor [B, T])")
        if len(prompt) == 0:
            raise ValueError(f"prompts: row {row} is empty; every prompt needs at least one token (e.g. BOS)")
    all_tokens = torch.cat([prompt.cpu() for prompt in prompts])
    if bool((all_tokens < 0).any() or (all_tokens >= vocabulary).any()):
        raise ValueError(f"prompts: token ids outside the target's vocabulary [0, {vocabulary})")
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    drafter.check_target(target)
    return params


def is_integer(value: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter | None,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    gamma: int = DEFAULT_GAMMA,
    min_p: float | None = None,
) -> torch.Tensor:
    """SPEC §2: ``max_new_tokens`` new tokens for ``input_ids [1, T]``, distributed exactly as sampling
    from ``target`` (its greedy output when ``temperature == 0``).

    ``draft``: a Hugging Face causal LM sharing the target's vocabulary (:class:`ModelDrafter`),
    ``None`` for prompt lookup (:class:`PromptLookupDrafter`), or any :class:`Drafter`.  Does not
    stop at EOS.  Extensions (optional keywords): ``gamma``, ``min_p``.
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[0] != 1:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids: expected an int64 tensor [1, T], got {shape}; batch prompts with speculative_generate")
    if draft is None:
        drafter: Drafter = PromptLookupDrafter()
    elif isinstance(draft, torch.nn.Module):
        drafter = ModelDrafter(draft)
    else:
        drafter = draft
    generation = speculative_generate(
        target, drafter, [input_ids[0].to(model_device(target))], max_new_tokens=max_new_tokens, gamma=gamma,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
    )
    return generation.tokens[0].to(input_ids.device)
