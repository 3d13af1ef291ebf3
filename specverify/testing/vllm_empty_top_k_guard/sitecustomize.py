"""Imported by every Python process of a vLLM CPU server started with this folder on PYTHONPATH.

vLLM 0.32.0's CPU build crashes its engine on a speculative step whose verify batch has no rows:
the rejection sampler applies top-k to ``[0, V]`` target logits, and on CPU (no Triton, top-p
unset) ``apply_top_k_only`` calls ``k.max()`` on an empty tensor (``RuntimeError: max(): Expected
reduction dim to be specified for input.numel() == 0``), so the first request with ``top_k`` and
no top-p kills the server.  This guard returns the logits unchanged when ``k`` is empty (there is
nothing to mask) and calls vLLM's function otherwise, so every non-empty batch takes vLLM's own
code.  :func:`specverify.testing.vllm_servers.start_vllm` puts it on a candidate's path only when
asked (``guard_empty_top_k``), so that the rest of the audit can run past the crash.
"""

import vllm.v1.sample.ops.topk_topp_sampler as _topk_topp

_vllm_apply_top_k_only = _topk_topp.apply_top_k_only


def _apply_top_k_only_unless_empty(logits, k):
    return logits if k.numel() == 0 else _vllm_apply_top_k_only(logits, k)


_topk_topp.apply_top_k_only = _apply_top_k_only_unless_empty
