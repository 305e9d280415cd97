"""Tree verifiers: losslessness by exact enumeration, exact expected accepted tokens by independent routes.

Independent routes:

* losslessness: every realised tree enumerated, the emitted path and token completed by the target to
  ``max_depth + 1`` tokens, against the target's joint law built from its conditionals (``check_lossless``);
* ``expected_accepted`` (a product of per-node acceptances along paths) against the depth-weighted mass of
  ``emission`` (the law of the accepted node), and against the package's other routes where the tree is a
  special case: one chain = per-token speculative sampling along a block (``otspec.block.expected_length``);
  ``k`` chains of length 1 = recursive rejection (``otspec.multiround``); SpecTr's prefix trees = SpecTr's
  block efficiency (``otspec.spectr.block_efficiency``); deterministic trees = the sum of the target's path
  probabilities (``otspec.models.sequence_probability``);
* ``sample`` against ``emission`` by chi-square.

Tolerance of the exact checks: 1e-12 (enumerations land near 1e-16).
Chi-square tests in this file: 5, each with false-failure rate 1e-6 (fixed seeds): a spurious failure has
probability below 5e-6 (union bound).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec import block, spectr
from otspec._registry import get_verifier, verifier_names
from otspec.models import MemorylessModel, random_markov_model, random_table_model, sequence_probability
from otspec.testing import chi2_gof
from otspec.tree import (
    DraftTree,
    Eagle2Params,
    SequoiaVerifier,
    SpecInferVerifier,
    SpecTrTreeVerifier,
    TargetOnlyVerifier,
    TreeShape,
    check_lossless,
    enumerate_trees,
    make_tree_verifier,
    output_law,
    sample_tree,
    tree_laws,
    value,
)
from tests.test_tree import _ancestors

TOL = 1e-12
ALPHA_FAIL = 1e-6
VERIFIERS = {
    "specinfer": SpecInferVerifier(),
    "sequoia": SequoiaVerifier(),
    "target-only": TargetOnlyVerifier(),
    "spectr-tree": SpecTrTreeVerifier(token_verifier="optimal"),
}


@st.composite
def gap_free_shapes(draw, max_nodes=5, max_depth=3, max_children=3):
    """Prefix-closed shapes whose siblings have ranks 0..m-1."""
    paths = [()]
    kids: dict = {(): 0}
    for _ in range(draw(st.integers(1, max_nodes))):
        open_ = [p for p in paths if len(p) < max_depth and kids[p] < max_children]
        parent = draw(st.sampled_from(open_))
        child = parent + (kids[parent],)
        kids[parent] += 1
        kids[child] = 0
        paths.append(child)
    return TreeShape(paths[1:])


@st.composite
def model_pairs(draw):
    V = draw(st.sampled_from([2, 3]))
    seed = draw(st.integers(0, 2**20))
    kind = draw(st.sampled_from(["markov", "table"]))
    c = draw(st.sampled_from([0.3, 1.0, 3.0]))
    if kind == "markov":
        return random_markov_model(V, concentration=c, rng=seed), random_markov_model(V, concentration=c, rng=seed + 1)
    return (random_table_model(V, 5, concentration=c, rng=seed),
            random_table_model(V, 5, concentration=c, rng=seed + 1))


def _max_children(shape):
    return max(len(shape.children(i)) for i in range(shape.n + 1))


# ----------------------------------------------------------------------------- lossless by enumeration
def _check_all_lossless(shape, models, process):
    draft, target = models
    V = draft.vocab_size
    if process != "iid" and _max_children(shape) > V:
        return  # a process needing more distinct children than the vocabulary is refused (tested below)
    for name, v in VERIFIERS.items():
        if not v.lossless_for(process, shape):
            continue
        res = check_lossless(v, shape, draft, target, process=process, prefix=(V - 1,), tol=TOL)
        assert res.passed, (name, process, res.max_error)
        assert res.acceptance_error <= TOL
        assert res.claimed_lossless and res.method == "enumeration"
        assert 0.0 <= res.acceptance <= shape.n + TOL


@settings(max_examples=12, deadline=None)
@given(gap_free_shapes(), model_pairs(), st.sampled_from(["iid", "wor", "topk"]))
def test_every_verifier_is_lossless_on_its_processes(shape, models, process):
    _check_all_lossless(shape, models, process)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(gap_free_shapes(), model_pairs(), st.sampled_from(["iid", "wor", "topk"]))
def test_every_verifier_is_lossless_on_its_processes_thorough(shape, models, process):
    _check_all_lossless(shape, models, process)


def test_emission_is_a_law_and_its_depth_mass_is_expected_accepted():
    draft, target = random_table_model(3, 4, concentration=0.5, rng=4), random_table_model(3, 4, rng=5)
    shape = TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (2, 0), (0, 0, 0)])
    for process in ("iid", "wor", "topk"):
        for _ in range(3):
            t = sample_tree(shape, draft, process=process, rng=7)
            P, Q = tree_laws(t, draft, target)
            for v in VERIFIERS.values():
                E = v.emission(t, P, Q)
                assert E.shape == (shape.n + 1, 3) and E.min() >= 0
                np.testing.assert_allclose(E.sum(), 1.0, rtol=0, atol=1e-14)
                np.testing.assert_allclose(float(t.depth @ E.sum(axis=1)), v.expected_accepted(t, P, Q),
                                           rtol=0, atol=TOL)


# ----------------------------------------------------------------------------- special cases
@pytest.mark.parametrize("L", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_chain_is_token_verification_along_a_block(L, seed):
    draft, target = random_table_model(3, L + 1, concentration=0.6, rng=seed), random_table_model(3, L + 1, rng=seed + 9)
    expected = block.expected_length(draft, target, L, "token")
    chain = TreeShape.chains(1, L)
    for name in ("specinfer", "sequoia", "spectr-tree"):
        process = "wor" if name == "sequoia" else "iid"
        np.testing.assert_allclose(value(chain, draft, target, process=process, verifier=VERIFIERS[name]),
                                   expected, rtol=0, atol=TOL)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", [2, 3])
def test_chains_of_length_one_are_recursive_rejection(k, seed):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(4)), rng.dirichlet(np.ones(4) * 0.5)
    draft, target = MemorylessModel(p), MemorylessModel(q)
    shape = TreeShape.chains(k, 1)
    np.testing.assert_allclose(value(shape, draft, target, process="iid", verifier="specinfer"),
                               otspec.multiround(p, q, k, replacement=True).acceptance(), rtol=0, atol=TOL)
    np.testing.assert_allclose(value(shape, draft, target, process="wor", verifier="sequoia"),
                               otspec.multiround(p, q, k, replacement=False).acceptance(), rtol=0, atol=TOL)
    np.testing.assert_allclose(value(shape, draft, target, process="iid", verifier=VERIFIERS["spectr-tree"]),
                               otspec.optimal_verifier(p, q, k).acceptance(), rtol=0, atol=TOL)


@pytest.mark.parametrize("branching,token_verifier", [((2, 2), "optimal"), ((3, 1), "kseq"), ((2, 1, 2), "multiround"),
                                                      ((2, 2), "lp")])
def test_spectr_tree_is_spectr_on_its_prefix_trees(branching, token_verifier):
    draft, target = random_markov_model(2, rng=21), random_markov_model(2, rng=22)
    K, L = math.prod(branching), len(branching)
    expected = spectr.block_efficiency(draft, target, K, L, verifier=token_verifier, branching=branching, prefix=(1,))
    got = value(TreeShape.branching(*branching), draft, target, process="iid",
                verifier=SpecTrTreeVerifier(token_verifier=token_verifier), prefix=(1,))
    np.testing.assert_allclose(got + 1.0, expected, rtol=0, atol=1e-10)  # block efficiency counts the extra token


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_deterministic_trees_give_the_target_path_probabilities(seed):
    draft, target = random_markov_model(4, rng=seed), random_markov_model(4, rng=seed + 50)
    prefix = (1, 2)
    cases = [(TreeShape([(0,), (1,), (3,), (0, 0), (0, 2), (0, 0, 1)]), "topk"),
             (Eagle2Params(depth=3, top_k=2, total_tokens=7), "eagle2")]
    for shape, process in cases:
        (t, w), = enumerate_trees(shape, draft, process=process, prefix=prefix)
        assert w == 1.0
        base = sequence_probability(target, prefix)
        expected = math.fsum(sequence_probability(target, prefix + path) / base for path in t.paths()[1:])
        got = value(shape, draft, target, process=process, verifier="target-only", prefix=prefix)
        np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)
        assert check_lossless("target-only", shape, draft, target, process=process, prefix=prefix, tol=TOL).passed


def test_target_only_counts_equal_siblings_once():
    t = DraftTree(TreeShape([(0,), (1,)]), [-1, 0, 0], [-1, 1, 1])
    P = np.full((3, 2), 0.5)
    Q = np.array([[0.3, 0.7], [0.5, 0.5], [0.5, 0.5]])
    v = TargetOnlyVerifier()
    assert v.expected_accepted(t, P, Q) == 0.7
    np.testing.assert_allclose(v.emission(t, P, Q), [[0.3, 0.0], [0.35, 0.35], [0.0, 0.0]], rtol=0, atol=1e-16)


def test_target_only_needs_no_pass_over_the_vocabulary():
    # a deterministic tree at V = 50,000: E[tau] from n gathers, exact
    V = 50_000
    rng = np.random.default_rng(0)
    shape = TreeShape.branching(4, 2)
    P = rng.dirichlet(np.ones(V), size=shape.n + 1)
    Q = rng.dirichlet(np.ones(V), size=shape.n + 1)
    t = DraftTree(shape, shape.parents, np.concatenate(([-1], rng.choice(V, size=shape.n, replace=False))))
    expected = sum(math.prod(Q[int(t.parents[j]), t.tokens[j]] for j in _ancestors(t, i)) for i in range(1, shape.n + 1))
    np.testing.assert_allclose(TargetOnlyVerifier().expected_accepted(t, P, Q), expected, rtol=1e-14)
    for v in (SpecInferVerifier(), SequoiaVerifier()):
        E = v.emission(t, P, Q, validate=False)
        np.testing.assert_allclose(E.sum(), 1.0, rtol=0, atol=1e-12)
        np.testing.assert_allclose(float(t.depth @ E.sum(axis=1)), v.expected_accepted(t, P, Q), rtol=1e-12)


def test_hand_computed_specinfer_tree():
    # root children (0, 1), node (0,) has child (0, 0); p = (1/2, 1/2) and q = (1/4, 3/4) at every node
    t = DraftTree.from_paths([(0,), (1,), (0, 0)])
    P = np.full((4, 2), 0.5)
    Q = np.tile([0.25, 0.75], (4, 1))
    # child 0 accepted w.p. 1/2; else q_2 = (0, 1): child 1 accepted w.p. 1; below (0,): child 0 w.p. 1/2
    v = SpecInferVerifier()
    np.testing.assert_allclose(v.expected_accepted(t, P, Q), 0.5 * 1.5 + 0.5 * 1.0, rtol=0, atol=1e-16)
    np.testing.assert_allclose(v.emission(t, P, Q), [[0, 0], [0, 0.25], [0.125, 0.375], [0.0625, 0.1875]],
                               rtol=0, atol=1e-16)


# ----------------------------------------------------------------------------- samplers
@pytest.mark.parametrize("name,process,seed", [("specinfer", "iid", 0), ("sequoia", "wor", 1),
                                               ("target-only", "topk", 2), ("spectr-tree", "iid", 3),
                                               ("sequoia", "iid", 4)])
def test_sampler_follows_the_emission(name, process, seed):
    draft, target = random_table_model(3, 4, concentration=0.7, rng=seed), random_table_model(3, 4, rng=seed + 30)
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    t = sample_tree(shape, draft, process=process, rng=seed)
    P, Q = tree_laws(t, draft, target)
    v = VERIFIERS[name]
    law = v.emission(t, P, Q).ravel()
    rng = np.random.default_rng(seed)
    counts = np.zeros(law.shape[0], dtype=np.int64)
    V = P.shape[1]
    for _ in range(4000):
        a, y = v.sample(t, P, Q, rng=rng, validate=False)
        counts[a * V + y] += 1
    assert chi2_gof(counts, law, alpha_fail=ALPHA_FAIL).passed


def test_samplers_never_accept_a_child_of_target_probability_zero():
    t = DraftTree.from_paths([(0,), (1,)])
    P = np.tile([0.5, 0.5, 0.0], (3, 1))
    Q = np.tile([0.0, 0.5, 0.5], (3, 1))
    for v in VERIFIERS.values():
        for seed in range(30):
            a, y = v.sample(t, P, Q, rng=seed)
            assert a != 1 and Q[a, y] > 0


# ----------------------------------------------------------------------------- rules on the wrong process
def test_smallest_specinfer_loss_on_topk_trees():
    # V = 2, one node: the top-1 token is deterministic, so SpecInfer's min(1, q/p) emits it with probability
    # min(1, q(0)/p(0)) = 1/2 instead of q(0) = 1/4
    draft, target = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    shape = TreeShape([(0,)])
    R = output_law(shape, draft, target, process="topk", verifier="specinfer")
    np.testing.assert_allclose(R.sum(axis=1), [0.5, 0.5], rtol=0, atol=1e-16)
    res = check_lossless("specinfer", shape, draft, target, process="topk")
    assert not res.passed and res.max_error >= 0.125 and not res.claimed_lossless
    assert check_lossless("target-only", shape, draft, target, process="topk", tol=TOL).passed


def test_wor_trees_need_three_tokens_to_separate_specinfer_from_sequoia():
    # on V = 2 a node's second child without replacement is the other token, which both rules accept
    # with probability 1 after a rejection: the two rules coincide on every V = 2 tree
    grid = [0.1, 0.3, 0.5, 0.8]
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    for a in grid:
        for b in grid:
            d, t = MemorylessModel([a, 1 - a]), MemorylessModel([b, 1 - b])
            assert check_lossless("specinfer", shape, d, t, process="wor", tol=TOL).passed


def test_smallest_specinfer_loss_on_wor_trees():
    # V = 3, two root children drawn without replacement, p = (1/5, 1/5, 3/5), q = (0, 3/10, 7/10).
    # First child 0 (prob 1/5) is rejected (q(0) = 0), q_2 = (0, 1/2, 1/2); the second child is 2 w.p. 3/4.
    # SpecInfer accepts it w.p. min(1, (1/2)/(3/5)) = 5/6, Sequoia w.p. min(1, (1/2)/(3/4)) = 2/3; a first
    # child 2 (prob 3/5) is accepted surely. So P(Y = 2) = 1/5 * 3/4 * 5/6 + 3/5 = 29/40 under SpecInfer's
    # rule and 1/5 * 3/4 * 2/3 + 3/5 = 7/10 = q(2) under Sequoia's.
    p, q = [0.2, 0.2, 0.6], [0.0, 0.3, 0.7]
    draft, target = MemorylessModel(p), MemorylessModel(q)
    shape = TreeShape([(0,), (1,)])
    spec = output_law(shape, draft, target, process="wor", verifier="specinfer").sum(axis=1)
    seq = output_law(shape, draft, target, process="wor", verifier="sequoia").sum(axis=1)
    np.testing.assert_allclose(spec[2], float(Fraction(29, 40)), rtol=0, atol=1e-15)
    np.testing.assert_allclose(seq, q, rtol=0, atol=1e-15)
    assert not check_lossless("specinfer", shape, draft, target, process="wor").passed
    # and Sequoia's rule on i.i.d. children loses too
    assert not check_lossless("sequoia", shape, draft, target, process="iid").passed


def test_sequoia_on_a_shape_with_a_missing_rank_is_lossy():
    draft, target = MemorylessModel([0.2, 0.2, 0.6]), MemorylessModel([0.0, 0.3, 0.7])
    shape = TreeShape([(1,)])  # the first draw is made and discarded: the child's law is not p
    assert not SequoiaVerifier().lossless_for("wor", shape)
    assert not check_lossless("sequoia", shape, draft, target, process="wor").passed
    with pytest.raises(ValueError, match="skips a rank"):
        value(shape, draft, target, process="wor", verifier="sequoia")
    assert check_lossless("target-only", shape, draft, target, process="wor", tol=TOL).passed


# ----------------------------------------------------------------------------- value, registry, errors
def test_value_refuses_a_verifier_on_a_process_it_is_not_lossless_for():
    draft, target = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    shape = TreeShape([(0,)])
    with pytest.raises(ValueError, match=r"'specinfer' is lossless only for the draft processes \('iid',\); "
                                         r"got process='topk' \(pass allow_lossy=True"):
        value(shape, draft, target, process="topk", verifier="specinfer")
    assert value(shape, draft, target, process="topk", verifier="specinfer", allow_lossy=True) == 0.5
    with pytest.raises(TypeError, match="`allow_lossy` must be a bool"):
        value(shape, draft, target, process="iid", verifier="specinfer", allow_lossy=1)
    with pytest.raises(ValueError, match="`verifier` must be one of"):
        value(shape, draft, target, process="iid", verifier="spec-infer")
    with pytest.raises(TypeError, match="`verifier` must be a tree verifier name"):
        value(shape, draft, target, process="iid", verifier=otspec.maximal_coupling)


def test_value_is_the_enumerated_average():
    draft, target = random_markov_model(3, rng=8), random_markov_model(3, rng=9)
    shape = TreeShape([(0,), (1,), (0, 0)])
    for process, name in (("iid", "specinfer"), ("wor", "sequoia"), ("iid", "target-only")):
        trees = enumerate_trees(shape, draft, process=process)
        avg = math.fsum(w * VERIFIERS[name].expected_accepted(t, *tree_laws(t, draft, target)) for t, w in trees)
        np.testing.assert_allclose(value(shape, draft, target, process=process, verifier=name), avg, rtol=0, atol=TOL)


def test_registry_holds_the_tree_verifiers():
    assert set(verifier_names(kind="tree")) == {"specinfer", "sequoia", "target-only", "spectr-tree", "traversal", "gbv",
                                                "hsd", "spechub"}
    for name in verifier_names(kind="tree"):
        spec = get_verifier(name, kind="tree")
        v = spec.build_tree()
        assert v.name == name and spec.processes == v.processes and spec.draft_process == "tree"
    assert "kseq" in verifier_names(kind="token") and "specinfer" not in verifier_names(kind="token")
    assert "block" in verifier_names(kind="block")
    with pytest.raises(ValueError, match="is registered but is a tree-level verifier"):
        get_verifier("specinfer", kind="token")
    v = make_tree_verifier("spectr-tree", token_verifier="kseq")
    assert v.factory.name == "kseq"
    with pytest.raises(ValueError, match=r"takes the options \[\], got \[.token_verifier.\]"):
        make_tree_verifier("specinfer", token_verifier="kseq")
    with pytest.raises(ValueError, match="apply to a verifier name"):
        make_tree_verifier(SpecInferVerifier(), token_verifier="kseq")
    with pytest.raises(ValueError, match="needs `build_tree`"):
        otspec.register_verifier(otspec.VerifierSpec("x-tree", "tree", None))


@pytest.mark.parametrize("bad,exc,match", [
    (dict(P=np.full((2, 2), 0.5)), ValueError, r"`p_nodes` must have shape \(n \+ 1, V\) = \(3, V\)"),
    (dict(P=np.array([[0.5, 0.5], [1.5, -0.5], [0.5, 0.5]])), ValueError, "`p_nodes` must be finite and non-negative"),
    (dict(Q=np.array([[0.5, 0.5], [0.5, 0.6], [0.5, 0.5]])), ValueError, r"`q_nodes\[1\]` must sum to 1"),
    (dict(Q=np.array([[0.5, 0.5], [np.nan, 0.5], [0.5, 0.5]])), ValueError, "`q_nodes` must be finite"),
    (dict(P=np.full((3, 3), 1 / 3)), ValueError, "`p_nodes` and `q_nodes` must have the same shape"),
    (dict(tree=DraftTree.from_paths([(0,), (2,)])), ValueError, "outside the vocabulary"),
    (dict(tree=TreeShape([(0,), (1,)])), TypeError, "`tree` must be a DraftTree"),
    (dict(P="abc"), TypeError, "`p_nodes` must be an"),
])
def test_verifiers_validate_their_inputs(bad, exc, match):
    args = dict(tree=DraftTree.from_paths([(0,), (1,)]), P=np.full((3, 2), 0.5), Q=np.full((3, 2), 0.5))
    args.update(bad)
    for v in VERIFIERS.values():
        for method in (v.emission, v.expected_accepted, v.sample):
            with pytest.raises(exc, match=match):
                method(args["tree"], args["P"], args["Q"])


def test_check_lossless_refuses_large_tables():
    draft, target = random_markov_model(3, rng=0), random_markov_model(3, rng=1)
    with pytest.raises(ValueError, match="`max_sequences`=5"):
        check_lossless("specinfer", TreeShape([(0,)]), draft, target, process="iid", max_sequences=5)
    with pytest.raises(ValueError, match="`max_trees`=5"):
        check_lossless("specinfer", TreeShape([(0,), (1,)]), draft, target, process="iid", max_trees=5)


@pytest.mark.parametrize("eps", [1e-13, 2e-13, 1e-300])
def test_wor_with_a_nearly_exhausted_support_stays_exact(eps):
    # after the first draw almost no mass is left: 1 - p(first) has no relative precision, the sum of what is
    # left has; the second child is then the other token with probability 1 (the tree weights) and is accepted
    # surely by Sequoia's rule (its renormalised draft probability is exactly 1)
    draft, target = MemorylessModel([1.0 - eps, eps]), MemorylessModel([0.25, 0.75])
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1)])
    trees = enumerate_trees(shape, draft, process="wor")
    np.testing.assert_allclose(math.fsum(w for _, w in trees), 1.0, rtol=0, atol=1e-15)
    res = check_lossless("sequoia", shape, draft, target, process="wor", tol=TOL)
    assert res.passed and res.acceptance_error <= TOL
    np.testing.assert_allclose(value(TreeShape([(0,), (1,)]), draft, target, process="wor", verifier="sequoia"),
                               1.0, rtol=0, atol=TOL)


def test_iid_rules_do_not_care_about_missing_ranks():
    # i.i.d. draws at ranks 1 and 3 are two independent draws, whatever was drawn at ranks 0 and 2
    draft, target = random_markov_model(3, rng=31), random_markov_model(3, rng=32)
    gaps, compact = TreeShape([(1,), (3,), (1, 2)]), TreeShape([(0,), (1,), (0, 0)])
    for name in ("specinfer", "spectr-tree", "target-only"):
        assert VERIFIERS[name].lossless_for("iid", gaps)
        assert check_lossless(VERIFIERS[name], gaps, draft, target, process="iid", tol=TOL).passed
        np.testing.assert_allclose(value(gaps, draft, target, process="iid", verifier=VERIFIERS[name]),
                                   value(compact, draft, target, process="iid", verifier=VERIFIERS[name]),
                                   rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["specinfer", "sequoia"])
@pytest.mark.parametrize("seed", range(4))
def test_reach_equals_the_emission_mass_through_each_node(name, seed):
    # the per-node rules' one-pass reach probabilities against the exact emission law (independent route)
    from otspec.models import random_markov_model
    from otspec.profile._trees import reach_of
    from otspec.tree import TreeShape, make_tree_verifier, sample_tree, tree_laws

    d, t = random_markov_model(4, rng=100 + seed), random_markov_model(4, rng=200 + seed)
    shape = TreeShape.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    v = make_tree_verifier(name)
    tree = sample_tree(shape, d, process="iid" if name == "specinfer" else "wor", rng=seed)
    P, Q = tree_laws(tree, d, t)
    reach = v.reach(tree, P, Q)
    np.testing.assert_allclose(reach, reach_of(tree, v.emission(tree, P, Q)), rtol=1e-12, atol=1e-15)
    assert reach[0] == 1.0 and v.expected_accepted(tree, P, Q) == float(reach[1:].sum())
