"""Drafters: what proposes the γ tokens that the target verifies in one pass.

Every drafter implements the small :class:`Drafter` protocol used by ``reference.decoder``:

- ``check_target(target)``: raise ``ValueError`` if the drafter cannot serve this target (called
  before any model runs);
- ``start(sequences)``: begin a batch (e.g. an empty KV cache for a draft model);
- ``propose(sequences, gammas, params, generators)``: return a :class:`Draft`: up to ``gammas[b]``
  tokens for row b (int64 ``[B]``, entries ``0..γ``) and the law each was drawn from;
  ``generators[b]`` is row b's own ``torch.Generator``, the only source of row b's draft
  randomness, and row b takes one draw per draft it makes (none for a row with ``gammas[b] = 0``
  or for padding), so a row's drafts never depend on the other rows;
- ``accepted(num_accepted)``: the target kept the first ``num_accepted[b]`` drafts of row b; roll
  any state back to that.

A drafter that also reads the target's hidden states is a :class:`HiddenStateDrafter`: after each
step's target pass the decoder hands it the target's last hidden state at every token the target's
cache kept (``target_hidden(hidden, counts)``), from that same pass.

Four drafters:

- :class:`ModelDrafter` — a separate small causal LM sharing the tokenizer, with its own KV cache.
  Draft token ``i`` is drawn from ``q_i = params.apply(draft logits)``, the same processing
  (temperature / top-k / top-p / min-p) that the decoder applies to the target, so ``q_i`` really
  is the law of the token and modified rejection sampling is exact (Leviathan et al. 2023
  Algorithm 1 needs the *actual* sampling law of the draft).
- :class:`EarlyExitDrafter` — self-speculation: the target's first ``k`` layers followed by its own
  final norm and LM head (a view sharing the target's weights, no copy), drafting like a model.
- :class:`MTPDrafter` — a multi-token-prediction head on the target (:class:`MTPHead`, DeepSeek-V3's
  design): it drafts from the target's own last hidden state and its next token, then from its own
  hidden state, through one transformer block and the target's LM head.
- :class:`PromptLookupDrafter` — n-gram copy from the context (prompt lookup decoding): the tokens
  that followed the earlier occurrence of the context's last tokens that agrees with it longest
  (other match policies: a parameter).  The drafts are deterministic given the context, i.e. drawn
  from point masses, so they are verified with the point-mass rule (``Draft.probs is None``).
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from reference.kv import RaggedCache
from reference.sequences import TokenSequences
from specverify.core.processing import SamplingParams
from specverify.core.sampling import sample as sample_from

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Draft:
    """One step's proposals for a batch.

    tokens: int64 ``[B, K]`` with ``K = draft_width(gammas)``; row b's first ``num_draft[b]``
        entries are real, the rest are 0.
    probs: ``[B, K, V]``, the law each draft token was drawn from (rows past ``num_draft[b]`` are
        padding), or ``None`` for point masses (deterministic drafts).
    num_draft: int64 ``[B]``, entries in ``0..gammas[b]``.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None
    num_draft: torch.Tensor


