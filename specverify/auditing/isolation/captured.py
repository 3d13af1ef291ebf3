"""Keep third-party warnings out of the terminal while an audit runs, and in its report.

The function under audit (transformers, an engine) may warn on every call — deprecation notices
through :mod:`warnings` or its logger — which would bury the audit's own output.
:func:`captured_warnings` collects them; the report lists each once with its count.
"""

from __future__ import annotations

import contextlib
import logging
import warnings as warnings_module
from collections import Counter
from collections.abc import Iterator


@contextlib.contextmanager
def captured_warnings() -> Iterator[list[str]]:
    """Collect what third-party code warns about inside the block — ``warnings.warn`` and log
    records of level WARNING or above from loggers outside specverify (transformers logs its
    deprecation notices) — as ``"Category: message (N×)"`` lines in first-seen order, instead of
    letting them reach the terminal; the list is filled when the block ends."""
    lines: list[str] = []
    records: list[str] = []

    original = logging.Logger.callHandlers

    def route(logger: logging.Logger, record: logging.LogRecord) -> None:  # loggers created inside too
        if record.levelno >= logging.WARNING and not record.name.startswith("specverify"):
            records.append(f"{record.name} {record.levelname.lower()}: {record.getMessage()}")
        else:
            original(logger, record)

    logging.Logger.callHandlers = route  # type: ignore[method-assign, assignment]
    try:
        with warnings_module.catch_warnings(record=True) as caught:
            warnings_module.simplefilter("always")
            yield lines
    finally:
        logging.Logger.callHandlers = original  # type: ignore[method-assign]
    records[:0] = [f"{w.category.__name__}: {w.message}" for w in caught]
    counts = Counter(records)
    lines.extend(f"{text} ({count}×)" if count > 1 else text for text, count in counts.items())
