"""The sampler level of the audit (SPEC §1: ``verify(target_probs, draft_probs, draft_tokens, generator)``).

- ``battery.py`` — the test laws, the toy-shape checks and :class:`SamplerBattery`;
- ``coverage.py`` — checks for how engines call a sampler (one row per call, ragged batches, late
  calls, truncated vocabularies, outputs that must stay valid);
- ``production.py``, ``production_laws.py`` — checks and exact laws at the shapes engines serve
  (vocabularies of real tokenizers, K up to 32, 1,024 rows, bf16/fp16 views);
- ``catalog.py`` — the known-bug catalog of chain rules, every check's proof that it can fail.
"""
