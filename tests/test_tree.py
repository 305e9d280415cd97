"""Draft-tree types and draft processes: shapes, realised trees, sampling, enumeration, EAGLE-2's dynamic tree.

Independent routes: the derived arrays (parents, ranks, attention mask, leaf paths, SGLang's next-token /
next-sibling arrays) against brute force over the paths; Medusa's own ordering rule (sorted by (len, path));
the enumerated tree probabilities against products of draft probabilities written out here, and against the
sampler (chi-square); the top-k and EAGLE-2 trees against re-implementations from their definitions.

Chi-square tests in this file: 3, each with false-failure rate 1e-6 (fixed seeds): a spurious failure has
probability below 3e-6 (union bound).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from otspec.models import MemorylessModel, random_markov_model, random_table_model, sequence_probability
from otspec.testing import chi2_gof
from otspec.tree import (
    MAX_TREE_NODES,
    DraftTree,
    Eagle2Params,
    TreeShape,
    enumerate_trees,
    sample_tree,
    tree_laws,
)

ALPHA_FAIL = 1e-6


@st.composite
def shapes(draw, max_nodes=6, max_depth=3, max_rank=3):
    """Random prefix-closed sets of rank paths (ranks may skip)."""
    paths = {()}
    for _ in range(draw(st.integers(0, max_nodes))):
        parent = draw(st.sampled_from(sorted(p for p in paths if len(p) < max_depth)))
        paths.add(parent + (draw(st.integers(0, max_rank)),))
    return [p for p in paths if p]


# ----------------------------------------------------------------------------- TreeShape
def test_shape_arrays_and_medusa_order():
    choices = [[1], [0], [0, 0], [0, 1], [2], [0, 0, 0], [1, 0]]
    s = TreeShape.from_medusa_choices(choices)
    # Medusa's generate_medusa_buffers sorts by (len, path): the same node order
    assert s.to_medusa_choices() == sorted(choices, key=lambda x: (len(x), x))
    assert s.paths[0] == ()
    assert s.parents.tolist() == [-1, 0, 0, 0, 1, 1, 2, 4]
    assert s.ranks.tolist() == [-1, 0, 1, 2, 0, 1, 0, 0]
    assert s.depth.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert s.children(0) == (1, 2, 3) and s.children(1) == (4, 5) and s.children(7) == ()
    assert s.leaves == (3, 5, 6, 7)
    assert (s.n, s.max_depth) == (7, 3)
    assert TreeShape([(), *choices]) == s and hash(TreeShape(choices[::-1])) == hash(s)
    for a in (s.parents, s.ranks, s.depth):
        with pytest.raises(ValueError):
            a[0] = 5  # read-only


@given(shapes())
def test_shape_derived_arrays_by_brute_force(paths):
    s = TreeShape(paths)
    assert len(s.paths) == len(set(paths)) + 1
    for i, p in enumerate(s.paths):
        if i:
            assert s.paths[int(s.parents[i])] == p[:-1]
            assert s.ranks[i] == p[-1] and s.depth[i] == len(p)
            assert int(s.parents[i]) < i
        assert s.children(i) == tuple(j for j, c in enumerate(s.paths) if c[:-1] == p and len(c) == len(p) + 1)
    assert TreeShape.from_medusa_choices(s.to_medusa_choices()) == s
    gaps = any(sorted(s.ranks[list(s.children(i))].tolist()) != list(range(len(s.children(i))))
               for i in range(s.n + 1))
    assert s.has_rank_gaps == gaps


@given(shapes(), st.integers(0, 2**31))
def test_successor_lists_round_trip_under_any_numbering(paths, seed):
    s = TreeShape(paths)
    back = TreeShape.from_successors(s.to_successors())
    # a children list has no rank gaps: ranks become positions among siblings, the node order is kept
    assert np.array_equal(back.parents, s.parents) and not back.has_rank_gaps
    assert (back == s) == (not s.has_rank_gaps)
    s = back
    # Sequoia's growmaps may number the nodes otherwise: relabel nodes 1..n at random
    perm = np.concatenate(([0], 1 + np.random.default_rng(seed).permutation(s.n)))
    relabelled = [None] * (s.n + 1)
    for i, kids in enumerate(s.to_successors()):
        relabelled[int(perm[i])] = [int(perm[c]) for c in kids]
    assert TreeShape.from_successors(relabelled) == s


@pytest.mark.parametrize("succ,match", [
    ([[1], [2], [1]], "lists node 1 twice"),
    ([[1, 3], []], r"`successors\[0\]` lists node 3, outside \[0, 2\)"),
    ([[1], [], []], r"leaves nodes \[2\] unreachable"),
    ([[1], [0]], "lists node 0 twice"),
])
def test_successor_lists_refused(succ, match):
    with pytest.raises(ValueError, match=match):
        TreeShape.from_successors(succ)


def test_chains_and_branching():
    assert TreeShape.chains(2, 3).to_medusa_choices() == [[0], [1], [0, 0], [1, 0], [0, 0, 0], [1, 0, 0]]
    assert TreeShape.chains(1, 1).n == 1
    b = TreeShape.branching(2, 3)
    assert b.n == 2 + 6 and b.children(1) == (3, 4, 5) and not b.has_rank_gaps
    assert TreeShape.branching([3, 1, 1]) == TreeShape.chains(3, 3)
    assert TreeShape([(1,)]).has_rank_gaps and not TreeShape([(0,), (1,)]).has_rank_gaps


@pytest.mark.parametrize("paths,exc,match", [
    ([(0,), (1, 0), (2, 0, 0)], ValueError, r"parent path \(1,\) of \(1, 0\) is missing"),
    ([(0,), (0,)], ValueError, r"must not repeat a path, got \(0,\) twice"),
    ([(0,), (-1,)], ValueError, r"`paths\[1\]` must hold non-negative ranks"),
    ([(0.0,)], TypeError, r"`paths\[0\]` must hold integers, got float"),
    ([(True,)], TypeError, r"`paths\[0\]` must hold integers, got bool"),
    ([0, 1], TypeError, r"`paths\[0\]` must be a sequence of int ranks"),
    ("01", TypeError, r"`paths` must be a sequence of paths"),
    (np.arange(3), TypeError, r"1-D integer array"),
    (5, TypeError, r"`paths` must be a sequence of paths"),
])
def test_shape_refuses_bad_paths(paths, exc, match):
    with pytest.raises(exc, match=match):
        TreeShape(paths)


def test_shape_first_missing_parent_is_named_in_given_order():
    with pytest.raises(ValueError, match=r"parent path \(3,\) of \(3, 1\)"):
        TreeShape([(0,), (3, 1), (2, 2)])


def test_shape_size_limits():
    with pytest.raises(ValueError, match="MAX_TREE_NODES"):
        TreeShape.chains(MAX_TREE_NODES, 2)
    with pytest.raises(ValueError, match="MAX_TREE_NODES"):
        TreeShape.branching(1000, 1000)
    with pytest.raises(ValueError, match="MAX_TREE_NODES"):
        TreeShape([(i,) for i in range(MAX_TREE_NODES + 1)])
    with pytest.raises(TypeError, match="`k` must be an integer"):
        TreeShape.chains(2.0, 1)
    with pytest.raises(ValueError, match="at least one branching factor"):
        TreeShape.branching()
    with pytest.raises(ValueError, match=r"`b\[1\]` must be an integer >= 1"):
        TreeShape.branching(2, 0)


# ----------------------------------------------------------------------------- DraftTree
@given(shapes(), st.integers(0, 2**31))
def test_tree_derived_views_by_brute_force(paths, seed):
    s = TreeShape(paths)
    rng = np.random.default_rng(seed)
    tokens = np.concatenate(([-1], rng.integers(0, 3, size=s.n)))
    t = DraftTree(s, s.parents, tokens)
    node_paths = t.paths()
    assert [t.path(i) for i in range(s.n + 1)] == node_paths
    mask = t.attention_mask()
    for i in range(s.n + 1):
        anc = {i}
        j = i
        while j > 0:
            j = int(s.parents[j])
            anc.add(j)
        assert set(np.flatnonzero(mask[i]).tolist()) == anc
    assert mask[:, 0].all()
    assert np.array_equal(t.positions(), s.depth)
    leaf_paths = t.leaf_paths()
    assert [lp[-1] for lp in leaf_paths] == list(s.leaves)
    for lp in leaf_paths:
        assert lp[0] == 0 and all(int(s.parents[b]) == a for a, b in zip(lp, lp[1:]))
    first, nxt = t.next_token_sibling()
    for i in range(s.n + 1):
        kids, c = [], int(first[i])
        while c >= 0:
            kids.append(c)
            c = int(nxt[c])
        assert tuple(kids) == s.children(i)


def test_tree_from_paths_keeps_sibling_order():
    t = DraftTree.from_paths([(7,), (5,), (7, 2), (5, 1), (7, 0)])
    assert t.tokens.tolist() == [-1, 7, 5, 2, 0, 1]
    assert t.parents.tolist() == [-1, 0, 0, 1, 1, 2]
    assert t.children(1) == (3, 4) and t.shape is None
    assert t == DraftTree(None, [-1, 0, 0, 1, 1, 2], [-1, 7, 5, 2, 0, 1])
    assert t != DraftTree.from_paths([(5,), (7,)])


def test_tree_allows_equal_siblings():
    t = DraftTree(TreeShape([(0,), (1,)]), [-1, 0, 0], [-1, 4, 4])
    assert t.paths() == [(), (4,), (4,)]


@pytest.mark.parametrize("kw,exc,match", [
    (dict(parents=[-1, 1], tokens=[-1, 0]), ValueError, r"parents\[1\] = 1"),
    (dict(parents=[0, 0], tokens=[-1, 0]), ValueError, r"`parents\[0\]` must be -1"),
    (dict(parents=[-1, 0], tokens=[0, 0]), ValueError, r"`tokens\[0\]` must be -1"),
    (dict(parents=[-1, 0], tokens=[-1, -3]), ValueError, r"tokens\[1\] = -3"),
    (dict(parents=[-1, 0], tokens=[-1, 0, 1]), ValueError, "must have the length of `parents`"),
    (dict(parents=[-1, 0.5], tokens=[-1, 0]), TypeError, "`parents` must hold integers"),
    (dict(parents=[[-1, 0]], tokens=[-1, 0]), ValueError, "`parents` must be 1-D"),
    (dict(parents=[], tokens=[]), ValueError, "at least the root"),
    (dict(parents=[-1, 0, 1], tokens=[-1, 0, 1], depth=[0, 1, 1]), ValueError, "`depth` must be the path lengths"),
])
def test_tree_refuses_bad_arrays(kw, exc, match):
    with pytest.raises(exc, match=match):
        DraftTree(None, **kw)


def test_tree_refuses_parents_other_than_the_shape():
    with pytest.raises(ValueError, match="must equal `shape.parents`"):
        DraftTree(TreeShape([(0,), (0, 0)]), [-1, 0, 0], [-1, 1, 1])
    with pytest.raises(TypeError, match="`shape` must be a TreeShape or None"):
        DraftTree([(0,)], [-1, 0], [-1, 1])


def test_from_paths_refuses_bad_paths():
    with pytest.raises(ValueError, match=r"parent path \(1,\) of \(1, 2\) is missing"):
        DraftTree.from_paths([(0,), (1, 2)])
    with pytest.raises(ValueError, match="twice"):
        DraftTree.from_paths([(0,), (0,)])


# ----------------------------------------------------------------------------- processes
SHAPE = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)])


def _iid_probability(tree, draft, prefix=()):
    """P(T) for i.i.d. children: the product of the draft's probabilities of every node's token."""
    return math.prod(float(draft.next_dist(prefix + tree.path(int(tree.parents[i])))[tree.tokens[i]])
                     for i in range(1, tree.n + 1))


def _wor_probability(tree, draft, prefix=()):
    """P(T) without replacement, gap-free shape: each node's children are its first draws, in order."""
    w = 1.0
    for v in range(tree.n + 1):
        p = draft.next_dist(prefix + tree.path(v))
        used = 0.0
        for c in tree.children(v):
            w *= p[tree.tokens[c]] / (1.0 - used)
            used += p[tree.tokens[c]]
    return w


