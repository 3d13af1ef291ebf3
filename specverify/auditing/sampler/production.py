"""Sampler checks at the shapes engines serve (SPEC §1): real vocabularies, K up to 32, batches of
1,024 rows, bfloat16 / float16 inputs, strided views.

The battery's other checks run at toy shapes (V ≤ 8, K ≤ 8, contiguous float32), where a
vocabulary tile, a partial last tile, a half-precision CDF, a K-specialised kernel, a row block or
a stride bug cannot show.  Every check here states its shape (V, K, B, dtype, layout) in its
parameters, and draws its laws from :mod:`specverify.auditing.sampler.production_laws` (exact in every
input dtype, a third of the mass on the vocabulary's boundary ids).

- :class:`ExactFinalDrawCheck` (functions taking ``uniforms=``): the exact law of the correction
  and bonus draws at V up to 151,936 and K = 32, integrated over the final uniform by the
  intervals of the inverse CDF (:mod:`specverify.core.exact_final`).  Deterministic.
- :class:`ProductionStepCheck`: one step per row at a production shape; the completed token of
  every position ``0..K`` (emitted, or continued by target sampling) is tested against the target
  with the token-level identity test of :mod:`specverify.core.identity` and, on the coarse views
  of :mod:`specverify.core.coarse` (id tiles, probability levels), with a goodness-of-fit test,
  per (chain, position), weighted Bonferroni within the check.  Large-V rows are expensive (a row at V = 128,256, K = 1
  is 1.5 MB of float32), so these checks are sized for their own TV per named budget
  (:attr:`ProductionStepCheck.target_tvs`), stated in the report and in ``specverify audit --list``.

Rows of one chain share their laws, so a large-V call is built from one copy of the laws (an
expanded view the guarded call copies into the function's buffer) instead of a gather per row;
the checks that must see rows that differ (row blocks, strides across rows) use several chains
at moderate V.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from specverify.auditing.ahead import AheadItem
from specverify.auditing.audited import AuditedFunction
from specverify.auditing.checks import (
    Check,
    CheckKind,
    CheckResult,
    ExactCase,
    Plan,
    SampleBudget,
    SequentialCheck,
    Tally,
    Verdict,
    declared_arithmetic_of,
    exact_cases_result,
    level_phrase,
    look_fields,
)
from specverify.auditing.cost import Cost, production_step_cost
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.sampler import production_laws as laws
from specverify.core import coarse, identity, outputs, rounding, stats
from specverify.core.chains import PositionalBank
from specverify.core.exact_final import FinalDrawCase, integrate_final_draw, weighted_branches
from specverify.core.seeding import derive_seed
from specverify.core.stats import monte_carlo_draws
from specverify.testing.harness import MAX_INPUT_ELEMENTS, Proposal, complete, gathered_rows, positional_drafts

INPUT_DTYPES = ("float32", "bfloat16", "float16")
"""The input dtypes engines pass (a function may declare the ones it accepts: ``fn.input_dtypes``)."""


def input_dtype(function: AuditedFunction, wanted: str) -> str:
    """``wanted`` if the function accepts it (its declared ``input_dtypes``, default all three),
    else the first dtype it declares."""
    declared = function.declared("input_dtypes")
    if declared is None:
        return wanted
    accepted = [str(d).removeprefix("torch.") for d in declared]
    unknown = [d for d in accepted if d not in INPUT_DTYPES]
    if unknown or not accepted:
        raise Fault("malformed", f"input_dtypes: expected a non-empty tuple of {', '.join(INPUT_DTYPES)}, "
                                 f"got {declared!r}")
    return wanted if wanted in accepted else accepted[0]


def rows_per_call(num_draft: int, vocab_size: int, rows: int | None = None) -> int:
    """``rows`` (the check's batch), capped so one call's inputs stay within MAX_INPUT_ELEMENTS."""
    cap = max(1, MAX_INPUT_ELEMENTS // ((2 * num_draft + 1) * vocab_size))
    return cap if rows is None else min(rows, cap)


# --------------------------------------------------------------------------------------------
# Exact final draws at production vocabularies
# --------------------------------------------------------------------------------------------

SUPPORT_RANDOM = 64
"""Tokens of an exact case's final law drawn at random ids (with the boundary ids: ~100 in all at
V ≥ 50k, so one case costs about 200 rows per branch)."""


def sparse_law(rng: np.random.Generator, vocab_size: int, random_tokens: int = SUPPORT_RANDOM) -> np.ndarray:
    """An exact law on the boundary ids and ``random_tokens`` random ids (Zipf weights in a random
    order), zero elsewhere: few inverse-CDF intervals, at the ids where tiling bugs show."""
    support = np.union1d(laws.boundary_ids(vocab_size), rng.choice(vocab_size, size=random_tokens, replace=False))
    weights = np.zeros(vocab_size)
    weights[support] = (rng.permutation(len(support)) + 1.0) ** -0.8
    return laws.dyadic_law(weights)


def bonus_case(label: str, vocab_size: int, num_draft: int) -> FinalDrawCase:
    """Every draft accepted (``q_i = p_i``: ratio 1, accepted at any ``u_i``); the bonus must follow ``p_K``."""
    rng = np.random.default_rng(derive_seed("exact-final", "bonus", vocab_size, num_draft))
    target = np.stack([sparse_law(rng, vocab_size) for _ in range(num_draft + 1)])
    draft = target[:num_draft].copy()
    path = np.array([rng.choice(np.flatnonzero(row)) for row in draft])
    branches = weighted_branches([path], [np.full(num_draft, 0.5)], [1.0])
    return FinalDrawCase(label, target, draft, branches, num_draft, target[num_draft].copy())


def correction_case(label: str, vocab_size: int, num_draft: int, rejected_at: int) -> FinalDrawCase:
    """Drafts ``0..n−1`` accepted (``q_i = p_i``), draft ``n`` rejected.  At ``n`` the laws partly
    overlap: ``p_n`` = ½ shared + ½ residual, ``q_n`` = the same ½ shared + ½ on two tokens ``p_n``
    forbids (zeros on both sides: ``q_n`` is also 0 on the residual's tokens).  The rejected draft
    is either of the two (weights ``q_n``), and the correction must follow ``(p_n − q_n)_+``
    normalised, i.e. the residual law."""
    n = rejected_at
    rng = np.random.default_rng(derive_seed("exact-final", "correction", vocab_size, num_draft, n))
    target = np.stack([sparse_law(rng, vocab_size) for _ in range(num_draft + 1)])
    draft = target[:num_draft].copy()
    ids = rng.permutation(vocab_size)
    shared, rejectable = ids[:32], ids[32:34]
    residual = sparse_law(rng, vocab_size)
    residual[np.concatenate([shared, rejectable])] = 0.0
    parts = []
    for weights in (residual, np.isin(np.arange(vocab_size), shared) * (rng.permutation(vocab_size) + 1.0),
                    np.isin(np.arange(vocab_size), rejectable) * np.arange(vocab_size, 0, -1.0)):
        parts.append(laws.dyadic_law(weights))
    residual, shared_law, excess = parts
    # Halves of exact laws whose masses are even multiples of 2^-24: the residual's total is exactly
    # 1/2, so its CDF is exact in float64 and a correct rule has no rounding to excuse.
    target[n] = 0.5 * shared_law + 0.5 * residual
    draft[n] = 0.5 * shared_law + 0.5 * excess
    assert laws.exact_in_dtypes(target[n]) and laws.exact_in_dtypes(draft[n])
    paths, path_weights = [], []
    for token in rejectable:
        path = np.array([rng.choice(np.flatnonzero(row)) for row in draft])
        path[n] = token
        paths.append(path)
        path_weights.append(draft[n, token])
    branches = weighted_branches(paths, [np.full(num_draft, 0.5)] * len(paths), path_weights)
    law = np.maximum(target[n] - draft[n], 0.0)
    return FinalDrawCase(label, target, draft, branches, n, law / law.sum())


@dataclass(frozen=True)
class ExactShape:
    """One case of :class:`ExactFinalDrawCheck` and how its inputs are presented."""

    case: FinalDrawCase
    dtype: str
    strided: bool

    def describe(self) -> str:
        layout = "strided views" if self.strided else "contiguous"
        return f"{self.case.label} (V={self.case.vocab_size:,}, K={self.case.num_draft}, {self.dtype}, {layout})"


@functools.cache
def exact_shapes() -> tuple[ExactShape, ...]:
    """The cases of ``exact-large-vocabulary``, in run order (cheap and broad first)."""
    v = laws.VOCABULARIES
    return (
        ExactShape(bonus_case("bonus", v["llama3"], 1), "float32", True),
        ExactShape(correction_case("correction at position 0", v["gpt2"], 1, 0), "bfloat16", False),
        ExactShape(bonus_case("bonus", 4_099, 32), "float16", True),
        ExactShape(correction_case("correction at position 25", 4_099, 32, 25), "float16", True),
    )


def final_draw_evaluator(raw: Callable[..., Any], shape: ExactShape, dtype: str,
                         where: str, *, copied: bool = False) -> Callable[..., torch.Tensor]:
    """The :data:`specverify.core.exact_final.Evaluator` of one case: the function called with
    ``uniforms=`` (generator withheld) on the case's laws in ``dtype`` and ``shape``'s layout, in
    chunks within MAX_INPUT_ELEMENTS; outputs validated for their layout only (a wrong accepted
    prefix is mass on a wrong tuple, which the integrator counts).  ``copied``: ``raw`` gets a
    copy of its arguments (a worker's), so the laws are presented once, for a full chunk, and a
    call of fewer rows gets their leading rows; else each call gets fresh ones (a function may
    write its inputs)."""
    from specverify.auditing.isolation.presentation import decoy_value, presented

    case = shape.case
    torch_dtype = getattr(torch, dtype)
    target = torch.from_numpy(case.target).to(torch_dtype).unsqueeze(0)
    draft = torch.from_numpy(case.draft).to(torch_dtype).unsqueeze(0)
    vocab, num_draft = case.vocab_size, case.num_draft
    per_call = rows_per_call(num_draft, vocab)
    cpu = torch.device("cpu")
    kept: list[torch.Tensor] = []

    def laws_of(rows: int) -> list[torch.Tensor]:
        if kept:
            return [tensor[:rows] for tensor in kept]
        made = [presented(tensor.expand(per_call if copied else rows, -1, -1), device=cpu, strided=shape.strided,
                          decoy=decoy_value(name, vocab))
                for name, tensor in (("target_probs", target), ("draft_probs", draft))]
        if copied:
            kept.extend(made)
        return [tensor[:rows] for tensor in made]

    def evaluate(draft_tokens: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        emitted = []
        for start in range(0, len(draft_tokens), per_call):
            tokens = draft_tokens[start:start + per_call]
            rows = len(tokens)
            inputs = [*laws_of(rows), presented(tokens, device=cpu, strided=shape.strided,
                                                decoy=decoy_value("draft_tokens", vocab))]
            try:
                result = raw(*inputs, None, uniforms=uniforms[start:start + per_call])
            except Exception as error:
                raise Fault("exception", f"the function (in {where}, with uniforms=) raised "
                                         f"{type(error).__name__}: {error}") from error
            try:
                emitted.append(outputs.validate_emitted(result, None, vocab, num_positions=num_draft + 1)[0])
            except outputs.MalformedOutput as error:
                raise Fault("malformed", f"the function (in {where}, with uniforms=) returned {error}") from None
        return torch.cat(emitted)

    return evaluate


@dataclass
class ExactFinalDrawCheck(Check):
    """Exact TV of the correction and bonus draws at production vocabularies (module docstring).

    Each case's integral returns ``tv_low`` when even that exceeds the case's rounding tolerance
    (:func:`specverify.core.rounding.rounding_tolerance` of the function's declared arithmetic at
    the case's K and V), else ``tv_high``: the check fails only on a proven excess.  A case whose
    bisection budget runs out undecided raises, and the check is skipped (it cannot say)."""

    name: str
    description: str
    shapes: tuple[ExactShape, ...]
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    production_shape: ClassVar[bool] = True
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = 0

    def __post_init__(self) -> None:
        self.parameters = {"cases": [shape.describe() for shape in self.shapes]}

    def run(self, session: Any, plan: Plan) -> CheckResult:
        arithmetic, declared = declared_arithmetic_of(session.function)
        cases = []
        for shape in self.shapes:
            dtype = input_dtype(session.function, shape.dtype)
            tolerance = rounding.rounding_tolerance(arithmetic, shape.case.num_draft, shape.case.vocab_size)
            evaluator = functools.partial(final_draw_evaluator, session.raw, shape, dtype, self.name,
                                          copied=session.function.runs_in_worker())
            label = shape.describe() if dtype == shape.dtype else f"{shape.describe()} in {dtype}"
            cases.append(ExactCase(label, functools.partial(_decided_tv, shape.case, evaluator, tolerance),
                                   shape.case.num_draft, shape.case.vocab_size))
        return exact_cases_result(self, plan, cases, 10 * session.timeout_s, arithmetic, declared)


def _decided_tv(case: FinalDrawCase, evaluator: Callable[[], Callable[..., torch.Tensor]], tolerance: float) -> float:
    """The case's exact TV as decided against ``tolerance``; its evaluator (and the laws it
    presents, tens of MB at V = 128,256) made here and released on return, so that the next
    case's laws take the memory this one's freed."""
    law = integrate_final_draw(case, evaluator(), tolerance=tolerance)
    if law.tv_low > tolerance:
        return law.tv_low
    if law.tv_high <= tolerance:
        return law.tv_high
    raise ValueError(f"the bisection budget ran out with the exact TV of {case.label} between {law.tv_low:.3g} "
                     f"and {law.tv_high:.3g} (tolerance {tolerance:.3g})")


# --------------------------------------------------------------------------------------------
# Production-shape steps: every position's token, token-level identity tests
# --------------------------------------------------------------------------------------------


@functools.cache
def production_bank(name: str, family: str, vocab_size: int, num_draft: int, num_chains: int) -> PositionalBank:
    """``num_chains`` production chains of ``family``
    (:func:`specverify.auditing.sampler.production_laws.step_family`)."""
    return PositionalBank(*laws.step_family(name, family, vocab_size, num_draft, num_chains))


def chain_laws(bank: PositionalBank, chain: torch.Tensor, num_draft: int,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The target laws ``[B, K+1, V]`` and draft laws ``[B, K, V]`` in ``dtype`` of rows on the
    chains ``chain [B]``: with one chain, one copy expanded over the rows; with several, a gather
    per row."""
    target_table, draft_table = bank.rows_in(dtype)
    rows = len(chain)
    if bank.num_chains == 1:
        return (target_table[: num_draft + 1].unsqueeze(0).expand(rows, -1, -1),
                draft_table[:num_draft].unsqueeze(0).expand(rows, -1, -1))
    first = chain[:, None] * bank.num_states + torch.arange(num_draft + 1)
    return gathered_rows(target_table, first), gathered_rows(draft_table, first[:, :num_draft])


def production_proposal(bank: PositionalBank, chain: torch.Tensor, laws: tuple[torch.Tensor, torch.Tensor],
                        num_draft: int, generator: torch.Generator) -> Proposal:
    """Drafts ``x_i ~ q_i`` per row (one inverse-CDF uniform each,
    :func:`specverify.testing.harness.positional_drafts`) on the rows' chains ``chain``, whose
    laws are ``laws`` (:func:`chain_laws`)."""
    return Proposal(*laws, positional_drafts(bank, bank.initial_state(chain), num_draft, generator)[1])


def balanced_chains(rows: int, num_chains: int, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[rows]``: each chain on ``rows / num_chains`` rows (±1), in a random order, so that
    rows that share a law are not at a fixed stride (a row-block bug reading row ``b − 256`` then
    reads another law)."""
    return (torch.arange(rows) % num_chains)[torch.randperm(rows, generator=generator)]


@functools.lru_cache(maxsize=2)
def placed_rows(bank: PositionalBank, rows: int, num_draft: int, dtype: torch.dtype,
                seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The chains of a call of ``rows`` rows (:func:`balanced_chains`, drawn from ``seed`` and
    ``rows`` alone) and their laws (:func:`chain_laws`): one tensor for every call of that size in
    a check's run, whichever looks run, so that the laws reach the function's buffer once
    (:class:`~specverify.auditing.isolation.presentation.Presenter`).  The last two are kept."""
    chain = balanced_chains(rows, bank.num_chains, torch.Generator().manual_seed(derive_seed(seed, "chains", rows)))
    return chain, chain_laws(bank, chain, num_draft, dtype)


IDENTITY_SHARE = 0.8
"""Share of a production check's level for its token-level identity tests; each of the two coarse
views (:func:`specverify.core.coarse.coarse_views`) takes half the rest."""

COARSE_SHARE = (1.0 - IDENTITY_SHARE) / 2

@dataclass
class ProductionStepCheck(SequentialCheck):
    """One verification step per row at a production shape; the completed token of every position
    ``0..K`` of every chain against the target's law at that position.

    Under losslessness the completed tokens of a context-free step are independent with laws
    ``p_0 … p_K`` (Leviathan et al. 2023, Theorem 1, applied to one step completed by target
    sampling), so each (chain, position) marginal is tested with the token-level identity test
    (:func:`specverify.core.identity.identity_test`) at level ``IDENTITY_SHARE · level / m``,
    ``m`` = chains × (K+1), and the law of its id tile and of its probability level
    (:func:`specverify.core.coarse.coarse_views`) with Pearson's goodness of fit at
    ``COARSE_SHARE · level / m`` each (weighted Bonferroni within the check: the combined p-value
    is the smallest ``p / share`` times m); the check fails when any one rejects.  Rows are spread
    evenly over the chains (:func:`balanced_chains`), in an order drawn once per call size
    (:func:`placed_rows`): the rows of a call are independent given their chains, and the calls of
    a run share one tensor of laws, which reaches the function's buffer once
    (:class:`~specverify.auditing.isolation.presentation.Presenter`); the interim looks end on
    whole calls (:meth:`looks`), so every call of a run but its last has the same shape.  Sized
    so that a TV of ε in any one marginal is detected with the stated power at ``n / chains`` rows
    each, verified at that n for every marginal
    (:func:`specverify.core.identity.identity_joint_sample_size`); at that n the coarse tests
    detect the TV of :meth:`coarse_detectable_tv` between coarse laws, far smaller.
    """

    name: str
    description: str
    bank: PositionalBank
    family: str
    dtype: str = "float32"
    strided: bool = False
    batch_rows: int | None = None
    target_tvs: dict[str, float] = field(default_factory=dict)
    """The TV the check is sized for under each named budget (:meth:`target_tv`); a budget not
    listed sizes it for the budget's ε."""
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    sizing_verifies_target: ClassVar[bool] = True
    production_shape: ClassVar[bool] = True
    coarse_views: ClassVar[str] = "id tiles and probability levels"
    parameters: dict[str, Any] = field(init=False)
    num_cells: int = field(init=False)
    def target_tv(self, budget: SampleBudget) -> float | None:
        if budget.name in self.target_tvs:
            return float(self.target_tvs[budget.name])
        return budget.epsilon

    @property
    def sized_for_own_tv(self) -> bool:
        return bool(self.target_tvs)

    def __post_init__(self) -> None:
        bank = self.bank
        self.num_draft = bank.num_draft
        self.rows_per_call = rows_per_call(self.num_draft, bank.vocab_size, self.batch_rows)
        self.num_tests = bank.num_chains * (self.num_draft + 1)
        self.num_cells = bank.vocab_size
        self.parameters = {
            "family": self.family, "V": bank.vocab_size, "K": self.num_draft, "B": self.rows_per_call,
            "dtype": self.dtype, "layout": "strided views" if self.strided else "contiguous",
            "chains": bank.num_chains, "positions": f"0..{self.num_draft}",
            "test": "token-level identity, and goodness of fit of id tiles and probability levels, per chain and "
                    "position (weighted Bonferroni)",
            "coarse views": [view.name for view in self._views[0][0]],
        }

    @property
    def _views(self) -> list[list[tuple[coarse.CoarseView, coarse.CoarseView]]]:
        """The coarse views of every (chain, position) law, ``[chain][position]`` (:func:`bank_views`)."""
        return bank_views(self.bank)

    def _mass_profiles(self) -> list[np.ndarray]:
        """The distinct sorted mass vectors of the tested laws: the identity test's sample size
        depends on a law's masses only, not on which ids carry them."""
        profiles: dict[bytes, np.ndarray] = {}
        for law in self.bank.target.reshape(-1, self.bank.vocab_size):
            masses = np.sort(law)
            profiles.setdefault(masses.tobytes(), masses)
        return list(profiles.values())

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        """Chains × the per-chain n at which every chain's law, at level IDENTITY_SHARE · α / (chains ×
        positions), is verified to detect ε (:func:`specverify.core.identity.identity_joint_sample_size`)."""
        per_chain = identity.identity_joint_sample_size(self._mass_profiles(), epsilon,
                                                        alpha=IDENTITY_SHARE * alpha / self.num_tests, power=power)
        return per_chain * self.bank.num_chains

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        level = IDENTITY_SHARE * alpha / self.num_tests
        per_chain = max(1, n // self.bank.num_chains)
        return max(identity.identity_detectable_tv(masses, per_chain, alpha=level, power=power)
                   for masses in self._mass_profiles())

    def coarse_detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        """The largest over (chain, position) of the TV between coarse laws their two views' tests
        detect at ``n / chains`` rows (:func:`specverify.core.coarse.coarse_detectable_tv`)."""
        level = COARSE_SHARE * alpha / self.num_tests
        per_chain = max(1, n // self.bank.num_chains)
        return max(coarse.coarse_detectable_tv(views, per_chain, alpha=level, power=power)
                   for row in self._views for views in row)

    def cost(self, plan: Plan) -> Cost:
        entry_bytes = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return production_step_cost(plan.n, self.num_draft, self.bank.vocab_size, entry_bytes, self.rows_per_call)

    def draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        """``n`` rows in calls of :attr:`rows_per_call`: the proposals are drawn from one generator
        and the completions from another, so the audit builds the next call's proposal while the
        function runs (:meth:`~specverify.auditing.isolation.guarded.GuardedFunction.call_each`)
        and the draws do not depend on that order.  The look's identity designs
        (:meth:`look_designs`) are claimed from the work made ahead (:meth:`work_ahead`), made
        while the samples are drawn when not made yet; the tally carries them to :meth:`judge`
        (``prepared``)."""
        designs = self._designs(plan, look)
        claimed = session.ahead.claim(designs.key, designs.make)
        tally = self._draw(session, plan, n, look)
        return Tally(tally.n, tally.counts, claimed.result())

    def judged_while_drawing(self) -> bool:
        """Always: a look's judgement (token-level identity tests at V up to 151,936) runs while the
        next look draws, so the function does not wait for it."""
        return True

    def looks(self, n: int, share: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The default design's looks (:meth:`SequentialCheck.looks`), each interim look raised to a
        whole number of calls of :attr:`rows_per_call` where that stays below the next look: the
        calls then share one shape.  The levels are the design's (the union bound over looks holds
        at any look sizes, :mod:`specverify.core.sequential`), and the final look is ``n``."""
        looks, alphas = super().looks(n, share)
        per_call = self.rows_per_call
        raised = list(looks)
        for index in range(len(raised) - 2, -1, -1):
            whole = -(-raised[index] // per_call) * per_call
            if whole < raised[index + 1]:
                raised[index] = whole
        return tuple(raised), alphas

    def work_ahead(self, plan: Plan) -> list[AheadItem]:
        """The identity designs of every look (:meth:`look_designs`)."""
        return [self._designs(plan, look) for look in range(len(plan.looks))]

    def _designs(self, plan: Plan, look: int) -> AheadItem:
        """The identity designs of look ``look`` as work made ahead."""
        return AheadItem((self.name, "identity designs", plan.seed, tuple(plan.looks), look), look,
                         functools.partial(self.look_designs, plan, look))

    def look_designs(self, plan: Plan, look: int) -> dict[tuple[int, int], identity.IdentityDesign]:
        """The identity tests' designs at look ``look`` (0-based), by (chain, position): each law at
        the rows its chain holds by then (:meth:`chain_rows`).  A pure function of the plan: made
        in a thread while the look's samples are drawn, it changes no test."""
        rows = self.chain_rows(plan, look)
        return {(r, j): identity.identity_design(self.bank.target[r, j], int(rows[r]))
                for r in range(self.bank.num_chains) if rows[r] for j in range(self.num_draft + 1)}

    def chain_rows(self, plan: Plan, look: int) -> np.ndarray:
        """Rows of each chain once look ``look`` (0-based) is drawn: every look's rows in calls of
        :attr:`rows_per_call`, of which :func:`balanced_chains` gives chain r ⌊rows / C⌋, one more
        when r < rows mod C."""
        chains = self.bank.num_chains
        per_chain = np.zeros(chains, dtype=np.int64)
        drawn = 0
        for size in plan.looks[:look + 1]:
            for offset in range(0, size - drawn, self.rows_per_call):
                rows = min(self.rows_per_call, size - drawn - offset)
                per_chain += rows // chains + (np.arange(chains) < rows % chains)
            drawn = size
        return per_chain

    def _draw(self, session: Any, plan: Plan, n: int, look: int) -> Tally:
        bank, k, vocab = self.bank, self.num_draft, self.bank.vocab_size
        proposing = torch.Generator().manual_seed(derive_seed(plan.seed, "harness", look))
        completing = torch.Generator().manual_seed(derive_seed(plan.seed, "completion", look))
        function_generator = session.function.generator(derive_seed(plan.seed, "function", look))
        dtype = getattr(torch, self.dtype)

        def proposals() -> Iterator[tuple[torch.Tensor, Proposal]]:
            for offset in range(0, n, self.rows_per_call):
                chain, rows_laws = placed_rows(bank, min(self.rows_per_call, n - offset), k, dtype, plan.seed)
                yield chain, production_proposal(bank, chain, rows_laws, k, proposing)

        counts = torch.zeros(bank.num_chains * (k + 1) * vocab, dtype=torch.int64)
        accepted = torch.zeros(k + 1, dtype=torch.int64)
        calls = session.function.call_each(proposals(), function_generator, where=self.name, strided=self.strided)
        for chain, emitted, lengths in calls:
            completed = complete(bank, bank.initial_state(chain), emitted, lengths, k + 1, completing)
            index = (chain[:, None] * (k + 1) + torch.arange(k + 1)) * vocab + completed
            counts.index_add_(0, index.reshape(-1), torch.ones(index.numel(), dtype=torch.int64))
            accepted += torch.bincount(lengths - 1, minlength=k + 1)
        return Tally(n, {"counts": counts.numpy(), "accepted": accepted.numpy()})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        bank, k, vocab = self.bank, self.num_draft, self.bank.vocab_size
        counts = tally.counts["counts"].reshape(bank.num_chains, k + 1, vocab)
        designs = tally.prepared or {}
        results = []
        for r in range(bank.num_chains):
            for j in range(k + 1):
                if not counts[r, j].any():  # a chain no row was given yet (tiny fixed budgets): no evidence, p = 1
                    continue
                design = designs.get((r, j))
                if design is not None and design.n != int(counts[r, j].sum()):
                    design = None
                results.append(self._tests(plan, counts[r, j], r, j, level, look, design))
        combined, r, j, failing, worst = min(results, key=lambda item: item[0])
        failed = combined <= level
        where = level_phrase(plan, level, look)
        reached = tally.counts["accepted"][::-1].cumsum()[::-1] / max(1, tally.n)
        shown = ", ".join(f"{x:.2f}" for x in reached)
        tv = max(item[4].empirical_tv for item in results)
        if worst.impossible_count and failed:
            message = (f"emitted {worst.impossible_count} token(s) of target probability 0 "
                       f"at position {j} of chain {r}: "
                       "certain loss")
        elif failed:
            message = (f"the token at position {j} (chain {r}) does not follow the target's law: {failing}; weighted "
                       f"Bonferroni p-value {combined:.3g} over {self.num_tests} (chain, position) tests ≤ {where}")
        else:
            message = (f"every position 0..{k} consistent with the target, token by token and in its id tiles and "
                       f"probability levels (smallest weighted Bonferroni p-value {combined:.3g} > {where}; share of "
                       f"rows whose step reached position j: {shown})")
        return self.report(plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n, num_cells=vocab,
                           statistic=float(worst.statistic), pvalue=float(combined), empirical_tv=float(tv),
                           **look_fields(plan, level, look))

    def _tests(self, plan: Plan, counts: np.ndarray, chain: int, position: int, level: float,
               look: int | None, design: identity.IdentityDesign | None = None,
               ) -> tuple[float, int, int, str, identity.IdentityTest]:
        """The tests of one (chain, position): the identity test (on ``design`` when it was made
        ahead) and the goodness of fit of its two coarse views, combined as ``m · min_i p_i /
        share_i`` (weighted Bonferroni, m tests in the check); returns that p-value, the chain and
        position, what the smallest one says, and the identity test."""
        seed = derive_seed(plan.seed, "identity", chain, position, look or 0) % (2**32)
        token_test = identity.identity_test(counts, self.bank.target[chain, position], seed=seed, design=design)
        parts = "; ".join(f"{part.name} p={part.pvalue:.3g}" for part in token_test.parts)
        scaled = [(token_test.pvalue * self.num_tests / IDENTITY_SHARE, f"token by token ({parts})")]
        allotted = COARSE_SHARE * level / self.num_tests
        for view in self._views[chain][position]:
            if view.cells_tested(int(counts.sum())) < 2:  # it detects nothing at this n: p = 1, nothing simulated
                continue
            fit = stats.goodness_of_fit(view.counts(counts), view.probs, seed=seed, confirm_below=allotted,
                                        monte_carlo_draws=monte_carlo_draws(allotted))
            scaled.append((fit.pvalue * self.num_tests / COARSE_SHARE,
                           f"its {view.name} (χ² {fit.statistic:.4g}, {fit.dof} dof, p={fit.pvalue:.3g}, empirical "
                           f"TV {fit.empirical_tv:.3g})"))
        combined, said = min(scaled, key=lambda item: item[0])
        return min(1.0, combined), chain, position, said, token_test


# --------------------------------------------------------------------------------------------
# The production checks of the sampler battery
# --------------------------------------------------------------------------------------------

# (name, family, V, K, chains, dtype, strided, rows per call, TV per named budget, description)
PRODUCTION_SHAPES: tuple[tuple[Any, ...], ...] = (
    ("production-qwen-K1", "correction", laws.VOCABULARIES["qwen2.5"], 1, 1, "bfloat16", True, None,
     {"quick": 0.4, "standard": 0.2, "thorough": 0.1},
     "Qwen2.5's 151,936-token vocabulary (above 65,536), bf16 strided views, K=1 with partly overlapping laws "
     "(acceptance 0.65): the correction at position 0 and the bonus at position 1, token by token."),
    ("production-gpt2-K4", "bonus", laws.VOCABULARIES["gpt2"], 4, 1, "float16", False, None,
     {"quick": 0.4, "standard": 0.2, "thorough": 0.1},
     "GPT-2's 50,257-token vocabulary (not a multiple of 128), fp16, K=4 with acceptance 0.95 (the bonus is "
     "reached in 4 of 5 rows): every position 0-4, token by token."),
    ("production-K32", "deeper", 2_053, 32, 1, "bfloat16", True, None,
     {"quick": 0.3, "standard": 0.2, "thorough": 0.1},
     "K=32 (n-gram / suffix drafting, vLLM's num_speculative_tokens up to 32) at V=2,053 (2,048 + 5), bf16 "
     "strided views, acceptance 0.975 so that the deep positions are reached (0.44 of the rows reach the bonus "
     "at position 32, 0.21 are corrected at a position 17-31): every position 0-32."),
    ("production-K12", "deep", 4_099, 12, 2, "float16", True, None,
     {"quick": 0.3, "standard": 0.2, "thorough": 0.1},
     "K=12 at V=4,099, fp16 strided views, two chains per batch, acceptance 0.92: every position 0-12."),
    ("production-batch-1024", "deep", 960, 8, 7, "float32", True, 1024,
     {"quick": 0.3, "standard": 0.2, "thorough": 0.1},
     "Batches of 1,024 rows (rows 256+ of a call are where row-block kernels go wrong) from 7 chains in a "
     "random order, K=8, V=960, fp32 strided views: every position 0-8 of every chain."),
)


def production_checks(function: AuditedFunction) -> list[Check]:
    """The production-shape step checks, each in the dtype it names or, when the function declares
    ``input_dtypes`` without it, the first dtype it declares."""
    checks: list[Check] = []
    for name, family, vocab, k, chains, dtype, strided, rows, tvs, description in PRODUCTION_SHAPES:
        checks.append(ProductionStepCheck(name, description, production_bank(name, family, vocab, k, chains), family,
                                          input_dtype(function, dtype), strided, rows, dict(tvs)))
    return checks


@functools.cache
def bank_views(bank: PositionalBank) -> list[list[tuple[coarse.CoarseView, coarse.CoarseView]]]:
    """The coarse views (:func:`specverify.core.coarse.coarse_views`) of every (chain, position)
    target law of ``bank``, ``[chain][position]``."""
    return [[coarse.coarse_views(bank.target[r, j]) for j in range(bank.num_draft + 1)]
            for r in range(bank.num_chains)]


LARGE_VOCABULARY = 50_000
"""Vocabularies from this size on are the large half of :func:`build_production_laws`."""


def build_production_laws(*, large: bool) -> None:
    """Build half of what the production checks are made of, all cached: with ``large``, the banks
    and coarse views of the shapes at V ≥ LARGE_VOCABULARY; else those of the other shapes and the
    exact cases (about the same time).  With both, :func:`production_checks` and
    :func:`exact_production_check` take no time.  The sampler battery builds one half in a thread
    and the other in its own while the worker process starts (NumPy's sorts and array operations
    release the GIL)."""
    for name, family, vocab, k, chains, *_ in PRODUCTION_SHAPES:
        if (vocab >= LARGE_VOCABULARY) == large:
            bank_views(production_bank(name, family, vocab, k, chains))
    if not large:
        exact_shapes()


def exact_production_check() -> ExactFinalDrawCheck:
    return ExactFinalDrawCheck(
        "exact-large-vocabulary",
        "The function takes uniforms=, so the law of its correction and bonus draws at production shapes "
        "(Llama-3's 128,256 and GPT-2's 50,257 vocabularies, K=32 at V=4,099; fp32, bf16, fp16; strided views) "
        "is integrated exactly over the final uniform, interval by interval of the inverse CDF.",
        exact_shapes())


__all__ = ["ExactFinalDrawCheck", "ExactShape", "INPUT_DTYPES", "PRODUCTION_SHAPES", "ProductionStepCheck",
           "balanced_chains", "bank_views", "bonus_case", "build_production_laws", "chain_laws",
           "correction_case", "exact_production_check", "exact_shapes", "final_draw_evaluator", "input_dtype",
           "production_bank",
           "placed_rows", "production_checks", "production_proposal", "rows_per_call", "sparse_law"]
