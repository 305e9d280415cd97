"""Draft blocks and SpecTr's draft sets are draft trees: ``DraftTree.from_blocks`` and ``DraftSet.node_tokens``.

otspec.block's multi-draft verifiers take ``k`` i.i.d. draft blocks as plain tuples, and otspec.spectr keeps a
prefix tree as a ``(K, L)`` leaf array (:class:`otspec.spectr.DraftSet`); both are the trees of
``TreeShape.chains(k, L)`` / ``TreeShape.branching(...)``. Independent routes checked here:

* the i.i.d. process on ``chains(k, L)`` (``enumerate_trees``) against every ``k``-tuple of blocks enumerated
  by hand with the product of the blocks' probabilities, converted with ``from_blocks``;
* the multi-draft block LPs (``multidraft_ot``, ``one_token_optimum``: set weights from a closed form,
  reward ``max_i lcp``) against the tree LPs (weights summed over enumerated trees, reward from root paths) on
  the converted trees: same classes, weights (to 1e-12), rewards (exactly) and optima (to the LP tolerance);
* the accepted length of a multi-draft plan sample against the longest root path of the converted tree;
* SpecTr's DraftSelection on a draft set against ``SpecTrTreeVerifier.sample`` on the converted tree with the
  same random stream (same token-verifier calls in the same order): identical outputs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from otspec import spectr
from otspec.block import MultiDraftPlanVerifier, multidraft_ot, one_token_optimum
from otspec.models import random_markov_model, sequence_probability
from otspec.spectr import DraftSet
from otspec.tree import DraftTree, SpecTrTreeVerifier, TreeShape, enumerate_trees, optimum, tree_laws

LP_TOL = 1e-8  # two HiGHS LPs (feasibility 1e-10, a few hundred rows, rewards <= L)
EXACT = 1e-12


def _class(tree: DraftTree) -> tuple:
    """The set of root token paths (what both LP families see of a realised tree), sorted by (len, path)."""
    return tuple(sorted(set(tree.paths()[1:]), key=lambda p: (len(p), p)))


def _blocks(key, V, L, k):
    """A multi-draft key (distinct block indices) as ``k`` blocks, padded with its first block."""
    bs = [tuple(int(x) for x in np.unravel_index(a, (V,) * L)) for a in key]
    return bs + [bs[0]] * (k - len(bs))


# ---------------------------------------------------------------------------
# the conversion itself
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("branching", [(2, 2), (3, 1), (2, 1, 2), (1, 2), (1, 1, 1)])
def test_a_draft_set_is_the_prefix_tree_of_its_branching(branching):
    draft = random_markov_model(3, rng=5)
    for seed in range(4):
        ds = spectr.prefix_tree_drafts(draft, branching, prefix=(1,), rng=seed)
        tree = DraftTree.from_blocks(ds)
        assert tree.shape.paths == TreeShape.branching(*branching).paths
        assert tree.n == sum(math.prod(branching[: d + 1]) for d in range(len(branching)))
        # the leaves in node order are the draft sequences in tree order
        assert [tree.path(v) for v in tree.leaves] == [tuple(int(x) for x in row) for row in ds.tokens]
        np.testing.assert_array_equal(tree.tokens[1:], ds.node_tokens())
        assert DraftTree.from_blocks(ds.tokens, branching=ds.branching) == tree
        # every node's path is the prefix shared by the leaves below it
        for v in range(1, tree.n + 1):
            below = [u for u in tree.leaves if tree.path(u)[: tree.depth[v]] == tree.path(v)]
            assert below


def test_iid_blocks_are_chains_even_when_they_share_a_prefix():
    blocks = [(2, 0, 1), (2, 0, 0), (1, 1, 1)]
    tree = DraftTree.from_blocks(blocks)
    assert tree.shape.paths == TreeShape.chains(3, 3).paths
    assert [tree.path(v) for v in tree.leaves] == blocks
    assert tree.children(0) == (1, 2, 3) and tree.tokens[1:4].tolist() == [2, 2, 1]  # duplicate siblings kept
    ds = spectr.iid_drafts(random_markov_model(3, rng=1), 4, 2, rng=0)
    assert DraftTree.from_blocks(ds).shape.paths == TreeShape.chains(4, 2).paths
    assert DraftTree.from_blocks(np.array(blocks, dtype=np.int32)) == tree


def test_from_blocks_refuses_what_is_not_a_block_array_or_prefix_tree():
    ds = DraftSet([[0, 1], [0, 2]], branching=(1, 2))
    with pytest.raises(ValueError, match="`branching` must be None for a DraftSet"):
        DraftTree.from_blocks(ds, branching=(1, 2))
    with pytest.raises(ValueError, match="not the leaves of a prefix tree"):
        DraftTree.from_blocks([[0, 1], [1, 2]], branching=(1, 2))
    with pytest.raises(ValueError, match="multiply to k=2"):
        DraftTree.from_blocks([[0, 1], [1, 2]], branching=(2, 2))
    with pytest.raises(ValueError, match="non-negative"):
        DraftTree.from_blocks([[0, -1]])
    with pytest.raises(ValueError, match="non-empty"):
        DraftTree.from_blocks([1, 2, 3])
    with pytest.raises(TypeError, match="integer"):
        DraftTree.from_blocks([[0.5, 1.0]])
    with pytest.raises(TypeError):
        DraftTree.from_blocks([(0, 1), (0,)])  # ragged
    blocks = [[1, 0], [1, 1]]
    DraftTree.from_blocks(blocks)
    assert blocks == [[1, 0], [1, 1]]  # input not mutated


# ---------------------------------------------------------------------------
# otspec.block: k i.i.d. draft blocks
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed,V,k,L", [(0, 2, 2, 2), (1, 3, 2, 2), (2, 2, 3, 2), (3, 2, 2, 3)])
def test_iid_blocks_converted_are_the_iid_chains_process(seed, V, k, L):
    draft = random_markov_model(V, rng=seed)
    by_hand: dict = {}
    for blocks in itertools.product(itertools.product(range(V), repeat=L), repeat=k):
        w = math.prod(sequence_probability(draft, b) for b in blocks)
        if w > 0:
            tree = DraftTree.from_blocks(blocks)
            by_hand[tree] = by_hand.get(tree, 0.0) + w
    listed = dict(enumerate_trees(TreeShape.chains(k, L), draft, process="iid"))
    assert set(listed) == set(by_hand)
    for tree, w in listed.items():
        np.testing.assert_allclose(w, by_hand[tree], rtol=0, atol=EXACT)


@pytest.mark.parametrize("seed,V,k,L", [(0, 2, 2, 2), (1, 3, 2, 2), (2, 2, 3, 2)])
def test_multidraft_block_lps_are_the_tree_lps_on_the_converted_trees(seed, V, k, L):
    draft, target = random_markov_model(V, rng=seed), random_markov_model(V, rng=seed + 40)
    res = multidraft_ot(draft, target, L, k, raise_on_failure=True)
    tree_opt = optimum(TreeShape.chains(k, L), draft, target, process="iid", one_token=False,
                       raise_on_failure=True)
    plan = tree_opt.plan
    assert plan.columns == tuple(itertools.product(range(V), repeat=L))  # target blocks in the same order
    index = {key: j for j, key in enumerate(plan.keys)}
    seen = set()
    for a, key in enumerate(res.keys):
        j = index[_class(DraftTree.from_blocks(_blocks(key, V, L, k)))]
        seen.add(j)
        np.testing.assert_allclose(plan.weights[j], res.weights[a], rtol=0, atol=EXACT)
        np.testing.assert_array_equal(plan.reward[j], res.reward[a])  # max_i lcp(X^i, y) = longest root path
    assert seen == set(range(len(plan.keys)))  # one class per block set, both ways
    np.testing.assert_allclose(tree_opt.value, res.value, rtol=0, atol=LP_TOL)
    one = optimum(TreeShape.chains(k, L), draft, target, process="iid", raise_on_failure=True)
    np.testing.assert_allclose(one.value, one_token_optimum(draft, target, L, k).value, rtol=0, atol=LP_TOL)


def test_a_multidraft_plan_sample_accepts_the_longest_root_path_of_its_tree():
    draft, target = random_markov_model(2, rng=3), random_markov_model(2, rng=4)
    v = MultiDraftPlanVerifier(draft, target, 2, 2)
    rng = np.random.default_rng(0)
    for _ in range(40):
        s = v.sample(rng=rng)
        paths = set(DraftTree.from_blocks(s.drafts).paths())
        assert s.tau == max(m for m in range(3) if s.output[:m] in paths)


# ---------------------------------------------------------------------------
# otspec.spectr: DraftSelection on a draft set = the tree verifier on its tree
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("branching,token_verifier", [((2, 2), "lp"), ((3, 1), "kseq"), ((2, 1, 2), "multiround"),
                                                      ((1, 3), "optimal")])
def test_draft_selection_is_the_spectr_tree_verifier_on_the_converted_tree(branching, token_verifier):
    draft, target = random_markov_model(3, rng=11), random_markov_model(3, rng=12)
    ctx = (2,)
    verifier = SpecTrTreeVerifier(token_verifier=token_verifier)
    stops = set()
    for seed in range(30):
        ds = spectr.prefix_tree_drafts(draft, branching, prefix=ctx, rng=1000 + seed)
        tree = DraftTree.from_blocks(ds)
        P, Q = tree_laws(tree, draft, target, prefix=ctx)
        out = spectr.draft_selection(draft, target, ds, verifier=token_verifier, prefix=ctx, rng=seed)
        node, y = verifier.sample(tree, P, Q, rng=seed)
        assert out == tree.path(node) + (y,)
        stops.add(len(out))
    assert len(stops) >= 2  # both corrections and accepted paths were exercised
