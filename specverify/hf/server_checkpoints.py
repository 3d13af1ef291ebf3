"""Tiny random checkpoints that a real serving engine loads from disk: a target, a draft, one tokenizer.

A server audit through the completions API needs a model the server can load (``config.json``,
safetensors weights, a tokenizer it can read) that is fast on a CPU and whose next-token laws are
peaked and vary from context to context.  :func:`write_tiny_target_and_draft` saves
:func:`specverify.hf.tiny_models.tiny_target_and_draft`'s pair (a 2-layer Llama target and, by
default, a copy with 10% noise on every weight: per-token acceptance ``sum_x min(p, q)`` 0.73–0.84 at
T = 1 after the endpoint audit's prompts, measured) with a **character tokenizer** into two folders.

Every token of the character tokenizer but the end token is one Unicode character (ASCII printable,
newline, tab, then letters from U+00A1 on that NFC and NFKC leave unchanged and that combine with
nothing), tokenization splits text into characters, and decoding concatenates them.  So the text of
any token sequence re-tokenizes to exactly that sequence: the endpoint audit's ``echo`` re-scoring
(``specverify.auditing.endpoint.scoring``) reaches every position a random model samples, which a
byte-level BPE would not (a random model emits invalid UTF-8 and non-canonical merges).  Token id 0
is ``<|endoftext|>``, the models' end token.

Two speculation heads for the target: :func:`write_tiny_eagle_head` (an EAGLE head read beside the
target) and :func:`write_tiny_mimo` (the target as a MiMo checkpoint carrying its own multi-token
prediction layer).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import NamedTuple

END_TOKEN = "<|endoftext|>"
RECORD = "specverify-tiny-checkpoint.json"
FIRST_EXTRA_CHARACTER = 0xA1


class TinyCheckpoints(NamedTuple):
    """The folders of a saved target and draft (each with the same tokenizer)."""

    target: Path
    draft: Path


def character_alphabet(size: int) -> list[str]:
    """The first ``size`` characters of the tokenizer's alphabet: ASCII printable, ``\\n``, ``\\t``,
    then letters from U+00A1 on that are their own NFC and NFKC form and not combining marks."""
    alphabet = [chr(code) for code in range(32, 127)] + ["\n", "\t"]
    code = FIRST_EXTRA_CHARACTER
    while len(alphabet) < size:
        char = chr(code)
        if (
            char.isalpha()
            and not unicodedata.combining(char)
            and unicodedata.normalize("NFC", char) == char == unicodedata.normalize("NFKC", char)
        ):
            alphabet.append(char)
        code += 1
    return alphabet[:size]


def character_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    """A fast tokenizer of ``vocab_size`` ids: id 0 the end token, ids 1.. one character each."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {END_TOKEN: 0} | {char: index + 1 for index, char in enumerate(character_alphabet(vocab_size - 1))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per character
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([END_TOKEN])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=END_TOKEN,
        bos_token=None,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )


def write_tiny_target_and_draft(
    folder: Path,
    *,
    vocab_size: int = 512,
    hidden_size: int = 128,
    seed: int = 0,
    logit_scale: float = 3.0,
    draft_layers: int = 2,
    draft_noise: float = 0.1,
    max_positions: int = 4096,
) -> TinyCheckpoints:
    """Save the tiny target and draft under ``folder/target`` and ``folder/draft`` (float32
    safetensors, the character tokenizer in each), unless a record of the same settings is there.

    The weights are :func:`~specverify.hf.tiny_models.tiny_target_and_draft`'s (two heads of
    ``hidden_size / 2``; logits of standard deviation ``logit_scale`` after the final norm, so the
    laws are peaked and depend on the context: top-1 0.15–0.29, top-8 0.57–0.69, entropy 3.2–3.5
    nats measured after the audit's prompts; ``draft_layers`` and ``draft_noise`` make the draft);
    ``max_positions`` is the context a server may
    allocate (RoPE has no learnt positions).
    """
    from specverify.hf.tiny_models import tiny_target_and_draft

    folder = Path(folder)
    settings = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "seed": seed,
        "logit_scale": logit_scale,
        "draft_layers": draft_layers,
        "draft_noise": draft_noise,
        "max_positions": max_positions,
    }
    paths = TinyCheckpoints(target=folder / "target", draft=folder / "draft")
    record = folder / RECORD
    if record.is_file() and json.loads(record.read_text()) == settings:
        return paths
    tokenizer = character_tokenizer(vocab_size)
    models = tiny_target_and_draft(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        seed=seed,
        logit_scale=logit_scale,
        draft_layers=draft_layers,
        draft_noise=draft_noise,
    )
    for model, path in zip(models, paths):
        model.config.max_position_embeddings = max_positions
        model.config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    record.write_text(json.dumps(settings))
    return paths


