"""SGLang 0.5.23 on its CPU engine: EAGLE verification commits the target's argmax for sampled requests.

Run from the repository root (SGLang installed, engines.txt):  python scripts/sglang_cpu_eagle_greedy.py

1. ``sglang.srt.speculative.eagle_utils._verify_uses_greedy`` — executed from the installed source
   text (importing ``eagle_utils`` itself needs ``sgl_kernel``'s CPU build and torchvision's
   compiled ops, which this machine cannot load) — is True for a batch that is not all greedy when
   ``is_cpu`` (``SGLANG_USE_CPU_ENGINE=1`` on x86 or arm64).  ``eagle_sample`` then takes
   ``target_predict = torch.argmax(next_token_logits)`` and ``verify_tree_greedy_func`` whatever the
   requests' temperature, top-k and top-p; no server argument rejects sampled requests with EAGLE on
   the CPU engine (the fix in ``_verify_uses_greedy`` covers HIP only).
2. The consequence, audited: that path — the target's argmax at every node, walked by SGLang's
   greedy tree kernel (``verify_tree_greedy_triton``, which SGLang's XPU path runs; the CPU engine
   runs the same walk in ``sgl_kernel.verify_tree_greedy_cpu``) — against sampling, at the tree level.
3. The exact loss: a sampled request whose target law at a position is ``p`` gets ``argmax p`` with
   probability 1, so its first token is off by ``TV = 1 - max p`` (0.5 for p = (0.5, 0.3, 0.2)).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specverify.auditing.runner import audit  # noqa: E402
from specverify.core.tree_layouts import to_sglang_layout  # noqa: E402
from specverify.engines import sglang_engine  # noqa: E402  (sets up Triton's interpreter without a GPU)


def installed_function(module: str, name: str):
    """The function ``name`` of ``module``, compiled from the installed file's text alone."""
    import importlib.util

    path = importlib.util.find_spec(module).origin
    tree = ast.parse(Path(path).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace: dict = {}
    exec(compile(ast.Module([node], []), path, "exec"), {}, namespace)
    return namespace[name], ast.get_source_segment(Path(path).read_text(), node)


def cpu_engine_eagle_verify(target_probs, draft_probs, tree_tokens, parents, generator):
    """SPEC §3: what SGLang's CPU engine commits (``_verify_uses_greedy`` true): argmax at every node."""
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    batch, width_plus_root, _ = target_probs.shape
    candidates, retrive_index, next_token, next_sibling = to_sglang_layout(tree_tokens, parents)
    predicts = torch.zeros(batch * width_plus_root, dtype=torch.int32)
    accept_index = torch.full((batch, width_plus_root), -1, dtype=torch.int32)
    accept_token_num = torch.zeros(batch, dtype=torch.int32)
    verify_tree_greedy_triton(predicts, accept_index, accept_token_num, candidates, retrive_index, next_token,
                              next_sibling, target_probs.argmax(-1))
    kept = torch.arange(width_plus_root)[None, :] <= accept_token_num.long()[:, None]
    tokens = predicts[accept_index.clamp_min(0).long()].long()
    return torch.where(kept, tokens, torch.full_like(tokens, -1))


cpu_engine_eagle_verify.draft_schemes = ("deterministic",)


def main() -> None:
    uses_greedy, source = installed_function("sglang.srt.speculative.eagle_utils", "_verify_uses_greedy")
    print(source.splitlines()[-1].strip())
    for is_cpu in (False, True):
        decision = uses_greedy(is_all_greedy=False, is_cpu=is_cpu, is_hip=False, is_xpu=False,
                               use_rejection_sampling=True)
        print(f"sampled batch, is_cpu={is_cpu}: commits the argmax = {decision}")
    p = torch.tensor([0.5, 0.3, 0.2])
    print(f"exact loss of the first token for p = {p.tolist()}: TV = 1 - max p = {1 - p.max().item():.2f}")
    report = audit(cpu_engine_eagle_verify, level="tree", budget=500,
                   checks=["tree-siblings-deterministic", "tree-branches-deterministic"], isolation="none")
    print(report.summary)
    print(f"{sglang_engine.AUDITED_VERSION}: exit {report.exit_code}")


if __name__ == "__main__":
    main()
