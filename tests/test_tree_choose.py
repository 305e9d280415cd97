"""Choosing draft-tree shapes: the exact best static top-k shape, greedy growth, Sequoia's dynamic programme.

Every optimum is checked against brute force over every prefix-closed shape (small vocabularies, n <= 5 or 6),
with the value of a shape recomputed here from the models' conditionals (an independent ranking and path
product), not from the module under test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from otspec.models import MarkovModel, MemorylessModel, random_markov_model
from otspec.tree._choose import acceptance_vector, best_shape, greedy_shape, sequoia, sequoia_gap
from otspec.tree._process import sample_tree
from otspec.tree._tree import TreeShape
from otspec.tree._value import value

# ---------------------------------------------------------------------------
# brute force: every prefix-closed shape
# ---------------------------------------------------------------------------


def all_shapes(n: int, K: int, D: int, *, contiguous: bool = False) -> list[frozenset]:
    """Every prefix-closed set of ``n`` rank paths with ranks < K and length <= D (children at ranks 0..b-1 if
    ``contiguous``)."""
    level = {frozenset()}
    for _ in range(n):
        nxt = set()
        for s in level:
            for parent in [()] + list(s):
                if len(parent) >= D:
                    continue
                for r in range(K):
                    c = parent + (r,)
                    if c not in s:
                        nxt.add(s | {c})
        level = nxt
    if contiguous:
        level = {s for s in level if all(p[-1] == 0 or p[:-1] + (p[-1] - 1,) in s for p in s)}
    return sorted(level, key=lambda s: sorted(s))


def realised_tokens(draft, context, rank_path):
    """The token path of a rank path under the top-k process, ranking by (-p, token id) with Python's sort."""
    toks = ()
    for r in rank_path:
        p = draft.next_dist(tuple(context) + toks)
        order = sorted(range(len(p)), key=lambda t: (-float(p[t]), t))
        toks += (order[r],)
    return toks


def target_path_prob(target, context, toks):
    out = 1.0
    for j in range(len(toks)):
        out *= float(target.next_dist(tuple(context) + toks[:j])[toks[j]])
    return out


def shape_value(draft, target, paths, contexts):
    """Mean over contexts of sum over rank paths of Q_c(realised path): E[tau] of the deterministic tree."""
    per = [math.fsum(target_path_prob(target, c, realised_tokens(draft, c, s)) for s in paths) for c in contexts]
    return float(np.mean(per)), per


def markov_pair(seed, V=3, concentration=0.7):
    rng = np.random.default_rng(seed)
    return (random_markov_model(V, concentration=concentration, rng=rng),
            random_markov_model(V, concentration=concentration, rng=rng))


# ---------------------------------------------------------------------------
# best static shape (top-k process)
# ---------------------------------------------------------------------------

CASES = [
    # (seed, V, n, depth, contexts)
    (0, 3, 1, 3, [()]),
    (1, 3, 3, 2, [()]),
    (2, 3, 4, 3, [()]),
    (3, 3, 5, 3, [(1,)]),
    (4, 2, 5, 3, [()]),
    (5, 3, 5, 2, [(), (0,), (2, 1)]),
    (6, 3, 4, 3, [(0,), (1,), (2,)]),
    (7, 2, 5, 4, [(0, 1), (1, 1)]),
]


