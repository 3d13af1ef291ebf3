"""The tree audit level (SPEC §3): a battery of checks for ``verify_tree`` functions.

Registered as ``tree`` in :data:`specverify.auditing.runner.LEVELS`; ``specverify audit --level
tree TARGET`` and ``specverify.audit(fn, level="tree")`` run it.  The harness
(:mod:`specverify.testing.tree_harness`) drafts trees from toy order-1/2 Markov drafts under each
sibling scheme the function declares (``fn.draft_schemes``; all three without it), evaluates the
target along every path, and validates every output (the accepted tokens must be a root-to-node
path of the row's tree).

Statistical honesty, as at the sampler level (:mod:`specverify.auditing.sampler.battery`): every
statistical check is a level-α test with its Bonferroni share of the audit's α, sized by
:func:`specverify.core.stats.sample_size_for_tv` to detect a deviation of TV ε (the budget: quick
0.05, standard 0.02, thorough 0.01) in the law of its cells with power 0.99, cells pooled by
expected counts only, a sample in a cell of target probability 0 a certain failure.  The
production-shape checks below are sized for a multiple of the budget's TV (their ``TV scale``:
2.5 for the 60-node trees, 10 at V = 32,768), and their plans state the TV they detect.

The battery (in run order), per declared scheme ``s``:

- ``randomness-source`` (contract): all randomness from ``generator``;
- ``exact-tree-step`` (only for functions taking ``uniforms=``): exact TV of one step on small
  trees (siblings, depth, branches; a depth-4 chain, a depth-first layout, V = 5) for every
  declared scheme, and a depth-8 chain, a node with four children and single-row calls — cannot
  flake (:func:`exact_cases`);
- ``tree-siblings-s``: three or two children of the root (V = 4), the first 2 completed tokens;
- ``tree-branches-s``: ragged two-level trees (shapes (-1,-1,0,1,1), (-1,0,0), (-1,-1,1)), 3 tokens;
- ``tree-deep-s``: depth-3 trees on order-2 targets (chain, ragged, EAGLE-like), 4 tokens;
- ``tree-loop-s``: whole decoding loops with a fresh tree every call (shapes changing per call
  and per row), the first 4 tokens of every sequence;
- ``tree-acceptance-s`` (exact one-sided binomial): P(a root child is accepted) must not exceed
  ``Σ_t min(p(t), P(t is drafted at the root))`` — the emitted first token follows ``p`` and an
  accepted one was drafted, so no lossless rule can exceed this coupling bound; the message
  compares the mean accepted length with recursive rejection sampling's exact expectation;
- ``tree-dynamic-deep-s`` (transitions, :class:`TreeTransitionCheck`): EAGLE-2-like dynamic trees
  of 60 nodes and depth up to 8 (:func:`production_trees`), each in breadth-first, depth-first
  and interleaved order, and 60-node trees at the limits of depth and parent–child distance (a
  chain of depth 60, children 1 to 59 indices after their parents: :func:`deep_trees`), rows in
  calls of 1 to 64 (:data:`CALL_ROWS`); V = 4 on close drafts, so paths are accepted deep: each
  of the first 9 tokens given the token before it;
- ``tree-dynamic-wide-s``: the same kind of trees with up to ten children per node, V = 12, on
  unrelated drafts (long sibling loops): the first two tokens jointly;

and once for the whole battery:

- ``tree-fan-out-independent`` (when the function declares independent siblings, the only scheme
  that drafts more than V children): 60-node trees at the limit of fan-out, a node with 59
  children 1 to 59 indices after it, and 59 children of the root the first of which has a child
  59 indices after it (:func:`tree_exact.fan_out_shapes`), V = 4, calls of 1 to 64 rows: each of
  the three tokens a step emits given the token before it;
- ``tree-small-batches``: the wide trees, rows of every declared scheme mixed, in calls of 1 to
  4 rows (half of them single-row calls): the first token;
- ``tree-large-vocabulary`` (token-level identity test, :class:`TreeIdentityCheck`): V = 32,768,
  small trees breadth- and depth-first, every declared scheme, calls of 1 to 64 rows, every
  fourth one strided: every token of every completed step pooled against the target's law;
- ``inputs-unchanged`` (contract);
- ``outputs-unaliased`` (contract): no call overwrote a tensor an earlier call returned.

The function runs in a worker process (:class:`specverify.auditing.isolation.guarded.GuardedTreeFunction`,
``isolation="process"``, the default of :func:`specverify.audit`) or in the audit's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from specverify.auditing.audited import AuditSession
from specverify.auditing.checks import (
    Battery,
    Check,
    CheckKind,
    CheckResult,
    ChiSquareCheck,
    ExactCase,
    InputsUnchangedCheck,
    Locus,
    Plan,
    SampleBudget,
    SequentialCheck,
    Tally,
    Verdict,
    binomial_detectable_rate,
    binomial_result,
    binomial_sample_size,
    check_report,
    declared_arithmetic_of,
    exact_cases_result,
    goodness_of_fit_result,
    level_phrase,
    look_fields,
)
from specverify.auditing.cost import EXACT_TREE_CASE_S, Cost, mean_nodes, tree_cost
from specverify.auditing.isolation.faults import (
    Fault,
    FaultKind,
    probe_randomness,
    seed_global_rng,
    validate_tree_emitted,
)
from specverify.auditing.isolation.guarded import GuardedTreeFunction
from specverify.auditing.omissions import Omission, tree_omissions
from specverify.auditing.sampler.battery import prefix_cell_counts, prefix_cells
from specverify.auditing.sampler.coverage import contract_checks
from specverify.auditing.tree.catalog import rows_at_a_time
from specverify.core import tree_exact
from specverify.core.chains import MarkovBank, random_markov_chain
from specverify.core.identity import identity_detectable_tv, identity_joint_sample_size, identity_test
from specverify.core.rules import accepts_uniforms
from specverify.core.seeding import derive_seed
from specverify.core.transitions import transition_goodness_of_fit
from specverify.core.tree_exact import eagle_shape
from specverify.core.tree_rules import DRAFT_SCHEMES
from specverify.testing.tree_harness import (
    DEFAULT_TREE_ROWS,
    draft_trees,
    padded_parents,
    present_nodes,
    sample_tree_runs,
    sample_tree_steps,
)

CLOSENESSES = (0.0, 0.5)
"""Each check's bank: one chain with a draft unrelated to the target, one halfway between."""


