"""Workloads shared by the benchmark files and their smoke test: inputs, prompts, decoders, timers.

Each function does one thing and is sized by its arguments, so that ``benchmarks/test_bench_*.py``
run them at full size and ``tests/test_benchmarks_smoke.py`` runs the same code on tiny sizes.

Decoders compared (all greedy, ``temperature == 0``, never stopping at EOS, so every method makes
exactly ``max_new_tokens`` tokens):

- ``plain``: Hugging Face ``generate`` without an assistant (one target pass per token);
- ``reference-<drafter>``: :func:`reference.decoder.speculative_generate` with a drafter of
  ``reference.drafters``;
- ``hf-<drafter>``: Hugging Face assisted generation with the same drafter, set up to do the same
  work: ``γ`` draft tokens per pass (constant schedule, no confidence cut-off);
- ``hf-<drafter>-defaults``: Hugging Face assisted generation with its shipped settings.

Target passes are counted with a forward hook on the target module (prefill included), so the
tokens per target pass of every method are counted the same way.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from specverify.core.processing import process_logits
from specverify.core.rules import greedy_verify, rejection_sample

GAMMA = 4
"""Draft tokens per step γ of every speculative decoder benchmarked."""

EARLY_EXIT_LAYERS = 4
"""Layers of the early-exit draft (SmolLM2-135M has 30): a cheap draft that is still a model.  Its
greedy agreement with the full model is ~6% on code (teacher-forced; 12% after 20 layers, 51% after
29), so the early-exit rows compare the decoders' cost at equal work, not a useful speedup."""

DRAFTERS = ("prompt-lookup", "early-exit")

