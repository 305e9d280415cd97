"""Published tree and multi-path verifiers (otspec.tree._published): exact laws against independent routes.

Routes: (1) the completed output law, built here from each verifier's emission
over every realised tree of its draft process, against the target's joint law
(``otspec.models.joint_law``); (2) one-step block verification of
``otspec.block`` on chains; (3) each verifier's sampler against its exact
emission by chi-square (false-failure rate 1e-4 per test, 6 such tests);
(4) SpecHub's optimum against a brute-force min-cut over vocabulary subsets.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from otspec.block import BlockVerifyOneStep, one_token_optimum, tau_law_on_path
from otspec.models import MarkovModel, MemorylessModel, joint_law, random_markov_model
from otspec.testing import chi2_gof
from otspec.tree import DraftTree, TreeShape, enumerate_trees, tree_laws
from otspec.tree._published import (
    MAX_SPECHUB_TREES,
    GreedyBlockVerify,
    HierarchicalVerify,
    SpecHubVerify,
    TraversalVerify,
    enumerate_spechub_trees,
    sample_spechub_tree,
    spechub_optimum,
    spechub_pair_law,
)

ATOL = 1e-12


def _trees(shape, draft, process):
    if process == "spechub":
        return enumerate_spechub_trees(shape, draft)
    return enumerate_trees(shape, draft, process=process)


def _output_law(verifier, trees, draft, target):
    """Law of (emitted path + token), completed by the target to max_depth + 1 tokens."""
    D = max(int(t.depth.max()) for t, _ in trees)
    V = target.vocab_size
    out = np.zeros((V,) * (D + 1))
    tail = {m: joint_law(target, m) for m in range(1, D + 1)} if isinstance(target, MemorylessModel) else None
    for tree, w in trees:
        P, Q = tree_laws(tree, draft, target)
        E = verifier.emission(tree, P, Q)
        np.testing.assert_allclose(E.sum(), 1.0, atol=ATOL)
        assert E.min() >= 0.0
        for a in range(tree.n + 1):
            s = tree.path(a)
            for y in range(V):
                m = w * E[a, y]
                if m == 0.0:
                    continue
                seq = s + (y,)
                rest = D + 1 - len(seq)
                if rest == 0:
                    out[seq] += m
                elif tail is not None:
                    out[seq] += m * tail[rest]
                else:
                    for cont in itertools.product(range(V), repeat=rest):
                        pr, z = 1.0, seq
                        for c in cont:
                            pr *= target.next_dist(z)[c]
                            z = z + (c,)
                        out[z] += m * pr
    return out, joint_law(target, D + 1)


def _models(seed, V):
    rng = np.random.default_rng(seed)
    return random_markov_model(V, rng=rng), random_markov_model(V, rng=rng)


# ---------------------------------------------------------------------------
# Traversal Verification
# ---------------------------------------------------------------------------

WOR_SHAPES = [
    TreeShape([(0,), (1,)]),
    TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)]),
    TreeShape([(0,), (1,), (2,), (0, 0), (2, 0)]),
    TreeShape.chains(1, 3),
]


@pytest.mark.parametrize("shape", WOR_SHAPES, ids=lambda s: str(s.n))
@pytest.mark.parametrize("seed", [0, 1])
def test_traversal_is_lossless_on_trees_drawn_without_replacement(shape, seed):
    draft, target = _models(seed, 3)
    out, want = _output_law(TraversalVerify(), _trees(shape, draft, "wor"), draft, target)
    np.testing.assert_allclose(out, want, atol=ATOL)


def test_traversal_is_lossless_with_zeros_and_equal_models():
    d = MarkovModel([[0.0, 0.5, 0.5], [0.5, 0.0, 0.5], [1 / 3, 1 / 3, 1 / 3]], initial=[[0.5, 0.5, 0.0]])
    t = MarkovModel([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], initial=[[0.0, 0.5, 0.5]])
    for draft, target in [(d, t), (d, d)]:
        out, want = _output_law(TraversalVerify(), _trees(WOR_SHAPES[1], draft, "wor"), draft, target)
        np.testing.assert_allclose(out, want, atol=ATOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_traversal_equals_one_step_block_verification_on_every_chain(seed):
    L = 3
    draft, target = _models(seed, 3)
    bv = BlockVerifyOneStep(draft, target, L)
    for tree, _ in _trees(TreeShape.chains(1, L), draft, "iid"):
        P, Q = tree_laws(tree, draft, target)
        E = TraversalVerify().emission(tree, P, Q)
        block = tree.path(L)
        np.testing.assert_allclose(E.sum(axis=1), tau_law_on_path(bv, block, P[:L], Q[:L]), atol=ATOL)
        np.testing.assert_allclose(E[L], E[L].sum() * Q[L], atol=ATOL)  # the bonus token
    np.testing.assert_allclose(
        sum(w * TraversalVerify().expected_accepted(t, *tree_laws(t, draft, target))
            for t, w in _trees(TreeShape.chains(1, L), draft, "iid")),
        bv.expected_length(), atol=ATOL)


def test_traversal_is_lossy_on_iid_children_smallest_cases():
    # fewest nodes: V = 3, two children at the root
    p, q = MemorylessModel([1 / 3, 2 / 3, 0.0]), MemorylessModel([2 / 3, 0.0, 1 / 3])
    out, want = _output_law(TraversalVerify(), _trees(TreeShape([(0,), (1,)]), p, "iid"), p, q)
    np.testing.assert_allclose(out[2, 0], 10 / 27, atol=ATOL)
    np.testing.assert_allclose(want[2, 0], 2 / 9, atol=ATOL)
    # smallest vocabulary: V = 2, one child with two i.i.d. children
    p, q = MemorylessModel([0.25, 0.75]), MemorylessModel([0.5, 0.5])
    out, want = _output_law(TraversalVerify(), _trees(TreeShape([(0,), (0, 0), (0, 1)]), p, "iid"), p, q)
    np.testing.assert_allclose(np.abs(out - want).max(), 3 / 128, atol=ATOL)
    np.testing.assert_allclose(out.sum(), 1.0, atol=ATOL)


def test_traversal_two_iid_children_at_v2_are_exact():
    # the V = 2 depth-1 case is exact on a grid (the loss needs V >= 3 or depth 2)
    for a, b in itertools.product([0.25, 0.5, 0.75], repeat=2):
        p, q = MemorylessModel([a, 1 - a]), MemorylessModel([b, 1 - b])
        out, want = _output_law(TraversalVerify(), _trees(TreeShape([(0,), (1,)]), p, "iid"), p, q)
        np.testing.assert_allclose(out, want, atol=ATOL)


def test_traversal_is_lossy_on_a_shape_with_a_rank_gap():
    # rank 1 without rank 0: the child is the second draw, not a draw from p
    p, q = MemorylessModel([0.5, 0.3, 0.2]), MemorylessModel([0.2, 0.3, 0.5])
    out, want = _output_law(TraversalVerify(), _trees(TreeShape([(1,)]), p, "wor"), p, q)
    assert np.abs(out - want).max() > 0.01


# ---------------------------------------------------------------------------
# GBV
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("k,L,V,seed", [(2, 1, 3, 0), (2, 2, 2, 1), (3, 1, 3, 2), (3, 2, 2, 3), (1, 2, 3, 4)])
def test_gbv_with_one_tie_order_is_lossless(k, L, V, seed):
    draft, target = _models(seed, V)
    out, want = _output_law(GreedyBlockVerify(), _trees(TreeShape.chains(k, L), draft, "iid"), draft, target)
    np.testing.assert_allclose(out, want, atol=ATOL)


def test_gbv_ties_with_equal_memoryless_models_stay_lossless():
    h = MemorylessModel([0.5, 0.5])
    out, want = _output_law(GreedyBlockVerify(), _trees(TreeShape.chains(3, 2), h, "iid"), h, h)
    np.testing.assert_allclose(out, want, atol=ATOL)


def test_gbv_reference_tie_break_is_lossy_at_v2_l1_k2():
    h = MemorylessModel([0.5, 0.5])
    out, want = _output_law(GreedyBlockVerify("first-path"), _trees(TreeShape.chains(2, 1), h, "iid"), h, h)
    np.testing.assert_allclose(out.sum(axis=1), [2 / 3, 1 / 3], atol=ATOL)
    np.testing.assert_allclose(want.sum(axis=1), [0.5, 0.5], atol=ATOL)


def test_gbv_with_one_path_is_block_verification():
    draft, target = _models(5, 3)
    for tree, _ in _trees(TreeShape.chains(1, 2), draft, "iid"):
        P, Q = tree_laws(tree, draft, target)
        np.testing.assert_allclose(GreedyBlockVerify().emission(tree, P, Q), TraversalVerify().emission(tree, P, Q),
                                   atol=ATOL)


def test_gbv_accepts_fewer_tokens_with_more_paths():
    p, q = MemorylessModel([0.5, 0.5]), MemorylessModel([0.6, 0.4])
    got = []
    for k in (1, 2, 3):
        got.append(sum(w * GreedyBlockVerify().expected_accepted(t, *tree_laws(t, p, q))
                       for t, w in _trees(TreeShape.chains(k, 1), p, "iid")))
    np.testing.assert_allclose(got, [9 / 10, 17 / 20, 29 / 40], atol=ATOL)
    np.testing.assert_allclose(one_token_optimum(p, q, 1, 2).value, 1.0, atol=1e-9)


def test_gbv_selects_the_largest_path():
    # draft (1/2, 1/2), target (3/5, 2/5): token 0 has ratio 1 > 4/5, so any path starting with 0 wins
    p, q = np.tile([0.5, 0.5], (5, 1)), np.tile([0.6, 0.4], (5, 1))
    tree = DraftTree(TreeShape.chains(2, 2), [-1, 0, 0, 1, 2], [-1, 1, 0, 0, 1])
    assert GreedyBlockVerify().selected_path(tree, p, q) == (0, 2, 4)


# ---------------------------------------------------------------------------
# HSD
# ---------------------------------------------------------------------------


def test_hsd_as_coded_is_lossy_at_v2_l2():
    p, q = MemorylessModel([2 / 3, 1 / 3]), MemorylessModel([1 / 3, 2 / 3])
    trees = _trees(TreeShape.chains(1, 2), p, "iid")
    out, want = _output_law(HierarchicalVerify(), trees, p, q)
    first_two = out.sum(axis=2)
    np.testing.assert_allclose(first_two[1], [1 / 3, 1 / 3], atol=ATOL)
    np.testing.assert_allclose(want.sum(axis=2)[1], [2 / 9, 4 / 9], atol=ATOL)
    hsd = sum(w * HierarchicalVerify().expected_accepted(t, *tree_laws(t, p, q)) for t, w in trees)
    bv = BlockVerifyOneStep(p, q, 2).expected_length()
    np.testing.assert_allclose(bv, 11 / 9, atol=ATOL)
    assert hsd > bv + 0.05


@pytest.mark.parametrize("seed", [0, 1])
def test_hsd_on_one_token_is_block_verification(seed):
    draft, target = _models(seed, 3)
    out, want = _output_law(HierarchicalVerify(), _trees(TreeShape.chains(1, 1), draft, "iid"), draft, target)
    np.testing.assert_allclose(out, want, atol=ATOL)


def test_hsd_differs_from_block_verification_only_in_the_whole_block():
    draft, target = _models(3, 3)
    for tree, _ in _trees(TreeShape.chains(1, 2), draft, "iid"):
        P, Q = tree_laws(tree, draft, target)
        a, b = HierarchicalVerify().emission(tree, P, Q), TraversalVerify().emission(tree, P, Q)
        # same h_1 and residual laws: the ratios of the shorter outcomes agree
        if b[0].sum() > 0 and b[1].sum() > 0:
            np.testing.assert_allclose(a[0] / a[0].sum(), b[0] / b[0].sum(), atol=1e-12)
        R = np.prod([Q[i][tree.tokens[i + 1]] / P[i][tree.tokens[i + 1]] for i in range(2)])
        np.testing.assert_allclose(a[2].sum(), min(1.0, R), atol=ATOL)


# ---------------------------------------------------------------------------
# SpecHub
# ---------------------------------------------------------------------------


def _brute_optimum(pair, q):
    V = q.shape[0]
    best = np.inf
    for mask in range(1 << V):
        U = [i for i in range(V) if mask >> i & 1]
        outside = sum(pair[i, j] for i in range(V) for j in range(V) if i not in U or j not in U)
        best = min(best, q[U].sum() + outside)
    return best


def test_spechub_pair_law_is_the_official_draw():
    p = np.array([0.2, 0.5, 0.3])
    pair = spechub_pair_law(p)
    np.testing.assert_allclose(pair.sum(), 1.0, atol=ATOL)
    np.testing.assert_allclose(pair[:, 1], [0.2, 0.0, 0.3], atol=ATOL)  # (i, a) w.p. p(i)
    np.testing.assert_allclose(pair[1], [0.5 * 0.4, 0.0, 0.5 * 0.6], atol=ATOL)  # (a, j) w.p. p(a) p(j)/(1 - p(a))
    np.testing.assert_allclose(spechub_pair_law([1.0, 0.0, 0.0])[0], [0.0, 1.0, 0.0], atol=0)


@pytest.mark.parametrize("seed", range(4))
def test_spechub_optimum_is_the_min_cut_and_spechub_attains_it(seed):
    rng = np.random.default_rng(seed)
    V = 4
    p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    if seed == 3:
        q = p.copy()
    opt = spechub_optimum(p, q)
    np.testing.assert_allclose(opt, _brute_optimum(spechub_pair_law(p), q), atol=ATOL)
    d, t = MemorylessModel(p), MemorylessModel(q)
    trees = enumerate_spechub_trees(TreeShape([(0,), (1,)]), d)
    got = sum(w * SpecHubVerify().expected_accepted(tr, *tree_laws(tr, d, t)) for tr, w in trees)
    np.testing.assert_allclose(got, opt, atol=ATOL)


@pytest.mark.parametrize("shape", [TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)]), TreeShape.branching(2, 2)],
                         ids=["5", "6"])
def test_spechub_is_lossless_on_its_own_trees(shape):
    draft, target = _models(7, 3)
    out, want = _output_law(SpecHubVerify(), _trees(shape, draft, "spechub"), draft, target)
    np.testing.assert_allclose(out, want, atol=ATOL)


def test_spechub_is_lossy_on_iid_pairs():
    draft, target = _models(8, 3)
    out, want = _output_law(SpecHubVerify(), _trees(TreeShape([(0,), (1,)]), draft, "iid"), draft, target)
    assert np.abs(out - want).max() > 1e-3


def test_spechub_tree_law_probabilities_sum_to_one_and_match_sampling():
    draft = MemorylessModel([0.5, 0.3, 0.2])
    shape = TreeShape([(0,), (1,), (0, 0)])
    trees = enumerate_spechub_trees(shape, draft)
    np.testing.assert_allclose(sum(w for _, w in trees), 1.0, atol=ATOL)
    index = {tuple(t.tokens.tolist()): i for i, (t, _) in enumerate(trees)}
    rng = np.random.default_rng(11)
    counts = np.zeros(len(trees), dtype=np.int64)
    for _ in range(4000):
        counts[index[tuple(sample_spechub_tree(shape, draft, rng=rng).tokens.tolist())]] += 1
    assert chi2_gof(counts, np.array([w for _, w in trees])).passed


# ---------------------------------------------------------------------------
# samplers against the exact emission
# ---------------------------------------------------------------------------


def _sampler_case(verifier, tree, draft, target, n, seed):
    P, Q = tree_laws(tree, draft, target)
    law = verifier.emission(tree, P, Q)
    rng = np.random.default_rng(seed)
    counts = np.zeros(law.shape, dtype=np.int64)
    for _ in range(n):
        counts[verifier.sample(tree, P, Q, rng=rng)] += 1
    return chi2_gof(counts.ravel(), law.ravel() / law.sum())


@pytest.mark.parametrize("verifier,tree,process", [
    (TraversalVerify(), DraftTree(WOR_SHAPES[1], WOR_SHAPES[1].parents, [-1, 0, 2, 1, 2, 0]), "wor"),
    (GreedyBlockVerify(), DraftTree(TreeShape.chains(2, 2), [-1, 0, 0, 1, 2], [-1, 1, 0, 0, 2]), "iid"),
    (GreedyBlockVerify("first-path"), DraftTree(TreeShape.chains(2, 2), [-1, 0, 0, 1, 2], [-1, 1, 1, 0, 2]), "iid"),
    (HierarchicalVerify(), DraftTree.from_paths([(1,), (1, 0), (1, 0, 2)]), "iid"),
    (SpecHubVerify(), DraftTree(TreeShape([(0,), (1,), (0, 0)]), [-1, 0, 0, 1], [-1, 0, 2, 1]), "spechub"),
], ids=["traversal", "gbv", "gbv-first-path", "hsd", "spechub"])
def test_sampler_follows_the_exact_emission(verifier, tree, process):
    draft, target = _models(21, 3)
    assert _sampler_case(verifier, tree, draft, target, 6000, 3).passed


# ---------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------


def test_inputs_are_not_mutated():
    tree = DraftTree.from_paths([(0,), (1,), (0, 1)])
    rng = np.random.default_rng(0)
    P, Q = rng.dirichlet(np.ones(3), size=4), rng.dirichlet(np.ones(3), size=4)
    P0, Q0 = P.copy(), Q.copy()
    for v in (TraversalVerify(), SpecHubVerify()):
        v.emission(tree, P, Q)
        v.sample(tree, P, Q, rng=0)
    np.testing.assert_array_equal(P, P0)
    np.testing.assert_array_equal(Q, Q0)


def test_errors_name_the_parameter():
    tree = DraftTree.from_paths([(0,), (1,)])
    good = np.full((3, 2), 0.5)
    with pytest.raises(TypeError, match="`tree`"):
        TraversalVerify().emission("tree", good, good)
    with pytest.raises(ValueError, match=r"`p_nodes` must have shape \(n \+ 1, V\) = \(3, V\)"):
        TraversalVerify().emission(tree, good[:2], good)
    with pytest.raises(ValueError, match=r"`q_nodes\[0\]` must sum to 1"):
        TraversalVerify().emission(tree, good, good * 1.1)
    with pytest.raises(ValueError, match="`q_nodes` must be finite and non-negative"):
        TraversalVerify().emission(tree, good, -good)
    with pytest.raises(TypeError, match="`p_nodes`"):
        TraversalVerify().emission(tree, None, good)
    with pytest.raises(ValueError, match=r"`tree` has token 5 at node 1, outside the vocabulary \[0, 2\)"):
        TraversalVerify().emission(DraftTree.from_paths([(5,)]), good[:2], good[:2])
    with pytest.raises(ValueError, match="`p_nodes` and `q_nodes` must have the same shape"):
        TraversalVerify().emission(tree, good, np.full((3, 4), 0.25))
    with pytest.raises(ValueError, match="`tie_break`"):
        GreedyBlockVerify("largest")
    with pytest.raises(ValueError, match="disjoint chains"):
        GreedyBlockVerify().emission(DraftTree.from_paths([(0,), (0, 0), (0, 1)]), np.full((4, 2), 0.5),
                                     np.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="one length L"):
        GreedyBlockVerify().emission(DraftTree.from_paths([(0,), (1,), (0, 0)]), np.full((4, 2), 0.5),
                                     np.full((4, 2), 0.5))
    with pytest.raises(ValueError, match="at least one draft path"):
        GreedyBlockVerify().emission(DraftTree(None, [-1], [-1]), np.full((1, 2), 0.5), np.full((1, 2), 0.5))
    with pytest.raises(ValueError, match="one draft path"):
        HierarchicalVerify().emission(tree, good, good)
    three = DraftTree.from_paths([(0,), (1,), (2,)])
    with pytest.raises(ValueError, match="at most two children"):
        SpecHubVerify().emission(three, np.full((4, 3), 1 / 3), np.full((4, 3), 1 / 3))
    with pytest.raises(ValueError, match="at most two children"):
        SpecHubVerify().sample(three, np.full((4, 3), 1 / 3), np.full((4, 3), 1 / 3), rng=0)
    with pytest.raises(ValueError, match="at most two children"):
        enumerate_spechub_trees(TreeShape.branching(3), MemorylessModel([0.5, 0.5]))
    with pytest.raises(ValueError, match="`draft.vocab_size` must be >= 2"):
        enumerate_spechub_trees(TreeShape.branching(2), MemorylessModel([1.0]))
    with pytest.raises(ValueError, match="`draft.vocab_size` must be >= 2"):
        sample_spechub_tree(TreeShape.branching(2), MemorylessModel([1.0]), rng=0)
    with pytest.raises(ValueError, match="MAX_SPECHUB_TREES"):
        enumerate_spechub_trees(TreeShape.branching(2, 2, 2), MemorylessModel(np.full(40, 1 / 40)))
    with pytest.raises(TypeError, match="`shape`"):
        enumerate_spechub_trees([(0,)], MemorylessModel([0.5, 0.5]))
    with pytest.raises(TypeError, match="`draft`"):
        sample_spechub_tree(TreeShape.branching(2), "model")
    with pytest.raises(TypeError, match="`prefix`"):
        enumerate_spechub_trees(TreeShape.branching(2), MemorylessModel([0.5, 0.5]), prefix=1)
    with pytest.raises(ValueError, match="`p` must have V >= 2"):
        spechub_pair_law([1.0])
    with pytest.raises(ValueError, match="same length"):
        spechub_optimum([0.5, 0.5], [1 / 3, 1 / 3, 1 / 3])
    assert MAX_SPECHUB_TREES >= 10**5



# ---------------------------------------------------------------------------
# the package's tree analyses (otspec.tree.check_lossless, value, the registry)
# ---------------------------------------------------------------------------


def test_check_lossless_agrees_and_the_claims_are_registered():
    from otspec._registry import get_verifier
    from otspec.tree import check_lossless, make_tree_verifier, value

    draft, target = _models(31, 3)
    c = check_lossless("traversal", WOR_SHAPES[1], draft, target, process="wor")
    assert c.passed and c.claimed_lossless and c.acceptance_error < 1e-12
    c = check_lossless("traversal", WOR_SHAPES[1], draft, target, process="iid")
    assert not c.passed and not c.claimed_lossless
    c = check_lossless("gbv", TreeShape.chains(2, 2), draft, target, process="iid")
    assert c.passed and c.claimed_lossless
    lossy = make_tree_verifier("gbv", tie_break="first-path")
    assert not lossy.lossless_for("iid", TreeShape.chains(2, 2))
    assert not GreedyBlockVerify().lossless_for("iid", TreeShape([(0,), (0, 0), (0, 1)]))
    assert HierarchicalVerify().lossless_for("iid", TreeShape.chains(1, 1))
    assert not HierarchicalVerify().lossless_for("iid", TreeShape.chains(1, 2))
    assert TraversalVerify().lossless_for("iid", TreeShape.chains(1, 3))
    assert not TraversalVerify().lossless_for("wor", TreeShape([(1,)]))
    with pytest.raises(ValueError, match="lossless only"):
        value(TreeShape.chains(1, 2), draft, target, process="iid", verifier="hsd")
    got = value(TreeShape.chains(1, 2), draft, target, process="iid", verifier="hsd", allow_lossy=True)
    assert got > value(TreeShape.chains(1, 2), draft, target, process="iid", verifier="traversal") - 1e-12
    for name in ("traversal", "gbv", "hsd", "spechub"):
        assert get_verifier(name, kind="tree").kind == "tree"
    assert not get_verifier("hsd", kind="tree").lossless


def test_check_spechub_lossless():
    from otspec.tree._published import check_spechub_lossless

    d, t = random_markov_model(3, rng=3), random_markov_model(3, rng=13)
    c = check_spechub_lossless(TreeShape.branching(2, 1), d, t)
    assert c.passed and c.claimed_lossless and c.process == "spechub" and c.acceptance_error < 1e-12
    assert not check_spechub_lossless(TreeShape.branching(2, 1), d, t, verifier="specinfer").passed
    with pytest.raises(TypeError, match="`shape` must be a TreeShape"):
        check_spechub_lossless("shape", d, t)