def parse_schemes(declared: Any) -> tuple[str, ...]:
    """The schemes of a ``draft_schemes`` value (None: all three); a malformed value is a Fault."""
    if declared is None:
        return DRAFT_SCHEMES
    schemes = (declared,) if isinstance(declared,
                                        str) else tuple(declared) if isinstance(declared, (tuple, list)) else ()
    unknown = [s for s in schemes if s not in DRAFT_SCHEMES]
    if unknown or not schemes:
        raise Fault("malformed", f"draft_schemes = {declared!r}: expected a non-empty tuple of "
                                 f"{', '.join(DRAFT_SCHEMES)}")
    return schemes


def tree_bank(name: str, vocab_size: int, order: int, closenesses: tuple[float, ...] = CLOSENESSES) -> MarkovBank:
    """The fixed bank of a check (seeded by its name): one Markov chain per entry of ``closenesses``."""
    chains = [random_markov_chain(vocab_size, order, derive_seed("tree-bank", name, i) % 2**31, closeness=c)
              for i, c in enumerate(closenesses)]
    return MarkovBank(np.stack([c.target_table for c in chains]), np.stack([c.draft_table for c in chains]), order,
                       np.array([c.prompt for c in chains], dtype=np.int64).reshape(len(chains), order))


@dataclass
class TreeSession(AuditSession):
    """A guarded function plus the settings every tree check shares."""

    function: GuardedTreeFunction
    raw: Callable[..., Any]
    timeout_s: float
    schemes: tuple[str, ...]
    batch_rows: int = DEFAULT_TREE_ROWS
    scheme_error: str | None = None  # a malformed ``draft_schemes`` attribute (reported by randomness-source)


def mean_call_rows(call_rows: tuple[int, ...] | None, batch_rows: int) -> float:
    """Rows per call of a check that calls with groups of ``call_rows`` rows in turn, or with batches
    of ``batch_rows`` (the session's default) when None."""
    return sum(call_rows) / len(call_rows) if call_rows else float(batch_rows)


def shape_parameters(shapes: tuple[tuple[int, ...], ...], call_rows: tuple[int, ...] | None,
                     orders: tuple[str, ...] | None, strided: tuple[bool, ...] | None = None) -> dict[str, Any]:
    """What a report says about a check's trees and calls: the shapes when there are a few
    small ones, else their sizes (N), largest depth, most children of a node, largest index
    distance from a node to its parent, number and node orders; the call sizes (B)."""
    if len(shapes) <= 4 and max(len(s) for s in shapes) <= 8:
        described: dict[str, Any] = {"shapes": [list(s) for s in shapes]}
    else:
        span = tree_exact.shape_span(shapes)
        described = {"N": sorted({len(s) for s in shapes}), "depth": max(span.depths),
                     "children": max(span.children), "distance": max(span.distances, default=0),
                     "trees": len(shapes)}
    if orders is not None:
        described["orders"] = list(orders)
    if call_rows is not None:
        described["B"] = list(call_rows)
    if strided is not None and any(strided):
        described["inputs"] = "contiguous and strided views" if not all(strided) else "strided views"
    return described


PRODUCTION_TV_SCALE = 2.5
"""The production-shape checks (60-node trees, calls of 1 to 64 rows) are sized for this multiple
of the budget's TV (standard: 0.05, quick 0.125, thorough 0.025): a sample there costs ten times
a small tree's, mostly in calls; their plans state the TV they detect."""


def _scale_parameter(scale: float) -> dict[str, Any]:
    return {} if scale == 1.0 else {"TV scale": scale}


class ScaledTvCheck(Check):
    """A tree check sized for ``tv_scale`` × the budget's ε (at most 1): the production-shape
    checks, whose rows cost megabytes, state the larger TV (``TV scale`` in their parameters)."""

    tv_scale: float

    def target_tv(self, budget: SampleBudget) -> float | None:
        return None if budget.epsilon is None else min(1.0, self.tv_scale * budget.epsilon)

    @property
    def sized_for_own_tv(self) -> bool:
        return self.tv_scale != 1.0


PRODUCTION_SEEDS = (0, 1, 2, 3)
"""The EAGLE-2-like trees of a production-shape check: :func:`tree_exact.dynamic_tree_shape` of these seeds."""

PRODUCTION_NODES = 60
"""Nodes of every production-shape tree (EAGLE-2's default draft tree size)."""


def production_trees(*, top_k: int, concentration: float, expand: int,
                     seeds: tuple[int, ...] = PRODUCTION_SEEDS) -> tuple[tuple[int, ...], ...]:
    """60-node EAGLE-2-like dynamic trees of depth ≤ 8 (:func:`tree_exact.dynamic_tree_shape`),
    each in every node order of :data:`tree_exact.NODE_ORDERS` (breadth-first, depth-first,
    interleaved), so one call holds rows of different trees and different layouts."""
    return tuple(tree_exact.reorder(tree_exact.dynamic_tree_shape(seed, num_nodes=PRODUCTION_NODES, top_k=top_k,
                                                                  concentration=concentration, expand=expand),
                                    order, seed)
                 for seed in seeds for order in tree_exact.NODE_ORDERS)


