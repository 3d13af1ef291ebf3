"""Fixtures of the endpoint-level tests: in-process toy servers (:mod:`specverify.testing.toy_server`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from specverify.testing.toy_server import ToyConfig, ToyServer


@pytest.fixture
def toy_server() -> Iterator[Callable[..., ToyServer]]:
    """Factory: ``toy_server(speculative=True, rule=..., fault=...)`` starts a toy server on
    127.0.0.1 (free port); every server started is stopped at the end of the test."""
    started: list[ToyServer] = []

    def start(**config: object) -> ToyServer:
        server = ToyServer(ToyConfig(**config)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