CODE_EDIT_PROMPTS: tuple[str, ...] = (
    # 1. rename a variable: the answer repeats the function almost verbatim
    "# Original version\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        total = 0\n"
    "        for j in range(window):\n"
    "            total += values[i + j]\n"
    "        result.append(total / window)\n"
    "    return result\n"
    "\n\n# Same function, with `result` renamed to `averages`\n",
    # 2. add type hints to a small class
    "# Before: no type hints\n"
    "class Inventory:\n"
    "    def __init__(self):\n"
    "        self.items = {}\n"
    "\n"
    "    def add(self, name, count):\n"
    "        self.items[name] = self.items.get(name, 0) + count\n"
    "\n"
    "    def remove(self, name, count):\n"
    "        left = self.items.get(name, 0) - count\n"
    "        if left < 0:\n"
    "            raise ValueError(name)\n"
    "        self.items[name] = left\n"
    "\n"
    "    def total(self):\n"
    "        return sum(self.items.values())\n"
    "\n\n# After: the same class with type hints\n",
    # 3. continue a repetitive structure (one method per field)
    "from dataclasses import dataclass\n\n\n"
    "@dataclass\n"
    "class Settings:\n"
    "    host: str\n"
    "    port: int\n"
    "    user: str\n"
    "    timeout: float\n"
    "\n"
    "    def with_host(self, host: str) -> 'Settings':\n"
    "        return Settings(host, self.port, self.user, self.timeout)\n"
    "\n"
    "    def with_port(self, port: int) -> 'Settings':\n"
    "        return Settings(self.host, port, self.user, self.timeout)\n"
    "\n"
    "    def with_user(self, user: str) -> 'Settings':\n",
    # 4. fix a bug: the answer copies the function with one line changed
    "# Buggy: the loop skips the last element\n"
    "def largest(numbers):\n"
    "    best = numbers[0]\n"
    "    for index in range(1, len(numbers) - 1):\n"
    "        if numbers[index] > best:\n"
    "            best = numbers[index]\n"
    "    return best\n"
    "\n\n# Fixed: the loop now visits every element\n",
)
"""Completion-style code/edit prompts (no chat template: a 135M model copies code far more
reliably when primed with the start of the answer than when asked in a chat turn)."""


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def synchronize(device: torch.device | str) -> None:
    """Wait for queued CUDA kernels (no-op on CPU), so that a wall-clock reading covers them."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


CLOCK: Callable[[], float] = time.perf_counter
"""The clock of the phase timers inside benchmarks; ``benchmarks/conftest.py`` sets it to
pytest-benchmark's ``--benchmark-timer`` so that phases and whole benchmarks share one clock
(``time.process_time`` measures this process's CPU time, robust to other processes on a shared
machine, and equal to wall time for a single-threaded run on an idle one)."""


def set_clock(clock: Callable[[], float]) -> None:
    global CLOCK
    CLOCK = clock


def timed(fn: Callable[[], Any], device: torch.device | str = "cpu") -> tuple[Any, float]:
    """``(fn(), seconds on CLOCK)``, synchronising CUDA before and after."""
    synchronize(device)
    start = CLOCK()
    result = fn()
    synchronize(device)
    return result, CLOCK() - start


def synchronized(fn: Callable[[], Any], device: torch.device | str) -> Callable[[], Any]:
    """``fn`` followed by a CUDA synchronisation, for the benchmark fixture to time."""
    if torch.device(device).type != "cuda":
        return fn

    def run() -> Any:
        result = fn()
        torch.cuda.synchronize(device)
        return result

    return run


# --------------------------------------------------------------------------------------------
# 1. Verification inputs
# --------------------------------------------------------------------------------------------


class VerificationInputs(NamedTuple):
    """One step's verification inputs: ``target_probs [B, K+1, V]``, ``draft_probs [B, K, V]``,
    ``draft_tokens [B, K]`` (drawn from ``draft_probs``)."""

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor

    @property
    def probability_bytes(self) -> int:
        """Bytes of target and draft probabilities: what a step that reads every input moves."""
        return (self.target_probs.numel() + self.draft_probs.numel()) * self.target_probs.element_size()

    @property
    def needed_row_bytes(self) -> int:
        """Bytes the rule itself must read without validation: ``p`` and ``q`` at the ``B·K`` draft
        tokens plus one target row and one draft row per request (the residual ``(p_n − q_n)+``)."""
        batch, num_draft, vocab = self.draft_probs.shape
        return (2 * batch * num_draft + 2 * batch * vocab) * self.target_probs.element_size()


@functools.lru_cache(maxsize=1)
def verification_inputs(
    batch: int, num_draft: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0
) -> VerificationInputs:
    """Random but realistic inputs: peaked target laws ``p = softmax(3 z)`` and correlated draft laws
    ``q = softmax(3 z + 1.5 z')`` (z, z' standard normal), draft tokens drawn from ``q``; cast to
    ``dtype`` after the draw so that every draft token keeps a positive draft probability.
    Cached (the last call only): the benchmark grid asks for the same inputs three times in a row.
    """
    generator = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch, num_draft + 1, vocab, generator=generator)
    target_probs = torch.softmax(logits, dim=-1)
    draft_logits = logits[:, :-1] + 1.5 * torch.randn(batch, num_draft, vocab, generator=generator)
    draft_probs = torch.softmax(draft_logits, dim=-1)
    del logits, draft_logits
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).reshape(batch, num_draft)
    return VerificationInputs(
        target_probs.to(device=device, dtype=dtype),
        draft_probs.to(device=device, dtype=dtype),
        draft_tokens.to(device),
    )


class TreeVerificationInputs(NamedTuple):
    """One tree step's inputs (SPEC §3): ``target_probs [B, N+1, V]``, ``draft_probs [B, N, V]``,
    ``tree_tokens [B, N]`` (drawn from ``draft_probs``), ``parents [B, N]``."""

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    tree_tokens: torch.Tensor
    parents: torch.Tensor

    @property
    def probability_bytes(self) -> int:
        """Bytes of target and draft probabilities: what a step that reads every input moves."""
        return (self.target_probs.numel() + self.draft_probs.numel()) * self.target_probs.element_size()


def binary_tree_parents(num_nodes: int) -> list[int]:
    """Parents of a complete binary tree in breadth-first order: ``[-1, -1, 0, 0, 1, 1, 2, 2, ...]``
    (two children of the root, two of each node after)."""
    return [node // 2 - 1 for node in range(num_nodes)]


@functools.lru_cache(maxsize=1)
def tree_verification_inputs(
    batch: int, num_nodes: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0
) -> TreeVerificationInputs:
    """A complete binary draft tree per row (:func:`binary_tree_parents`) with the laws of
    :func:`verification_inputs`: target ``p_n = softmax(3 z_n)``, draft law of node ``n``
    ``softmax(3 z_parent + 1.5 z')`` (correlated with the target law at its parent), tokens drawn
    from it, cast to ``dtype`` after the draw.  Cached (the last call only)."""
    generator = torch.Generator().manual_seed(seed)
    parents = torch.tensor(binary_tree_parents(num_nodes), dtype=torch.int64).expand(batch, num_nodes).contiguous()
    logits = 3.0 * torch.randn(batch, num_nodes + 1, vocab, generator=generator)
    target_probs = torch.softmax(logits, dim=-1)
    at_parent = logits[:, (parents[0] + 1)]
    draft_probs = torch.softmax(at_parent + 1.5 * torch.randn(batch, num_nodes, vocab, generator=generator), dim=-1)
    del logits, at_parent
    tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).reshape(batch, num_nodes)
    return TreeVerificationInputs(
        target_probs.to(device=device, dtype=dtype), draft_probs.to(device=device, dtype=dtype),
        tokens.to(device), parents.to(device),
    )


# --------------------------------------------------------------------------------------------
# Models and prompts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelUnderTest:
    """A loaded target and the prompts to decode: what the model benchmarks need.

    ``prompts``: 1-D int64 token tensors of different lengths.  ``early_exit_layers``: layers of
    the early-exit draft.  ``draft_model``: a separate draft LM sharing the vocabulary, or None.
    """

    name: str
    model: Any
    prompts: tuple[torch.Tensor, ...]
    early_exit_layers: int = EARLY_EXIT_LAYERS
    draft_model: Any | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def encode_prompts(tokenizer: Any, texts: Sequence[str] = CODE_EDIT_PROMPTS) -> tuple[torch.Tensor, ...]:
    """Each text as a 1-D int64 token tensor (no special tokens added)."""
    return tuple(torch.tensor(tokenizer(text)["input_ids"], dtype=torch.int64) for text in texts)


def batch_of_prompts(prompts: Sequence[torch.Tensor], batch: int) -> list[torch.Tensor]:
    """``batch`` prompts cycling through ``prompts`` (rows of different lengths, as in serving)."""
    return [prompts[row % len(prompts)] for row in range(batch)]


def equal_length_batch(prompts: Sequence[torch.Tensor], batch: int) -> torch.Tensor:
    """``[batch, L]``: the last ``L = min length`` tokens of the cycled prompts (no padding needed)."""
    rows = batch_of_prompts(prompts, batch)
    length = min(len(row) for row in rows)
    return torch.stack([row[-length:] for row in rows])


def left_padded(prompts: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [B, L], attention_mask [B, L])`` with the prompts right-aligned (left padding)."""
    length = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), length), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros(len(prompts), length, dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, length - len(prompt):] = prompt
        attention_mask[row, length - len(prompt):] = 1
    return input_ids, attention_mask


# --------------------------------------------------------------------------------------------
# 2 and 5. One decoding step of the target, by phase
# --------------------------------------------------------------------------------------------


@dataclass
class StepState:
    """A target KV cache holding ``context_length`` tokens per row, and one step's draft.

    ``block [B, γ+1]``: the last context token then the γ draft tokens; ``draft_probs [B, γ, V]``
    the law the drafts were drawn from (a fixed random law: verification cost does not depend on
    which law it is).
    """

    model: Any
    cache: Any
    context_length: int
    block: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor
    generator: torch.Generator


@torch.no_grad()
def prepare_step(unit: ModelUnderTest, batch: int, gamma: int = GAMMA, seed: int = 0) -> StepState:
    """Prefill the target with ``batch`` equal-length prompts (all tokens but the last) and draw a
    random draft of γ tokens per row."""
    from transformers import DynamicCache

    device = unit.device
    context = equal_length_batch(unit.prompts, batch).to(device)
    cache = DynamicCache(config=unit.model.config)
    unit.model(input_ids=context[:, :-1], cache=cache, use_cache=True)
    vocab = unit.model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator(device=device).manual_seed(seed)
    draft_logits = 3.0 * torch.randn(batch, gamma, vocab, generator=generator, device=device)
    draft_probs = process_logits(draft_logits, temperature=1.0)
    draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=generator).reshape(batch, gamma)
    block = torch.cat([context[:, -1:], draft_tokens], dim=1)
    return StepState(unit.model, cache, context.shape[1] - 1, block, draft_probs, draft_tokens, generator)


