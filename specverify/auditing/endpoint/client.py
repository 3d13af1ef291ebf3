"""HTTP client for an OpenAI-compatible completions server (SPEC §4), on ``httpx``.

Every request has a deadline (``timeout_s``: the whole exchange, body included, enforced while
the body streams in) and the run has one (``deadline``: a ``time.monotonic()`` instant after which
no request starts).  Transient failures are retried a bounded number of times with exponential
backoff: connection errors (refused, reset, a server closing the connection) and HTTP 429 / 502 /
503 / 504.  A timeout is not retried: a server that hung once is reported, not waited for again.
The connection pool is bounded by ``concurrency``; :meth:`EndpointClient.complete_many` sends at
most that many requests at once.

Everything that goes wrong becomes a :class:`~specverify.auditing.isolation.faults.Fault` whose message
names the server, the request and the fix: the audit turns it into "could not audit" (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from specverify.auditing.audited import AuditedFunction, CallCounts
from specverify.auditing.isolation.faults import Fault

RETRIED_STATUSES = (429, 502, 503, 504)
DEFAULT_RETRIES = 3
BACKOFF_S = 0.25
MAX_BODY_BYTES = 32 << 20
LIVENESS_S = 5.0
"""Seconds the ``GET /models`` after a server error may take to say the server still answers."""


@dataclass(frozen=True)
class Completion:
    """One choice of a ``/completions`` response.

    ``tokens``: the token strings of ``logprobs.tokens`` (echoed prompt tokens first when the
    request had ``echo``); ``token_logprobs[i]``: log p(token i | tokens before it) (``None`` for a
    first prompt token); ``top_logprobs[i]``: the returned alternatives at position i, token string
    -> logprob (``None`` where the server gives none).  Empty lists when no logprobs were asked.
    """

    text: str
    tokens: tuple[str, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[Mapping[str, float] | None, ...]
    finish_reason: str | None
    timings: Mapping[str, Any] | None = None
    sent: float | None = None
    """``time.monotonic()`` when the client sent the request (None for a parsed document)."""
    received: float | None = None
    """``time.monotonic()`` when the whole response had arrived."""
    prompt_tokens: int | None = None
    """The prompt's length in tokens as the server counted it (``usage.prompt_tokens``), or None."""


@dataclass
class RequestLog(CallCounts):
    """What the client sent: the :class:`~specverify.auditing.audited.CallCounts` (requests,
    tokens, seconds), the retries and the mutations the checks found."""

    retries: int = 0
    mutations: list[str] = field(default_factory=list)


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


