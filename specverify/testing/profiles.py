"""The Hypothesis profiles of specverify's test suites (the repository's tests and the packaged
property suite, :mod:`specverify.properties`), registered in one place.

- ``specverify``: derandomized (the same examples on every run and every xdist worker, so that a
  green CI is reproducible and the property suite's count of statistical executions,
  :mod:`specverify.properties.budget`, is exact), no deadline (sampled checks take seconds),
  the health checks for slow and large examples off, the failing example's blob printed;
- ``explore``: the same, not derandomized, 500 examples per test (looking for new failures).

``SPECVERIFY_HYPOTHESIS_PROFILE`` picks one (default ``specverify``).  The names are specverify's
own, so Hypothesis's ``default`` profile stays as Hypothesis defines it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE_ENV = "SPECVERIFY_HYPOTHESIS_PROFILE"
DEFAULT_PROFILE = "specverify"


def load_profile() -> str:
    """Register both profiles (again: idempotent) and load the one ``$SPECVERIFY_HYPOTHESIS_PROFILE``
    names; return its name."""
    settings.register_profile(
        DEFAULT_PROFILE,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    settings.register_profile("explore", parent=settings.get_profile(DEFAULT_PROFILE), derandomize=False,
                              max_examples=500)
    name = os.environ.get(PROFILE_ENV, DEFAULT_PROFILE)
    settings.load_profile(name)
    return name
