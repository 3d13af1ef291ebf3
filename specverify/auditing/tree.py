"""The tree audit level (SPEC §3): a battery of checks for ``verify_tree`` functions.

Registered as ``tree`` in :data:`specverify.auditing.runner.LEVELS`; ``specverify audit --level
tree TARGET`` and ``specverify.audit(fn, level="tree")`` run it.  The harness
(:mod:`specverify.testing.tree_harness`) drafts trees from toy order-1/2 Markov drafts under each
sibling scheme the function declares (``fn.draft_schemes``; all three without it), evaluates the
target along every path, and validates every output (the accepted tokens must be a root-to-node
path of the row's tree).

Statistical honesty, as at the sampler level (:mod:`specverify.auditing.sampler`): every
statistical check is a level-α test with its Bonferroni share of the audit's α, sized by
:func:`specverify.core.stats.sample_size_for_tv` to detect a deviation of TV ε (the budget: quick
0.05, standard 0.02, thorough 0.01) in the law of its cells with power 0.99, cells pooled by
expected counts only, a sample in a cell of target probability 0 a certain failure.

The battery (in run order), per declared scheme ``s``:

- ``randomness-source`` (contract): all randomness from ``generator``;
- ``exact-tree-step`` (only for functions taking ``uniforms=``): exact TV of one step on small
  trees (siblings, depth, branches) for every declared scheme — cannot flake;
- ``tree-siblings-s``: three or two children of the root (V = 4), the first 2 completed tokens;
- ``tree-branches-s``: ragged two-level trees (shapes (-1,-1,0,1,1), (-1,0,0), (-1,-1,1)), 3 tokens;
- ``tree-deep-s``: depth-3 trees on order-2 targets (chain, ragged, EAGLE-like), 4 tokens;
- ``tree-loop-s``: whole decoding loops with a fresh tree every call (shapes changing per call
  and per row), the first 4 tokens of every sequence;
- ``tree-acceptance-s`` (exact one-sided binomial): P(a root child is accepted) must not exceed
  ``Σ_t min(p(t), P(t is drafted at the root))`` — the emitted first token follows ``p`` and an
  accepted one was drafted, so no lossless rule can exceed this coupling bound; the message
  compares the mean accepted length with recursive rejection sampling's exact expectation;
- ``inputs-unchanged`` (contract);
- ``outputs-unaliased`` (contract): no call overwrote a tensor an earlier call returned.

The function runs in a worker process (:class:`specverify.auditing.guarded.GuardedTreeFunction`,
``isolation="process"``, the default of :func:`specverify.audit`) or in the audit's own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from specverify.auditing.checks import (
    Check,
    CheckKind,
    CheckResult,
    ChiSquareCheck,
    InputsUnchangedCheck,
    Plan,
    SequentialCheck,
    Tally,
    Verdict,
    binomial_detectable_rate,
    binomial_result,
    binomial_sample_size,
    ExactCase,
    declared_arithmetic_of,
    exact_cases_result,
    goodness_of_fit_result,
)
from specverify.auditing.faults import (
    Fault,
    FaultKind,
    probe_randomness,
    seed_global_rng,
    validate_tree_emitted,
)
from specverify.auditing.guarded import GuardedTreeFunction
from specverify.auditing.sampler import prefix_cell_counts, prefix_cells
from specverify.auditing.sampler_coverage import contract_checks
from specverify.core import tree_exact
from specverify.core.chains import MarkovBank, random_markov_chain
from specverify.core.rules import accepts_uniforms
from specverify.core.seeding import derive_seed
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


def declared_schemes(fn: Callable[..., Any]) -> tuple[str, ...]:
    """``fn.draft_schemes`` (SPEC §3), or all three schemes when the attribute is absent."""
    return parse_schemes(getattr(fn, "draft_schemes", None))


def parse_schemes(declared: Any) -> tuple[str, ...]:
    """The schemes of a ``draft_schemes`` value (None: all three); a malformed value is a Fault."""
    if declared is None:
        return DRAFT_SCHEMES
    schemes = (declared,) if isinstance(declared, str) else tuple(declared) if isinstance(declared, (tuple, list)) else ()
    unknown = [s for s in schemes if s not in DRAFT_SCHEMES]
    if unknown or not schemes:
        raise Fault("malformed", f"draft_schemes = {declared!r}: expected a non-empty tuple of "
                                 f"{', '.join(DRAFT_SCHEMES)}")
    return schemes


def tree_bank(name: str, vocab_size: int, order: int) -> MarkovBank:
    """The fixed bank of a check (seeded by its name): one Markov chain per entry of CLOSENESSES."""
    chains = [random_markov_chain(vocab_size, order, derive_seed("tree-bank", name, i) % 2**31, closeness=c)
              for i, c in enumerate(CLOSENESSES)]
    return MarkovBank(np.stack([c.target_table for c in chains]), np.stack([c.draft_table for c in chains]), order,
                       np.array([c.prompt for c in chains], dtype=np.int64).reshape(len(chains), order))


@dataclass
class TreeSession:
    """A guarded function plus the settings every tree check shares."""

    function: GuardedTreeFunction
    raw: Callable[..., Any]
    timeout_s: float
    schemes: tuple[str, ...]
    batch_rows: int = DEFAULT_TREE_ROWS
    scheme_error: str | None = None  # a malformed ``draft_schemes`` attribute (reported by randomness-source)


@dataclass
class TreeLawCheck(ChiSquareCheck):
    """One tree step per row (or whole loops), the first ``length`` completed tokens jointly
    (cells: chain × V^length) against the target's exact law."""

    name: str
    description: str
    bank: MarkovBank
    shapes: tuple[tuple[int, ...], ...]
    scheme: str
    length: int
    loop: bool = False
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.num_cells = self.bank.num_chains * self.bank.vocab_size**self.length
        self.parameters = {"scheme": self.scheme, "shapes": [list(s) for s in self.shapes],
                           "chain": f"markov order {self.bank.order}", "V": self.bank.vocab_size,
                           "chains": self.bank.num_chains, "L": self.length, "cells": self.num_cells,
                           "loop": self.loop}
        self.expected_accepted = None if self.loop else self._accepted_law()

    def _accepted_law(self) -> np.ndarray:
        """Law of the accepted path length under recursive rejection sampling, averaged over the
        (chain, shape) pairs the rows cycle through (:func:`tree_exact.ideal_tree_step_distribution`)."""
        depth = max(tree_exact.tree_depth(s) for s in self.shapes)
        law = np.zeros(depth + 1)
        for r in range(self.bank.num_chains):
            for shape in self.shapes:
                for emitted, prob in tree_exact.ideal_tree_step_distribution(self.bank.chain(r), shape,
                                                                             self.scheme).items():
                    law[len(emitted) - 1] += prob
        return law / law.sum()

    def draw(self, session: TreeSession, plan: Plan, n: int, look: int) -> Tally:
        sampler = sample_tree_runs if self.loop else sample_tree_steps
        sample = sampler(session.function, self.bank, shapes=self.shapes, scheme=self.scheme, length=self.length,
                         n=n, batch_rows=session.batch_rows, harness_seed=derive_seed(plan.seed, "harness", look),
                         function_seed=derive_seed(plan.seed, "function", look), where=self.name)
        counts = {"cells": prefix_cell_counts(self.bank, sample.chain, sample.tokens)}
        if not self.loop:
            depth = max(tree_exact.tree_depth(s) for s in self.shapes)
            counts["accepted"] = torch.bincount(sample.accepted, minlength=depth + 1)[: depth + 1].numpy()
        return Tally(n, counts)

    @functools.cached_property
    def cells(self) -> tuple[np.ndarray, tuple[str, ...]]:
        """The target's exact law of the cells (chain × first ``length`` tokens) and their labels."""
        return prefix_cells(self.bank, self.length)

    def judge(self, plan: Plan, tally: Tally, level: float, look: int | None) -> CheckResult:
        acceptance = None
        if not self.loop:
            acceptance = {"observed": tuple(float(c) for c in tally.counts["accepted"].tolist()),
                          "expected": tuple(float(e) for e in self.expected_accepted)}
        expected, labels = self.cells
        return goodness_of_fit_result(self, plan, tally.counts["cells"], expected, labels, acceptance, level=level,
                                      look=look)


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
    num_cells: ClassVar[int] = 2

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
    small trees for every declared scheme; only for functions taking ``uniforms=``."""

    name: str
    description: str
    cases: tuple[tuple[str, Any, tuple[int, ...], str], ...]  # (label, chain, shape, scheme)
    parameters: dict[str, Any] = field(init=False)
    kind: ClassVar[CheckKind] = CheckKind.EXACT

    def __post_init__(self) -> None:
        self.parameters = {"cases": [f"{label} {list(shape)} ({scheme}, V={chain.vocab_size})"
                                     for label, chain, shape, scheme in self.cases]}

    def run(self, session: TreeSession, plan: Plan) -> CheckResult:
        def rule(target_probs, draft_probs, tree_tokens, parents, generator=None, *, uniforms=None):
            try:
                result = session.raw(target_probs, draft_probs, tree_tokens, parents, None, uniforms=uniforms)
            except Exception as error:
                raise Fault("exception", f"the function (in {self.name}, with uniforms=) raised "
                                         f"{type(error).__name__}: {error}") from error
            return validate_tree_emitted(result, tree_tokens, parents, target_probs.shape[-1])[0]

        cases = [ExactCase(f"{label} {list(shape)} ({scheme})",
                           functools.partial(tree_exact.exact_tree_step_tv, rule, chain, shape, scheme),
                           len(shape), chain.vocab_size)
                 for label, chain, shape, scheme in self.cases]
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

    def __post_init__(self) -> None:
        self.parameters = {"shape": list(self.shape), "scheme": self.scheme, "V": self.bank.vocab_size,
                           "rows": self.rows}

    def run(self, session: TreeSession, plan: Plan) -> CheckResult:
        if session.scheme_error is not None:
            raise Fault("malformed", session.scheme_error)
        chain = torch.arange(self.rows) % self.bank.num_chains
        shape_of_row = torch.zeros(self.rows, dtype=torch.int64)
        drafted = draft_trees(self.bank, chain, self.bank.prompt_states(chain), padded_parents([self.shape], shape_of_row),
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


class TreeBattery:
    """SPEC §3 battery: tree steps and whole tree decoding loops, per declared sibling scheme."""

    level = "tree"

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

    def checks(self, session: TreeSession) -> list[Any]:
        schemes = session.schemes
        checks: list[Any] = [TreeRandomnessCheck(
            "randomness-source", "Randomness must come from the generator only: the same generator seed under other "
            "global RNG seeds gives the same output, and a second call with the advanced generator a new one.",
            tree_bank("randomness-source", 4, 1), (-1, -1, 0, 1), schemes[0], 512)]
        if accepts_uniforms(session.raw):
            exact_chain = random_markov_chain(3, 1, 1, closeness=0.0)
            checks.append(ExactTreeCheck(
                "exact-tree-step", "The function takes uniforms=, so one step's output law is integrated exactly over "
                "the uniforms on small trees for every declared scheme and compared with the target's.",
                tuple((label, exact_chain, shape, scheme) for scheme in schemes for label, shape in EXACT_SHAPES)))
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
            ]
        checks.append(InputsUnchangedCheck("inputs-unchanged", "No call may modify the tensors it is given."))
        checks += contract_checks()
        return checks