@pytest.mark.parametrize("seed", [0, 1])
def test_enumeration_matches_product_formulas(seed):
    draft = random_markov_model(3, rng=seed)
    prefix = (2,)
    iid = enumerate_trees(SHAPE, draft, process="iid", prefix=prefix)
    assert len(iid) == 3**5 and len({t for t, _ in iid}) == len(iid)
    np.testing.assert_allclose(math.fsum(w for _, w in iid), 1.0, rtol=0, atol=1e-14)
    for t, w in iid:
        np.testing.assert_allclose(w, _iid_probability(t, draft, prefix), rtol=1e-13, atol=0)
    wor = enumerate_trees(SHAPE, draft, process="wor", prefix=prefix)
    assert len(wor) == 6 * 6 * 3  # ordered pairs at the root and at node (0,), any token at (1,)
    np.testing.assert_allclose(math.fsum(w for _, w in wor), 1.0, rtol=0, atol=1e-14)
    for t, w in wor:
        for v in range(t.n + 1):
            toks = [int(t.tokens[c]) for c in t.children(v)]
            assert len(set(toks)) == len(toks)
        np.testing.assert_allclose(w, _wor_probability(t, draft, prefix), rtol=1e-13, atol=0)


def test_wor_with_a_missing_rank_sums_out_the_discarded_draw():
    p = np.array([0.5, 0.3, 0.2])
    trees = enumerate_trees(TreeShape([(1,)]), MemorylessModel(p), process="wor")
    law = {int(t.tokens[1]): w for t, w in trees}
    # the second draw without replacement: sum_a p(a) p(b) / (1 - p(a))
    expected = {b: sum(p[a] * p[b] / (1 - p[a]) for a in range(3) if a != b) for b in range(3)}
    for b in range(3):
        np.testing.assert_allclose(law[b], expected[b], rtol=1e-14)
    # i.i.d.: a missing rank changes nothing
    trees = enumerate_trees(TreeShape([(1,)]), MemorylessModel(p), process="iid")
    np.testing.assert_allclose([w for _, w in trees], p, rtol=1e-15)


