"""The anytime upper bound B on every lossless tree verifier (otspec.tree.bound).

Independent routes: every realised tree enumerated (pi(y) = P(y is a root path), b_d and B summed from it), the
coupling and one-token optima of otspec.tree.optimum (LPs: B >= OPT_c >= OPT_1), the block bound on one chain
from the joint laws, alpha at depth 1, the target-only rule's exact value on deterministic trees, and the laws of
the draws without replacement by enumerating ordered draws.

Tolerances: sums over enumerated trees agree to EXACT = 1e-12 (at most a few thousand float64 terms of size <= 1);
LP values carry the HiGHS tolerance, LP_TOL = 1e-8.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.models import MarkovModel, MemorylessModel, joint_law, random_markov_model, sequence_probability
from otspec.tree import (
    MAX_BOUND_BUDGET,
    Eagle2Params,
    TreeBound,
    TreeShape,
    _bound_kernels,
    bound,
    enumerate_trees,
    optimum,
    value,
)
from otspec.tree._bound import _DrawLaws, _root_path_probability, _second_draw, _wor_draw_laws
from otspec.tree._process import _wor_sequences

EXACT = 1e-12
LP_TOL = 1e-8


def _reference(shape, draft, target, process, prefix=()):
    """(b_d, B, pi) from every realised tree enumerated: pi(y) = sum of P(T) over the trees with root path y."""
    D = int(shape.max_depth)
    pi: dict = {}
    for tree, w in enumerate_trees(shape, draft, process=process, prefix=prefix):
        for y in set(tree.paths()[1:]):
            pi.setdefault(y, []).append(w)
    pi = {y: math.fsum(ws) for y, ws in pi.items()}
    b = []
    for d in range(1, D + 1):
        b.append(math.fsum(min(sequence_probability(_After(target, prefix), y), w)
                           for y, w in pi.items() if len(y) == d))
    return np.array(b), math.fsum(np.minimum.accumulate(b).tolist()), pi


class _After:
    def __init__(self, model, prefix):
        self.model, self.prefix, self.vocab_size = model, tuple(prefix), model.vocab_size

    def next_dist(self, s):
        return self.model.next_dist(self.prefix + tuple(s))


@st.composite
def shapes(draw, max_nodes=5, max_depth=3, max_rank=2):
    paths = {()}
    for _ in range(draw(st.integers(1, max_nodes))):
        par = draw(st.sampled_from(sorted(p for p in paths if len(p) < max_depth)))
        free = [r for r in range(max_rank + 1) if par + (r,) not in paths]
        if free:
            paths.add(par + (draw(st.sampled_from(free)),))
    return TreeShape(sorted(p for p in paths if p))


@st.composite
def markov_pairs(draw, V):
    """Two first-order Markov models whose rows have zeros and ties (values from a small grid, normalised)."""
    def rows():
        grid = draw(st.lists(st.lists(st.sampled_from([0, 0, 1, 1, 2, 5]), min_size=V, max_size=V),
                             min_size=V + 1, max_size=V + 1))
        a = np.array(grid, dtype=float)
        a[a.sum(axis=1) == 0, 0] = 1.0
        return a / a.sum(axis=1, keepdims=True)
    d, t = rows(), rows()
    return MarkovModel(d[1:], initial=[d[0]]), MarkovModel(t[1:], initial=[t[0]])


# --------------------------------------------------------------------------- exact against enumeration
@settings(max_examples=60)
@given(shape=shapes(), V=st.sampled_from([2, 3]), data=st.data(), process=st.sampled_from(["iid", "wor"]))
def test_bound_equals_the_enumerated_sum_when_every_prefix_is_expanded(shape, V, data, process):
    if process == "wor" and max(r for p in shape.paths[1:] for r in p) + 1 > V:
        return
    draft, target = data.draw(markov_pairs(V))
    try:
        b_ref, B_ref, _ = _reference(shape, draft, target, process)
    except ValueError as exc:   # the draft's support is too small for the shape at some prefix
        assert "distinct children" in str(exc)
        with pytest.raises(ValueError, match="distinct children"):
            bound(shape, draft, target, process=process)
        return
    res = bound(shape, draft, target, process=process, budget=10_000)
    assert res.complete and res.pi_exact and res.remainder == 0.0
    np.testing.assert_allclose(res.per_depth, b_ref, rtol=0, atol=EXACT)
    np.testing.assert_allclose(res.lower_per_depth, b_ref, rtol=0, atol=EXACT)
    assert abs(res.value - B_ref) <= EXACT


@settings(max_examples=40)
@given(shape=shapes(max_nodes=4, max_depth=3), seed=st.integers(0, 10**6), process=st.sampled_from(["iid", "wor"]),
       V=st.sampled_from([3, 4]))
def test_root_path_probability_against_realised_trees(shape, seed, process, V):
    draft = random_markov_model(V, rng=seed, concentration=0.7)
    _, _, pi = _reference(shape, draft, draft, process)
    for d in range(1, int(shape.max_depth) + 1):
        for y in itertools.product(range(V), repeat=d):
            got, exact = _root_path_probability(shape, draft, y, process=process)
            assert exact
            assert abs(got - pi.get(y, 0.0)) <= EXACT


def test_iid_pi_is_not_the_product_of_per_depth_probabilities():
    # two slots that drew the same token each get their own chance below: branching(2, 2), V = 2, uniform
    draft = MemorylessModel([0.5, 0.5])
    got, _ = _root_path_probability(TreeShape.branching(2, 2), draft, (0, 0), process="iid")
    f1 = 1 - (1 - 0.5) ** 2                      # a depth-1 slot holding 0 has a child 0
    assert got == pytest.approx(1 - (1 - 0.5 * f1) ** 2, abs=EXACT)        # 0.609375
    assert got != pytest.approx((1 - 0.5**2) ** 2, abs=1e-3)                # 0.5625, the wrong product


def _drawable(shape, V, process):
    """Whether ``process`` can draw ``shape`` at ``V`` (without replacement a node's ranks need as many tokens)."""
    return process == "iid" or max(r for p in shape.paths[1:] for r in p) + 1 <= V


def _optima_case(shape, V, data, process):
    """A drawn Markov pair with both optima, ``(draft, target, OPT_c, OPT_1)``, or None where the process cannot
    draw the shape (refused with the error that says so)."""
    if not _drawable(shape, V, process):
        return None
    draft, target = data.draw(markov_pairs(V))
    try:
        oc = optimum(shape, draft, target, process=process, one_token=False, raise_on_failure=True).value
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return None
    return draft, target, oc, optimum(shape, draft, target, process=process, raise_on_failure=True).value


# --------------------------------------------------------------------------- above the optima, equal where theory says
@settings(max_examples=25)
@given(shape=shapes(max_nodes=4, max_depth=2), V=st.sampled_from([2, 3]), data=st.data(),
       process=st.sampled_from(["iid", "wor"]))
def test_bound_is_above_both_optima(shape, V, data, process):
    case = _optima_case(shape, V, data, process)
    if case is None:
        return
    draft, target, oc, o1 = case
    for budget in (1, 2, 3, 10_000):
        assert bound(shape, draft, target, process=process, budget=budget).value >= oc - LP_TOL
    assert oc >= o1 - LP_TOL


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("L", [1, 2, 3])
def test_one_chain_gives_the_block_bound(seed, L):
    draft, target = random_markov_model(3, rng=seed), random_markov_model(3, rng=100 + seed)
    block = math.fsum(1.0 - 0.5 * float(np.abs(joint_law(draft, d) - joint_law(target, d)).sum())
                      for d in range(1, L + 1))
    res = bound(TreeShape.chains(1, L), draft, target, process="iid")
    assert abs(res.value - block) <= EXACT
    assert abs(res.value - optimum(TreeShape.chains(1, L), draft, target, process="iid",
                                   one_token=False).value) <= LP_TOL
    # drawing one child without replacement is drawing it from p
    assert abs(bound(TreeShape.chains(1, L), draft, target, process="wor").value - block) <= EXACT


@pytest.mark.parametrize("seed", range(6))
def test_depth_one_with_one_child_is_the_one_token_optimum(seed):
    draft, target = random_markov_model(4, rng=seed), random_markov_model(4, rng=50 + seed)
    p, q = draft.next_dist(()), target.next_dist(())
    s = TreeShape([(0,)])
    res = bound(s, draft, target, process="iid")
    assert abs(res.value - float(np.minimum(p, q).sum())) <= EXACT
    assert abs(res.value - optimum(s, draft, target, process="iid").value) <= LP_TOL


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [TreeShape.branching(2, 2), TreeShape([(0,), (2,), (0, 0), (0, 1)]),
                                   Eagle2Params(depth=3, top_k=2, total_tokens=6)])
def test_deterministic_trees_give_the_attained_sum_of_q(seed, shape):
    process = "eagle2" if isinstance(shape, Eagle2Params) else "topk"
    draft, target = random_markov_model(4, rng=seed), random_markov_model(4, rng=70 + seed)
    res = bound(shape, draft, target, process=process)
    attained = value(shape, draft, target, process=process, verifier="target-only")
    assert abs(res.value - attained) <= EXACT
    assert res.complete and res.pi_exact and res.remainder == 0.0
    assert abs(res.value - optimum(shape, draft, target, process=process).value) <= LP_TOL


# --------------------------------------------------------------------------- anytime
@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", [TreeShape.branching(3, 2, 2), TreeShape.chains(2, 4),
                                   TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)])])
def test_bound_never_increases_with_the_budget_and_reaches_b(process, shape):
    # B itself: the complete bound (equal to the enumerated sum in the test above, where enumeration is possible)
    V = 5
    draft, target = random_markov_model(V, rng=3, concentration=0.5), random_markov_model(V, rng=4, concentration=0.5)
    full = bound(shape, draft, target, process=process, budget=10_000, batch=3)
    assert full.complete and full.remainder == 0.0
    B = full.value
    prev = math.inf
    first = None
    for budget in range(1, 60):
        res = bound(shape, draft, target, process=process, budget=budget, batch=3)
        assert res.n_expanded <= budget
        assert res.value <= prev + EXACT
        assert res.value >= B - EXACT
        assert res.value - res.remainder <= B + EXACT
        prev = res.value
        first = res.value if first is None else first
    if process == "iid":
        assert first > B + 1e-3             # one expanded prefix leaves a remainder here


def test_frontier_size_changes_the_calls_not_the_complete_value():
    draft, target = random_markov_model(6, rng=8), random_markov_model(6, rng=9)
    s = TreeShape.branching(2, 2, 2)
    one = bound(s, draft, target, process="iid", budget=10_000, batch=1)
    many = bound(s, draft, target, process="iid", budget=10_000, batch=64)
    assert one.complete and many.complete
    assert abs(one.value - many.value) <= EXACT
    assert many.n_calls < one.n_calls == one.n_expanded


def test_large_vocabulary_runs_and_brackets():
    V = 2000
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.full(V, 0.05)), rng.dirichlet(np.full(V, 0.05))
    draft, target = MemorylessModel(p), MemorylessModel(q)
    s = TreeShape.branching(4, 2, 2)
    prev = math.inf
    for budget in (1, 4, 16, 64):
        for process in ("iid", "wor"):
            res = bound(s, draft, target, process=process, budget=budget, batch=16)
            assert 0.0 <= res.value - res.remainder <= res.value <= 3.0
        r = bound(s, draft, target, process="iid", budget=budget, batch=16)
        assert r.value <= prev + EXACT
        assert (budget == 1) == (prev == math.inf) and (budget == 1 or r.value < prev - 1e-6)
        prev = r.value
    # at depth 1 the bound is exact from the root alone: sum_x min(q, 1 - (1 - p)**4)
    r1 = bound(TreeShape.branching(4), draft, target, process="iid", budget=1)
    assert r1.complete and abs(r1.value - math.fsum(np.minimum(q, 1 - (1 - p) ** 4).tolist())) <= EXACT


# --------------------------------------------------------------------------- the law of a draw without replacement
@pytest.mark.parametrize("p", [[0.5, 0.5], [0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25], [1 - 1e-12, 1e-12, 0.0],
                               [0.4, 0.3, 0.2, 0.05, 0.05, 0.0]])
