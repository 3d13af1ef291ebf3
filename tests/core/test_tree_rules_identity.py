"""Every fast path of the tree rules gives the outputs and the errors of their plain torch path.

Each rule of ``specverify.core.tree_rules`` is defined once, by its torch walk.  The faster ways of
computing it must not change a single token:

- the native walk (``specverify.core.native_rules.tree_verify`` / ``tree_greedy``), taken by
  ``tree_rejection_sample``, ``point_mass_tree_verify`` and ``greedy_tree_verify`` for contiguous
  CPU float32/bfloat16 inputs, on unless ``SPECVERIFY_NATIVE=0``;
- the validation screen reduced in cache-sized chunks (``rules.SCREEN_CHUNK_BYTES``), and the
  walk's float64 rows kept between calls (``tree_rules.WALK_BUFFER_CACHE_BYTES``);
- the walk's rejection update of the rejecting rows only, when not every row of the batch rejects.

The plain path (:data:`PLAIN`) is the torch walk with the kernel off, fresh float64 rows per call
and the screen over whole tensors.  On random ragged trees (shapes up to V = 128k,
fp64/fp32/bf16/fp16, siblings drawn from the target itself for high acceptance, exact zeros,
one-hot rows, uniforms at the acceptance edge) every rule on every path must return equal tensors
under the same uniforms, and under the same generator also leave it in the same state.  With
validation, every path must raise the first error of the detailed checks (``validate_tree_inputs``
with a screen that flags every row) or, when they find none, return the plain outputs without
validation.  Each row of a batch must give the outputs of a batch of copies of that row (which
always updates the whole batch at once).  Perturbed paths are shown to fail these comparisons.

The plain walk itself is held to the exact law (``specverify.core.tree_exact``) under injected
uniforms in tests/core/test_tree_rules.py (hand cases, the star case, deterministic children),
tests/core/test_tree_layouts.py (every sibling scheme through the layout adapters) and, for depth
three and siblings that are not contiguous, :func:`test_the_plain_walk_has_the_exact_law` here.
tests/core/test_native_tree_rules.py checks the kernel's own pieces and mutants.
"""

from __future__ import annotations

import math

import pytest
import torch

from specverify.core import native_rules, rules, tree_exact, tree_rules
from specverify.core.chains import random_markov_chain
from specverify.core.seeding import derive_seed

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
NATIVE_DTYPES = (torch.float32, torch.bfloat16)

# (name, takes draft_probs, takes randomness)
RULES = [
    ("tree_rejection_sample", True, True),
    ("point_mass_tree_verify", False, True),
    ("greedy_tree_verify", False, False),
    ("typical_acceptance_tree_verify", False, True),
    ("unchanged_target_tree_verify", True, True),
    ("thresholded_tree_verify", True, True),
]
ARGUMENTS = {name: (with_draft, random) for name, with_draft, random in RULES}
NATIVE_RULES = ("tree_rejection_sample", "point_mass_tree_verify", "greedy_tree_verify")

# --------------------------------------------------------------------------------------------
# The paths: (native walk on, {(module, name): value})
# --------------------------------------------------------------------------------------------

WHOLE = 1 << 62
"""A chunk size no input reaches: the screen reduces whole tensors."""

PLAIN = {(rules, "SCREEN_CHUNK_BYTES"): WHOLE, (tree_rules, "WALK_BUFFER_CACHE_BYTES"): 0}

PATHS = {
    "native walk": (True, {}),
    "torch defaults": (False, {}),
    "chunked screen, one row a chunk": (False, {(rules, "SCREEN_CHUNK_BYTES"): 1}),
    "chunked screen, uneven chunks": (False, {(rules, "SCREEN_CHUNK_BYTES"): 5 * 50 * 2 + 3}),
}


def outcome(rule, *args, **kwargs):
    """The rule's outputs as a tuple, or the text of the ValueError it raised."""
    try:
        return tuple(rule(*args, **kwargs))
    except ValueError as error:
        return str(error)


def assert_same(expected, actual):
    if isinstance(expected, str) or isinstance(actual, str):
        assert expected == actual
        return
    assert len(expected) == len(actual)
    for expected_field, actual_field in zip(expected, actual):
        assert torch.equal(expected_field, actual_field), (expected_field, actual_field)


