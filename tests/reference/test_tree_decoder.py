"""The reference tree decoder (``reference/tree_decoder.py``) on real Hugging Face models.

Exact checks (cannot flake):
- one tree pass with the 4-D tree mask and depth positions gives, at every slot, the target's law
  after the context and that node's path (plain forward passes), for chain / star / binary /
  EAGLE-like shapes; after keeping the accepted path, the cache continues as a plain forward over
  the committed tokens; the draft's per-node laws likewise; each check fails on a broken mask or
  broken positions;
- greedy identity: at temperature 0 the tokens equal ``target.generate(do_sample=False)`` (tiny
  models; SmolLM2-135M for 32 tokens when its converted weights are installed).

Statistical checks (α and detectable TV stated, sample sizes from ``stats.sample_size_for_tv``,
seeds derived from the test's parameters, α split by Bonferroni over the module's statistical
tests): the law of the first L = 2 new tokens against the target's exact law (enumerated), for
both drafting schemes; the accepted length of one step against its exact law
(``specverify.core.tree_exact`` on the same models).  A lossy rule swapped into the decoder is
rejected by the same sequence-level test (its exact TV is computed and printed first).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from reference import tree_decoder
from reference.drafters import truncated_view
from reference.tree_decoder import (
    TREE_SCHEMES,
    ModelTreeDrafter,
    PromptLookupTreeDrafter,
    TargetTreeCache,
    TreeShape,
    tree_speculative_generate,
)
from specverify.core import stats, tree_exact
from specverify.core.processing import SamplingParams
from specverify.core.seeding import derive_seed
from specverify.core.tree_exact import (
    binary_shape,
    chain_shape,
    eagle_shape,
    star_shape,
)
from specverify.core.tree_rules import unchanged_target_tree_verify
from specverify.hf.tiny_models import continuation_distribution, tiny_target_and_draft

SHAPES = {"chain4": chain_shape(4), "star3": star_shape(3), "binary6": binary_shape(6),
          "eagle231": eagle_shape(2, 3, 1)}
PROMPT = (3, 1, 4, 1, 5)
NEW_TOKENS = 24

# Statistical tests of this module (fast tier): 2 schemes × sequence law + 2 schemes × accepted length.
FAMILY_ALPHA = 0.01
NUM_STATISTICAL_TESTS = 4
ALPHA = stats.bonferroni(FAMILY_ALPHA, NUM_STATISTICAL_TESTS)
POWER = 0.9
SEQUENCE_TV = 0.2  # detectable TV of the sequence-law test, with power POWER at level ALPHA
LENGTH_TV = 0.1  # detectable TV of the accepted-length test
STAT_VOCAB = 8
STAT_SHAPE = binary_shape(4)
L = 2


@pytest.fixture(scope="module")
def models():
    return tiny_target_and_draft(vocab_size=16, hidden_size=32, seed=3)


@pytest.fixture(scope="module")
def stat_models():
    return tiny_target_and_draft(vocab_size=STAT_VOCAB, seed=0)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run far faster on one thread on a shared machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@torch.no_grad()
def next_law(model, tokens) -> torch.Tensor:
    """The model's softmax law after ``tokens`` by a plain forward pass (no cache, causal mask)."""
    return torch.softmax(model(input_ids=torch.tensor([list(tokens)])).logits[0, -1].float(), -1)


def path_tokens(shape: TreeShape, tokens: list[int], node: int) -> list[int]:
    return [tokens[m] for m in shape.path_to(node)]


