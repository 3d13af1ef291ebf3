"""The reference speculative decoder: a readable, exact implementation for Hugging Face causal LMs.

Read in this order:
- ``decoder.py``  — the loop (draft, score in one target pass, verify, roll back) and the SPEC §2
  adapter ``generate(target, draft, input_ids, *, max_new_tokens, temperature, top_k, top_p, seed)``;
- ``drafters.py`` — the drafter protocol and its four drafters: a separate small model, early
  exit (the target's first layers), an MTP head on the target's hidden states, prompt lookup
  (n-gram copy);
- ``kv.py``       — one KV cache for a batch of rows of different lengths (masks, positions, rollback);
- ``sequences.py``, ``request_stats.py`` — committed tokens per row; tokens per pass, acceptance by
  position and time per request.
"""
