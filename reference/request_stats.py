"""Per-request decoding statistics: tokens per target pass, acceptance by draft position, time.

Acceptance by position is the conditional rate the speedup model needs (Leviathan et al. 2023
§3.1, eq. (1) generalised to a position-dependent α): of the target passes in which draft
position ``i`` was verified (all earlier drafts accepted), the fraction in which it was accepted.
With those rates ``α_1 .. α_γ`` the expected number of tokens per target pass is
``1 + sum_j prod_{i<=j} α_i`` (every pass emits one correction-or-bonus token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RequestStats:
    """What one request of a decode did.

    target_passes: target forward passes made while the request was unfinished.
    emitted_tokens: tokens those passes emitted (accepted drafts + one each), before truncation
        to ``max_new_tokens``/EOS.
    verified_by_position / accepted_by_position: per draft position ``i`` (0-based), how many passes
        verified it (it was proposed and every earlier draft was accepted) and how many accepted it.
    draft_seconds / target_seconds: wall time of the batch's draft and target work while the
        request was in it (a batch's passes are shared by its rows).
    """

    target_passes: int
    emitted_tokens: int
    verified_by_position: tuple[int, ...]
    accepted_by_position: tuple[int, ...]
    draft_seconds: float
    target_seconds: float

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens emitted per target pass (1 = no gain over plain decoding)."""
        return self.emitted_tokens / self.target_passes if self.target_passes else math.nan

    @property
    def acceptance_by_position(self) -> tuple[float, ...]:
        """Measured ``α_i``: accepted / verified at each draft position (NaN where never verified)."""
        return tuple(
            accepted / verified if verified else math.nan
            for accepted, verified in zip(self.accepted_by_position, self.verified_by_position)
        )

    @property
    def predicted_tokens_per_pass(self) -> float:
        """``1 + sum_j prod_{i<=j} α_i`` from the measured ``α_i`` (positions never verified add 0).

        Equals :attr:`tokens_per_pass` when every pass proposed γ drafts; passes with fewer make it
        an overestimate: a request's last passes, which draft only the tokens it still needs
        (``min(γ, tokens left − 1)``), and prompt lookup passes that found fewer (or no) drafts.
        """
        total, reach = 1.0, 1.0
        for alpha in self.acceptance_by_position:
            if math.isnan(alpha):
                break
            reach *= alpha
            total += reach
        return total


@dataclass(frozen=True)
class BatchStats:
    """The :class:`RequestStats` of every row of a batch, as CPU tensors (one entry per row).

    ``request(b)`` gives row b's :class:`RequestStats`; ``pooled()`` sums the counts over rows (the
    acceptance by position of the whole batch).
    """

    target_passes: torch.Tensor  # int64 [B]
    emitted_tokens: torch.Tensor  # int64 [B]
    verified_by_position: torch.Tensor  # int64 [B, γ]
    accepted_by_position: torch.Tensor  # int64 [B, γ]
    draft_seconds: torch.Tensor  # float64 [B]
    target_seconds: torch.Tensor  # float64 [B]

    def __len__(self) -> int:
        return self.target_passes.shape[0]

    @property
    def tokens_per_pass(self) -> torch.Tensor:
        """Mean tokens per target pass of each row, float64 ``[B]``."""
        return self.emitted_tokens.to(torch.float64) / self.target_passes.to(torch.float64)

    def request(self, row: int) -> RequestStats:
        """Row ``row``'s statistics."""
        return RequestStats(
            target_passes=int(self.target_passes[row]),
            emitted_tokens=int(self.emitted_tokens[row]),
            verified_by_position=tuple(self.verified_by_position[row].tolist()),
            accepted_by_position=tuple(self.accepted_by_position[row].tolist()),
            draft_seconds=float(self.draft_seconds[row]),
            target_seconds=float(self.target_seconds[row]),
        )

    def pooled(self, rows: torch.Tensor | slice | None = None) -> RequestStats:
        """Counts and times summed over ``rows`` (all rows by default), as one :class:`RequestStats`."""
        rows = slice(None) if rows is None else rows
        return RequestStats(
            target_passes=int(self.target_passes[rows].sum()),
            emitted_tokens=int(self.emitted_tokens[rows].sum()),
            verified_by_position=tuple(self.verified_by_position[rows].sum(0).tolist()),
            accepted_by_position=tuple(self.accepted_by_position[rows].sum(0).tolist()),
            draft_seconds=float(self.draft_seconds[rows].sum()),
            target_seconds=float(self.target_seconds[rows].sum()),
        )


class StatsRecorder:
    """Accumulates the statistics of every row of a batch, on the batch's device."""

    def __init__(self, batch_size: int, gamma: int, device: torch.device) -> None:
        self.passes = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.emitted = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.verified = torch.zeros(batch_size, gamma, dtype=torch.int64, device=device)
        self.accepted = torch.zeros(batch_size, gamma, dtype=torch.int64, device=device)
        self.draft_seconds = torch.zeros(batch_size, dtype=torch.float64)
        self.target_seconds = torch.zeros(batch_size, dtype=torch.float64)

    def record_pass(
        self, active: torch.Tensor, num_draft: torch.Tensor, num_accepted: torch.Tensor,
        draft_seconds: float, target_seconds: float,
    ) -> None:
        """Count one target pass for the ``active`` rows: position ``i`` was verified iff
        ``i < num_draft`` and ``i <= num_accepted``, accepted iff ``i < num_accepted``."""
        positions = torch.arange(self.verified.shape[1], device=self.verified.device)
        row_active = active[:, None]
        self.verified += row_active & (positions < num_draft[:, None]) & (positions <= num_accepted[:, None])
        self.accepted += row_active & (positions < num_accepted[:, None])
        self.passes += active
        self.emitted += torch.where(active, num_accepted + 1, 0)
        active_cpu = active.cpu()
        self.draft_seconds += active_cpu * draft_seconds
        self.target_seconds += active_cpu * target_seconds

    def finish(self) -> BatchStats:
        """The frozen statistics, on CPU."""
        return BatchStats(
            target_passes=self.passes.cpu(),
            emitted_tokens=self.emitted.cpu(),
            verified_by_position=self.verified.cpu(),
            accepted_by_position=self.accepted.cpu(),
            draft_seconds=self.draft_seconds,
            target_seconds=self.target_seconds,
        )
