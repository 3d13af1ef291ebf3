"""The endpoint audit's request space: the dimensions it varies, the values it sends, what it saw.

A serving engine takes different paths for different requests: a sampling field applied by one
sampler and not another, long prompts prefilled in chunks, prompts that hit a prefix cache,
``n > 1`` choices run as sibling sequences, stop handling inside multi-token verification steps,
and batch sizes above which speculation changes (or stops).  A loss confined to one of those paths
is invisible to requests that never take it.  This module declares the dimensions
(:data:`DIMENSIONS`), the requests that reach each value (:class:`Case`, :func:`field_cases`,
:func:`length_cases`, :func:`prefix_cases`, :func:`load_cases`), and records per value whether the
audit reached it, with the evidence the server took the path, or why not and the flag that would
cover it (:class:`Coverage`, printed as the coverage table of the report).

Fields beyond docs/spec.md §4's standard ones (``top_k``, ``min_p``, the penalties, ``stop``) are an
extension: :func:`probe_fields` sends each once; a field the server refuses (HTTP 4xx) is *not
covered*, never silently skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specverify.auditing.endpoint.checks import NEUTRAL_PROCESSING, Prompt
from specverify.auditing.endpoint.client import EndpointClient
from specverify.core.seeding import derive_seed

DIMENSIONS: tuple[tuple[str, str], ...] = (
    ("temperature", "0 (greedy checks), 0.5, 0.7, 1, 1.3"),
    ("top_k", "4, 8, 16 (extension: logprob-exact laws need it)"),
    ("top_p", "0.8 (law from logprobs), 0.9 (two-sample vs baseline)"),
    ("min_p", "0.1 (extension)"),
    ("penalties", "presence_penalty 1, frequency_penalty 0.5, repetition_penalty 1.2 (extension; vs baseline)"),
    ("seed", "seeded, unseeded"),
    ("n", "1, 2, 4"),
    ("prompt length", "40 characters to min(16,384, context − max_tokens)"),
    ("prefix", "the same prompt repeated; prompts sharing a long prefix"),
    ("stop", "max_tokens exact, stop strings, finish_reason, nothing after an end token"),
    ("load", "bursts of 1, 2, 4, … up to --concurrency requests, then 1 again (first 2 tokens, per context)"),
)
"""(dimension, the values the audit sends) — the rows of the coverage table."""

OPTIONAL_FIELDS: dict[str, Any] = {"top_k": 8, "min_p": 0.1, "presence_penalty": 1.0, "frequency_penalty": 0.5,
                                   "repetition_penalty": 1.2, "stop": ["\n\n"]}
"""Fields outside docs/spec.md §4's standard set, each probed once with this value."""

PENALTIES: tuple[tuple[str, float], ...] = (("presence_penalty", 1.0), ("frequency_penalty", 0.5),
                                            ("repetition_penalty", 1.2))
PROMPT_LENGTHS: tuple[int, ...] = (40, 256, 1024, 4096, 16384)
"""Prompt lengths in characters; a prompt of c ASCII characters has at most c tokens (every
tokenizer spends at least one character per token on ASCII text), so a length ≤ context −
max_tokens always fits."""
UNKNOWN_CONTEXT_LIMIT = 1024
"""The longest prompt sent when neither the server nor ``--context-length`` states the context."""
SHARED_PREFIX = 512
"""Characters shared by the prompts of the shared-prefix value (several KV-cache blocks)."""
KNOWN_END_TOKENS = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|end_of_text|>", "<eos>")
"""End-of-sequence token strings of common tokenizers: a returned one must be the choice's last token."""

_WORDS = ("the", "river", "ledger", "of", "a", "quiet", "harbour", "kept", "seven", "lamps", "and", "merchants",
          "counted", "grain", "while", "clocks", "in", "towers", "rang", "over", "stone", "bridges", "to", "north",
          "winter", "markets", "opened", "early", "for", "travellers", "with", "maps", "songs", "letters")