@pytest.mark.parametrize("process,shape,seed", [
    ("iid", TreeShape([(0,), (1,), (0, 0)]), 11),
    ("wor", TreeShape([(0,), (1,), (0, 0)]), 12),
    ("wor", TreeShape([(2,), (0,), (2, 1)]), 13),
])
def test_sampler_follows_the_enumerated_law(process, shape, seed):
    draft = random_table_model(3, 3, concentration=0.7, rng=seed)
    trees = enumerate_trees(shape, draft, process=process, prefix=(1,))
    index = {t: i for i, (t, _) in enumerate(trees)}
    law = np.array([w for _, w in trees])
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(trees), dtype=np.int64)
    for _ in range(4000):
        counts[index[sample_tree(shape, draft, process=process, prefix=(1,), rng=rng)]] += 1
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed


def test_sampler_never_draws_zero_probability_children():
    draft = MemorylessModel([0.0, 1.0, 0.0])
    for seed in range(20):
        t = sample_tree(TreeShape([(0,), (1,), (0, 0)]), draft, process="iid", rng=seed)
        assert set(t.tokens[1:].tolist()) == {1}


def test_topk_tree_is_the_ranked_tokens_ties_by_lower_id():
    class Ties:
        vocab_size = 4

        def next_dist(self, prefix):
            return np.array([0.2, 0.3, 0.3, 0.2]) if len(prefix) % 2 == 0 else np.array([0.1, 0.1, 0.1, 0.7])

    s = TreeShape([(0,), (1,), (2,), (3,), (1, 0), (1, 2)])
    t = sample_tree(s, Ties(), process="topk")
    assert t.tokens.tolist() == [-1, 1, 2, 0, 3, 3, 1]
    assert enumerate_trees(s, Ties(), process="topk") == [(t, 1.0)]