def test_draw_laws_without_replacement_against_ordered_draws(p):
    p = np.array(p)
    need = int(np.count_nonzero(p))
    ranks = list(range(need))
    exact = {r: np.zeros(p.shape[0]) for r in ranks}
    for seq, w in _wor_sequences(p, need):
        for r in ranks:
            exact[r][seq[r]] += w
    np.testing.assert_allclose(_second_draw(p)[0], exact[1], rtol=0, atol=EXACT)
    got, ex = _wor_draw_laws(p, ranks)
    assert ex
    for r in ranks:
        np.testing.assert_allclose(got[r, 0], exact[r], rtol=0, atol=EXACT)
    # enumeration refused: the exponential race, exact to WOR_LAW_RTOL
    race, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    assert ex
    for r in ranks:
        np.testing.assert_allclose(race[r, 0], exact[r], rtol=0, atol=EXACT)
    # the stated upper bound (ranks >= 2) without the race
    bnd, ex = _wor_draw_laws(p, ranks, exact_limit=0, race=False)
    assert ex == (need <= 2)
    for r in ranks:
        assert np.all(bnd[r, 0] >= exact[r] - EXACT)
        if r < 2:
            np.testing.assert_allclose(bnd[r, 0], exact[r], rtol=0, atol=EXACT)


def test_bounded_draw_laws_keep_an_upper_bound(monkeypatch):
    import otspec.tree._bound as mod

    draft, target = random_markov_model(5, rng=21, concentration=0.4), random_markov_model(5, rng=22)
    s = TreeShape([(0,), (1,), (2,), (3,), (0, 0), (2, 0), (2, 1), (2, 2)])
    exact = bound(s, draft, target, process="wor", budget=10_000)
    monkeypatch.setattr(mod, "_MAX_WOR_ENUMERATION", 0)
    race = bound(s, draft, target, process="wor", budget=10_000)          # the exponential race
    monkeypatch.setattr(mod, "_WOR_RACE", False)
    loose = bound(s, draft, target, process="wor", budget=10_000)
    assert exact.pi_exact and race.pi_exact and not loose.pi_exact
    assert abs(race.value - exact.value) <= EXACT
    np.testing.assert_allclose(race.per_depth, exact.per_depth, rtol=0, atol=EXACT)
    assert loose.value >= exact.value - EXACT
    assert exact.value >= optimum(s, draft, target, process="wor", one_token=False).value - LP_TOL


# --------------------------------------------------------------------------- bad input
class _Refuses:
    vocab_size = 3

    def next_dist(self, prefix):
        raise AssertionError("a model call before the input was checked")


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(budget=0), ValueError, "`budget` must be"),
    (dict(budget=MAX_BOUND_BUDGET + 1), ValueError, "`budget` must be at most"),
    (dict(budget=2.0), TypeError, "`budget` must be an integer"),
    (dict(batch=0), ValueError, "`batch` must be"),
    (dict(process="beam"), ValueError, "`process` must be one of"),
    (dict(process="eagle2"), TypeError, "Eagle2Params"),
    (dict(prefix=[5]), ValueError, "`prefix` must hold token ids"),
])
def test_bad_input_is_refused_before_any_model_call(kwargs, exc, match):
    args = dict(process="iid")
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        bound(TreeShape.branching(2, 2), _Refuses(), _Refuses(), **args)


def test_a_shape_the_process_cannot_draw_and_unequal_vocabularies():
    with pytest.raises(ValueError, match="process='wor' cannot draw the shape.*V=3"):
        bound(TreeShape([(0,), (3,)]), _Refuses(), _Refuses(), process="wor")
    with pytest.raises(ValueError, match="share one vocabulary"):
        bound(TreeShape.branching(2), MemorylessModel([0.5, 0.5]), _Refuses(), process="iid")
    with pytest.raises(ValueError, match="at least one draft node"):
        bound(TreeShape([]), _Refuses(), _Refuses(), process="iid")
    with pytest.raises(ValueError, match="distinct children at the node with token path"):
        bound(TreeShape([(0,), (1,)]), MemorylessModel([1.0, 0.0, 0.0]), MemorylessModel([0.2, 0.3, 0.5]),
              process="wor")


def test_result_is_frozen():
    res = bound(TreeShape.branching(2), MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]), process="iid")
    assert isinstance(res, TreeBound)
    with pytest.raises(AttributeError):
        res.value = 0.0


# --------------------------------------------------------------------------- decoding models: one call per frontier
def test_decoding_models_score_each_frontier_in_one_call_and_agree_with_next_dist():
    torch = pytest.importorskip("torch")
    from otspec.decoding import CallableLM

    V = 5
    gen = torch.Generator().manual_seed(0)
    Wd, Wt = torch.randn(V, V, generator=gen, dtype=torch.float64), torch.randn(V, V, generator=gen, dtype=torch.float64)

    def bigram(W):
        return lambda ids: W[ids]                          # logits depend on the last token only

    class Counting(CallableLM):
        calls = 0

        def tree_logits(self, *a, **k):
            type(self).calls += 1
            return super().tree_logits(*a, **k)

    lm_d, lm_t = Counting(bigram(Wd), V), Counting(bigram(Wt), V)
    ctx = [2, 4]
    md = MarkovModel(torch.softmax(Wd, -1).numpy(), initial=[torch.softmax(Wd[4], -1).numpy()])
    mt = MarkovModel(torch.softmax(Wt, -1).numpy(), initial=[torch.softmax(Wt[4], -1).numpy()])
    for process, shape in (("iid", TreeShape.branching(2, 2, 2)), ("wor", TreeShape.branching(3, 2))):
        Counting.calls = 0
        a = bound(shape, lm_d, lm_t, process=process, prefix=ctx, budget=20, batch=8)
        b = bound(shape, md, mt, process=process, budget=20, batch=8)
        assert Counting.calls == 2 * a.n_calls and a.n_expanded == b.n_expanded
        assert abs(a.value - b.value) <= EXACT and abs(a.remainder - b.remainder) <= EXACT
    c = bound(TreeShape.branching(2, 2), lm_d, lm_t, process="topk", prefix=ctx)
    assert abs(c.value - value(TreeShape.branching(2, 2), md, mt, process="topk", verifier="target-only")) <= EXACT
    with pytest.raises(ValueError, match="at least one token"):
        bound(TreeShape.branching(2), lm_d, lm_t, process="iid")
    with pytest.raises(TypeError, match="both be models"):
        bound(TreeShape.branching(2), lm_d, md, process="iid", prefix=ctx)


# --------------------------------------------------------------------------- the torch route: laws as tensors
class _Laws:
    """``laws(paths) -> (P, Q)`` from two models, as float64 numpy arrays or as torch tensors (the interface of
    the bound's frontier expansion), counting calls."""

    def __init__(self, draft, target, as_tensor):
        self.draft, self.target, self.as_tensor, self.calls = draft, target, as_tensor, 0

    def __call__(self, paths):
        self.calls += 1
        P = np.array([self.draft.next_dist(tuple(s)) for s in paths], dtype=np.float64)
        Q = np.array([self.target.next_dist(tuple(s)) for s in paths], dtype=np.float64)
        if self.as_tensor:
            import torch

            return torch.from_numpy(P), torch.from_numpy(Q)
        return P, Q


def _rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


@pytest.fixture(params=["compiled", "numpy"])
def host(request, monkeypatch):
    """Run a test with the host route's fused kernels (numba, when installed) and with its numpy route."""
    if request.param == "numpy":
        monkeypatch.setattr(_bound_kernels, "JIT", False)
    return request.param


def _outcome(r):
    return (r.value, r.per_depth.tolist(), r.lower_per_depth.tolist(), r.remainder, r.n_expanded, r.n_calls,
            r.complete, r.pi_exact)


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("V, concentration, shape", [
    (60, 0.05, TreeShape.branching(8, 7)),
    (300, 1.0, TreeShape([(0,), (3,), (0, 0), (0, 2), (3, 1), (0, 0, 0), (0, 2, 1)])),
    (700, 0.3, TreeShape.branching(3, 2, 2)),                  # more than one block of columns per row
    (500, 5.0, TreeShape([(0,), (1,), (0, 0), (0, 0, 0), (0, 0, 1), (1, 0)])),
])
@pytest.mark.parametrize("budget", [1, 9, 80])
def test_fused_row_kernels_agree_with_the_numpy_route(process, V, concentration, shape, budget, monkeypatch):
    """The fused row kernels against the numpy route (numba off): the same prefixes expanded, every value,
    per-depth sum and remainder within EXACT (relative). Not bit for bit: the kernels sum each row over 256
    lanes (numpy: pairwise) and, without replacement, combine the ranks' race laws before the sum; the entries
    and the row sums are pinned against independent routes below."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    draft = random_markov_model(V, rng=V + 3, concentration=concentration)
    target = random_markov_model(V, rng=V + 4, concentration=concentration)
    a = bound(shape, draft, target, process=process, budget=budget, batch=16)
    monkeypatch.setattr(_bound_kernels, "JIT", False)
    b = bound(shape, draft, target, process=process, budget=budget, batch=16)
    assert (a.n_expanded, a.n_calls, a.complete, a.pi_exact) == (b.n_expanded, b.n_calls, b.complete, b.pi_exact)
    assert _rel(a.value, b.value) <= EXACT and abs(a.remainder - b.remainder) <= EXACT * a.value
    for x, y in ((a.per_depth, b.per_depth), (a.lower_per_depth, b.lower_per_depth)):
        np.testing.assert_allclose(x, y, rtol=EXACT, atol=0)


def _one_frontier(process, shape, V, m, seed):
    """A frontier of ``m`` depth-1 prefixes of ``shape`` with LLM-like laws (softmax of Gaussian logits, some exact
    zeros): ``(slots, prefixes, P, Q)``."""
    from otspec.tree._bound import _Prefix, _Slots

    rng = np.random.default_rng(seed)
    slots = _Slots(shape)

    def law():
        z = rng.normal(0, 3.0, V)
        p = np.exp(z - z.max())
        p[rng.random(V) < 0.05] = 0.0
        return p / p.sum()

    P, Q = np.stack([law() for _ in range(m)]), np.stack([law() for _ in range(m)])
    n1 = slots.n_at[1]
    frontier = [_Prefix((int(x),), float(rng.random()), 0.5, rng.random(n1), (float(rng.random()),), {})
                for x in rng.choice(V, m, replace=False)]
    return slots, frontier, P, Q


@pytest.mark.parametrize("process, shape", [("iid", TreeShape.branching(3, 4, 2)), ("iid", TreeShape.branching(8, 7, 1)),
                                            ("wor", TreeShape.branching(3, 4, 2)), ("wor", TreeShape.branching(2, 6, 1))])
@pytest.mark.parametrize("V", [700, 5000])
def test_fused_row_pass_entries_and_row_sums(process, shape, V, monkeypatch):
    """One frontier expanded by the fused row kernels against the numpy route's whole arrays (numba off): the
    children's pi and min(Q, pi) entries bit for bit (i.i.d.: the same operations) or within EXACT (without
    replacement: the ranks' race laws combined before the sum), and every row sum (the exact level and the caps
    of the lower depths) within 1e-13 of math.fsum over the numpy route's entries."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree._bound import _expand_rows, _iid_pi

    slots, frontier, P, Q = _one_frontier(process, shape, V, 5, V)
    j = 1
    a = _expand_rows(slots, process, frontier, list(P), list(Q), 10**6)[0]
    rc = (np.array([frontier.index(o) for o in a["owner"]]), a["x"])
    got = [(u.exact, dict(u.S)) for u in frontier]
    monkeypatch.setattr(_bound_kernels, "JIT", False)
    from otspec.tree._bound import _child_pi

    A = np.stack([u.A for u in frontier])
    s_all = np.array([u.s for u in frontier])
    pi, md, _draws, _ex = _child_pi(slots, process, A, s_all, P, [u.path for u in frontier])
    Qc = np.array([u.Q for u in frontier])[:, None] * Q
    low = np.minimum(Qc, pi)
    if process == "iid":
        np.testing.assert_array_equal(pi, _iid_pi(slots, j, s_all, P))
        np.testing.assert_array_equal(a["pi"], pi[rc])          # the candidates' values, bit for bit
        np.testing.assert_array_equal(a["pr"], low[rc])
    else:
        np.testing.assert_allclose(a["pi"], pi[rc], rtol=EXACT, atol=0)
        np.testing.assert_allclose(a["pr"], low[rc], rtol=EXACT, atol=0)
    for i, (exact, S) in enumerate(got):
        assert _rel(exact, math.fsum(low[i].tolist())) <= 1e-13
        assert set(S) == set(md)
        for d, v in S.items():
            assert _rel(v, math.fsum(np.minimum(Qc[i], md[d][i]).tolist())) <= 1e-13


