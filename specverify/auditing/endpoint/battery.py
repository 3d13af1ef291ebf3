"""The endpoint level (SPEC §4): audit a running OpenAI-compatible completions server.

``specverify audit --level endpoint http://HOST:PORT/v1 [--baseline URL] [--model NAME]``

The target is the candidate server's ``/v1`` base URL (it runs speculative decoding); the
baseline serves the same model without it.  Before any check, :meth:`EndpointBattery.open_session`
checks that the servers answer, return logprobs (and, for the baseline, ``echo``), and serve the
same model: same tokenization of a probe prompt and the same first-token law (a prefill, which
speculation cannot touch) within :data:`MODEL_TOLERANCE` nats.
Any failure there is "could not audit" (exit 2) with the reason.

Checks, in order:

- ``greedy-identity`` (exact): prompts of five kinds (code, JSON, an edit of the prompt, prose,
  repetitive text that makes n-gram drafts fire), greedy, candidate vs baseline; every position
  scored by the baseline's logprobs given the candidate's own prefix, a gap beyond the tolerance
  of the measured rounding noise UNEXPLAINED (:mod:`~specverify.auditing.endpoint.greedy`);
- ``batch-invariance`` (exact): the candidate's greedy tokens alone and inside a concurrent burst;
- ``pit-T1-top8`` and ``pit-T0.7-top8`` (goodness of fit): sequential randomized PIT of sampled
  tokens under the target's law at each sampled prefix as the candidate returned it, the
  baseline's law there (``echo``) compared and reported (:class:`~specverify.auditing.endpoint.checks.PitCheck`);
- ``context-law-T1-top4`` (goodness of fit): the first 2 tokens of fixed prompts at T = 1, top-k 4,
  counted per context (prompt, earlier token) against the laws returned with them, χ² summed over
  contexts: deviations whose direction changes from context to context, which the PIT's pooled
  cells average out (drafts and acceptance tests sharing their random numbers), stay visible
  (:mod:`~specverify.auditing.endpoint.context_law`);
- ``pit-burst-mixed`` (goodness of fit; ``concurrency`` ≥ 2): bursts of ``concurrency`` requests
  sent at once, each with its own prompt, temperature, top-k and seed (some sharing a seed), PIT
  under each request's own law, and what the audit could see of their landing in one step;
- ``pit-pairs-n2`` (goodness of fit; where the server serves ``n = 2``): the two choices of one
  request are independent draws of the law (pairs of PIT values uniform on the unit square);
- ``two-sample-top-p`` (homogeneity; needs a baseline): T = 0.8, top-p 0.9, standard fields only,
  which the logprobs cannot express (engines apply top-p before or after temperature, and keep
  their own defaults such as llama.cpp's min-p 0.05), so the two servers' samples are compared;
- ``seed-reproducibility`` (contract): a seeded request alone, twice in a burst, alone again;
  judged only where the server promises seeded determinism (``seeded_determinism``), else reported
  (:mod:`~specverify.auditing.endpoint.bursts`);
- ``acceptance`` (contract): speculation counters per prompt kind, where exposed, checked for
  consistency (:class:`~specverify.auditing.endpoint.checks.AcceptanceCheck`); a failure is
  "contract violated": the counters misreport speculation.

The request space (``request_space=True``, the default; :mod:`~specverify.auditing.endpoint.request_space`,
:mod:`~specverify.auditing.endpoint.space_checks`): ``space-sampling-fields``, ``space-prompt-lengths``,
``space-prefixes`` (PIT per value of a dimension), ``space-load`` (per-context counts per burst size,
:mod:`~specverify.auditing.endpoint.load`), ``choices-joint`` (``n`` = 2, 4),
``space-penalties`` (with a baseline), ``stop-handling`` (exact) and ``request-space-coverage``,
the coverage table, last.

Out of reach of the PIT, and why: top-p (its order relative to temperature is engine-specific),
min-p, penalties, grammars and logit bias (processing the logprobs do not show), top-k above the
returned n (the mass of ranks n+1…k is unknown), and the full-vocabulary law at T = 1 (the value
that disables top-k differs between engines: 0, -1).  The two-sample check covers them.

Budgets (:data:`ENDPOINT_BUDGETS`): each PIT check detects TV ε on its PIT cells, the context
check a visit-weighted mean TV ε per token on its contexts' cells, the pairs check ε on its 16
cells, the two-sample check 2ε between the servers' joint laws, with power 0.99 at its
Bonferroni share of α (the six core statistical checks with a baseline, ``request_space=False``:
1.7e-4 each; each sized at its final look, 63/64 of the share); the greedy checks run
``GREEDY_TOKENS[budget]`` tokens per prompt.  The request-space checks detect ε per value
(docs/budgets.md has their sizes); with them twelve statistical checks share α.
Samples (requests) per core check at α = 1e-3 with a baseline, ``concurrency`` 4 and
``request_space=False``:

=========  =====  ===============  ================  ===============  ===============  =================  ======
budget     ε      each pit-T*      context (2 tok.)  burst (8 tok.)   pairs (n=2)      two-sample         greedy
=========  =====  ===============  ================  ===============  ===============  =================  ======
quick      0.1    1 373 (≈ 172+…)  1 904 (952)       1 373 (≈ 200)    1 561 (≈ 200)    781 (+ pilot 78)   24
standard   0.05   5 490 (≈ 686+…)  7 613 (3 807)     5 490 (≈ 784)    6 241 (≈ 780)    3 121 (+ 312)      48
thorough   0.025  21 960 (≈ 2 745) 30 452 (15 226)   21 960 (≈ 3 137) 24 963 (≈ 3 120) 12 482 (+ 1 248)   96
=========  =====  ===============  ================  ===============  ===============  =================  ======

(each pit-T* request on the candidate is followed by one ``echo`` request on the baseline; the
burst check's requests are 1/7 more than its u's need, for the companions that repeat a seed;
``seed-reproducibility`` sends 18 requests and the session's ``n = 2`` probe one.)

Deadlines: every request has ``timeout_s`` (``--timeout``); the run has ``deadline_s``
(``--deadline``; by default :func:`default_deadline_s`: 1 h for ``quick``, 4 h for ``standard``,
16 h for ``thorough`` without the request space, about twice what SmolLM2-135M on llama-cpp-python
needs on 2 CPU cores; 4 × those with it);
transient failures are retried (:mod:`~specverify.auditing.endpoint.client`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from specverify.auditing.audited import AuditSession
from specverify.auditing.checks import Battery
from specverify.auditing.endpoint.bursts import BurstPitCheck, ChoicePairsCheck, SeedReproducibilityCheck
from specverify.auditing.endpoint.checks import (
    NEUTRAL_PROCESSING,
    AcceptanceCheck,
    BatchInvarianceCheck,
    GreedyIdentityCheck,
    PitCheck,
    Prompt,
    TwoSampleCheck,
)
from specverify.auditing.endpoint.client import Completion, EndpointClient
from specverify.auditing.endpoint.context_law import ContextLawCheck
from specverify.auditing.endpoint.greedy import greedy_tolerance
from specverify.auditing.endpoint.load import LoadThresholdCheck
from specverify.auditing.endpoint.request_space import (
    PENALTIES,
    Coverage,
    field_cases,
    length_cases,
    load_cases,
    prefix_cases,
    probe_fields,
    record_field_support,
)
from specverify.auditing.endpoint.scoring import completion_laws, detect_offset, echo_body, prompt_boundary
from specverify.auditing.endpoint.space_checks import (
    CaseLawCheck,
    ChoicesJointCheck,
    CoverageCheck,
    PenaltyCheck,
    StopHandlingCheck,
)
from specverify.auditing.isolation.faults import Fault
from specverify.auditing.loading import LoadError
from specverify.auditing.sampler.battery import SampleBudget, resolve_budget
from specverify.core.greedy_identity import NoiseTolerance

ENDPOINT_BUDGETS: dict[str, float] = {"quick": 0.1, "standard": 0.05, "thorough": 0.025}
GREEDY_TOKENS: dict[str, int] = {"quick": 24, "standard": 48, "thorough": 96}
DEFAULT_DEADLINES_S = {"quick": 3600.0, "standard": 4 * 3600.0, "thorough": 16 * 3600.0}
SECONDS_PER_SAMPLE_DEADLINE = 3.0
"""An N-sample budget's default deadline: 3 s per sample of a check (quick: 1,309 PIT u's, 28 min
measured on the llama.cpp pair, ~1.3 s each), at least 1 h."""
DEFAULT_CONCURRENCY = 4
PIT_TOP_K = 8
PIT_TOKENS = 8
CONTEXT_TOP_K = 4
TWO_SAMPLE_TOKENS = 2


REQUEST_SPACE_DEADLINE_FACTOR = 4.0
"""The request space adds ≈ 10,700 requests at ``quick`` to the core's ≈ 2,340 (≈ 125 min more at the
≈ 0.7 s per request of the llama.cpp pair, estimated: ≈ 2.5 h in all), so its default deadlines are
4 × the core's."""