class EndpointClient(AuditedFunction):
    """POSTs to ``{base_url}/completions`` (``base_url`` is the server's ``/v1`` base).  As the
    audited function (the candidate's client) it has no Python function (``raw`` is None) and no
    process of the audit's own."""

    raw = None

    def __init__(self, base_url: str, *, role: str, model: str | None, timeout_s: float, deadline: float,
                 concurrency: int = 4, retries: int = DEFAULT_RETRIES) -> None:
        if not (isinstance(concurrency, int) and concurrency >= 1):
            raise ValueError(f"concurrency: expected a positive integer, got {concurrency!r}")
        self.base_url = base_url.rstrip("/")
        self.role = role
        self.model = model
        self.timeout_s = float(timeout_s)
        self.deadline = deadline
        self.concurrency = concurrency
        self.retries = retries
        self.log: RequestLog = RequestLog()
        self.down: str | None = None
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout_s), limits=limits,
                                  transport=httpx.HTTPTransport(retries=1, limits=limits))

    def cut_off_at(self, moment: float | None) -> None:
        """No cutoff: a request ends by its own deadlines (``timeout_s`` and the audit's
        ``deadline``), and the endpoint level runs no check and no search after its verdict."""

    def close(self, grace_s: float | None = None) -> None:
        """Close the HTTP connections (``grace_s`` does not apply: there is no worker process)."""
        self._http.close()

    # ---------------------------------------------------------------------------------- requests

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> tuple[int, bytes]:
        """One exchange with a deadline on the whole of it; retries transient failures."""
        url = self.base_url + path
        for attempt in range(self.retries + 1):
            if self.down is not None:
                raise Fault("exception", self.down)
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise Fault("timeout", f"the audit's total deadline passed before {method} {url} could be sent "
                                       "(raise it with --deadline, or choose a smaller --budget)")
            limit = min(self.timeout_s, remaining)
            try:
                status, payload = self._exchange(method, url, body, limit)
            except httpx.TimeoutException as error:
                if limit < self.timeout_s:
                    raise Fault("timeout", f"the audit's total deadline passed during {method} {url} (raise it with "
                                           "--deadline, or choose a smaller --budget)") from error
                raise Fault("timeout", f"{self.role} server {self.base_url}: no complete response to {method} {path} "
                                       f"within {limit:.3g} s ({type(error).__name__}); raise the per-request "
                                       "deadline with --timeout if the server is merely slow") from error
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as error:
                if attempt < self.retries:
                    self.log.retries += 1
                    time.sleep(min(BACKOFF_S * 2**attempt, max(0.0, self.deadline - time.monotonic())))
                    continue
                where = (f"after {self.log.calls} successful request(s)" if self.log.calls
                         else "on the first request")
                self.down = (f"{self.role} server {self.base_url}: {method} {path} failed {where}, "
                             f"{self.retries + 1} attempts: {type(error).__name__}: {error or 'connection failed'} "
                             "(is the server running, and is the URL its /v1 base, e.g. http://127.0.0.1:8000/v1?)")
                raise Fault("exception", self.down) from error
            except httpx.HTTPError as error:
                raise Fault("exception", f"{self.role} server {self.base_url}: {method} {path}: "
                                         f"{type(error).__name__}: {error}") from error
            if status in RETRIED_STATUSES and attempt < self.retries:
                self.log.retries += 1
                time.sleep(min(BACKOFF_S * 2**attempt, max(0.0, self.deadline - time.monotonic())))
                continue
            return status, payload
        raise AssertionError("unreachable")

    def _exchange(self, method: str, url: str, body: Mapping[str, Any] | None, limit: float) -> tuple[int, bytes]:
        started = time.monotonic()
        chunks: list[bytes] = []
        size = 0
        with self._http.stream(method, url, json=body, timeout=httpx.Timeout(limit)) as response:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise Fault("malformed", f"{self.role} server {url}: response body over {MAX_BODY_BYTES >> 20} MiB")
                chunks.append(chunk)
                if time.monotonic() - started > limit:
                    raise httpx.ReadTimeout("the response body was still arriving at the deadline")
            return response.status_code, b"".join(chunks)

    def _json(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        status, payload = self._request(method, path, body)
        text = payload.decode("utf-8", errors="replace")
        if status >= 400:
            raise self._status_fault(status, method, path, body, text)
        try:
            return json.loads(text)
        except ValueError as error:
            raise Fault("malformed", f"{self.role} server {self.base_url}: {method} {path} returned a body that is "
                                     f"not JSON ({error}): {_excerpt(text, 120)!r}") from error

    def _status_fault(self, status: int, method: str, path: str, body: Mapping[str, Any] | None, text: str) -> Fault:
        """The fault of an HTTP error status: the request sent and the server's answer; after a
        server error (5xx), whether the server still answers (:meth:`_answers_after`)."""
        hint = " (is the URL the server's /v1 base?)" if status == 404 else ""
        sent = "" if body is None else f" for {json.dumps(_summary(body))}"
        message = (f"{self.role} server {self.base_url}: HTTP {status} from {method} {path}{sent}{hint}: "
                   f"{_excerpt(text)}")
        if status >= 500:
            message += self._answers_after(message)
        return Fault("exception", message)

    def _answers_after(self, failure: str) -> str:
        """Whether the server still answers ``GET /models`` right after a server error, as a clause
        for the error's message; when it does not, the client is :attr:`down` (the request ended
        the server: every later request fails at once with ``failure``)."""
        limit = max(0.1, min(LIVENESS_S, self.deadline - time.monotonic()))
        try:
            status, _ = self._exchange("GET", self.base_url + "/models", None, limit)
        except (httpx.HTTPError, Fault) as error:
            self.down = f"{failure}; the server no longer answers (GET /models: {type(error).__name__})"
            return f"; the server no longer answers (GET /models: {type(error).__name__}): this request ended it"
        return f"; the server still answers (GET /models: HTTP {status})"

    def complete(self, body: Mapping[str, Any]) -> Completion:
        """POST one completion request (``model`` is added) and parse its first choice."""
        return self.complete_choices(body)[0]

    def complete_choices(self, body: Mapping[str, Any]) -> list[Completion]:
        """POST one completion request and parse all its choices, in ``index`` order (``n``
        of them when the request asks for ``n``), each stamped with the exchange's ``sent`` and
        ``received`` instants."""
        request = dict(body)
        if self.model is not None:
            request.setdefault("model", self.model)
        started = time.perf_counter()
        sent = time.monotonic()
        document = self._json("POST", "/completions", request)
        received = time.monotonic()
        self.log.function_seconds += time.perf_counter() - started
        choices = [dataclasses.replace(c, sent=sent, received=received)
                   for c in parse_choices(document, self.role, self.base_url, request)]
        self.log.calls += 1
        self.log.rows += sum(len(c.tokens) for c in choices)
        return choices

    def complete_many(self, bodies: Sequence[Mapping[str, Any]]) -> list[Completion]:
        """The completions of ``bodies`` in order, at most ``concurrency`` in flight at once."""
        return [choices[0] for choices in self.complete_many_choices(bodies)]

    def complete_many_choices(self, bodies: Sequence[Mapping[str, Any]]) -> list[list[Completion]]:
        """:meth:`complete_choices` of each of ``bodies``, in order, at most ``concurrency`` in
        flight at once (a burst of ``concurrency`` bodies is sent all at once)."""
        if len(bodies) <= 1 or self.concurrency == 1:
            return [self.complete_choices(body) for body in bodies]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(bodies))) as pool:
            futures = [pool.submit(self.complete_choices, body) for body in bodies]
            try:
                return [future.result() for future in futures]
            finally:
                for future in futures:
                    future.cancel()

    def refusal(self, body: Mapping[str, Any]) -> str | None:
        """None when the server completes ``body``; its answer when it refuses it with HTTP 4xx (a
        field it does not support); :class:`Fault` on anything else."""
        request = dict(body)
        if self.model is not None:
            request.setdefault("model", self.model)
        status, payload = self._request("POST", "/completions", request)
        self.log.calls += 1
        if 400 <= status < 500:
            return f"HTTP {status}: {_excerpt(payload.decode('utf-8', errors='replace'), 160)}"
        if status >= 500:
            raise self._status_fault(status, "POST", "/completions", request, payload.decode("utf-8", "replace"))
        return None

    def context_length(self) -> int | None:
        """The model's context in tokens as ``GET /models`` states it (vLLM's ``max_model_len``,
        llama.cpp's ``meta.n_ctx_train``), or None (also when the server has no ``/models``)."""
        try:
            document = self._json("GET", "/models", None)
        except Fault as fault:
            if fault.kind == "timeout" or self.down is not None:
                raise
            return None
        data = document.get("data") if isinstance(document, dict) else None
        for entry in data if isinstance(data, list) else []:
            if not isinstance(entry, dict) or (self.model is not None and entry.get("id") != self.model):
                continue
            meta = entry["meta"] if isinstance(entry.get("meta"), dict) else {}
            for value in (entry.get("max_model_len"), meta.get("n_ctx_train")):
                if isinstance(value, int) and value > 0:
                    return value
        return None

    def models(self) -> list[str]:
        """The ids of ``GET /models`` (an empty list if the server lists none)."""
        document = self._json("GET", "/models", None)
        data = document.get("data") if isinstance(document, dict) else None
        if not isinstance(data, list):
            return []
        return [str(entry["id"]) for entry in data if isinstance(entry, dict) and "id" in entry]

    def metrics(self) -> str | None:
        """The Prometheus text of ``GET /metrics`` at the server root, or None when there is none."""
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        try:
            response = self._http.get(root + "/metrics", timeout=min(self.timeout_s, 10.0))
        except httpx.HTTPError:
            return None
        if response.status_code != 200 or "text/plain" not in response.headers.get("content-type", "text/plain"):
            return None
        return response.text