class Drafter(Protocol):
    """The interface the decoder drives (see the module docstring)."""

    def check_target(self, target: PreTrainedModel) -> None: ...

    def start(self, sequences: TokenSequences) -> None: ...

    def propose(
        self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Draft: ...

    def accepted(self, num_accepted: torch.Tensor) -> None: ...


class HiddenStateDrafter(abc.ABC):
    """A drafter that drafts from the target's hidden states (the :class:`Drafter` protocol, plus this).

    After each step's target pass, rollback and :meth:`Drafter.accepted`, the decoder calls
    :meth:`target_hidden` with the target's last hidden state at every token the target's KV cache
    took in that pass (the committed tokens it lacked and the accepted drafts), so the drafter never
    needs a target pass of its own.
    """

    @abc.abstractmethod
    def target_hidden(self, hidden: torch.Tensor, counts: torch.Tensor) -> None:
        """``hidden [B, m, H]``: row b's first ``counts[b]`` columns are the target's last hidden states
        (the input of its output head) at the tokens its cache took this step, in order."""


def vocab_size(model: PreTrainedModel | MTPHead) -> int:
    """Rows of the model's output head: the ids its distributions range over."""
    weight = model.get_output_embeddings().weight
    assert isinstance(weight, torch.Tensor), "an output head's weight is a tensor [V, H]"
    return int(weight.shape[0])


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    return next(model.parameters()).device


def draft_width(gammas: torch.Tensor) -> int:
    """Columns ``K`` of a step's draft: ``max_b gammas[b]``, at least 1 (the rules take ``K >= 1``;
    a column no row uses is padding, which the target pass does not feed)."""
    return max(1, int(gammas.max()))


def empty_draft(gammas: torch.Tensor, vocab: int) -> Draft:
    """No drafts for any row (``num_draft = 0``): the step is plain target decoding.  One padding
    column of tokens and of (unread) laws, as the rules take ``K >= 1``."""
    no_probs = torch.zeros(gammas.shape[0], 1, vocab, device=gammas.device)
    return Draft(torch.zeros_like(gammas)[:, None], no_probs, torch.zeros_like(gammas))


def sample_each_row(probs: torch.Tensor, generators: Sequence[torch.Generator], drawing: torch.Tensor) -> torch.Tensor:
    """One token for each row b of ``probs [B, V]`` with ``drawing[b]``, drawn by :func:`sample_from`
    with ``generators[b]`` alone, and 0 (no draw) for the other rows: B small draws instead of one
    batched draw, so that a row's token does not depend on how many rows precede it (batch
    invariance under sampling)."""
    return torch.cat([
        sample_from(probs[row : row + 1], generator) if draw else probs.new_zeros(1, dtype=torch.int64)
        for row, (generator, draw) in enumerate(zip(generators, drawing.tolist()))
    ])


class ModelDrafter:
    """Draft with a separate small causal LM that shares the target's tokenizer.

    The draft model keeps its own :class:`~reference.kv.RaggedCache` holding every committed token
    but the last (and, during a step, its own drafts).  A step feeds the committed tokens it has not
    seen yet (the whole prompt at the first step, which is the draft's prefill; then 1 token, or 2
    after a step where all its drafts were accepted: the last draft, which it never fed, and the
    bonus token), then samples ``γ_b = gammas[b]`` tokens autoregressively for row b, feeding its
    first ``γ_b − 1`` back: ``max_b γ_b`` passes of the draft model, a row past its ``γ_b`` riding
    along as padding; no pass at all when every ``γ_b`` is 0 (as Hugging Face skips its assistant
    when no candidate is needed).  ``accepted`` forgets the fed drafts that the target rejected.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.kv: RaggedCache | None = None
        self.fed_drafts: torch.Tensor | None = None  # per row: drafts fed to the draft model this step

    def check_target(self, target: PreTrainedModel) -> None:
        if vocab_size(self.model) != vocab_size(target):
            raise ValueError(
                f"draft: its vocabulary has {vocab_size(self.model)} ids but the target's has "
                f"{vocab_size(target)}; use a draft model that shares the target's tokenizer and output size"
            )
        if model_device(self.model) != model_device(target):
            raise ValueError(
                f"draft: on {model_device(self.model)} but the target is on {model_device(target)}; "
                f"move it with draft.to({str(model_device(target))!r})"
            )

    def start(self, sequences: TokenSequences) -> None:
        self.kv = RaggedCache(self.model, sequences.tokens.shape[0], sequences.tokens.device)  # the first step prefills
        self.fed_drafts = None

    @torch.no_grad()
    def propose(
        self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Draft:
        assert self.kv is not None, "start() makes the cache"
        passes = int(gammas.max())
        self.fed_drafts = (gammas - 1).clamp(min=0)
        if passes == 0:  # nothing to draft: the draft model does not run
            return empty_draft(gammas, vocab_size(self.model))
        block, counts = sequences.tail(self.kv.lengths)
        next_logits = self.kv.extend(block, counts, read_from=counts - 1)[:, 0]
        tokens, probs = [], []
        for position in range(passes):
            q = params.apply(next_logits.float())
            token = sample_each_row(q, generators, position < gammas)
            tokens.append(token)
            probs.append(q)
            if position + 1 < passes:  # feed the drafts of the rows that draft again
                next_logits = self.kv.extend(token[:, None], (position + 1 < gammas).to(torch.int64))[:, -1]
        return Draft(torch.stack(tokens, 1), torch.stack(probs, 1), gammas.clone())

    def accepted(self, num_accepted: torch.Tensor) -> None:
        assert self.kv is not None and self.fed_drafts is not None, "start() and propose() set them"
        self.kv.forget(self.fed_drafts - torch.minimum(num_accepted, self.fed_drafts))


def truncated_view(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A causal LM that runs the first ``num_layers`` decoder layers of ``model``, then its final norm
    and LM head, sharing every weight with ``model`` (shallow module copies: no tensor is copied).

    Supports decoder-only models whose base model keeps its blocks in ``.layers`` and loops over
    them (Llama, Mistral, Qwen2, Gemma, SmolLM, ...).  The view has its own config with
    ``num_hidden_layers = num_layers``, so it gets a KV cache of that many layers.
    """
    base = model.get_decoder()
    base_name = next((name for name, child in model.named_children() if child is base), None)
    layers = getattr(base, "layers", None)
    if base_name is None or not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"target: early-exit drafting needs a direct base-model child with a '.layers' ModuleList; "
            f"{type(model).__name__} has none, use ModelDrafter or PromptLookupDrafter"
        )
    if not 1 <= num_layers < len(layers):
        raise ValueError(
            f"num_layers: expected 1..{len(layers) - 1} (fewer than the target's "
            f"{len(layers)} layers), got {num_layers}"
        )
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:num_layers]

    view_base = copy.copy(base)
    view_base._modules = dict(base._modules)  # own child table: replacing .layers leaves the target intact
    view_base.layers = torch.nn.ModuleList(list(layers)[:num_layers])
    view_base.config = config
    view = copy.copy(model)
    view._modules = dict(model._modules)
    setattr(view, base_name, view_base)
    view.config = config
    return view