# --------------------------------------------------------------------------------------------
# Exact: the tree pass, the kept path, the draft's laws
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def tree_pass_error(target, shape: TreeShape, seed: int) -> float:
    """Largest |law difference| between one tree pass (then one pass after keeping a path) and plain forwards."""
    generator = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    tokens = torch.randint(vocab, (shape.num_nodes,), generator=generator)
    prompt = torch.tensor(PROMPT)
    cache = TargetTreeCache(target, prompt)
    logits = cache.score(prompt[-1], tree_decoder.TreeDraft(tokens, None), shape)
    laws = torch.softmax(logits.float(), -1)
    error = 0.0
    for node in range(-1, shape.num_nodes):
        reference = next_law(target, list(PROMPT) + path_tokens(shape, tokens.tolist(), node))
        error = max(error, float((laws[node + 1] - reference).abs().max()))
    kept = shape.num_nodes - 1  # the deepest-indexed node's path
    cache.keep_path(shape, kept)
    committed = list(PROMPT) + path_tokens(shape, tokens.tolist(), kept)
    follow = TreeShape.of((-1,))
    after = cache.score(torch.tensor(7), tree_decoder.TreeDraft(torch.tensor([2]), None), follow)  # next root: 7
    for slot, extra in ((0, [7]), (1, [7, 2])):
        reference = next_law(target, committed + extra)
        error = max(error, float((torch.softmax(after[slot].float(), -1) - reference).abs().max()))
    return error


@pytest.mark.parametrize("name", list(SHAPES))
def test_one_tree_pass_equals_path_forwards(name, models):
    target, _ = models
    assert tree_pass_error(target, TreeShape.of(SHAPES[name]), seed=derive_seed("tree pass", name)) < 1e-5


def test_tree_pass_check_fails_on_a_broken_mask_or_positions(models, monkeypatch):
    target, _ = models
    assert tree_pass_error(target, TreeShape.of(SHAPES["binary6"]), seed=1) < 1e-5

    def full(ancestors, context):
        return torch.ones(1, 1, ancestors.shape[0], context + ancestors.shape[0], dtype=torch.bool)

    with monkeypatch.context() as patch:
        patch.setattr(tree_decoder, "tree_attention_mask", full)  # every node sees every sibling
        assert tree_pass_error(target, TreeShape.of(SHAPES["binary6"]), seed=1) > 1e-3
    flat = TreeShape.of(SHAPES["binary6"])
    object.__setattr__(flat, "depth", torch.arange(flat.num_nodes + 1))  # positions by slot, not depth
    assert tree_pass_error(target, flat, seed=1) > 1e-3


@pytest.mark.parametrize("name", ["binary6", "eagle231"])
def test_draft_laws_are_the_draft_model_laws_at_each_parent(name, models):
    _, draft = models
    shape = TreeShape.of(SHAPES[name])
    drafter = ModelTreeDrafter(draft)
    sequence = torch.tensor(PROMPT)
    drafter.start()
    generator = torch.Generator().manual_seed(derive_seed("draft laws", name))
    for _ in range(2):  # the second call runs on a warm cache
        tree = drafter.propose(sequence, shape, "independent", SamplingParams(), generator)
        for node, parent in enumerate(shape.parents):
            reference = next_law(draft, list(sequence.tolist()) + path_tokens(shape, tree.tokens.tolist(), parent))
            assert float((tree.probs[node] - reference).abs().max()) < 1e-5
        assert drafter.cache.get_seq_length() == len(sequence)
        sequence = torch.cat([sequence, tree.tokens[:1]])
    top = drafter.propose(sequence, shape, "deterministic", SamplingParams(), generator)
    root = next_law(draft, sequence.tolist())
    assert top.probs is None
    assert top.tokens[list(shape.children(-1))].tolist() == root.argsort(descending=True, stable=True)[:2].tolist()


def test_prompt_lookup_children_are_the_followers_of_the_last_ngram():
    drafter = PromptLookupTreeDrafter(max_ngram=2)
    text = [5, 6, 7, 5, 6, 8, 1, 5, 6]
    assert drafter.candidates(text, 3) == [8, 7, 0]  # after "5 6": 8 (most recent), 7; "6" adds nothing; fill 0
    tree = drafter.propose(torch.tensor(text), TreeShape.of(binary_shape(4)), "deterministic", SamplingParams(), None)
    assert tree.tokens.tolist()[:2] == [8, 7] and tree.probs is None
    assert len(set(tree.tokens.tolist()[2:])) == 2  # distinct siblings


# --------------------------------------------------------------------------------------------
# Exact: greedy identity
# --------------------------------------------------------------------------------------------


def greedy_reference(target, prompt, new_tokens) -> list[int]:
    output = target.generate(torch.tensor([list(prompt)]), do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)
    return output[0, len(prompt):].tolist()


def make_drafter(kind: str, target, draft):
    if kind == "lookup":
        return PromptLookupTreeDrafter()
    return ModelTreeDrafter(draft if kind == "model" else truncated_view(target, 1))