def _summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request without its (long) prompt, for error messages."""
    shown = {k: v for k, v in body.items() if k != "prompt"}
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        shown["prompt"] = prompt if len(prompt) <= 40 else prompt[:40] + "…"
    return shown


def parse_completion(document: Any, role: str, base_url: str, request: Mapping[str, Any]) -> Completion:
    """The first choice of a ``/completions`` response; :class:`Fault` ``malformed`` when a field the
    request asked for is missing or of the wrong type."""
    return parse_choices(document, role, base_url, request)[0]


def parse_choices(document: Any, role: str, base_url: str, request: Mapping[str, Any]) -> list[Completion]:
    """Every choice of a ``/completions`` response in ``index`` order (all of them, or exactly
    ``n`` when the request asks for ``n``); :class:`Fault` ``malformed`` as :func:`parse_completion`."""
    where = f"{role} server {base_url}: POST /completions"
    choices = document.get("choices") if isinstance(document, dict) else None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise Fault("malformed", f"{where}: the response has no choices[0] object: "
                    f"{_excerpt(json.dumps(document), 200)}")
    wanted = request.get("n")
    if wanted is not None and len(choices) != int(wanted):
        raise Fault("malformed", f"{where}: the request asked for n={wanted} choices, the response has {len(choices)}")
    indices = [c.get("index", i) for i, c in enumerate(choices)]
    if not all(isinstance(i, int) for i in indices) or sorted(indices) != list(range(len(choices))):
        raise Fault("malformed", f"{where}: the choices' index fields are {indices}, expected 0…{len(choices) - 1}")
    timings = document.get("timings") if isinstance(document.get("timings"), dict) else None
    usage = document.get("usage") if isinstance(document.get("usage"), dict) else {}
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    ordered = [choices[indices.index(i)] for i in range(len(choices))]
    return [dataclasses.replace(_parse_choice(choice, index, where, request, timings), prompt_tokens=prompt_tokens)
            for index, choice in enumerate(ordered)]


def _parse_choice(choice: Mapping[str, Any], index: int, where: str, request: Mapping[str, Any],
                  timings: Mapping[str, Any] | None) -> Completion:
    text = choice.get("text")
    if not isinstance(text, str):
        raise Fault("malformed", f"{where}: choices[{index}].text is {type(text).__name__}, expected a string")
    if request.get("logprobs") is None:
        return Completion(text, (), (), (), choice.get("finish_reason"), timings)
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise Fault("malformed", f"{where}: the request asked for logprobs={request.get('logprobs')} but "
                                 f"choices[{index}].logprobs is {json.dumps(logprobs)}: this check needs a server that "
                                 "returns logprobs (vLLM, SGLang, llama.cpp do)")
    tokens, token_logprobs, top = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if not (isinstance(tokens, list) and isinstance(token_logprobs, list) and len(tokens) == len(token_logprobs)):
        raise Fault("malformed", f"{where}: logprobs.tokens / logprobs.token_logprobs missing or of different lengths")
    if not isinstance(top, list) or len(top) != len(tokens):
        raise Fault("malformed", f"{where}: logprobs.top_logprobs missing or not one entry per token "
                                 f"(got {type(top).__name__})")
    values: list[float | None] = []
    for value in token_logprobs:
        if value is not None and not (isinstance(value, (int, float)) and not math.isnan(value)):
            raise Fault("malformed", f"{where}: token logprob {value!r} is not a number")
        values.append(None if value is None else float(value))
    alternatives: list[Mapping[str, float] | None] = []
    for entry in top:
        if entry is None:
            alternatives.append(None)
        elif isinstance(entry, dict) and all(isinstance(v, (int, float)) for v in entry.values()):
            alternatives.append({str(k): float(v) for k, v in entry.items()})
        else:
            raise Fault("malformed", f"{where}: a top_logprobs entry is not a token -> logprob object: "
                                     f"{_excerpt(json.dumps(entry), 120)}")
    if not all(isinstance(t, str) for t in tokens):
        raise Fault("malformed", f"{where}: logprobs.tokens holds non-strings")
    return Completion(text, tuple(tokens), tuple(values), tuple(alternatives), choice.get("finish_reason"), timings)