def test_fused_draw_laws_at_entries_are_the_whole_laws():
    """Without replacement the fused route holds no law whole: the laws of the candidates' draws, read at
    entries, are the numpy route's whole laws there, bit for bit, the top tokens and the most likely one
    included."""
    rng = np.random.default_rng(5)
    P = rng.dirichlet(np.full(900, 0.2), size=3)
    ranks = [0, 1, 2, 4, 5]
    whole = _DrawLaws(P, ranks, np)
    fused = _DrawLaws(P, ranks, np, fused=True)
    assert not whole.fused and fused.fused == _bound_kernels.JIT
    rows = np.repeat(np.arange(3), 900)
    cols = np.tile(np.arange(900), 3)
    for k in range(len(ranks)):
        np.testing.assert_array_equal(fused.at(k, rows, cols), whole.law(k)[rows, cols])


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("V, concentration, shape", [
    (4, 0.5, TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])),   # small supports: enumerated
    (200, 0.3, TreeShape.branching(4, 3, 2)),                                       # ranks >= 2 bounded
    (300, 1.0, TreeShape([(0,), (3,), (0, 0), (0, 2), (3, 1), (0, 0, 0), (0, 2, 1)])),
])
@pytest.mark.parametrize("budget, batch", [(1, 1), (7, 3), (40, 16), (150, 64)])
def test_torch_route_agrees_with_numpy(process, V, concentration, shape, budget, batch, host):
    torch = pytest.importorskip("torch")
    from otspec.tree._bound import _sampled, _Slots

    draft = random_markov_model(V, rng=V + 1, concentration=concentration)
    target = random_markov_model(V, rng=V + 2, concentration=concentration)
    a = _sampled(_Slots(shape), process, _Laws(draft, target, False), budget, batch)
    b = _sampled(_Slots(shape), process, _Laws(draft, target, True), budget, batch)
    assert isinstance(torch.zeros(1), torch.Tensor)
    assert (a.n_expanded, a.n_calls, a.complete, a.pi_exact) == (b.n_expanded, b.n_calls, b.complete, b.pi_exact)
    assert _rel(a.value, b.value) <= EXACT and abs(a.remainder - b.remainder) <= EXACT * a.value
    for x, y in ((a.per_depth, b.per_depth), (a.lower_per_depth, b.lower_per_depth)):
        np.testing.assert_allclose(y, x, rtol=EXACT, atol=0)
    # the numpy route is the public function's
    c = bound(shape, draft, target, process=process, budget=budget, batch=batch)
    assert c.value == a.value and c.n_expanded == a.n_expanded
    if V == 4 and budget == 150:
        assert a.complete and a.pi_exact                      # every prefix expanded, every draw law enumerated


@pytest.mark.parametrize("p", [[0.4, 0.3, 0.2, 0.05, 0.05, 0.0], [0.25, 0.25, 0.25, 0.25]])
def test_draw_laws_of_tensors_agree_with_numpy(p):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    P = np.vstack([p, rng.dirichlet(np.full(len(p), 0.5))])
    for limit in (None, 0):
        a, ea = _wor_draw_laws(P, [0, 1, 2, 3], exact_limit=limit)
        b, eb = _wor_draw_laws(torch.from_numpy(P), [0, 1, 2, 3], exact_limit=limit)
        assert isinstance(b, torch.Tensor) and ea == eb
        np.testing.assert_allclose(b.numpy(), a, rtol=EXACT, atol=0)
    np.testing.assert_allclose(_second_draw(torch.from_numpy(P)).numpy(), _second_draw(P), rtol=EXACT, atol=0)


@settings(max_examples=60)
@given(rows=st.lists(st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.1, 0.2, 0.5]), min_size=6, max_size=6), min_size=1,
                     max_size=4), keep=st.integers(0, 7), as_tensor=st.booleans())
def test_candidates_of_a_block_are_each_rows_ranked_prefix(rows, keep, as_tensor):
    # one partition of the whole block gives, row by row, what _ranked gives (decreasing, ties by lower id)
    from otspec.tree._bound import _top_per_row
    from otspec.tree._process import _ranked

    low = np.array(rows)
    xp = np
    if as_tensor:
        torch = pytest.importorskip("torch")
        import array_api_compat

        low, xp = torch.from_numpy(low), array_api_compat.array_namespace(torch.zeros(1))
    r, x, dropped = _top_per_row(low, keep, xp)
    want_r, want_x, want_drop = [], [], 0
    for i, row in enumerate(np.array(rows)):
        n_pos = int(np.count_nonzero(row > 0))
        k = min(keep, n_pos)
        want_drop += n_pos - k
        if k:
            want_x += _ranked(row, k).tolist()
            want_r += [i] * k
    assert r.tolist() == want_r and x.tolist() == want_x and dropped == want_drop


# --------------------------------------------------------------------------- the exponential race (exact laws, any V)
def _subset_laws(p, ranks):
    """P(draw r = y) by summing over the sets S of the first r draws: P(first |S| draws are S) by the recursion
    over sets, then p_y / (1 - p(S)) (an independent exact route, every term positive; V up to ~16)."""
    p = np.asarray(p, dtype=float)
    V, R = p.size, max(ranks)
    out = np.zeros((len(ranks), V))
    layer = {frozenset(): 1.0}
    for r in range(R + 1):
        if r in ranks:
            for S, w in layer.items():
                rest = math.fsum(p[[x for x in range(V) if x not in S]])
                for y in range(V):
                    if y not in S and p[y] > 0:
                        out[ranks.index(r), y] += w * p[y] / rest
        nxt: dict = {}
        for S, w in layer.items():
            rest = math.fsum(p[[x for x in range(V) if x not in S]])
            for y in range(V):
                if y not in S and p[y] > 0:
                    nxt[S | {y}] = nxt.get(S | {y}, 0.0) + w * p[y] / rest
        layer = nxt
    return out


@settings(max_examples=40, deadline=None)
@given(grid=st.lists(st.sampled_from([0, 0, 1, 1, 2, 5, 40]), min_size=4, max_size=7), scale=st.sampled_from([1, 1e-9]))
def test_race_laws_equal_the_ordered_draws_enumerated(grid, scale):
    # zeros, ties, and a token of probability ~1e-9 next to ~1: the race (enumeration refused) against every
    # ordered sequence of draws
    p = np.array(grid, dtype=float)
    if np.count_nonzero(p) < 3:
        return
    p[np.argmax(p)] /= scale
    p /= p.sum()
    need = int(min(np.count_nonzero(p), 5))
    ranks = list(range(need))
    exact = np.zeros((need, p.size))
    for seq, w in _wor_sequences(p, need):
        for r in ranks:
            exact[r, seq[r]] += w
    got, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    assert ex
    np.testing.assert_allclose(got[:, 0], exact, rtol=0, atol=EXACT)


@pytest.mark.parametrize("seed, concentration", [(0, 0.3), (1, 1.0), (2, 0.05), (3, 3.0)])
def test_race_laws_equal_the_sums_over_sets_of_earlier_draws(seed, concentration, monkeypatch):
    # V = 13, ranks up to 7 (too many ordered draws to enumerate); a small head, so the tail's series is used too
    import otspec.tree._bound as mod

    monkeypatch.setattr(mod, "_RACE_HEAD", 4)
    p = np.random.default_rng(seed).dirichlet(np.full(13, concentration))
    ranks = [0, 1, 2, 3, 5, 7]
    got, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    assert ex
    np.testing.assert_allclose(got[:, 0], _subset_laws(p, ranks), rtol=0, atol=EXACT)


def _rows(V):
    rng = np.random.default_rng(V)
    peaked = np.full(V, 1e-3 / (V - 1))
    peaked[7] = 1 - 1e-3
    geometric = 0.5 ** np.arange(1, V + 1)
    zipf = 1.0 / np.arange(1, V + 1)
    with_zeros = rng.dirichlet(np.full(V, 0.02))
    with_zeros[::3] = 0.0
    logits = 3.0 * rng.standard_normal(V)
    rows = [np.full(V, 1.0 / V), peaked, geometric, zipf, with_zeros, np.exp(logits - logits.max()),
            rng.dirichlet(np.full(V, 0.01))]
    return np.stack([r / r.sum() for r in rows])


@pytest.mark.parametrize("head", [8, 32, 200])
def test_race_laws_at_a_large_vocabulary_are_distributions_and_below_the_bound(head, monkeypatch):
    # V = 20,000: each rank's law sums to 1; the laws do not depend on how many tokens the head holds; they lie
    # below the stated upper bound; every row is accepted
    import otspec.tree._bound as mod

    P = _rows(20_000)
    ranks = [0, 1, 2, 4, 7]
    monkeypatch.setattr(mod, "_RACE_HEAD", 32)
    ref = _DrawLaws(P, ranks, np, exact_limit=0)
    monkeypatch.setattr(mod, "_RACE_HEAD", head)
    dl = _DrawLaws(P, ranks, np, exact_limit=0)
    bnd = _DrawLaws(P, ranks, np, exact_limit=0, race=False)
    assert dl.exact and dl.race.ok.all() and not bnd.exact
    for k in range(len(ranks)):
        law = dl.law(k)
        np.testing.assert_allclose(law.sum(axis=1), 1.0, rtol=0, atol=EXACT)
        np.testing.assert_allclose(law, ref.law(k), rtol=0, atol=EXACT * 1e-3)
        assert np.all(law <= bnd.law(k) + EXACT)
        assert np.all(law >= 0.0)


def test_rows_the_race_refuses_keep_the_stated_bound(monkeypatch):
    import otspec.tree._bound as mod

    P = _rows(3_000)[[1, 5]]
    ranks = [0, 1, 3]
    bnd = _DrawLaws(P, ranks, np, exact_limit=0, race=False)
    monkeypatch.setattr(mod, "_RACE_MAX_NODES", 4)         # the quadrature cannot finish: every row refused
    dl = _DrawLaws(P, ranks, np, exact_limit=0)
    assert not dl.exact and not dl.race.ok.any()
    for k in range(3):
        np.testing.assert_array_equal(dl.law(k), bnd.law(k))
    fused = _DrawLaws(P, ranks, np, exact_limit=0, fused=True)
    rows, cols = np.repeat(np.arange(2), 3000), np.tile(np.arange(3000), 2)
    np.testing.assert_array_equal(fused.at(2, rows, cols), bnd.law(2)[rows, cols])


@settings(max_examples=30, deadline=None)
@given(shape=shapes(max_nodes=5, max_depth=2), V=st.sampled_from([3, 4]), data=st.data())
def test_bound_with_the_race_is_the_enumerated_bound(shape, V, data):
    # enumeration of the draws refused everywhere: B equals the enumerated B, stays above OPT_c >= OPT_1, and is at
    # most the B of the stated upper bound
    import otspec.tree._bound as mod

    if max(r for p in shape.paths[1:] for r in p) + 1 > V:
        return
    draft, target = data.draw(markov_pairs(V))
    try:
        oc = optimum(shape, draft, target, process="wor", one_token=False, raise_on_failure=True).value
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return
    o1 = optimum(shape, draft, target, process="wor", raise_on_failure=True).value
    b_ref, B_ref, _ = _reference(shape, draft, target, "wor")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mod, "_MAX_WOR_ENUMERATION", 0)
        race = bound(shape, draft, target, process="wor", budget=10_000)
        mp.setattr(mod, "_WOR_RACE", False)
        old = bound(shape, draft, target, process="wor", budget=10_000)
    assert race.pi_exact and race.complete
    np.testing.assert_allclose(race.per_depth, b_ref, rtol=0, atol=EXACT)
    assert abs(race.value - B_ref) <= EXACT
    assert race.value >= oc - LP_TOL and oc >= o1 - LP_TOL
    assert race.value <= old.value + EXACT


