"""Built-in adapters that wrap third-party speculative decoding into the SPEC interfaces.

Each adapter lives in its own module and imports its engine lazily (the engines are optional
extras), so ``import specverify.adapters`` costs nothing.  They are registered as built-in audit
targets in :data:`specverify.loading.BUILTINS`:

- ``hf-transformers`` at the sampler level (SPEC §1): :func:`specverify.adapters.hf_sampler.verify`,
  transformers' speculative-sampling verification step;
- ``hf-transformers`` at the decoder level (SPEC §2): :func:`specverify.adapters.hf_generate.generate`,
  ``model.generate(assistant_model=draft)``; and ``hf-transformers-prompt-lookup``:
  :func:`specverify.adapters.hf_generate.generate_prompt_lookup`, ``model.generate(prompt_lookup_num_tokens=...)``.

What the audit finds for them is written up in ``docs/hf-transformers-findings.md``.
"""
