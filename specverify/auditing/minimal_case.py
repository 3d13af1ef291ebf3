"""A minimal failing case: one step's laws and draft tokens on which the function is visibly wrong,
printed as a unit test the user can paste (as Hypothesis prints a falsifying example).

A failing sampler check says the law of many steps, over drafts the harness drew and rows from
several chains, is wrong.  To hand the user something to debug, the audit takes the laws of one
chain of a failing check (``p_0 … p_K``, ``q_0 … q_{K−1}``, the float32 values it passed), fixes
the draft tokens, and calls the function once on :data:`MINIMAL_ROWS` copies of that one step
with a seeded generator.  With the drafts fixed, modified rejection sampling (Leviathan et al.
2023, Algorithm 1; the rule of docs/spec.md §1) emits, in column i, draft ``x_i`` with probability
``R_i·a_i`` (``R_i = Π_{j<i} a_j`` the probability of reaching it, ``a_i = min(1, p_i(x_i)/q_i(x_i))``),
a correction ``y`` with probability ``R_i·(1 − a_i)·r_i(y)`` (``r_i = norm(max(0, p_i − q_i))``), and
in column K the bonus token ``y`` with probability ``R_K·p_K(y)`` (:func:`conditional_law`); the
padding ``-1`` takes the rest.  The case reproduces when the observed share of one (column,
token) is more than :data:`REPRODUCE_Z` binomial standard errors from that law.

Candidates: the worst cell of the failing check (its chain and tokens) first, then the draft paths
the harness draws most often (a beam over q), at most :data:`MAX_CANDIDATES` calls in all, within
the audit's post-verdict budget (:mod:`specverify.auditing.post_verdict`): a call has
:data:`MINIMAL_ROWS` rows, or as many (in thousands) as the function evaluates in half the time
left at its measured rows/s (:func:`case_rows`), and none below :data:`MIN_ROWS`; a candidate is
not called when its expected time exceeds the time left, a call still running at the
deadline is stopped, and the case's reading against the catalog stops there too.  The
case is evidence for the reader, not a further test: the audit's verdict is the checks'.  A
correct modified-rejection rule reproduces a case with probability below 1e-6 (6 standard
errors over every cell of every candidate); a lossless rule that is *not* modified rejection
sampling may differ from this conditional law with the drafts fixed, which is why the case is
only looked for after a check has failed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specverify.auditing.checks import Check, CheckResult
from specverify.core.chains import ChainBank

MINIMAL_ROWS = 20_000
"""Copies of the step in the one call of a candidate (standard error ≤ 0.0036 per share)."""

REPRODUCE_Z = 6.0
"""Standard errors between the observed share and the law for a case to count as reproduced."""

MIN_ROWS = 1_000
"""The fewest rows a case is looked for with: 6 standard errors of a share are then ≤ 0.095 (≤ 0.048
for a share near 0.07), so a gross loss still shows; below it no case is attempted."""

MAX_CANDIDATES = 6
"""Calls of the function spent looking for a case."""

MAX_PRINTED_ENTRIES = 160
"""A case is printed only when its laws have at most this many entries ((2K+1)·V)."""


@dataclass(frozen=True)
class MinimalCase:
    """One step on which the function is wrong: the laws and drafts passed (float32 values), the
    seed, and the (column, token) whose share is furthest from modified rejection sampling's law."""

    target: str
    check: str
    chain: int
    target_probs: tuple[tuple[float, ...], ...]
    draft_probs: tuple[tuple[float, ...], ...]
    draft_tokens: tuple[int, ...]
    rows: int
    seed: int
    column: int
    token: int
    expected: float
    observed: float
    z: float
    follows: str = ""
    """Which wrong law the tokens at ``column`` follow (:func:`specverify.auditing.diagnosis.followed_law`)."""
    closest: str = ""
    """The closest catalog entry (:func:`specverify.auditing.diagnosis.closest_catalog_entry`)."""

    @property
    def tolerance(self) -> float:
        return REPRODUCE_Z * math.sqrt(self.expected * (1 - self.expected) / self.rows)

    @property
    def impossible(self) -> bool:
        """The function emitted a token that modified rejection sampling never emits here."""
        return self.expected == 0.0

    def sentence(self) -> str:
        token = "no token (-1)" if self.token < 0 else f"token {self.token}"
        against = ("which modified rejection sampling never emits given these drafts" if self.impossible else
                   f"against {self.expected:.4f} under modified rejection sampling ({self.z:.1f} standard errors)")
        return (f"minimal failing case (from {self.check}, chain {self.chain}): with draft tokens "
                f"{list(self.draft_tokens)} fixed, position {self.column} gets {token} in {self.observed:.4f} of "
                f"{self.rows:,} rows, {against}; seed {self.seed}")

    def code(self, replay: str = "") -> str:
        """A pytest test reproducing the case (fails on the function, passes on a correct rule),
        importing the function as the user's own tests do (:func:`specverify.auditing.replay.import_code`);
        ``replay``: the command that finds the case again from the audit's seed."""
        from specverify.auditing.replay import import_code

        name = re.sub(r"\W+", "_", f"{self.check}_chain{self.chain}").strip("_")
        k, v = len(self.draft_tokens), len(self.target_probs[0])
        token = "-1" if self.token < 0 else str(self.token)
        drafts = "q_0" if k == 1 else f"q_0..q_{k - 1}"
        if self.impossible:
            law = "# modified rejection sampling never emits it given these drafts"
            check = "assert share == 0, share"
        else:
            law = (f"# modified rejection sampling: {self.expected:.6f} given these drafts; "
                   f"this function gave {self.observed:.6f}")
            check = (f"assert abs(share - {self.expected:.9g}) <= {self.tolerance:.6g} + 1e-12, share"
                     "  # 6 standard errors")
        binding, function = import_code(self.target)
        test = textwrap.dedent(f"""\
            def test_{name}():
                # found by specverify: check {self.check}, chain {self.chain}, seed {self.seed}
                rows = {self.rows}
                # p_0..p_{k} [K+1={k + 1}, V={v}]
                target_probs = torch.tensor({_table(self.target_probs)}).repeat(rows, 1, 1)
                draft_probs = torch.tensor({_table(self.draft_probs)}).repeat(rows, 1, 1)  # {drafts}
                draft_tokens = torch.tensor([{list(self.draft_tokens)}]).repeat(rows, 1)
                generator = torch.Generator().manual_seed({self.seed})
                emitted = {function}(target_probs, draft_probs, draft_tokens, generator)
                share = (emitted[:, {self.column}] == {token}).double().mean().item()
                {law}
                {check}
            """)
        if replay:
            found = f"seed {self.seed}\n"
            test = test.replace(found, f"{found}    # found again from the audit's seed by: {replay}\n", 1)
        return f"import torch\n{binding}\n\n\n{test}"