def test_race_tightens_the_bound_at_a_large_vocabulary():
    # V = 1,000 (no enumeration): the race's B is exact and below the B of the stated upper bound, by a margin
    import otspec.tree._bound as mod

    draft = random_markov_model(1000, rng=31, concentration=0.05)
    target = random_markov_model(1000, rng=32, concentration=0.05)
    shape = TreeShape.branching(6, 4)
    race = bound(shape, draft, target, process="wor", budget=50)
    old_flag = mod._WOR_RACE
    try:
        mod._WOR_RACE = False
        old = bound(shape, draft, target, process="wor", budget=50)
    finally:
        mod._WOR_RACE = old_flag
    assert race.pi_exact and not old.pi_exact
    assert np.all(race.per_depth <= old.per_depth + EXACT)
    assert race.value < old.value - 1e-6


def test_race_laws_against_sampled_draws_chi_square():
    # an independent route by sampling: successive draws without replacement as the order of Gumbel-perturbed log
    # probabilities, 200,000 draws of V = 40 tokens; each rank's counts against the race's law by a chi-square test
    # at level 1e-4 per rank (3 ranks: a false failure at most 3e-4 for a random seed; the seed is fixed)
    from scipy.stats import chisquare

    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.full(40, 0.5))
    ranks = [2, 4, 6]
    laws, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    assert ex
    n = 200_000
    keys = np.log(p)[None, :] + rng.gumbel(size=(n, p.size))
    order = np.argsort(-keys, axis=1)[:, :7]
    for k, r in enumerate(ranks):
        expected = laws[k, 0] * n
        counts = np.bincount(order[:, r], minlength=p.size).astype(float)
        big = expected >= 5
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum())
        keep = exp > 0
        assert chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-4