@pytest.mark.parametrize("seed,V,n,depth,contexts", CASES)
def test_best_shape_equals_brute_force(seed, V, n, depth, contexts):
    draft, target = markov_pair(seed, V)
    choice = best_shape(draft, target, n, contexts=contexts, depth=depth)
    shapes = all_shapes(n, V, depth)
    values = [shape_value(draft, target, s, contexts)[0] for s in shapes]
    best = max(values)
    np.testing.assert_allclose(choice.value, best, rtol=0, atol=1e-14)
    # the returned shape's value, recomputed independently, is the reported one
    got, per = shape_value(draft, target, choice.shape.paths[1:], contexts)
    np.testing.assert_allclose(choice.value, got, rtol=0, atol=1e-14)
    np.testing.assert_allclose(choice.context_values, per, rtol=0, atol=1e-14)
    assert choice.shape.n == n and choice.shape.max_depth <= depth
    assert choice.method == "exact"
    # the tree package's exact value of the deterministic tree, context by context
    for c, got_c in zip(contexts, choice.context_values):
        np.testing.assert_allclose(value(choice.shape, draft, target, process="topk", verifier="target-only",
                                         prefix=c), got_c, rtol=0, atol=1e-14)
    # greedy never beats the optimum and never skips a sibling rank
    g = greedy_shape(draft, target, n, contexts=contexts, depth=depth)
    assert g.value <= choice.value + 1e-14
    assert all(p[-1] == 0 or p[:-1] + (p[-1] - 1,) in g.shape.paths for p in g.shape.paths[1:])
    np.testing.assert_allclose(g.value, shape_value(draft, target, g.shape.paths[1:], contexts)[0], rtol=0, atol=1e-14)


def test_best_shape_skips_a_sibling_rank_and_greedy_misses_it():
    # the draft's rank 1 (token 1) is the target's least likely token
    draft = MemorylessModel([0.5, 0.3, 0.2])
    target = MemorylessModel([0.45, 0.05, 0.5])
    choice = best_shape(draft, target, 2, depth=2)
    assert set(choice.shape.paths[1:]) == {(0,), (2,)}  # rank 1 skipped
    np.testing.assert_allclose(choice.value, 0.95, rtol=0, atol=1e-15)
    brute = max(shape_value(draft, target, s, [()])[0] for s in all_shapes(2, 3, 2))
    np.testing.assert_allclose(brute, 0.95, rtol=0, atol=1e-15)
    g = greedy_shape(draft, target, 2, depth=2)
    assert set(g.shape.paths[1:]) == {(0,), (0, 0)}
    np.testing.assert_allclose(g.value, 0.45 + 0.45**2, rtol=0, atol=1e-15)
    assert g.value < choice.value - 0.29


def test_greedy_can_miss_the_best_gapless_shape():
    # rank 1 is nearly worthless but unlocks rank 2; greedy never pays for it
    draft = MemorylessModel([0.5, 0.3, 0.2])
    target = MemorylessModel([0.45, 0.05, 0.5])
    g = greedy_shape(draft, target, 3, depth=2)
    assert set(g.shape.paths[1:]) == {(0,), (0, 0), (1,)}
    best_gapless = max(shape_value(draft, target, s, [()])[0] for s in all_shapes(3, 3, 2, contiguous=True))
    np.testing.assert_allclose(best_gapless, 1.0, rtol=0, atol=1e-15)  # the star (0,), (1,), (2,)
    np.testing.assert_allclose(g.value, 0.45 + 0.45**2 + 0.05, rtol=0, atol=1e-15)
    assert g.value < best_gapless - 0.29
    best = best_shape(draft, target, 3, depth=2)
    np.testing.assert_allclose(best.value, 0.5 + 0.45 + 0.5**2, rtol=0, atol=1e-15)  # (0,), (2,), (2, 2)


def test_ties_are_broken_by_lower_token_id():
    # a uniform draft: rank r is token r at every step
    draft = MemorylessModel([1 / 3, 1 / 3, 1 / 3])
    target = MarkovModel([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]], initial=[[0.3, 0.3, 0.4]])
    choice = best_shape(draft, target, 4, depth=2)
    brute = max(shape_value(draft, target, s, [()])[0] for s in all_shapes(4, 3, 2))
    np.testing.assert_allclose(choice.value, brute, rtol=0, atol=1e-15)
    assert choice.shape.paths[1:] == ((0,), (1,), (2,), (2, 2))


def test_point_masses_and_p_equal_q():
    # p = q point mass: the single chain carries probability 1 at each depth
    m = MemorylessModel([0.0, 1.0])
    choice = best_shape(m, m, 3)
    assert choice.shape.paths[1:] == ((0,), (0, 0), (0, 0, 0))
    np.testing.assert_allclose(choice.value, 3.0, rtol=0, atol=0)
    np.testing.assert_allclose(choice.node_values, [1.0, 1.0, 1.0, 1.0], rtol=0, atol=0)