def write_tiny_eagle_head(folder: Path, target: Path, *, seed: int = 2) -> Path:
    """Save a random EAGLE head for the target saved at ``target`` into ``folder`` (once).

    vLLM's EAGLE draft for a Llama target (``EagleLlamaForCausalLM``, method ``"eagle"``) reads a
    one-layer Llama config and the weights ``fc.weight`` (``[h, 2h]``: it maps the concatenation
    of the next token's embedding and the target's hidden state to ``h``) and ``layers.0.*``
    (attention, MLP, ``post_attention_layernorm``; the first layer has no input norm), and shares
    the target's embedding and output head.  Weights are N(0, 1/fan_in), norms 1: the head drafts
    from the target's hidden states with a law of its own (random, so acceptance is low; the
    verification path is the same whatever the drafts).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    config = AutoConfig.from_pretrained(target)
    config.num_hidden_layers = 1
    hidden, inner = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = hidden // heads
    shapes = {
        "fc.weight": (hidden, 2 * hidden),
        "layers.0.self_attn.q_proj.weight": (heads * head_dim, hidden),
        "layers.0.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "layers.0.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "layers.0.mlp.gate_proj.weight": (inner, hidden),
        "layers.0.mlp.up_proj.weight": (inner, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inner),
    }
    generator = torch.Generator().manual_seed(seed)
    weights = {name: torch.randn(shape, generator=generator) / shape[1] ** 0.5 for name, shape in shapes.items()}
    weights["layers.0.post_attention_layernorm.weight"] = torch.ones(hidden)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(target).save_pretrained(folder)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def write_tiny_mimo(folder: Path, target: Path, *, seed: int = 3) -> Path:
    """Save the target at ``target`` as a MiMo checkpoint with one random MTP layer into ``folder`` (once).

    MiMo (``MiMoForCausalLM``) is a Qwen2 decoder, which is Llama's with biases on the q, k and v
    projections: with those biases zero the checkpoint's decoder computes exactly the Llama
    target's logits.  ``num_nextn_predict_layers = 1`` adds the MTP layer vLLM's method ``"mtp"``
    drafts with (``MiMoMTP``): from the target's last hidden state ``h_t`` and the embedding
    ``e_{t+1}`` of the token after it, ``final_layernorm(block(input_proj([norm(h_t), norm(e_{t+1})])))``
    through the target's output head is the law of token ``t + 2``; for more than one speculative
    token the layer runs again on its own output.  The layer's weights (``model.mtp_layers.0.*``:
    ``input_proj`` ``[h, 2h]``, a Qwen2 decoder block, the three norms) are N(0, 1/fan_in), biases
    zero, norms 1, so drafts are random and acceptance low; the verification path is the same
    whatever the drafts.

    The folder holds no tokenizer: transformers loads any tokenizer beside a ``qwen2`` config as
    Qwen2's byte-level BPE, whose decoder maps the character tokenizer's letters back to bytes;
    serve it with the target's (vLLM's ``--tokenizer TARGET``).
    """
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig

    folder = Path(folder)
    if (folder / "model.safetensors").is_file():
        return folder
    config = json.loads((Path(target) / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    weights = load_file(str(Path(target) / "model.safetensors"))
    projections = {"q_proj": heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
    for layer in range(config["num_hidden_layers"]):
        for projection, width in projections.items():
            weights[f"model.layers.{layer}.self_attn.{projection}.bias"] = torch.zeros(width)
    prefix = "model.mtp_layers.0."
    shapes = {
        "input_proj.weight": (hidden, 2 * hidden),
        "self_attn.o_proj.weight": (hidden, heads * head_dim),
        "mlp.gate_proj.weight": (inner, hidden),
        "mlp.up_proj.weight": (inner, hidden),
        "mlp.down_proj.weight": (hidden, inner),
    } | {f"self_attn.{projection}.weight": (width, hidden) for projection, width in projections.items()}
    generator = torch.Generator().manual_seed(seed)
    for name, shape in sorted(shapes.items()):
        weights[prefix + name] = torch.randn(shape, generator=generator) / shape[1] ** 0.5
    for projection, width in projections.items():
        weights[f"{prefix}self_attn.{projection}.bias"] = torch.zeros(width)
    for norm in (
        "token_layernorm",
        "hidden_layernorm",
        "input_layernorm",
        "post_attention_layernorm",
        "final_layernorm",
    ):
        weights[f"{prefix}{norm}.weight"] = torch.ones(hidden)
    config |= {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "num_nextn_predict_layers": 1,
        "use_sliding_window": False,
    }
    for llama_only in ("attention_bias", "mlp_bias", "pretraining_tp"):
        config.pop(llama_only, None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    GenerationConfig.from_pretrained(target).save_pretrained(folder)
    save_file(
        {name: tensor.contiguous() for name, tensor in weights.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder
