"""Optima of draft-tree processes (coupling and one-token LPs) and the verifier attaining the one-token optimum.

Independent routes: the multi-draft block LPs and one-step block verification of otspec.block (chains), the
closed forms alpha_k / alpha_k without replacement (depth 1), the target path probabilities (deterministic
trees), a second formulation of the one-token LP solved by scipy's linprog (acceptance variables and the
inequalities a(uz) <= Q(z|u) a(u)), an unmerged tree-level coupling LP, and the verifier's output law completed
by the target, enumerated over every realised tree.

Tolerances: values from two different LPs agree to LP_TOL = 1e-8 (HiGHS feasibility tolerance 1e-10 on at most a
few hundred rows, rewards at most D <= 3); laws built from a repaired plan are exact to float rounding (1e-12).
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from scipy.optimize import linprog

from otspec import alpha_k
from otspec.block import expected_length, multidraft_ot, one_token_optimum, theorem1_length
from otspec.models import MarkovModel, MemorylessModel, random_markov_model, sequence_probability
from otspec.otm import alpha_k_without_replacement
from otspec.testing import chi2_gof
from otspec.tree._optimum import MAX_TREE_LP_VARIABLES, OptimalTreeVerifier, optimum
from otspec.tree._process import enumerate_trees, sample_tree, tree_laws
from otspec.tree._tree import DraftTree, Eagle2Params, TreeShape
from otspec.tree._value import check_lossless, value
from otspec.tree._verifiers import make_tree_verifier

LP_TOL = 1e-8
EXACT = 1e-12
ALPHA_FAIL = 1e-4
# scipy's HiGHS defaults (1e-7) are looser than the package's (1e-10): the references solve to the same tolerance
SCIPY_TOL = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def markov_pair(seed, V=3, concentration=1.0):
    rng = np.random.default_rng(seed)
    return (random_markov_model(V, concentration=concentration, rng=rng),
            random_markov_model(V, concentration=concentration, rng=rng))


# ---------------------------------------------------------------------------
# independent references
# ---------------------------------------------------------------------------


def target_cond(target, prefix, D):
    """{u: q(. | prefix + u)} for every token path u of length <= D."""
    V = target.vocab_size
    return {u: np.asarray(target.next_dist(tuple(prefix) + u), dtype=float)
            for t in range(D + 1) for u in itertools.product(range(V), repeat=t)}


def e_form_one_token(shape, draft, target, process, prefix=()):
    """OPT_1 as the LP over acceptance laws e(K, u): sum_u e(K, u) = P(K), abar(uz) <= Q(z|u) abar(u) (scipy)."""
    V, D = target.vocab_size, shape.max_depth
    trees = enumerate_trees(shape, draft, process=process, prefix=prefix)
    classes = {}
    for t, w in trees:
        classes.setdefault(frozenset(t.paths()[1:]), []).append(w)
    keys = list(classes)
    cols = [(k, u) for k, key in enumerate(keys) for u in [()] + sorted(key)]
    col = {c: i for i, c in enumerate(cols)}
    A_eq = np.zeros((len(keys), len(cols)))
    for (k, _u), i in col.items():
        A_eq[k, i] = 1.0
    b_eq = np.array([math.fsum(classes[key]) for key in keys])
    qc = target_cond(target, prefix, D)
    rows = []
    for t in range(D):
        for u in itertools.product(range(V), repeat=t):
            for z in range(V):
                row = np.zeros(len(cols))
                for (_k, v), i in col.items():
                    if v[:t + 1] == u + (z,):
                        row[i] += 1.0
                    if v[:t] == u:
                        row[i] -= qc[u][z]
                rows.append(row)
    cost = -np.array([len(u) for (_, u) in cols], dtype=float)
    res = linprog(cost, A_ub=np.array(rows), b_ub=np.zeros(len(rows)), A_eq=A_eq, b_eq=b_eq, method="highs", options=SCIPY_TOL)
    assert res.status == 0
    return -res.fun


def tree_level_coupling(shape, draft, target, process, prefix=()):
    """OPT_c without merging: one row per realised tree (scipy)."""
    V, D = target.vocab_size, shape.max_depth
    trees = enumerate_trees(shape, draft, process=process, prefix=prefix)
    ys = list(itertools.product(range(V), repeat=D))
    qy = np.array([sequence_probability(target, tuple(prefix) + y) / sequence_probability(target, tuple(prefix))
                   for y in ys])
    reward = np.array([[max(len(p) for p in set(t.paths()) if y[:len(p)] == p) for y in ys] for t, _ in trees])
    nt, ny = reward.shape
    A_eq = np.zeros((nt + ny, nt * ny))
    for i in range(nt):
        A_eq[i, i * ny:(i + 1) * ny] = 1.0
    for j in range(ny):
        A_eq[nt + j, j::ny] = 1.0
    b_eq = np.concatenate([[w for _, w in trees], qy])
    b_eq[nt:] *= b_eq[:nt].sum() / b_eq[nt:].sum()
    res = linprog(-reward.ravel().astype(float), A_eq=A_eq, b_eq=b_eq, method="highs", options=SCIPY_TOL)
    assert res.status == 0
    return -res.fun


def completed_law_and_tau(verifier, shape, draft, target, process, prefix=()):
    """Enumerate every realised tree: the law of the emitted string completed by the target to D + 1 tokens,
    and E[tau]."""
    V, D = target.vocab_size, shape.max_depth
    qc = target_cond(target, prefix, D)
    law = np.zeros((V,) * (D + 1))
    tau = []
    for tree, w in enumerate_trees(shape, draft, process=process, prefix=prefix):
        P, Q = tree_laws(tree, draft, target, prefix=prefix)
        em = verifier.emission(tree, P, Q)
        np.testing.assert_allclose(em.sum(), 1.0, rtol=0, atol=EXACT)
        assert em.min() >= 0
        tau.append((w, verifier.expected_accepted(tree, P, Q)))
        np.testing.assert_allclose(tau[-1][1], sum(tree.depth[a] * em[a].sum() for a in range(tree.n + 1)),
                                   rtol=0, atol=EXACT)
        for a in range(tree.n + 1):
            for y in range(V):
                if em[a, y] == 0:
                    continue
                s = tree.path(a) + (y,)
                for rest in itertools.product(range(V), repeat=D + 1 - len(s)):
                    full = s + rest
                    pr = math.prod(qc[full[:j]][full[j]] for j in range(len(s), D + 1))
                    law[full] += w * em[a, y] * pr
    ref = np.zeros((V,) * (D + 1))
    for z in itertools.product(range(V), repeat=D + 1):
        ref[z] = math.prod(qc[z[:j]][z[j]] for j in range(D + 1))
    return law, ref, math.fsum(w * t for w, t in tau)


# ---------------------------------------------------------------------------
# chains: the multi-draft block optima
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed,V,k,L", [(0, 2, 2, 2), (1, 2, 3, 2), (2, 3, 2, 2), (3, 2, 2, 3)])
def test_iid_chains_are_the_multidraft_block_optima(seed, V, k, L):
    draft, target = markov_pair(seed, V)
    shape = TreeShape.chains(k, L)
    oc = optimum(shape, draft, target, process="iid", one_token=False)
    o1 = optimum(shape, draft, target, process="iid")
    assert oc.success and o1.success and oc.status == "optimal"
    np.testing.assert_allclose(oc.value, multidraft_ot(draft, target, L, k).value, rtol=0, atol=LP_TOL)
    np.testing.assert_allclose(o1.value, one_token_optimum(draft, target, L, k).value, rtol=0, atol=LP_TOL)
    assert o1.value <= oc.value + LP_TOL
    np.testing.assert_allclose(oc.plan_value, oc.value, rtol=0, atol=LP_TOL)
    # the coupling plan has the exact marginals
    np.testing.assert_allclose(oc.plan.mass.sum(axis=1), oc.plan.weights, rtol=0, atol=EXACT)
    qd = np.array([sequence_probability(target, y) for y in oc.plan.columns])
    np.testing.assert_allclose(oc.plan.mass.sum(axis=0), qd, rtol=0, atol=EXACT)


def test_multidraft_counterexample_value():
    # the smallest case where the multi-draft block optimum is below the level-wise bound: 231/128
    shape = TreeShape.chains(2, 2)
    res = optimum(shape, MemorylessModel([0.75, 0.25]), MemorylessModel([0.5, 0.5]), process="iid", one_token=False)
    np.testing.assert_allclose(128 * res.value, 231.0, rtol=0, atol=1e-7)
    assert res.n_trees == 16 and res.n_keys == 10


@pytest.mark.parametrize("seed,V,L", [(4, 3, 2), (5, 2, 3), (6, 3, 3)])
def test_one_chain_is_block_verification(seed, V, L):
    draft, target = markov_pair(seed, V)
    shape = TreeShape.chains(1, L)
    o1 = optimum(shape, draft, target, process="iid")
    oc = optimum(shape, draft, target, process="iid", one_token=False)
    np.testing.assert_allclose(o1.value, expected_length(draft, target, L, "block-onestep"), rtol=0, atol=LP_TOL)
    np.testing.assert_allclose(oc.value, theorem1_length(draft, target, L), rtol=0, atol=LP_TOL)
    # wor and iid coincide on a chain
    np.testing.assert_allclose(optimum(shape, draft, target, process="wor").value, o1.value, rtol=0, atol=LP_TOL)


# ---------------------------------------------------------------------------
# depth 1: the draft process's alpha
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_depth_one_is_alpha(seed, k):
    V = 4
    draft, target = markov_pair(seed + 10, V, concentration=0.6)
    prefix = (seed % V, 1)
    p, q = draft.next_dist(prefix), target.next_dist(prefix)
    shape = TreeShape([(r,) for r in range(k)])
    for process, ref in (("iid", alpha_k(p, q, k)), ("wor", alpha_k_without_replacement(p, q, k))):
        o1 = optimum(shape, draft, target, process=process, prefix=prefix)
        oc = optimum(shape, draft, target, process=process, prefix=prefix, one_token=False)
        np.testing.assert_allclose(o1.value, ref, rtol=0, atol=LP_TOL)
        np.testing.assert_allclose(oc.value, ref, rtol=0, atol=LP_TOL)


# ---------------------------------------------------------------------------
# deterministic trees: the target's path probabilities
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("paths", [[(0,), (1,), (0, 0)], [(0,), (2,), (2, 1), (2, 1, 0)], [(1,), (1, 0), (1, 2)]])
def test_topk_optima_are_the_target_path_probabilities(paths):
    draft, target = markov_pair(21, 3)
    prefix = (2,)
    shape = TreeShape(paths)
    tree = sample_tree(shape, draft, process="topk", prefix=prefix)
    ref = math.fsum(sequence_probability(target, prefix + tree.path(i)) for i in range(1, tree.n + 1))
    ref /= sequence_probability(target, prefix)
    for one in (True, False):
        res = optimum(shape, draft, target, process="topk", prefix=prefix, one_token=one)
        np.testing.assert_allclose(res.value, ref, rtol=0, atol=LP_TOL)
        assert res.n_trees == 1


def test_eagle2_optimum_is_the_target_path_probabilities():
    draft, target = markov_pair(22, 3)
    params = Eagle2Params(depth=2, top_k=2, total_tokens=5)
    tree = sample_tree(params, draft, process="eagle2")
    ref = math.fsum(sequence_probability(target, tree.path(i)) for i in range(1, tree.n + 1))
    res = optimum(params, draft, target, process="eagle2")
    np.testing.assert_allclose(res.value, ref, rtol=0, atol=LP_TOL)
    law, qref, tau = completed_law_and_tau(res.verifier, params, draft, target, "eagle2")
    np.testing.assert_allclose(law, qref, rtol=0, atol=EXACT)
    np.testing.assert_allclose(tau, ref, rtol=0, atol=LP_TOL)


# ---------------------------------------------------------------------------
# general trees: a second formulation and the unmerged LP
# ---------------------------------------------------------------------------

GENERAL = [
    (30, 2, [(0,), (1,), (0, 0)], "iid"),
    (31, 3, [(0,), (1,), (0, 0)], "wor"),
    (32, 3, [(0,), (0, 0), (0, 1)], "iid"),
    (33, 2, [(0,), (1,), (0, 0), (1, 0)], "wor"),
    (34, 3, [(0,), (1,), (1, 0)], "iid"),
]


@pytest.mark.parametrize("seed,V,paths,process", GENERAL)
def test_one_token_optimum_equals_the_acceptance_form_lp(seed, V, paths, process):
    draft, target = markov_pair(seed, V, concentration=0.7)
    shape = TreeShape(paths)
    o1 = optimum(shape, draft, target, process=process)
    np.testing.assert_allclose(o1.value, e_form_one_token(shape, draft, target, process), rtol=0, atol=LP_TOL)
    oc = optimum(shape, draft, target, process=process, one_token=False)
    np.testing.assert_allclose(oc.value, tree_level_coupling(shape, draft, target, process), rtol=0, atol=LP_TOL)
    assert o1.value <= oc.value + LP_TOL
    assert oc.n_keys <= oc.n_trees


@pytest.mark.parametrize("seed,V,paths,process", GENERAL + [(35, 3, [(0,), (1,), (0, 0), (1, 0)], "iid")])
def test_optimal_verifier_is_lossless_and_attains_the_optimum(seed, V, paths, process):
    draft, target = markov_pair(seed, V, concentration=0.7)
    shape = TreeShape(paths)
    res = optimum(shape, draft, target, process=process, prefix=(1,))
    v = res.verifier
    assert isinstance(v, OptimalTreeVerifier) and v.processes == (process,)
    law, ref, tau = completed_law_and_tau(v, shape, draft, target, process, prefix=(1,))
    np.testing.assert_allclose(law, ref, rtol=0, atol=EXACT)
    np.testing.assert_allclose(tau, res.value, rtol=0, atol=LP_TOL)
    np.testing.assert_allclose(tau, res.plan_value, rtol=0, atol=EXACT)
    # the plan is the verifier's joint law: rows sum to the class weights
    np.testing.assert_allclose(res.plan.mass.sum(axis=1), res.plan.weights, rtol=0, atol=EXACT)
    # the tree package's own enumeration and value agree
    chk = check_lossless(v, shape, draft, target, process=process, prefix=(1,), tol=EXACT)
    assert chk.passed and chk.claimed_lossless
    np.testing.assert_allclose(value(shape, draft, target, process=process, verifier=v, prefix=(1,)), tau,
                               rtol=0, atol=EXACT)
    # every registered rule that is lossless for the process stays at or below the one-token optimum
    for name in ("specinfer", "sequoia", "target-only", "spectr-tree"):
        rule = make_tree_verifier(name)
        if rule.lossless_for(process, shape):
            assert value(shape, draft, target, process=process, verifier=rule, prefix=(1,)) <= res.value + LP_TOL


def test_optimal_verifier_sampler_chi2():
    draft, target = markov_pair(40, 3, concentration=0.7)
    shape = TreeShape([(0,), (1,), (0, 0)])
    res = optimum(shape, draft, target, process="wor")
    tree = sample_tree(shape, draft, process="wor", rng=7)
    P, Q = tree_laws(tree, draft, target)
    em = res.verifier.emission(tree, P, Q)
    gen = np.random.default_rng(8)
    N = 2000
    res.verifier.sample(tree, P, Q, rng=gen)  # validated once; the draws below skip the law checks
    idx = [a * 3 + y for a, y in (res.verifier.sample(tree, P, Q, rng=gen, validate=False) for _ in range(N))]
    assert chi2_gof(np.bincount(idx, minlength=em.size), em.ravel(), alpha_fail=ALPHA_FAIL).passed


def test_sizes_guard_and_speed():
    # depth 3, V = 3, six nodes, i.i.d. children: 729 realised trees, seconds
    draft, target = markov_pair(50, 3)
    shape = TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    t0 = time.perf_counter()
    res = optimum(shape, draft, target, process="iid")
    elapsed = time.perf_counter() - t0
    assert res.success and res.n_trees == 729 and res.n_keys < 729
    assert elapsed < 30.0
    with pytest.raises(ValueError, match=r"one-token LP .* would have \d+ variables, above the limit `max_variables`=100"):
        optimum(shape, draft, target, process="iid", max_variables=100)
    with pytest.raises(ValueError, match=r"coupling LP .* above the limit `max_variables`=100"):
        optimum(shape, draft, target, process="iid", one_token=False, max_variables=100)
    with pytest.raises(ValueError, match=r"target enumeration V\*\*\(D\+1\) = 3\*\*4 .* limit `max_variables`=50"):
        optimum(shape, draft, target, process="iid", max_variables=50)
    with pytest.raises(ValueError, match="max_trees"):
        optimum(shape, draft, target, process="iid", max_trees=100)
    assert MAX_TREE_LP_VARIABLES == 1_000_000


def test_validation_and_misuse():
    draft, target = markov_pair(60, 2)
    shape = TreeShape([(0,), (1,)])
    with pytest.raises(ValueError, match="`process` must be one of"):
        optimum(shape, draft, target, process="nope")
    with pytest.raises(TypeError, match="`one_token` must be a bool"):
        optimum(shape, draft, target, process="iid", one_token=1)
    with pytest.raises(TypeError, match="`raise_on_failure` must be a bool"):
        optimum(shape, draft, target, process="iid", raise_on_failure="yes")
    with pytest.raises(TypeError, match="`max_variables` must be an integer"):
        optimum(shape, draft, target, process="iid", max_variables=1.5)
    with pytest.raises(ValueError, match="`shape` must have at least one draft node"):
        optimum(TreeShape([]), draft, target, process="iid")
    with pytest.raises(ValueError, match=r"`prefix` must hold token ids in \[0, 2\)"):
        optimum(shape, draft, target, process="iid", prefix=(2,))
    with pytest.raises(ValueError, match="vocab"):
        optimum(shape, draft, MemorylessModel([0.2, 0.3, 0.5]), process="iid")
    with pytest.raises(TypeError, match="`shape` must be a TreeShape"):
        optimum(Eagle2Params(depth=1, top_k=2, total_tokens=3), draft, target, process="iid")
    v = optimum(shape, draft, target, process="wor").verifier
    same = DraftTree(shape, shape.parents, [-1, 1, 1])  # two equal siblings: impossible without replacement
    P, Q = tree_laws(same, draft, target)
    with pytest.raises(ValueError, match="has probability 0 under the 'wor' process"):
        v.emission(same, P, Q)
    tree = DraftTree(shape, shape.parents, [-1, 0, 1])
    P, Q = tree_laws(tree, draft, target)
    with pytest.raises(ValueError, match=r"row 0 \(token path \(\)\) differ from the draft/target laws"):
        v.emission(tree, P, np.vstack([[1.0, 0.0], Q[1:]]))
    with pytest.raises(ValueError, match=r"`q_nodes` must have shape \(n \+ 1, V\) = \(3, V\)"):
        v.emission(tree, P, Q[:2])
    with pytest.raises(TypeError, match="`tree` must be a DraftTree"):
        v.emission("tree", P, Q)
    deep = DraftTree.from_paths([(0,), (0, 0)])
    with pytest.raises(ValueError, match="depth 2, above the depth 1"):
        v.emission(deep, *tree_laws(deep, draft, target))


def test_point_masses_and_p_equal_q():
    # p = q: every lossless optimum accepts the whole deepest path with probability 1 on a chain
    m = MarkovModel([[0.3, 0.7], [0.6, 0.4]], initial=[[0.5, 0.5]])
    res = optimum(TreeShape.chains(1, 3), m, m, process="iid")
    np.testing.assert_allclose(res.value, 3.0, rtol=0, atol=LP_TOL)
    # disjoint supports at the root: nothing is ever accepted
    res = optimum(TreeShape([(0,), (0, 0)]), MemorylessModel([1.0, 0.0]), MemorylessModel([0.0, 1.0]), process="iid")
    np.testing.assert_allclose(res.value, 0.0, rtol=0, atol=LP_TOL)