@pytest.mark.parametrize("fn", [best_shape, greedy_shape])
def test_only_ranks_inside_the_draft_support(fn):
    # the draft puts mass on one token only: the top-k process has a single child per node
    draft = MemorylessModel([0.0, 1.0, 0.0])
    target = MemorylessModel([0.5, 0.25, 0.25])
    choice = fn(draft, target, 2)
    assert choice.shape.paths[1:] == ((0,), (0, 0))
    sample = sample_tree(choice.shape, draft, process="topk")
    assert sample.tokens.tolist() == [-1, 1, 1]
    np.testing.assert_allclose(choice.value, 0.25 + 0.0625, rtol=0, atol=0)
    with pytest.raises(ValueError, match="`n`=3 is above the 2 rank paths of depth <= `depth`=2 that the top-k"):
        fn(draft, target, 3, depth=2)
    # a static shape over contexts: only ranks realised in every context
    draft2 = MarkovModel([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], initial=[[0.4, 0.4, 0.2]])
    choice = fn(draft2, target, 2, contexts=[(0,), (1,)], depth=2)
    assert choice.shape.paths[1:] == ((0,), (0, 0))
    with pytest.raises(ValueError, match="that the top-k process realises in every context"):
        fn(draft2, target, 2, contexts=[(0,), (1,)], depth=1)


def test_mean_over_contexts_is_not_the_best_for_each_context():
    draft, target = markov_pair(11)
    ctxs = [(0,), (1,), (2,)]
    joint = best_shape(draft, target, 4, contexts=ctxs, depth=2)
    each = [best_shape(draft, target, 4, contexts=[c], depth=2).value for c in ctxs]
    # the static shape is at most the per-context optimum in every context
    assert np.all(joint.context_values <= np.array(each) + 1e-14)
    np.testing.assert_allclose(joint.value, joint.context_values.mean(), rtol=0, atol=1e-15)


def test_inputs_are_not_mutated():
    draft, target = markov_pair(3)
    ctx = [[1, 0], [2]]
    best_shape(draft, target, 3, contexts=ctx, depth=2)
    assert ctx == [[1, 0], [2]]


@pytest.mark.parametrize("fn", [best_shape, greedy_shape])
def test_choose_validation(fn):
    draft, target = markov_pair(0)
    with pytest.raises(ValueError, match="`n` must be an integer >= 1"):
        fn(draft, target, 0)
    with pytest.raises(TypeError, match="`n` must be an integer"):
        fn(draft, target, 2.0)
    with pytest.raises(ValueError, match="`depth` must be an integer >= 1"):
        fn(draft, target, 2, depth=0)
    with pytest.raises(ValueError, match="`contexts` must hold at least one context"):
        fn(draft, target, 2, contexts=[])
    with pytest.raises(TypeError, match="`contexts` must be a sequence of token sequences"):
        fn(draft, target, 2, contexts=(0, 1))
    with pytest.raises(TypeError, match="`contexts` must be a sequence of token sequences"):
        fn(draft, target, 2, contexts=None)
    with pytest.raises(ValueError, match=r"`contexts` must hold token ids in \[0, 3\)"):
        fn(draft, target, 2, contexts=[(3,)])
    with pytest.raises(ValueError, match="`n`=4 is above the 3 rank paths of depth <= `depth`=1"):
        fn(draft, target, 4, depth=1)
    with pytest.raises(ValueError, match="MAX_CHOOSE_WORK"):
        fn(draft, target, 600_000)
    with pytest.raises(ValueError, match="vocab"):
        fn(draft, MemorylessModel([0.5, 0.5]), 2)


# ---------------------------------------------------------------------------
# Sequoia's dynamic programme
# ---------------------------------------------------------------------------


def positional_value(a, paths):
    """sum over nodes of the product of a[rank] along the path (positional acceptance)."""
    return math.fsum(math.prod(a[r] for r in p) for p in paths)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n,depth", [(1, 1), (3, 2), (4, 3), (5, 2), (6, 3)])
