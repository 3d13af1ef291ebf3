"""The baseline's law at a sampled prefix, from ``echo`` + ``logprobs`` (SPEC §4).

Re-scoring: POST ``prompt + completion text`` with ``echo: true``, ``max_tokens: 1`` and
``logprobs: n``; the echoed tokens after the prompt must be the completion's own tokens (else the
text re-tokenized differently and the sampled path cannot be scored there).

Servers disagree on where an echoed position's alternatives sit.  The OpenAI convention is
``top_logprobs[i]`` = the law of token i given the tokens before it (offset 0);
llama-cpp-python 0.3.16 returns the law of token i+1 there (offset 1), and pairs token i with a
logprob read from that next law.  :func:`detect_offset` settles it per server, before any
sampling, by comparing the echo of a greedy completion with the logprobs the server returned
while generating it, and refuses a server that matches neither convention.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specverify.auditing.endpoint.client import Completion, EndpointClient
from specverify.auditing.isolation.faults import Fault

PROBE_TOKENS = 6


def echo_body(text: str, logprobs: int) -> dict[str, object]:
    return {"prompt": text, "max_tokens": 1, "echo": True, "logprobs": logprobs, "temperature": 0.0}


def prompt_boundary(echo: Completion, prompt: str) -> int | None:
    """The number of echoed tokens that spell ``prompt`` (allowing leading special tokens such as
    BOS), or None when no token boundary falls at the prompt's end."""
    joined = ""
    for index, token in enumerate(echo.tokens):
        if joined.endswith(prompt):
            return index
        joined += token
    return len(echo.tokens) if joined.endswith(prompt) else None


def completion_laws(echo: Completion, prompt: str, tokens: Sequence[str],
                    offset: int) -> list[Mapping[str, float]] | None:
    """The echoed law at each of ``tokens`` (the completion after ``prompt``) under ``offset``, or
    None if the echo does not re-tokenize to exactly those tokens."""
    start = prompt_boundary(echo, prompt)
    if start is None or tuple(echo.tokens[start:start + len(tokens)]) != tuple(tokens):
        return None
    laws = []
    for j in range(len(tokens)):
        index = start + j - offset
        law = echo.top_logprobs[index] if 0 <= index < len(echo.top_logprobs) else None
        if not law:
            return None
        laws.append(law)
    return laws


def law_deviation(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Largest |Δ logprob| over the tokens both laws list (inf when they share fewer than two)."""
    shared = a.keys() & b.keys()
    return max(abs(a[t] - b[t]) for t in shared) if len(shared) >= 2 else float("inf")


def detect_offset(client: EndpointClient, prompt: str, logprobs: int, tolerance: float) -> int:
    """0 or 1: where ``client``'s echoed alternatives sit (module docstring): the offset whose echoed
    laws deviate least from the generation-time ones, if that is within ``tolerance`` nats (the
    two evaluations may round differently; the wrong offset compares different positions, which
    differ by nats); :class:`Fault` otherwise."""
    generated = client.complete({"prompt": prompt, "max_tokens": PROBE_TOKENS, "temperature": 0.0,
                                 "logprobs": logprobs, "repeat_penalty": 1.0, "repetition_penalty": 1.0})
    if not generated.tokens:
        raise Fault("malformed", f"{client.role} server {client.base_url}: a greedy request of {PROBE_TOKENS} tokens "
                                 "returned no tokens")
    echo = client.complete(echo_body(prompt + generated.text, logprobs))
    deviations = {}
    for offset in (0, 1):
        laws = completion_laws(echo, prompt, generated.tokens, offset)
        deviations[offset] = float("inf") if laws is None else max(
            law_deviation(e, g or {}) for e, g in zip(laws, generated.top_logprobs))
    best = min(deviations, key=deviations.__getitem__)
    if deviations[best] <= tolerance:
        return best
    raise Fault("malformed", f"{client.role} server {client.base_url}: the logprobs it returns with echo=true do "
                             "not match the ones it returned while generating the same tokens (under the OpenAI "
                             "convention or shifted by one position), so its echo cannot score a sampled prefix")
