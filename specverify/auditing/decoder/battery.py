"""The decoder level of the audit (SPEC §2): end-to-end generation on tiny real models.

``specverify audit TARGET --level decoder`` drives a SPEC §2 function

    generate(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed) -> new_tokens

with tiny random-initialised Hugging Face targets and drafts over one 8-token vocabulary
(:func:`specverify.hf.tiny_models.tiny_target_and_draft`, fp32, deterministic): five model pairs
(:data:`MODEL_PAIRS`) whose laws are peaked or flat and whose drafts are close to the target
(acceptance ≈ 0.92), far from it (≈ 0.16) or in between, so that the decoder's KV caches,
rollbacks, position ids, rejections, full acceptances and sampling all run for real.  SPEC §2: a
lossless decoder's ``new_tokens`` follow the target's law after the same temperature / top-k /
top-p processing (:func:`specverify.core.processing.process_logits`), token after token,

    P(x_1 .. x_L | prompt) = Π_t p(x_t | prompt, x_<t)

(Leviathan et al. 2023, Theorem 1, applied step after step); under greedy they equal the target's
own greedy decoding.

Checks (in order):

- ``determinism`` (contract): the same seed gives the same tokens whatever the global RNG states
  (torch, numpy, ``random``) are: all randomness must be derived from ``seed``;
- ``seed-sensitivity``: k calls with different seeds at temperature 1 are not all identical; k is
  the smallest number for which a lossless decoder returns k identical continuations with
  probability Σ_x P(x)^k ≤ 1e-9 (computed exactly on 3 tokens; not charged to α);
- ``greedy-identity`` (exact): at temperature 0, 16 new tokens after each prompt, on every model
  pair, equal the target's greedy continuation token for token (also with top-k/top-p set, which
  greedy ignores): one teacher-forced target pass over the whole continuation, every token its
  argmax given the tokens before it (:mod:`specverify.core.greedy_identity` with τ = 0);
- ``position-laws`` (goodness of fit): every one of the L = 16 new tokens against its exact
  conditional law given the PIT value 1 to 5 positions back, over 8 strata (model pair, setting,
  prompt; :data:`POSITION_STRATA`) drawn uniformly per call (see below);
- ``inputs-unchanged`` and ``models-unchanged`` (contract): ``input_ids`` and the models'
  parameters are the same after every call.

The position-law check.  One teacher-forced pass of the stratum's target over each returned
continuation gives, processed like the request, the exact law ``p_t = p(· | prompt, x_<t)`` of
every new token ``x_t``.  Its randomized PIT value (:func:`specverify.auditing.endpoint.pit.token_pit_values`)

    u_t = F_t(x_t −) + U_t · p_t(x_t),      U_t ~ Uniform(0, 1) drawn by the audit,

is Uniform(0, 1) given everything before it (x_<t and U_<t) exactly when ``x_t ~ p_t``, so under
H0 the u_t of a continuation are i.i.d. uniform (Rosenblatt 1952).  Each u_t falls in one of
``B = 4`` equal bins.  For each lag ℓ of :data:`PIT_LAGS` (1 to 5) the *block* of position t is
(stratum, t, bin of u_{t−ℓ}) (t ≤ ℓ: (stratum, t)), a function of the past, so under H0 the bin of
u_t is uniform in every block, and each lag's counts are tested by Pearson's X² of transition
counts summed over blocks (:func:`specverify.core.transitions.transition_goodness_of_fit`); the
check's p-value is ``min(1, 5 · min_ℓ p_ℓ)`` (Bonferroni over the lags).  A token of probability
0 under ``p_t`` (cut by top-k/top-p) is a certain loss (p-value 0).  The blocks make the test see
both kinds of loss: a token drawn from a wrong law (a sampling parameter misapplied, a residual
mixed up: u_t not uniform, in every lag's test) and randomness reused or correlated across steps
or between drafting and verification (u_t not independent of u_{t−ℓ}).  A step of a γ = 4 decoder
emits 1 to 5 tokens, so a random number reused from one step in the next recurs at a lag of 1 to
5 positions (uniforms replayed every 4 tokens leave every u_t uniform and independent of u_{t−1}:
only the lag-4 test sees them).

What it detects.  Let the decoder's token at position t, in block m of lag ℓ, have a PIT law
whose B-binned version is at TV ε_m from uniform (a token law q_t at TV δ from p_t gives a PIT
law at TV exactly δ; binning can only lower it).  The noncentrality of lag ℓ's test is
≥ 4 n Σ_m π_m ε_m² (:mod:`specverify.core.transitions`), π_m the probability of block m; so with
``ε̄_ℓ² = Σ_m π_m ε_m² / L`` (the mean over the L positions of the squared deviation, averaged over
strata and the bin ℓ positions back) and ``ε̄ = max_ℓ ε̄_ℓ``, n calls detect ε̄ with power 0.99
when 4 n L ε̄² reaches the χ² noncentrality of a test at level α / 5 with the lag-1 test's
``dof = S (1 + (L − 1) B)(B − 1)`` = 1 464, the most of any lag
(:meth:`PositionLawCheck.required_samples`).  A wrong token law at every position of every
stratum is ε̄ = ε; at every position of one stratum, ε̄ = ε / √8; at one position of every
stratum, ε̄ = ε / 4.

Budgets (:data:`DECODER_BUDGETS`, α = 1e-3, power 0.99; calls of the position-law check, every
look; wall time measured for the reference decoder on this project's 2 shared cores, docs/budgets.md):

=========  ==============  ===========  ================================================
budget     detects ε̄ ≥     calls        one stratum, every position / one position, every stratum
=========  ==============  ===========  ================================================
quick      0.05            2 182        0.14 / 0.2
standard   0.02            13 637       0.057 / 0.08
thorough   0.01            54 545       0.028 / 0.04
=========  ==============  ===========  ================================================

A fixed budget of N calls per statistical check reports the ε̄ it can then detect.  Seeds: call i
of a check uses ``derive_seed(plan seed, "call", i)``, the plan seed being derived from the check's
name and parameters and the audit's base seed; the strata and the PIT's U of look j come from
``derive_seed(plan seed, "strata", j)`` and ``derive_seed(plan seed, "pit", j)``.

Faults inside a call (an exception, a hang past the per-call deadline, output that is not an int64
tensor ``[max_new_tokens]`` of ids in ``[0, V)``) stop that check with verdict ``error`` ("could not
audit"); they never end the audit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from specverify.auditing.audited import AuditSession
from specverify.auditing.checks import (
    Battery,
    Check,
    CheckKind,
    CheckResult,
    InputsUnchangedCheck,
    Plan,
    SampleBudget,
    SequentialCheck,
    Tally,
    Verdict,
    level_phrase,
    look_fields,
    resolve_budget,
)
from specverify.auditing.cost import SECONDS_UNSAMPLED, Cost, call_cost
from specverify.auditing.endpoint.pit import token_pit_values
from specverify.auditing.isolation.faults import (
    FaultKind,
    preserved_global_rng,
    seed_global_rng,
    validate_new_tokens,
)
from specverify.auditing.isolation.guarded import GuardedGenerate
from specverify.core import stats
from specverify.core.processing import process_logits
from specverify.core.seeding import derive_seed
from specverify.core.transitions import TransitionFit, transition_goodness_of_fit

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

DECODER_BUDGETS: dict[str, float] = {"quick": 0.05, "standard": 0.02, "thorough": 0.01}
"""Named decoder budgets: the mean per-position TV ε̄ (module docstring) the position-law check
detects with power ≥ POWER."""

VOCAB_SIZE = 8
MODEL_SEED = 0
CONTINUATION_LENGTH = 16
"""New tokens per call of the position-law, greedy and determinism checks: 5–8 steps of a γ = 4
decoder, so rejections, full acceptances and step boundaries all occur."""
SEED_LENGTH = 3
PIT_BINS = 4
PIT_LAGS: tuple[int, ...] = (1, 2, 3, 4, 5)
"""Lags ℓ of the position-law check's blocks (bin of the PIT value ℓ positions back): a step of a
γ = 4 decoder emits 1 to γ + 1 = 5 tokens, so randomness reused from one step to the next (or
within a step) recurs at one of these lags."""
PROMPTS: tuple[tuple[int, ...], ...] = ((3,), (1, 5, 2, 6), (7, 0, 4, 4, 2, 1))
"""Prompts of 1, 4 and 6 tokens (prefill of one token, and of several)."""

SEED_FALSE_ALARM = 1e-9
"""Largest probability that ``seed-sensitivity`` fails a lossless decoder."""

MAX_SEED_CALLS = 64


# --------------------------------------------------------------------------------------------
# Settings, models and exact laws
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelPair:
    """A target and a draft of :func:`specverify.hf.tiny_models.tiny_target_and_draft` (V = 8):
    ``logit_scale`` sets how peaked both laws are, ``draft_noise`` and ``draft_layers`` how far the
    draft is from the target; ``acceptance`` is Σ_x min(p, q) at temperature 1, measured on 200
    random contexts."""

    logit_scale: float
    draft_noise: float
    draft_layers: int
    acceptance: float


MODEL_PAIRS: dict[str, ModelPair] = {
    "base": ModelPair(2.0, 0.3, 1, 0.52),
    "close-draft": ModelPair(2.0, 0.05, 2, 0.92),
    "far-draft": ModelPair(2.0, 3.0, 1, 0.16),
    "flat": ModelPair(0.8, 0.3, 1, 0.73),
    "peaked": ModelPair(4.0, 0.3, 1, 0.42),
}
"""The audit's model pairs: next-token entropy ≈ 1.08 nats (max p ≈ 0.61) for base and the two
draft variants, 1.79 (0.34) for ``flat``, 0.55 (0.80) for ``peaked``."""


@dataclass(frozen=True)
class Setting:
    """SPEC §2 sampling settings of one call (``temperature == 0`` is greedy)."""

    temperature: float
    top_k: int | None = None
    top_p: float | None = None

    def label(self) -> str:
        parts = ["greedy" if self.temperature == 0 else f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k {self.top_k}")
        if self.top_p is not None:
            parts.append(f"top-p {self.top_p:g}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Stratum:
    """One kind of call: its settings, its prompt and the model pair (a :data:`MODEL_PAIRS` key)."""

    setting: Setting
    prompt: tuple[int, ...]
    models: str = "base"

    def label(self) -> str:
        return f"{self.models} models, {self.setting.label()}, prompt {list(self.prompt)}"


class DecoderModels:
    """The audit's tiny model pairs (:data:`MODEL_PAIRS`, V = 8, fp32) on ``device``, with their
    exact laws and greedy continuations; ``target``/``draft`` are the ``base`` pair."""

    def __init__(self, device: str = "cpu") -> None:
        from specverify.hf.tiny_models import tiny_target_and_draft

        self.device = torch.device(device)
        self.pairs: dict[str, tuple[LlamaForCausalLM, LlamaForCausalLM]] = {}
        for name, spec in MODEL_PAIRS.items():
            target, draft = tiny_target_and_draft(vocab_size=VOCAB_SIZE, seed=MODEL_SEED, draft_noise=spec.draft_noise,
                                                  logit_scale=spec.logit_scale, draft_layers=spec.draft_layers)
            self.pairs[name] = (
                target.to(self.device),  # type: ignore[arg-type]  # typeshed: @wraps'd PreTrainedModel.to binds no self
                draft.to(self.device),  # type: ignore[arg-type]  # typeshed: @wraps'd PreTrainedModel.to binds no self
            )
        self.target, self.draft = self.pairs["base"]
        self.vocab_size = VOCAB_SIZE
        self._snapshot = {name: self._parameters(model) for name, model in self._models()}
        self._laws: dict[tuple[Stratum, int], np.ndarray] = {}

    def pair(self, name: str) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
        """``(target, draft)`` of the model pair ``name``."""
        if name not in self.pairs:
            raise ValueError(f"models: no model pair {name!r}; use one of {', '.join(self.pairs)}")
        return self.pairs[name]

    def _models(self) -> tuple[tuple[str, torch.nn.Module], ...]:
        return tuple((f"{role} of the {name} pair", model) for name, (target, draft) in self.pairs.items()
                     for role, model in (("target", target), ("draft", draft)))

    @staticmethod
    def _parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}

    def sequence_law(self, stratum: Stratum, length: int) -> np.ndarray:
        """Exact law of the next ``length`` tokens, float64 ``[V**length]`` indexed by
        ``Σ_i x_i V^(length−1−i)`` (first token most significant): the chain-rule product of
        the target's processed next-token laws (:func:`specverify.hf.tiny_models.continuation_laws`)."""
        key = (stratum, length)
        if key not in self._laws:
            from specverify.hf.tiny_models import continuation_laws

            setting = stratum.setting
            laws = continuation_laws(self.pair(stratum.models)[0], stratum.prompt, length,
                                     temperature=setting.temperature, top_k=setting.top_k, top_p=setting.top_p)
            joint = laws[0]
            for law in laws[1:]:
                joint = joint[..., None] * law
            self._laws[key] = joint.reshape(-1) / joint.sum()
        return self._laws[key]

    @torch.no_grad()
    def conditional_laws(self, stratum: Stratum, tokens: np.ndarray) -> np.ndarray:
        """``p(· | prompt, x_<t)`` for every new token of every continuation ``tokens [N, L]``:
        float64 ``[N, L, V]``, from one teacher-forced pass of the stratum's target over
        ``prompt + x_1 .. x_{L−1}``, processed by :func:`process_logits` with the stratum's setting
        and normalised in float64."""
        target = self.pair(stratum.models)[0]
        setting = stratum.setting
        prompt = torch.tensor(stratum.prompt, dtype=torch.int64, device=self.device)
        continuations = torch.as_tensor(tokens, dtype=torch.int64, device=self.device)
        inputs = torch.cat([prompt.expand(len(continuations), -1), continuations[:, :-1]], 1)
        logits = target(input_ids=inputs).logits[:, len(stratum.prompt) - 1:].double()
        probs = process_logits(logits, temperature=setting.temperature, top_k=setting.top_k,
                               top_p=setting.top_p).double()
        return (probs / probs.sum(-1, keepdim=True)).cpu().numpy()

    @torch.no_grad()
    def greedy(self, stratum: Stratum, length: int) -> tuple[list[int], float]:
        """The stratum's target's own greedy continuation (argmax of full forward passes, no cache)
        and the smallest gap between the two largest logits along it (how far it is from a tie)."""
        target = self.pair(stratum.models)[0]
        tokens = list(stratum.prompt)
        margin = float("inf")
        for _ in range(length):
            logits = target(torch.tensor([tokens], device=self.device)).logits[0, -1].double()
            top = logits.topk(2).values
            margin = min(margin, float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
        return tokens[len(stratum.prompt):], margin

    def changed(self) -> list[str]:
        """Names of the models whose parameters differ from the snapshot taken at construction."""
        changed = []
        for name, model in self._models():
            current = dict(model.named_parameters())
            snapshot = self._snapshot[name]
            if current.keys() != snapshot.keys() or any(not torch.equal(current[k], snapshot[k]) for k in snapshot):
                changed.append(name)
        return changed


# --------------------------------------------------------------------------------------------
# Guarded calls
# --------------------------------------------------------------------------------------------


@dataclass
class DecoderSession(AuditSession):
    """A guarded SPEC §2 function and the models every decoder check uses."""

    function: GuardedGenerate
    models: DecoderModels
    timeout_s: float


# --------------------------------------------------------------------------------------------
# Contract and exact checks
# --------------------------------------------------------------------------------------------


@dataclass
class DeterminismCheck(Check):
    """Same seed, different global RNG states → the same tokens; same seed and states twice → the
    same tokens.  Randomness from anywhere but ``seed`` is a contract violation (exit 1)."""

    name: str
    description: str
    strata: tuple[Stratum, ...]
    length: int
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.parameters = {"strata": [s.label() for s in self.strata], "max_new_tokens": self.length}

    def cost(self, plan: Plan) -> Cost:
        return call_cost(3 * len(self.strata), fixed_s=SECONDS_UNSAMPLED)

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        for number, stratum in enumerate(self.strata):
            seed = derive_seed(plan.seed, "seed", number)
            with preserved_global_rng():
                first, repeat, other = (self._call(session, stratum, seed, derive_seed(plan.seed, "global", number, g))
                                        for g in (1, 1, 2))
            if not torch.equal(first, repeat):
                return self._failed(plan, "two calls with the same seed and the same global RNG states returned "
                                    f"different tokens ({stratum.label()}): the decoder draws randomness from outside "
                                    "both (OS entropy, time, threads); derive everything from `seed`")
            if not torch.equal(first, other):
                return self._failed(plan, f"the tokens changed when only the global RNG seeds changed (same `seed`, "
                                    f"{stratum.label()}): the decoder samples from the global torch/numpy/"
                                    "random RNG instead of deriving its randomness from `seed`")
        return self.report(plan, Verdict.PASS,
                           f"same seed, same tokens, whatever the global RNG states ({len(self.strata)} prompts)")

    def _call(self, session: DecoderSession, stratum: Stratum, seed: int, global_seed: int) -> torch.Tensor:
        seed_global_rng(global_seed)
        return session.function(stratum, self.length, seed, where=f"{self.name}, {stratum.label()}")

    def _failed(self, plan: Plan, message: str) -> CheckResult:
        return self.report(plan, Verdict.FAIL, message, fault=FaultKind.GLOBAL_RNG)


@dataclass
class SeedSensitivityCheck(Check):
    """k calls with k different seeds at temperature > 0 must not all return the same tokens.

    Under the target law P a lossless decoder returns k identical continuations with probability
    Σ_x P(x)^k; k is the smallest number (≤ MAX_SEED_CALLS) that makes it ≤ SEED_FALSE_ALARM.
    """

    name: str
    description: str
    stratum: Stratum
    length: int
    law: np.ndarray
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.calls = MAX_SEED_CALLS
        for calls in range(2, MAX_SEED_CALLS + 1):
            if float(np.sum(self.law**calls)) <= SEED_FALSE_ALARM:
                self.calls = calls
                break
        self.false_alarm = float(np.sum(self.law**self.calls))
        self.parameters = {"stratum": self.stratum.label(), "max_new_tokens": self.length,
                           "calls": self.calls, "P(all equal | lossless)": float(f"{self.false_alarm:.3g}")}

    def cost(self, plan: Plan) -> Cost:
        return call_cost(self.calls, fixed_s=SECONDS_UNSAMPLED)

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        outputs = {tuple(session.function(self.stratum, self.length, derive_seed(plan.seed, "call", i),
                                          where=f"{self.name}, call {i}").tolist())
                   for i in range(self.calls)}
        if len(outputs) == 1:
            message = (f"{self.calls} different seeds all gave {next(iter(outputs))} ({self.stratum.label()}); a "
                       f"lossless decoder does so with probability {self.false_alarm:.2g}: the output ignores `seed`, "
                       "so it cannot follow the target's law")
            return self.report(plan, Verdict.FAIL, message)
        return self.report(plan, Verdict.PASS,
                           f"{len(outputs)} distinct continuations from {self.calls} seeds")


@dataclass
class GreedyIdentityCheck(Check):
    """Temperature 0: the new tokens must be the target's own greedy continuation exactly: the
    target scores the whole continuation teacher-forced and every token must be its argmax given
    the tokens before it (:func:`specverify.hf.divergence.check_identity`, float32: τ = 0)."""

    name: str
    description: str
    cases: tuple[Stratum, ...]
    length: int
    models: DecoderModels
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.expected = [self.models.greedy(case, self.length) for case in self.cases]
        margin = min(m for _, m in self.expected)
        self.parameters = {"cases": [c.label() for c in self.cases], "max_new_tokens": self.length,
                           "smallest top-2 logit gap": float(f"{margin:.3g}")}

    def cost(self, plan: Plan) -> Cost:
        return call_cost(len(self.cases), fixed_s=SECONDS_UNSAMPLED)

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        from specverify.hf.divergence import check_identity

        for number, (case, (expected, _)) in enumerate(zip(self.cases, self.expected)):
            got = session.function(case, self.length, derive_seed(plan.seed, "call", number),
                                   where=f"{self.name}, {case.label()}")
            prompt = torch.tensor(case.prompt, dtype=torch.int64, device=self.models.device)
            target = self.models.pair(case.models)[0]
            (result,) = check_identity(target, [prompt], [got.to(self.models.device)], labels=[case.label()]).results
            if not result.passed:
                first = result.first_divergences[0]
                message = (f"{case.label()}: generated {got.tolist()}, but the target's greedy continuation is "
                           f"{expected}: at new token {first.position} the target, given the generated tokens before "
                           f"it, prefers token {first.target_token} to {first.candidate_token} by {first.gap:.3g} in "
                           f"logit ({len(result.exceedances)} of {result.positions} new tokens are not its argmax)")
                return self.report(plan, Verdict.FAIL, message, statistic=float(first.position))
        return self.report(plan, Verdict.PASS,
                           f"identical to the target's greedy decoding in all {len(self.cases)} cases "
                           f"(every new token the target's argmax given the tokens before it)")


@dataclass
class ModelsUnchangedCheck(Check):
    """After all other checks: the parameters of every target and draft are unchanged."""

    name: str
    description: str
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    parameters: dict[str, Any] = field(default_factory=dict)

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        if session.function.log.calls == 0:
            return self.skipped(plan, "no call of the function completed")
        changed = session.models.changed()
        if changed:
            return self.report(plan, Verdict.FAIL,
                               f"the decoder modified the parameters of the {' and '.join(changed)}",
                               fault=FaultKind.MUTATION)
        if session.function.log.model_changes:  # seen by the worker, which has its own models
            changes = session.function.log.model_changes
            return self.report(plan, Verdict.FAIL,
                               f"the decoder modified the models' parameters in {len(changes)} call(s) ({changes[0]})",
                               fault=FaultKind.MUTATION)
        return self.report(plan, Verdict.PASS,
                           f"the models' parameters are unchanged after {session.function.log.calls} calls")


# --------------------------------------------------------------------------------------------
# The position-law check
# --------------------------------------------------------------------------------------------


@dataclass
class PositionLawCheck(SequentialCheck):
    """Every new token against its exact conditional law, by its randomized PIT value, in blocks
    (stratum, position, bin of the PIT value ``lag`` positions back), one transition test per lag
    of :data:`PIT_LAGS` (see the module docstring).

    Counts are int64 ``[S, Λ, L, B, B + 1]``: stratum, lag, position, the bin of the PIT value
    ``lag`` positions back (0 at the first ``lag`` positions), and the PIT value's bin, the last
    column counting tokens of probability 0.  Each lag's counts are one test of the module
    docstring's H0; the check's p-value is ``min(1, Λ · min_ℓ p_ℓ)`` (Bonferroni over the Λ lags).
    Planning: n calls give ``n L`` tokens, each in one block of each lag, and each lag's
    noncentrality is ``≥ 4 n L ε̄_ℓ²``, so n = ⌈n_tokens / L⌉ with n_tokens the size at which
    Pearson's test at level α / Λ on the ``dof + 1`` cells of lag 1 (the most) detects TV ε̄
    (:func:`specverify.core.stats.sample_size_for_tv`)."""

    name: str
    description: str
    strata: tuple[Stratum, ...]
    length: int
    models: DecoderModels
    bins: int = PIT_BINS
    lags: tuple[int, ...] = PIT_LAGS
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT

    def __post_init__(self) -> None:
        blocks = len(self.strata) * (min(self.lags) + (self.length - min(self.lags)) * self.bins)
        self.num_cells = blocks * (self.bins - 1) + 1  # dof + 1 of the lag with the most blocks
        self.parameters = {"strata": [s.label() for s in self.strata], "max_new_tokens": self.length,
                           "PIT bins": self.bins, "lags": list(self.lags)}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        tokens = stats.sample_size_for_tv(epsilon, alpha=alpha / len(self.lags), power=power,
                                          num_cells=self.num_cells)
        return math.ceil(tokens / self.length)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n * self.length, alpha=alpha / len(self.lags), power=power,
                                   num_cells=self.num_cells)

    def empty_counts(self) -> np.ndarray:
        """Zero counts ``[S, Λ, L, B, B + 1]`` (class docstring)."""
        return np.zeros((len(self.strata), len(self.lags), self.length, self.bins, self.bins + 1), dtype=np.int64)

    def cost(self, plan: Plan) -> Cost:
        return call_cost(plan.n)

    def draw(self, session: DecoderSession, plan: Plan, n: int, look: int) -> Tally:
        """``n`` calls, each on a stratum drawn uniformly; call ``i`` of the check (counted over
        all looks) gets the seed ``derive_seed(plan.seed, "call", i)``; then each stratum's
        continuations are scored in one teacher-forced pass and counted in their blocks."""
        first = plan.looks[look - 1] if plan.looks and look else 0
        choices = np.random.default_rng(derive_seed(plan.seed, "strata", look)).integers(len(self.strata), size=n)
        continuations: list[list[list[int]]] = [[] for _ in self.strata]
        for call, s in enumerate(choices, start=first):
            tokens = session.function(self.strata[s], self.length, derive_seed(plan.seed, "call", call),
                                      where=f"{self.name}, call {call}")
            continuations[s].append(tokens.tolist())
        counts = self.empty_counts()
        uniforms = np.random.default_rng(derive_seed(plan.seed, "pit", look))
        for s, rows in enumerate(continuations):
            if rows:
                stratum_tokens = np.asarray(rows, dtype=np.int64)
                values = token_pit_values(self.models.conditional_laws(self.strata[s], stratum_tokens), stratum_tokens,
                                          uniforms.random(stratum_tokens.shape))
                self.count(counts[s], values)
        return Tally(n, {"blocks": counts})

    def count(self, counts: np.ndarray, values: np.ndarray) -> None:
        """Add the PIT values ``[N, L]`` of one stratum's continuations to its ``counts [Λ, L, B, B + 1]``
        (NaN: a token of probability 0, counted in column B; a block read from it is bin 0)."""
        cell = np.where(np.isnan(values), self.bins, np.minimum(np.nan_to_num(values) * self.bins, self.bins - 1))
        cell = cell.astype(np.int64)
        positions = np.broadcast_to(np.arange(self.length), cell.shape)
        for index, lag in enumerate(self.lags):
            back = np.concatenate([np.zeros_like(cell[:, :lag]), cell[:, :-lag] % self.bins], 1)
            np.add.at(counts[index], (positions, back, cell), 1)

    def lag_fits(self, counts: np.ndarray) -> list[TransitionFit]:
        """One transition test per lag (:func:`transition_goodness_of_fit`) of ``counts [S, Λ, L, B, B + 1]``."""
        law = np.append(np.full(self.bins, 1.0 / self.bins), 0.0)
        fits = []
        for index in range(len(self.lags)):
            blocks = counts[:, index].reshape(-1, self.bins + 1)
            fits.append(transition_goodness_of_fit(blocks, np.tile(law, (len(blocks), 1))))
        return fits

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        """Pearson's X² of each lag's transition counts against the uniform bins (probability 0 for
        the last column); the check fails when ``Λ · min_ℓ p_ℓ ≤ level``."""
        counts = tally.counts["blocks"]
        fits = self.lag_fits(counts)
        worst = int(np.argmin([fit.pvalue for fit in fits]))
        fit, lag = fits[worst], self.lags[worst]
        pvalue = min(1.0, len(self.lags) * fit.pvalue)
        failed = pvalue <= level
        where = level_phrase(plan, level, look)
        by_lag = f"lags {', '.join(map(str, self.lags))}, Bonferroni"
        positions = counts[:, 0]
        if fit.impossible_count:
            message = (f"emitted {fit.impossible_count} token(s) of target probability 0 (cut by top-k/top-p) "
                       f"{self._impossible(positions)}: certain loss")
        elif failed:
            message = (f"the new tokens do not follow the target's conditional laws: p-value {pvalue:.3g} ≤ "
                       f"{where} (at lag {lag}: X² = {fit.statistic:.1f}, dof {fit.dof}; {by_lag}); "
                       f"{self._deviations(positions)}")
        else:
            message = (f"every position consistent with the target's conditional law (p-value {pvalue:.3g} > "
                       f"{where}; smallest at lag {lag}: X² = {fit.statistic:.1f}, dof {fit.dof}; {by_lag}; "
                       f"{tally.n} calls × {self.length} tokens)")
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n,
                           statistic=float(fit.statistic), pvalue=float(pvalue),
                           empirical_tv=self._largest_tv(positions)[0], **look_fields(plan, level, look))

    def _position_tvs(self, counts: np.ndarray) -> np.ndarray:
        """Plug-in TV of the binned PIT law from uniform at each (stratum, position) from one lag's
        ``counts [S, L, B, B + 1]``, the earlier bin summed out (diagnosis only, biased up at small
        counts): float64 ``[S, L]``."""
        marginal = counts.sum(2)[..., : self.bins]
        totals = marginal.sum(-1, keepdims=True)
        return 0.5 * np.abs(marginal / np.maximum(totals, 1) - 1.0 / self.bins).sum(-1) * (totals[..., 0] > 0)

    def _largest_tv(self, counts: np.ndarray) -> tuple[float, int, int]:
        tvs = self._position_tvs(counts)
        s, t = np.unravel_index(int(np.argmax(tvs)), tvs.shape)
        return float(tvs[s, t]), int(s), int(t)

    def _deviations(self, counts: np.ndarray) -> str:
        tv, s, t = self._largest_tv(counts)
        per_stratum = self._position_tvs(counts).mean(1)
        worst = int(np.argmax(per_stratum))
        return (f"largest plug-in TV of the binned PIT law {tv:.3f} at new token {t + 1} ({self.strata[s].label()}); "
                f"largest mean over positions {per_stratum[worst]:.3f} ({self.strata[worst].label()})")

    def _impossible(self, counts: np.ndarray) -> str:
        s, t = (int(i[0]) for i in np.nonzero(counts[..., self.bins].sum(2)))
        return f"(first at new token {t + 1}, {self.strata[s].label()})"