@pytest.mark.parametrize("V, K, ties", [(5000, 32, False), (700, 32, True), (20, 32, False), (40, 8, True)])
def test_one_pass_row_stats_against_numpy(V, K, ties):
    """What one pass over a draft row gives the draws without replacement (support, most likely token, the head
    of K tokens by decreasing p with ties to the lower id, the tail's largest probability, the second draw's sums
    and the race's power sums) against numpy and math.fsum on the same row."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree._process import _ranked

    rng = np.random.default_rng(V + K)
    z = rng.normal(0, 3.0, V)
    if ties:
        z = np.round(z)                                   # many exactly equal probabilities
    p = np.exp(z - z.max())
    p[rng.random(V) < 0.1] = 0.0
    p /= p.sum()
    N = 48
    head, hval, nu, st = np.empty(K, np.int64), np.empty(K), np.zeros(N + 1), np.empty(7)
    mark = np.zeros(V, dtype=bool)
    _bound_kernels.wor_row_stats(p, K, True, head, hval, nu, mark, st)
    assert not mark.any()
    support = int(np.count_nonzero(p > 0))
    kh = min(K, support)
    order = _ranked(p)
    assert st[0] == support and st[1] == np.argmax(p) and st[2] == kh
    np.testing.assert_array_equal(head[:kh], order[:kh])
    np.testing.assert_array_equal(hval[:kh], p[order[:kh]])
    assert (head[kh:] == -1).all()
    tail = np.setdiff1d(np.flatnonzero(p > 0), order[:kh])
    pmax = p[tail].max() if tail.size else 0.0
    assert st[3] == pmax
    top = int(np.argmax(p))
    others = np.delete(p, top)
    rest = math.fsum(others.tolist())
    S2 = math.fsum((others / (1.0 - others)).tolist())
    assert _rel(st[4], rest) <= 1e-13 and _rel(st[6], S2) <= 1e-13
    assert _rel(st[5], S2 + p[top] / rest) <= 1e-13
    if tail.size:
        y = p[tail] / pmax
        for n in range(1, N + 1):
            want = math.fsum((y ** n).tolist())
            assert abs(nu[n] - want) <= 1e-13 * want + 1e-24 * nu[1], n   # terms below 1e-24 of the largest dropped





def _row_of_kind(kind: str, V: int, rng) -> np.ndarray:
    """A draft row of ``V`` entries: LLM-like, a grid with zeros and ties, one-hot, flat, rising along the
    vocabulary (with ties), or with many tokens at each power of 10**-0.5 (``tiers``)."""
    if kind == "llm":
        z = rng.normal(0, rng.uniform(1, 5), V)
        p = np.exp(z - z.max())
    elif kind == "grid":
        p = rng.choice([0.0, 0.0, 1.0, 2.0, 3.0, 1e-3, 1e-9], V)
    elif kind == "one-hot":
        p = np.zeros(V)
    elif kind == "flat":
        p = np.ones(V)
    elif kind == "rising":
        p = np.arange(1.0, V + 1.0) + rng.choice([0.0, 0.5], V)
    else:
        p = 10.0 ** rng.choice([0.0, -0.5, -1.0, -1.5, -2.0, -2.5, -3.0, -6.0], V)
    p[rng.integers(V)] = 1.0 if kind == "one-hot" or p.max() == 0 else p.max()
    return p / p.sum()

@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "rising"]),
       seed=st.integers(0, 10**6), K=st.sampled_from([1, 3, 32]))
def test_row_stats_head_against_ranked(V, kind, seed, K):
    # the head of wor_row_stats (its insertion pass visits only the blocks with an entry above the head's current
    # threshold) against the ranking of otspec.tree._process._ranked: ties by lower id, zeros, one-hot rows, rows
    # rising along the vocabulary (every block raises the threshold), V across block boundaries
    from otspec.tree._process import _ranked

    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    head, hval, nu, st_ = np.empty(K, np.int64), np.empty(K), np.zeros(49), np.empty(7)
    mark = np.zeros(V, dtype=bool)
    _bound_kernels.wor_row_stats(p, K, True, head, hval, nu, mark, st_)
    support = int(np.count_nonzero(p > 0))
    kh = min(K, support)
    order = _ranked(p)
    assert st_[0] == support and st_[1] == order[0] and st_[2] == kh
    np.testing.assert_array_equal(head[:kh], order[:kh])
    np.testing.assert_array_equal(hval[:kh], p[order[:kh]])
    assert (head[kh:] == -1).all() and not mark.any()
    assert st_[3] == (p[order[kh]] if support > kh else 0.0)

@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6),
       K=st.sampled_from([0, 1, 8, 32]))
def test_race_power_sums_against_fsum(V, kind, seed, K):
    # the race's power sums of a row's tail (race_moments_row: tokens up to 1e-2 of the tail's largest in the
    # sweep's lanes, the others from the gathered list, above 0.1 up to the last power) against math.fsum of every
    # power: zeros, ties, one-hot rows, LLM-like rows, rows with many tokens in each tier
    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    N = 48
    mark = np.zeros(V, dtype=bool)
    head = np.argsort(-p, kind="stable")[:min(K, V - 1)]
    mark[head] = True
    tail = p[~mark & (p > 0)]
    mx = float(tail.max()) if tail.size else 0.0
    nu = np.full(N + 1, np.nan)
    _bound_kernels.race_moments_row(p, mark, mx, nu)
    assert nu[0] == 0.0
    if mx == 0.0:
        assert (nu == 0.0).all()
        return
    y = tail / mx
    for n in range(1, N + 1):
        want = math.fsum((y ** n).tolist())
        # each token leaves out at most 1e-22 (its powers below it); nu[n] >= 1 (the largest has y = 1)
        assert abs(nu[n] - want) <= 1e-14 * want + 1e-22 * y.size, (n, nu[n], want)

@pytest.mark.parametrize("process", ["iid", "wor"])
def test_row_route_reads_the_laws_where_they_are(process):
    """With numba the laws handed over as rows are read where they are: no frontier is stacked into a block (the
    block route copied each frontier's draft and target laws, 2 * 32 * V * 8 bytes here), and the bound is the
    block route's."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    import tracemalloc

    from otspec.tree._bound import _sampled, _Slots

    V, shape = 20_000, TreeShape.branching(8, 4)
    rng = np.random.default_rng(11)

    def law():
        z = rng.normal(0, 3.0, V)
        p = np.exp(z - z.max())
        return p / p.sum()

    held: dict = {}

    def pair():
        return law(), law()

    _sampled(_Slots(shape), process, HeldLaws(held, pair), 33, 32)     # every law made and held before tracing
    tracemalloc.start()
    try:
        got = _sampled(_Slots(shape), process, HeldLaws(held, pair), 33, 32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    block = 32 * V * 8
    assert peak < block / 4, peak

    class Stacked(HeldLaws):
        def __call__(self, paths):
            P, Q = super().__call__(paths)
            return np.stack(P), np.stack(Q)

    ref = _sampled(_Slots(shape), process, Stacked(held, pair), 33, 32)
    assert got.value == ref.value and got.n_expanded == ref.n_expanded == 33


class HeldLaws:
    """A model of a frontier's laws for ``otspec.tree._bound._sampled``: per call, the draft rows and the target rows
    of the paths, each path's pair made once by ``make()`` and kept in ``held`` (a dict that instances may share: the
    same laws again), the calls counted in ``calls``."""

    def __init__(self, held: dict, make):
        self.held, self.make, self.calls = held, make, 0

    def __call__(self, paths):
        self.calls += 1
        for s in paths:
            if tuple(s) not in self.held:
                self.held[tuple(s)] = self.make()
        return [self.held[tuple(s)][0] for s in paths], [self.held[tuple(s)][1] for s in paths]


def _race_case(kind: str, V: int, seed: int, K: int, R: int):
    """A row of ``kind`` for the race's kernels with its generator and the ranks ``2..R-1``, ``(rng, p, ranks)``;
    None where the row has no tail beyond a head of ``K`` tokens."""
    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    if np.count_nonzero(p) <= K + 1:
        return None
    return rng, p, np.arange(2, R, dtype=np.int64)


# --------------------------------------------------------------------------- the last depth: pi only where it can be the minimum
@st.composite
def law_rows(draw, V):
    """A draft or target row: a grid with zeros and ties, a one-hot row, or LLM-like (softmax of wide logits, some
    exact zeros)."""
    kind = draw(st.sampled_from(["grid", "onehot", "llm", "llm"]))
    if kind == "grid":
        a = np.array(draw(st.lists(st.sampled_from([0, 0, 1, 1, 2, 5, 1000]), min_size=V, max_size=V)), float)
    elif kind == "onehot":
        a = np.zeros(V)
        a[draw(st.integers(0, V - 1))] = 1.0
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        z = rng.normal(0, draw(st.sampled_from([0.5, 3.0, 8.0])), V)
        a = np.exp(z - z.max())
        a[rng.random(V) < 0.05] = 0.0
    if a.sum() == 0:
        a[0] = 1.0
    return a / a.sum()


_LAST_SHAPES = [TreeShape.branching(3, 2), TreeShape.branching(2, 4), TreeShape.branching(8, 7),
                TreeShape([(0,), (1,), (0, 0), (0, 1), (0, 2), (1, 0)])]


@settings(max_examples=80, deadline=None)
@given(process=st.sampled_from(["iid", "wor"]), shape=st.sampled_from(_LAST_SHAPES),
       V=st.sampled_from([2, 3, 8, 60, 700, 3000]), data=st.data())
def test_last_depth_rows_against_the_whole_evaluation(process, shape, V, data):
    """Rows of the last expanded depth (no caps, no candidates), where the row kernels decide most entries by a
    lower bound on pi and evaluate pi only at the others: each row's sum of min(Q, pi) within 1e-13 of
    math.fsum over the numpy route's entries (pi of every child, numba off; without replacement at any size by
    the race, the enumeration turned off), and for i.i.d. children bit for bit the kernel's whole evaluation."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    slots = B._Slots(shape)
    j = 1
    need = slots.need[j]
    m = data.draw(st.integers(1, 4))
    P = np.stack([data.draw(law_rows(V)) for _ in range(m)])
    Q = np.stack([data.draw(law_rows(V)) for _ in range(m)])
    if process == "wor" and (np.count_nonzero(P, axis=1) < need).any():
        return
    unit = st.floats(0.0, 1.0, allow_nan=False)
    scale = st.sampled_from([1.0, 0.1, 1e-3, 1e-6])          # slot weights from about Q_u to far below it
    frontier = []
    for i in range(m):
        a = data.draw(scale) * np.array([data.draw(unit) for _ in range(slots.n_at[1])])
        frontier.append(B._Prefix((i,), data.draw(unit), 0.5, a, (data.draw(scale) * data.draw(unit),), {}))
    limit = B._MAX_WOR_ENUMERATION
    B._MAX_WOR_ENUMERATION = 0                      # the row route at any size (the race, not the enumeration)
    try:
        got = B._expand_rows(slots, process, frontier, list(P), list(Q), 10**6)
        assert got[0] is None
        pi = _whole_pi(slots, process, frontier, P)
    finally:
        B._MAX_WOR_ENUMERATION = limit
    _check_last_depth_sums(process, slots, frontier, P, Q, pi)


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 2)])
@pytest.mark.parametrize("sigma, scale", [(3.0, 1.0), (8.0, 1e-2), (8.0, 1e-4)])
def test_last_depth_rows_of_llm_like_laws(process, shape, sigma, scale):
    """The same check on whole frontiers of LLM-like laws at V = 5000 (softmax of Gaussian logits, some exact
    zeros; draft and target independent, so that many entries fall on either side of pi), slot weights and draft
    path probabilities from about Q_u to far below it."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    rng = np.random.default_rng(int(sigma * 7 + 1 / scale))
    V, m = 5000, 6
    slots = B._Slots(shape)

    def law():
        z = rng.normal(0, sigma, V)
        p = np.exp(z - z.max())
        p[rng.random(V) < 0.05] = 0.0
        return p / p.sum()

    P, Q = np.stack([law() for _ in range(m)]), np.stack([law() for _ in range(m)])
    frontier = [B._Prefix((i,), float(rng.random()), 0.5, scale * rng.random(slots.n_at[1]),
                          (scale * float(rng.random()),), {}) for i in range(m)]
    assert B._expand_rows(slots, process, frontier, list(P), list(Q), 10**6)[0] is None
    _check_last_depth_sums(process, slots, frontier, P, Q, _whole_pi(slots, process, frontier, P))


def _llm_laws(rng, m: int, V: int) -> np.ndarray:
    """``m`` LLM-like draft rows over ``V`` tokens: softmax of Gaussian logits of scale 3."""
    z = rng.normal(0, 3.0, (m, V))
    P = np.exp(z - z.max(axis=1, keepdims=True))
    return P / P.sum(axis=1, keepdims=True)


def _whole_pi(slots, process, frontier, P):
    """pi of every child of the frontier's prefixes by the numpy route (numba off): the whole evaluation."""
    from otspec.tree import _bound as B

    A = np.stack([u.A for u in frontier])
    s_all = np.array([u.s for u in frontier])
    jit = _bound_kernels.JIT
    _bound_kernels.JIT = False
    try:
        return B._child_pi(slots, process, A, s_all, P, [u.path for u in frontier])[0]
    finally:
        _bound_kernels.JIT = jit


def _check_last_depth_sums(process, slots, frontier, P, Q, pi):
    """Each row's exact level against math.fsum of min(Q, pi) over the whole evaluation's entries (1e-13), and for
    i.i.d. children bit for bit the kernel's whole evaluation (pi at every entry)."""
    m, V = P.shape
    j = 1
    sums = [u.exact for u in frontier]
    s_all = np.array([u.s for u in frontier])
    Qc = np.array([u.Q for u in frontier])[:, None] * Q
    for i in range(m):
        want = math.fsum(np.minimum(Qc[i], pi[i]).tolist())
        assert abs(sums[i] - want) <= 1e-13 * want + 1e-300, (i, sums[i], want)
    if process == "iid":
        prog = _bound_kernels.iid_program(*slots.iid_classes(j))
        for i in range(m):
            whole = np.zeros(1)
            _bound_kernels.iid_row(P[i], Q[i], float(frontier[i].Q), s_all[i], j, *prog, np.zeros(0), whole,
                                   np.empty(V), np.empty(V))
            assert sums[i] == whole[0]


def _inclusion(p, n):
    """P(x in the first n draws without replacement) for every token x, by enumerating the ordered draws."""
    out = np.zeros(p.shape[0])
    for seq, w in _wor_sequences(p, n):
        out[list(seq)] += w
    return out


@settings(max_examples=60, deadline=None)
@given(p=st.lists(st.sampled_from([0, 1, 1, 2, 3, 10, 50]), min_size=2, max_size=6), data=st.data())
def test_lower_bounds_on_pi_without_replacement_against_enumeration(p, data):
    """The lower bounds the row kernels decide entries by, against the inclusion probabilities enumerated:
    P(x in S_n) >= 1 - (1 - p_x)^n and >= I_2 + (1 - I_2)(1 - (1 - p_x)^(n - 2)) (I_2 the exact first two draws),
    and the kernels' weighted bound (``wor_lower``, the slope at SLOPE_AT, ``wor_row_recheck``) below
    min(1, sum_r W_r P(draw r = x)) for nonincreasing weights W."""
    p = np.array(p, float)
    if p.sum() == 0:
        p[0] = 1.0
    p /= p.sum()
    R = int(np.count_nonzero(p))
    inc = {n: _inclusion(p, n) for n in range(1, R + 1)}
    for n in range(1, R + 1):
        assert np.all(inc[n] >= 1 - (1 - p) ** n - EXACT)
        if n >= 2:
            assert np.all(inc[n] >= inc[2] + (1 - inc[2]) * (1 - (1 - p) ** (n - 2)) - EXACT)
    W = np.sort(np.array([data.draw(st.floats(0.0, 3.0)) for _ in range(R)]))[::-1]
    dW = np.ascontiguousarray(W - np.append(W[1:], 0.0))
    pi = np.minimum(1.0, sum(dW[n - 1] * inc[n] for n in range(1, R + 1)))
    for x in range(p.shape[0]):
        assert _bound_kernels.wor_lower(dW, float(p[x])) <= pi[x] + EXACT
    # the recheck decides an entry only below its pi: every entry's target just above the bound stays undecided
    top = int(np.argmax(p))
    t = np.where(p < 1, p / np.where(p < 1, 1 - p, 1), 0.0)
    S2 = math.fsum(np.delete(t, top).tolist())
    rest = math.fsum(np.delete(p, top).tolist())
    S1 = S2 + (p[top] / rest if rest > 0 else 0.0)
    idx = np.arange(p.shape[0], dtype=np.int32)   # the index type the bound passes: one compilation
    q = np.minimum(pi * (1 + 1e-6) + 1e-300, 1.0)   # Q_u q_x just above pi_x: never decided
    out = np.array([0.0, p.shape[0], 0.0])
    _bound_kernels.wor_row_recheck(p, q, 1.0, idx, top, S1, S2, dW, out)
    decided = np.setdiff1d(np.arange(p.shape[0]), idx[:int(out[1])])
    assert np.all(q[decided] <= pi[decided] + EXACT)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iid_pi_is_concave_in_the_child_probability(seed):
    """The i.i.d. recursion's pi(ux) as a function of p(x | u) is concave with pi = 0 at 0, so pi(p) >= p pi(P) / P
    for p <= P (the slope the row kernel decides entries by): checked on a grid for several shapes."""
    from otspec.tree._bound import _iid_pi, _Slots

    rng = np.random.default_rng(seed)
    grid = np.concatenate([[0.0], np.geomspace(1e-12, 1.0, 400)])
    for shape in (TreeShape.branching(8, 7), TreeShape.branching(3, 2, 2), TreeShape([(0,), (1,), (0, 0), (0, 1),
                                                                                         (1, 0), (0, 0, 0)])):
        slots = _Slots(shape)
        for j in range(1, slots.D):
            s_all = rng.random((1, j))
            f = _iid_pi(slots, j, s_all, grid[None, :])[0]
            slope = f[1:] / grid[1:]
            assert f[0] == 0.0 and np.all(np.diff(slope) <= 1e-12 * slope[:-1])


def test_last_depth_rows_skip_the_race_where_the_draft_covers_the_target(monkeypatch):
    """Without replacement at the last depth, a row whose every target entry lies below the lower bound on pi needs
    neither the row's stats nor the race's quadrature (the code before ran both for every row)."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    V, m = 5000, 3
    rng = np.random.default_rng(5)
    P = _llm_laws(rng, m, V)
    slots = B._Slots(TreeShape.branching(8, 7))
    frontier = [B._Prefix((i,), 0.05, 0.5, np.full(8, 0.5), (0.3,), {}) for i in range(m)]

    def refuse(*a, **k):
        raise AssertionError("the race ran")

    # the route compiled before the patch (a compiled kernel cannot call a Python function: without numba's cache
    # of the kernels, their first compilation would otherwise meet the patched global)
    B._expand_rows(slots, "wor", [B._Prefix((i,), 0.05, 0.5, np.full(8, 0.5), (0.3,), {}) for i in range(m)],
                   list(P), list(P), 10**6)
    monkeypatch.setattr(_bound_kernels, "race_rows", refuse)
    monkeypatch.setattr(_bound_kernels, "wor_row_stats", refuse)
    assert B._expand_rows(slots, "wor", frontier, list(P), list(P), 10**6)[0] is None
    for u in frontier:
        assert u.exact == pytest.approx(0.05, rel=1e-13)          # every entry min(Q, pi) = Q: the row sums to Q_u


@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 2)])
def test_last_depth_entries_left_at_head_tokens(shape, monkeypatch):
    """Entries left at the draft's most likely tokens (the target puts 0.7 of its mass on the draft's third most
    likely token): pi there from the race's laws of the head (or, with two children
    per slot, the closed forms alone), the row sums against the whole evaluation; each row's entries left as
    ``wor_row_at`` reads them (rows as separate arrays) and as ``wor_rows_at`` reads them (rows of one array)."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    rng = np.random.default_rng(17)
    V, m = 3000, 4
    slots = B._Slots(shape)
    P, Q = np.empty((m, V)), np.empty((m, V))
    for i in range(m):
        z = rng.normal(0, 3.0, V)
        P[i] = np.exp(z - z.max())
        P[i] /= P[i].sum()
        Q[i] = 0.3 * P[i]
        Q[i, np.argsort(-P[i])[2]] += 0.7
    # slot weights summing to 0.4: pi >= 0.4 p(x) decides the bulk (Q_u q = 0.27 p), not the spike (Q_u q > 0.63)
    seen = []
    at, rows_at = _bound_kernels.wor_row_at, _bound_kernels.wor_rows_at

    def spy(p, q, Qu, idx, top, S1, S2, w01, H, rok, pmax, theta, head, HLw):
        seen.append((bool(rok), bool(np.isin(idx, np.argsort(-p)[:3]).any())))
        return at(p, q, Qu, idx, top, S1, S2, w01, H, rok, pmax, theta, head, HLw)

    def rows_spy(P, pr, Q, qr, ii, Qu, codes, left, lo, st, w01, H, rok, *rest):
        for k, i in enumerate(ii.tolist()):      # each row's entries left, as wor_rows_at reads them
            if codes[i] >= 2:
                idx = left[i, :int(lo[i, 1])]
                seen.append((bool(rok), bool(np.isin(idx, np.argsort(-P[pr[k]])[:3]).any())))
        return rows_at(P, pr, Q, qr, ii, Qu, codes, left, lo, st, w01, H, rok, *rest)

    # the rows as separate arrays (one wor_row_at per row), then as rows of one array (one wor_rows_at, compiled
    # with the kernel wor_row_at: that one is not replaced then)
    for Prows, Qrows, name, fn in (([p.copy() for p in P], [q.copy() for q in Q], "wor_row_at", spy),
                                   (list(P), list(Q), "wor_rows_at", rows_spy)):
        monkeypatch.undo()
        monkeypatch.setattr(_bound_kernels, name, fn)
        seen.clear()
        frontier = [B._Prefix((i,), 0.9, 0.5, np.full(slots.n_at[1], 0.4 / slots.n_at[1]), (0.01,), {})
                    for i in range(m)]
        assert B._expand_rows(slots, "wor", frontier, Prows, Qrows, 10**6)[0] is None
        assert len(seen) == m and all(hit for _rok, hit in seen)
        assert all(rok == (slots.need[1] > 2) for rok, _hit in seen)
        _check_last_depth_sums("wor", slots, frontier, P, Q, _whole_pi(slots, "wor", frontier, P))


