"""An in-process OpenAI-compatible completions server over an exact toy LM, for the endpoint tests.

The toy LM is character level (96 tokens: printable ASCII and newline).  Its raw next-token
logprobs after a context are a pure function of the last two characters (pseudo-random logits
seeded from them) plus an induction bonus for the character that followed the previous
occurrence of the last three, so repetitive prompts make n-gram drafts fire and continuations
repeat.  The law is computed in float64 and is identical in every request: τ = 0.

The candidate decodes speculatively: a draft toy LM (0.6 × the target's logits plus independent noise, a weaker induction bonus) proposes K = 3 tokens
from its processed law, and a SPEC §1 ``verify`` function (default the correct
:func:`specverify.core.rules.verify`; plant a catalog rule with ``rule=``) decides what is
emitted; at temperature 0 the drafts are checked by greedy matching (plant ``greedy_bug``: accept
a draft the target scores within a factor 2 of its argmax; ``batch_bug``: do that only while
another request is in flight).  The baseline samples from the processed law directly.

Processing (like vLLM): temperature, then top-k, top-p, min-p.  Returned logprobs are raw.
Fault switches: ``fault`` = ``"http500"`` | ``"no-logprobs"`` | ``"no-echo"`` | ``"slow"`` |
``"malformed"`` | ``"bad-counters"`` (the speculation counters count each pass's own token as an
accepted draft); ``die_after`` = N (the server closes its socket after N completion requests);
``echo_shift`` (echo alternatives one position late, as llama-cpp-python 0.3.16 returns them).

Numerics: ``path_noise`` = σ adds a deterministic N(0, σ²) perturbation, a pure function of the
context and of the numeric path, to the logprobs a server *returns* from a batched evaluation (the
candidate's verify pass, anyone's ``echo`` prefill), as batch-shape rounding does on real engines
(llama.cpp: up to ~0.5 nats between 1-token and 2…31-token batches); the tokens are unchanged.
A planted different law: ``law_temperature`` = T′ makes the candidate's target the toy LM at
temperature T′ (same argmax, so its greedy tokens stay the baseline's; only its logprobs differ).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import numpy as np
import torch

from specverify.core.rules import verify as correct_verify
from specverify.core.seeding import derive_seed

ALPHABET = tuple(chr(c) for c in range(32, 127)) + ("\n",)
INDEX = {c: i for i, c in enumerate(ALPHABET)}
V = len(ALPHABET)
NUM_DRAFT = 3
MAX_SLEEP_S = 5.0


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
                logits += np.random.default_rng(derive_seed("toy-noise", self.seed, key[0]) % (2**32)).standard_normal(V) * self.noise
            if follower >= 0:
                logits[follower] += self.induction
            cached = logits - np.logaddexp.reduce(logits)
            with self._lock:
                self._cache[key] = cached
        return cached


def process(logprobs: np.ndarray, temperature: float, top_k: int | None, top_p: float | None,
            min_p: float | None) -> np.ndarray:
    """Sampling law after temperature, top-k, top-p, min-p (temperature 0: one-hot argmax)."""
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
    echo_shift: bool = False
    slow_s: float = 3.0
    path_noise: float = 0.0
    law_temperature: float = 1.0


@dataclass
class ToyState:
    config: ToyConfig
    target: ToyLM
    draft: ToyLM
    requests: int = 0
    active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _top(logprobs: np.ndarray, n: int, token: int) -> dict[str, float]:
    order = np.argsort(-logprobs, kind="stable")[:n]
    top = {ALPHABET[i]: float(logprobs[i]) for i in order}
    top[ALPHABET[token]] = float(logprobs[token])
    return top


def generate(state: ToyState, prompt: list[int], max_tokens: int, params: dict[str, Any], seed: int,
             counters: dict[str, int]) -> list[int]:
    config = state.config
    temperature = float(params.get("temperature", 1.0))
    settings = (temperature, params.get("top_k"), params.get("top_p"), params.get("min_p"))
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    context, out = list(prompt), []
    accepted_flags: list[bool] = []
    while len(out) < max_tokens:
        if not config.speculative:
            probs = process(state.target.logprobs(context), *settings)
            token = int(rng.choice(V, p=probs))
            context.append(token)
            out.append(token)
            continue
        drafts, draft_probs, extended = [], [], list(context)
        for _ in range(NUM_DRAFT):
            q = process(state.draft.logprobs(extended), *settings)
            token = int(np.argmax(q)) if temperature == 0 else int(rng.choice(V, p=q))
            drafts.append(token)
            draft_probs.append(q)
            extended.append(token)
        target_probs = [process(state.target.logprobs(context + drafts[:i]), *settings) for i in range(NUM_DRAFT + 1)]
        if temperature == 0:
            emitted = _greedy_verify(state, drafts, [state.target.logprobs(context + drafts[:i])
                                                     for i in range(NUM_DRAFT + 1)])
        else:
            rule = config.rule or correct_verify
            result = rule(torch.tensor(np.array(target_probs))[None], torch.tensor(np.array(draft_probs))[None],
                          torch.tensor(drafts, dtype=torch.int64)[None], generator)
            emitted = [int(t) for t in result[0].tolist() if t >= 0]
        counters["draft_n"] += NUM_DRAFT
        own = 0 if config.fault == "bad-counters" else 1  # BUG when 0: the pass's own token counted as a draft
        accepted_flags += [True] * (len(emitted) - own) + [False] * own
        context.extend(emitted)
        out.extend(emitted)
        if config.batch_bug:
            time.sleep(0.002)
    counters["draft_n_accepted"] = sum(accepted_flags[:max_tokens])  # the accepted drafts it emitted
    return out[:max_tokens]


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


def completion(state: ToyState, body: dict[str, Any]) -> dict[str, Any]:
    config = state.config
    prompt_text = body.get("prompt", "")
    if not isinstance(prompt_text, str):
        raise ValueError("prompt must be a string")
    prompt = tokenize(prompt_text)
    max_tokens = int(body.get("max_tokens", 16))
    temperature = float(body.get("temperature", 1.0))
    seed = body.get("seed")
    seed = int(seed) if seed is not None else int(np.random.default_rng().integers(2**31))
    counters = {"draft_n": 0, "draft_n_accepted": 0}
    new = generate(state, prompt, max_tokens, body, seed, counters)
    text = "".join(ALPHABET[t] for t in new)
    echo = bool(body.get("echo"))
    logprobs = body.get("logprobs")
    choice: dict[str, Any] = {"index": 0, "text": (prompt_text if echo else "") + text, "finish_reason": "length",
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
    return {"id": "cmpl-toy", "object": "text_completion", "created": 0, "model": body.get("model", "toy"),
            "choices": [choice], "timings": dict(counters, predicted_n=len(new)) if config.speculative else None,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(new), "temperature": temperature}}


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
    server: "ToyServer"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, payload: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "toy", "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        state = self.server.state
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._send(404, b'{"error": "not found"}')
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
            count = state.requests
        try:
            payload = json.dumps(completion(state, body)).encode()
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
    """A toy server on 127.0.0.1 (free port) in a daemon thread; ``url`` is its ``/v1`` base."""

    daemon_threads = True

    def __init__(self, config: ToyConfig) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        if not config.law_temperature > 0:
            raise ValueError(f"law_temperature: expected a positive temperature, got {config.law_temperature!r}")
        target = ToyLM(config.lm_seed, scale=2.0 / config.law_temperature, induction=3.0 / config.law_temperature)
        self.state = ToyState(config, target, ToyLM(config.lm_seed, scale=1.2, induction=1.5, noise=1.0))
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._stopped = threading.Event()

    def start(self) -> "ToyServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self.shutdown()
            self.server_close()