def default_deadline_s(budget: SampleBudget, request_space: bool = True) -> float:
    """The whole run's default deadline for ``budget`` (see the module docstring), ×
    :data:`REQUEST_SPACE_DEADLINE_FACTOR` with the request-space checks."""
    factor = REQUEST_SPACE_DEADLINE_FACTOR if request_space else 1.0
    if budget.name in DEFAULT_DEADLINES_S:
        return factor * DEFAULT_DEADLINES_S[budget.name]
    return factor * max(DEFAULT_DEADLINES_S["quick"], SECONDS_PER_SAMPLE_DEADLINE * (budget.samples or 0))


PROMPTS: tuple[Prompt, ...] = (
    Prompt("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"),
    Prompt("json", '{"name": "Ada Lovelace", "born": 1815, "fields": ["mathematics", "computing"], "name_upper":'),
    Prompt("edit", "Replace every 'cat' with 'dog': The cat sat on the mat and the cat was happy.\n"
                   "Result: The dog sat on the mat and"),
    Prompt("prose", "The history of the printing press begins in"),
    Prompt("repetitive", "red green blue, red green blue, red green blue, red green blue, red green"),
)
"""Greedy prompts, one per kind; none ends in a space (a trailing space re-tokenizes differently)."""

SAMPLING_PROMPTS: tuple[Prompt, ...] = (PROMPTS[3], PROMPTS[4])
MODEL_TOLERANCE = 0.5
"""Nats by which one model's first-token law may differ between two servers (rounding: up to ~0.25
on llama-cpp-python with a reused prefix cache; a different model or quantization: nats)."""
MODEL_PROBE = "The capital of France is Paris. The capital of Italy is"


