"""specverify.hf.server_checkpoints: the tiny target saved as a MiMo checkpoint with an MTP layer.

The decoder of :func:`write_tiny_mimo`'s checkpoint is the Llama target's (Qwen2 with zero q/k/v
biases), and its MTP layer carries every weight vLLM's ``MiMoMTP`` loads.  Runtime: 10 s at
load ≈ 6 (the 512-token target and draft written once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specverify.hf.server_checkpoints import write_tiny_mimo, write_tiny_target_and_draft

MTP_LAYER_WEIGHTS = {
    "input_proj.weight",
    "token_layernorm.weight",
    "hidden_layernorm.weight",
    "final_layernorm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Llama target folder, MiMo folder)."""
    folder = Path(tmp_path_factory.mktemp("tiny-server-models"))
    target, _ = write_tiny_target_and_draft(folder)
    return target, write_tiny_mimo(folder / "mimo", target)


def test_the_mimo_decoder_is_the_llama_target(checkpoints: tuple[Path, Path]) -> None:
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    target, mimo = checkpoints
    tokens = torch.randint(1, 512, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        llama = LlamaForCausalLM.from_pretrained(target)(tokens).logits
        qwen2 = Qwen2ForCausalLM.from_pretrained(mimo)(tokens).logits
    assert torch.equal(llama, qwen2)


def test_the_mimo_checkpoint_declares_and_carries_one_mtp_layer(checkpoints: tuple[Path, Path]) -> None:
    from safetensors import safe_open

    _, mimo = checkpoints
    config = json.loads((mimo / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["num_nextn_predict_layers"]) == (
        ["MiMoForCausalLM"],
        "qwen2",
        1,
    )
    with safe_open(str(mimo / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    prefix = "model.mtp_layers.0."
    assert {name.removeprefix(prefix) for name in names if name.startswith(prefix)} == MTP_LAYER_WEIGHTS
    assert not list(mimo.glob("tokenizer*")), "the folder must be served with the target's tokenizer"
