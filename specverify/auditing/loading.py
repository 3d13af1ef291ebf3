"""Resolve an implementation under test from a string.

Accepted forms (docs/spec.md §1):
- ``path/to/file.py:function`` — a file anywhere on disk, imported under a private module name,
  with the file's folder on ``sys.path`` (as ``python file.py`` does), so it can import the
  modules next to it;
- ``package.module:function`` — a module importable from ``sys.path`` or, failing that, from the
  current directory (as ``python -m`` does), so a target printed by a test run in a project's
  root also loads from there;
- a built-in name registered in :data:`BUILTINS` (``reference``, ``greedy``, ...), or
  ``catalog:<name>`` for an entry of the known-bug catalog (``catalog:residual_is_target`` and
  ``catalog:residual-is-target`` name the same entry).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specverify.errors import SpecverifyError

# level -> name -> "module:attribute"; resolved lazily so that optional extras load only when used.
BUILTINS: dict[str, dict[str, str]] = {
    "sampler": {
        "reference": "specverify.core.rules:verify",
        "point-mass": "specverify.core.rules:point_mass_as_verify",
        "greedy": "specverify.core.rules:greedy_as_verify",
        "typical": "specverify.core.rules:typical_acceptance_as_verify",
        "hf-transformers": "specverify.hf.sampler_adapter:verify",
        # Real engines' verification code, unmodified (specverify.engines; `pip install specverify[ENGINE]`).
        "lmdeploy": "specverify.engines.lmdeploy_engine:verify",
        "lmdeploy-one-hot": "specverify.engines.lmdeploy_engine:verify_one_hot",
        "lmdeploy-greedy": "specverify.engines.lmdeploy_engine:verify_greedy",
        "lmdeploy-mixed": "specverify.engines.lmdeploy_engine:verify_mixed",
        "sglang": "specverify.engines.sglang_engine:verify",
        "sglang-one-hot": "specverify.engines.sglang_engine:verify_one_hot",
        "sglang-greedy": "specverify.engines.sglang_engine:verify_greedy",
        "sglang-triton": "specverify.engines.sglang_engine:verify_triton",
        "sglang-triton-one-hot": "specverify.engines.sglang_engine:verify_triton_one_hot",
        "sglang-chain-triton": "specverify.engines.sglang_engine:verify_chain_triton",
        "sglang-chain-block-triton": "specverify.engines.sglang_engine:verify_chain_block_triton",
        "vllm": "specverify.engines.vllm_engine:verify",
        "vllm-no-draft-probs": "specverify.engines.vllm_engine:verify_no_draft_probs",
        "vllm-greedy": "specverify.engines.vllm_engine:verify_greedy",
        "vllm-mixed": "specverify.engines.vllm_engine:verify_mixed",
    },
    "decoder": {
        "reference": "reference.decoder:generate",
        "reference-mtp": "reference.decoder:generate_mtp",
        "hf-transformers": "specverify.hf.generate_adapter:generate",
        "hf-transformers-prompt-lookup": "specverify.hf.generate_adapter:generate_prompt_lookup",
    },
    "tree": {
        "reference": "specverify.core.tree_rules:verify_tree",
        "point-mass": "specverify.core.tree_rules:point_mass_verify_tree",
        "greedy": "specverify.core.tree_rules:greedy_verify_tree",
        "typical": "specverify.core.tree_rules:typical_verify_tree",
        "unchanged-target": "specverify.core.tree_rules:unchanged_target_verify_tree",
        "thresholded": "specverify.core.tree_rules:thresholded_verify_tree",
        "sglang-style": "specverify.core.tree_layouts:sglang_style_verify_tree",
        "eagle-style": "specverify.core.tree_layouts:eagle_style_verify_tree",
        "sglang-tree-greedy-triton": "specverify.engines.sglang_engine:verify_tree_greedy_triton",
    },
}


class LoadError(SpecverifyError, ValueError):
    """The target string could not be resolved to a callable (exit status 2 in the CLI)."""


def load_target(spec: str, level: str = "sampler") -> Callable[..., Any]:
    """Return the callable named by ``spec`` (see the module docstring for the forms).

    ``level`` selects the table of built-in names: ``sampler`` (SPEC §1), ``decoder`` (SPEC §2) or
    ``tree`` (SPEC §3; ``catalog:<name>`` then names an entry of the tree bug catalog; at the
    decoder level, of the decoder bug catalog).
    """
    if level not in BUILTINS:
        raise LoadError(f"level: expected one of {sorted(BUILTINS)}, got {level!r}")
    if not spec or not isinstance(spec, str):
        raise LoadError("target: expected 'file.py:function', 'package.module:function' or a built-in name")
    builtins = BUILTINS[level]
    if spec in builtins:
        return _load_from_module(*builtins[spec].split(":"), spec=spec)
    if spec.startswith("catalog:") and level == "tree":
        from specverify.auditing.tree.catalog import TREE_CATALOG

        name = spec.split(":", 1)[1]
        if name not in TREE_CATALOG:
            raise LoadError(f"target: no tree catalog entry {name!r}; known: {', '.join(sorted(TREE_CATALOG))}")
        return TREE_CATALOG[name].fn
    if spec.startswith("catalog:") and level == "decoder":
        from specverify.auditing.decoder.catalog import DECODER_CATALOG

        name = catalog_key(spec.split(":", 1)[1])
        if name not in DECODER_CATALOG:
            raise LoadError(f"target: no decoder catalog entry {spec.split(':', 1)[1]!r}; known: "
                            f"{', '.join(sorted(DECODER_CATALOG))}")
        return DECODER_CATALOG[name].fn
    if spec.startswith("catalog:"):
        from specverify.auditing.sampler.catalog import CATALOG

        name = catalog_key(spec.split(":", 1)[1])
        if name not in CATALOG:
            raise LoadError(f"target: no catalog entry {spec.split(':', 1)[1]!r}; known: "
                            f"{', '.join(sorted(CATALOG))} (list them with `specverify audit --list`)")
        return CATALOG[name].fn
    if ":" not in spec:
        known = ", ".join(sorted(builtins))
        raise LoadError(
            f"target: {spec!r} is neither a built-in ({known}, catalog:<name>) nor of the form "
            "'path/to/file.py:function' or 'package.module:function'"
        )
    location, attribute = spec.rsplit(":", 1)
    if location.endswith(".py") or "/" in location or "\\" in location:
        return _load_from_file(Path(location), attribute, spec=spec)
    return _load_from_module(location, attribute, spec=spec)


def catalog_key(name: str) -> str:
    """The :data:`~specverify.auditing.sampler.catalog.CATALOG` key of a catalog name written with hyphens or
    underscores."""
    return name.strip().replace("-", "_")


def _load_from_module(module_name: str, attribute: str, *, spec: str) -> Callable[..., Any]:
    try:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as missing:
            # Not importable from sys.path: try the current directory, as `python -m` would (the
            # `specverify` console script does not put it on sys.path).
            top = module_name.split(".")[0]
            cwd = str(Path.cwd())
            if missing.name != top or cwd in sys.path:
                raise
            sys.path.append(cwd)
            module = importlib.import_module(module_name)
    except Exception as error:  # any import-time failure is "could not audit"
        raise LoadError(f"target {spec!r}: importing {module_name!r} failed: "
                        f"{type(error).__name__}: {error}") from error
    return _get_callable(module, attribute, spec=spec)


def _load_from_file(path: Path, attribute: str, *, spec: str) -> Callable[..., Any]:
    if not path.is_file():
        raise LoadError(f"target {spec!r}: file {str(path)!r} does not exist")
    resolved = path.resolve()
    module_name = "_specverify_target_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return _get_callable(sys.modules[module_name], attribute, spec=spec)
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise LoadError(f"target {spec!r}: cannot import {str(path)!r} as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    if str(resolved.parent) not in sys.path:  # as `python file.py`: the modules next to it import
        sys.path.insert(0, str(resolved.parent))
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise LoadError(f"target {spec!r}: executing {str(path)!r} failed: {type(error).__name__}: {error}") from error
    return _get_callable(module, attribute, spec=spec)


def _get_callable(module: object, attribute: str, *, spec: str) -> Callable[..., Any]:
    target = getattr(module, attribute, None)
    if target is None:
        defined = defined_callables(module)
        listing = ", ".join(defined) if defined else "none"
        close = difflib.get_close_matches(attribute, defined, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise LoadError(f"target {spec!r}: module has no attribute {attribute!r}{hint}; "
                        f"the functions and classes it defines: {listing}")
    if not callable(target):
        raise LoadError(f"target {spec!r}: {attribute!r} is a {type(target).__name__}, not a function")
    return target


def defined_callables(module: object) -> list[str]:
    """Names of the public functions and classes ``module`` defines itself (not the ones it imports)."""
    own = getattr(module, "__name__", None)
    return sorted(name for name, value in vars(module).items()
                  if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == own)
