"""The Hypothesis property suite, shipped with the package so that a pip-installed specverify
runs it against any implementation::

    specverify properties path/to/impl.py:verify          # or
    pytest --pyargs specverify.properties --specverify-impl path/to/impl.py:verify

In a checkout, ``pytest properties`` runs the same files (``properties`` is a link to this folder).
The statistical budget of the suite is :mod:`specverify.properties.budget`.
"""
