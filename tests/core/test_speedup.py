"""The analytic speedup model (specverify.core.speedup) and its CLI command (specverify.cli.speedup)."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specverify.cli.speedup import main, register
from specverify.core import exact
from specverify.core.speedup import (
    best_gamma,
    expected_tokens_per_pass,
    expected_tokens_per_pass_by_position,
    pass_cost,
    speedup,
    speedup_table,
)

rates = st.floats(0.0, 1.0)
gammas = st.integers(1, 12)
costs = st.floats(0.0, 2.0)


@given(alpha=rates, gamma=gammas)
def test_closed_form_equals_the_position_dependent_form(alpha, gamma):
    """(1 − α^{γ+1})/(1 − α) = 1 + Σ_{j=1..γ} α^j (eq. (1) is the geometric sum)."""
    closed = expected_tokens_per_pass(alpha, gamma)
    assert closed == pytest.approx(expected_tokens_per_pass_by_position([alpha] * gamma), rel=1e-9, abs=1e-12)
    assert closed == pytest.approx(exact.expected_tokens_constant_alpha(alpha, gamma), rel=1e-12)


@given(alphas=st.lists(rates, min_size=1, max_size=8))
def test_position_form_agrees_with_exact(alphas):
    assert expected_tokens_per_pass_by_position(alphas) == pytest.approx(exact.expected_tokens_per_step(alphas),
                                                                         rel=1e-12)


def test_limits_and_a_hand_computed_value():
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0
    assert expected_tokens_per_pass_by_position([0.5, 0.5, 0.0, 1.0]) == 1.75  # 1 + .5 + .25 + 0 + 0
    # Leviathan et al. Theorem 3.8 with α = 0.8, γ = 3, c = 0.05: (1 − 0.8^4) / (0.2 · 1.15)
    assert speedup(0.8, 3, 0.05).speedup == pytest.approx((1 - 0.8**4) / (0.2 * 1.15), rel=1e-12)


@given(alpha=rates, gamma=gammas, c=costs, v=costs)
def test_speedup_is_tokens_over_cost(alpha, gamma, c, v):
    estimate = speedup(alpha, gamma, c, v)
    assert estimate.pass_cost == pytest.approx(gamma * c + 1 + gamma * v)
    assert estimate.speedup == pytest.approx(estimate.tokens_per_pass / estimate.pass_cost)
    assert estimate.pays == (estimate.speedup > 1)
    if alpha < 1:
        theorem = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1 + gamma * v))
        assert estimate.speedup == pytest.approx(theorem, rel=1e-9)


@given(alpha=rates, gamma=gammas, c=costs, v=costs, more=st.floats(0.01, 1.0))
def test_speedup_falls_with_draft_and_verify_cost(alpha, gamma, c, v, more):
    base = speedup(alpha, gamma, c, v).speedup
    assert speedup(alpha, gamma, c + more, v).speedup < base
    assert speedup(alpha, gamma, c, v + more).speedup < base


@given(alpha=rates, c=costs, v=costs, max_gamma=st.integers(1, 10))
def test_best_gamma_is_the_argmax_and_ties_go_to_the_smaller(alpha, c, v, max_gamma):
    result = best_gamma(alpha, c, v, max_gamma=max_gamma)
    assert [e.gamma for e in result.table] == list(range(1, max_gamma + 1))
    assert all(result.speedup >= e.speedup for e in result.table)
    assert result.gamma == min(e.gamma for e in result.table if e.speedup == result.speedup)
    assert result.pays == (result.speedup > 1)


def test_speculation_can_be_slower_than_plain_decoding():
    """Large-batch regime: with v = 0.5 and α = 0.6, one more verified token costs more than it yields."""
    result = best_gamma(0.6, 0.1, 0.5, max_gamma=8)
    assert not result.pays
    assert all(e.speedup <= 1 for e in result.table)
    memory_bound = best_gamma(0.6, 0.1, 0.0, max_gamma=8)
    assert memory_bound.pays and memory_bound.gamma > 1


def test_position_dependent_rates_and_gamma_limits():
    result = best_gamma([0.9, 0.8, 0.1], 0.05)
    assert [e.gamma for e in result.table] == [1, 2, 3]
    assert result.gamma == 2  # the third draft is almost never accepted but costs c
    assert speedup([0.9, 0.8, 0.1], 2, 0.05).alphas == (0.9, 0.8)
    with pytest.raises(ValueError, match="gamma: 4 exceeds the 3 per-position rates"):
        speedup([0.9, 0.8, 0.1], 4, 0.05)
    assert [e.gamma for e in speedup_table(0.7, [4, 1, 4], 0.1)] == [1, 4]


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: expected_tokens_per_pass(1.2, 3), "alpha"),
        (lambda: expected_tokens_per_pass(0.5, 0), "gamma"),
        (lambda: expected_tokens_per_pass_by_position([]), "alphas"),
        (lambda: expected_tokens_per_pass_by_position([0.5, -0.1]), r"alphas\[1\]"),
        (lambda: pass_cost(2, -0.1), "draft_cost"),
        (lambda: pass_cost(2, 0.1, math.inf), "verify_cost"),
        (lambda: speedup(0.5, 2.5, 0.1), "gamma"),
        (lambda: best_gamma(0.5, 0.1, max_gamma=0), "max_gamma"),
        (lambda: best_gamma(0.5, 0.1, max_gamma=3, gammas=[1]), "gammas/max_gamma"),
        (lambda: speedup_table(0.5, [], 0.1), "gammas"),
    ],
)
def test_bad_values(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def parse(argv):
    parser = argparse.ArgumentParser(prog="specverify")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_prints_table_best_gamma_and_verdict(capsys):
    args = parse(["speedup", "--alpha", "0.8", "--max-gamma", "6", "--draft-cost", "0.05"])
    assert args.handler(args) == 0
    output = capsys.readouterr().out
    assert output.count("x") >= 6 and "best gamma: 6" in output
    assert "verdict: speculation pays" in output
    rows = [line for line in output.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 6


def test_cli_says_when_speculation_does_not_pay(capsys):
    args = parse(["speedup", "--alpha", "0.6", "--gamma", "1", "2", "4", "--draft-cost", "0.1", "--verify-cost", "0.5"])
    assert args.handler(args) == 0
    output = capsys.readouterr().out
    assert "best gamma: 1" in output and "speculation does not pay" in output


def test_cli_plot_is_a_png(tmp_path, capsys):
    path = tmp_path / "speedup.png"
    args = parse(["speedup", "--alpha", "0.7", "--gamma", "3", "--draft-cost", "0.2", "--plot", str(path)])
    assert args.handler(args) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_gamma_and_max_gamma_together():
    with pytest.raises(SystemExit) as exit_info:
        parse(["speedup", "--alpha", "0.7", "--gamma", "3", "--max-gamma", "5", "--draft-cost", "0.2"])
    assert exit_info.value.code == 2


def test_cli_returns_2_on_invalid_values(capsys):
    args = parse(["speedup", "--alpha", "1.5", "--gamma", "2", "--draft-cost", "0.1"])
    assert args.handler(args) == 2
    assert "alpha: expected an acceptance rate in [0, 1]" in capsys.readouterr().err
    assert main(["--alpha", "0.5", "--gamma", "2", "--draft-cost", "-1"]) == 2
    assert "draft_cost: expected a finite cost >= 0" in capsys.readouterr().err


def test_wired_into_the_main_cli(capsys):
    from specverify.cli import main as specverify_main

    assert specverify_main(["speedup", "--alpha", "0.9", "--max-gamma", "3", "--draft-cost", "0.0"]) == 0
    assert "best gamma: 3" in capsys.readouterr().out


def test_cli_with_one_gamma_says_what_was_compared_and_the_best_over_1_to_16(capsys):
    args = parse(["speedup", "--alpha", "0.8", "--gamma", "4", "--draft-cost", "0.05"])
    assert args.handler(args) == 0
    output = capsys.readouterr().out
    assert "best gamma: 4 of the gamma asked (4)" in output
    assert "best gamma: 8 over gamma = 1..16" in output


def test_cli_plot_with_one_gamma_draws_the_whole_curve(tmp_path, monkeypatch):
    drawn = {}

    def capture(curve, alpha, draft_cost, verify_cost, path, *, asked=None):
        drawn.update(curve=[e.gamma for e in curve.table], asked=[e.gamma for e in asked.table])

    monkeypatch.setattr("specverify.cli.speedup.save_plot", capture)
    args = parse(["speedup", "--alpha", "0.8", "--gamma", "4", "--draft-cost", "0.05", "--plot",
                  str(tmp_path / "p.png")])
    assert args.handler(args) == 0
    assert drawn == {"curve": list(range(1, 17)), "asked": [4]}
