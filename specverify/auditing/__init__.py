"""The audit: the check framework, the guarded calls (faults), one battery per level (sampler,
decoder), the known-bug catalog, target loading, the runner (``audit``/``assert_lossless``) and
the three report formats.  The function ``specverify.audit`` is :func:`specverify.auditing.runner.audit`."""
