"""GitHub Actions workflow annotations for an :class:`~specverify.auditing.audit_report.AuditReport`.

Printed by ``specverify audit`` when ``GITHUB_ACTIONS=true``: each failing or erroring finding
as an ``::error``, an underpowered plan as an ``::error``, each check left out for this
function as a ``::warning`` (with its fix), and the verdict as a ``::notice`` when it passed.
Annotations point at the target's file when the target is ``path/to/file.py:function``.
The workflow-command syntax escapes ``%``, CR and LF in messages and also ``:`` and ``,`` in
property values.
"""

from __future__ import annotations

from specverify.auditing.audit_report import AuditReport
from specverify.auditing.findings import grouped_findings


def _message(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _message(text).replace(":", "%3A").replace(",", "%2C")


def workflow_commands(report: AuditReport) -> list[str]:
    """The workflow-command lines of the annotations (see the module docstring)."""
    settings, plan, case = report.settings, report.plan, report.case_search.case
    where = ""
    path = settings.target.rsplit(":", 1)[0] if ":" in settings.target else ""
    if path.endswith(".py"):
        where = f"file={_property(path)},"
    lines = []
    for finding in grouped_findings(report.checks):
        title = _property(f"specverify {settings.level}: {', '.join(finding.names)} [{finding.verdict}]")
        body = finding.message
        if finding.verdict == "fail" and report.diagnosis:
            body += f"\ndiagnosis: {report.diagnosis}"
        lines.append(f"::error {where}title={title}::{_message(body)}")
    if plan.shortfall is not None and report.exit_code != 1:
        kind = "warning" if settings.allow_underpowered else "error"
        lines.append(f"::{kind} {where}title={_property('specverify: underpowered')}::"
                     f"{_message('underpowered: ' + plan.shortfall.sentence() + '; ' + plan.shortfall.fix())}")
    if report.exit_code != 0 and not report.checks:  # nothing ran: the summary is the one message
        lines.append(f"::error {where}title={_property('specverify: ' + report.verdict)}::{_message(report.summary)}")
    for omission in plan.omitted:
        lines.append(f"::warning {where}title={_property('specverify: not run')}::{_message(omission.line())}")
    if case is not None:
        lines.append(f"::error {where}title={_property('specverify: minimal failing case')}::"
                     f"{_message(case.sentence() + chr(10) + report.minimal_case_code())}")
    if report.exit_code == 0:
        lines.append(f"::notice title={_property('specverify: ' + report.verdict)}::{_message(report.summary)}")
    lines.append(f"::notice title={_property('specverify: replay')}::{_message(report.replay_command)}")
    return lines
