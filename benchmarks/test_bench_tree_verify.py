"""1b. The tree verification step against the memory-copy bandwidth of the same machine, same run.

For every (B, N, V, dtype) the group holds, on the same inputs (:func:`benchmarks.workloads.
tree_verification_inputs`: a complete binary draft tree of N nodes per row):

- ``copy-into``: ``copy_()`` of the target and draft probabilities into buffers allocated before
  timing (the steady-state copy bandwidth);
- ``verify`` / ``verify+validate``: ``specverify.core.tree_rules.tree_rejection_sample`` without
  and with input validation (the default), which takes the native walk
  (``specverify.core.native_rules.tree_verify``) for these contiguous CPU float32/bfloat16 inputs;
- ``torch`` / ``torch+validate``: the same rule on its torch code (``SPECVERIFY_NATIVE=0``), timed
  side by side with the native walk in one run.

N = bytes of ``target_probs [B, N+1, V]`` + ``draft_probs [B, N, V]``; the fraction of copy-into
bandwidth of a variant is ``t(copy-into) / t(variant)`` (``benchmarks/report.py``).  The recursive
rule has no two-row shortcut: a rejected sibling updates the float64 residual of its whole row, so
its work grows with the number of rejections along the walk, up to N rows per request, and the totals
of the residuals are taken by ``torch.sum`` over the whole ``[B, V]`` float64 buffer after every node
with a rejection (on both paths: a C sum could not reproduce torch's summation order).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from benchmarks.test_bench_verify import dtype_name
from benchmarks.workloads import synchronized, tree_verification_inputs
from specverify.core import native_rules
from specverify.core.tree_rules import tree_rejection_sample

BATCHES = (1, 8, 64)
NUM_NODES = (4, 8)
VOCABS = (32_768, 131_072)
DTYPES = (torch.float32, torch.bfloat16)
VARIANTS = ("copy-into", "verify", "verify+validate", "torch", "torch+validate")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_name)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("num_nodes", NUM_NODES)
@pytest.mark.parametrize("batch", BATCHES)
def test_tree_verification_step(benchmark, variant: str, batch: int, num_nodes: int, vocab: int,
                                dtype: torch.dtype) -> None:
    device = "cpu"
    inputs = tree_verification_inputs(batch, num_nodes, vocab, dtype, device)
    generator = torch.Generator(device=device).manual_seed(0)
    if variant == "copy-into":
        target_buffer, draft_buffer = torch.empty_like(inputs.target_probs), torch.empty_like(inputs.draft_probs)

        def step():
            return target_buffer.copy_(inputs.target_probs), draft_buffer.copy_(inputs.draft_probs)
    else:
        validate = variant.endswith("+validate")
        torch_only = native_rules.disabled() if variant.startswith("torch") else contextlib.nullcontext()

        def step():
            with torch_only:
                return tree_rejection_sample(*inputs, generator, validate=validate)

    benchmark.group = f"tree B={batch} N={num_nodes} V={vocab} {dtype_name(dtype)} {device}"
    benchmark.extra_info.update(
        suite="verify-tree", variant=variant, batch=batch, num_draft=num_nodes, vocab=vocab,
        dtype=dtype_name(dtype), device=device, probability_bytes=inputs.probability_bytes,
    )
    benchmark(synchronized(step, device))
