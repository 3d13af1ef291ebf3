"""The reference speculative decoder, for any Hugging Face causal LM target.

One step (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), repeated until every
request has ``max_new_tokens`` tokens or has emitted EOS:

1. **draft**: the drafter proposes up to ``γ_b`` tokens for row b, ``x_1 .. x_{γ_b}``, each drawn
   from a known law ``q_i`` (or deterministically: a point mass), from the context alone: the first
   step drafts from the prompt.  ``γ_b = min(γ, r_b − 1)`` with ``r_b`` the tokens row b still needs
   (``max_new_tokens`` minus its new tokens so far), and ``γ_b = 0`` once row b is finished: a
   step emits at most ``γ_b + 1`` tokens, so a draft beyond ``r_b − 1`` could never be used.  This
   is Hugging Face's cap on its assistant (``AssistedCandidateGenerator._calculate_new_tokens``:
   ``min(num_assistant_tokens, max_length − cur_len − 1)``), so with a model drafter the passes and
   drafts are HF's; its prompt lookup caps only the last step (``r_b = 1``: no draft);
2. **score**: ONE target forward pass over the committed tokens the target's cache lacks and the
   drafts gives ``p_1 .. p_{γ_b+1}``, where ``p_i`` is the target's next-token law after the context
   and ``x_1 .. x_{i-1}``.  The cache holds every committed token but the last, so a step feeds
   ``[last committed token, x_1 .. x_{n_b}]``, and the first step ``[prompt, x_1 .. x_{n_b}]``
   (``n_b <= γ_b`` the drafts row b got): the prefill
   is the first step's pass and already emits its tokens (as Hugging Face's assisted generation
   does; there is no pass of the prompt alone);
3. **verify**: ``specverify.core.rules`` accepts a prefix of the drafts and emits one correction-or-bonus
   token: modified rejection sampling for sampled drafts, its point-mass form for deterministic
   drafts, greedy matching at temperature 0.  Each emitted token is distributed exactly as the
   target's (Leviathan et al. Theorem 1), so the whole output is;
4. **roll back**: both KV caches forget the rejected drafts (the target's keeps the last token and
   the accepted drafts; the newly emitted token is fed at the start of the next step).  A drafter
   that drafts from the target's hidden states (a :class:`~reference.drafters.HiddenStateDrafter`,
   e.g. the MTP drafter) then gets the target's last hidden state at every token its cache kept,
   from the same pass (``output_hidden_states``): no extra target pass.

Temperature, top-k, top-p and min-p are applied to draft and target logits by the same function,
``specverify.core.processing.SamplingParams.apply``, so ``q`` is the law the draft was drawn from and
``p`` the law SPEC §2 asks to sample from.

Randomness is per request: row b has its own ``torch.Generator`` on the target's device, and every
random number of row b comes from it alone.  Per step, row b draws, in this order: its draft tokens
(a model drafter: one float64 uniform per draft, ``γ_b`` in all, at temperature 0 too; the MTP
drafter the same, but none at the first step, where it drafts nothing; prompt lookup: none),
then the ``n_b + 1`` uniforms its verification reads (``n_b`` = its number of drafts: ``γ_b``
for a model drafter, up to ``γ_b`` for prompt lookup; at temperature 0 none),
placed in ``specverify.core.rules``' convention: the first ``n_b`` in columns ``0 .. n_b − 1``
(the accept tests), the last in column ``K = max_b γ_b`` (the inverse CDF of the
correction-or-bonus token; ``K = 1`` when no row drafts).  Padding columns (``n_b ≤ i < K``) and
padding draft positions take no random number.  ``seed`` is either one seed per row (a list: a
request keeps its seed wherever it sits in the batch) or an int ``s``, which seeds row b with
:func:`request_seed` ``(s, b)``: distinct rows get independent streams, and request 0 decoded
alone with ``s`` equals row 0 of any batch decoded with ``s``.  Same inputs and seeds, same
tokens; and a request's tokens do not depend on the other rows of its batch.

Batches: rows advance by different numbers of tokens per step.  Each model keeps one KV cache for
the batch with per-row validity masks and explicit per-row position ids (``reference/kv.py``), so
a row's law never depends on another row, and neither do its random numbers (per-row generators).
Finished rows keep riding along until the whole batch is done (their extra tokens are discarded):
the loop needs no row bookkeeping, at the price of computing those rows.  Cost of the ragged
cache: see ``reference/kv.py``.  A row's draws per step depend only on its own history (its ``γ_b``
and ``n_b``), never on the batch's ``K`` or on the other rows, so they cannot shift its stream; a
finished row drafts nothing (``γ_b = 0``) and its draws are discarded with its tokens.  The draft
model runs ``max_b γ_b`` passes per step (none when no row drafts), the target one pass over
``max_b (unseen_b + n_b)`` columns.

:func:`generate` is the SPEC §2 adapter (built-in decoder ``reference`` of ``specverify audit``;
:func:`generate_mtp`, drafting with a random MTP head on the target, is ``reference-mtp``);
:func:`speculative_generate` is the full interface (batches, drafters, EOS, statistics).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch

from reference.drafters import (
    Draft,
    Drafter,
    HiddenStateDrafter,
    ModelDrafter,
    MTPDrafter,
    MTPHead,
    PromptLookupDrafter,
    model_device,
    vocab_size,
)
from reference.kv import RaggedCache
from reference.request_stats import BatchStats, StatsRecorder
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams
from specverify.core.rules import VerifyResult, greedy_verify, point_mass_verify, rejection_sample
from specverify.core.seeding import derive_seed

if TYPE_CHECKING:
    from transformers import PreTrainedModel

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
    target: PreTrainedModel,
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
    reads_hidden = isinstance(drafter, HiddenStateDrafter)
    target_kv = RaggedCache(target, len(prompts), device, keep_hidden=reads_hidden)  # empty: the first pass prefills
    drafter.start(sequences)
    recorder = StatsRecorder(len(prompts), gamma, device)
    finished = torch.zeros(len(prompts), dtype=torch.bool, device=device)

    while not bool(finished.all()):
        gammas = draft_lengths(sequences, finished, gamma, max_new_tokens)
        with Stopwatch(device) as draft_clock:  # 1. draft
            draft = drafter.propose(sequences, gammas, params, generators)
        seen = target_kv.lengths
        with Stopwatch(device) as target_clock:  # 2. score, 3. verify
            target_probs = score_drafts(target_kv, sequences, draft, params)
            result = verify(target_probs, draft, params, generators)
        target_kv.forget(draft.num_draft - result.num_accepted)  # 4. roll back: keep the fed context + accepted drafts
        drafter.accepted(result.num_accepted)
        if isinstance(drafter, HiddenStateDrafter):  # the same pass's hidden states at the tokens the target kept
            assert target_kv.hidden is not None, "a cache made with keep_hidden keeps each block's hidden states"
            drafter.target_hidden(target_kv.hidden, target_kv.lengths - seen)
        sequences.append(result.emitted, result.num_accepted + 1)
        recorder.record_pass(~finished, draft.num_draft, result.num_accepted, draft_clock.seconds, target_clock.seconds)
        finished = finished | request_done(sequences, result, max_new_tokens, eos_token_id)

    tokens, num_tokens = new_tokens(sequences, max_new_tokens, eos_token_id)
    return Generation(tokens, num_tokens, recorder.finish())


def request_seed(seed: int, row: int) -> int:
    """The seed of row ``row`` of a batch decoded with the int ``seed``: a 63-bit hash of both, so the
    rows' generators are independent and row 0 gets the same seed whatever the batch size."""
    return derive_seed("reference.decoder request", int(seed), row)


