"""JUnit XML rendering of an :class:`~specverify.auditing.audit_report.AuditReport`, for CI systems
(GitLab, Jenkins, Azure, CircleCI and GitHub test-report actions read it).

One ``<testsuite>`` per audit, one ``<testcase>`` per check (classname ``specverify.<level>``):
a failing check is a ``<failure>``, a check that could not judge the function an ``<error>``, a
check not run (fail-fast, an interrupt, or left out for this function, with its fix) a
``<skipped>``; the message is the check's.  A last test case, ``verdict``, carries what belongs
to the whole audit: an underpowered plan or a target that could not be audited at all is an
``<error>`` there, a loss a ``<failure>``, so a CI that reads only test cases is red exactly when
the exit status is not 0.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

from specverify.auditing.audit_report import AuditReport


def junit_tree(report: AuditReport) -> ElementTree.ElementTree:
    """The report as a JUnit XML element tree (see the module docstring)."""
    settings = report.settings
    classname = f"specverify.{settings.level}"
    suite = ElementTree.Element("testsuite", name=f"specverify audit {settings.target}")
    properties = ElementTree.SubElement(suite, "properties")
    for name, value in (("target", settings.target), ("level", settings.level), ("budget", settings.budget.name),
                        ("alpha", f"{settings.alpha:g}"), ("seed", str(settings.seed)), ("verdict", report.verdict),
                        ("exit_code", str(report.exit_code)), ("replay", report.replay_command)):
        ElementTree.SubElement(properties, "property", name=name, value=value)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for check in report.checks:
        case = ElementTree.SubElement(suite, "testcase", classname=classname, name=check.name,
                                      time=f"{check.seconds:.3f}")
        counts["tests"] += 1
        if check.verdict == "fail":
            _outcome(case, "failure", check.message, f"{check.description}\n{check.message}")
            counts["failures"] += 1
        elif check.verdict == "error":
            _outcome(case, "error", check.message, check.message)
            counts["errors"] += 1
        elif check.verdict == "skipped":
            ElementTree.SubElement(case, "skipped", message=check.message)
            counts["skipped"] += 1
    for omission in report.plan.omitted:
        for name in omission.names:
            case = ElementTree.SubElement(suite, "testcase", classname=classname, name=name, time="0")
            ElementTree.SubElement(case, "skipped", message=omission.line())
            counts["tests"] += 1
            counts["skipped"] += 1
    verdict = ElementTree.SubElement(suite, "testcase", classname=classname, name="verdict",
                                     time=f"{report.timings.get('total_s', 0.0):.3f}")
    counts["tests"] += 1
    text = f"{report.verdict.upper()} (exit {report.exit_code}): {report.summary}"
    details = "\n".join(part for part in (text, report.diagnosis and f"diagnosis: {report.diagnosis}",
                                          report.minimal_case_code(),
                                          f"replay: {report.replay_command}") if part)
    if report.exit_code == 1:
        _outcome(verdict, "failure", text, details)
        counts["failures"] += 1
    elif report.exit_code != 0:
        _outcome(verdict, "error", text, details)
        counts["errors"] += 1
    for key, count in counts.items():
        suite.set(key, str(count))
    suite.set("time", f"{report.timings.get('total_s', 0.0):.3f}")
    root = ElementTree.Element("testsuites", {"name": "specverify"} | {k: suite.attrib[k] for k in (*counts, "time")})
    root.append(suite)
    ElementTree.indent(root)
    return ElementTree.ElementTree(root)


def _outcome(case: ElementTree.Element, kind: str, message: str, text: str) -> None:
    element = ElementTree.SubElement(case, kind, message=message[:1000])
    element.text = text


def write_junit(report: AuditReport, path: str | Path) -> Path:
    """Write :func:`junit_tree` to ``path`` (UTF-8, with an XML declaration) and return the path."""
    path = Path(path)
    junit_tree(report).write(path, encoding="utf-8", xml_declaration=True)
    return path