def test_sequoia_equals_brute_force(seed, n, depth):
    rng = np.random.default_rng(seed)
    K = 3
    a = rng.dirichlet(np.ones(K + 1))[:K]  # sub-stochastic, not sorted: ranks may be worth more later
    if seed % 2:
        a = np.sort(a)[::-1]
    value, shape = sequoia(a, n, depth)
    shapes = all_shapes(n, K, depth, contiguous=True)
    best = max(positional_value(a, s) for s in shapes)
    np.testing.assert_allclose(value, best, rtol=0, atol=1e-14)
    np.testing.assert_allclose(positional_value(a, shape.paths[1:]), value, rtol=0, atol=1e-14)
    assert shape.n == n and shape.max_depth <= depth
    assert all(p[-1] == 0 or p[:-1] + (p[-1] - 1,) in shape.paths for p in shape.paths[1:])
    if seed % 2:  # non-increasing a: gaps would not help
        best_any = max(positional_value(a, s) for s in all_shapes(n, K, depth))
        np.testing.assert_allclose(value, best_any, rtol=0, atol=1e-14)
    np.testing.assert_allclose(sequoia(a, n, depth, include_bonus=True).value, value + 1.0, rtol=0, atol=0)


def test_sequoia_known_values():
    # a chain when only rank 0 is ever accepted: 0.5 + 0.25 + 0.125
    value, shape = sequoia([0.5], 3, 5)
    assert shape.paths[1:] == ((0,), (0, 0), (0, 0, 0))
    np.testing.assert_allclose(value, 0.875, rtol=0, atol=1e-16)
    # depth 1: a star over the best ranks
    value, shape = sequoia([0.5, 0.3, 0.1], 2, 1)
    assert shape.paths[1:] == ((0,), (1,))
    np.testing.assert_allclose(value, 0.8, rtol=0, atol=1e-16)
    # zero acceptance: nodes still placed, value 0
    value, shape = sequoia([0.0, 0.0], 3, 2)
    assert shape.n == 3 and value == 0.0


def test_sequoia_non_monotone_acceptance_uses_contiguous_ranks():
    # rank 1 is worth more than rank 0, but a rank-1 child needs a rank-0 sibling (Sequoia's code)
    value, shape = sequoia([0.1, 0.8], 1, 1)
    assert shape.paths[1:] == ((0,),)
    np.testing.assert_allclose(value, 0.1, rtol=0, atol=0)
    value, shape = sequoia([0.1, 0.8], 2, 1)
    np.testing.assert_allclose(value, 0.9, rtol=0, atol=1e-16)


def test_sequoia_validation():
    with pytest.raises(ValueError, match=r"`acceptance` entries must lie in \[0, 1\], got acceptance\[1\]=1.5$"):
        sequoia([0.5, 1.5], 2, 2)
    with pytest.raises(ValueError, match="`acceptance` must be a non-empty 1-D array"):
        sequoia([], 2, 2)
    with pytest.raises(ValueError, match="`acceptance` must be a non-empty 1-D array"):
        sequoia([[0.5]], 2, 2)
    with pytest.raises(TypeError, match="`acceptance` must be a 1-D array"):
        sequoia("0.5", 2, 2)
    with pytest.raises(ValueError, match="`n` must be an integer >= 1"):
        sequoia([0.5], 0, 2)
    with pytest.raises(ValueError, match="`depth` must be an integer >= 1"):
        sequoia([0.5], 2, 0)
    with pytest.raises(TypeError, match="`include_bonus` must be a bool"):
        sequoia([0.5], 2, 2, include_bonus=1)
    with pytest.raises(ValueError, match="no shape has `n`=3 nodes with at most K=1 children"):
        sequoia([0.5], 3, 2)
    with pytest.raises(ValueError, match="MAX_SEQUOIA_WORK"):
        sequoia(np.full(2000, 1e-4), 2000, 12)
    a = np.array([0.5, 0.2])
    sequoia(a, 2, 2)
    np.testing.assert_array_equal(a, [0.5, 0.2])


