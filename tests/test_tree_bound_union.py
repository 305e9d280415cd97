"""The union bound B* (otspec.tree.bound(..., method="union")): OPT_c <= B* <= B.

Independent routes: every realised tree enumerated (Pi(T) = P(some root path in T) summed over the trees), the
brute-force minimum over every set T of token paths of one length, SpecTr's optimal k-draft acceptance alpha_k
(otspec.alpha_k, a sort) at depth 1, the coupling and one-token optima of otspec.tree.optimum (LPs).

Tolerances: sums over enumerated trees and paths agree to EXACT = 1e-12 (at most a few thousand float64 terms of
size <= 1); LP values carry the HiGHS tolerance, LP_TOL = 1e-8.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.models import MemorylessModel, random_markov_model, sequence_probability
from otspec.otm import alpha_k
from otspec.tree import TreeShape, bound, enumerate_trees, optimum
from otspec.tree._bound import _ModelLaws, _sampled, _Slots
from otspec.tree._bound_union import _EVERY_STATE, _Rows, _states, union_bound

from .test_tree_bound import _After, _drawable, _Laws, _optima_case, markov_pairs, shapes

EXACT = 1e-12
LP_TOL = 1e-8


def _enumerated(shape, draft, target, process):
    """(trees as (set of root paths, probability), Q(y) and P(y) of every path up to the depth)."""
    D = int(shape.max_depth)
    trees = [(set(t.paths()[1:]), w) for t, w in enumerate_trees(shape, draft, process=process)]
    V = draft.vocab_size
    Q, P = {}, {}
    for d in range(1, D + 1):
        for y in itertools.product(range(V), repeat=d):
            Q[y] = sequence_probability(_After(target, ()), y)
            P[y] = sequence_probability(_After(draft, ()), y)
    return trees, Q, P


def _Pi(trees, T) -> float:
    return math.fsum(w for paths, w in trees if paths & T)


def _brute_min(trees, Q, d, V) -> float:
    """min over every set T of paths of length d of Q(T^c) + Pi(T)."""
    ys = list(itertools.product(range(V), repeat=d))
    best = math.inf
    for mask in range(2 ** len(ys)):
        T = {y for i, y in enumerate(ys) if mask >> i & 1}
        best = min(best, math.fsum(Q[y] for y in ys if y not in T) + _Pi(trees, T))
    return best


def _threshold_sweep(trees, Q, P, d, V) -> float:
    """The threshold family swept exhaustively over the paths of length d: keys pi/Q and P/Q, every distinct key."""
    ys = list(itertools.product(range(V), repeat=d))
    pi = {y: _Pi(trees, {y}) for y in ys}

    def key(num, q):
        return 0.0 if num <= 0 else (math.inf if q <= 0 else num / q)

    best = math.inf
    for k in ({y: key(pi[y], Q[y]) for y in ys}, {y: key(P[y], Q[y]) for y in ys}):
        for t in sorted({0.0} | {v for v in k.values() if math.isfinite(v)}):
            T = {y for y in ys if k[y] <= t}
            best = min(best, math.fsum(Q[y] for y in ys if y not in T) + _Pi(trees, T))
    return best


def _rows(shape, draft, target, process, budget=10_000, batch=64):
    rows = _Rows(_Slots(shape), process)
    res = _sampled(_Slots(shape), process, _ModelLaws(draft, target, draft.vocab_size, ()), budget, batch,
                   on_rows=rows.add)
    return rows, res


# --------------------------------------------------------------------------- between the optima and B
@settings(max_examples=40)
@given(shape=shapes(max_nodes=4, max_depth=2), V=st.sampled_from([2, 3, 4]), data=st.data(),
       process=st.sampled_from(["iid", "wor"]))
def test_union_bound_is_between_the_optima_and_the_paths_bound(shape, V, data, process):
    case = _optima_case(shape, V, data, process)
    if case is None:
        return
    draft, target, oc, o1 = case
    assert oc >= o1 - LP_TOL
    for budget in (1, 2, 3, 10_000):
        u = bound(shape, draft, target, process=process, budget=budget, method="union")
        b = bound(shape, draft, target, process=process, budget=budget)
        assert u.method == "union" and b.method == "paths"
        assert oc - LP_TOL <= u.value <= b.value
        assert np.all(u.per_depth <= b.per_depth)
        assert u.pi_exact          # i.i.d., or every node's draws enumerated (V <= 8)


def test_union_bound_is_strictly_tighter_on_a_branched_iid_tree():
    # branching(2, 2), V = 3: B is 0.13 above OPT_c, B* within 0.01 of it
    draft, target = random_markov_model(3, rng=0, concentration=0.7), random_markov_model(3, rng=50, concentration=0.7)
    s = TreeShape.branching(2, 2)
    oc = optimum(s, draft, target, process="iid", one_token=False).value
    b = bound(s, draft, target, process="iid").value
    u = bound(s, draft, target, process="iid", method="union").value
    assert b - oc > 0.1
    assert oc - LP_TOL <= u <= oc + 0.01


# --------------------------------------------------------------------------- depth 1: SpecTr's alpha_k
@settings(max_examples=60)
@given(V=st.integers(2, 12), k=st.integers(1, 5), data=st.data())
def test_depth_one_iid_is_spectr_alpha_k(V, k, data):
    grid = [0, 0, 1, 1, 2, 5, 13]
    p = np.array(data.draw(st.lists(st.sampled_from(grid), min_size=V, max_size=V)), dtype=float)
    q = np.array(data.draw(st.lists(st.sampled_from(grid), min_size=V, max_size=V)), dtype=float)
    p[0] += p.sum() == 0
    q[-1] += q.sum() == 0
    p, q = p / p.sum(), q / q.sum()
    s = TreeShape([(r,) for r in range(k)])
    u = bound(s, MemorylessModel(p), MemorylessModel(q), process="iid", method="union")
    a = float(alpha_k(p, q, k))
    if V <= 8:      # every distinct key swept: the exact minimum over T
        assert abs(u.value - a) <= EXACT
    else:           # the fixed grid of thresholds: an upper bound, never below alpha_k
        assert u.value >= a - EXACT
    assert u.value <= bound(s, MemorylessModel(p), MemorylessModel(q), process="iid").value



def _enumerated_case(shape, V, data, process):
    """A drawn Markov pair and its enumerated realised trees (:func:`_enumerated`), or None where the process
    cannot draw the shape at ``V`` (refused with the error that says so)."""
    if not _drawable(shape, V, process):
        return None
    draft, target = data.draw(markov_pairs(V))
    try:
        return (draft, target, *_enumerated(shape, draft, target, process))
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return None

# --------------------------------------------------------------------------- against every set T
@settings(max_examples=30)
@given(shape=shapes(max_nodes=4, max_depth=3), V=st.sampled_from([2, 3, 4]), data=st.data(),
       process=st.sampled_from(["iid", "wor"]))
def test_sweep_is_above_the_minimum_over_every_set(shape, V, data, process):
    case = _enumerated_case(shape, V, data, process)
    if case is None:
        return
    draft, target, trees, Q, P = case
    u = bound(shape, draft, target, process=process, budget=10_000, method="union")
    for d in range(1, int(shape.max_depth) + 1):
        if V**d > 12:
            continue
        brute = _brute_min(trees, Q, d, V)
        assert u.per_depth[d - 1] >= brute - EXACT
        if d == 1 and process == "iid":
            # at depth 1 the threshold sets (keys P / Q) hold the minimum for i.i.d. root drafts
            assert abs(u.per_depth[0] - brute) <= EXACT


@settings(max_examples=40)
@given(shape=shapes(max_nodes=4, max_depth=3), V=st.sampled_from([2, 3]), data=st.data(),
       process=st.sampled_from(["iid", "wor"]))
def test_complete_state_equals_the_exhaustive_sweep(shape, V, data, process):
    # Pi exact (i.i.d.; without replacement every node's draws enumerated): with every prefix expanded the last
    # state's value is the threshold family swept over the enumerated paths with Pi(T) from the enumerated trees;
    # B* (the least over the states) is at most it
    case = _enumerated_case(shape, V, data, process)
    if case is None:
        return
    draft, target, trees, Q, P = case
    rows, res = _rows(shape, draft, target, process)
    assert res.complete
    last = rows.state(len(rows.rows))
    u = bound(shape, draft, target, process=process, budget=10_000, method="union")
    assert u.pi_exact
    for d in range(1, int(shape.max_depth) + 1):
        ref = _threshold_sweep(trees, Q, P, d, V)
        assert abs(last[d - 1] - ref) <= EXACT
        assert u.per_depth[d - 1] <= ref + EXACT


# --------------------------------------------------------------------------- anytime
_ANYTIME_SHAPES = [TreeShape.branching(3, 2, 2), TreeShape.chains(2, 4),
                   TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)])]


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", _ANYTIME_SHAPES)
def test_union_bound_never_increases_with_the_budget(process, shape):
    # 13 of the slow test's 34 budgets: 1 to 8 in turn, 16, either side of the last budget whose every state is kept
    # (31, 32) and the powers of two beyond it (64, 128)
    _union_bound_never_increases(process, shape, sorted(set(range(1, 9)) | {16, _EVERY_STATE - 1, _EVERY_STATE, 64, 128}))


@pytest.mark.slow
@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", _ANYTIME_SHAPES)
def test_union_bound_never_increases_with_the_budget_every_budget(process, shape):
    # every budget up to the last one with every state (the fast test above takes 13 of these 34 budgets)
    _union_bound_never_increases(process, shape, sorted(set(range(1, _EVERY_STATE + 1)) | {64, 128}))


def _union_bound_never_increases(process, shape, budgets):
    V = 5
    draft, target = random_markov_model(V, rng=3, concentration=0.5), random_markov_model(V, rng=4, concentration=0.5)
    prev = math.inf
    for budget in budgets:
        u = bound(shape, draft, target, process=process, budget=budget, batch=3, method="union")
        assert u.value <= prev
        assert u.value <= bound(shape, draft, target, process=process, budget=budget, batch=3).value
        prev = u.value


def test_states_are_the_same_for_every_budget_that_reaches_them():
    assert _states(5, 5) == [1, 2, 3, 4, 5]
    assert _states(300, 300)[-4:] == [64, 128, 256, 300]
    for b in range(1, 200):
        for b2 in (b + 1, 2 * b):
            small = {m for m in _states(b, b) if m <= _EVERY_STATE or m & (m - 1) == 0}
            assert small <= set(_states(b2, b2))


# --------------------------------------------------------------------------- deterministic trees, input, large V
@pytest.mark.parametrize("process", ["topk", "eagle2"])
def test_deterministic_trees_union_equals_paths(process):
    from otspec.tree import Eagle2Params

    shape = Eagle2Params(depth=3, top_k=2, total_tokens=6) if process == "eagle2" else TreeShape.branching(2, 2)
    draft, target = random_markov_model(4, rng=1), random_markov_model(4, rng=2)
    u = bound(shape, draft, target, process=process, method="union")
    b = bound(shape, draft, target, process=process)
    assert u.value == b.value and u.method == "union"


@pytest.mark.parametrize("method, exc", [("exact", ValueError), ("", ValueError), ("Union", ValueError),
                                         (None, TypeError), (3, TypeError)])
def test_bad_method_is_refused_before_any_model_call(method, exc):
    class Boom:
        vocab_size = 2

        def next_dist(self, prefix):
            raise AssertionError("model called")

    with pytest.raises(exc, match="`method` must be"):
        bound(TreeShape.branching(2), Boom(), Boom(), process="iid", method=method)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_large_vocabulary_grid_stays_between_the_optimum_at_depth_one_and_b(process):
    V = 300
    draft = random_markov_model(V, rng=5, concentration=0.3)
    target = random_markov_model(V, rng=6, concentration=0.3)
    s = TreeShape.branching(3, 2)
    u = bound(s, draft, target, process=process, budget=16, method="union")
    b = bound(s, draft, target, process=process, budget=16)
    assert u.value <= b.value and np.all(u.per_depth <= b.per_depth)
    if process == "iid":
        # b*_1 >= alpha_3 (the optimum at depth 1), within the grid's spacing of it
        a = float(alpha_k(draft.next_dist(()), target.next_dist(()), 3))
        assert a - EXACT <= u.per_depth[0] <= a + 0.02


@pytest.mark.parametrize("route", ["bounds, every key", "bounds, grid"])
def test_without_replacement_the_stated_bounds_stay_between_the_optimum_and_b(route, monkeypatch):
    # the route of large vocabularies (no enumeration of the draws: the product bound and the union over the
    # children's draws, the smaller), forced at small V where OPT_c is an LP: still OPT_c <= B* <= B, pi_exact False
    import otspec.tree._bound_union as U

    monkeypatch.setattr(U, "_MAX_SEQUENCES", 0)
    if route == "bounds, grid":
        monkeypatch.setattr(U, "_EXACT_KEYS_V", 0)
    shapes_ = [TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0)]), TreeShape.branching(2, 2),
               TreeShape([(0,), (1,), (2,), (0, 0), (2, 0)])]
    gained = 0.0
    for seed in range(4):
        V = 3 + seed % 2
        draft = random_markov_model(V, rng=seed, concentration=0.7)
        target = random_markov_model(V, rng=50 + seed, concentration=0.7)
        for s in shapes_:
            oc = optimum(s, draft, target, process="wor", one_token=False).value
            b = bound(s, draft, target, process="wor").value
            u = bound(s, draft, target, process="wor", method="union")
            assert oc - LP_TOL <= u.value <= b
            assert not u.pi_exact
            gained = max(gained, b - u.value)
    # the case above: the union over the children's draws (their exact laws) takes B* from B = 1.890 to 1.862
    # (OPT_c = 1.8615); the product bound alone gives B there
    assert gained > 0.02


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("V, shape, budget, batch", [
    (4, TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), 150, 64),    # every key, draws enumerated
    (200, TreeShape.branching(4, 3, 2), 40, 16),                                        # the grid, the stated bounds
])
def test_laws_as_tensors_give_the_same_union_bound(process, V, shape, budget, batch):
    # the frontier's laws as torch tensors (the device route's expansion on the CPU): the same rows reach the union
    # bound (read back to the host), so the same value as with numpy laws
    pytest.importorskip("torch")
    draft = random_markov_model(V, rng=V + 1, concentration=0.5)
    target = random_markov_model(V, rng=V + 2, concentration=0.5)
    a = union_bound(_Slots(shape), process, _Laws(draft, target, False), budget, batch)
    b = union_bound(_Slots(shape), process, _Laws(draft, target, True), budget, batch)
    assert a.method == b.method == "union" and a.pi_exact == b.pi_exact
    assert abs(a.value - b.value) <= EXACT * max(1.0, a.value)
    np.testing.assert_allclose(b.per_depth, a.per_depth, rtol=0, atol=EXACT)
    assert a.value <= bound(shape, draft, target, process=process, budget=budget, batch=batch).value