def on_path(path: str, function, *args, **kwargs):
    """``outcome(function, ...)`` on one path (a name of :data:`PATHS`, or ``"plain"``)."""
    native, settings = (False, PLAIN) if path == "plain" else PATHS[path]
    with pytest.MonkeyPatch.context() as patch, native_rules.path(native):
        for (module, name), value in settings.items():
            patch.setattr(module, name, value)
        return outcome(function, *args, **kwargs)


def call(name, p, q, tokens, parents, generator=None, *, uniforms=None, validate=True):
    """Rule ``name`` called with the arguments it takes."""
    with_draft, random = ARGUMENTS[name]
    rule, draft = getattr(tree_rules, name), (q,) if with_draft else ()
    if not random:
        return rule(p, *draft, tokens, parents, validate=validate)
    return rule(p, *draft, tokens, parents, generator, uniforms=uniforms, validate=validate)


def detailed_checks(name, p, q, tokens, parents, u):
    """``validate_tree_inputs`` as the rule calls it, its screen flagging every row, so that the
    detailed checks always run."""
    with_draft, random = ARGUMENTS[name]

    def flag_every_row(probs):
        return torch.zeros(probs.shape[:2], dtype=torch.bool, device=probs.device)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tree_rules, "_rows_look_valid", flag_every_row)
        tree_rules.validate_tree_inputs(p, q if with_draft else None, tokens, parents,
                                        uniforms=u if random else None, needs_randomness=random)


def plain_outcome(name, p, q, tokens, parents, u):
    """What rule ``name`` with validation must give: the detailed checks' first error, or the plain
    path's outputs without validation."""
    try:
        detailed_checks(name, p, q, tokens, parents, u)
    except ValueError as error:
        return str(error)
    return on_path("plain", call, name, p, q, tokens, parents, uniforms=u, validate=False)


def compare(path, name, p, q, tokens, parents, u, *, valid=True):
    """Assert that rule ``name`` on ``path`` gives the plain outcome, with validation and (for valid
    inputs) without."""
    expected = plain_outcome(name, p, q, tokens, parents, u)
    assert_same(expected, on_path(path, call, name, p, q, tokens, parents, uniforms=u))
    if valid:
        assert not isinstance(expected, str), expected
        assert_same(expected, on_path(path, call, name, p, q, tokens, parents, uniforms=u, validate=False))
    return expected


@pytest.fixture
def kernel_calls(monkeypatch):
    """The native walks' outcomes during the test (``None``: declined or flagged the inputs)."""
    taken: list = []
    for function in ("tree_verify", "tree_greedy"):
        original = getattr(native_rules, function)
        monkeypatch.setattr(native_rules, function,
                            lambda *a, original=original, **k: taken.append(original(*a, **k)) or taken[-1])
    return taken


def skip_without_kernel(path: str) -> None:
    if PATHS[path][0] and not native_rules.enabled():
        pytest.skip("no C compiler: the native kernel cannot be built")


def assert_kernel_taken(path: str, name: str, dtype: torch.dtype, calls: list) -> None:
    """On the native path, a native rule on float32/bfloat16 inputs must have run the native walk."""
    if PATHS[path][0] and name in NATIVE_RULES and dtype in NATIVE_DTYPES:
        assert any(result is not None for result in calls), "the native path was never taken"


# --------------------------------------------------------------------------------------------
# Random trees
# --------------------------------------------------------------------------------------------


def random_rows(gen: torch.Generator, shape: tuple[int, ...], zero_fraction: float) -> torch.Tensor:
    probs = torch.softmax(3.0 * torch.randn(shape, generator=gen, dtype=torch.float64), -1)
    probs = probs * (torch.rand(shape, generator=gen, dtype=torch.float64) >= zero_fraction)
    probs[..., 0] += probs.sum(-1) == 0
    hot = torch.rand(shape[:-1], generator=gen, dtype=torch.float64) < 0.1
    probs = torch.where(hot[..., None], torch.nn.functional.one_hot(probs.argmax(-1), shape[-1]).to(probs), probs)
    return probs / probs.sum(-1, keepdim=True)