@settings(max_examples=40, deadline=None)
@given(V=st.integers(2, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6), race=st.booleans(), scale=st.sampled_from([0.05, 0.3, 0.9, 3.0]))
def test_row_decide_against_its_passes(V, kind, seed, race, scale):
    """``wor_row_decide`` (the last depth's row up to the race in one call) against its passes called one by one as
    before: ``wor_row_last``, ``wor_row_stats`` without the power sums, ``race_moments_row`` on the tail and
    ``wor_row_recheck``: the same entries left, the same decided sum, head, stats and power sums, bit for bit, and
    the code says whether a head token is left. Rows with zeros, ties, one-hot, flat and rising rows; targets from
    the draft (scaled: all decided) to far above it (many left: more than ``big``)."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    q = _row_of_kind(["llm", "grid", "flat", "tiers"][seed % 4], V, rng)
    Qu = float(scale)
    W = np.sort(rng.uniform(0.0, 1.0, 7))[::-1]
    dW = np.ascontiguousarray(W - np.append(W[1:], 0.0))
    K, N = min(32, V), 48
    big = int(rng.choice([V // 16, V]))
    # before: the passes one by one
    idx0, lo0 = np.empty(V, np.int32), np.zeros(3)
    head0, hval0, nu0, st0 = np.empty(K, np.int64), np.empty(K), np.zeros(N + 1), np.zeros(7)
    mark = np.zeros(V, dtype=bool)
    _bound_kernels.wor_row_last(p, q, Qu, dW, idx0, lo0)
    want = 0
    if lo0[1] > 0:
        _bound_kernels.wor_row_stats(p, K, False, head0, hval0, nu0, mark, st0)
        if race:
            kh = int(st0[2])
            mark[head0[:kh]] = True
            _bound_kernels.race_moments_row(p, mark, float(st0[3]), nu0)
            mark[head0[:kh]] = False
        if lo0[1] > big:
            want = 1
        else:
            _bound_kernels.wor_row_recheck(p, q, Qu, idx0, int(st0[1]), float(st0[5]), float(st0[6]), dW, lo0)
            n = int(lo0[1])
            want = 0 if n == 0 else 3 if np.isin(idx0[:n], head0[:int(st0[2])]).any() else 2
    else:
        st0[0] = lo0[0]
    # after: one call
    idx, lo = np.empty(V, np.int32), np.zeros(3)
    head, hval, nu, st_ = np.empty(K, np.int64), np.empty(K), np.zeros(N + 1), np.zeros(7)
    got = _bound_kernels.wor_row_decide(p, q, Qu, dW, idx, lo, K, race, big, head, hval, nu, mark, st_)
    assert got == want and not mark.any()
    np.testing.assert_array_equal(lo, lo0)
    np.testing.assert_array_equal(idx[:int(lo[1])], idx0[:int(lo0[1])])
    assert st_[0] == st0[0]
    if lo0[1] > 0 or want:
        np.testing.assert_array_equal(st_, st0)
        np.testing.assert_array_equal(head, head0)
        np.testing.assert_array_equal(hval, hval0)
        np.testing.assert_array_equal(nu, nu0)


@settings(max_examples=30, deadline=None)
@given(V=st.integers(40, 3000), kind=st.sampled_from(["llm", "grid", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6), K=st.sampled_from([1, 8, 32]), R=st.integers(3, 8))
def test_race_rows_without_head_laws_keep_the_tail(V, kind, seed, K, R):
    """The race's quadrature for rows whose head laws are not read (the whole suffix product rolled in one buffer)
    against the same rows with them: the tail's Taylor coefficients, the nodes and the last ``t`` bit for bit, the
    head's laws left 0 (a wrong roll changes PB and so every coefficient)."""
    from otspec.tree._bound import _RACE_MAX_NODES, _RACE_T0, _race_step, _stirling

    case = _race_case(kind, V, seed, K, R)
    if case is None:
        return
    rng, p, ranks = case
    N = 48
    deg = int(ranks.max()) + 1
    order = np.argsort(-p, kind="stable")
    head = np.ascontiguousarray(order[:K])
    mark = np.zeros(V, dtype=bool)
    mark[head] = True
    pmax = float(p[~mark].max())
    nu = np.zeros((1, N + 1))
    _bound_kernels.race_moments_row(p, mark, pmax, nu[0])
    out = {}
    for heads in (True, False):
        HL, HL2 = np.zeros((1, len(ranks), K)), np.zeros((1, len(ranks), K))
        C, C2, info = np.zeros((1, len(ranks), N + 1)), np.zeros((1, len(ranks), N + 1)), np.zeros((1, 3))
        _bound_kernels.race_rows(p[head][None, :].copy(), np.array([K]), np.array([pmax]), nu, ranks, deg,
                                 _race_step(deg - 1), math.log(_RACE_T0), _stirling(deg, N), _RACE_MAX_NODES, HL, HL2, C, C2,
                                 info, np.array([heads]))
        out[heads] = (HL, HL2, C, C2, info)
    for a, b in zip(out[True][2:], out[False][2:]):
        np.testing.assert_array_equal(a, b)
    assert (out[False][0] == 0).all() and (out[False][1] == 0).all() and (out[True][0] > 0).any()


@settings(max_examples=40, deadline=None)
@given(V=st.integers(2, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6), K=st.sampled_from([0, 1, 8, 32]))
def test_race_power_sums_lanes_bit_for_bit(V, kind, seed, K):
    """The race's power sums' lanes (``moments_block``: the small tokens' error-free split at ``split_point`` and
    their powers 2 .. 10, each product formed once per entry in one sweep of each block) against the lanes built
    block by block in numpy (``q = (sigma + w) - sigma`` and ``w - q``; ``y2 = w w``, ``y2 w``, ``y2 y2``;
    ``y4 w``, ``y3 y3``, ``y4 y3``; ``y8``, ``y8 w``, ``y8 y2``), each lane summed in block order: every lane and
    the gathered tokens (above 1e-2, the marked ones left out) bit for bit (so ``race_moments_row``'s sums, which
    finish from them, too)."""
    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    B = _bound_kernels.BLOCK
    mark = np.zeros(V, dtype=bool)
    mark[np.argsort(-p, kind="stable")[:min(K, V - 1)]] = True
    tail = p[~mark & (p > 0)]
    if tail.size == 0:
        return
    inv = 1.0 / float(tail.max())
    sig = _bound_kernels.split_point(V)
    s0k, s1k, ybk, Ak, bigk = _bound_kernels.moments_scratch(V)
    k = 0
    s0, s1, A = np.zeros(B), np.zeros(B), np.zeros((11, B))
    big = []
    for v0 in range(0, V, B):
        b = min(B, V - v0)
        k = _bound_kernels.moments_block(p[v0:v0 + b], mark[v0:v0 + b], b, inv, sig, s0k, s1k, ybk, Ak, bigk, k)
        y = p[v0:v0 + b] * inv
        w = np.where(y <= 1e-2, y, 0.0)
        q = (sig + w) - sig
        s0[:b] += q
        s1[:b] += w - q
        y2 = w * w
        y3, y4 = y2 * w, y2 * y2
        y8 = y4 * y4
        for n, term in zip(range(2, 11), (y2, y2 * w, y2 * y2, y4 * w, y3 * y3, y4 * y3, y8, y8 * w, y8 * y2)):
            A[n, :b] += term
        big.extend(y[(y > 1e-2) & ~mark[v0:v0 + b]].tolist())
    np.testing.assert_array_equal(s0k, s0)
    np.testing.assert_array_equal(s1k, s1)
    np.testing.assert_array_equal(Ak[2:], A[2:])
    assert k == len(big) and bigk[:k].tolist() == big