def test_sequoia_shape_round_trips():
    value, shape = sequoia([0.7, 0.2, 0.05], 12, 4)
    assert TreeShape.from_paths(shape.paths[1:]).paths == shape.paths


# ---------------------------------------------------------------------------
# Sequoia's acceptance vector and the gap of its prediction
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("process,verifier", [("wor", "sequoia"), ("iid", "specinfer")])
def test_sequoia_prediction_is_exact_when_acceptance_ignores_the_prefix(seed, process, verifier):
    rng = np.random.default_rng(seed)
    draft = MemorylessModel(rng.dirichlet(np.ones(3)))
    target = MemorylessModel(rng.dirichlet(np.ones(3)))
    n, depth = (4, 2) if process == "iid" else (5, 3)
    g = sequoia_gap(draft, target, n, depth, process=process, verifier=verifier)
    np.testing.assert_allclose(g.exact, value(g.shape, draft, target, process=process, verifier=verifier),
                               rtol=0, atol=0)
    np.testing.assert_allclose(g.predicted, positional_value(g.acceptance, g.shape.paths[1:]), rtol=0, atol=1e-14)
    np.testing.assert_allclose(g.gap, 0.0, rtol=0, atol=1e-14)
    assert g.shape.n == n and g.shape.max_depth <= depth


def test_sequoia_gap_on_a_markov_pair():
    draft, target = markov_pair(3, 3, concentration=0.5)
    g = sequoia_gap(draft, target, 5, 3)
    np.testing.assert_allclose(g.exact, value(g.shape, draft, target, process="wor", verifier="sequoia"),
                               rtol=0, atol=0)
    np.testing.assert_allclose(g.gap, g.predicted - g.exact, rtol=0, atol=0)
    assert abs(g.gap) > 1e-2  # positional acceptance does not hold: the prediction is off
    # averaging the vector over the contexts that the tree's nodes see changes the prediction, not the truth
    g2 = sequoia_gap(draft, target, 5, 3, contexts=[(), (0,), (1,), (2,)])
    assert not np.allclose(g2.acceptance, g.acceptance, rtol=0, atol=1e-6)


@pytest.mark.parametrize("process,verifier", [("wor", "sequoia"), ("iid", "specinfer")])
def test_acceptance_vector(process, verifier):
    draft, target = markov_pair(5, 3)
    ctx = (2,)
    a = acceptance_vector(draft, target, 3, process=process, verifier=verifier, contexts=[ctx])
    p, q = draft.next_dist(ctx), target.next_dist(ctx)
    np.testing.assert_allclose(a[0], np.minimum(p, q).sum(), rtol=0, atol=1e-15)
    star = TreeShape([(0,), (1,), (2,)])
    np.testing.assert_allclose(a.sum(), value(star, draft, target, process=process, verifier=verifier, prefix=ctx),
                               rtol=0, atol=1e-14)
    assert a.sum() <= 1.0 + 1e-15 and a.min() >= 0
    both = acceptance_vector(draft, target, 3, process=process, verifier=verifier, contexts=[ctx, ()])
    np.testing.assert_allclose(both, (a + acceptance_vector(draft, target, 3, process=process,
                                                            verifier=verifier)) / 2, rtol=0, atol=1e-15)


def test_acceptance_vector_validation():
    draft, target = markov_pair(5, 3)
    with pytest.raises(ValueError, match="`verifier`='specinfer' is lossless only for the draft processes"):
        acceptance_vector(draft, target, 2, process="wor", verifier="specinfer")
    with pytest.raises(ValueError, match="`width` must be an integer >= 1"):
        acceptance_vector(draft, target, 0)
    with pytest.raises(ValueError, match="`process` must be one of"):
        acceptance_vector(draft, target, 2, process="beam")
    with pytest.raises(ValueError, match="`n` must be an integer >= 1"):
        sequoia_gap(draft, target, 0, 2)
    with pytest.raises(ValueError, match=r"`prefix` must hold token ids in \[0, 3\)"):
        sequoia_gap(draft, target, 2, 2, prefix=(5,))
