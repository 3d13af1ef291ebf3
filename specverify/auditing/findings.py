"""The failing and erroring checks of a report, with repeated messages said once.

A function that breaks the output contract (a float tensor of the wrong shape) makes every check
stop with the same message, differing only in the batch sizes of each check and in where the
call was made (``the function (in call 1 of 520, batch-size-1) raised …``); a report repeating it
18 times buries the one thing to fix.  :func:`grouped_findings` groups the non-passing checks
whose verdict, fault and message agree once digits and the ``(in …)`` of the call are ignored,
keeping the first message; :func:`said_in_summary` tells a report that the verdict line already
carries a finding, so it is not printed a second time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Finding:
    """``names``: the checks with this finding (in run order); ``verdict``; ``message``: the first one's."""

    names: tuple[str, ...]
    verdict: str
    message: str

    def line(self) -> str:
        if len(self.names) == 1:
            return f"{self.names[0]} [{self.verdict}]: {self.message}"
        shown = ", ".join(self.names) if len(self.names) <= 4 else f"{', '.join(self.names[:3])}, … {self.names[-1]}"
        return (f"{len(self.names)} checks ({shown}) [{self.verdict}]: {self.message} "
                f"(said once for all of them: their messages differ only in numbers)")


def _key(check: Any) -> tuple[str, str, str]:
    message = re.sub(r"\(in [^()]*\)", "(in CHECK)", check.message.replace(f"in {check.name}", "in CHECK"))
    return str(check.verdict), str(check.fault), re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", message)


def grouped_findings(checks: Sequence[Any]) -> list[Finding]:
    """Failing checks first, then erroring ones; checks with the same finding merged (see the module docstring).
    Statistical failures (which carry their own p-values and deviations) are never merged."""
    groups: dict[tuple[str, str, str], list[Any]] = {}
    for verdict in ("fail", "error"):
        for check in checks:
            if str(check.verdict) != verdict:
                continue
            key = _key(check) if check.fault is not None or verdict == "error" else (check.name, "", "")
            groups.setdefault(key, []).append(check)
    return [Finding(tuple(c.name for c in members), str(members[0].verdict), members[0].message)
            for members in groups.values()]


def said_in_summary(finding: Finding, report: Any) -> bool:
    """Whether the report's verdict line already states ``finding`` (an error finding of an audit
    that could not audit: its summary is that message), so that a report says it once."""
    return finding.verdict == "error" and report.exit_code != 1 and finding.message in report.summary
