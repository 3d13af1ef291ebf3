"""Greedy identity of Hugging Face models in any dtype: teacher-forced scoring and its noise.

The verdict is :func:`specverify.core.greedy_identity.judge` (whole-sequence identity: every
position of every candidate row against the target's argmax given the row's own prefix; see that
module for the gaps, margins and its two tests).  This module supplies its inputs for a Hugging
Face causal LM:

Scoring (:func:`check_identity`).  Each candidate row is scored by ONE teacher-forced pass of the
target over prompt + row (:func:`teacher_forced`) in the dtype under test; in float16/bfloat16
also by a float32 copy of the target: a token that is neither within the dtype's noise of the
dtype's argmax nor within the float32 noise of the float32 argmax is an error either way.  The
family-wise α is split over the references judged (Bonferroni).  In float32/float64 the dtype's
own pass decides alone with tolerance 0: identity is exact.

Noise (:func:`calibrate`).  The noise is measured on the same model, dtype, device and kernels by
running *plain* greedy decoding (``model.generate``, no speculation) in the shapes of
``batch_sizes`` (left padded) and re-scoring every run on its own tokens with each reference's
teacher-forced pass.  Every position is then aligned (both passes condition on the run's prefix),
and two noise values are read there, ``a, b`` being the reference's top-2:

    margin change  |Δ(ℓ[a] − ℓ[b])|  between the run's own logits and the reference's
    gap            ℓ_ref[a] − ℓ_ref[run's token]   (> 0 where rounding flipped the argmax)

Both are the model's own numeric paths against each other, noise the audit trusts, so the
tolerance is greedy identity's one rule (:func:`specverify.core.greedy_identity.noise_tolerance`)
with these as its trusted sample, no candidate sample and floor 0 (dense float logits):

    τ = max(largest margin change, largest gap)      tolerance = safety_factor · τ

The runs' gaps are also the noise sample of the divergent-positions test (plain greedy is a
lossless decoder along another path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specverify.core.greedy_identity import (
    DEFAULT_ALPHA,
    SAFETY_FACTOR,
    IdentityResult,
    NoiseTolerance,
    judge,
    noise_tolerance,
    score_logits,
)

EXACT_DTYPES = (torch.float32, torch.float64)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class GreedyRun:
    """One request's greedy decode: ``tokens`` int64 ``[N]`` and ``logits`` float32 ``[N, V]``,
    the logits each token was chosen from (on CPU)."""

    tokens: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class Noise:
    """One reference's rounding noise against plain greedy runs (module docstring).

    ``calibration``: the noise level τ and the exceedance tolerance; ``max_margin_change``,
    ``max_gap``: what τ was set from; ``gaps``: float64 ``[positions]``, the runs' gaps under the
    reference (the divergent-positions test's noise sample)."""

    reference: str
    calibration: NoiseTolerance
    max_margin_change: float
    max_gap: float
    gaps: np.ndarray

    @property
    def tau(self) -> float:
        return self.calibration.tau

    @property
    def tolerance(self) -> float:
        return self.calibration.tolerance

    @property
    def positions(self) -> int:
        return int(self.gaps.size)

    @property
    def divergent(self) -> int:
        return int((self.gaps > 0).sum())

    def summary(self) -> dict[str, Any]:
        return {"reference": self.reference, "tau": self.tau, "tolerance": self.tolerance,
                "max_margin_change": self.max_margin_change, "max_gap": self.max_gap,
                "safety_factor": self.calibration.safety_factor, "positions": self.positions,
                "divergent": self.divergent}


@dataclass(frozen=True)
class Calibration:
    """The noise of one model in one dtype on one device and kernel set: per reference (the dtype's
    own teacher-forced pass; the float32 copy's where given), from plain runs in ``shapes``."""

    dtype: str
    shapes: tuple[str, ...]
    noise: tuple[Noise, ...]

    @property
    def tolerance(self) -> float:
        """The exceedance tolerance of the dtype's own pass."""
        return self.noise[0].tolerance

    def summary(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shapes": list(self.shapes), "noise": [n.summary() for n in self.noise]}


@dataclass(frozen=True)
class IdentityReport:
    """Whole-sequence greedy identity of candidate rows, one :class:`IdentityResult` per reference;
    passed iff every reference passes."""

    dtype: str
    results: tuple[IdentityResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def positions(self) -> int:
        return self.results[0].positions

    @property
    def exceedances(self) -> int:
        """Positions with an exceedance under any reference."""
        return len({(d.row, d.position) for r in self.results for d in r.exceedances})

    def __str__(self) -> str:
        head = (f"greedy identity, {self.dtype}: {self.positions} positions compared, {self.exceedances} "
                f"exceedance(s): {'PASS' if self.passed else 'FAIL'}")
        return "\n".join([head] + [str(r) for r in self.results])


def _model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def greedy_decode(
    model: Any, prompts: Sequence[torch.Tensor], *, max_new_tokens: int, batch_size: int = 1, pad_token_id: int = 0
) -> list[GreedyRun]:
    """The model's own greedy decoding of each 1-D prompt, ``batch_size`` requests per call.

    Prompts are left padded to a common length; a last, short batch is filled up with copies of
    earlier prompts so that every call has the requested shape (the copies are discarded).
    End-of-sequence stopping is disabled, so every run has exactly ``max_new_tokens`` tokens.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size, max_new_tokens: expected >= 1, got {batch_size}, {max_new_tokens}")
    device = _model_device(model)
    runs: list[GreedyRun] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [prompts[(start + j) % len(prompts)] for j in range(batch_size)]
        width = max(p.numel() for p in chunk)
        input_ids = torch.full((batch_size, width), pad_token_id, dtype=torch.int64)
        attention_mask = torch.zeros((batch_size, width), dtype=torch.int64)
        for row, prompt in enumerate(chunk):
            input_ids[row, width - prompt.numel():] = prompt.reshape(-1).cpu()
            attention_mask[row, width - prompt.numel():] = 1
        out = model.generate(
            input_ids.to(device),
            attention_mask=attention_mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        logits = torch.stack(out.logits, dim=1).float().cpu()  # [batch, N, V]
        tokens = out.sequences[:, width:].cpu()
        for row in range(min(batch_size, len(prompts) - start)):
            runs.append(GreedyRun(tokens[row], logits[row]))
    return runs


@torch.no_grad()
def teacher_forced(model: Any, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The logits ``[N, V]`` (float32, CPU) at every one of the ``N`` tokens after ``prompt``, given
    the prompt and the tokens before it, in ONE forward pass over prompt + tokens."""
    tokens = tokens.reshape(-1).cpu()
    vocabulary = int(model.get_output_embeddings().weight.shape[0])
    if tokens.numel() == 0 or bool((tokens < 0).any() or (tokens >= vocabulary).any()):
        raise ValueError(f"tokens: expected a non-empty row of ids in [0, {vocabulary}), got {tokens.tolist()[:8]}...")
    sequence = torch.cat([prompt.reshape(-1).cpu(), tokens[:-1]]).to(_model_device(model))
    return model(sequence[None]).logits[0, prompt.numel() - 1:].float().cpu()


def _margin_changes(own: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """``|Δ(ℓ[a] − ℓ[b])|`` per position between two logits ``[N, V]``, ``a, b`` ``scored``'s top-2."""
    top2 = scored.topk(2, dim=-1).indices

    def difference(logits: torch.Tensor) -> torch.Tensor:
        logits = logits.double()
        return logits.gather(-1, top2[:, :1]) - logits.gather(-1, top2[:, 1:])

    return (difference(own) - difference(scored)).abs().reshape(-1)


def _noise(reference: str, model: Any, prompts: Sequence[torch.Tensor], runs: Sequence[GreedyRun],
           safety_factor: float) -> Noise:
    changes, gaps = [], []
    for prompt, run in zip(prompts, runs):
        scored = teacher_forced(model, prompt, run.tokens)
        changes.append(_margin_changes(run.logits, scored).numpy())
        gaps.append(score_logits("", run.tokens, scored).gaps)
    changes_array, gaps_array = np.concatenate(changes), np.concatenate(gaps)
    calibration = noise_tolerance(np.concatenate([changes_array, gaps_array]), safety_factor=safety_factor)
    return Noise(reference, calibration, float(changes_array.max(initial=0.0)), float(gaps_array.max(initial=0.0)),
                 gaps_array)


def calibrate(
    model: Any,
    prompts: Sequence[torch.Tensor],
    *,
    max_new_tokens: int,
    batch_sizes: Sequence[int] = (4,),
    float32_model: Any | None = None,
    pad_token_id: int = 0,
    safety_factor: float = SAFETY_FACTOR,
) -> Calibration:
    """The noise of ``model`` in its dtype and device: plain greedy runs of ``prompts`` in batches of
    each size in ``batch_sizes``, re-scored by the model's own teacher-forced pass and by
    ``float32_model``'s (module docstring)."""
    noise_tolerance(safety_factor=safety_factor)  # its argument errors before any decoding
    if model.dtype in EXACT_DTYPES:
        raise ValueError(f"model: {dtype_name(model.dtype)} needs no calibration (identity is exact: tolerance 0)")
    runs = {f"batch{size}": greedy_decode(model, prompts, max_new_tokens=max_new_tokens, batch_size=size,
                                         pad_token_id=pad_token_id) for size in batch_sizes}
    all_prompts = [p for _ in runs for p in prompts]
    all_runs = [run for shape in runs.values() for run in shape]
    references = [(f"{dtype_name(model.dtype)} teacher-forced", model)]
    if float32_model is not None:
        references.append(("float32 teacher-forced", float32_model))
    noise = tuple(_noise(name, ref, all_prompts, all_runs, safety_factor) for name, ref in references)
    return Calibration(dtype_name(model.dtype), tuple(runs), noise)


def check_identity(
    model: Any,
    prompts: Sequence[torch.Tensor],
    candidates: Sequence[torch.Tensor],
    *,
    calibration: Calibration | None = None,
    float32_model: Any | None = None,
    labels: Sequence[str] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> IdentityReport:
    """Whole-sequence greedy identity of ``candidates[i]`` (the new tokens after ``prompts[i]``).

    float32/float64 ``model``: exact (no noise, tolerance 0, the model's own teacher-forced pass).
    Otherwise ``calibration`` (:func:`calibrate`, same model, dtype, device and kernels) gives each
    reference's tolerance and noise sample, and ``float32_model`` is the float32 reference when the
    calibration measured one; α is split over the references."""
    if len(prompts) != len(candidates):
        raise ValueError(f"candidates: expected {len(prompts)} rows (one per prompt), got {len(candidates)}")
    labels = list(labels) if labels is not None else [str(i) for i in range(len(prompts))]
    dtype = dtype_name(model.dtype)
    if model.dtype in EXACT_DTYPES:
        references = [(f"{dtype} teacher-forced", model, noise_tolerance().tolerance, np.zeros(0))]
    else:
        if calibration is None or calibration.dtype != dtype:
            raise ValueError(f"calibration: a {dtype} model needs its calibrate() result (got "
                             f"{None if calibration is None else calibration.dtype})")
        if (float32_model is not None) != (len(calibration.noise) == 2):
            raise ValueError("float32_model: pass it exactly when the calibration measured the float32 reference")
        models = [model] + ([float32_model] if float32_model is not None else [])
        references = [(n.reference, m, n.tolerance, n.gaps) for n, m in zip(calibration.noise, models)]
    results = []
    for name, reference, tolerance, noise_gaps in references:
        rows = [score_logits(label, c, teacher_forced(reference, p, c)) for label, p,
                c in zip(labels, prompts, candidates)]
        results.append(judge(rows, tolerance=tolerance, noise_gaps=noise_gaps, alpha=alpha / len(references),
                             reference=name))
    return IdentityReport(dtype, tuple(results))