@torch.no_grad()
def target_pass(state: StepState, width: int) -> torch.Tensor:
    """One target forward pass over the first ``width`` tokens of the step's block; the cache is
    cropped back to the context afterwards, so passes can be repeated.  Returns the logits."""
    logits = state.model(input_ids=state.block[:, :width], cache=state.cache, use_cache=True).logits
    state.cache.crop(-width)  # transformers 5.x: a negative argument removes that many columns
    return logits


def decoding_step(state: StepState, rule: str) -> dict[str, float]:
    """One speculative decoding step, timed by phase: ``forward`` (target pass over γ+1 tokens),
    ``probs`` (logits -> processed probabilities), ``verify`` (the rule, with its input
    validation, as ``reference.decoder`` calls it).  ``rule``: ``"rejection"`` (temperature 1,
    modified rejection sampling) or ``"greedy"`` (temperature 0, greedy matching).
    """
    device = state.block.device
    logits, forward_s = timed(lambda: target_pass(state, state.block.shape[1]), device)
    temperature = 0.0 if rule == "greedy" else 1.0
    target_probs, probs_s = timed(lambda: process_logits(logits.float(), temperature=temperature), device)
    if rule == "greedy":
        _, verify_s = timed(lambda: greedy_verify(target_probs, state.draft_tokens), device)
    elif rule == "rejection":
        _, verify_s = timed(
            lambda: rejection_sample(target_probs, state.draft_probs, state.draft_tokens, state.generator), device
        )
    else:
        raise ValueError(f"rule: expected 'rejection' or 'greedy', got {rule!r}")
    return {"forward_s": forward_s, "probs_s": probs_s, "verify_s": verify_s}


# --------------------------------------------------------------------------------------------
# 4 and 5. Whole decoders
# --------------------------------------------------------------------------------------------


class DecodeResult(NamedTuple):
    """What one decoder run produced.

    tokens: int64 ``[B, max_new_tokens]`` new tokens.  target_calls / draft_calls: forward passes
    of the full target / of the draft (prefill included).  stats: the reference decoder's
    ``BatchStats`` (None for the Hugging Face decoders).  wall_s: wall-clock seconds of the run
    (the reference's own statistics are wall-clock; with another benchmark clock the report
    rescales them by ``benchmark time / wall_s``).
    """

    tokens: torch.Tensor
    target_calls: int
    draft_calls: int
    stats: Any | None = None
    wall_s: float = 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """New tokens of one row per full-target forward pass (a pass serves every row of the batch;
        plain decoding: ``max_new_tokens / max_new_tokens`` = 1, its prefill emitting the first)."""
        return self.tokens.shape[1] / self.target_calls


class PassCounter:
    """Counts forward passes of ``model``: full-depth calls as target passes, calls of a shallower
    view (early exit: a truncated view or HF's temporarily lowered ``num_hidden_layers``) as draft
    passes; calls of a separate ``draft_model`` as draft passes."""

    def __init__(self) -> None:
        self.target = 0
        self.draft = 0


