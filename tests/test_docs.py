"""The figures and cross-references of the docs that can be checked mechanically: every relative
link (and its #anchor) resolves, and the constants the docs quote are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for heading in re.findall(r"^#+\s+(.*)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(path):
    broken = []
    for link in relative_links(path):
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.name}")
    assert not broken, f"{path.name}: {broken}"


def doc_text() -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in DOCS)


def test_the_ceiling_tv_the_docs_quote_is_the_codes():
    from specverify.auditing.defaults import POWER_CEILING_TV

    quoted = re.findall(r"ceiling TV \(?(\d+(?:\.\d+)?)", doc_text())
    assert quoted and {float(q) for q in quoted} <= set(POWER_CEILING_TV.values()), quoted


def test_the_budget_tvs_the_docs_quote_are_the_codes():
    from specverify.auditing.checks import BUDGETS

    rows = re.findall(r"\| (?:sampler|tree) \(SPEC §\d\) \| TV (\S+) \| (\S+) \| (\S+) \|", doc_text())
    assert rows and all(tuple(map(float, row)) == tuple(BUDGETS.values()) for row in rows), rows
    for match in re.findall(r"TV (0\.\d+) / (0\.\d+) / (0\.\d+)", doc_text()):
        assert tuple(map(float, match)) == tuple(BUDGETS.values()), match


def test_the_shapes_the_docs_quote_are_the_production_checks():
    from specverify.auditing.sampler.production import PRODUCTION_SHAPES

    largest_k = max(shape[3] for shape in PRODUCTION_SHAPES)
    largest_v = max(shape[2] for shape in PRODUCTION_SHAPES)
    text = doc_text()
    assert {int(k) for k in re.findall(r"K up to (\d+)", text)} <= {largest_k, 8}  # 8: the toy shapes' largest K
    assert {int(k) for k in re.findall(r"K from 1 to (\d+)", text)} == {largest_k}
    quoted_v = {int(v.replace(",", "")) for v in re.findall(r"(?:vocabular(?:y|ies)|V) up to ([\d,]+)", text)}
    assert quoted_v <= {largest_v}, quoted_v


def test_the_catalog_counts_the_docs_quote_are_the_catalogs():
    from specverify.auditing.sampler.catalog import CATALOG
    from specverify.auditing.tree.catalog import TREE_CATALOG

    text = doc_text()
    chain = re.findall(r"(\d+) (?:known-bug variants|entries modelled|chain entries)", text)
    tree = re.findall(r"(\d+) tree (?:rules|entries)", text)
    assert chain and {int(n) for n in chain} == {len(CATALOG)}, chain
    assert tree and {int(n) for n in tree} == {len(TREE_CATALOG)}, tree


def test_the_presets_the_docs_quote_are_the_codes():
    from specverify.auditing.presets import PRESETS

    rows = re.findall(r"^\| `([\w-]+)` \| `(\w+)`, [^|]*\|([^|]*)\|([^|]*)\|([^|]*)\|([^|]*)\|", doc_text(), re.M)
    assert {row[0] for row in rows} == set(PRESETS), rows
    for name, budget, *levels in rows:
        preset = PRESETS[name]
        assert preset.budget == budget, name
        for level, cell in zip(("sampler", "tree", "decoder", "endpoint"), levels):
            quoted = re.findall(r"`([\w*-]+)`", cell)
            patterns = preset.checks[level]
            assert patterns is None or set(quoted) <= set(patterns), (name, level, quoted)