def test_row_blocks_only_for_rows_of_arrays():
    """``_row_blocks``: a frontier's rows that are rows of arrays (any order, any of their rows, a 3-d array's too,
    several arrays: one group per pair) as those arrays and row numbers (no copy); None where a row is a copy or
    not float64."""
    from otspec.tree._bound import _row_blocks

    rng = np.random.default_rng(0)
    X, Y, Z = rng.random((5, 7)), rng.random((2, 3, 7)), rng.random((4, 7))
    for order in ([0, 1, 2, 3, 4], [3, 0, 4], [2, 2, 1]):
        (P, pr, Q, qr, ii), = _row_blocks([X[i] for i in order], [Z[i % 4] for i in order])
        assert np.shares_memory(P, X) and np.shares_memory(Q, Z) and ii.tolist() == list(range(len(order)))
        assert np.array_equal(P[pr], X[order]) and np.array_equal(Q[qr], Z[[i % 4 for i in order]])
    Prows, Qrows = [X[1], Y[1, 2], X[0], Y[0, 1]], [Z[0], Z[1], Z[2], Z[3]]
    groups = _row_blocks(Prows, Qrows)
    assert len(groups) == 2 and sorted(np.concatenate([g[4] for g in groups]).tolist()) == [0, 1, 2, 3]
    for P, pr, Q, qr, ii in groups:
        for k, i in enumerate(ii.tolist()):
            assert np.shares_memory(P[pr[k]], Prows[i]) and np.array_equal(P[pr[k]], Prows[i])
            assert np.array_equal(Q[qr[k]], Qrows[i])
    assert _row_blocks([X[0], X[1].copy()], [Z[0], Z[1]]) is None
    assert _row_blocks([X[0]], [Z[0].copy()]) is None
    assert _row_blocks([X.astype(np.float32)[i] for i in range(2)], [Z[0], Z[1]]) is None
    W = rng.random((7, 5))                                   # a column (strided) and rows of a transposed array
    assert _row_blocks([X[0], W[:, 0]], [Z[0], Z[1]]) is None
    assert _row_blocks([X[0], W.T[1]], [Z[0], Z[1]]) is None
    assert _row_blocks([X[0], X[:, :6][1]], [Z[0], Z[1]]) is None
    assert _row_blocks([X[0], X[1]], [Z[0], X[1:3].ravel()[2:9]]) is None     # 8 bytes off a row's start


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 2, 2)])
def test_frontier_in_one_call_equals_row_by_row(process, shape):
    """A frontier whose rows are rows of arrays (one kernel call per array: ``iid_rows``, ``wor_rows_decide``) against
    the same rows as separate arrays (one call per row): the same exact levels, caps' sums and candidates, bit for
    bit, at every depth (LLM-like rows; targets that leave entries to the race, at head and tail tokens)."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    rng = np.random.default_rng(3)
    V, m = 2500, 6
    slots = B._Slots(shape)
    P = _llm_laws(rng, m, V)
    w = rng.normal(0, 3.0, (m, V))
    mix = np.array([0.5, 0.02, 0.02, 0.002, 0.002, 0.0])[:, None]     # rows with many, few and no entries left
    Q = (1 - mix) * P + mix * np.exp(w - w.max(axis=1, keepdims=True)) / np.exp(w - w.max(axis=1, keepdims=True)).sum(
        axis=1, keepdims=True)
    Q[1::2, np.argsort(-P[0])[1]] += 0.3
    Q /= Q.sum(axis=1, keepdims=True)
    for j in range(slots.D):
        n_at = slots.n_at[j]
        out = []
        order = rng.permutation(m)                        # rows of arrays in any order (tree calls' rows)
        P2, Q2 = P.copy(), Q.copy()                       # half the rows from a second call
        for rows in ([(P, P2)[i % 2][i] for i in order], [P[i].copy() for i in order]):
            qrows = [(Q, Q2)[i % 2][i] for i in order] if rows[0].base is not None else [Q[i].copy() for i in order]
            frontier = [B._Prefix(tuple(range(i, i + j)), 0.9, 0.5, np.full(n_at, 0.6 / n_at), (0.2,) * j, {})
                        for i in range(m)]
            cand, ex, dropped = B._expand_rows(slots, process, frontier, rows, qrows, 10**6)
            out.append(([(u.exact, sorted(u.S.items())) for u in frontier], ex, dropped,
                        None if cand is None else {k: v for k, v in cand.items() if k != "owner"}))
        (a, exa, da, ca), (b, exb, db, cb) = out
        assert a == b and exa == exb and da == db
        assert (ca is None) == (cb is None)
        if ca is not None:
            for k in ca:
                if isinstance(ca[k], dict):
                    for d in ca[k]:
                        np.testing.assert_array_equal(ca[k][d], cb[k][d])
                elif ca[k] is not None:
                    np.testing.assert_array_equal(ca[k], cb[k])


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 2, 2)])
def test_children_of_a_block_equal_one_by_one(process, shape):
    """``_children`` (a block's selected candidates made at once, the frontier's step of the search) against
    ``_child`` for each: the same path, Q, pi, slot weights, draft path and caps, bit for bit, for candidates of
    several owners in any order, at every depth above the last (LLM-like rows, the numpy route and the row route)."""
    from otspec.tree import _bound as B

    rng = np.random.default_rng(8)
    V, m = 600, 4
    slots = B._Slots(shape)
    P = _llm_laws(rng, m, V)
    Q = 0.7 * P + 0.3 * rng.dirichlet(np.ones(V), m)
    seen = 0
    for j in range(slots.D - 1):
        n_at = slots.n_at[j]
        frontier = [B._Prefix(tuple(range(i, i + j)), 0.9, 0.5, rng.uniform(0.01, 0.2, n_at), (0.2,) * j, {})
                    for i in range(m)]
        for route in ("block", "rows"):
            if route == "rows" and not _bound_kernels.JIT:
                continue
            cand = (B._expand(slots, process, frontier, P, Q, 10**6) if route == "block" else
                    B._expand_rows(slots, process, frontier, list(P), list(Q), 10**6))[0]
            n = cand["x"].shape[0]
            ks = rng.permutation(n)[:min(n, 50)].tolist()
            got = B._children(slots, process, cand, ks)
            for k, c in zip(ks, got):
                want = B._child(slots, process, cand, k)
                assert (c.path, c.Q, c.pi, c.s, c.caps) == (want.path, want.Q, want.pi, want.s, want.caps)
                assert c.A.shape == want.A.shape and c.A.tobytes() == want.A.tobytes()
                seen += 1
            assert len({id(cand["owner"][k]) for k in ks}) > 1             # candidates of several owners
    assert seen > 0


def test_race_rows_accepted_in_different_rounds_as_alone():
    """``_Race`` over rows accepted in different rounds (heads grown from 32 to 128 tokens: 40 tied tokens; rows with
    fewer tokens than the head; LLM-like rows; a row left out) against each row's race alone: the same head, head
    laws, Taylor coefficients, thresholds and tail maximum, bit for bit; places past a row's head -1 (laws 0)."""
    from otspec.tree import _bound as B

    rng = np.random.default_rng(5)
    V = 2000
    tied = np.full(V, 1e-7)
    tied[:40] = 1.0
    few = np.zeros(V)
    few[rng.choice(V, 20, replace=False)] = rng.random(20) + 0.1
    P = np.stack([_row_of_kind("llm", V, rng), tied, few, _row_of_kind("tiers", V, rng), tied[::-1].copy()])
    P /= P.sum(axis=1, keepdims=True)
    for kw in ({}, {"weights": rng.random((5, 2))}):
        rows = [0, 1, 2, 4]
        race = B._Race(P, [2, 3], rows, **kw)
        assert race.ok[rows].all() and not race.ok[3] and race.head.shape[1] == 128
        assert (race.head[3] == -1).all() and not race.HL[3].any() and not race.C[3].any()
        for i in rows:
            one = B._Race(P[i:i + 1], [2, 3], [0], **({"weights": kw["weights"][i:i + 1]} if kw else {}))
            w = one.head.shape[1]
            np.testing.assert_array_equal(race.head[i, :w], one.head[0])
            assert (race.head[i, w:] == -1).all() and not race.HL[i, :, w:].any()
            kh = int((race.head[i] >= 0).sum())
            assert kh == min(np.count_nonzero(P[i]), w) and (race.head[i, kh:] == -1).all()
            assert not race.HL[i, :, kh:].any()
            np.testing.assert_array_equal(race.HL[i, :, :w], one.HL[0])
            np.testing.assert_array_equal(race.C[i], one.C[0])
            np.testing.assert_array_equal(race.theta[i], one.theta[0])
            assert race.pmax[i] == one.pmax[0]


@pytest.mark.parametrize("kind", ["llm", "grid", "tiers"])
def test_race_at_compiled_equals_numpy(kind, monkeypatch):
    """The race's laws at a few entries (``_race_at``: the candidates' draws) by the compiled loop against numpy's
    operations (the route without numba), bit for bit: tail tokens, head tokens, zeros, every rank."""
    if not _bound_kernels.RACE_JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    rng = np.random.default_rng(11)
    V, m = 1500, 4
    P = np.stack([_row_of_kind(kind, V, rng) for _ in range(m)])
    race = B._Race(P, [2, 3, 5], list(range(m)))
    assert race.ok.all()
    rows = np.repeat(np.arange(m), 60).astype(np.int64)
    cols = np.concatenate([np.concatenate([np.argsort(-P[i], kind="stable")[:20], rng.integers(0, V, 40)])
                           for i in range(m)]).astype(np.int64)
    p = P[rows, cols]
    for kk in range(3):
        got = B._race_at(race, kk, p, rows, cols)
        monkeypatch.setattr(_bound_kernels, "RACE_JIT", False)
        want = B._race_at(race, kk, p, rows, cols)
        monkeypatch.setattr(_bound_kernels, "RACE_JIT", True)
        np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(V=st.integers(40, 3000), kind=st.sampled_from(["llm", "grid", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6), K=st.sampled_from([1, 8, 32]), R=st.integers(3, 8), heads=st.booleans())
def test_race_rows_weighted_equals_the_ranks_combined(V, kind, seed, K, R, heads):
    """The race with the ranks' laws combined by slot weights inside the quadrature (``race_rows_weighted``: per node
    :math:`g_q = \\sum_k w_k \\mathrm{PB}_{r_k - q}`, then one sum over ``q`` per degree) against each rank's laws
    (``race_rows``) combined afterwards (steps ``h`` and ``2h``): the head's laws within 1e-13 of the weighted laws,
    the tail's Taylor coefficients within 1e-13 of the weighted sum of their absolute values over the degrees (what
    bounds the change of :math:`p \\sum_n C_n x^n` for :math:`x \\le 1`; single coefficients cancel), the nodes and
    the last ``t`` the same. Weights with zeros; rows
    with zeros, ties, flat and rising rows. It fails when a rank's shift ``r_k - q`` or the sign of ``q`` is
    wrong."""
    from otspec.tree._bound import _RACE_MAX_NODES, _RACE_T0, _race_step, _stirling

    case = _race_case(kind, V, seed, K, R)
    if case is None:
        return
    rng, p, ranks = case
    N = 48
    nk, deg = ranks.shape[0], int(ranks.max()) + 1
    w = rng.choice([0.0, 0.1, 0.5, 1.0, 3.0], nk)
    head = np.ascontiguousarray(np.argsort(-p, kind="stable")[None, :K])          # the head; the tail's moments
    pmax, nu = np.zeros(1), np.zeros((1, N + 1))
    _bound_kernels.race_moments(p[None, :], head, np.zeros(V, dtype=bool), pmax, nu)
    args = (p[head[0]][None, :].copy(), np.array([K]), pmax, nu, ranks)
    rest = (deg, _race_step(deg - 1), math.log(_RACE_T0), _stirling(deg, N), _RACE_MAX_NODES)
    per = [np.zeros((1, nk, K)), np.zeros((1, nk, K)), np.zeros((1, nk, N + 1)), np.zeros((1, nk, N + 1)),
           np.zeros((1, 3))]
    _bound_kernels.race_rows(*args, *rest, *per, np.array([heads]))
    got = [np.zeros((1, 1, K)), np.zeros((1, 1, K)), np.zeros((1, 1, N + 1)), np.zeros((1, 1, N + 1)),
           np.zeros((1, 3))]
    _bound_kernels.race_rows_weighted(*args, w[None, :].copy(), *rest, *got, np.array([heads]))
    for j, (a, b) in enumerate(zip(per[:4], got[:4])):
        want = np.einsum("k,kn->n", w, a[0])
        scale = np.einsum("k,kn->n", w, np.abs(a[0]))
        if j < 2:                    # the head's laws: sums of positive terms, entry by entry
            assert (np.abs(b[0, 0] - want) <= 1e-13 * scale + 1e-300).all()
        else:                        # Taylor coefficients (alternating sums): the law p sum_n C_n x^n, x in [0, 1]
            assert np.abs(b[0, 0] - want).sum() <= 1e-13 * scale.sum() + 1e-300
    np.testing.assert_array_equal(per[4], got[4])
    if not heads:
        assert (got[0] == 0).all()


@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 6)])
def test_last_depth_race_combined_by_the_slot_weights(shape, monkeypatch):
    """At the last expanded depth the race keeps only the ranks' laws combined by the rows' slot weights (what pi
    reads there): the weighted kernel runs with one weight per rank >= 2, and each row's sum equals the route with
    each rank's laws (the race without weights, combined afterwards) within 1e-13 and the whole evaluation."""
    if not _bound_kernels.JIT:
        pytest.skip("numba is not installed")
    from otspec.tree import _bound as B

    V, m = 2500, 5
    slots = B._Slots(shape)
    z = np.random.default_rng(23).normal(0, 2.5, (2, m, V))          # LLM-like draft and target rows
    e = np.exp(z - z.max(axis=2, keepdims=True))
    P, Q = e / e.sum(axis=2, keepdims=True)

    def frontier():
        return [B._Prefix((i,), 0.6, 0.5, np.full(slots.n_at[1], 0.7 / slots.n_at[1]), (0.02,), {}) for i in range(m)]

    seen = []
    weighted = _bound_kernels.race_rows_weighted

    def spy(PH, kh, pmax, nu, ranks, wts, *rest):
        seen.append((ranks.copy(), wts.shape))
        return weighted(PH, kh, pmax, nu, ranks, wts, *rest)

    monkeypatch.setattr(_bound_kernels, "race_rows_weighted", spy)
    fa = frontier()
    assert B._expand_rows(slots, "wor", fa, list(P), list(Q), 10**6)[0] is None
    assert seen and all(len(r) > 0 and shp[1] == len(r) for r, shp in seen)     # one weight per rank >= 2
    race = B._Race

    def per_rank(*a, weights=None, **k):
        return race(*a, **k)

    monkeypatch.setattr(B, "_Race", per_rank)
    fb = frontier()
    assert B._expand_rows(slots, "wor", fb, list(P), list(Q), 10**6)[0] is None
    for u, v in zip(fa, fb):
        assert abs(u.exact - v.exact) <= 1e-13 * v.exact
    _check_last_depth_sums("wor", slots, fa, P, Q, _whole_pi(slots, "wor", frontier(), P))


@settings(max_examples=25, deadline=None)
@given(V=st.integers(6, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "tiers", "rising"]),
       seed=st.integers(0, 10**6))
