"""``specverify speedup``: the analytic speedup model (``specverify.core.speedup``) on the command line.

    specverify speedup --alpha A (--gamma G [G ...] | --max-gamma N) --draft-cost C
                       [--verify-cost V] [--plot out.png]

Prints the table over γ (tokens per pass, cost per pass in target steps, speedup), the best γ,
and whether speculation pays at all; with ``--gamma`` it says which γ were compared and gives the
best γ over 1..16 beside them.  ``--plot`` saves the speedup curve over γ with the no-speedup line
at 1, the best γ and the asked ones marked.  :func:`register` adds the command to the main CLI's subparsers;
:func:`main` runs it alone
(``python -m specverify.cli.speedup ...``).  Exit status 0, or 2 with a message for invalid values.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specverify.core.speedup import DEFAULT_MAX_GAMMA, BestGamma, best_gamma

DESCRIPTION = (
    "Predicted walltime speedup of speculative decoding over plain decoding (Leviathan et al. 2023 "
    "§3.3–3.4): tokens per target pass (1 − α^(γ+1))/(1 − α) over the pass cost γc + 1 + γv, in "
    "target steps."
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``speedup`` command; its ``handler`` is :func:`run` (``run(args) -> exit status``)."""
    parser = subparsers.add_parser("speedup", help="analytic speedup model: best draft length γ",
                                   description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(handler=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's options (shared by :func:`register` and :func:`main`)."""
    parser.add_argument("--alpha", type=float, required=True, help="per-token acceptance rate α in [0, 1]")
    lengths = parser.add_mutually_exclusive_group()
    lengths.add_argument("--gamma", type=int, nargs="+", metavar="G", help="draft length(s) γ to evaluate")
    lengths.add_argument(
        "--max-gamma", type=int, metavar="N", help=f"evaluate γ = 1..N (default {DEFAULT_MAX_GAMMA})"
    )
    parser.add_argument(
        "--draft-cost", type=float, required=True, metavar="C", help="cost of one draft token, in target steps (c)"
    )
    parser.add_argument(
        "--verify-cost", type=float, default=0.0, metavar="V",
        help="extra cost of each verified token beyond the first, in target steps (v; 0 = memory-bound target)",
    )
    parser.add_argument("--plot", type=Path, metavar="PNG", help="save speedup against γ to this image")


def run(args: argparse.Namespace) -> int:
    """Evaluate the model for the parsed arguments, print the report, save the plot; return 0, or 2
    with a message on stderr for invalid values.

    With ``--gamma``, the report compares the γ asked for and, beside them, gives the best γ over
    1..max(16, largest asked): a single asked γ is "best" only among itself."""
    try:
        if args.gamma is not None:
            asked = best_gamma(args.alpha, args.draft_cost, args.verify_cost, gammas=args.gamma)
            curve = best_gamma(args.alpha, args.draft_cost, args.verify_cost,
                               max_gamma=max(DEFAULT_MAX_GAMMA, *args.gamma))
        else:
            asked = None
            curve = best_gamma(args.alpha, args.draft_cost, args.verify_cost,
                               max_gamma=args.max_gamma or DEFAULT_MAX_GAMMA)
    except ValueError as error:
        print(f"specverify speedup: error: {error}", file=sys.stderr)
        return 2
    print(format_report(curve, args.alpha, args.draft_cost, args.verify_cost, asked=asked))
    if args.plot is not None:
        save_plot(curve, args.alpha, args.draft_cost, args.verify_cost, args.plot, asked=asked)
        print(f"plot: {args.plot}")
    return 0


def format_report(curve: BestGamma, alpha: float, draft_cost: float, verify_cost: float, *,
                  asked: BestGamma | None = None) -> str:
    """The table over γ (the asked γ when given, else the whole curve), the best γ and the verdict."""
    shown = asked or curve
    lines = [
        f"speculative decoding speedup model: alpha={alpha:g}, draft cost c={draft_cost:g}, "
        f"verify cost v={verify_cost:g} (target steps per token)",
        f"{'gamma':>5}  {'tokens/pass':>11}  {'cost/pass':>9}  {'speedup':>7}",
    ]
    for estimate in shown.table:
        marker = "  <- best" if estimate.gamma == shown.gamma else ""
        lines.append(
            f"{estimate.gamma:>5}  {estimate.tokens_per_pass:>11.3f}  {estimate.pass_cost:>9.3f}  "
            f"{estimate.speedup:>6.3f}x{marker}"
        )
    span = f"gamma = {curve.table[0].gamma}..{curve.table[-1].gamma}"
    if asked is not None:
        compared = ", ".join(str(e.gamma) for e in asked.table)
        lines.append(f"best gamma: {asked.gamma} of the gamma asked ({compared}), speedup {asked.speedup:.3f}x")
    lines.append(f"best gamma: {curve.gamma} over {span}, speedup {curve.speedup:.3f}x")
    if curve.pays:
        lines.append(f"verdict: speculation pays: {curve.speedup:.3f}x faster than plain "
                     f"decoding at gamma={curve.gamma}")
    else:
        lines.append(
            f"verdict: speculation does not pay: no gamma in {span} beats plain decoding "
            f"(best {curve.speedup:.3f}x); decode without a draft"
        )
    return "\n".join(lines)


def save_plot(curve: BestGamma, alpha: float, draft_cost: float, verify_cost: float, path: Path, *,
              asked: BestGamma | None = None) -> None:
    """Speedup against γ over the whole curve, the no-speedup line at 1 (dashed), the best γ as a
    star and the asked γ (if any) as rings."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot([e.gamma for e in curve.table], [e.speedup for e in curve.table], marker="o", label="predicted speedup")
    axes.axhline(1.0, color="gray", linestyle="--", label="no speedup (plain decoding)")
    axes.plot([curve.gamma], [curve.speedup], marker="*", markersize=14, color="tab:red", linestyle="none",
              label=f"best γ = {curve.gamma} ({curve.speedup:.2f}x)")
    if asked is not None:
        axes.plot([e.gamma for e in asked.table], [e.speedup for e in asked.table], marker="o", markersize=12,
                  markerfacecolor="none", color="tab:green", linestyle="none",
                  label="asked γ = " + ", ".join(str(e.gamma) for e in asked.table))
    axes.set_xlabel("draft tokens per pass γ")
    axes.set_ylabel("speedup over plain decoding")
    axes.set_title(f"α = {alpha:g}, c = {draft_cost:g}, v = {verify_cost:g}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``speedup`` on its own (the same options as ``specverify speedup``)."""
    parser = argparse.ArgumentParser(prog="specverify speedup", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
