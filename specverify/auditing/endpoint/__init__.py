"""Endpoint level of the audit (SPEC §4): a running OpenAI-compatible completions server.

``specverify audit --level endpoint http://HOST:PORT/v1 --baseline http://HOST:PORT/v1``;
see :mod:`specverify.auditing.endpoint.battery`.
"""

from specverify.auditing.endpoint.battery import ENDPOINT_BUDGETS, EndpointBattery

__all__ = ["ENDPOINT_BUDGETS", "EndpointBattery"]
