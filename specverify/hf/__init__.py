"""Built-in adapters that wrap third-party speculative decoding into the SPEC interfaces.

Each adapter lives in its own module and imports its engine lazily (the engines are optional
extras), so ``import specverify.hf`` costs nothing.  They are registered as built-in audit
targets in :data:`specverify.auditing.loading.BUILTINS`:

- ``hf-transformers`` at the sampler level (SPEC §1): :func:`specverify.hf.sampler_adapter.verify`,
  transformers' speculative-sampling verification step;
- ``hf-transformers`` at the decoder level (SPEC §2): :func:`specverify.hf.generate_adapter.generate`,
  ``model.generate(assistant_model=draft)``; and ``hf-transformers-prompt-lookup``:
  :func:`specverify.hf.generate_adapter.generate_prompt_lookup`, ``model.generate(prompt_lookup_num_tokens=...)``.

What the audit finds for them is written up in ``docs/hf-transformers-findings.md``.
"""