def _eagle2_reference(draft, depth, top_k, total, prefix=()):
    """EAGLE-2's tree from its description: top-k frontier by cumulative log-probability, then the best nodes.

    Written independently of the package: candidates as dicts, explicit lexicographic keys.
    """
    cands = []

    def top(path):
        p = draft.next_dist(prefix + path)
        return sorted(range(len(p)), key=lambda x: (-p[x], x))[:top_k], p

    toks, p = top(())
    frontier = []
    for t in toks:
        cands.append(dict(path=(t,), score=math.log(p[t]), idx=len(cands)))
        frontier.append(cands[-1])
    for _ in range(depth - 1):
        level = []
        for f in frontier:
            toks, p = top(f["path"])
            for t in toks:
                level.append(dict(path=f["path"] + (t,), score=f["score"] + math.log(p[t]), idx=len(cands)))
                cands.append(level[-1])
        frontier = sorted(level, key=lambda c: (-c["score"], c["idx"]))[:top_k]
    kept = sorted(sorted(cands, key=lambda c: (-c["score"], c["idx"]))[: total - 1], key=lambda c: c["idx"])
    return [c["path"] for c in kept]


@pytest.mark.parametrize("V,depth,top_k,total,seed", [
    (3, 3, 2, 6, 0), (4, 4, 2, 9, 1), (5, 3, 3, 12, 2), (3, 1, 3, 3, 3), (6, 5, 3, 30, 4), (3, 2, 2, 6, 5),
])
def test_eagle2_tree_matches_the_reference(V, depth, top_k, total, seed):
    draft = random_markov_model(V, rng=seed)
    params = Eagle2Params(depth=depth, top_k=top_k, total_tokens=total)
    t = sample_tree(params, draft, process="eagle2", prefix=(0,))
    assert t.shape is None and t.n == total - 1 and t.max_depth <= depth
    assert t.paths()[1:] == _eagle2_reference(draft, depth, top_k, total, prefix=(0,))
    # prefix-closed with every kept parent before its children (DraftTree checks parents[i] < i)
    assert all(int(t.parents[i]) < i for i in range(1, t.n + 1))


