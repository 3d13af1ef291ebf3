"""Sampling parameters: temperature, top-k, top-p, min-p; one function shared by draft and target.

Speculative decoding is lossless only if ``q`` passed to the verification rule is the law the
draft token was really drawn from, and ``p`` the law the user asked the target to sample from
(Leviathan et al. 2023 §2.3: temperature, top-k and nucleus sampling are sampling from an
adjusted distribution, and speculative sampling applies to it unchanged).  So the
draft and the target must go through *the same* transform: :func:`process_logits`.

Order (each step acts on the output of the previous one):

1. temperature ``T``: ``softmax(logits / T)``; ``T == 0`` is greedy, a one-hot at ``argmax``
   (``torch.argmax``: the first maximal index on ties), and the filters below are then no-ops;
2. top-k: keep the tokens whose scaled logit is ``>=`` the k-th largest;
3. top-p (nucleus, Holtzman et al. 2020): keep the smallest set of highest-probability tokens
   whose mass is ``>= top_p`` (at least one token), measured on the top-k-renormalised law;
4. min-p: keep the tokens with ``p >= min_p * max(p)``;
5. renormalise.

Tie rule (deterministic, and a function of the values only, so that permuting the vocabulary
permutes the output): every cut-off keeps *all* tokens tied with the last kept value, so top-k
may keep more than k tokens and top-p more than the minimal number when values tie at the edge.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch


def process_logits(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> torch.Tensor:
    """Turn logits ``[..., V]`` into float32 sampling probabilities ``[..., V]`` (see module doc).

    ``top_k=None``, ``top_p=None`` (or 1) and ``min_p=None`` (or 0) mean no filtering.  Logits may
    be ``-inf`` (banned tokens) but not NaN or ``+inf``, and each row needs one finite logit.
    Computation is in float32 (float64 input stays float64 until the final cast).
    """
    _validate_sampling_arguments(temperature, top_k, top_p, min_p)
    _validate_logits(logits)
    work_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = logits.to(work_dtype)
    if temperature == 0:
        greedy = scores.argmax(-1, keepdim=True)
        return torch.zeros_like(scores, dtype=torch.float32).scatter_(-1, greedy, 1.0)

    # subtract the max first so that a tiny temperature cannot overflow to inf
    scaled = (scores - scores.amax(-1, keepdim=True)) / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth_largest = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth_largest, -math.inf)
    probs = torch.softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1:
        probs = _keep_nucleus(probs, top_p)
    if min_p is not None and min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    return probs.to(torch.float32)


def _keep_nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all tokens below the nucleus cut-off (the caller renormalises).

    Sorted descending, the cut-off is the probability of the first token at which the cumulative
    mass (float64) reaches ``top_p``; all tokens ``>=`` the cut-off are kept (ties included).  If
    rounding keeps the cumulative mass below ``top_p`` to the end, everything is kept.  min-p
    compares with the maximum, so it needs no renormalisation in between.
    """
    sorted_probs = probs.sort(dim=-1, descending=True).values
    cumulative = sorted_probs.cumsum(-1, dtype=torch.float64)
    last_kept = (cumulative < top_p).sum(-1, keepdim=True).clamp(max=probs.shape[-1] - 1)
    cutoff = sorted_probs.gather(-1, last_kept)
    return probs.masked_fill(probs < cutoff, 0.0)


def _validate_sampling_arguments(temperature: Any, top_k: Any, top_p: Any, min_p: Any) -> None:
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: expected a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k: expected an integer >= 1, or None for no top-k filtering, got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p: expected a number in (0, 1], or None for no nucleus filtering, got {top_p!r}")
    if min_p is not None and (not _is_real(min_p) or not 0 <= min_p <= 1):
        raise ValueError(f"min_p: expected a number in [0, 1], or None for no min-p filtering, got {min_p!r}")


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _validate_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError("logits: expected a floating-point torch.Tensor of shape [..., V]")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits: expected shape [..., V] with V >= 1, got {list(logits.shape)}")
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError("logits: contains NaN or +inf; only -inf (a banned token) is allowed")
    if (logits.amax(-1) == -math.inf).any():
        raise ValueError("logits: a row has every logit = -inf, so no token can be sampled")


@dataclass(frozen=True)
class SamplingParams:
    """Temperature / top-k / top-p / min-p settings, validated at construction.

    ``apply(logits)`` is :func:`process_logits` with these settings; ``is_greedy`` is
    ``temperature == 0``.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        _validate_sampling_arguments(self.temperature, self.top_k, self.top_p, self.min_p)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities (float32, shape of ``logits``) to sample the next token from."""
        return process_logits(
            logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p
        )
