"""The formats of an :class:`~specverify.auditing.audit_report.AuditReport`.

``terminal.py`` (the summary table and the verdict), ``json_file.py`` (schema ``specverify.audit/1``),
``html_page.py`` (a self-contained page; ``tree_drawings.py`` draws failing trees in it),
``junit_xml.py`` (one test case per check) and ``github_annotations.py`` (workflow annotations).
"""