def random_tree_case(seed: int, batch: int, num_nodes: int, vocab: int, dtype: torch.dtype):
    """``(target_probs, draft_probs, tree_tokens, parents, uniforms)``: per row a random tree of a
    random size (absent nodes last), each node's parent an earlier node or the root, its token
    drawn from its draft row as cast to ``dtype``; a third of the rows draft from the target law
    at the parent (high acceptance, deep paths).  The uniforms of a fifth of the nodes sit at the
    acceptance edge ``p/q`` (NaN in the columns of absent nodes: see :func:`valid_uniforms`)."""
    gen = torch.Generator().manual_seed(seed)
    p = random_rows(gen, (batch, num_nodes + 1, vocab), float(torch.rand((), generator=gen)) * 0.5)
    q = random_rows(gen, (batch, num_nodes, vocab), float(torch.rand((), generator=gen)) * 0.5)
    parents = torch.full((batch, num_nodes), -1, dtype=torch.int64)
    for node in range(1, num_nodes):
        parents[:, node] = torch.randint(-1, node, (batch,), generator=gen)
    same = torch.rand(batch, generator=gen) < 1 / 3
    at_parent = p.gather(1, (parents + 1)[..., None].expand(-1, -1, vocab))
    q = torch.where(same[:, None, None], at_parent, q)
    p_cast, q_cast = p.to(dtype), q.to(dtype)
    tokens = torch.multinomial(q_cast.double().reshape(-1, vocab), 1, generator=gen).reshape(batch, num_nodes)
    size = torch.randint(1, num_nodes + 1, (batch,), generator=gen)
    absent = torch.arange(num_nodes) >= size[:, None]
    tokens = torch.where(absent, -1, tokens)
    parents = torch.where(absent, -1, parents)
    u = torch.rand(batch, num_nodes + 1, generator=gen, dtype=torch.float64)
    edge = torch.rand(batch, num_nodes, generator=gen) < 0.2
    p_at = at_parent.to(dtype).double().gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    q_at = q_cast.double().gather(-1, tokens.clamp(min=0)[..., None])[..., 0]
    u[:, :-1] = torch.where(edge, (p_at / q_at).clamp(max=math.nextafter(1.0, 0.0)), u[:, :-1])
    return p_cast, q_cast, tokens, parents, u


def valid_uniforms(case):
    """The case with the NaN edge uniforms of absent nodes (``q = 0``) replaced by 0.5."""
    p, q, tokens, parents, u = case
    return p, q, tokens, parents, torch.nan_to_num(u, nan=0.5)


SHAPES = [(1, 1, 2), (3, 2, 5), (5, 4, 7), (8, 8, 32), (17, 6, 50), (64, 8, 16)]
LARGE_SHAPES = [(4, 5, 4099), (3, 4, 32_768)]


# --------------------------------------------------------------------------------------------
# The same outputs on every path
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rule", [name for name, _, _ in RULES])
@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_every_path_gives_the_plain_outputs(path, rule, dtype, kernel_calls):
    skip_without_kernel(path)
    for shape in SHAPES:
        for repeat in range(2):
            case = valid_uniforms(random_tree_case(derive_seed("tree-identity", rule, shape, str(dtype), repeat),
                                                   *shape, dtype))
            compare(path, rule, *case)
    assert_kernel_taken(path, rule, dtype, kernel_calls)


@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=str)
@pytest.mark.parametrize("path", ["native walk", "torch defaults"])
def test_the_same_outputs_at_large_vocabularies(path, shape, dtype, kernel_calls):
    skip_without_kernel(path)
    case = valid_uniforms(random_tree_case(derive_seed("tree-identity-large", shape, str(dtype)), *shape, dtype))
    for rule in NATIVE_RULES:
        compare(path, rule, *case)
    assert_kernel_taken(path, "tree_rejection_sample", dtype, kernel_calls)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["native walk", "torch defaults"])
def test_the_same_outputs_at_128k(path, dtype, kernel_calls):
    skip_without_kernel(path)
    case = valid_uniforms(random_tree_case(derive_seed("tree-identity-128k", str(dtype)), 2, 4, 131_072, dtype))
    compare(path, "tree_rejection_sample", *case)
    assert_kernel_taken(path, "tree_rejection_sample", dtype, kernel_calls)


