"""The tree level of the audit (SPEC §3: ``verify_tree(target_probs, draft_probs, tree_tokens, parents, generator)``).

- ``battery.py`` — toy-shape and production-shape checks (60-node dynamic trees) and :class:`TreeBattery`;
- ``catalog.py`` — the known-bug catalog of tree verifiers.
"""