@contextlib.contextmanager
def count_passes(model: Any, draft_model: Any | None = None) -> Iterator[PassCounter]:
    counter = PassCounter()
    full_depth = model.config.num_hidden_layers

    def on_target_forward(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        full = module is model and module.config.num_hidden_layers == full_depth
        if full:
            counter.target += 1
        else:
            counter.draft += 1

    def on_draft_forward(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        counter.draft += 1

    handles = [model.register_forward_hook(on_target_forward, with_kwargs=True)]
    if draft_model is not None:
        handles.append(draft_model.register_forward_hook(on_draft_forward, with_kwargs=True))
    try:
        yield counter
    finally:
        for handle in handles:
            handle.remove()


def _generation_config(max_new_tokens: int, **settings: Any) -> Any:
    """Greedy, exactly ``max_new_tokens`` tokens (no EOS).  ``pad_token_id`` only fills padding
    columns; every call passes its attention mask explicitly (without one, ``generate`` would
    mask every prompt token equal to the pad id)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=None, pad_token_id=0,
        **settings,
    )


@contextlib.contextmanager
def assistant_settings(model: Any, **settings: Any) -> Iterator[None]:
    """Temporarily set fields of ``model.generation_config``: Hugging Face reads an assistant's
    draft length, schedule and confidence threshold from the *assistant's* generation config."""
    config = model.generation_config
    saved = {name: getattr(config, name, None) for name in settings}
    for name, value in settings.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


SAME_WORK = {"num_assistant_tokens": GAMMA, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
"""Hugging Face assistant settings that make it do the reference decoder's work: γ drafts every
pass, never cut short by the draft's confidence."""


@torch.no_grad()
def plain_decode(unit: ModelUnderTest, prompts: Sequence[torch.Tensor], max_new_tokens: int) -> DecodeResult:
    """Greedy decoding with Hugging Face ``generate`` (left-padded batch), no assistant."""
    input_ids, attention_mask = left_padded(prompts, pad_token_id=0)
    input_ids, attention_mask = input_ids.to(unit.device), attention_mask.to(unit.device)
    with count_passes(unit.model) as passes:
        output = unit.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=_generation_config(max_new_tokens)
        )
    return DecodeResult(output[:, input_ids.shape[1]:].cpu(), passes.target, passes.draft)


@torch.no_grad()
def hf_assisted_decode(
    unit: ModelUnderTest, prompt: torch.Tensor, max_new_tokens: int, drafter: str, *, defaults: bool = False,
    gamma: int = GAMMA,
) -> DecodeResult:
    """Hugging Face assisted generation (batch 1) with ``drafter``:

    - ``prompt-lookup``: ``prompt_lookup_num_tokens = γ``, ``max_matching_ngram_size = 3`` (the
      reference drafter's longest n-gram); ``defaults`` is not applicable;
    - ``early-exit``: ``assistant_early_exit = unit.early_exit_layers`` (the target's first layers,
      its final norm and head: the reference ``EarlyExitDrafter``'s draft);
    - ``draft-model``: ``assistant_model = unit.draft_model``.

    Unless ``defaults``, the assistant drafts γ tokens every pass (:data:`SAME_WORK`).
    """
    input_ids = prompt[None].to(unit.device)
    settings = {} if defaults else dict(SAME_WORK, num_assistant_tokens=gamma)
    draft_model = None
    if drafter == "prompt-lookup":
        config = _generation_config(max_new_tokens, prompt_lookup_num_tokens=gamma, max_matching_ngram_size=3)
        assistant = unit.model
    elif drafter == "early-exit":
        config = _generation_config(max_new_tokens, assistant_early_exit=unit.early_exit_layers)
        assistant = unit.model
    elif drafter == "draft-model":
        config = _generation_config(max_new_tokens)
        assistant = draft_model = unit.draft_model
    else:
        raise ValueError(f"drafter: expected prompt-lookup, early-exit or draft-model, got {drafter!r}")
    extra = {"assistant_model": draft_model} if draft_model is not None else {}
    with assistant_settings(assistant, **settings), count_passes(unit.model, draft_model) as passes:
        output = unit.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                     generation_config=config, **extra)
    return DecodeResult(output[:, input_ids.shape[1]:].cpu(), passes.target, passes.draft)


def reference_drafter(unit: ModelUnderTest, drafter: str) -> Any:
    """The ``reference.drafters`` object for ``drafter`` (a fresh one per run)."""
    from reference.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter

    if drafter.startswith("prompt-lookup"):  # prompt-lookup[-earliest|-latest|-longest]: the match policy
        policy = drafter.removeprefix("prompt-lookup").removeprefix("-")
        return PromptLookupDrafter(max_ngram=3, **({"match": policy} if policy else {}))
    if drafter == "early-exit":
        return EarlyExitDrafter(unit.model, unit.early_exit_layers)
    if drafter == "draft-model":
        return ModelDrafter(unit.draft_model)
    raise ValueError(f"drafter: expected prompt-lookup, early-exit or draft-model, got {drafter!r}")


@torch.no_grad()
def reference_decode(
    unit: ModelUnderTest, prompts: Sequence[torch.Tensor], max_new_tokens: int, drafter: str, gamma: int = GAMMA
) -> DecodeResult:
    """Greedy speculative decoding with the reference decoder (ragged batch of ``prompts``)."""
    from reference.decoder import speculative_generate

    draft = reference_drafter(unit, drafter)
    rows = [prompt.to(unit.device) for prompt in prompts]
    with count_passes(unit.model, unit.draft_model if drafter == "draft-model" else None) as passes:
        generation = speculative_generate(
            unit.model, draft, rows, max_new_tokens=max_new_tokens, gamma=gamma, temperature=0.0, seed=0
        )
    return DecodeResult(generation.tokens.cpu(), passes.target, passes.draft, generation.stats)


def effective_alphas(stats: Any) -> list[float]:
    """Acceptance by position counting every pass, including passes where the drafter proposed
    fewer than ``i`` tokens (prompt lookup without a match): ``α_1 = accepted_1 / passes`` and
    ``α_i = accepted_i / accepted_{i−1}``.  Then ``1 + Σ_j Π_{i≤j} α_i`` equals the measured tokens
    per pass exactly, which is the α the speedup model (``specverify.core.speedup``) needs."""
    pooled = stats.pooled()
    alphas, reached = [], pooled.target_passes
    for accepted in pooled.accepted_by_position:
        alphas.append(accepted / reached if reached else 0.0)
        reached = accepted
    return alphas


def decode(unit: ModelUnderTest, method: str, prompts: Sequence[torch.Tensor], max_new_tokens: int) -> DecodeResult:
    """Run decoder ``method`` (``plain``, ``reference-<drafter>``, ``hf-<drafter>`` or
    ``hf-<drafter>-defaults``; see the module docstring) on ``prompts``."""
    family, _, drafter = method.partition("-")
    start = time.perf_counter()
    if method == "plain":
        result = plain_decode(unit, prompts, max_new_tokens)
    elif family == "reference":
        result = reference_decode(unit, prompts, max_new_tokens, drafter)
    elif family == "hf":
        if len(prompts) != 1:
            raise ValueError(f"prompts: Hugging Face assisted generation takes one prompt, got {len(prompts)}")
        defaults = drafter.endswith("-defaults")
        result = hf_assisted_decode(unit, prompts[0], max_new_tokens, drafter.removesuffix("-defaults"),
                                    defaults=defaults)
    else:
        raise ValueError(f"method: expected plain, reference-<drafter> or hf-<drafter>[-defaults], got {method!r}")
    return result._replace(wall_s=time.perf_counter() - start)


def decode_summary(result: DecodeResult, method: str, gamma: int = GAMMA) -> dict[str, Any]:
    """The figures a decoder benchmark records: tokens, passes, tokens per target pass, and the
    acceptance.  ``accepted_per_draft_slot`` = accepted drafts / (γ · speculative passes), the one
    acceptance figure every method has (Hugging Face does not report what it proposed): the
    reference counts its accepted drafts; Hugging Face emits one token in its prefill and
    ``accepted + 1`` per later pass, so accepted = tokens − target passes."""
    rows, new_tokens = result.tokens.shape
    summary: dict[str, Any] = {
        "rows": rows, "new_tokens": new_tokens, "target_calls": result.target_calls,
        "draft_calls": result.draft_calls, "tokens_per_target_pass": result.tokens_per_target_pass,
        "wall_s": result.wall_s,
    }
    if result.stats is not None:
        pooled = result.stats.pooled()
        summary.update(
            speculative_passes=int(result.stats.target_passes.max()),  # passes of the batch, not summed over rows
            accepted_per_draft_slot=sum(pooled.accepted_by_position) / (gamma * pooled.target_passes),
            acceptance_by_position=[round(a, 4) for a in pooled.acceptance_by_position],
            effective_alphas=[round(a, 4) for a in effective_alphas(result.stats)],
            stats_tokens_per_pass=pooled.tokens_per_pass,
            draft_seconds=float(result.stats.draft_seconds.max()),
            target_seconds=float(result.stats.target_seconds.max()),
        )
    elif method.startswith("hf-"):
        passes = result.target_calls - 1
        summary.update(
            speculative_passes=passes,
            accepted_per_draft_slot=(new_tokens - result.target_calls) / (gamma * passes) if passes else 0.0,
        )
    return summary
