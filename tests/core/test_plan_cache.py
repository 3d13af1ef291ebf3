"""The identity test's planning figures on disk (specverify.core.plan_cache): each figure is read
back exactly as computed, and an entry that cannot be trusted is computed again."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specverify.core import identity, plan_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.setenv(plan_cache.SWITCH_ENV, "1")
    return tmp_path / "plans"


def counted(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


@pytest.mark.parametrize(("kind", "value"), [(float, 0.1 + 0.2), (float, math.inf), (int, 123_457)])
def test_a_figure_is_computed_once_and_read_back_exactly(cache, kind, value):
    compute, calls = counted(value)
    assert plan_cache.remembered("figure", (1, 0.5), kind, compute) == value
    assert plan_cache.remembered("figure", (1, 0.5), kind, compute) == value and len(calls) == 1
    assert plan_cache.remembered("figure", (1, 0.25), kind, compute) == value and len(calls) == 2
    assert len(list(cache.glob("*.json"))) == 2 and not list(cache.glob("*.tmp"))


@pytest.mark.parametrize("content", ["", "{", '{"value": "12"}', '{"value": 0}', '{"value": true}', "[3]"])
def test_an_entry_that_cannot_be_trusted_is_computed_again_and_rewritten(cache, content):
    compute, calls = counted(12)
    path = plan_cache.entry_path("figure", ("law",))
    path.parent.mkdir(parents=True)
    path.write_text(content, encoding="utf-8")
    assert plan_cache.remembered("figure", ("law",), int, compute) == 12 and len(calls) == 1
    assert plan_cache.remembered("figure", ("law",), int, compute) == 12 and len(calls) == 1


def test_switched_off_or_unwritable_it_computes_every_time(cache, monkeypatch, tmp_path):
    compute, calls = counted(7)
    monkeypatch.setenv(plan_cache.SWITCH_ENV, "0")
    assert plan_cache.remembered("figure", (), int, compute) == 7 and not cache.exists()
    monkeypatch.setenv(plan_cache.SWITCH_ENV, "1")
    (tmp_path / "file").write_text("", encoding="utf-8")
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path / "file"))  # a file where the folder should be
    assert plan_cache.remembered("figure", (), int, compute) == 7
    assert plan_cache.remembered("figure", (), int, compute) == 7 and len(calls) == 3


def test_the_identity_plan_read_from_disk_is_the_computed_one(cache, monkeypatch):
    p = np.arange(1, 513, dtype=np.float64) ** -1.1
    p /= p.sum()
    n = identity.identity_sample_size(p, 0.3, alpha=1e-3, power=0.99)
    tv = identity.identity_detectable_tv(p, n, alpha=1e-3, power=0.99)
    assert len(list(cache.glob("*.json"))) == 2

    def not_computed(*args, **kwargs):
        raise AssertionError("the stored figure is read, not computed")

    monkeypatch.setattr(identity, "_cached_sample_size", not_computed)
    monkeypatch.setattr(identity, "_detectable_tv", not_computed)
    assert identity.identity_sample_size(p, 0.3, alpha=1e-3, power=0.99) == n
    assert identity.identity_detectable_tv(p, n, alpha=1e-3, power=0.99) == tv
    monkeypatch.undo()  # the computing functions back, the cache switched off
    monkeypatch.setenv(plan_cache.SWITCH_ENV, "0")
    identity._cached_sample_size.cache_clear()
    assert identity.identity_sample_size(p, 0.3, alpha=1e-3, power=0.99) == n
    assert identity.identity_detectable_tv(p, n, alpha=1e-3, power=0.99) == tv
