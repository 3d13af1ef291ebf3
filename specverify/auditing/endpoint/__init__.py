"""The endpoint level of the audit (SPEC §4): a running OpenAI-compatible completions server.

``specverify audit --level endpoint http://HOST:PORT/v1 --baseline http://HOST:PORT/v1``; the
battery is :class:`specverify.auditing.endpoint.battery.EndpointBattery`.
"""