def deep_trees(scheme: str) -> tuple[tuple[int, ...], ...]:
    """The trees of ``tree-dynamic-deep-{scheme}``: the EAGLE-2-like ones of :func:`production_trees`
    (depth ≤ 8; at most :data:`DEEP_VOCAB` children per node without replacement or top-k) and the
    60-node trees at the limits of depth and parent–child distance
    (:func:`tree_exact.far_parent_shapes`: a chain of depth 60, children 1 to 59 indices after
    their parents)."""
    return (production_trees(top_k=10 if scheme == "independent" else DEEP_VOCAB, concentration=0.15, expand=4)
            + tree_exact.far_parent_shapes(PRODUCTION_NODES))


@dataclass
class TreeLawCheck(ScaledTvCheck, ChiSquareCheck):
    """One tree step per row (or whole loops), the first ``length`` completed tokens jointly
    (cells: chain × V^length) against the target's exact law.  ``call_rows``: the rows go to the
    function in calls of these sizes in turn (default: one call per harness batch).  The law of
    the accepted length (recursive rejection sampling's, reported next to the observed one) is
    enumerated only for small trees (``acceptance``)."""

    name: str
    description: str
    bank: MarkovBank
    shapes: tuple[tuple[int, ...], ...]
    scheme: str | tuple[str, ...]
    length: int
    loop: bool = False
    call_rows: tuple[int, ...] | None = None
    acceptance: bool = True
    orders: tuple[str, ...] | None = None
    tv_scale: float = 1.0
    strided: tuple[bool, ...] | None = None
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.num_cells = self.bank.num_chains * self.bank.vocab_size**self.length
        scheme = self.scheme if isinstance(self.scheme, str) else list(self.scheme)
        self.parameters = {"scheme": scheme, **shape_parameters(self.shapes, self.call_rows, self.orders, self.strided),
                           "chain": f"markov order {self.bank.order}", "V": self.bank.vocab_size,
                           "chains": self.bank.num_chains, "L": self.length, "cells": self.num_cells,
                           "loop": self.loop, **_scale_parameter(self.tv_scale)}
        self.expected_accepted = None if self.loop or not self.acceptance else self._accepted_law()

    def _one_scheme(self) -> str:
        """The check's scheme where one is needed: whole loops and the law of the accepted length."""
        if not isinstance(self.scheme, str):
            raise ValueError(f"scheme: {self.name} mixes the schemes {self.scheme}; whole loops and the law of the "
                             "accepted length take one")
        return self.scheme

    def _accepted_law(self) -> np.ndarray:
        """Law of the accepted path length under recursive rejection sampling, averaged over the
        (chain, shape) pairs the rows cycle through (:func:`tree_exact.ideal_tree_step_distribution`)."""
        depth = max(tree_exact.tree_depth(s) for s in self.shapes)
        law = np.zeros(depth + 1)
        for r in range(self.bank.num_chains):
            for shape in self.shapes:
                for emitted, prob in tree_exact.ideal_tree_step_distribution(self.bank.chain(r), shape,
                                                                             self._one_scheme()).items():
                    law[len(emitted) - 1] += prob
        return law / law.sum()

    def cost(self, plan: Plan) -> Cost:
        return tree_cost(plan.n, mean_nodes(self.shapes), self.bank.vocab_size, self.length if self.loop else 1,
                         mean_call_rows(self.call_rows, DEFAULT_TREE_ROWS))

    def draw(self, session: TreeSession, plan: Plan, n: int, look: int) -> Tally:
        if self.loop:
            sampler = functools.partial(sample_tree_runs, scheme=self._one_scheme())
        else:
            sampler = functools.partial(sample_tree_steps, scheme=self.scheme, call_rows=self.call_rows,
                                        strided=self.strided)
        sample = sampler(session.function, self.bank, shapes=self.shapes, length=self.length, n=n,
                         batch_rows=session.batch_rows, harness_seed=derive_seed(plan.seed, "harness", look),
                         function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        counts = {"cells": prefix_cell_counts(self.bank, sample.chain, sample.tokens)}
        if self.expected_accepted is not None:
            depth = max(tree_exact.tree_depth(s) for s in self.shapes)
            counts["accepted"] = torch.bincount(sample.accepted, minlength=depth + 1)[: depth + 1].numpy()
        return Tally(n, counts)

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """The target's exact law of the cells (chain × first ``length`` tokens) and their labels."""
        return prefix_cells(self.bank, self.length)

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        acceptance = None
        if self.expected_accepted is not None:
            acceptance = {"observed": tuple(float(c) for c in tally.counts["accepted"].tolist()),
                          "expected": tuple(float(e) for e in self.expected_accepted)}
        expected, labels = self.cells
        return goodness_of_fit_result(self, plan, tally.counts["cells"], expected, labels, acceptance, level=level,
                                      look=look)


@dataclass
class TreeTransitionCheck(ScaledTvCheck, ChiSquareCheck):
    """One tree step per row on large trees, completed to ``length`` tokens; every position's
    token given the state before it (blocks: chain × position × the last ``order`` tokens)
    against the target's law there (:func:`specverify.core.transitions.transition_goodness_of_fit`).

    Under a lossless rule the completed sequence is target sampling, so the token at position
    ``j`` has the target's law at the state before it whatever came earlier; every position is
    tested on all ``n`` sequences, so a deviation confined to deep positions (paths of depth
    ≥ 4 … 8) is not diluted as it is in a joint law of ``V^length`` cells.  Sized (module
    docstring of :mod:`specverify.core.transitions`) to detect ``ε_j ≥ ε`` at any one position:
    the TV of position ``j``'s token given the state before it, averaged over the states."""

    name: str
    description: str
    bank: MarkovBank
    shapes: tuple[tuple[int, ...], ...]
    scheme: str
    length: int
    call_rows: tuple[int, ...] | None = None
    orders: tuple[str, ...] | None = None
    tv_scale: float = 1.0
    strided: tuple[bool, ...] | None = None
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        bank = self.bank
        reachable = sum(min(bank.num_states, bank.vocab_size**j) for j in range(self.length))
        self.num_cells = bank.num_chains * reachable * (bank.vocab_size - 1) + 1  # degrees of freedom + 1
        self.parameters = {"scheme": self.scheme,
                           **shape_parameters(self.shapes, self.call_rows, self.orders, self.strided),
                           "chain": f"markov order {bank.order}", "V": bank.vocab_size, "chains": bank.num_chains,
                           "L": self.length, "blocks": bank.num_chains * reachable, "cells": self.num_cells,
                           "test": "transitions", **_scale_parameter(self.tv_scale)}

    def cost(self, plan: Plan) -> Cost:
        return tree_cost(plan.n, mean_nodes(self.shapes), self.bank.vocab_size,
                         rows_per_call=mean_call_rows(self.call_rows, DEFAULT_TREE_ROWS))

    def draw(self, session: TreeSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_tree_steps(session.function, self.bank, shapes=self.shapes, scheme=self.scheme,
                                   length=self.length, n=n, batch_rows=session.batch_rows,
                                   harness_seed=derive_seed(plan.seed, "harness", look),
                                   function_seed=derive_seed(plan.seed, "function", look), where=self.name,
                                   call_rows=self.call_rows, strided=self.strided)
        return Tally(n, {"blocks": transition_counts(self.bank, sample.chain, sample.tokens)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        bank, counts = self.bank, tally.counts["blocks"]
        probs = np.broadcast_to(bank.target[:, None], counts.shape)
        fit = transition_goodness_of_fit(counts.reshape(-1, bank.vocab_size), probs.reshape(-1, bank.vocab_size))
        totals = counts.sum(-1)  # [R, L, S]
        block_tv = fit.block_tv.reshape(totals.shape)
        position_tv = (block_tv * totals).sum((0, 2)) / np.maximum(totals.sum((0, 2)), 1)  # ε_j, plug-in
        worst = int(np.argmax(position_tv))
        failed = fit.pvalue <= level
        where = level_phrase(plan, level, look)
        if fit.impossible_count:
            message = f"emitted {fit.impossible_count} token(s) of target probability 0: certain loss"
        elif failed:
            message = (f"the emitted tokens do not follow the target's law given the tokens before them: p-value "
                       f"{fit.pvalue:.3g} ≤ {where}; largest deviation at position {worst + 1} (estimated "
                       f"conditional TV {position_tv[worst]:.4f}; per position "
                       f"{', '.join(f'{tv:.3f}' for tv in position_tv)})")
        else:
            message = (f"every position follows the target's law given the state before it "
                       f"(p-value {fit.pvalue:.3g} > {where})")
        expected = (totals[..., None] * probs / max(1, int(totals.sum()))).reshape(-1)
        return check_report(self, plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n,
                            num_cells=fit.dof + 1, statistic=float(fit.statistic), pvalue=float(fit.pvalue),
                            empirical_tv=float(position_tv[worst]), observed=tuple(int(c) for c in counts.reshape(-1)),
                            expected=tuple(float(e) for e in expected), cell_labels=self.labels,
                            **look_fields(plan, level, look))

    @functools.cached_property
    def labels(self) -> tuple[str, ...]:
        bank = self.bank
        return tuple(f"chain {r} position {j + 1} state {s} token {t}" for r in range(bank.num_chains)
                     for j in range(self.length) for s in range(bank.num_states) for t in range(bank.vocab_size))


LARGE_VOCAB = 32_768
"""V of ``tree-large-vocabulary`` (2^15, the smallest of the vocabularies engines serve; a row of
the check carries 11 laws of V floats, so its cost is linear in V)."""

LARGE_VOCAB_SHAPES = ((-1, -1, 0, 2, 3), (-1, 0, 1, 2, -1))
"""Its trees: two children of the root and a depth-4 branch, breadth-first and depth-first."""

LARGE_VOCAB_ROWS = 128
"""Rows drafted at a time at large V (4096 rows of 11 laws of 50k floats would be 9 GB)."""

LARGE_VOCAB_TV_SCALE = 10.0
"""``tree-large-vocabulary`` is sized for 10 × the budget's TV (standard: 0.2, thorough 0.1) in
the law of its pooled tokens: a row carries 11 laws of V floats (1.4 MB at V = 32,768)."""

ZIPF_EXPONENT = 1.1


def zipf_law(rng: np.random.Generator, vocab_size: int) -> np.ndarray:
    """A Zipf(1.1) law over a random permutation of the ids (heavy tokens anywhere in the
    vocabulary, every token of positive probability), as a language model's next-token law."""
    weights = np.empty(vocab_size)
    weights[rng.permutation(vocab_size)] = 1.0 / np.arange(1, vocab_size + 1) ** ZIPF_EXPONENT
    return weights / weights.sum()


def large_vocabulary_bank(name: str, vocab_size: int) -> MarkovBank:
    """A context-free (order-0) bank at large V: one target law ``p`` (:func:`zipf_law`) shared by
    two chains, one with a draft close to ``p`` (``0.8 p + 0.2 r``: deep acceptance, bonus tokens)
    and one with an unrelated Zipf draft (rejections, residuals, corrections).  Under a lossless
    rule every token of a completed step is then an independent draw from ``p``."""
    rng = np.random.default_rng(derive_seed("tree-bank", name, vocab_size) % 2**63)
    target = zipf_law(rng, vocab_size)
    close = 0.8 * target + 0.2 * zipf_law(rng, vocab_size)
    far = zipf_law(rng, vocab_size)
    tables = np.stack([target, target])[:, None, :]
    drafts = np.stack([close / close.sum(), far])[:, None, :]
    return MarkovBank(tables, drafts, 0, np.zeros((2, 0), dtype=np.int64))


@dataclass
class TreeIdentityCheck(ScaledTvCheck, SequentialCheck):
    """Tree steps at a large vocabulary, every completed token of every step pooled, against the
    target's law by the token-level identity test (:func:`specverify.core.identity.identity_test`).

    The bank is context-free and its chains share one target law ``p`` (:func:`large_vocabulary_bank`),
    so under a lossless rule the ``L = depth + 1`` tokens of a completed step are independent
    draws from ``p``: ``n`` steps give ``n · L`` samples of ``p``, tested at the token level (the
    light tail by mass, by blocks of consecutive ids and by probability level; a token of
    probability 0 is a certain failure).  The TV it detects is that of the pooled token law (the
    average over positions of each position's law) from ``p``, planned by
    :func:`specverify.core.identity.identity_joint_sample_size` (a worst case over every alternative)."""

    name: str
    description: str
    bank: MarkovBank
    shapes: tuple[tuple[int, ...], ...]
    schemes: tuple[str, ...]
    call_rows: tuple[int, ...]
    strided: tuple[bool, ...]
    tv_scale: float = LARGE_VOCAB_TV_SCALE
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.GOODNESS_OF_FIT
    sizing_verifies_target: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.bank.order != 0 or not np.array_equal(self.bank.target[0], self.bank.target[-1]):
            raise ValueError("bank: the identity check needs a context-free bank whose chains share one target law")
        self.law = self.bank.target[0, 0]
        self.length = max(tree_exact.tree_depth(s) for s in self.shapes) + 1
        self.num_cells = self.bank.vocab_size
        self.parameters = {"scheme": list(self.schemes),
                           **shape_parameters(self.shapes, self.call_rows, None, self.strided),
                           "chain": "context-free Zipf(1.1)", "V": self.bank.vocab_size, "chains": self.bank.num_chains,
                           "L": self.length, "tokens per step": self.length, "test": "identity",
                           **_scale_parameter(self.tv_scale)}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        """Steps whose ``L`` tokens each are verified to detect ε
        (:func:`specverify.core.identity.identity_joint_sample_size` in steps of ``L``)."""
        tokens = identity_joint_sample_size([self.law], epsilon, alpha=alpha, power=power, step=self.length)
        return tokens // self.length

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return identity_detectable_tv(self.law, n * self.length, alpha=alpha, power=power)

    def cost(self, plan: Plan) -> Cost:
        return tree_cost(plan.n, mean_nodes(self.shapes), self.bank.vocab_size,
                         rows_per_call=mean_call_rows(self.call_rows, LARGE_VOCAB_ROWS))

    def draw(self, session: TreeSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_tree_steps(session.function, self.bank, shapes=self.shapes, scheme=self.schemes,
                                   length=self.length, n=n, batch_rows=min(session.batch_rows, LARGE_VOCAB_ROWS),
                                   harness_seed=derive_seed(plan.seed, "harness", look),
                                   function_seed=derive_seed(plan.seed, "function", look), where=self.name,
                                   call_rows=self.call_rows, strided=self.strided)
        return Tally(n, {"tokens": np.bincount(sample.tokens.reshape(-1).numpy(), minlength=self.bank.vocab_size)})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        counts = tally.counts["tokens"]
        result = identity_test(counts, self.law, seed=derive_seed(plan.seed, "identity", look or 0) % 2**32)
        failed = result.pvalue <= level
        where = level_phrase(plan, level, look)
        parts = "; ".join(f"{part.name} p = {part.pvalue:.3g}" for part in result.parts)
        if result.impossible_count:
            message = f"emitted {result.impossible_count} token(s) of target probability 0: certain loss"
        elif failed:
            message = (f"the {int(counts.sum())} emitted tokens do not follow the target's law: p-value "
                       f"{result.pvalue:.3g} ≤ {where} ({parts}); plug-in TV {result.empirical_tv:.4f}")
        else:
            message = (f"the {int(counts.sum())} emitted tokens are consistent with the target's law (p-value "
                       f"{result.pvalue:.3g} > {where}; {parts})")
        return check_report(self, plan, Verdict.FAIL if failed else Verdict.PASS, message, n=tally.n,
                            num_cells=self.bank.vocab_size, statistic=float(result.statistic),
                            pvalue=float(result.pvalue), empirical_tv=float(result.empirical_tv),
                            **look_fields(plan, level, look))


def transition_counts(bank: MarkovBank, chain: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    """int64 ``[R, L, S, V]``: for chain ``r``, position ``j`` and state ``s`` (the last ``order``
    tokens before position ``j``, prompt included), how many sequences have token ``t`` there."""
    length = tokens.shape[1]
    states = bank.prompt_states(chain)
    shape = (bank.num_chains, length, bank.num_states, bank.vocab_size)
    counts = torch.zeros(int(np.prod(shape)), dtype=torch.int64)
    for j in range(length):
        index = ((chain * length + j) * bank.num_states + states) * bank.vocab_size + tokens[:, j]
        counts += torch.bincount(index, minlength=counts.numel())
        states = bank.next_state(states, tokens[:, j])
    return counts.reshape(shape).numpy()


@dataclass
class TreeAcceptanceCheck(SequentialCheck):
    """P(a root child is accepted) ≤ ``Σ_t min(p(t), P(t ∈ root children))`` (coupling bound:
    the first emitted token follows ``p`` and an accepted one is one of the drafted tokens).
    One-sided exact binomial test; the mean accepted length is reported against recursive
    rejection sampling's exact expectation."""

    name: str
    description: str
    bank: MarkovBank
    shape: tuple[int, ...]
    scheme: str
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.BINOMIAL
    num_cells: ClassVar[int] = 2  # type: ignore[misc]  # one value for every instance (Check declares it per instance)

    def __post_init__(self) -> None:
        bounds, optimum = [], []
        for r in range(self.bank.num_chains):
            chain = self.bank.chain(r)
            drafted = np.zeros(self.bank.vocab_size)
            roots = [n for n, a in enumerate(self.shape) if a == -1]
            for tree in tree_exact.enumerate_trees(chain, self.shape, self.scheme):
                tokens = {tree.tokens[n] for n in roots}
                drafted[list(tokens)] += tree.prob
            bounds.append(float(np.minimum(chain.target(()), drafted).sum()))
            optimum.append(tree_exact.expected_tree_accepted_length(chain, self.shape, self.scheme))
        self.bound = float(np.mean(bounds))
        self.optimum = float(np.mean(optimum))
        self.parameters = {"scheme": self.scheme, "shape": list(self.shape), "V": self.bank.vocab_size,
                           "chains": self.bank.num_chains, "acceptance bound": round(self.bound, 12)}

    def required_samples(self, epsilon: float, *, alpha: float, power: float) -> int:
        return binomial_sample_size(epsilon, min(self.bound, 1 - 1e-9), alpha, power)

    def detectable_tv(self, n: int, *, alpha: float, power: float) -> float:
        return binomial_detectable_rate(n, min(self.bound, 1 - 1e-9), alpha, power)

    def cost(self, plan: Plan) -> Cost:
        return tree_cost(plan.n, len(self.shape), self.bank.vocab_size)

    def draw(self, session: TreeSession, plan: Plan, n: int, look: int) -> Tally:
        sample = sample_tree_steps(session.function, self.bank, shapes=(self.shape,), scheme=self.scheme, length=1,
                                   n=n, batch_rows=session.batch_rows,
                                   harness_seed=derive_seed(plan.seed, "harness", look),
                                   function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        return Tally(n, {"accepted": np.array(int((sample.accepted >= 1).sum())),
                         "length": np.array(int(sample.accepted.sum()))})

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        mean_length = float(tally.counts["length"]) / tally.n
        return binomial_result(
            self, plan, int(tally.counts["accepted"]), tally.n, self.bound,
            ("a root child accepted", "no root child accepted"),
            failing=("accepts a drafted root child in {rate:.4f} of steps, more than the coupling bound "
                     "Σ min(p, P(drafted)) = {bound:.4f} (p-value {pvalue:.3g} ≤ {where}): the emitted law is at "
                     "TV ≥ {excess:.4f} from the target's"),
            passing="acceptance {rate:.4f} within the bound {bound:.4f} (p-value {pvalue:.3g} > {where})",
            level=level, look=look,
            note=f"mean accepted length {mean_length:.4f} vs {self.optimum:.4f} for recursive rejection sampling")


@dataclass
class ExactTreeCheck(Check):
    """Exact integration over the uniforms (:mod:`specverify.core.tree_exact`) of one step on
    small trees for every declared scheme; only for functions taking ``uniforms=``.  A case with
    a row count calls the function on that many rows at a time
    (:func:`specverify.auditing.tree.catalog.rows_at_a_time`)."""

    name: str
    description: str
    cases: tuple[tuple[str, Any, tuple[int, ...], str, int | None], ...]  # (label, chain, shape, scheme, rows)
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.EXACT
    locus = Locus.ONE_ROW_EXACT

    def __post_init__(self) -> None:
        self.parameters = {"cases": [self._label(case) + f" (V={case[1].vocab_size})" for case in self.cases]}

    @staticmethod
    def _label(case: tuple[str, Any, tuple[int, ...], str, int | None]) -> str:
        label, _, shape, scheme, rows = case
        return f"{label} {list(shape)} ({scheme}{f', {rows} row per call' if rows else ''})"

    def cost(self, plan: Plan) -> Cost:
        return Cost(0, len(self.cases) * EXACT_TREE_CASE_S)

    def run(self, session: TreeSession, plan: Plan) -> CheckResult:
        def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
            try:
                result = session.raw(target_probs, draft_probs, tree_tokens, parents, None, uniforms=uniforms)
            except Exception as error:
                raise Fault("exception", f"the function (in {self.name}, with uniforms=) raised "
                                         f"{type(error).__name__}: {error}") from error
            return validate_tree_emitted(result, tree_tokens, parents, target_probs.shape[-1])[0]

        cases = [ExactCase(self._label(case),
                           functools.partial(tree_exact.exact_tree_step_tv,
                                             rule if case[4] is None else rows_at_a_time(rule, case[4]),
                                             case[1], case[2], case[3]),
                           len(case[2]), case[1].vocab_size)
                 for case in self.cases]
        arithmetic, declared = declared_arithmetic_of(session.function)
        return exact_cases_result(self, plan, cases, 10 * session.timeout_s, arithmetic, declared)


@dataclass
class TreeRandomnessCheck(Check):
    """All randomness must come from ``generator`` (same probe as the sampler level)."""

    name: str
    description: str
    bank: MarkovBank
    shape: tuple[int, ...]
    scheme: str
    rows: int
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.CONTRACT
    locus = Locus.RANDOMNESS_SOURCE

    def __post_init__(self) -> None:
        self.parameters = {"shape": list(self.shape), "scheme": self.scheme, "V": self.bank.vocab_size,
                           "rows": self.rows}

    def run(self, session: TreeSession, plan: Plan) -> CheckResult:
        if session.scheme_error is not None:
            raise Fault("malformed", session.scheme_error)
        chain = torch.arange(self.rows) % self.bank.num_chains
        shape_of_row = torch.zeros(self.rows, dtype=torch.int64)
        drafted = draft_trees(self.bank, chain, self.bank.prompt_states(chain),
                              padded_parents([self.shape], shape_of_row),
                              present_nodes([self.shape], shape_of_row), self.scheme,
                              torch.Generator().manual_seed(derive_seed(plan.seed, "harness")))

        def run_twice(generator_seed: int, global_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
            seed_global_rng(global_seed)
            generator = session.function.generator(generator_seed)
            first = session.function(drafted.proposal, generator, where=self.name)[0]
            return first, session.function(drafted.proposal, generator, where=self.name)[0]

        probe = probe_randomness(run_twice, derive_seed(plan.seed, "function"),
                                 (derive_seed(plan.seed, "global", 1), derive_seed(plan.seed, "global", 2)))
        if probe.uses_only_generator:
            return self.report(plan, Verdict.PASS, "the output depends on the generator's stream only")
        if not probe.repeatable:
            message = ("the output changed between two runs with the same generator seed and the same global seeds: "
                       "the function draws randomness from outside both; draw everything from `generator`")
        elif not probe.independent_of_global:
            message = ("the output changed when only the global RNG seeds changed: the function uses the global "
                       "torch/numpy/random RNG instead of `generator`")
        else:
            message = ("two successive calls with the same generator gave identical outputs: the function reseeds or "
                       "ignores `generator`, so successive steps reuse the same random numbers")
        return self.report(plan, Verdict.FAIL, message, fault=FaultKind.GLOBAL_RNG)


SIBLING_SHAPES = ((-1, -1, -1), (-1, -1))
BRANCH_SHAPES = ((-1, -1, 0, 1, 1), (-1, 0, 0), (-1, -1, 1))
DEEP_SHAPES = ((-1, 0, 1), (-1, -1, 0, 2), eagle_shape(2, 3, 1))
LOOP_SHAPES = ((-1, -1), (-1, 0, 0, 1), (-1, -1, 1, 2))
EXACT_SHAPES = (("siblings", (-1, -1, -1)), ("depth", (-1, 0)), ("branches", (-1, -1, 1)))

CALL_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)
"""Call sizes of the production-shape checks, in turn: every B from 1 to 8 and 16, 32, 64 rows
(a batch of requests as an engine holds them; a path for small batches gets 6 % of the rows at
B ≤ 4, 22 % at B ≤ 8)."""

SOME_STRIDED = (False, False, False, True)
"""Every fourth call of ``tree-large-vocabulary`` gets its inputs as strided views of wider buffers
(:mod:`specverify.auditing.isolation.presentation`: a decoy law in the padding), the others contiguous
tensors (4 and the 11 call sizes are coprime: every size is met both ways).  The 60-node checks
pass contiguous tensors: a strided view sends the reference rule to its torch walk, 25 ms a call."""


SMALL_CALL_ROWS = (1,) * 9 + (2, 3, 4)
"""Call sizes of ``tree-small-batches``, in turn: half of its rows in single-row calls (the latency
path), the others in calls of 2, 3 and 4 rows."""

DEEP_VOCAB = 4
"""V of the deep production-shape check: transition blocks (chain, position, state) × V tokens stay few."""

FAN_OUT_LENGTH = 3
"""Tokens ``tree-fan-out-independent`` tests: its trees have depth 2 at most, so a step emits at
most three tokens."""

WIDE_VOCAB = 12
"""V of the wide production-shape check: ten distinct children per node under every scheme, and
laws with mass beyond their top entries."""


def exact_cases(schemes: tuple[str, ...]) -> tuple[tuple[str, Any, tuple[int, ...], str, int | None], ...]:
    """The cases of ``exact-tree-step``: ``(label, chain, shape, scheme, rows per call)``, every
    one a few seconds or less to integrate.  Small trees (siblings, depth, branches) for every
    declared scheme; a depth-4 chain, a depth-first layout (a root child after its sibling's
    child) and V = 5 for every declared scheme; a depth-8 chain and a node with four children
    (deterministic children: one drafted tree; else the smallest V that draws four); and one
    case with the rule called on one row at a time (a separate single-request path)."""
    small = random_markov_chain(3, 1, 1, closeness=0.0)
    close = random_markov_chain(2, 1, 3, closeness=0.9)
    wide = random_markov_chain(5, 1, 1, closeness=0.0)
    cases: list[tuple[str, Any, tuple[int, ...], str, int | None]] = []
    for scheme in schemes:
        cases += [(label, small, shape, scheme, None) for label, shape in EXACT_SHAPES]
        cases += [("depth 4", close, tree_exact.chain_shape(4), scheme, None),
                  ("depth-first", small, (-1, 0, -1), scheme, None),
                  ("V = 5", wide, (-1, -1), scheme, None)]
    cheapest = "deterministic" if "deterministic" in schemes else schemes[0]
    four_vocab = {"deterministic": 5, "without_replacement": 4, "independent": 3}[cheapest]
    if "deterministic" in schemes:
        cases.append(("depth 8", close, tree_exact.chain_shape(8), "deterministic", None))
    cases += [("4 children", random_markov_chain(four_vocab, 1, 1, closeness=0.0), tree_exact.star_shape(4), cheapest,
               None),
              ("one row per call", small, (-1,), cheapest, 1)]
    return tuple(cases)


class TreeBattery(Battery):
    """SPEC §3 battery: tree steps and whole tree decoding loops, per declared sibling scheme."""

    level = "tree"
    first_looks_first = True

    def __init__(self, batch_rows: int = DEFAULT_TREE_ROWS) -> None:
        self.batch_rows = batch_rows

    def open_session(self, fn: Callable[..., Any] | str, *, device: str, timeout_s: float,
                     isolation: str = "none") -> TreeSession:
        """The guarded function (in a worker process with ``isolation="process"``) and the schemes
        it declares (its ``draft_schemes`` attribute, read where it was loaded)."""
        function = GuardedTreeFunction(fn, timeout_s=timeout_s, device=device, isolation=isolation)
        try:
            schemes, error = parse_schemes(function.draft_schemes), None
        except Fault as fault:
            schemes, error = DRAFT_SCHEMES, fault.message  # audited under every scheme, reported as an error
        return TreeSession(function, function.raw, timeout_s, schemes, self.batch_rows, error)

    def omitted(self, session: TreeSession) -> list[Omission]:
        return tree_omissions(session)

    def checks(self, session: TreeSession) -> list[Any]:
        schemes = session.schemes
        checks: list[Any] = [TreeRandomnessCheck(
            "randomness-source", "Randomness must come from the generator only: the same generator seed under other "
            "global RNG seeds gives the same output, and a second call with the advanced generator a new one.",
            tree_bank("randomness-source", 4, 1), (-1, -1, 0, 1), schemes[0], 512)]
        if accepts_uniforms(session.raw):
            checks.append(ExactTreeCheck(
                "exact-tree-step", "The function takes uniforms=, so one step's output law is integrated exactly over "
                "the uniforms on small trees for every declared scheme and compared with the target's.",
                exact_cases(schemes)))
        for scheme in schemes:
            checks += [
                TreeLawCheck(f"tree-siblings-{scheme}", f"Two or three {scheme} children of the root (V=4): the first "
                             "two completed tokens must follow the target (the sibling loop and its residuals).",
                             tree_bank(f"tree-siblings-{scheme}", 4, 1), SIBLING_SHAPES, scheme, 2),
                TreeLawCheck(f"tree-branches-{scheme}", f"Ragged two-level {scheme} trees in one batch: the first "
                             "three completed tokens (which branch is accepted, the bonus at its leaf).",
                             tree_bank(f"tree-branches-{scheme}", 3, 1), BRANCH_SHAPES, scheme, 3),
                TreeLawCheck(f"tree-deep-{scheme}", f"Depth-3 {scheme} trees (chain, ragged, EAGLE-like) on order-2 "
                             "targets keyed by the path: the first four completed tokens.",
                             tree_bank(f"tree-deep-{scheme}", 3, 2), DEEP_SHAPES, scheme, 4),
                TreeLawCheck(f"tree-loop-{scheme}", f"Whole decoding loops, a fresh {scheme} tree every call, shapes "
                             "changing per call and row: the first four tokens of every sequence.",
                             tree_bank(f"tree-loop-{scheme}", 3, 1), LOOP_SHAPES, scheme, 4, loop=True),
                TreeAcceptanceCheck(f"tree-acceptance-{scheme}", "Two root children: a drafted child may be accepted "
                                    "at most Σ min(p(t), P(t drafted)) of the time (coupling bound).",
                                    tree_bank(f"tree-acceptance-{scheme}", 4, 1), (-1, -1), scheme),
                TreeTransitionCheck(
                    f"tree-dynamic-deep-{scheme}", f"EAGLE-2-like dynamic {scheme} trees of 60 nodes and depth up to 8 "
                    "in breadth-first, depth-first and interleaved order, and 60-node trees at the limits (a chain "
                    "of depth 60; children 1 to 59 indices after their parents), called with 1 to 64 rows: each of "
                    "the first nine tokens given the token before it (paths accepted deep on close drafts).",
                    tree_bank(f"tree-dynamic-deep-{scheme}", DEEP_VOCAB, 1, (0.9, 0.6)), deep_trees(scheme),
                    scheme, 9, CALL_ROWS, tree_exact.NODE_ORDERS, PRODUCTION_TV_SCALE),
                TreeLawCheck(
                    f"tree-dynamic-wide-{scheme}", f"EAGLE-2-like dynamic {scheme} trees of 60 nodes with up to ten "
                    f"children per node (V={WIDE_VOCAB}) in breadth-first, depth-first and interleaved order, called "
                    "with 1 to 64 rows: the first two tokens (long sibling loops on unrelated drafts).",
                    tree_bank(f"tree-dynamic-wide-{scheme}", WIDE_VOCAB, 1),
                    production_trees(top_k=10, concentration=1.0, expand=3), scheme, 2, call_rows=CALL_ROWS,
                    acceptance=False, orders=tree_exact.NODE_ORDERS, tv_scale=PRODUCTION_TV_SCALE),
            ]
        if "independent" in schemes:
            checks.append(TreeTransitionCheck(
                "tree-fan-out-independent", "60-node trees at the limit of fan-out, independent siblings: a node "
                "with 59 children (1 to 59 indices after it), and 59 children of the root the first of which has a "
                "child 59 indices after it, called with 1 to 64 rows: each of the three tokens they emit given the "
                "token before it.",
                tree_bank("tree-fan-out-independent", DEEP_VOCAB, 1, (0.9, 0.6)),
                tree_exact.fan_out_shapes(PRODUCTION_NODES), "independent", FAN_OUT_LENGTH, CALL_ROWS, None,
                PRODUCTION_TV_SCALE))
        checks.append(TreeLawCheck(
            "tree-small-batches", "The wide 60-node trees of tree-dynamic-wide "
            f"(V={WIDE_VOCAB}), rows of every declared "
            "scheme mixed, called with 1 to 4 rows at a time (the single-request latency path and small batches "
            "engines serve by separate kernels): the first token.",
            tree_bank("tree-small-batches", WIDE_VOCAB, 1), production_trees(top_k=10, concentration=1.0, expand=3),
            schemes, 1, call_rows=SMALL_CALL_ROWS, acceptance=False, orders=tree_exact.NODE_ORDERS,
            tv_scale=PRODUCTION_TV_SCALE))
        checks.append(TreeIdentityCheck(
            "tree-large-vocabulary", f"V={LARGE_VOCAB:,}: trees with two root children and "
            "a depth-4 branch, breadth- and depth-first, every declared scheme, called with 1 to 64 rows as "
            "contiguous tensors and as strided views: every token of every completed step against the target's "
            "law, token by token (the light tail by mass, id blocks and probability levels).",
            large_vocabulary_bank("tree-large-vocabulary", LARGE_VOCAB), LARGE_VOCAB_SHAPES, schemes, CALL_ROWS,
            SOME_STRIDED))
        checks.append(InputsUnchangedCheck("inputs-unchanged", "No call may modify the tensors it is given."))
        checks += contract_checks()
        return checks