@dataclass(frozen=True)
class EndpointTarget:
    """The candidate's base URL as given on the command line."""

    url: str


def check_url(url: str, what: str) -> str:
    """``url`` without a trailing slash; :class:`LoadError` unless it is an http(s) URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise LoadError(f"{what}: expected the server's base URL such as http://127.0.0.1:8000/v1, got {url!r}")
    return url.rstrip("/")


@dataclass
class EndpointSession(AuditSession):
    """The two servers' clients and what the checks learn along the way (the greedy tolerance, the
    baseline's own gaps under its echo, greedy runs)."""

    candidate: EndpointClient
    baseline: EndpointClient | None
    echo_offset: int | None
    timeout_s: float
    notes: list[str] = field(default_factory=list)
    greedy_noise: NoiseTolerance = field(default_factory=greedy_tolerance)
    """Greedy identity's tolerance (``greedy-identity`` measures it; until then the floor)."""
    noise_gaps: list[float] | None = None
    greedy_alone: list[Completion] | None = None
    choices: bool | str = True
    """True when the candidate serves ``n = 2``, else why not (its answer to the probe)."""
    fields: dict[str, str | None] = field(default_factory=dict)
    """Each optional field of the request space -> None (served) or the candidate's refusal."""
    four_choices: str | None = None
    """None when the candidate serves ``n = 4``, else its refusal."""
    context_length: int | None = None
    """The model's context in tokens (``--context-length``, else the server's ``GET /models``), or None."""
    coverage: Coverage = field(default_factory=Coverage)

    function: EndpointClient = field(init=False)
    """The audited function: the candidate's client."""

    def __post_init__(self) -> None:
        self.function = self.candidate

    def candidate_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        request = dict(body)
        if self.candidate.model is not None:
            request.setdefault("model", self.candidate.model)
        return request

    def baseline_laws(self, bodies: Sequence[Mapping[str, Any]],
                      completions: Sequence[Completion]) -> list[list[Mapping[str, float]] | None]:
        """The baseline's law at every token of each completion, re-scored with ``echo``; None
        without a baseline, or where the text re-tokenizes differently from the completion's tokens."""
        if self.baseline is None:
            return [None] * len(completions)
        echoes = self.baseline.complete_many([echo_body(b["prompt"] + c.text, int(b["logprobs"]))
                                              for b, c in zip(bodies, completions)])
        return [completion_laws(echo, body["prompt"], completion.tokens, self.echo_offset or 0)
                for body, completion, echo in zip(bodies, completions, echoes)]

    def close(self, grace_s: float | None = None) -> None:
        """Close both servers' clients."""
        self.candidate.close()
        if self.baseline is not None:
            self.baseline.close()