@pytest.mark.parametrize("dtype", NATIVE_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["native walk", "torch defaults"])
def test_the_same_outputs_and_generator_state_under_the_same_generator(path, dtype, kernel_calls):
    skip_without_kernel(path)
    p, q, tokens, parents, _ = random_tree_case(derive_seed("tree-identity-gen", str(dtype)), 9, 6, 300, dtype)
    for seed in range(3):
        for rule in ("tree_rejection_sample", "point_mass_tree_verify", "typical_acceptance_tree_verify"):
            plain_gen, path_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            expected = on_path("plain", call, rule, p, q, tokens, parents, plain_gen)
            assert_same(expected, on_path(path, call, rule, p, q, tokens, parents, path_gen))
            assert torch.equal(plain_gen.get_state(), path_gen.get_state())
    assert_kernel_taken(path, "tree_rejection_sample", dtype, kernel_calls)


def test_float64_inputs_are_not_modified():
    """The walk updates its float64 rows in place; with float64 inputs the first row must be a copy."""
    p, q, tokens, parents, u = random_tree_case(derive_seed("tree-identity-inplace"), 6, 5, 40, torch.float64)
    p_before, q_before = p.clone(), q.clone()
    tree_rules.tree_rejection_sample(p, q, tokens, parents, uniforms=torch.nan_to_num(u, nan=0.5))
    assert torch.equal(p, p_before) and torch.equal(q, q_before)


# --------------------------------------------------------------------------------------------
# The update of the rejecting rows only equals the update of the whole batch
# --------------------------------------------------------------------------------------------


def assert_rows_match_batches_of_copies(rule, p, q, tokens, parents, u):
    """Row ``b`` of the batch gives the outputs of a batch of ``B`` copies of row ``b``, whose rows
    all accept or all reject each node (the walk then updates the whole batch at once)."""
    batch = p.shape[0]
    together = on_path("torch defaults", call, rule, p, q, tokens, parents, uniforms=u)
    for row in range(batch):
        copies = [tensor[row:row + 1].expand(batch, *tensor.shape[1:]).contiguous()
                  for tensor in (p, q, tokens, parents, u)]
        alone = on_path("torch defaults", call, rule, *copies[:4], uniforms=copies[4])
        assert all(torch.equal(field[row], field_alone[0]) for field, field_alone in zip(together, alone)), row


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("rule", ["tree_rejection_sample", "point_mass_tree_verify", "unchanged_target_tree_verify"])
def test_each_row_gives_the_outputs_of_a_batch_of_its_copies(rule, dtype):
    for shape in [(5, 4, 7), (12, 6, 50)]:
        seed = derive_seed("tree-identity-rows", rule, shape, str(dtype))
        case = valid_uniforms(random_tree_case(seed, *shape, dtype))
        assert_rows_match_batches_of_copies(rule, *case)


# --------------------------------------------------------------------------------------------
# Validation: the detailed checks' first error on every path, nothing for valid inputs
# --------------------------------------------------------------------------------------------


def _corruptions(p, q, tokens, parents, u):
    """(name, inputs) pairs, each breaking one property the validator checks (or none: -0.0)."""
    batch, _, vocab = p.shape
    tiny_negative = -2.0 ** -24 if p.dtype == torch.float16 else -1e-30  # -1e-30 rounds to -0.0 in float16

    def with_entry(tensor, index, value):
        tensor = tensor.clone()
        tensor[index] = value
        return tensor

    yield "target NaN", (with_entry(p, (batch - 1, 0, vocab - 1), math.nan), q, tokens, parents, u)
    yield "target Inf", (with_entry(p, (0, 0, 0), math.inf), q, tokens, parents, u)
    yield "target negative", (with_entry(p, (0, 0, vocab - 1), tiny_negative), q, tokens, parents, u)
    minus_zero = with_entry(p, (0, 0, vocab - 1), -0.0) if float(p[0, 0, -1]) == 0 else p
    yield "minus zero", (minus_zero, q, tokens, parents, u)
    yield "draft NaN", (p, with_entry(q, (0, 0, 1), math.nan), tokens, parents, u)
    yield "draft negative", (p, with_entry(q, (0, 0, vocab - 1), -1e-3), tokens, parents, u)
    yield "target scaled", (p * 1.5, q, tokens, parents, u)
    yield "draft scaled", (p, q * 0.5, tokens, parents, u)
    yield "token too large", (p, q, with_entry(tokens, (0, 0), vocab), parents, u)
    yield "forward parent", (p, q, tokens, with_entry(parents, (0, 0), 0), u)
    yield "draft probability 0", (p, with_entry(q, (0, 0, int(tokens[0, 0])), 0.0), tokens, parents, u)
    yield "uniform 1", (p, q, tokens, parents, with_entry(u, (0, -1), 1.0))


