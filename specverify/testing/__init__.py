"""The testing toolkit other projects import: Hypothesis strategies, the sampler harness that
drives a SPEC §1 function with drafts it samples itself, and the pytest plugin."""
