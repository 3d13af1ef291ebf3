"""The tree audit level (specverify.auditing.tree.battery): the reference passes, the catalog fails,
faults and contract violations are reported, the CLI and the built-ins work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specverify
from specverify.auditing.loading import load_target
from specverify.auditing.runner import audit
from specverify.auditing.tree.catalog import TREE_CATALOG
from specverify.core import tree_rules

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference_report():
    return audit("reference", level="tree", budget="quick")


def test_reference_passes_at_quick(reference_report):
    assert reference_report.exit_code == 0, reference_report.explain()
    names = [c.name for c in reference_report.checks]
    assert "exact-tree-step" in names and "tree-loop-deterministic" in names and "tree-small-batches" in names
    statistical = [c for c in reference_report.checks if c.alpha is not None]
    assert len(statistical) == 24
    assert all(c.detectable_tv <= 0.05 * c.parameters.get("TV scale", 1.0) + 1e-12 for c in statistical)


@pytest.mark.parametrize("name", sorted(n for n, entry in TREE_CATALOG.items() if entry.scale_model is None))
def test_every_catalog_entry_fails_the_exact_check(name):
    report = audit(f"catalog:{name}", level="tree", budget="quick", checks=["exact-tree-step"])
    assert report.exit_code == 1, report.explain()


@pytest.mark.parametrize("name", sorted(n for n, entry in TREE_CATALOG.items() if entry.scale_model is not None))
def test_entries_beyond_exact_integration_are_exact_on_the_exact_checks_trees(name):
    """Wrong only on trees too large to integrate: the exact check passes them (the production-shape
    checks kill them, tests/auditing/test_tree_production.py)."""
    report = audit(f"catalog:{name}", level="tree", budget="quick", checks=["exact-tree-step", "randomness-source"])
    assert report.checks[0].verdict == "pass", report.explain()


@pytest.mark.parametrize("builtin", ["typical", "unchanged-target", "thresholded", "greedy"])
def test_lossy_builtins_fail(builtin):
    report = audit(builtin, level="tree", budget="quick",
                   checks=["tree-siblings-independent", "tree-siblings-deterministic"])
    assert report.exit_code == 1, report.explain()


def test_declared_schemes_select_the_checks():
    fn = load_target("point-mass", "tree")
    report = audit(fn, level="tree", budget=2000, checks=None)
    assert all("independent" not in c.name and "without_replacement" not in c.name for c in report.checks)
    assert report.exit_code == 0, report.explain()


def test_non_path_output_is_an_impossible_output():
    def jumps(target_probs, draft_probs, tree_tokens, parents, generator):
        emitted = torch.full((tree_tokens.shape[0], tree_tokens.shape[1] + 1), -1, dtype=torch.int64)
        emitted[:, 0] = (tree_tokens[:, 0] + 1) % target_probs.shape[-1]  # not a root child's token ...
        emitted[:, 1] = 0  # ... followed by a final token: claims one accepted node
        return emitted

    report = audit(jumps, level="tree", budget=200, checks=["tree-siblings-independent"])
    # Well formed, but no lossless rule emits a path off the tree: a loss (exit 1), not a broken adapter.
    assert report.exit_code == 1 and report.checks[0].fault == "impossible"
    assert "root-to-node path" in report.checks[0].message


def test_global_rng_is_a_contract_violation():
    def global_rng(target_probs, draft_probs, tree_tokens, parents, generator):
        return tree_rules.verify_tree(target_probs, draft_probs, tree_tokens, parents, None,
                                      uniforms=torch.rand(tree_tokens.shape[0], tree_tokens.shape[1] + 1))

    report = audit(global_rng, level="tree", budget=200, checks=["randomness-source"])
    assert report.exit_code == 1 and report.checks[0].fault == "global-rng"


def test_input_mutation_is_a_contract_violation():
    def mutates(target_probs, draft_probs, tree_tokens, parents, generator):
        out = tree_rules.verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)
        draft_probs.zero_()
        return out

    report = audit(mutates, level="tree", budget=200, checks=["tree-siblings-independent", "inputs-unchanged"])
    assert report.exit_code == 1 and report.checks[-1].verdict == "fail"


def test_raising_function_cannot_be_audited():
    def raises(target_probs, draft_probs, tree_tokens, parents, generator):
        raise RuntimeError("kernel not built")

    report = audit(raises, level="tree", budget=200, checks=["tree-siblings-independent"])
    assert report.exit_code == 2 and "kernel not built" in report.summary


def test_assert_lossless_and_reports_render(reference_report, tmp_path):
    from specverify.auditing.reports import html_page, json_file, terminal

    for module in (terminal, json_file, html_page):
        assert module is not None
    with pytest.raises(AssertionError, match="exact-tree-step"):
        specverify.assert_lossless(TREE_CATALOG["bonus_from_parent"].fn, level="tree", budget="quick",
                                   checks=["exact-tree-step"])


def test_cli_tree_level(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "report.json"
    html = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "specverify", "audit", "--level", "tree",
                             "catalog:bonus_from_parent",
                             "--budget", "3000", "--checks", "tree-branches-independent,exact-tree-step",
                             "--json", str(out), "--html", str(html)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert json.loads(out.read_text())["level"] == "tree"
    page = html.read_text()
    assert "exact-tree-step" in page and "<svg" in page and "Trees drafted by tree-branches-independent" in page


def test_tree_svg_draws_every_node():
    from specverify.auditing.reports.tree_drawings import tree_svg

    drawing = tree_svg((-1, -1, 0, 1, 1))
    assert drawing.count("<circle") == 6 and drawing.count("<line") == 5


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TREE_CATALOG))
def test_every_catalog_entry_fails_the_full_battery_at_standard(name):
    report = audit(f"catalog:{name}", level="tree", budget="standard")
    assert report.exit_code == 1, report.explain()


def test_malformed_draft_schemes_cannot_be_audited():
    def declared_badly(target_probs, draft_probs, tree_tokens, parents, generator):
        return tree_rules.verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)

    declared_badly.draft_schemes = ("greedy",)
    report = audit(declared_badly, level="tree", budget=200, checks=["randomness-source", "tree-siblings-independent"])
    assert report.exit_code == 2 and "draft_schemes" in report.summary