class EarlyExitDrafter(ModelDrafter):
    """Self-speculative drafting: the target's first ``num_layers`` layers + its final norm and head.

    No second model: :func:`truncated_view` shares the target's weights.  The drafter keeps its own
    KV cache of ``num_layers`` layers; those keys/values equal the target's first layers' for the
    same tokens, but sharing them would couple the two caches' rollbacks, so they are recomputed.
    """

    def __init__(self, target: PreTrainedModel, num_layers: int) -> None:
        super().__init__(truncated_view(target, num_layers))
        self.target = target

    def check_target(self, target: PreTrainedModel) -> None:
        if target is not self.target:
            raise ValueError("target: this EarlyExitDrafter was built from a different model; build it from the target")


class MTPHead(torch.nn.Module):
    """A multi-token-prediction head on a target (DeepSeek-V3's MTP module, Liu et al. 2024, §2.2).

    Entry ``j`` of the head's stream pairs a hidden state ``h_j`` (the target's at token ``x_j``, or
    the head's own) with the embedding of the token after it, ``x_{j+1}``, and predicts ``x_{j+2}``:

        h'_j = W [RMSNorm(h_j); RMSNorm(Emb(x_{j+1}))]        W: 2H → H          (eq. 21)
        g_{0..j} = TRM(h'_{0..j})                             one causal block    (eq. 22)
        P(x_{j+2}) = softmax(LMHead(g_j))                     the target's head   (eq. 23)

    ``Emb`` and ``LMHead`` are the target's own modules (shared, not copied); ``TRM`` is one decoder
    layer of the target's family (a base model of the target's class with one layer, its final
    norm the head's output norm), with its own KV cache over the stream's entries at position ids
    ``j``.  ``g_j`` (after that norm: the input of ``LMHead``, as the target's hidden state is) is
    what the next draft step pairs with the drafted token.

    The head's own weights are random, drawn from a ``torch.Generator`` seeded with ``seed`` (the
    global RNG is left untouched), in :mod:`specverify.hf.tiny_models`' style: norms 1, every other
    weight ``N(0, 1/fan_in)``.  Losslessness does not depend on them; acceptance does.
    """

    def __init__(self, target: PreTrainedModel, *, seed: int = 0) -> None:
        super().__init__()
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = 1
        if isinstance(getattr(config, "layer_types", None), list):
            config.layer_types = config.layer_types[:1]
        with torch.random.fork_rng(devices=[]):  # torch's and Hugging Face's inits draw from the global RNG
            block = type(target.get_decoder())(config)
            projection = torch.nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        block.embed_tokens = None  # its input is the projection's output
        self.config = config
        self.embed_tokens = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()
        self.hidden_norm = copy.deepcopy(block.norm)
        self.token_norm = copy.deepcopy(block.norm)
        self.projection = projection
        self.block = block
        initialise_head(self, seed)
        parameter = next(target.parameters())
        self.to(device=parameter.device, dtype=parameter.dtype).eval()

    def own_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The head's own weights, by name (the embedding and the LM head are the target's)."""
        shared = {id(parameter) for module in (self.embed_tokens, self.lm_head) for parameter in module.parameters()}
        return [(name, parameter) for name, parameter in self.named_parameters() if id(parameter) not in shared]

    def get_output_embeddings(self) -> torch.nn.Module:
        """The target's LM head (as a Hugging Face causal LM names it)."""
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        previous_hidden: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: object,
        use_cache: bool = True,
        output_hidden_states: bool = True,
    ) -> CausalLMOutputWithPast:
        """``input_ids [B, m]`` are the tokens ``x_{j+1}`` and ``previous_hidden [B, m, H]`` the states
        ``h_j`` of ``m`` new entries; returns their logits ``[B, m, V]`` and, as ``hidden_states[-1]``,
        their ``g_j`` ``[B, m, H]`` (always: ``output_hidden_states`` is accepted for the cache's call)."""
        joined = torch.cat([self.hidden_norm(previous_hidden), self.token_norm(self.embed_tokens(input_ids))], dim=-1)
        output = self.block(inputs_embeds=self.projection(joined), attention_mask=attention_mask,
                            position_ids=position_ids, cache=cache, use_cache=use_cache)
        hidden = output.last_hidden_state
        return CausalLMOutputWithPast(logits=self.lm_head(hidden), hidden_states=(hidden,))


