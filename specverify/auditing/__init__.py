"""The audit of code it does not trust, at four levels (docs/spec.md; docs/ARCHITECTURE.md maps it).

The folders are what an audit is made of:

- ``sampler/``, ``tree/``, ``decoder/``, ``endpoint/`` — one per level: its test laws, checks and
  battery (``battery.py``), and at the sampler and tree levels the known-bug catalog
  (``catalog.py``) that every check is shown to catch;
- ``isolation/`` — how the function under audit is called: a worker process, deadlines, faults,
  input views, captured warnings;
- ``reports/`` — the report formats (terminal, JSON, HTML, JUnit XML, GitHub annotations).

The modules beside them are the framework every level shares: ``checks`` (verdicts, budgets,
plans, results), ``runner`` (``audit``, ``assert_lossless``; ``specverify.audit`` is
:func:`specverify.auditing.runner.audit`), ``audit_report`` (the report: settings, plan, results),
``power`` (no power, no pass), ``defaults``, ``loading`` and ``signatures`` (targets and their
calls), ``diagnosis``, ``findings``, ``minimal_case`` and ``omissions`` (what a verdict says),
``progress`` and ``replay``.
"""
