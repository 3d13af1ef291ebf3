"""Known-bug catalog of the decoder level: SPEC §2 decoders that are the reference decoder
(:mod:`reference.decoder`) with one mistake, each standing for a class of bugs that live on the
sampled path and across steps, where a one-step sampler audit cannot see them.

Each entry is a :class:`BuggyDecoder` whose ``fn`` has the SPEC §2 signature
``fn(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed) -> new_tokens``.
The entries are built by wrapping the reference's drafter (:class:`reference.drafters.ModelDrafter`)
or by handing :func:`reference.decoder.speculative_generate` other sampling parameters; the
mistake is marked ``# BUG``.  Two classes:

- ``randomness``: the random numbers of the reference are one stream per request (its
  ``torch.Generator``): per step, one uniform per draft, then ``n + 1`` verification uniforms.
  The entries reuse or correlate them: across steps, or between drafting and verification.
  Every marginal uniform stays Uniform(0, 1); what breaks is their independence, so the output
  law changes from the second step on (or, for the drafting/verification reuse, at once);
- ``processing``: temperature / top-k / top-p applied to one model's law and not the other's, or
  applied twice.  The verifier needs ``q`` to be the law the draft was really drawn from and ``p``
  the law the user asked for (:mod:`specverify.core.processing`).

``tv`` is what the position-law check sees (:class:`specverify.auditing.decoder.battery.PositionLawCheck`):
ε̄ = √(λ / (4 n L)) at the lag ℓ where it is largest, λ the noncentrality of that lag's test on n
calls of L tokens over its strata (≥ the root mean square over strata, positions and blocks of
the TV between the binned PIT law and the uniform one), estimated by Monte Carlo as X² − dof on
8,000 calls, 1,000 per stratum (``benchmarks/decoder_catalog_tv.py``; the upper end of its
two-standard-error interval is within 0.007 of each figure).  The check has power ≥ 0.99 at the
budgets whose ε̄ (:data:`~specverify.auditing.decoder.battery.DECODER_BUDGETS`) the entry's
reaches.  None for the two entries that emit tokens the request's top-k/top-p forbids (in 7,034
and 839 of those 128,000 tokens): each such token is a certain loss, failing the check at the
first look that holds one, whatever ε̄.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference.decoder import DEFAULT_GAMMA, speculative_generate
from reference.drafters import Draft, ModelDrafter
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["DECODER_CATALOG", "BuggyDecoder"]


@dataclass(frozen=True)
class BuggyDecoder:
    """One entry: ``name`` (the key in :data:`DECODER_CATALOG`); ``description``, the exact error;
    ``bug_class``, ``randomness`` or ``processing``; ``fn``, the SPEC §2 decoder; ``tv``, ε̄ of the
    position-law check's strata (module docstring; None for an entry that emits forbidden tokens)."""

    name: str
    description: str
    bug_class: str
    fn: Callable[..., torch.Tensor]
    tv: float | None = None


def _generate(target: PreTrainedModel, drafter: ModelDrafter, input_ids: torch.Tensor, *, max_new_tokens: int,
              temperature: float, top_k: int | None, top_p: float | None, seed: int) -> torch.Tensor:
    """The reference decoder's SPEC §2 call with ``drafter``: ``new_tokens [max_new_tokens]`` for
    ``input_ids [1, T]``.  ``input_ids [B, T]`` with B > 1 decodes B requests in one batch, row b
    seeded :func:`reference.decoder.request_seed` ``(seed, b)`` (row 0 is the SPEC §2 call's), and
    returns ``[B, max_new_tokens]``: the Monte Carlo of ``benchmarks/decoder_catalog_tv.py``."""
    generation = speculative_generate(target, drafter, list(input_ids), max_new_tokens=max_new_tokens,
                                      gamma=DEFAULT_GAMMA, temperature=temperature, top_k=top_k, top_p=top_p,
                                      seed=seed)
    return generation.tokens[0] if len(input_ids) == 1 else generation.tokens


# ------------------------------------------------------------------------------------------------
# Randomness reused or correlated
# ------------------------------------------------------------------------------------------------


class ReplayingDrafter(ModelDrafter):
    """Every step restarts each request's generator from the state it had at the first step."""

    def start(self, sequences: TokenSequences) -> None:
        super().start(sequences)
        self.first_states: list[torch.Tensor] | None = None

    def propose(self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator]) -> Draft:
        if self.first_states is None:
            self.first_states = [generator.get_state() for generator in generators]
        else:
            for generator, state in zip(generators, self.first_states):
                generator.set_state(state)  # BUG: the same uniforms at every step
        return super().propose(sequences, gammas, params, generators)