def request_seeds(seed: int | Sequence[int], batch_size: int) -> list[int]:
    """One seed per row: ``seed`` itself if it is a sequence, else ``request_seed(seed, b)`` for row b."""
    if isinstance(seed, Sequence):
        return [int(s) for s in seed]
    return [request_seed(seed, row) for row in range(batch_size)]


def draft_lengths(sequences: TokenSequences, finished: torch.Tensor, gamma: int, max_new_tokens: int) -> torch.Tensor:
    """``γ_b = min(γ, r_b − 1)`` per row (int64 ``[B]``), ``r_b = max_new_tokens −`` row b's new
    tokens so far (``≥ 1`` while it is unfinished), and 0 for finished rows: a step emits at most
    ``γ_b + 1`` tokens, so no draft is made that the row could not use."""
    remaining = max_new_tokens - (sequences.lengths - sequences.prompt_lengths)
    return torch.where(finished, 0, (remaining - 1).clamp(max=gamma))


def score_drafts(target_kv: RaggedCache, sequences: TokenSequences, draft: Draft,
                 params: SamplingParams) -> torch.Tensor:
    """ONE target pass over each row's unseen committed tokens followed by its drafts: ``target_probs
    [B, K+1, V]`` after processing (``K`` = the draft's width, ``max_b γ_b`` or 1).

    Row b feeds the ``c_b`` committed tokens the cache lacks (its whole prompt at the first step, its
    last token after) and then ``x_1 .. x_{num_draft[b]}``; ``target_probs[b, i]`` is the processed
    law at its ``(c_b + i)``-th fed token, i.e. of the token after the context and ``x_1 .. x_i``.
    Only those ``K + 1`` columns get logits (a prompt's other positions predict nothing we need);
    positions ``i > num_draft[b]``, which the rules ignore, hold the law at a later column.
    """
    unseen, unseen_counts = sequences.tail(target_kv.lengths)
    block, counts = concat_rows(unseen, unseen_counts, draft.tokens, draft.num_draft)
    logits = target_kv.extend(block, counts, read_from=unseen_counts - 1, width=draft.tokens.shape[1] + 1)
    return params.apply(logits.float())