def test_eagle2_with_ties_everywhere_stays_prefix_closed():
    draft = MemorylessModel(np.full(4, 0.25))  # every score ties with its siblings and cousins
    t = sample_tree(Eagle2Params(3, 2, 7), draft, process="eagle2")
    assert t.paths()[1:] == _eagle2_reference(draft, 3, 2, 7)
    assert t.paths()[1:] == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def test_eagle2_params():
    assert Eagle2Params.from_eagle(depth=5, top_k=10, total_tokens=60) == Eagle2Params(6, 10, 60)
    assert Eagle2Params.from_sglang(num_steps=5, topk=4, num_draft_tokens=8) == Eagle2Params(5, 4, 8)
    assert Eagle2Params(2, 2, 7).n == 6
    # positional and SGLang's keywords: SGLang's names in the messages; EAGLE's keywords: EAGLE's names
    with pytest.raises(ValueError, match=r"`num_draft_tokens` - 1 = 7 draft nodes exceeds the 6 nodes proposed"):
        Eagle2Params(2, 2, 8)
    with pytest.raises(ValueError, match=r"`total_tokens` - 1 = 7 draft nodes exceeds the 6 nodes proposed"):
        Eagle2Params(depth=2, top_k=2, total_tokens=8)
    with pytest.raises(ValueError, match="`num_draft_tokens` must be an integer >= 2"):
        Eagle2Params(2, 2, 1)
    with pytest.raises(TypeError, match="`topk` must be an integer"):
        Eagle2Params(2, 2.0, 3)
    with pytest.raises(TypeError, match="`top_k` must be an integer"):
        Eagle2Params(depth=2, top_k=2.0, total_tokens=3)
    with pytest.raises(ValueError, match="MAX_TREE_NODES"):
        Eagle2Params(10, 10**4, 10)


# ----------------------------------------------------------------------------- errors
def test_processes_needing_more_children_than_the_support():
    draft = MemorylessModel([0.5, 0.5, 0.0])
    three = TreeShape([(0,), (1,), (2,)])
    for process in ("wor", "topk"):
        with pytest.raises(ValueError, match=rf"process='{process}' needs 3 distinct children .* only 2 tokens"):
            sample_tree(three, draft, process=process, rng=0)
        with pytest.raises(ValueError, match=rf"process='{process}' needs 3 distinct"):
            enumerate_trees(three, draft, process=process)
    with pytest.raises(ValueError, match="process='topk' needs 3 distinct children"):
        sample_tree(TreeShape([(2,)]), draft, process="topk")
    with pytest.raises(ValueError, match="process='eagle2' needs 3 distinct children"):
        sample_tree(Eagle2Params(2, 3, 4), draft, process="eagle2")
    assert len(enumerate_trees(three, draft, process="iid")) == 8  # i.i.d. draws may repeat


def test_process_and_shape_validation():
    draft = MemorylessModel([0.5, 0.5])
    with pytest.raises(ValueError, match=r"`process` must be one of .* got 'wr' \(did you mean 'wor'\?\)"):
        sample_tree(SHAPE, draft, process="wr")
    with pytest.raises(TypeError, match="`process` must be one of"):
        sample_tree(SHAPE, draft, process=1)
    with pytest.raises(TypeError, match="`shape` must be an Eagle2Params for process='eagle2'"):
        sample_tree(SHAPE, draft, process="eagle2")
    with pytest.raises(TypeError, match="needs process='eagle2'"):
        sample_tree(Eagle2Params(2, 2, 3), draft, process="topk")
    with pytest.raises(TypeError, match="`draft` must be a model"):
        sample_tree(SHAPE, [0.5, 0.5], process="iid")
    with pytest.raises(ValueError, match="`prefix`"):
        sample_tree(SHAPE, draft, process="iid", prefix=(5,))
    with pytest.raises(ValueError, match=r"above the stated limit `max_trees`=10"):
        enumerate_trees(SHAPE, draft, process="iid", max_trees=10)
    with pytest.raises(TypeError, match="`max_trees` must be an integer"):
        enumerate_trees(SHAPE, draft, process="iid", max_trees=1.5)


