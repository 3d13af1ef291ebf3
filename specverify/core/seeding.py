"""Deterministic seeds derived from a test's parameters.

A statistical check must be reproducible in CI and must not let a search (Hypothesis shrinking,
a retry loop) hunt for a lucky seed.  Every seed in the suite is therefore a hash of the check's
own parameters plus one *base seed* chosen for the whole run: ``0`` by default (reproducible), or
a fresh random value in random-seed mode, which is how the false-positive rate is measured.
"""

from __future__ import annotations

import hashlib
import secrets

DEFAULT_BASE_SEED = 0


def derive_seed(*parts: object, base: int = DEFAULT_BASE_SEED) -> int:
    """Return a 63-bit seed that is a pure function of ``parts`` and ``base``.

    ``parts`` are rendered with ``repr`` (so floats, tuples and strings all work) and hashed with
    BLAKE2b; equal parameters give equal seeds in every process and on every platform.
    """
    text = repr((base, parts)).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def random_base_seed() -> int:
    """A fresh base seed for random-seed mode (print it so that a failure can be replayed)."""
    return secrets.randbits(63)


def parse_base_seed(value: str | int | None) -> int:
    """Parse a ``--specverify-seed`` value: an integer, or ``random`` for a fresh seed."""
    if value is None:
        return DEFAULT_BASE_SEED
    if isinstance(value, int):
        return value
    if value.strip().lower() == "random":
        return random_base_seed()
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"seed: expected an integer or 'random', got {value!r}; pass e.g. --specverify-seed 0"
        ) from None
