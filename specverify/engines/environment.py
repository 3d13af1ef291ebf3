"""What an engine's import needs on a machine without a GPU, set before the engine is imported.

Engines write their sampling kernels in Triton.  Without a GPU, Triton's interpreter
(``TRITON_INTERPRET=1``) runs the same kernel source on CPU tensors with numpy, one program
instance at a time (~18 ms a program on one core).  vLLM decides at import whether a GPU driver
is active and, when none is, replaces ``triton`` with placeholders that raise on use, unless
``CUDA_VISIBLE_DEVICES`` is set (to the empty string here: no device is visible, and the
interpreter runs the kernels).  Both variables must be in the environment before the engine
(and Triton) is first imported, so every adapter calls :func:`prepare_engine_import` at the top
of its module.  With CUDA available nothing is changed: the compiled kernels run.
"""

from __future__ import annotations

import os

import torch

from specverify.core.sampling import sample
from specverify.engines import INSTALL_HINTS


def prepare_engine_import() -> bool:
    """Set ``TRITON_INTERPRET=1`` and ``CUDA_VISIBLE_DEVICES=""`` unless CUDA is available or the
    caller set them already; return whether Triton kernels will be interpreted."""
    if torch.cuda.is_available():
        return os.environ.get("TRITON_INTERPRET", "0") == "1"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    return os.environ["TRITON_INTERPRET"] == "1"


def require_engine(distribution: str) -> str:
    """The installed version of ``distribution``; ModuleNotFoundError naming the install command if absent."""
    found = installed_version(distribution)
    if found is None:
        hint = INSTALL_HINTS.get(distribution, f"pip install {distribution}")
        raise ModuleNotFoundError(f"{distribution} is not installed; install the audited version with: {hint} "
                                  "(--no-deps: its declared torch pin would replace your torch)", name=distribution)
    return found


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def gumbel_perturbed_logits(target_probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``log p + G`` with ``G`` i.i.d. standard Gumbel from ``generator`` (float32, same shape).

    The argmax of each row is then a draw from that row's ``p`` (the Gumbel-max trick:
    ``P(argmax_v (log p_v + G_v) = t) = p_t``).  An engine's greedy verification applied to these
    logits accepts draft ``x_i`` iff it equals the target's sample ``y_i`` and then emits ``y_n``:
    every emitted token is a draw from the target at its position, so the step is lossless, and
    a bug in the greedy path's prefix, bonus or output logic shows as a loss.
    """
    log_p = torch.log(target_probs.float())
    uniform = torch.rand(log_p.shape, generator=generator, device=log_p.device, dtype=torch.float64)
    gumbel = -torch.log(-torch.log(uniform.clamp_min(torch.finfo(torch.float64).tiny)))
    return (log_p.double() + gumbel).float()


def with_greedy_rows_perturbed(logits: torch.Tensor, target_probs: torch.Tensor, greedy_rows: torch.Tensor,
                               generator: torch.Generator | None) -> torch.Tensor:
    """``logits [B, P, V]`` with each greedy row (``greedy_rows [B]`` True) replaced by that row's
    :func:`gumbel_perturbed_logits`, whose noise is drawn for the greedy rows only, in row order
    (a batch of all greedy rows draws what ``gumbel_perturbed_logits(target_probs)`` draws)."""
    if not bool(greedy_rows.any()):
        return logits
    perturbed = logits.clone()
    perturbed[greedy_rows] = gumbel_perturbed_logits(target_probs[greedy_rows], generator).to(logits.dtype)
    return perturbed


def target_draws(target_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """int64 ``[B, P]``: one draw from each position's target law ``p`` (:func:`specverify.core.sampling.sample`,
    one float64 uniform per row and position, in row-major order).

    What a greedy verification rule receives as the target's choices (``target_predict``,
    ``target_token_ids``) where the engine takes token ids, not logits: the rule accepts draft
    ``x_i`` iff it equals the draw ``y_i`` and then emits ``y_n``, so every emitted token is a draw
    from the target and the step is lossless exactly when the rule is right, as with the argmax
    of :func:`gumbel_perturbed_logits`, for one pass over the law instead of two logarithms of V
    float64 uniforms."""
    batch, positions, vocab = target_probs.shape
    return sample(target_probs.reshape(batch * positions, vocab), generator).view(batch, positions)