def _table(rows: Sequence[Sequence[float]]) -> str:
    return "[" + ", ".join("[" + ", ".join(f"{value:.9g}" for value in row) + "]" for row in rows) + "]"


def conditional_law(p: np.ndarray, q: np.ndarray, drafts: Sequence[int]) -> np.ndarray:
    """``[K+1, V+1]``: the probability that modified rejection sampling emits token t (index V:
    the padding -1) in column i given ``p [K+1, V]``, ``q [K, V]`` and the draft tokens (see the
    module docstring; the correction and bonus laws normalised as the rule's inverse CDF does)."""
    k, v = q.shape
    law = np.zeros((k + 1, v + 1))
    reach = 1.0
    for i, token in enumerate(drafts):
        accept = 1.0 if q[i, token] <= 0 else min(1.0, p[i, token] / q[i, token])
        law[i, token] += reach * accept
        residual = np.maximum(p[i] - q[i], 0.0)
        if accept < 1.0 and residual.sum() > 0:
            law[i, :v] += reach * (1.0 - accept) * residual / residual.sum()
        law[i, v] += 1.0 - reach
        reach *= accept
    law[k, :v] = reach * p[k] / p[k].sum()
    law[k, v] = 1.0 - reach
    return law


def _path_laws(bank: ChainBank, chain: int, drafts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 ``p [K+1, V]`` and ``q [K, V]`` the harness passes for ``chain`` along ``drafts``."""
    from specverify.testing.harness import INPUT_DTYPE

    target, draft = bank.rows_in(INPUT_DTYPE)
    state = bank.initial_state(torch.tensor([chain]))
    rows = []
    for token in drafts:
        rows.append(bank.rows_of(state))
        state = bank.advance(state, torch.tensor([int(token)]))
    final = bank.rows_of(state)
    p = torch.cat([target[r] for r in rows] + [target[final]])
    q = torch.cat([draft[r] for r in rows]) if rows else draft[final][:0]
    return p, q


def candidate_paths(bank: ChainBank, chain: int, num_draft: int, preferred: Mapping[int, int],
                    limit: int) -> list[tuple[int, ...]]:
    """Draft paths to try: the one through ``preferred`` (position → token, the worst cell's
    tokens; the draft's most likely token elsewhere) first, then the ``limit`` most likely under
    q (a beam over positions)."""
    first: list[int] = []
    for i in range(num_draft):
        q = _path_laws(bank, chain, first + [0])[1][i].double().numpy()
        token = preferred.get(i)
        first.append(token if token is not None and q[token] > 0 else int(np.argmax(q)))
    beam: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for i in range(num_draft):
        grown = []
        for score, path in beam:
            q = _path_laws(bank, chain, list(path) + [0])[1][i].double().numpy()
            for token in np.argsort(-q, kind="stable")[:limit]:
                if q[token] > 0:
                    grown.append((score + math.log(q[token]), path + (int(token),)))
        beam = sorted(grown, key=lambda sp: -sp[0])[:limit]
    paths = [tuple(first)] + [path for _, path in beam]
    unique = list(dict.fromkeys(paths))
    return unique[:limit]


@dataclass(frozen=True)
class CaseSource:
    """A step the search may replay: chain ``chain`` of ``bank`` with ``num_draft`` drafts, the draft
    tokens to try first by position (the worst cell's), if any."""

    bank: ChainBank
    chain: int
    num_draft: int
    preferred: Mapping[int, int] = dataclasses.field(default_factory=dict)


class FailingStepSource(ABC):
    """A loss check whose failure the minimal-case search can narrow to single steps of its banks."""

    @abstractmethod
    def case_sources(self, result: CheckResult) -> list[CaseSource]:
        """The steps to replay after ``result`` failed, the most suspect first."""


def worst_cell_sources(bank: ChainBank, num_draft: int, window: tuple[int, int],
                       result: CheckResult) -> list[CaseSource]:
    """Every chain of ``bank``, the chain of the cell of ``result`` with the largest standardised
    deviation first, with that cell's tokens (labelled ``chain C tokens (t, …)`` over the positions
    of ``window`` = (start, length)) as its preferred draft tokens."""
    chain, preferred = _worst_cell(window, result)
    chains = [chain] + [c for c in range(bank.num_chains) if c != chain]
    return [CaseSource(bank, c, num_draft, preferred if c == chain else {}) for c in chains]


def _worst_cell(window: tuple[int, int], result: CheckResult) -> tuple[int, dict[int, int]]:
    """The chain and the draft-position tokens of the cell with the largest standardised deviation."""
    observed, expected, labels = result.observed, result.expected, result.cell_labels
    if not observed or not expected or not labels or len(observed) != len(expected):
        return 0, {}
    counts, law = np.asarray(observed, dtype=float), np.asarray(expected, dtype=float)
    n = counts.sum()
    if n <= 0:
        return 0, {}
    z = np.abs(counts - n * law) / np.sqrt(np.maximum(n * law, 1.0))
    match = re.match(r"chain (\d+) tokens \(([^)]*)\)", labels[int(np.argmax(z))])
    if match is None:
        return 0, {}
    chain = int(match.group(1))
    preferred = {}
    for offset, word in enumerate(match.group(2).split(",")):
        word = word.strip()
        if word.isdigit():
            preferred[window[0] + offset] = int(word)
    return chain, preferred


@dataclass(frozen=True)
class CaseSearch:
    """What the search found: the case (None: none), why none is shown (``note``, "" with a case),
    and whether the post-verdict deadline cut the search or the case's reading short.
    ``CaseSearch()``: no case was looked for (no loss at the sampler level), nothing to say."""

    case: MinimalCase | None = None
    note: str = ""
    cut_off: bool = False

    def outcome(self) -> str:
        """The post-verdict step's outcome, in words."""
        if self.case is None:
            return self.note
        unread = "; the closest catalog entry not read: the post-verdict deadline came first" if self.cut_off else ""
        return f"reproduced with {self.case.rows:,} rows a call{unread}"


def case_rows(rows_per_s: float | None, seconds_left: float) -> int:
    """Rows of one candidate call: :data:`MINIMAL_ROWS`, or the whole thousands the function
    evaluates in half of ``seconds_left`` at ``rows_per_s`` (None: not measured yet, the full
    size); 0 when that is below :data:`MIN_ROWS` or no time is left (no case is attempted)."""
    if seconds_left <= 0:
        return 0
    if rows_per_s is None:
        return MINIMAL_ROWS
    rows = min(MINIMAL_ROWS, int(rows_per_s * seconds_left / 2) // 1000 * 1000)
    return rows if rows >= MIN_ROWS else 0


def find_minimal_case(target: str, failing: Sequence[tuple[Check, CheckResult]], function: Any, seed: int, *,
                      rows: int = MINIMAL_ROWS, rows_per_s: float | None = None,
                      deadline: float | None = None) -> CaseSearch:
    """The first reproducing case over the failing ``(check, result)`` pairs, calling the guarded
    ``function`` at most :data:`MAX_CANDIDATES` times on ``rows`` copies of a step; else none and
    why.  ``deadline`` (a ``time.perf_counter()`` reading): no candidate starts whose expected
    time at ``rows_per_s`` runs past it, the function is cut off there (the caller sets the
    cutoff, :meth:`specverify.auditing.audited.AuditedFunction.cut_off_at`), and a case found is
    read against the catalog only until then."""
    from specverify.auditing.isolation.faults import CutOff
    from specverify.core.seeding import derive_seed
    from specverify.testing.harness import Proposal

    calls, stopped = 0, False
    best: tuple[MinimalCase, np.ndarray] | None = None  # the case furthest from the law, with its tokens
    for check, result in failing:
        sources = check.case_sources(result) if isinstance(check, FailingStepSource) else []
        for source in sources[:2]:
            bank, chain, k = source.bank, source.chain, source.num_draft
            if (2 * k + 1) * bank.vocab_size > MAX_PRINTED_ENTRIES or k < 1:
                continue
            for drafts in candidate_paths(bank, chain, k, source.preferred, limit=3):
                if calls >= MAX_CANDIDATES or stopped:
                    break
                expected_s = rows / rows_per_s if rows_per_s else 0.0
                if deadline is not None and time.perf_counter() + expected_s > deadline:
                    stopped = True
                    break
                case_seed = derive_seed(seed, "minimal-case", check.name, chain, list(drafts)) % 1_000_000
                p, q = _path_laws(bank, chain, drafts)
                proposal = Proposal(p.unsqueeze(0).repeat(rows, 1, 1), q.unsqueeze(0).repeat(rows, 1, 1),
                                    torch.tensor([list(drafts)]).repeat(rows, 1))
                try:
                    emitted = function(proposal, function.generator(case_seed),
                                       where=f"minimal case of {check.name}")[0]
                except CutOff:
                    stopped = True
                    break
                calls += 1
                case = _judge(target, check.name, chain, p, q, drafts, emitted, case_seed)
                if best is None or case.z > best[0].z:
                    best = (case, emitted.clamp(min=-1).numpy())
            if best is not None and best[0].z >= REPRODUCE_Z:
                return _read(*best, deadline)
    if calls == 0 and not stopped:
        return CaseSearch(None, "no failing check has a step small enough to print (a minimal case needs (2K+1)·V "
                                "≤ 160)", False)
    if stopped and calls == 0:
        return CaseSearch(None, f"the post-verdict deadline came before a call of {rows:,} rows could end (the "
                                "failing checks' cells are the evidence)", True)
    if stopped:
        return CaseSearch(None, f"the post-verdict deadline ended the search after {calls} call(s) of {rows:,} rows, "
                                "none reproducing the loss (the failing checks' cells are the evidence)", True)
    return CaseSearch(None, f"no single step with fixed drafts reproduced the loss in {calls} call(s) of {rows:,} "
                            "rows (it shows only over drafted or mixed rows: the failing checks' cells are the "
                            "evidence)", False)


def _judge(target: str, check: str, chain: int, p: torch.Tensor, q: torch.Tensor, drafts: Sequence[int],
           emitted: torch.Tensor, seed: int) -> MinimalCase:
    """The case of one candidate call: the (column, token) whose share in ``emitted`` is the most
    standard errors from :func:`conditional_law`."""
    law = conditional_law(p.double().numpy(), q.double().numpy(), drafts)
    k1, v1 = law.shape
    tokens = emitted.clamp(min=-1).numpy()
    rows = tokens.shape[0]
    observed = np.zeros_like(law)
    for column in range(k1):
        index = np.where(tokens[:, column] < 0, v1 - 1, tokens[:, column])
        observed[column] = np.bincount(index, minlength=v1)[:v1] / rows
    error = np.sqrt(np.maximum(law * (1 - law), 1e-300) / rows)
    z = np.where((law == 0) & (observed > 0), np.inf, np.abs(observed - law) / error)
    z = np.where((law == 0) & (observed == 0), 0.0, z)
    column, cell = map(int, np.unravel_index(int(np.argmax(z)), z.shape))
    return MinimalCase(target, check, chain, tuple(tuple(float(x) for x in row) for row in p.tolist()),
                       tuple(tuple(float(x) for x in row) for row in q.tolist()), tuple(int(t) for t in drafts), rows,
                       int(seed), int(column), -1 if cell == v1 - 1 else int(cell), float(law[column, cell]),
                       float(observed[column, cell]), float(min(z[column, cell], 1e9)))


def _read(case: MinimalCase, tokens: np.ndarray, deadline: float | None) -> CaseSearch:
    """A reproducing case with what its ``tokens`` (the function's output, ``[rows, K+1]``) show:
    the wrong law they follow and the closest catalog entry, the latter read only until
    ``deadline`` (past it the entry is not named and the search counts as cut off)."""
    from specverify.auditing.diagnosis import closest_catalog_entry, followed_law
    from specverify.auditing.isolation.faults import CutOff

    p64, q64 = np.array(case.target_probs), np.array(case.draft_probs)
    case = dataclasses.replace(case, follows=followed_law(p64, q64, case.draft_tokens, tokens, case.column))
    try:
        closest = closest_catalog_entry(p64, q64, case.draft_tokens, tokens, case.seed, deadline=deadline)
    except CutOff:
        return CaseSearch(case, "", True)
    return CaseSearch(dataclasses.replace(case, closest=closest), "", False)