def test_race_left_end_added_on_the_safe_side(V, kind, seed):
    """The race's quadrature starts at ``t0 = 5e-3`` and adds a bound on the nodes before it (``_left_end``: from
    the row's elementary symmetric polynomials, to second order in t), which exceeds them by at most
    :math:`\\Delta_r(p) = p\\, (2/3)\\, h\\, t_0^{r+3} / (r!\\, (e^{(r+3)h} - 1))` (:math:`e_r \\le 1/r!`):
    against the same race from ``t0 = 1e-7`` (whose own left part is below 1e-21 relative), every law of rank 2, 3,
    5 lies in ``[exact, exact + Delta]`` (within the rules' rounding, 1e-14) wherever the left part is far above
    the rounding (1e-13 of the law): it fails when the bound is not added (the law then lies below by about the
    left part, 1e-8 of it at rank 2) or added more than once."""
    from otspec.tree import _bound as B

    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    ranks = [0, 1, 2, 3, 5]
    if np.count_nonzero(p) < 6 or math.perm(int(np.count_nonzero(p)), 6) * V <= 10**4:
        return
    t0 = B._RACE_T0
    assert t0 == 5e-3
    got, ex = _wor_draw_laws(p, ranks, exact_limit=0)
    B._RACE_T0 = 1e-7
    try:
        ref, ex2 = _wor_draw_laws(p, ranks, exact_limit=0)
    finally:
        B._RACE_T0 = t0
    assert ex and ex2
    h = B._race_step(max(ranks))
    for k, r in enumerate(ranks):
        if r < 2:
            np.testing.assert_array_equal(got[k], ref[k])
            continue
        left = p * t0 ** (r + 1) * (1 - p) ** r / math.factorial(r + 1)      # about the left part, at most
        d = p * (2 / 3) * h * t0 ** (r + 3) / (math.factorial(r) * math.expm1((r + 3) * h))
        sel = left > 1e-13 * ref[k, 0]
        diff = got[k, 0, sel] - ref[k, 0, sel]
        # 1e-14: the rounding of the two rules' sums of some 120 nodes on different grids (measured up to 2.1e-15
        # relative from 5e-3, 1e-15 from 1e-4)
        assert (diff >= -1e-14 * ref[k, 0, sel]).all()
        assert (diff <= d[sel] + 1e-14 * ref[k, 0, sel]).all()


@pytest.mark.parametrize("shape", [TreeShape.branching(8, 7), TreeShape.branching(3, 2, 2),
                                   TreeShape([(0,), (1,), (2,), (3,), (0, 0), (2, 0), (2, 1), (2, 2)]),
                                   TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)])])
def test_iid_point_is_iid_block_at_one_column(shape):
    """``iid_point`` (the i.i.d. row kernel's entries the slope leaves, one by one) against ``iid_block`` over a
    whole block, bit for bit, at every depth of programs with several classes per level, several terms per class
    and terms of one child (draft probabilities from 0 to 1, SLOPE_AT among them, prefix probabilities 0 to 1)."""
    from otspec.tree import _bound as B

    rng = np.random.default_rng(5)
    slots = B._Slots(shape)
    x = np.concatenate([[0.0, 1.0, _bound_kernels.SLOPE_AT, 1e-300, 0.5], rng.random(60), 10.0 ** -rng.uniform(0, 12, 60)])
    for j in range(len(slots.n_at) - 1):
        prog = _bound_kernels.iid_program(*slots.iid_classes(j))
        leaf_n, lvl_start, term_start, term_child, term_cnt, root = prog
        for s in (rng.random(j + 1), rng.random(j + 1), np.ones(j + 1), np.zeros(j + 1)):
            F, a, g, acc, r, h = _bound_kernels.iid_scratch(lvl_start)
            _bound_kernels.iid_block(x, 0, x.shape[0], s, j, leaf_n, lvl_start, term_start, term_child, term_cnt, F, a,
                                     g, acc, r, h)
            Fs = np.zeros(lvl_start[-1])
            got = np.array([_bound_kernels.iid_point(v, s, j, *prog, Fs) for v in x])
            assert np.array_equal(got, F[root, : x.shape[0]]), (j, s, np.flatnonzero(got != F[root, : x.shape[0]]))


@pytest.mark.parametrize("V", [5000, 4096, 1000])
def test_row_stats_power_sums_are_the_block_sweeps(V):
    """``wor_row_stats`` (the race's power sums of the tail in groups of GROUP blocks, ``moments_group``, then block
    by block past the last whole group) against ``race_moments_row`` (block by block) on the same tail: the same
    floats, on LLM-like rows with exact zeros and large tokens (above 1e-2 and 0.1 of the tail's largest)."""
    rng = np.random.default_rng(V)
    K = 8
    for sigma in (1.0, 3.0, 8.0):
        z = rng.normal(0, sigma, V)
        p = np.exp(z - z.max())
        p[rng.random(V) < 0.05] = 0.0
        p[rng.integers(0, V, 40)] *= 50.0
        p[min(V - 1, 1500)] = 2.0 * p.max()             # the most likely token in the second group
        p /= p.sum()
        head, hval = np.zeros(K, np.int64), np.zeros(K)
        nu, want, st = np.zeros(49), np.zeros(49), np.zeros(7)
        mark = np.zeros(V, dtype=bool)
        _bound_kernels.wor_row_stats(p, K, True, head, hval, nu, mark, st)
        assert not mark.any()
        kh = int(st[2])
        mark[head[:kh]] = True
        _bound_kernels.race_moments_row(p, mark, st[3], want)
        assert st[3] == p[~mark].max() and want[1] >= 1.0
        assert np.array_equal(nu, want), np.flatnonzero(nu != want)
        # the support, mass and second draw's sums with the race's sweeps are those without them, to the bit
        st0 = np.zeros(7)
        mark[:] = False
        _bound_kernels.wor_row_stats(p, K, False, head, hval, np.zeros(49), mark, st0)
        assert np.array_equal(st, st0), (st, st0)


@pytest.mark.parametrize("V", [300, 4096, 102_400])
def test_split_point_keeps_lane_sums_exact(V):
    """The race's mass of the small tokens (:math:`y \\le 10^{-2}`) split without error at ``split_point``: each
    :math:`y = q + (y - q)` exactly, every lane's sum of the parts :math:`q` exact (``math.fsum`` of the lane's
    parts, bit for bit) on rows whose lanes add up to nearly :math:`m \\cdot 10^{-2}` (``m`` entries a lane, 400
    at the largest ``V``), and ``race_moments_row``'s ``nu[1]`` within an ulp of ``math.fsum`` of the whole tail.
    Fails with a split point that does not grow with ``V`` (``2**-6``: the lanes' parts round from a lane total
    of 1/32 on) or a lane's parts added in a wrong order of magnitude."""
    B = _bound_kernels.BLOCK
    m = -(-V // B)
    sig = _bound_kernels.split_point(V)
    assert sig >= m * 1e-2 and (sig == 2.0**-6 or sig / 2 < m * 1e-2) and math.frexp(sig)[0] == 0.5
    rng = np.random.default_rng(V)
    p = rng.uniform(0.5e-2, 1e-2, V)
    p[rng.integers(0, V, 3)] = 1.0                     # the tail's largest (y = 1) and two ties: gathered
    mark = np.zeros(V, dtype=bool)
    s0, s1, yb, A, big = _bound_kernels.moments_scratch(V)
    k = 0
    for v0 in range(0, V, B):
        b = min(B, V - v0)
        k = _bound_kernels.moments_block(p[v0:v0 + b], mark[v0:v0 + b], b, 1.0, sig, s0, s1, yb, A, big, k)
    w = np.where(p <= 1e-2, p, 0.0)
    q = (sig + w) - sig
    assert np.array_equal(q + (w - q), w) and np.array_equal((w - q) + q, w)
    for v in range(B):
        assert s0[v] == math.fsum(q[v::B].tolist()), v
    if m > 12:                                         # lanes past 2 * 2**-6: a fixed split point rounds there
        assert max(math.fsum(q[v::B].tolist()) for v in range(B)) > 2.0**-4
    nu = np.zeros(49)
    _bound_kernels.race_moments_row(p, mark, 1.0, nu)
    want = math.fsum(p.tolist())
    assert abs(nu[1] - want) <= 2.0**-52 * want, (nu[1], want)


def _group_and_blocks(p, mark, inv):
    """The race's moments of ``p`` by ``moments_group`` group by group and by ``moments_block`` block by block:
    ``(got, want, kg, kw)``, their scratch arrays and counts of large tokens."""
    B, G, V = _bound_kernels.BLOCK, _bound_kernels.GROUP, p.shape[0]
    got, want = _bound_kernels.moments_scratch(V), _bound_kernels.moments_scratch(V)
    yg = np.zeros(G * B)
    sig = _bound_kernels.split_point(V)
    kg = kw = 0
    for g0 in range(0, V, G * B):
        kg = _bound_kernels.moments_group(p[g0:g0 + G * B], mark[g0:g0 + G * B], inv, sig, got[0], got[1], yg,
                                          got[3], got[4], kg)
        for v0 in range(g0, g0 + G * B, B):
            kw = _bound_kernels.moments_block(p[v0:v0 + B], mark[v0:v0 + B], B, inv, sig, want[0], want[1], want[2],
                                              want[3], want[4], kw)
    return got, want, kg, kw


def test_moments_group_is_moments_block_lane_by_lane():
    """``moments_group`` against ``moments_block`` on each of its blocks in turn: every lane (the split's two sums,
    the powers 2 .. 10) and the gathered large tokens the same floats, over several groups in a row
    (lanes carried from one group to the next), with marked entries, exact zeros and tokens on both sides of 1e-2."""
    B, G = _bound_kernels.BLOCK, _bound_kernels.GROUP
    rng = np.random.default_rng(11)
    V = 3 * G * B
    p = 10.0 ** -rng.uniform(0, 9, V)
    p[rng.random(V) < 0.05] = 0.0
    mark = rng.random(V) < 0.02
    inv = 1.0 / (0.5 * p.max())
    got, want, kg, kw = _group_and_blocks(p, mark, inv)
    assert kg == kw > 0
    for a, b in zip(got[:2] + got[3:4], want[:2] + want[3:4]):
        assert np.array_equal(a, b)
    assert np.array_equal(got[4][:kg], want[4][:kw])


def test_moments_group_gathers_sparse_large_tokens():
    """``moments_group`` gathers the large tokens (:math:`y > 10^{-2}`) only from the chunks of
    :data:`_bound_kernels.CHUNK` columns that hold one: on groups where they are rare (one alone at a chunk's first
    or last column, two in one chunk, one exactly at 1e-2 that stays out, whole chunks and a whole group without
    any), the same list, lanes and count as ``moments_block`` block by block (which scans every column). Fails when a
    chunk with a single large token, or a chunk's edge column, is skipped."""
    B, G, CH = _bound_kernels.BLOCK, _bound_kernels.GROUP, _bound_kernels.CHUNK
    assert (G * B) % CH == 0
    rng = np.random.default_rng(5)
    V = 3 * G * B
    p = rng.uniform(1e-9, 1e-6, V)                     # y <= 1e-3: small everywhere
    mark = np.zeros(V, dtype=bool)
    big_at = [0, CH - 1, 3 * CH, 3 * CH + 7, 5 * CH + CH // 2, G * B - 1, 2 * G * B + CH]   # none in group 1
    for v in big_at:
        p[v] = rng.uniform(0.05, 0.9)
    p[7 * CH + 3] = 1e-2                                  # y = 1e-2 exactly: not large
    p[9 * CH + 1] = 0.5
    mark[9 * CH + 1] = True                               # marked (the head): y = 0, not gathered
    inv = 1.0
    got, want, kg, kw = _group_and_blocks(p, mark, inv)
    assert kg == kw == len(big_at)
    assert np.array_equal(got[4][:kg], p[big_at])
    assert np.array_equal(got[4][:kg], want[4][:kw])
    for a, b in zip(got[:2] + got[3:4], want[:2] + want[3:4]):
        assert np.array_equal(a, b)
