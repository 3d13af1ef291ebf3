"""Drawings of the draft trees of failing tree checks, as inline SVG for the HTML report.

A tree check (:mod:`specverify.auditing.tree.battery`) records the shapes it drafted (``parameters["shapes"]``
or ``["shape"]``, SPEC §3 ``parents`` lists).  For each failing one the report shows every shape:
the root (the context's last token) at the top, node ``n`` labelled with its index, children left
to right in index order (the order in which a verifier tests siblings).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from specverify.auditing.checks import CheckResult

_STEP_X, _STEP_Y, _RADIUS = 34, 46, 12


def tree_svg(parents: Sequence[int]) -> str:
    """An SVG drawing of one tree shape (leaves spaced evenly, parents centred over their children)."""
    parents = [int(a) for a in parents]
    children: dict[int, list[int]] = {-1: []}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
        children.setdefault(node, [])
    x: dict[int, float] = {}
    depth: dict[int, int] = {-1: 0}
    next_leaf = [0]

    def place(node: int) -> None:
        for child in children[node]:
            depth[child] = depth[node] + 1
            place(child)
        if children[node]:
            x[node] = sum(x[c] for c in children[node]) / len(children[node])
        else:
            x[node] = next_leaf[0]
            next_leaf[0] += 1

    place(-1)
    width = max(1, next_leaf[0]) * _STEP_X + 2 * _RADIUS
    height = (max(depth.values()) + 1) * _STEP_Y + _RADIUS

    def centre(node: int) -> tuple[float, float]:
        return _RADIUS + x[node] * _STEP_X + _STEP_X / 2 - _RADIUS, _RADIUS + 4 + depth[node] * _STEP_Y

    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' height='{height:.0f}' role='img' "
             f"aria-label='tree with parents {html.escape(str(parents))}'>"]
    for node, parent in enumerate(parents):
        (x1, y1), (x2, y2) = centre(parent), centre(node)
        parts.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='#888'/>")
    for node in [-1] + list(range(len(parents))):
        cx, cy = centre(node)
        label = "root" if node < 0 else str(node)
        fill = "#ddd" if node < 0 else "#cfe3ff"
        parts.append(f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='{_RADIUS}' fill='{fill}' stroke='#333'/>"
                     f"<text x='{cx:.1f}' y='{cy + 4:.1f}' font-size='{9 if node < 0 else 11}' "
                     f"text-anchor='middle'>{label}</text>")
    parts.append("</svg>")
    return "".join(parts)


def tree_sections(checks: Sequence[CheckResult]) -> list[str]:
    """HTML sections drawing the shapes of every failing check that drafted trees."""
    sections = []
    for check in checks:
        if check.verdict != "fail":
            continue
        shapes = check.parameters.get("shapes") or ([check.parameters["shape"]] if "shape" in check.parameters else [])
        if not shapes:
            continue
        drawings = "".join(f"<figure style='display:inline-block;margin:0 18px'>{tree_svg(shape)}"
                           f"<figcaption><code>parents={html.escape(str(list(shape)))}</code></figcaption></figure>"
                           for shape in shapes)
        scheme = html.escape(str(check.parameters.get("scheme", "")))
        sections.append(f"<h3>Trees drafted by {html.escape(check.name)} ({scheme} siblings)</h3>"
                        f"<p>{html.escape(check.message)}</p><div>{drawings}</div>")
    return sections