def initialise_head(head: MTPHead, seed: int) -> None:
    """The head's own weights from ``torch.Generator().manual_seed(seed)``, in name order: norms 1,
    every other weight ``N(0, 1/fan_in)`` (activations keep unit scale)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(head.own_parameters()):
            if "norm" in name:
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[-1]))


class MTPDrafter(HiddenStateDrafter):
    """Draft with an :class:`MTPHead` on the target: MTP speculative decoding.

    With ``n`` committed tokens ``x_0 .. x_{n-1}``, the target's cache holds ``x_0 .. x_{n-2}`` and
    the decoder has handed over their hidden states ``h_j``; the head's stream needs the entries
    ``(h_j, x_{j+1})`` for ``j <= n − 2``.  A step feeds the entries the head's cache lacks (the
    hidden states handed over since the last step, paired with the tokens after them): the last,
    ``(h_{n-2}, x_{n-1})``, gives ``q_1``, the law of the first draft ``d_1``; draft ``i + 1`` is
    drawn from the entry ``(g, d_i)`` fed next, ``g`` the head's own state at the entry before.  Row b
    draws ``γ_b = gammas[b]`` drafts (one draw each) from ``q_i = params.apply(logits)``, the law
    the rules verify; the head runs ``max(1, max_b γ_b)`` passes (the first feeds the new entries
    even when no row drafts, so the stream never falls behind).

    The first step drafts nothing: the target has not run yet (its first pass, the prefill, hands
    over the prompt's hidden states).  ``accepted`` forgets every draft entry, accepted or not: an
    accepted draft is fed again at the next step paired with the target's hidden state instead of
    the head's, as DeepSeek-V3 pairs the main model's state with every committed token.
    """

    def __init__(self, head: MTPHead) -> None:
        self.head = head
        self.kv: RaggedCache | None = None
        self.new_hidden: torch.Tensor | None = None  # the target's hidden states not yet fed to the head
        self.fed_drafts: torch.Tensor | None = None  # per row: draft entries fed this step

    def check_target(self, target: PreTrainedModel) -> None:
        if target.get_output_embeddings() is not self.head.lm_head:
            raise ValueError("target: this MTPHead was built on a different model; build it with MTPHead(target)")

    def start(self, sequences: TokenSequences) -> None:
        self.kv = RaggedCache(self.head, sequences.tokens.shape[0], sequences.tokens.device, keep_hidden=True)
        self.new_hidden = None

    def target_hidden(self, hidden: torch.Tensor, counts: torch.Tensor) -> None:
        self.new_hidden = hidden[:, : int(counts.max())]  # the pass's rejected drafts are no entries

    @torch.no_grad()
    def propose(
        self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Draft:
        kv = self.kv
        assert kv is not None, "start() makes the cache"
        self.fed_drafts = torch.zeros_like(gammas)
        if self.new_hidden is None:  # the first step: no hidden state of the target yet
            return empty_draft(gammas, vocab_size(self.head))
        next_tokens, counts = sequences.tail(kv.lengths + 1)  # x_{j+1} of each new entry j
        hidden, self.new_hidden = self.new_hidden, None
        rows = torch.arange(gammas.shape[0], device=gammas.device)
        next_logits = kv.extend(next_tokens, counts, read_from=counts - 1, previous_hidden=hidden)[:, 0]
        assert kv.hidden is not None, "a cache made with keep_hidden keeps each block's hidden states"
        head_hidden = kv.hidden[rows, counts - 1]
        passes = int(gammas.max())
        if passes == 0:
            return empty_draft(gammas, vocab_size(self.head))
        self.fed_drafts = (gammas - 1).clamp(min=0)
        tokens, probs = [], []
        for position in range(passes):
            q = params.apply(next_logits.float())
            token = sample_each_row(q, generators, position < gammas)
            tokens.append(token)
            probs.append(q)
            if position + 1 < passes:  # feed the drafts of the rows that draft again, with the head's state
                feeding = (position + 1 < gammas).to(torch.int64)
                next_logits = kv.extend(token[:, None], feeding, previous_hidden=head_hidden[:, None])[:, 0]
                head_hidden = kv.hidden[:, 0]
        return Draft(torch.stack(tokens, 1), torch.stack(probs, 1), gammas.clone())

    def accepted(self, num_accepted: torch.Tensor) -> None:
        assert self.kv is not None and self.fed_drafts is not None, "start() and propose() set them"
        self.kv.forget(self.fed_drafts)


MATCH_POLICIES = ("earliest", "latest", "longest")


class PromptLookupDrafter:
    """Prompt lookup decoding: copy what followed an earlier occurrence of the context's last tokens.

    A *match* is a position ``e < len(context)`` whose preceding tokens equal the context's last
    ones: ``L(e)``, the length of the common suffix of ``context[:e]`` and ``context``, is at least
    ``min_ngram``.  The drafter proposes the (up to ``γ_b``) tokens ``context[e : e+γ_b]`` that
    followed the chosen match; a row without a match proposes nothing (``num_draft = 0``: the step is plain
    target decoding).  ``match`` chooses among the matches:

    - ``"longest"`` (default): the match with the longest common suffix ``L(e)`` (compared up to
      ``LONGEST_CONTEXT`` tokens back), the earliest among equals: the occurrence whose context
      agrees best;
    - ``"earliest"``: among the matches of the longest n-gram ``n = min(L(e), max_ngram)`` the
      first one, as Hugging Face's prompt lookup does (``max_matching_ngram_size = max_ngram``):
      the same drafts as HF;
    - ``"latest"``: the same n-gram, its most recent occurrence.

    The default is measured (greedy, γ = 4, target passes per request, NOTES-decoder.md): on
    SmolLM2-135M's four code/edit prompts (48 tokens) longest / earliest / latest need 31/10/30/15,
    31/11/31/15 and 30/12/26/16 passes; on Qwen2.5-Coder-1.5B (prompts 1 and 3, 32 tokens) all three
    need 21/8.  ``"longest"`` is never worse than ``"earliest"`` there and needs fewer passes on two
    prompts; ``"latest"`` wins two prompts and loses two.

    Vectorised over the batch (all positions compared at once).  Drafts are a deterministic
    function of the context, i.e. draws from point masses, so they are verified with
    ``specverify.core.rules.point_mass_verify``.
    """

    LONGEST_CONTEXT = 32

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, match: str = "longest") -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"min_ngram/max_ngram: expected 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if match not in MATCH_POLICIES:
            raise ValueError(f"match: expected one of {MATCH_POLICIES}, got {match!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.match = match

    def check_target(self, target: PreTrainedModel) -> None:
        """Any target: the drafts are ids copied from the context, which is in the target's vocabulary."""

    def start(self, sequences: TokenSequences) -> None:
        """Nothing to prefill."""

    def propose(
        self, sequences: TokenSequences, gammas: torch.Tensor, params: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Draft:
        tokens, lengths = sequences.tokens, sequences.lengths
        capacity = tokens.shape[1]
        depth = max(self.max_ngram, self.LONGEST_CONTEXT) if self.match == "longest" else self.max_ngram
        agreement = self._common_suffix(tokens, lengths, depth)  # [B, capacity]: L(e), capped at depth
        ends = torch.arange(capacity, device=tokens.device)
        score = agreement if self.match == "longest" else agreement.clamp(max=self.max_ngram)
        score = torch.where(ends < lengths[:, None], score, 0)  # a continuation must exist: e < len
        best = score.amax(1, keepdim=True)
        candidates = (score == best) & (best >= self.min_ngram)
        if self.match == "latest":
            chosen = torch.where(candidates, ends, -1).amax(1)
        else:
            chosen = torch.where(candidates, ends, capacity).amin(1)
        copy_from = torch.where(candidates.any(1), chosen, -1)
        num_draft = torch.where(copy_from >= 0, torch.minimum(lengths - copy_from, gammas), 0)
        positions = torch.arange(draft_width(gammas), device=tokens.device)
        index = (copy_from.clamp(min=0)[:, None] + positions).clamp(max=capacity - 1)
        draft_tokens = torch.where(positions < num_draft[:, None], tokens.gather(1, index), 0)
        return Draft(draft_tokens, None, num_draft)

    @staticmethod
    def _common_suffix(tokens: torch.Tensor, lengths: torch.Tensor, depth: int) -> torch.Tensor:
        """``L(e)`` for every position ``e`` (int64 ``[B, capacity]``): how many of the tokens just
        before ``e`` equal the context's last tokens, ``tokens[e-k] == tokens[len-k]`` for
        ``k = 1, 2, …``, counted up to ``depth`` and never reaching before position 0."""
        capacity = tokens.shape[1]
        back = torch.arange(1, depth + 1, device=tokens.device)  # k
        ends = torch.arange(capacity, device=tokens.device)
        before = ends[:, None] - back  # [capacity, depth]: e - k
        suffix = lengths[:, None] - back  # [B, depth]: len - k
        valid = (before >= 0)[None] & (suffix >= 0)[:, None, :]
        earlier = tokens[:, before.clamp(min=0)]  # [B, capacity, depth]
        last = tokens.gather(1, suffix.clamp(min=0))[:, None, :]  # [B, 1, depth]
        agree = (earlier == last) & valid
        return agree.to(torch.int64).cumprod(-1).sum(-1)

    def accepted(self, num_accepted: torch.Tensor) -> None:
        """Stateless: nothing to roll back."""
