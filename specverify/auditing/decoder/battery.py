"""The decoder level of the audit (SPEC §2): end-to-end generation on tiny real models.

``specverify audit TARGET --level decoder`` drives a SPEC §2 function

    generate(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed) -> new_tokens

with a tiny random-initialised Hugging Face target and a different draft over one 8-token
vocabulary (:func:`specverify.hf.tiny_models.tiny_target_and_draft`, fp32, deterministic), so that
the decoder's KV caches, rollbacks, position ids and sampling all run for real while the law it
must sample from is known exactly: with ``V = 8`` and ``L = 3`` new tokens every continuation is
enumerated,

    P(x_1 x_2 x_3 | prompt) = Π_i p(x_i | prompt, x_<i),

each ``p`` the target's next-token law after the same temperature / top-k / top-p processing
(:func:`specverify.core.processing.process_logits`).  SPEC §2: a lossless decoder's ``new_tokens``
follow ``P`` (Leviathan et al. 2023, Theorem 1, applied step after step); under greedy they equal
the target's own greedy decoding.

Checks (in order):

- ``determinism`` (contract): the same seed gives the same tokens whatever the global RNG states
  (torch, numpy, ``random``) are: all randomness must be derived from ``seed``;
- ``seed-sensitivity``: k calls with different seeds at temperature 1 are not all identical; k is
  the smallest number for which a lossless decoder returns k identical continuations with
  probability Σ_x P(x)^k ≤ 1e-9 (computed exactly; not charged to α);
- ``greedy-identity`` (exact): at temperature 0, 8 new tokens after each prompt equal the target's
  greedy continuation token for token (also with top-k/top-p set, which greedy ignores): one
  teacher-forced target pass over the whole continuation, every token its argmax given the tokens
  before it (:mod:`specverify.core.greedy_identity` with τ = 0, the rule of every level);
- ``sampling-temperatures`` and ``sampling-top-k-top-p`` (goodness of fit): the joint law of the
  L = 3 new tokens, over strata (setting, prompt) drawn uniformly at random per call, so the
  stratum and the continuation together are one multinomial.  Cells are fixed before sampling
  from the exact law: every continuation whose expected count n·P/S reaches 5 is its own cell, the
  rarer ones of a stratum share one "other" cell (merged into the stratum's rarest own cell when
  still below 5), and the continuations of probability 0 (cut by top-k/top-p) form one cell of
  expected count 0: a single sample there is a certain loss.  No cell is then pooled by the
  test, so the power statement below holds for the total variation on exactly these cells;
- ``inputs-unchanged`` and ``models-unchanged`` (contract): ``input_ids`` and the two models'
  parameters are the same after every call.

Sample sizes.  Each call yields one sequence and costs several model forward passes (50–100 ms
for the reference decoder on a shared CPU), so the decoder level cannot afford the sampler
level's TV targets.  Its named budgets (:data:`DECODER_BUDGETS`) are sized, like the sampler's,
with :func:`specverify.core.stats.sample_size_for_tv` at each check's Bonferroni share of the
family-wise α (α/2) and power 0.99, ``n`` and the cells being solved together (more samples, more
cells).  At α = 1e-3, calls per statistical check (temperatures / filters):

=========  ===========  ===============  ==========================================
budget     detects TV   calls per check  audit (all checks), reference decoder
=========  ===========  ===============  ==========================================
quick      0.25         209 / 224        463 calls, ~47 s
standard   0.10         2 397 / 1 965    4 392 calls, ~5–7 min
thorough   0.05         14 845 / 8 567   23 450 calls, ~30–40 min
=========  ===========  ===============  ==========================================

A fixed budget of N calls per check reports the TV it can then detect.  Seeds: call i of a
check uses ``derive_seed(plan seed, "call", i)``, the plan seed being derived from the check's name
and parameters and the audit's base seed.

Faults inside a call (an exception, a hang past the per-call deadline, output that is not an int64
tensor ``[max_new_tokens]`` of ids in ``[0, V)``) stop that check with verdict ``error`` ("could not
audit"); they never end the audit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

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
    goodness_of_fit_result,
    resolve_budget,
)
from specverify.auditing.isolation.faults import FaultKind, preserved_global_rng, seed_global_rng, validate_new_tokens
from specverify.auditing.isolation.guarded import GuardedGenerate
from specverify.core import stats
from specverify.core.seeding import derive_seed

DECODER_BUDGETS: dict[str, float] = {"quick": 0.25, "standard": 0.1, "thorough": 0.05}
"""Named decoder budgets: the TV (on each check's cells) every statistical check detects with power ≥ POWER."""

VOCAB_SIZE = 8
MODEL_SEED = 0
CONTINUATION_LENGTH = 3
GREEDY_LENGTH = 8
DETERMINISM_LENGTH = 8
PROMPTS: tuple[tuple[int, ...], ...] = ((3,), (1, 5, 2, 6), (7, 0, 4, 4, 2, 1))
"""Prompts of 1, 4 and 6 tokens (prefill of one token, and of several)."""

MIN_EXPECTED = 5.0
"""Smallest expected count of a cell of the goodness-of-fit checks (Cochran's rule)."""

SEED_FALSE_ALARM = 1e-9
"""Largest probability that ``seed-sensitivity`` fails a lossless decoder."""

MAX_SEED_CALLS = 64


# --------------------------------------------------------------------------------------------
# Settings, models and exact laws
# --------------------------------------------------------------------------------------------


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


Stratum = tuple[Setting, tuple[int, ...]]


def stratum_label(stratum: Stratum) -> str:
    setting, prompt = stratum
    return f"{setting.label()}, prompt {list(prompt)}"


class DecoderModels:
    """The audit's tiny target and draft (:func:`specverify.hf.tiny_models.tiny_target_and_draft`,
    V = 8, fp32) on ``device``, with their exact continuation laws and greedy continuations."""

    def __init__(self, device: str = "cpu") -> None:
        from specverify.hf.tiny_models import tiny_target_and_draft

        target, draft = tiny_target_and_draft(vocab_size=VOCAB_SIZE, seed=MODEL_SEED)
        self.device = torch.device(device)
        self.target = target.to(self.device)
        self.draft = draft.to(self.device)
        self.vocab_size = VOCAB_SIZE
        self._snapshot = {name: self._parameters(model) for name, model in self._models()}
        self._laws: dict[tuple[Stratum, int], np.ndarray] = {}

    def _models(self) -> tuple[tuple[str, torch.nn.Module], ...]:
        return (("target", self.target), ("draft", self.draft))

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

            setting, prompt = stratum
            laws = continuation_laws(self.target, prompt, length, temperature=setting.temperature,
                                     top_k=setting.top_k, top_p=setting.top_p)
            joint = laws[0]
            for law in laws[1:]:
                joint = joint[..., None] * law
            self._laws[key] = joint.reshape(-1) / joint.sum()
        return self._laws[key]

    @torch.no_grad()
    def greedy(self, prompt: tuple[int, ...], length: int) -> tuple[list[int], float]:
        """The target's own greedy continuation (argmax of full forward passes, no cache) and the
        smallest gap between the two largest logits along it (how far it is from a tie)."""
        tokens = list(prompt)
        margin = float("inf")
        for _ in range(length):
            logits = self.target(torch.tensor([tokens], device=self.device)).logits[0, -1].double()
            top = logits.topk(2).values
            margin = min(margin, float(top[0] - top[1]))
            tokens.append(int(logits.argmax()))
        return tokens[len(prompt):], margin

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
class DecoderSession:
    """A guarded SPEC §2 function and the models every decoder check uses."""

    function: GuardedGenerate
    models: DecoderModels
    timeout_s: float


def sequence_index(tokens: torch.Tensor, vocab_size: int) -> int:
    """``Σ_i x_i V^(L−1−i)``: the index of a continuation in :meth:`DecoderModels.sequence_law`."""
    index = 0
    for token in tokens.tolist():
        index = index * vocab_size + int(token)
    return index


def _tokens_label(index: int, vocab_size: int, length: int) -> str:
    digits = [(index // vocab_size ** (length - 1 - i)) % vocab_size for i in range(length)]
    return "(" + ", ".join(map(str, digits)) + ")"


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
        self.parameters = {"strata": [stratum_label(s) for s in self.strata], "max_new_tokens": self.length}

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        for number, stratum in enumerate(self.strata):
            seed = derive_seed(plan.seed, "seed", number)
            with preserved_global_rng():
                first, repeat, other = (self._call(session, stratum, seed, derive_seed(plan.seed, "global", number, g))
                                        for g in (1, 1, 2))
            if not torch.equal(first, repeat):
                return self._failed(plan, "two calls with the same seed and the same global "
                                    "RNG states returned different "
                                    f"tokens ({stratum_label(stratum)}): the decoder draws randomness from outside "
                                    "both (OS entropy, time, threads); derive everything from `seed`")
            if not torch.equal(first, other):
                return self._failed(plan, f"the tokens changed when only the global RNG seeds changed (same `seed`, "
                                    f"{stratum_label(stratum)}): the decoder samples from the global torch/numpy/"
                                    "random RNG instead of deriving its randomness from `seed`")
        return self.report(plan, Verdict.PASS,
                           f"same seed, same tokens, whatever the global RNG states ({len(self.strata)} prompts)")

    def _call(self, session: DecoderSession, stratum: Stratum, seed: int, global_seed: int) -> torch.Tensor:
        seed_global_rng(global_seed)
        return session.function(stratum, self.length, seed, where=f"{self.name}, {stratum_label(stratum)}")

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
        self.parameters = {"stratum": stratum_label(self.stratum), "max_new_tokens": self.length,
                           "calls": self.calls, "P(all equal | lossless)": float(f"{self.false_alarm:.3g}")}

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        outputs = {tuple(session.function(self.stratum, self.length, derive_seed(plan.seed, "call", i),
                                          where=f"{self.name}, call {i}").tolist())
                   for i in range(self.calls)}
        if len(outputs) == 1:
            message = (f"{self.calls} different seeds all gave {next(iter(outputs))} "
                       f"({stratum_label(self.stratum)}); a "
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
        self.expected = [self.models.greedy(prompt, self.length) for _, prompt in self.cases]
        margin = min(m for _, m in self.expected)
        self.parameters = {"cases": [stratum_label(c) for c in self.cases], "max_new_tokens": self.length,
                           "smallest top-2 logit gap": float(f"{margin:.3g}")}

    def run(self, session: DecoderSession, plan: Plan) -> CheckResult:
        from specverify.hf.divergence import check_identity

        for number, (case, (expected, _)) in enumerate(zip(self.cases, self.expected)):
            got = session.function(case, self.length, derive_seed(plan.seed, "call", number),
                                   where=f"{self.name}, {stratum_label(case)}")
            prompt = torch.tensor(case[1], dtype=torch.int64, device=self.models.device)
            (result,) = check_identity(self.models.target, [prompt], [got], labels=[stratum_label(case)]).results
            if not result.passed:
                first = result.first_divergences[0]
                message = (f"{stratum_label(case)}: generated {got.tolist()}, but the target's greedy continuation is "
                           f"{expected}: at new token {first.position} the target, given the generated tokens before "
                           f"it, prefers token {first.target_token} to {first.candidate_token} by {first.gap:.3g} in "
                           f"logit ({len(result.exceedances)} of {result.positions} new tokens are not its argmax)")
                return self.report(plan, Verdict.FAIL, message, statistic=float(first.position))
        return self.report(plan, Verdict.PASS,
                           f"identical to the target's greedy decoding in all {len(self.cases)} cases "
                           f"(every new token the target's argmax given the tokens before it)")


@dataclass
class ModelsUnchangedCheck(Check):
    """After all other checks: the target's and the draft's parameters are unchanged."""

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
                               f"the decoder modified the parameters of the {' and '.join(changed)} model",
                               fault=FaultKind.MUTATION)
        if session.function.log.model_changes:  # seen by the worker, which has its own models
            changes = session.function.log.model_changes
            return self.report(plan, Verdict.FAIL,
                               f"the decoder modified the models' parameters in {len(changes)} call(s) ({changes[0]})",
                               fault=FaultKind.MUTATION)
        return self.report(plan, Verdict.PASS,
                           f"the models' parameters are unchanged after {session.function.log.calls} calls")


# --------------------------------------------------------------------------------------------
# The sequence-law check
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellMap:
    """Cells of a :class:`SequenceLawCheck` for a given n (see the module docstring).

    index: int64 ``[S, V**L]``, the cell of every (stratum, continuation); expected: float64
    ``[cells]``, each cell's probability (stratum drawn with probability 1/S); labels: one per
    cell; num_positive: the cells of positive probability (the test's cells)."""

    index: np.ndarray
    expected: np.ndarray
    labels: tuple[str, ...]
    num_positive: int


@dataclass
class SequenceLawCheck(SequentialCheck):
    """The joint law of the L new tokens over strata (setting, prompt), against the exact law."""

    name: str
    description: str
    strata: tuple[Stratum, ...]
    length: int
    laws: np.ndarray  # [S, V**L]
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT

    def __post_init__(self) -> None:
        self.vocab_size = round(self.laws.shape[1] ** (1 / self.length))
        self.num_cells = int((self.laws > 0).sum())
        self.parameters = {"strata": [stratum_label(s) for s in self.strata], "max_new_tokens": self.length,
                           "V": self.vocab_size}

    def cell_map(self, n: int) -> CellMap:
        """Cells fixed from the exact law before sampling: own cells for continuations of expected
        count n·P/S ≥ MIN_EXPECTED, one "other" cell per stratum, one zero-probability cell."""
        strata, sequences = self.laws.shape
        threshold = MIN_EXPECTED * strata / n
        index = np.zeros((strata, sequences), dtype=np.int64)
        expected: list[float] = []
        labels: list[str] = []
        zero_cells: list[tuple[int, np.ndarray]] = []
        for s, law in enumerate(self.laws):
            name = stratum_label(self.strata[s])
            order = np.argsort(-law, kind="stable")
            own = [int(t) for t in order if law[t] >= threshold]
            rest = np.flatnonzero((law > 0) & (law < threshold))
            for token in own:
                index[s, token] = len(expected)
                expected.append(law[token] / strata)
                labels.append(f"{name}: tokens {_tokens_label(token, self.vocab_size, self.length)}")
            rest_mass = float(law[rest].sum())
            if rest.size and (not own or n * rest_mass / strata >= MIN_EXPECTED):
                index[s, rest] = len(expected)
                expected.append(rest_mass / strata)
                labels.append(f"{name}: {rest.size} rarer continuations")
            elif rest.size:
                index[s, rest] = index[s, own[-1]]
                expected[-1] += rest_mass / strata
                labels[-1] += f" + {rest.size} rarer continuations"
            zeros = np.flatnonzero(law == 0)
            if zeros.size:
                zero_cells.append((s, zeros))
        num_positive = len(expected)
        for s, zeros in zero_cells:
            index[s, zeros] = len(expected)
            expected.append(0.0)
            labels.append(f"{stratum_label(self.strata[s])}: {zeros.size} continuations of probability 0")
        return CellMap(index, np.asarray(expected), tuple(labels), num_positive)

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        """Smallest n that detects TV ε on the cells of ``cell_map(n)`` with ``power``: iterate
        n ← sample_size_for_tv(ε, cells), cells ← cell_map(n) from all cells down (n and the
        number of cells only decrease, so it stops at a consistent pair)."""
        cells = max(2, self.num_cells)
        while True:
            n = stats.sample_size_for_tv(epsilon, alpha=alpha, power=power, num_cells=cells)
            fewer = max(2, self.cell_map(n).num_positive)
            if fewer >= cells:
                return n
            cells = fewer

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return stats.detectable_tv(n, alpha=alpha, power=power, num_cells=max(2, self.cell_map(n).num_positive))

    def draw(self, session: DecoderSession, plan: Plan, n: int, look: int) -> Tally:
        """``n`` calls, each on a stratum drawn uniformly; call ``i`` of the check (counted over
        all looks) gets the seed ``derive_seed(plan.seed, "call", i)``."""
        first = plan.looks[look - 1] if plan.looks and look else 0
        rng = np.random.default_rng(derive_seed(plan.seed, "strata", look))
        per_stratum = np.zeros(self.laws.shape, dtype=np.int64)
        for call, s in enumerate(rng.integers(len(self.strata), size=n), start=first):
            tokens = session.function(self.strata[s], self.length, derive_seed(plan.seed, "call", call),
                                      where=f"{self.name}, call {call}")
            per_stratum[s, sequence_index(tokens, self.vocab_size)] += 1
        return Tally(n, {"per stratum": per_stratum})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        """The goodness of fit on the cells of ``cell_map(n)`` for the n drawn so far."""
        per_stratum = tally.counts["per stratum"]
        cells = self.cell_map(tally.n)
        counts = np.bincount(cells.index.ravel(), weights=per_stratum.ravel(),
                             minlength=len(cells.expected)).astype(np.int64)
        result = goodness_of_fit_result(self, plan, counts, cells.expected, cells.labels, None, level=level, look=look)
        return dataclasses.replace(result, message=result.message + "; " + self._per_stratum(per_stratum))

    def _per_stratum(self, per_stratum: np.ndarray) -> str:
        """Plug-in TV of each stratum's continuations (diagnosis only: not what is tested)."""
        parts = []
        for s, counts in enumerate(per_stratum):
            n = int(counts.sum())
            tv = 0.5 * float(np.abs(counts / max(n, 1) - self.laws[s]).sum()) if n else float("nan")
            parts.append(f"{stratum_label(self.strata[s])}: n={n}, TV {tv:.3f}")
        return "per stratum (plug-in, biased up at small n): " + "; ".join(parts)


# --------------------------------------------------------------------------------------------
# The decoder battery
# --------------------------------------------------------------------------------------------


TEMPERATURE_STRATA: tuple[Stratum, ...] = (
    (Setting(1.0), PROMPTS[0]),
    (Setting(0.7), PROMPTS[1]),
    (Setting(1.3), PROMPTS[2]),
)
FILTER_STRATA: tuple[Stratum, ...] = (
    (Setting(1.0, top_k=3), PROMPTS[1]),
    (Setting(1.0, top_p=0.8), PROMPTS[2]),
    (Setting(0.8, top_k=5, top_p=0.9), PROMPTS[0]),
)
GREEDY_CASES: tuple[Stratum, ...] = tuple((Setting(0.0), prompt) for prompt in PROMPTS) + (
    (Setting(0.0, top_k=3, top_p=0.9), PROMPTS[1]),
)


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
        models, length = session.models, CONTINUATION_LENGTH
        seed_stratum = (Setting(1.0), PROMPTS[1])
        return [
            DeterminismCheck(
                "determinism",
                "The same seed must give the same tokens whatever the global RNG states: all randomness "
                "must be derived from `seed`.",
                ((Setting(1.3), PROMPTS[0]), (Setting(1.3), PROMPTS[2])), DETERMINISM_LENGTH),
            SeedSensitivityCheck(
                "seed-sensitivity",
                "Different seeds at temperature 1 must not all give the same tokens (the number of calls makes "
                "that probability ≤ 1e-9 for a lossless decoder; not charged to α).",
                seed_stratum, length, models.sequence_law(seed_stratum, length)),
            GreedyIdentityCheck(
                "greedy-identity",
                "Temperature 0: the new tokens must equal the target's own greedy decoding, token for token "
                "(also with top-k/top-p set, which greedy decoding ignores).",
                GREEDY_CASES, GREEDY_LENGTH, models),
            SequenceLawCheck(
                "sampling-temperatures",
                "Temperatures 1.0, 0.7 and 1.3 (one prompt each, chosen at random per call): the joint law of "
                "the 3 new tokens must be the target's, computed exactly by enumeration.",
                TEMPERATURE_STRATA, length, np.stack([models.sequence_law(s, length) for s in TEMPERATURE_STRATA])),
            SequenceLawCheck(
                "sampling-top-k-top-p",
                "Top-k 3, top-p 0.8, and T=0.8 with top-k 5 and top-p 0.9: the joint law of the 3 new tokens "
                "must be the target's after the same filtering (a continuation the filters forbid is a "
                "certain loss).",
                FILTER_STRATA, length, np.stack([models.sequence_law(s, length) for s in FILTER_STRATA])),
            InputsUnchangedCheck("inputs-unchanged", "No call may modify the input_ids tensor it is given."),
            ModelsUnchangedCheck("models-unchanged", "No call may modify the parameters of the target or the draft."),
        ]


def audit_decoder(generate_fn: Callable[..., Any] | str, **options: Any) -> Any:
    """``specverify.auditing.runner.audit(generate_fn, level="decoder", **options)``: the decoder-level
    :class:`~specverify.auditing.runner.AuditReport` (options as for ``audit``: budget, alpha, seed, device,
    timeout_s, progress)."""
    from specverify.auditing.runner import audit

    return audit(generate_fn, level="decoder", **options)


__all__ = [
    "DECODER_BUDGETS", "DecoderBattery", "DecoderModels", "Setting", "audit_decoder", "resolve_decoder_budget",
    "validate_new_tokens",
]
