"""Greedy token identity under reduced precision: which divergences rounding explains.

In float32 a lossless speculative decoder's greedy output equals the target's own greedy output,
token for token (SPEC §2).  In float16/bfloat16 it need not: verifying K+1 positions in one pass
runs other kernels, reduction orders and paddings than decoding one token at a time, so the
target's logits differ by rounding noise, and where the two best logits are closer than that
noise the argmax may flip.  A flip is still a divergence, but an *explained* one.

The rule.  Let ``b`` be the baseline (the target's own greedy decoding, batch 1) with logits
``ℓ_t`` at step ``t``, and ``c`` the candidate (speculative) tokens.  At the first position ``t``
with ``c_t ≠ b_t``:

    margin = ℓ_t[top-1] − ℓ_t[top-2]          (the baseline's top-2 logit margin)
    gap    = ℓ_t[b_t]  − ℓ_t[c_t]  ≥ margin    (equal when c_t is the runner-up)

The divergence is explained iff ``gap ≤ τ``: the candidate chose a token that rounding noise of
size τ could have put on top.  After the first divergence the two rows condition on different
prefixes, so nothing further in that row is compared.  In float32 (and float64) no divergence is
explained: the outputs must be identical.

Calibrating τ (:func:`calibrate`).  τ is the size of the rounding noise on the margin, measured
on the same model, hardware and dtype by running *plain* greedy decoding (no speculation) against
itself in other shapes: each prompt inside batches of other sizes (left padded), and the
baseline's own tokens re-scored in one teacher-forced pass (the widest shape a verifier uses).
While two plain runs share a prefix, the change of the baseline's top-2 margin between them,
``|Δ(ℓ[a] − ℓ[b])|`` with ``a, b`` the baseline's top-2, is pure noise; where they diverge, the
baseline's gap is a realised noise value too.  Then

    τ = safety_factor × max(largest margin change, largest plain-vs-plain divergence gap)

with ``safety_factor = 2`` by default: the verifier's shapes are not exactly the calibration's,
and the largest of a few thousand noise draws understates the tail.  A bug that emits a token
the target does not prefer almost always shows a gap far above τ (whole logits, not ulps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_SAFETY_FACTOR = 2.0
EXACT_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class GreedyRun:
    """One request's greedy decode: ``tokens`` int64 ``[N]`` and ``logits`` float32 ``[N, V]``,
    the logits each token was chosen from (on CPU)."""

    tokens: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class Divergence:
    """The first position where a candidate row left the baseline.

    ``margin`` is the baseline's top-1 minus top-2 logit there, ``gap`` the baseline's top-1 logit
    minus its logit for the candidate's token; ``explained`` is ``gap ≤ tau`` (never in float32).
    """

    row: str
    position: int
    baseline_token: int
    candidate_token: int
    margin: float
    gap: float
    tau: float
    explained: bool


@dataclass(frozen=True)
class IdentityReport:
    """Greedy identity of candidate rows against the target's own greedy rows.

    ``passed`` is ``identical`` in float32/float64, and "every divergence explained" otherwise.
    """

    dtype: str
    tau: float
    rows: int
    tokens_compared: int
    divergences: tuple[Divergence, ...]

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def unexplained(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if not d.explained)

    @property
    def passed(self) -> bool:
        return not self.unexplained

    def __str__(self) -> str:
        head = (
            f"greedy identity, {self.dtype}: {self.rows} rows, {self.tokens_compared} tokens compared, "
            f"tau={self.tau:.4g}, {len(self.divergences)} divergence(s), {len(self.unexplained)} unexplained"
        )
        lines = [head] + [
            f"  row {d.row}: position {d.position}: baseline {d.baseline_token} vs candidate "
            f"{d.candidate_token}, margin {d.margin:.4g}, gap {d.gap:.4g}, "
            f"{'explained' if d.explained else 'UNEXPLAINED'} (tau {d.tau:.4g})"
            for d in self.divergences
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class Calibration:
    """τ for one model, dtype and device, from plain greedy decoding against itself.

    ``max_margin_change``: the largest change of the baseline's top-2 margin at aligned positions;
    ``max_divergence_gap``: the largest baseline gap at a plain-vs-plain divergence (0 if none);
    ``divergences``: those plain-vs-plain divergences; ``positions``: aligned positions measured;
    ``shapes``: the plain-decoding shapes compared with the batch-1 baseline.
    """

    tau: float
    max_margin_change: float
    max_divergence_gap: float
    safety_factor: float
    positions: int
    divergences: tuple[Divergence, ...]
    dtype: str
    shapes: tuple[str, ...]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _first_difference(baseline: torch.Tensor, candidate: torch.Tensor) -> int | None:
    differing = (baseline != candidate).nonzero()
    return int(differing[0, 0]) if differing.numel() else None


def divergence_at(
    row: str, position: int, baseline: GreedyRun, candidate_token: int, *, tau: float, exact: bool
) -> Divergence:
    """The :class:`Divergence` of a candidate that chose ``candidate_token`` at ``position``."""
    logits = baseline.logits[position].to(torch.float64)
    top2 = logits.topk(2).values
    baseline_token = int(baseline.tokens[position])
    gap = float(logits[baseline_token] - logits[candidate_token])
    return Divergence(
        row=row,
        position=position,
        baseline_token=baseline_token,
        candidate_token=candidate_token,
        margin=float(top2[0] - top2[1]),
        gap=gap,
        tau=tau,
        explained=not exact and gap <= tau,
    )


def compare_greedy(
    baseline: Sequence[GreedyRun],
    candidates: Sequence[torch.Tensor],
    *,
    tau: float,
    dtype: torch.dtype,
    labels: Sequence[str] | None = None,
) -> IdentityReport:
    """Compare candidate token rows with the baseline rows, position by position, up to each row's
    first divergence (see the module docstring for margin, gap and the rule ``gap ≤ τ``)."""
    if len(baseline) != len(candidates):
        raise ValueError(f"candidates: expected {len(baseline)} rows (one per baseline row), got {len(candidates)}")
    if tau < 0:
        raise ValueError(f"tau: expected >= 0, got {tau}")
    labels = list(labels) if labels is not None else [str(i) for i in range(len(baseline))]
    exact = dtype in EXACT_DTYPES
    divergences, compared = [], 0
    for label, run, candidate in zip(labels, baseline, candidates):
        candidate = candidate.reshape(-1).cpu()
        if candidate.shape != run.tokens.shape:
            raise ValueError(
                f"candidates: row {label} has {candidate.numel()} tokens, the baseline {run.tokens.numel()}; "
                "generate the same number of new tokens (disable end-of-sequence stopping)"
            )
        position = _first_difference(run.tokens, candidate)
        compared += run.tokens.numel() if position is None else position + 1
        if position is not None:
            divergences.append(divergence_at(label, position, run, int(candidate[position]), tau=tau, exact=exact))
    return IdentityReport(_dtype_name(dtype), tau, len(baseline), compared, tuple(divergences))


def margin_changes(reference: GreedyRun, other: GreedyRun, *, aligned_to: int | None = None) -> torch.Tensor:
    """``|Δ(ℓ[a] − ℓ[b])|`` per position, ``a, b`` the reference's top-2, over the first
    ``aligned_to`` positions (where both runs had the same prefix); float64 ``[aligned_to]``."""
    n = reference.tokens.numel() if aligned_to is None else aligned_to
    ref = reference.logits[:n].to(torch.float64)
    oth = other.logits[:n].to(torch.float64)
    top2 = ref.topk(2, dim=-1).indices
    ref_margin = ref.gather(-1, top2[:, :1]) - ref.gather(-1, top2[:, 1:])
    oth_margin = oth.gather(-1, top2[:, :1]) - oth.gather(-1, top2[:, 1:])
    return (ref_margin - oth_margin).abs().reshape(-1)


def calibrate_from_runs(
    reference: Sequence[GreedyRun],
    others: dict[str, Sequence[GreedyRun]],
    *,
    dtype: torch.dtype,
    teacher_forced: frozenset[str] = frozenset(),
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
) -> Calibration:
    """τ from plain runs of the same prompts in other shapes (see the module docstring).

    ``others[shape][i]`` is prompt ``i`` decoded in ``shape``.  A free-running shape is aligned
    with the reference up to and including its first divergence (the prefix is shared until
    then); a shape named in ``teacher_forced`` was scored on the reference's own tokens, so every
    position is aligned and every flip counts.
    """
    if safety_factor < 1:
        raise ValueError(f"safety_factor: expected >= 1 (it widens the measured noise), got {safety_factor}")
    changes, divergences = [torch.zeros(1, dtype=torch.float64)], []
    for shape, runs in others.items():
        if len(runs) != len(reference):
            raise ValueError(f"others: shape {shape!r} has {len(runs)} runs, expected {len(reference)}")
        for i, (ref, run) in enumerate(zip(reference, runs)):
            if shape in teacher_forced:
                aligned, flips = ref.tokens.numel(), (ref.tokens != run.tokens).nonzero().reshape(-1).tolist()
            else:
                first = _first_difference(ref.tokens, run.tokens)
                aligned = ref.tokens.numel() if first is None else first + 1
                flips = [] if first is None else [first]
            changes.append(margin_changes(ref, run, aligned_to=aligned))
            divergences += [
                divergence_at(f"{shape}/{i}", t, ref, int(run.tokens[t]), tau=float("nan"), exact=False) for t in flips
            ]
    max_change = float(torch.cat(changes).max())
    max_gap = max((d.gap for d in divergences), default=0.0)
    tau = safety_factor * max(max_change, max_gap)
    divergences = [
        Divergence(d.row, d.position, d.baseline_token, d.candidate_token, d.margin, d.gap, tau, d.gap <= tau)
        for d in divergences
    ]
    return Calibration(
        tau=tau,
        max_margin_change=max_change,
        max_divergence_gap=max_gap,
        safety_factor=safety_factor,
        positions=sum(c.numel() for c in changes[1:]),
        divergences=tuple(divergences),
        dtype=_dtype_name(dtype),
        shapes=tuple(others),
    )


# --- running plain greedy decoding with Hugging Face models ------------------------------------


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
def teacher_forced(model: Any, prompt: torch.Tensor, tokens: torch.Tensor) -> GreedyRun:
    """Score ``tokens`` after ``prompt`` in one forward pass: the logits at every new position given
    the fixed prefix, and their argmaxes (what greedy would pick there in this shape)."""
    device = _model_device(model)
    sequence = torch.cat([prompt.reshape(-1).cpu(), tokens.reshape(-1)[:-1].cpu()]).to(device)
    logits = model(sequence[None]).logits[0, prompt.numel() - 1:].float().cpu()
    return GreedyRun(logits.argmax(-1), logits)


def calibrate(
    model: Any,
    prompts: Sequence[torch.Tensor],
    reference: Sequence[GreedyRun],
    *,
    batch_sizes: Sequence[int] = (4,),
    pad_token_id: int = 0,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
) -> Calibration:
    """τ for ``model`` in its current dtype and device: ``reference`` (the prompts decoded alone,
    :func:`greedy_decode` with ``batch_size=1``) against the same prompts decoded in batches of
    each size in ``batch_sizes`` and re-scored teacher-forced (see the module docstring)."""
    max_new_tokens = reference[0].tokens.numel()
    others: dict[str, Sequence[GreedyRun]] = {
        f"batch{size}": greedy_decode(
            model, prompts, max_new_tokens=max_new_tokens, batch_size=size, pad_token_id=pad_token_id
        )
        for size in batch_sizes
    }
    others["teacher-forced"] = [teacher_forced(model, p, run.tokens) for p, run in zip(prompts, reference)]
    return calibrate_from_runs(
        reference, others, dtype=model.dtype, teacher_forced=frozenset({"teacher-forced"}), safety_factor=safety_factor
    )