def test_tree_laws_are_the_models_conditionals():
    draft, target = random_table_model(3, 4, rng=1), random_table_model(3, 4, rng=2)
    t = sample_tree(SHAPE, draft, process="iid", prefix=(0,), rng=3)
    P, Q = tree_laws(t, draft, target, prefix=(0,))
    assert P.shape == Q.shape == (6, 3)
    for i, path in enumerate(t.paths()):
        np.testing.assert_array_equal(P[i], draft.next_dist((0,) + path))
        np.testing.assert_array_equal(Q[i], target.next_dist((0,) + path))
        if path:
            np.testing.assert_allclose(sequence_probability(target, (0,) + path),
                                       sequence_probability(target, (0,)) * math.prod(
                                           Q[int(t.parents[j])][t.tokens[j]] for j in _ancestors(t, i)),
                                       rtol=1e-13)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tree_laws(DraftTree.from_paths([(3,)]), draft, target)
    with pytest.raises(TypeError, match="`tree` must be a DraftTree"):
        tree_laws(SHAPE, draft, target)
    with pytest.raises(ValueError, match="must share one vocabulary"):
        tree_laws(t, draft, MemorylessModel([0.5, 0.5]))


def _ancestors(t, i):
    out = []
    while i > 0:
        out.append(i)
        i = int(t.parents[i])
    return out


def test_inputs_are_not_mutated():
    paths = [[0], [1], [0, 0]]
    TreeShape(paths)
    assert paths == [[0], [1], [0, 0]]
    parents, tokens = np.array([-1, 0, 0]), np.array([-1, 1, 1])
    t = DraftTree(None, parents, tokens)
    parents[1] = 5
    assert t.parents.tolist() == [-1, 0, 0]
    assert list(itertools.islice(iter(t.paths()), 2)) == [(), (1,)]


def test_entry_points_take_a_shape_as_a_list_of_rank_paths():
    # the entry points' documented form: a shape is a list of rank-path tuples (Medusa's medusa_choices)
    from otspec.models import random_markov_model
    from otspec.tree import TreeShape, check_lossless, enumerate_trees, optimum, sample_tree, value

    d, t = random_markov_model(3, rng=1), random_markov_model(3, rng=2)
    paths = [(0,), (1,), (0, 0)]
    shape = TreeShape.from_paths(paths)
    for process, verifier in (("iid", "specinfer"), ("wor", "sequoia"), ("topk", "target-only")):
        assert value(paths, d, t, process=process, verifier=verifier) == value(shape, d, t, process=process,
                                                                             verifier=verifier)
        assert check_lossless(verifier, paths, d, t, process=process).passed
    assert optimum(paths, d, t, process="iid").value == optimum(shape, d, t, process="iid").value
    assert len(enumerate_trees(paths, d, process="iid")) == len(enumerate_trees(shape, d, process="iid"))
    assert (sample_tree(paths, d, process="wor", rng=3).tokens == sample_tree(shape, d, process="wor", rng=3).tokens).all()
    with pytest.raises(ValueError, match=r"^`shape` must be prefix-closed: the parent path \(0,\) of \(0, 0\)"):
        value([(0, 0)], d, t, process="iid", verifier="specinfer")


@pytest.mark.parametrize("seed", range(6))
def test_the_first_k_ranks_equal_the_full_stable_sort(seed):
    # the partition route must give the same ids as the full stable sort, ties to the lower id included
    from otspec.tree._process import _ranked

    rng = np.random.default_rng(seed)
    V = 200
    p = rng.choice([0.0, 0.001, 0.002, 0.005, 0.01], size=V)  # heavy ties, zeros
    p[rng.integers(V, size=3)] = 0.05
    full = np.argsort(-p, kind="stable")
    for k in (1, 2, 3, 8, 17, 60, V - 1, V, V + 5):
        np.testing.assert_array_equal(_ranked(p, k), full[:k])
    np.testing.assert_array_equal(_ranked(p), full)