@pytest.mark.parametrize("drafter", ["model", "early-exit", "lookup"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_greedy_equals_target_generate(name, drafter, models):
    target, draft = models
    generation = tree_speculative_generate(target, make_drafter(drafter, target, draft), torch.tensor(PROMPT),
                                           parents=SHAPES[name], max_new_tokens=NEW_TOKENS, temperature=0.0)
    assert generation.tokens.tolist() == greedy_reference(target, PROMPT, NEW_TOKENS)
    assert 1.0 <= generation.stats.tokens_per_pass <= tree_exact.tree_depth(SHAPES[name]) + 1


def test_greedy_identity_fails_when_the_rejected_branches_stay_in_the_cache(models, monkeypatch):
    target, draft = models
    monkeypatch.setattr(TargetTreeCache, "keep_path", lambda self, shape, last_node: None)
    generation = tree_speculative_generate(target, ModelTreeDrafter(draft), torch.tensor(PROMPT),
                                           parents=SHAPES["binary6"], max_new_tokens=NEW_TOKENS, temperature=0.0)
    assert generation.tokens.tolist() != greedy_reference(target, PROMPT, NEW_TOKENS)


def smollm2_or_skip():
    from specverify.hf import packaged

    if not packaged.is_prepared(packaged.packaged_model(packaged.DEFAULT_TARGET)):
        pytest.skip(f"{packaged.DEFAULT_TARGET} is not converted here (specverify models prepare)")
    return packaged.load_causal_lm(packaged.DEFAULT_TARGET, dtype=torch.float32)


def test_greedy_equals_target_generate_on_smollm2():
    torch.set_num_threads(2)
    target = smollm2_or_skip()
    from specverify.hf.packaged import DEFAULT_TARGET, load_tokenizer

    text = ('{"name": "Ada Lovelace", "born": 1815, "field": "mathematics"},\n{"name": "Alan Turing", "born": 1912, '
            '"field": "computer science"},\n{"name": "Grace Hopper", "born": 1906, ')  # lookup finds copies here
    prompt = tuple(load_tokenizer(DEFAULT_TARGET)(text)["input_ids"])
    generation = tree_speculative_generate(target, PromptLookupTreeDrafter(), torch.tensor(prompt),
                                           parents=eagle_shape(2, 3, 1), max_new_tokens=32, temperature=0.0)
    assert generation.tokens.tolist() == greedy_reference(target, prompt, 32)
    print(f"SmolLM2 greedy identity, eagle(2,3,1), prompt lookup: tokens/pass {generation.stats.tokens_per_pass:.3f}")
    assert generation.stats.tokens_per_pass > 1.2, \
        "no tree path was accepted: the identity did not exercise the KV gather"


# --------------------------------------------------------------------------------------------
# Statistical: the law of the first L tokens, the accepted length
# --------------------------------------------------------------------------------------------


class ModelChain:
    """The processed target / draft laws after ``prompt + prefix`` (plain forward passes, memoised), as a
    :class:`specverify.core.chains.Chain` for the exact laws of :mod:`specverify.core.tree_exact`."""

    def __init__(self, target, draft, prompt, params: SamplingParams) -> None:
        self.models, self.prompt, self.params = {"target": target, "draft": draft}, tuple(prompt), params
        self.vocab_size = target.config.vocab_size
        self.laws: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}

    def _law(self, which: str, prefix: tuple[int, ...]) -> np.ndarray:
        if (which, prefix) not in self.laws:
            with torch.no_grad():
                logits = self.models[which](input_ids=torch.tensor([self.prompt + prefix])).logits[0, -1:]
            law = self.params.apply(logits.float())[0].double().numpy()
            self.laws[which, prefix] = law / law.sum()
        return self.laws[which, prefix]

    def target(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._law("target", tuple(prefix))

    def draft(self, prefix: tuple[int, ...]) -> np.ndarray:
        return self._law("draft", tuple(prefix))


def sample_runs(target, draft, scheme: str, new_tokens: int, runs: int, label: str, **sampling):
    """``runs`` decodes of ``new_tokens`` tokens after PROMPT with seeds derived from the parameters."""
    prompt = torch.tensor(PROMPT)
    return [tree_speculative_generate(target, ModelTreeDrafter(draft), prompt, parents=STAT_SHAPE, scheme=scheme,
                                      max_new_tokens=new_tokens, seed=derive_seed(label, scheme, run), **sampling)
            for run in range(runs)]


def sequence_law_test(target, draft, scheme: str, label: str, **sampling):
    runs = stats.sample_size_for_tv(SEQUENCE_TV, alpha=ALPHA, power=POWER, num_cells=STAT_VOCAB ** L)
    counts = Counter(tuple(g.tokens.tolist()) for g in sample_runs(target, draft, scheme, L, runs, label, **sampling))
    expected = continuation_distribution(target, PROMPT, L, **sampling)
    result = stats.goodness_of_fit(dict(counts), expected, seed=derive_seed(label, scheme))
    print(f"{label} {scheme}: n={runs}, alpha={ALPHA:.4g}, detects TV {SEQUENCE_TV} with power {POWER}: {result}")
    return result


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", TREE_SCHEMES)
def test_first_tokens_follow_the_target_law(scheme, stat_models):
    target, draft = stat_models
    sampling = {"temperature": 0.8, "top_k": 6} if scheme == "independent" else {"temperature": 1.0, "top_p": 0.9}
    assert sequence_law_test(target, draft, scheme, "tree decoder law", **sampling).pvalue >= ALPHA


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", TREE_SCHEMES)
def test_accepted_length_follows_its_exact_law(scheme, stat_models):
    target, draft = stat_models
    params = SamplingParams()
    law = tree_exact.ideal_tree_step_distribution(ModelChain(target, draft, PROMPT, params), STAT_SHAPE, scheme)
    depth = tree_exact.tree_depth(STAT_SHAPE)
    expected = np.zeros(depth + 1)
    for emitted, prob in law.items():
        expected[len(emitted) - 1] += prob
    runs = stats.sample_size_for_tv(LENGTH_TV, alpha=ALPHA, power=POWER, num_cells=depth + 1)
    generations = sample_runs(target, draft, scheme, 1, runs, "tree decoder length")  # one step each
    counts = np.bincount([g.stats.accepted_lengths[0] for g in generations], minlength=depth + 1)
    result = stats.goodness_of_fit(counts, expected, seed=derive_seed("tree length", scheme))
    mean = float(np.mean([g.stats.tokens_per_pass for g in generations]))
    exact_mean = float(expected @ np.arange(1, depth + 2))
    print(f"{scheme}: tokens per pass {mean:.3f} (exact {exact_mean:.3f}), n={runs}, alpha={ALPHA:.4g}, "
          f"detects TV {LENGTH_TV} with power {POWER}: {result}")
    assert result.pvalue >= ALPHA


def unchanged_target_point_mass(target_probs, tree_tokens, parents, generator=None):
    """LOSSY: every child tested against the parent's unchanged target law (no residual update)."""
    one_hot = torch.nn.functional.one_hot(tree_tokens.clamp(min=0), target_probs.shape[-1]).to(target_probs.dtype)
    return unchanged_target_tree_verify(target_probs, one_hot, tree_tokens, parents, generator)


@pytest.mark.slow
@pytest.mark.statistical
def test_sequence_law_test_rejects_a_lossy_rule(stat_models, monkeypatch):
    target, draft = stat_models
    sampling = {"temperature": 1.0, "top_p": 0.9}
    chain = ModelChain(target, draft, PROMPT, SamplingParams(**sampling))
    tv = tree_exact.exact_tree_run_tv(unchanged_target_tree_verify, chain, STAT_SHAPE, "deterministic", L)
    print(f"unchanged-target rule: exact TV of the first {L} tokens = {tv:.4f} (test sized for {SEQUENCE_TV})")
    assert tv >= SEQUENCE_TV, f"the lossy rule's TV here ({tv:.4f}) is below the test's detectable TV {SEQUENCE_TV}"
    monkeypatch.setattr(tree_decoder, "point_mass_tree_verify", unchanged_target_point_mass)
    assert sequence_law_test(target, draft, "deterministic", "tree decoder lossy", **sampling).pvalue < ALPHA