def generator_replayed_each_step(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
    return _generate(target, ReplayingDrafter(draft), input_ids, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


class SharedUniformDrafter(ModelDrafter):
    """The verification reads the uniforms the drafts were drawn with."""

    def propose(self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator]) -> Draft:
        states = [generator.get_state() for generator in generators]
        draft = super().propose(sequences, gammas, params, generators)
        for generator, state in zip(generators, states):
            generator.set_state(state)  # BUG: accept test i uses the uniform that drew draft i
        return draft


def draft_uniform_reused_in_acceptance(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p,
                                       seed):
    return _generate(target, SharedUniformDrafter(draft), input_ids, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


class RewindingDrafter(ModelDrafter):
    """Each step's first draft reuses the uniform of the previous step's correction-or-bonus token."""

    def start(self, sequences: TokenSequences) -> None:
        super().start(sequences)
        self.before_verification: list[tuple[torch.Tensor, int]] | None = None

    def propose(self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator]) -> Draft:
        if self.before_verification is not None:
            for generator, (state, drafts) in zip(generators, self.before_verification):
                generator.set_state(state)  # BUG: rewinds to the last verification uniform of the previous step
                torch.rand(drafts, generator=generator, dtype=torch.float64, device=generator.device)
        draft = super().propose(sequences, gammas, params, generators)
        self.before_verification = [(generator.get_state(), int(n)) for generator, n in
                                    zip(generators, draft.num_draft.tolist())]
        return draft


def correction_uniform_reused_next_step(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p,
                                        seed):
    return _generate(target, RewindingDrafter(draft), input_ids, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


# ------------------------------------------------------------------------------------------------
# Sampling parameters applied to one law only, or twice
# ------------------------------------------------------------------------------------------------


class UntemperedDrafter(ModelDrafter):
    """Draws at temperature 1 (with the request's filters) and tells the verifier q_1^(1/T), renormalised."""

    def propose(self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator]) -> Draft:
        if params.is_greedy or not bool(gammas.any()):
            return super().propose(sequences, gammas, params, generators)
        draft = super().propose(sequences, gammas, dataclasses.replace(params, temperature=1.0), generators)  # BUG
        assert draft.probs is not None, "a draft model's drafts come with their laws"
        believed = draft.probs.double() ** (1.0 / params.temperature)  # q_T ∝ q_1^(1/T) on the drawn support
        return dataclasses.replace(draft, probs=(believed / believed.sum(-1, keepdim=True)).float())


def draft_ignores_temperature(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
    return _generate(target, UntemperedDrafter(draft), input_ids, max_new_tokens=max_new_tokens,
                     temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


class RequestedParamsDrafter(ModelDrafter):
    """Draws (and reports) with the request's parameters, whatever the decoder loop was given."""

    def __init__(self, model: PreTrainedModel, params: SamplingParams) -> None:
        super().__init__(model)
        self.params = params

    def propose(self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
                generators: Sequence[torch.Generator]) -> Draft:
        return super().propose(sequences, gammas, self.params, generators)


def sampling_parameters_on_draft_only(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p,
                                      seed):
    if temperature == 0:
        return _generate(target, ModelDrafter(draft), input_ids, max_new_tokens=max_new_tokens, temperature=0.0,
                         top_k=top_k, top_p=top_p, seed=seed)
    drafter = RequestedParamsDrafter(draft, SamplingParams(temperature, top_k, top_p))
    # BUG: the target's law is left at temperature 1, unfiltered
    return _generate(target, drafter, input_ids, max_new_tokens=max_new_tokens, temperature=1.0, top_k=None,
                     top_p=None, seed=seed)


def temperature_applied_twice(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed):
    return _generate(target, ModelDrafter(draft), input_ids, max_new_tokens=max_new_tokens,
                     temperature=temperature**2, top_k=top_k, top_p=top_p, seed=seed)  # BUG: logits / T / T


_ENTRIES = (
    BuggyDecoder(
        "generator_replayed_each_step",
        "Every step restarts the request's generator from its state at the first step, so every step draws "
        "the same drafts' uniforms and the same verification uniforms: from the second step on the accept "
        "tests and the correction are functions of the first step's, not fresh.",
        "randomness", generator_replayed_each_step, tv=0.10),
    BuggyDecoder(
        "draft_uniform_reused_in_acceptance",
        "The accept test of draft i reads the uniform u that drew draft i by inverse CDF: x_i = F_q^{-1}(u) and "
        "accept iff u q(x_i) < p(x_i), so acceptance depends on where x_i lies in q's CDF instead of being "
        "independent of it (the output law is not p even at the first token).",
        "randomness", draft_uniform_reused_in_acceptance, tv=0.062),
    BuggyDecoder(
        "correction_uniform_reused_next_step",
        "Each step's first draft is drawn with the uniform that drew the previous step's correction-or-bonus "
        "token (the stream is rewound by one draw): consecutive steps are correlated.",
        "randomness", correction_uniform_reused_next_step, tv=0.054),
    BuggyDecoder(
        "draft_ignores_temperature",
        "The draft model samples at temperature 1 while the verifier is told its law at the request's T "
        "(q_T ∝ q_1^{1/T}): q in the acceptance ratio is not the law of the draft (lossless only at T = 1).",
        "processing", draft_ignores_temperature, tv=0.017),
    BuggyDecoder(
        "sampling_parameters_on_draft_only",
        "Temperature, top-k and top-p are applied to the draft's logits only: the verification is exact, "
        "against the target at T = 1 unfiltered, which is then what the decoder samples.",
        "processing", sampling_parameters_on_draft_only),
    BuggyDecoder(
        "temperature_applied_twice",
        "Both models' logits are divided by T twice: the decoder samples the target at T² (lossless only at "
        "T = 1).",
        "processing", temperature_applied_twice),
)

DECODER_CATALOG: dict[str, BuggyDecoder] = {entry.name: entry for entry in _ENTRIES}