def serves_choices(client: EndpointClient) -> bool | str:
    """Whether ``client``'s server answers a sampled request with ``n = 2`` by two choices (True),
    else its answer (an HTTP error, one choice): ``n > 1`` is optional (llama.cpp's server refuses it)."""
    body = dict(NEUTRAL_PROCESSING, prompt=MODEL_PROBE, max_tokens=1, temperature=1.0, n=2, seed=1, logprobs=1)
    try:
        client.complete_choices(body)
    except Fault as fault:
        if fault.kind == "timeout" or client.down is not None:
            raise
        return fault.message
    return True


class EndpointBattery(Battery):
    """SPEC §4 battery (module docstring).  ``baseline``: the baseline's base URL (None: the
    candidate's own logprobs stand for the target's law); ``model``: the ``model`` field (default:
    the first id of the candidate's ``GET /models``); ``concurrency``: requests in flight at once
    (also the burst size of the load checks); ``deadline_s``: the whole run's deadline (None: by
    budget, :func:`default_deadline_s`); ``seeded_determinism``: the server promises that a seeded
    request gives the same tokens alone and in any batch (vLLM with ``VLLM_BATCH_INVARIANT=1``), so
    ``seed-reproducibility`` judges it (default False: reported, not judged); ``request_space``: run the
    request-space checks and the coverage table; ``request_space_only``: run only those (a coverage
    run, with a fixed budget at N samples per check)."""

    level = "endpoint"

    def __init__(self, baseline: str | None = None, model: str | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY, deadline_s: float | None = None,
                 seeded_determinism: bool = False, context_length: int | None = None,
                 request_space: bool = True, request_space_only: bool = False) -> None:
        if not (isinstance(concurrency, int) and not isinstance(concurrency, bool) and concurrency >= 1):
            raise ValueError(f"concurrency: expected a positive integer, got {concurrency!r}")
        if not isinstance(seeded_determinism, bool):
            raise ValueError(f"seeded_determinism: expected True (the server promises that a seeded request gives "
                             f"the same tokens alone and in any batch) or False, got {seeded_determinism!r}")
        self.seeded_determinism = seeded_determinism
        if context_length is not None and not (isinstance(context_length, int) and context_length > 16):
            raise ValueError(f"context_length: expected the model's context in tokens (an integer above 16), or None "
                             f"to read it from the server, got {context_length!r}")
        self.context_length = context_length
        if not isinstance(request_space, bool):
            raise ValueError(f"request_space: expected True (the request-space checks run) or False (the core "
                             f"battery only), got {request_space!r}")
        if not isinstance(request_space_only, bool) or (request_space_only and not request_space):
            raise ValueError(f"request_space_only: expected True (only the request-space checks and the coverage "
                             f"table; needs request_space=True, i.e. no --no-request-space) or False, got "
                             f"{request_space_only!r} with request_space={request_space!r}")
        self.request_space = request_space
        self.request_space_only = request_space_only
        if deadline_s is not None and not (isinstance(deadline_s, (int, float)) and deadline_s > 0):
            raise ValueError("deadline_s: expected a positive number of seconds (or None: "
                             f"by budget), got {deadline_s!r}")
        self.baseline_url = None if baseline is None else baseline
        self.model = model
        self.concurrency = concurrency
        self.deadline_s = None if deadline_s is None else float(deadline_s)
        self.budget_name = "standard"

    def resolve_budget(self, budget: str | int | SampleBudget) -> SampleBudget:
        """``quick`` / ``standard`` / ``thorough`` with :data:`ENDPOINT_BUDGETS`, or N samples per check."""
        if isinstance(budget, str) and budget.strip().lower() in ENDPOINT_BUDGETS:
            name = budget.strip().lower()
            resolved = SampleBudget(name, epsilon=ENDPOINT_BUDGETS[name])
        else:
            resolved = resolve_budget(budget)
        self.budget_name = resolved.name if resolved.name in GREEDY_TOKENS else "quick"  # N samples: quick's greedy
        if self.deadline_s is None:
            self.deadline_s = default_deadline_s(resolved, self.request_space)
        return resolved

    def load_target(self, spec: str) -> EndpointTarget:
        """The target string is a URL: nothing is imported."""
        url = check_url(spec, "target")
        if self.baseline_url is not None:
            check_url(self.baseline_url, "--baseline")
        return EndpointTarget(url)

    def open_session(self, target: EndpointTarget, *, device: str, timeout_s: float,
                     isolation: str = "process") -> EndpointSession:
        """Connect, check capabilities and model identity; :class:`LoadError` (exit 2) on any failure.
        ``isolation`` does not apply: the code under audit runs in the server, not in this process."""
        deadline = time.monotonic() + (self.deadline_s or DEFAULT_DEADLINES_S["standard"])
        candidate = EndpointClient(target.url, role="candidate", model=self.model, timeout_s=timeout_s,
                                   deadline=deadline, concurrency=self.concurrency)
        baseline = None if self.baseline_url is None else EndpointClient(
            check_url(self.baseline_url, "--baseline"), role="baseline", model=self.model, timeout_s=timeout_s,
            deadline=deadline, concurrency=self.concurrency)
        try:
            return self._probe(candidate, baseline, timeout_s)
        except Fault as fault:
            candidate.close()
            if baseline is not None:
                baseline.close()
            raise LoadError(f"could not audit the endpoint: {fault.message}") from fault

    def _probe(self, candidate: EndpointClient, baseline: EndpointClient | None, timeout_s: float) -> EndpointSession:
        for client in (candidate, baseline):
            if client is not None and client.model is None:
                names = client.models()
                client.model = names[0] if names else None
        first = candidate.complete({"prompt": MODEL_PROBE, "max_tokens": 1, "temperature": 0.0, "logprobs": 5})
        if not first.top_logprobs or not first.top_logprobs[0]:
            raise Fault("malformed", f"candidate server {candidate.base_url} returned no top_logprobs for logprobs=5")
        session = EndpointSession(candidate, baseline, None, timeout_s)
        session.choices = serves_choices(candidate)
        if session.choices is not True:
            session.notes.append(f"the candidate does not serve n = 2 choices per request ({session.choices}): "
                                 "pit-pairs-n2 not run")
        if self.request_space:
            self._probe_space(session)
        if baseline is None:
            session.notes.append("no baseline: the candidate's own logprobs stand for the target's law")
            return session
        offset = detect_offset(baseline, MODEL_PROBE, 5, MODEL_TOLERANCE)
        session.echo_offset = offset
        if offset:
            session.notes.append(f"the baseline's echo logprobs sit {offset} position(s) late (top_logprobs[i] is the "
                                 "law of token i+1, as llama-cpp-python 0.3.16 returns them); corrected")
        self._same_model(candidate, baseline, first)
        return session

    def _probe_space(self, session: EndpointSession) -> None:
        """The optional fields and ``n = 4`` the candidate serves, and the model's context."""
        candidate = session.candidate
        session.fields = probe_fields(candidate, MODEL_PROBE)
        record_field_support(session.coverage, session.fields, session.baseline is not None)
        session.four_choices = candidate.refusal(dict(NEUTRAL_PROCESSING, prompt=MODEL_PROBE, max_tokens=1,
                                                      temperature=1.0, n=4, seed=1))
        if session.choices is not True:
            session.coverage.missing("n", "2", f"the candidate does not serve n = 2 ({session.choices})")
        if session.four_choices is not None or session.choices is not True:
            session.coverage.missing("n", "4", f"the candidate does not serve n = 4 ({session.four_choices})")
        session.context_length = self.context_length or candidate.context_length()
        if session.context_length is None:
            session.coverage.missing("prompt length", "above 1,024 characters",
                                     "the server does not state its context (GET /models max_model_len): "
                                     "--context-length N sends prompts up to N tokens")
        if self.concurrency < 2:
            session.coverage.missing("load", "bursts of 2 or more", "concurrency 1: --concurrency N sends bursts")

    @staticmethod
    def _same_model(candidate: EndpointClient, baseline: EndpointClient, first: Completion) -> None:
        """Same tokenization of the probe (echo) and the same first-token law (prefill)."""
        reference = baseline.complete({"prompt": MODEL_PROBE, "max_tokens": 1, "temperature": 0.0, "logprobs": 5})
        try:
            echoes = [client.complete(echo_body(MODEL_PROBE, 5)) for client in (candidate, baseline)]
        except Fault as fault:
            raise Fault(fault.kind, f"echo=true is needed to score sampled prefixes and compare tokenizations: "
                                    f"{fault.message}") from fault
        cut = [prompt_boundary(e, MODEL_PROBE) for e in echoes]
        if cut[0] is None or cut[1] is None or echoes[0].tokens[:cut[0]] != echoes[1].tokens[:cut[1]]:
            raise Fault("malformed", f"the baseline serves a different model: it tokenizes the probe "
                                     f"{MODEL_PROBE!r} differently from the candidate "
                                     f"({list(echoes[1].tokens[:8])} vs {list(echoes[0].tokens[:8])})")
        a, b = first.top_logprobs[0] or {}, reference.top_logprobs[0] or {}
        shared = a.keys() & b.keys()
        worst = max((abs(a[t] - b[t]) for t in shared), default=float("inf"))
        if worst > MODEL_TOLERANCE:
            raise Fault("malformed", f"the baseline serves a different model: after the probe prompt its next-token "
                                     f"law differs from the candidate's (top tokens {max(b, key=b.__getitem__)!r} vs "
                                     f"{max(a, key=a.__getitem__)!r}, largest |Δ logprob| {worst:.3g} nats > "
                                     f"{MODEL_TOLERANCE}); a prefill cannot differ under speculation")

    def checks(self, session: EndpointSession) -> list[Any]:
        if self.request_space_only:
            return self.space_checks(session) + [self.coverage_check()]
        length = GREEDY_TOKENS[self.budget_name]
        burst = max(2, -(-self.concurrency // len(PROMPTS)))  # copies of each prompt per burst
        checks: list[Any] = [
            GreedyIdentityCheck(
                "greedy-identity",
                "Greedy: every token the candidate emits is the baseline's argmax given the candidate's prefix, "
                "except near-ties within the tolerance of the measured rounding noise (without a baseline: each "
                "token is the top-1 of its own logprobs).",
                PROMPTS, length, burst),
            BatchInvarianceCheck(
                "batch-invariance",
                "Greedy: the candidate's tokens for a prompt alone and inside a burst of concurrent requests agree, "
                "except at explained near-ties.",
                PROMPTS, length, burst),
            PitCheck("pit-T1-top8",
                     "T=1, top-k 8: the randomized PIT values of sampled tokens under the baseline's law at each "
                     "sampled prefix are i.i.d. uniform.", SAMPLING_PROMPTS, 1.0, PIT_TOP_K, PIT_TOKENS),
            PitCheck("pit-T0.7-top8",
                     "T=0.7, top-k 8: the randomized PIT values of sampled tokens under the baseline's law at each "
                     "sampled prefix are i.i.d. uniform.", SAMPLING_PROMPTS, 0.7, PIT_TOP_K, PIT_TOKENS),
            ContextLawCheck("context-law-T1-top4",
                            "T=1, top-k 4: the first 2 sampled tokens of fixed prompts, counted per context (prompt, "
                            "earlier token), follow the laws returned with them (χ² summed over contexts).",
                            SAMPLING_PROMPTS, 1.0, CONTEXT_TOP_K),
        ]
        if self.concurrency >= 2:
            checks.append(BurstPitCheck(
                "pit-burst-mixed",
                f"Bursts of {self.concurrency} concurrent requests, each with its own prompt, temperature, top-k and "
                "seed (some sharing a seed): the PIT values of every sampled token under its own request's law are "
                "i.i.d. uniform.", PROMPTS, self.concurrency, PIT_TOKENS))
        else:
            session.notes.append("concurrency 1: no bursts of concurrent requests (pit-burst-mixed not run)")
        if session.choices is True:
            checks.append(ChoicePairsCheck(
                "pit-pairs-n2",
                "Requests with n = 2: the PIT values of the two choices at each position are independent uniforms "
                "(4 x 4 cells of the unit square).", PROMPTS, self.concurrency, PIT_TOKENS))
        if session.baseline is not None:
            checks.append(TwoSampleCheck(
                "two-sample-top-p",
                "T=0.8, top-p 0.9 (standard fields only, engine defaults apply): the first 2 tokens' joint law is "
                "the same on candidate and baseline (χ² homogeneity, cells from a pilot run).",
                SAMPLING_PROMPTS, {"temperature": 0.8, "top_p": 0.9}, TWO_SAMPLE_TOKENS))
        if self.request_space:
            checks += self.space_checks(session)
        checks.append(SeedReproducibilityCheck(
            "seed-reproducibility",
            "A seeded sampled request gives the same tokens alone, twice inside a burst of other prompts, and alone "
            "again (judged only where the server promises seeded determinism).",
            PROMPTS, self.concurrency, PIT_TOKENS, self.seeded_determinism))
        checks.append(AcceptanceCheck(
            "acceptance", "Speculation counters per prompt kind where the server exposes them, checked for consistency "
            "(accepted ≤ drafted, one own token per pass, emitted tokens as counted).",
            PROMPTS, length))
        if self.request_space:
            checks.append(self.coverage_check())
        return checks

    @staticmethod
    def coverage_check() -> CoverageCheck:
        return CoverageCheck(
            "request-space-coverage",
            "The request space the audit reached: each dimension, the values reached with the evidence that the "
            "server took the path, and the values not covered with the flag that would cover them.")

    def space_checks(self, session: EndpointSession) -> list[Any]:
        """The checks of the request space (:mod:`~specverify.auditing.endpoint.request_space`)."""
        checks: list[Any] = [
            CaseLawCheck("space-sampling-fields",
                         "Per sampling-field value (temperature 0.5 and 1.3, top-p 0.8, min-p 0.1, no seed): the "
                         "randomized PIT of sampled tokens under that value's law, tested value by value.",
                         field_cases(SAMPLING_PROMPTS, session.fields)),
            CaseLawCheck("space-prompt-lengths",
                         "Per prompt length (40 characters up to the model's context): the randomized PIT of sampled "
                         "tokens, tested length by length (long prompts take other paths: chunked prefill).",
                         length_cases(session.context_length)),
            CaseLawCheck("space-prefixes",
                         "A prompt repeated and prompts sharing a long prefix (prefix-cache hits): the randomized PIT "
                         "of the first two sampled tokens, tested per pattern.", prefix_cases(PROMPTS)),
        ]
        if self.concurrency >= 2:
            checks.append(LoadThresholdCheck(
                "space-load",
                f"Bursts of exactly 1, 2, 4, … {self.concurrency} concurrent requests and back to 1: the first two "
                "sampled tokens, counted per context against the laws returned with them, tested side by side "
                "(paths switched by the number of requests verified together).",
                load_cases(SAMPLING_PROMPTS, self.concurrency)))
        choices = tuple(n for n, served in ((2, session.choices is True),
                                            (4, session.choices is True and session.four_choices is None)) if served)
        if choices:
            checks.append(ChoicesJointCheck(
                "choices-joint",
                "Requests with n = 2 and n = 4, seeded and not: disjoint pairs of choices are independent draws "
                "(joint PIT cells; identical first tokens against Σ p² under independence, exact).",
                PROMPTS, choices))
        penalties = tuple((name, value) for name, value in PENALTIES if session.fields.get(name) is None)
        if session.baseline is not None and penalties:
            checks.append(PenaltyCheck(
                "space-penalties",
                "Per penalty field: the number of repeated tokens among the first 8 has the same law on candidate "
                "and baseline (χ² homogeneity, field by field).", SAMPLING_PROMPTS, penalties))
        checks.append(StopHandlingCheck(
            "stop-handling",
            "max_tokens is exact, finish_reason is 'length' exactly when max_tokens tokens came back, no stop string "
            "is returned and nothing follows one, an end token is last.", PROMPTS))
        return checks


__all__ = ["ENDPOINT_BUDGETS", "EndpointBattery", "EndpointSession", "EndpointTarget", "PROMPTS"]