def filler_text(characters: int, seed: object) -> str:
    """Deterministic prose of exactly ``characters`` ASCII characters, not ending in a space."""
    rng = np.random.default_rng(derive_seed("filler", seed) % (2**32))
    words: list[str] = []
    length = 0
    while length < characters + 1:
        sentence = " ".join(_WORDS[int(i)] for i in rng.integers(len(_WORDS), size=int(rng.integers(6, 14))))
        words.append(sentence.capitalize() + ".")
        length += len(words[-1]) + 1
    text = " ".join(words)[:characters]
    return text[:-1] + "s" if text.endswith(" ") else text


@dataclass(frozen=True)
class Case:
    """One value of one dimension and the requests that reach it: ``prompts`` in turn, the sampling
    settings whose processed law the logprobs give (temperature, top-k, and a top-p or min-p
    truncation), ``seeded`` or not, sent in bursts of exactly ``burst`` concurrent requests (one at a
    time for 1), or up to the client's concurrency when ``burst`` is None."""

    dimension: str
    value: str
    prompts: tuple[Prompt, ...]
    temperature: float = 1.0
    top_k: int = 8
    top_p: float = 1.0
    min_p: float = 0.0
    seeded: bool = True
    burst: int | None = None
    max_tokens: int = 8

    @property
    def label(self) -> str:
        return f"{self.dimension}={self.value}"

    def body(self, prompt: Prompt, seed: int) -> dict[str, Any]:
        body = dict(NEUTRAL_PROCESSING, prompt=prompt.text, max_tokens=self.max_tokens, temperature=self.temperature,
                    top_k=self.top_k, top_p=self.top_p, min_p=self.min_p, logprobs=max(self.top_k, 8))
        if self.seeded:
            body["seed"] = seed
        return body


def field_cases(prompts: tuple[Prompt, ...], supported: Mapping[str, str | None]) -> tuple[Case, ...]:
    """Sampling-field values whose law the logprobs give: temperatures other than the PIT checks'
    0.7 and 1, a top-p and a min-p truncation (at T = 1, top-k 16), and unseeded requests; a case
    whose extension field the server refused is left out (:func:`probe_fields` records it)."""
    cases = [Case("temperature", "0.5", prompts, temperature=0.5), Case("temperature", "1.3", prompts, temperature=1.3),
             Case("top_p", "0.8", prompts, top_k=16, top_p=0.8), Case("seed", "none", prompts, seeded=False)]
    if supported.get("min_p") is None:
        cases.insert(3, Case("min_p", "0.1", prompts, top_k=16, min_p=0.1))
    return tuple(cases)


def length_cases(context_length: int | None, max_tokens: int = 8) -> tuple[Case, ...]:
    """One case per prompt length of :data:`PROMPT_LENGTHS` that fits the context (the longest
    cut to it), up to :data:`UNKNOWN_CONTEXT_LIMIT` characters when the context is unknown."""
    limit = (context_length - max_tokens - 1) if context_length else UNKNOWN_CONTEXT_LIMIT
    lengths = sorted({min(c, limit) for c in PROMPT_LENGTHS if c <= limit or c == PROMPT_LENGTHS[-1]} - {0})
    lengths = [c for c in lengths if c >= PROMPT_LENGTHS[0]]
    return tuple(Case("prompt length", f"{c} chars", tuple(Prompt(f"filler-{c}-{i}", filler_text(c, (c, i)))
                                                         for i in range(3)), max_tokens=max_tokens) for c in lengths)


def prefix_cases(prompts: tuple[Prompt, ...]) -> tuple[Case, ...]:
    """The same long prompt every time (a full prefix-cache hit), and prompts that share
    :data:`SHARED_PREFIX` characters and end differently (a partial hit on another prompt's
    blocks): 2 tokens each, so the first token (the one a cache hit computes) is half of them."""
    shared = filler_text(SHARED_PREFIX, "shared-prefix") + "\n"
    return (Case("prefix", "repeated prompt", (Prompt("repeated", shared + prompts[0].text),), max_tokens=2),
            Case("prefix", "shared prefix", tuple(Prompt(f"shared+{p.kind}", shared + p.text) for p in prompts),
                 max_tokens=2))