# --------------------------------------------------------------------------------------------
# The decoder battery
# --------------------------------------------------------------------------------------------


POSITION_STRATA: tuple[Stratum, ...] = (
    Stratum(Setting(1.0), PROMPTS[1], "base"),
    Stratum(Setting(0.7), PROMPTS[0], "peaked"),
    Stratum(Setting(1.3), PROMPTS[2], "flat"),
    Stratum(Setting(1.0, top_k=3), PROMPTS[1], "far-draft"),
    Stratum(Setting(1.0, top_p=0.8), PROMPTS[2], "close-draft"),
    Stratum(Setting(0.8, top_k=5, top_p=0.9), PROMPTS[0], "base"),
    Stratum(Setting(1.3, top_p=0.9), PROMPTS[0], "far-draft"),
    Stratum(Setting(0.7, top_k=4), PROMPTS[1], "close-draft"),
)
"""The position-law check's strata: temperatures 0.7, 0.8, 1 and 1.3, top-k alone, top-p alone and
both, on every model pair and prompt length."""

GREEDY_CASES: tuple[Stratum, ...] = tuple(Stratum(Setting(0.0), prompt) for prompt in PROMPTS) + (
    Stratum(Setting(0.0, top_k=3, top_p=0.9), PROMPTS[1]),
) + tuple(Stratum(Setting(0.0), PROMPTS[1], name) for name in MODEL_PAIRS if name != "base")