def is_invalid_for(rule: str, corruption: str) -> bool:
    """Whether ``corruption`` breaks an input that ``rule`` reads."""
    with_draft, random = ARGUMENTS[rule]
    if corruption == "minus zero":
        return False
    if corruption.startswith("draft"):
        return with_draft
    return random or not corruption.startswith("uniform")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("path", PATHS, ids=list(PATHS))
def test_every_path_gives_the_detailed_checks_first_error(path, dtype):
    """Every rule on small trees; at V = 4096 the rules with a native walk (the lossy rules call the
    validator exactly as the torch path of ``tree_rejection_sample`` or ``point_mass_tree_verify`` does)."""
    skip_without_kernel(path)
    every_rule = [name for name, _, _ in RULES]
    for shape, names in [((1, 1, 3), every_rule), ((4, 3, 50), every_rule), ((3, 2, 4096), NATIVE_RULES)]:
        seed = derive_seed("tree-identity-validation", shape, str(dtype))
        case = valid_uniforms(random_tree_case(seed, *shape, dtype))
        for label, corrupted in _corruptions(*case):
            for rule in names:
                invalid = is_invalid_for(rule, label)
                expected = compare(path, rule, *corrupted, valid=not invalid)
                assert isinstance(expected, str) == invalid, (rule, label)


# --------------------------------------------------------------------------------------------
# The plain walk has the exact law
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(-1, 0, 1), (-1, -1, 0, 1), (-1, 0, -1, 2)], ids=str)
def test_the_plain_walk_has_the_exact_law(shape):
    """Deterministic children (the scheme whose integration takes seconds at four nodes) of a chain of
    depth three and of trees whose siblings are not contiguous: both lossless rules have the target's
    law exactly, and the rule that tests each sibling against the unchanged target law does not."""
    chain = random_markov_chain(3, 1, seed=derive_seed("tree-identity-exact", shape), closeness=0.0)
    with native_rules.disabled():
        for rule in (tree_rules.verify_tree, tree_rules.point_mass_verify_tree):
            assert tree_exact.exact_tree_step_tv(rule, chain, shape, "deterministic") < 1e-12, rule.__name__
        lossy = tree_exact.exact_tree_step_tv(tree_rules.unchanged_target_verify_tree, chain, shape, "deterministic")
    if len(set(shape)) < len(shape):  # siblings: the unchanged law counts an accepted token's mass twice
        assert lossy > 1e-3


# --------------------------------------------------------------------------------------------
# The comparisons catch a path that differs from the plain one
# --------------------------------------------------------------------------------------------


def _totals_kept_after_a_partial_rejection(original):
    """The rejecting rows' residuals updated, their totals left as they were."""

    def update(rows, draft_probs, n, x, r, s, *rest):
        before = s.clone()
        original(rows, draft_probs, n, x, r, s, *rest)
        return before

    return update


def _screen_without_the_sign_bit(original):
    """A screen that checks the row sums only (a tiny negative entry passes it)."""

    def screen(probs):
        sums = probs.sum(-1).to(torch.float64)
        return (sums - 1).abs() <= rules.row_sum_tolerance(probs.dtype, probs.shape[-1])

    return screen


def test_a_partial_update_that_keeps_the_totals_fails_the_batch_of_copies_check(monkeypatch):
    monkeypatch.setattr(tree_rules, "_update_some_rows", _totals_kept_after_a_partial_rejection(
        tree_rules._update_some_rows))
    case = valid_uniforms(random_tree_case(derive_seed("tree-identity-mutant-rows"), 12, 6, 50, torch.float64))
    with pytest.raises(AssertionError):
        assert_rows_match_batches_of_copies("tree_rejection_sample", *case)


def test_a_screen_without_the_sign_bit_fails_the_validation_check(monkeypatch):
    monkeypatch.setattr(tree_rules, "_rows_look_valid", _screen_without_the_sign_bit(tree_rules._rows_look_valid))
    case = valid_uniforms(random_tree_case(derive_seed("tree-identity-mutant-screen"), 4, 3, 50, torch.float64))
    corrupted = dict(_corruptions(*case))["target negative"]
    with pytest.raises(AssertionError):
        compare("torch defaults", "tree_rejection_sample", *corrupted, valid=False)