def concat_rows(
    first: torch.Tensor, first_counts: torch.Tensor, second: torch.Tensor, second_counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row b's first ``first_counts[b]`` tokens of ``first`` then its first ``second_counts[b]`` of
    ``second``, left-aligned and padded with 0: ``(block [B, m], counts [B])``, ``m = max(counts)``."""
    counts = first_counts + second_counts
    offsets = torch.arange(int(counts.max()), device=first.device).expand(first.shape[0], -1)
    in_second = offsets - first_counts[:, None]
    from_first = first.gather(1, offsets.clamp(max=first.shape[1] - 1))
    from_second = second.gather(1, in_second.clamp(0, second.shape[1] - 1))
    block = torch.where(in_second < 0, from_first, torch.where(in_second < second_counts[:, None], from_second, 0))
    return block, counts


def verify(
    target_probs: torch.Tensor, draft: Draft, params: SamplingParams, generators: Sequence[torch.Generator]
) -> VerifyResult:
    """Pick the lossless rule for the draft: greedy at temperature 0 (no randomness), point-mass for
    deterministic drafts, modified rejection sampling otherwise; the sampled rules get each row's
    uniforms from its own generator (:func:`step_uniforms`)."""
    if params.temperature == 0:
        return greedy_verify(target_probs, draft.tokens, num_draft=draft.num_draft)
    uniforms = step_uniforms(generators, draft.num_draft, draft.tokens.shape[1], target_probs.device)
    if draft.probs is None:
        return point_mass_verify(target_probs, draft.tokens, uniforms=uniforms, num_draft=draft.num_draft)
    return rejection_sample(target_probs, draft.probs, draft.tokens, uniforms=uniforms, num_draft=draft.num_draft)


def step_uniforms(
    generators: Sequence[torch.Generator], num_draft: torch.Tensor, width: int, device: torch.device
) -> torch.Tensor:
    """One step's uniforms ``u [B, K+1]`` (``width = K``), float64 in ``[0, 1)``, in
    ``specverify.core.rules``' convention: column ``i < K`` is draft i's accept test, column ``K`` the
    inverse CDF of the correction-or-bonus token.  Row b draws ``torch.rand(n_b + 1,
    generator=generators[b])`` (``n_b = num_draft[b]``): the first ``n_b`` go to columns
    ``0 .. n_b − 1``, the last to column ``K``; its padding columns ``n_b .. K − 1``, which the rules
    ignore, hold 0 and take no draw."""
    rows = []
    for generator, drafts in zip(generators, num_draft.tolist()):
        draws = torch.rand(drafts + 1, generator=generator, dtype=torch.float64, device=device)
        padding = torch.zeros(width - drafts, dtype=torch.float64, device=device)
        rows.append(torch.cat([draws[:drafts], padding, draws[drafts:]]))
    return torch.stack(rows)


def request_done(
    sequences: TokenSequences, result: VerifyResult, max_new_tokens: int, eos_token_id: int | None
) -> torch.Tensor:
    """Rows that now have ``max_new_tokens`` new tokens or emitted EOS this step, bool ``[B]``."""
    done = sequences.lengths - sequences.prompt_lengths >= max_new_tokens
    if eos_token_id is not None:
        done = done | (result.emitted == eos_token_id).any(1)
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
    target: PreTrainedModel,
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
    if isinstance(seed, (list, tuple)) and len(seed) != len(prompts):
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
    target: PreTrainedModel,
    draft: PreTrainedModel | Drafter | None,
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
        raise ValueError(f"input_ids: expected an int64 tensor [1, T], got {shape}; batch "
                         "prompts with speculative_generate")
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


MTP_HEAD_SEED = 0
"""The seed of the random MTP head of :func:`generate_mtp`."""


def generate_mtp(
    target: PreTrainedModel,
    draft: PreTrainedModel | None,
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
    """SPEC §2 with MTP drafting (built-in decoder ``reference-mtp``): :func:`generate` with an
    :class:`MTPDrafter` whose head, ``MTPHead(target, seed=MTP_HEAD_SEED)``, is built on ``target``
    (random weights, the same at every call); ``draft`` is ignored."""
    drafter = MTPDrafter(MTPHead(target, seed=MTP_HEAD_SEED))
    return generate(target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                    top_p=top_p, seed=seed, gamma=gamma, min_p=min_p)