def resolve_decoder_budget(budget: str | int | SampleBudget) -> SampleBudget:
    """``quick`` / ``standard`` / ``thorough`` with the decoder's TV targets
    (:data:`DECODER_BUDGETS`), or N calls per statistical check."""
    if isinstance(budget, str) and budget.strip().lower() in DECODER_BUDGETS:
        name = budget.strip().lower()
        return SampleBudget(name, epsilon=DECODER_BUDGETS[name])
    return resolve_budget(budget)


class DecoderBattery(Battery):
    """SPEC §2 battery (see the module docstring)."""

    level = "decoder"

    @staticmethod
    def resolve_budget(budget: str | int | SampleBudget) -> SampleBudget:
        return resolve_decoder_budget(budget)

    def open_session(self, fn: Callable[..., Any], *, device: str, timeout_s: float,
                     isolation: str = "none") -> DecoderSession:
        models = DecoderModels(device)
        return DecoderSession(GuardedGenerate(fn, models, timeout_s=timeout_s, isolation=isolation), models, timeout_s)

    def checks(self, session: DecoderSession) -> list[Any]:
        models = session.models
        seed_stratum = Stratum(Setting(1.0), PROMPTS[1])
        return [
            DeterminismCheck(
                "determinism",
                "The same seed must give the same tokens whatever the global RNG states: all randomness "
                "must be derived from `seed`.",
                (Stratum(Setting(1.3), PROMPTS[0]), Stratum(Setting(1.3), PROMPTS[2], "far-draft")),
                CONTINUATION_LENGTH),
            SeedSensitivityCheck(
                "seed-sensitivity",
                "Different seeds at temperature 1 must not all give the same tokens (the number of calls makes "
                "that probability ≤ 1e-9 for a lossless decoder; not charged to α).",
                seed_stratum, SEED_LENGTH, models.sequence_law(seed_stratum, SEED_LENGTH)),
            GreedyIdentityCheck(
                "greedy-identity",
                "Temperature 0: the new tokens must equal the target's own greedy decoding, token for token, "
                "on every model pair (also with top-k/top-p set, which greedy decoding ignores).",
                GREEDY_CASES, CONTINUATION_LENGTH, models),
            PositionLawCheck(
                "position-laws",
                f"Each of {CONTINUATION_LENGTH} new tokens against the target's exact law given the tokens before "
                "it (randomized PIT, in blocks by position and the PIT value 1 to 5 positions back): temperatures "
                "0.7–1.3, "
                "top-k, top-p and both, on five model pairs.",
                POSITION_STRATA, CONTINUATION_LENGTH, models),
            InputsUnchangedCheck("inputs-unchanged", "No call may modify the input_ids tensor it is given."),
            ModelsUnchangedCheck("models-unchanged", "No call may modify the parameters of the targets or the drafts."),
        ]


def audit_decoder(generate_fn: Callable[..., Any] | str, **options: Any) -> Any:
    """``specverify.auditing.runner.audit(generate_fn, level="decoder", **options)``: the decoder-level
    :class:`~specverify.auditing.runner.AuditReport` (options as for ``audit``: budget, alpha, seed, device,
    timeout_s, progress)."""
    from specverify.auditing.runner import audit

    return audit(generate_fn, level="decoder", **options)


__all__ = [
    "DECODER_BUDGETS", "MODEL_PAIRS", "POSITION_STRATA", "DecoderBattery", "DecoderModels", "PositionLawCheck",
    "Setting", "Stratum", "audit_decoder", "resolve_decoder_budget", "validate_new_tokens",
]