def load_cases(prompts: tuple[Prompt, ...], concurrency: int) -> tuple[Case, ...]:
    """The sides of the load dimension: bursts of 1, 2, 4, … and ``concurrency`` concurrent
    requests, then of 1 again (the batch taken across any size threshold and back); T = 1, top-k 4,
    8 tokens (:mod:`~specverify.auditing.endpoint.load`)."""
    sizes = sorted({2**i for i in range(concurrency.bit_length()) if 2**i <= concurrency} | {concurrency})
    values = [(f"burst {s}", s) for s in sizes] + [("burst 1 again", 1)]
    return tuple(Case("load", value, prompts, top_k=4, burst=size)
                 for value, size in values)


def probe_fields(client: EndpointClient, prompt: str) -> dict[str, str | None]:
    """Each of :data:`OPTIONAL_FIELDS` sent once on a 1-token request: None where the server
    completes it, its refusal (HTTP 4xx) where it does not."""
    answers = {}
    for name, value in OPTIONAL_FIELDS.items():
        body = dict(NEUTRAL_PROCESSING, prompt=prompt, max_tokens=1, temperature=1.0, seed=1)
        body[name] = value
        answers[name] = client.refusal(body)
    return answers


@dataclass
class CoverageRow:
    """A dimension: the values the audit reached (value -> evidence the server took the path),
    and the values it did not (value -> why, and the flag or condition that would cover it)."""

    dimension: str
    sent: str
    reached: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"dimension": self.dimension, "values sent": self.sent, "reached": dict(self.reached),
                "not covered": dict(self.missing)}


@dataclass
class Coverage:
    """The coverage table: one :class:`CoverageRow` per dimension of :data:`DIMENSIONS`."""

    rows: dict[str, CoverageRow] = field(
        default_factory=lambda: {name: CoverageRow(name, sent) for name, sent in DIMENSIONS})

    def reached(self, dimension: str, value: str, evidence: str) -> None:
        self.rows[dimension].reached[value] = evidence
        self.rows[dimension].missing.pop(value, None)

    def missing(self, dimension: str, value: str, why: str) -> None:
        if value not in self.rows[dimension].reached:
            self.rows[dimension].missing[value] = why

    def table(self) -> str:
        """The rows as text: dimension, values reached with their evidence, values not covered."""
        lines = []
        for row in self.rows.values():
            reached = "; ".join(f"{v} ({e})" for v, e in row.reached.items()) or "nothing (its checks did not run)"
            lines.append(f"  {row.dimension}: reached {reached}")
            lines += [f"  {row.dimension}: NOT COVERED {v}: {why}" for v, why in row.missing.items()]
        return "\n".join(lines)

    def as_list(self) -> list[dict[str, Any]]:
        return [row.as_dict() for row in self.rows.values()]


def record_field_support(coverage: Coverage, supported: Mapping[str, str | None], has_baseline: bool) -> None:
    """The probe's refusals as "not covered" rows; penalties also need a baseline."""
    dimension_of = {"top_k": "top_k", "min_p": "min_p", "stop": "stop", "presence_penalty": "penalties",
                    "frequency_penalty": "penalties", "repetition_penalty": "penalties"}
    for name, refusal in supported.items():
        if refusal is not None:
            coverage.missing(dimension_of[name], f"{name}={OPTIONAL_FIELDS[name]}",
                             f"the candidate refuses the field ({refusal}); no flag covers it on this server")
        elif dimension_of[name] == "penalties" and not has_baseline:
            coverage.missing("penalties", f"{name}={OPTIONAL_FIELDS[name]}",
                             "the penalized law is engine-defined (which tokens count, before or after "
                             "temperature), so it is compared with the baseline's: add --baseline URL")


def prompt_token_range(counts: Sequence[int]) -> str:
    return (f"{min(counts)}–{max(counts)} prompt tokens as the server counted them" if counts
            else "the server reports no usage.prompt_tokens")


__all__ = [
    "DIMENSIONS",
    "KNOWN_END_TOKENS",
    "OPTIONAL_FIELDS",
    "PENALTIES",
    "PROMPT_LENGTHS",
    "Case",
    "Coverage",
    "CoverageRow",
    "field_cases",
    "filler_text",
    "length_cases",
    "load_cases",
    "prefix_cases",
    "probe_fields",
    "record_field_support",
]
