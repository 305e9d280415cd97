"""Audit of the tree bound, the law checks and the samplers with other seeds, sizes and inputs (task BN).

Independent routes: the exhaustive sum over every realised tree (otspec.tree.enumerate_trees) and the package's LPs
(otspec.tree.optimum: B >= OPT_c >= OPT_1) on enumerable cases; the bound's numpy route (numba off) and its torch
route (CPU tensors) against the fused host route; the law check's numpy reference (numba off) against its compiled
fast path; Pearson's chi-square against the exact law for the samplers. Laws with zeros, ties, subnormal entries
(1e-310, flushed to 0 on reading), near one-hot and uniform rows; V from 2 to 3,000.

Tolerances: EXACT = 1e-12 (sums of at most a few thousand float64 terms of size <= 1, and the stated 1e-12 of the
race's laws); LP values carry HiGHS's tolerance, LP_TOL = 1e-8. Each chi-square test fails falsely with probability
ALPHA = 1e-6 (fixed seeds: the outcome is reproducible).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otspec._validation import SIMPLEX_TOL, law_into, validate_distribution
from otspec.models import MemorylessModel, sequence_probability
from otspec.testing import chi2_gof
from otspec.tree import (
    MAX_BOUND_BUDGET,
    Eagle2Params,
    TreeShape,
    _bound_kernels,
    bound,
    enumerate_trees,
    optimum,
    sample_tree,
    value,
)
from otspec.tree._bound import _order_key, _sampled, _Slots

EXACT = 1e-12
LP_TOL = 1e-8
ALPHA = 1e-6
KINDS = ("dirichlet", "onehot", "near1", "uniform", "ties", "zeros", "subnormal", "llm")


def _law(rng, V: int, kind: str) -> np.ndarray:
    """A law on ``V`` tokens of the given kind (float64, summing to 1 within a few ulp)."""
    if kind == "dirichlet":
        return rng.dirichlet(np.full(V, rng.choice([0.05, 0.3, 1.0, 5.0])))
    if kind == "onehot":
        return np.eye(V)[rng.integers(V)]
    if kind == "near1":
        p = np.zeros(V)
        i = int(rng.integers(V))
        if V == 1:
            p[0] = 1.0
            return p
        eps = float(rng.choice([1e-12, 1e-9, 1e-300]))
        p[i], p[(i + 1) % V] = 1.0 - eps, eps
        return p
    if kind == "uniform":
        return np.full(V, 1.0 / V)
    if kind == "ties":
        w = rng.choice([0.0, 1.0, 1.0, 2.0, 5.0], V)
    elif kind == "zeros":
        w = rng.dirichlet(np.ones(V)) * (rng.random(V) < 0.5)
    elif kind == "subnormal":
        w = rng.dirichlet(np.ones(V))
        small = rng.random(V) < 0.3
        if small.all():
            small[0] = False
        w[~small] /= w[~small].sum()
        w[small] = 1e-310                          # below the smallest normal double: flushed to 0 when read
        return w
    else:
        z = rng.normal(0.0, 3.0, V)
        w = np.exp(z - z.max()) * (rng.random(V) >= 0.05)
    if w.sum() == 0:
        w[int(rng.integers(V))] = 1.0
    return w / w.sum()


class TableModel:
    """A model whose law after each prefix is drawn (once, then kept) of one of ``kinds``, seeded by the prefix."""

    def __init__(self, V: int, seed: int, kinds):
        self.vocab_size, self.seed, self.kinds, self.memo = V, seed, tuple(kinds), {}

    def next_dist(self, prefix):
        prefix = tuple(int(x) for x in prefix)
        if prefix not in self.memo:
            h = zlib.crc32(repr((self.seed, prefix)).encode())
            self.memo[prefix] = _law(np.random.default_rng(h), self.vocab_size, self.kinds[h % len(self.kinds)])
        return self.memo[prefix].copy()


class _Laws:
    """``laws(paths) -> (P, Q)`` as the search reads them: checked rows (subnormals flushed), numpy or torch."""

    def __init__(self, draft, target, as_tensor: bool):
        self.draft, self.target, self.as_tensor, self.calls = draft, target, as_tensor, 0

    def __call__(self, paths):
        self.calls += 1
        P = np.array([validate_distribution(self.draft.next_dist(tuple(s)), "draft") for s in paths])
        Q = np.array([validate_distribution(self.target.next_dist(tuple(s)), "target") for s in paths])
        if self.as_tensor:
            import torch

            return torch.from_numpy(P), torch.from_numpy(Q)
        return P, Q


@st.composite
def shapes(draw, max_nodes=5, max_depth=3, max_rank=2):
    paths = {()}
    for _ in range(draw(st.integers(1, max_nodes))):
        par = draw(st.sampled_from(sorted(p for p in paths if len(p) < max_depth)))
        free = [r for r in range(max_rank + 1) if par + (r,) not in paths]
        if free:
            paths.add(par + (draw(st.sampled_from(free)),))
    return TreeShape(sorted(p for p in paths if p))


def _kinds():
    return st.lists(st.sampled_from(KINDS), min_size=1, max_size=3)


def _reference(shape, draft, target, process):
    """(b_d, B) from every realised tree: pi(y) = the probability of the trees with root path y."""
    D = int(shape.max_depth)
    pi: dict = {}
    for tree, w in enumerate_trees(shape, draft, process=process):
        for y in set(tree.paths()[1:]):
            pi.setdefault(y, []).append(w)
    pi = {y: math.fsum(ws) for y, ws in pi.items()}
    b = [math.fsum(min(sequence_probability(target, y), w) for y, w in pi.items() if len(y) == d)
         for d in range(1, D + 1)]
    return np.array(b), math.fsum(np.minimum.accumulate(b).tolist())


def _drawable(shape, V, process) -> bool:
    return process != "wor" or max(r for p in shape.paths[1:] for r in p) + 1 <= V


def _rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


# --------------------------------------------------------------------------- found by this audit (fail on 24cd376)
class _Tensors:
    def __init__(self, draft, target, as_tensor):
        self.inner = _Laws(draft, target, as_tensor)

    def __call__(self, paths):
        return self.inner(paths)

    @property
    def calls(self):
        return self.inner.calls


@pytest.mark.parametrize(("V", "paths", "target_kinds", "budgets"), [
    # a uniform draft: every child's pi is 1/V (the race's rank 2), computed a few ulp apart per column and route;
    # ordered by those bits, budgets 10 and 11 expanded other prefixes on the torch route (bounds 2e-3 apart); the
    # budgets 1 to 12 in turn in the slow test below
    (50, [(2,), (2, 0)], ("ties",), (10, 11)),
    # the case the audit found: ranks 4 and 5 at the root, the bound 1.5% apart at budgets 2 to 100
    (50, [(4,), (5,), (5, 3), (5, 5), (5, 3, 4)], ("ties", "llm", "near1"), (2, 3, 5, 10, 100)),
])
def test_tied_draft_probabilities_expand_the_same_prefixes_on_every_route(V, paths, target_kinds, budgets, monkeypatch):
    _same_prefixes_on_every_route(V, paths, target_kinds, budgets, monkeypatch)


@pytest.mark.slow
def test_tied_uniform_draft_expands_the_same_prefixes_on_every_route_at_every_budget(monkeypatch):
    # the uniform draft above at every budget from 1 to 12 (the route without numba is the slow one: 12 walks)
    _same_prefixes_on_every_route(50, [(2,), (2, 0)], ("ties",), range(1, 13), monkeypatch)


def _same_prefixes_on_every_route(V, paths, target_kinds, budgets, monkeypatch):
    pytest.importorskip("torch")
    shape = TreeShape(paths)
    draft = MemorylessModel(np.full(V, 1.0 / V))
    target = TableModel(V, 1076 + 10**6, target_kinds)
    for budget in budgets:
        a = _sampled(_Slots(shape), "wor", _Laws(draft, target, False), budget, 64)
        t = _sampled(_Slots(shape), "wor", _Laws(draft, target, True), budget, 64)
        with monkeypatch.context() as m:
            m.setattr(_bound_kernels, "JIT", False)
            n = _sampled(_Slots(shape), "wor", _Laws(draft, target, False), budget, 64)
        for other in (t, n):
            assert (other.n_expanded, other.complete, other.pi_exact) == (a.n_expanded, a.complete, a.pi_exact)
            assert _rel(other.value, a.value) <= EXACT, (budget, a.value, other.value)
            np.testing.assert_allclose(other.per_depth, a.per_depth, rtol=EXACT, atol=0)


def test_the_order_key_is_monotone_and_shares_a_key_within_a_few_ulp():
    rng = np.random.default_rng(0)
    v = np.sort(np.concatenate([rng.random(2000), rng.random(50) * 1e-300, [0.0, 5e-324, 1.0, 0.04, 0.5]]))
    k = _order_key(v)
    assert np.all(np.diff(k) >= 0)
    # a few ulp either side of values away from the (dyadic, 32-bit) bin edges share the key
    for x in (0.04, 1 / 3, 0.5, 0.25, 0.1, 1.0, 2 / 7):
        near = np.array([x * (1 + e * 2.0**-52) for e in range(-4, 5)])
        assert np.unique(_order_key(near)).size == 1, x
    pytest.importorskip("torch")
    import torch

    from otspec.tree._bound import _key_edges

    np.testing.assert_array_equal(_order_key(torch.from_numpy(v), torch).numpy(), k)
    for x in v[v > 0][::97]:
        lo, hi = _key_edges(np.array([x]))
        lt, ht = _key_edges(torch.tensor([x]), torch)
        assert (lo[0], hi[0]) == (float(lt[0]), float(ht[0]))
        assert _order_key(lo)[0] == _order_key(np.array([x]))[0] or lo[0] == 5e-324
        assert _order_key(hi)[0] == _order_key(np.array([x]))[0] + 1
        assert _order_key(np.nextafter(lo, 0.0))[0] < _order_key(np.array([x]))[0] or lo[0] == 5e-324


# --------------------------------------------------------------------------- against enumeration and the LPs
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(), V=st.integers(2, 4), seed=st.integers(0, 2**31 - 1), kd=_kinds(), kt=_kinds(),
       process=st.sampled_from(["iid", "wor"]))
def test_complete_bound_is_the_exhaustive_sum_and_never_rises_with_the_budget(shape, V, seed, kd, kt, process):
    if not _drawable(shape, V, process):
        return
    draft, target = TableModel(V, seed, kd), TableModel(V, seed + 1, kt)
    try:
        b_ref, B_ref = _reference(shape, draft, target, process)
    except ValueError as exc:                      # a prefix with fewer draft tokens than the shape's ranks
        assert "distinct children" in str(exc)
        # refused where the search expands the prefix; a prefix of target probability 0 is never read (documented)
        try:
            r = bound(shape, draft, target, process=process, budget=MAX_BOUND_BUDGET)
        except ValueError as exc2:
            assert "distinct children" in str(exc2)
        else:
            assert r.complete
        return
    prev = math.inf
    for budget in (1, 2, 3, 5, 8, 10_000):
        r = bound(shape, draft, target, process=process, budget=budget, batch=2)
        assert r.value <= prev + EXACT
        assert r.value >= B_ref - EXACT and r.value - r.remainder <= B_ref + EXACT
        prev = r.value
    assert r.complete and r.pi_exact and r.remainder == 0.0
    np.testing.assert_allclose(r.per_depth, b_ref, rtol=0, atol=EXACT)
    assert abs(r.value - B_ref) <= EXACT


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(max_nodes=3, max_depth=2), V=st.sampled_from([2, 3]), seed=st.integers(0, 2**31 - 1),
       kd=_kinds(), kt=_kinds(), process=st.sampled_from(["iid", "wor"]))
def test_bound_is_above_both_optima(shape, V, seed, kd, kt, process):
    if not _drawable(shape, V, process):
        return
    draft, target = TableModel(V, seed, kd), TableModel(V, seed + 1, kt)
    try:
        oc = optimum(shape, draft, target, process=process, one_token=False, raise_on_failure=True).value
        o1 = optimum(shape, draft, target, process=process, raise_on_failure=True).value
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return
    assert oc >= o1 - LP_TOL
    for budget in (1, 2, 10_000):
        assert bound(shape, draft, target, process=process, budget=budget).value >= oc - LP_TOL


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kinds", [("ties",), ("uniform",), ("subnormal", "near1"), ("zeros", "onehot")])
@pytest.mark.parametrize("shape", [TreeShape.branching(2, 2), TreeShape([(0,), (2,), (0, 0), (0, 1)]),
                                   Eagle2Params(depth=3, top_k=2, total_tokens=5)])
def test_deterministic_trees_give_the_target_only_value(seed, kinds, shape):
    process = "eagle2" if isinstance(shape, Eagle2Params) else "topk"
    draft, target = TableModel(4, seed, kinds), TableModel(4, seed + 7, ("dirichlet", "ties"))
    try:
        attained = value(shape, draft, target, process=process, verifier="target-only")
    except ValueError as exc:                     # a node with fewer draft tokens than its children: refused alike
        assert "distinct children" in str(exc)
        with pytest.raises(ValueError, match="distinct children"):
            bound(shape, draft, target, process=process)
        return
    r = bound(shape, draft, target, process=process)
    assert r.complete and r.pi_exact and r.remainder == 0.0
    assert abs(r.value - attained) <= EXACT


# --------------------------------------------------------------------------- the routes at larger vocabularies
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes(max_nodes=8, max_depth=3, max_rank=5), V=st.sampled_from([2, 3, 7, 50, 300, 3000]),
       seed=st.integers(0, 2**31 - 1), kd=_kinds(), kt=_kinds(), process=st.sampled_from(["iid", "wor"]),
       budget=st.sampled_from([1, 2, 3, 7, 20]), batch=st.sampled_from([1, 3, 64]))
def test_torch_and_numpy_routes_agree_with_the_fused_route(shape, V, seed, kd, kt, process, budget, batch):
    pytest.importorskip("torch")
    if not _drawable(shape, V, process):
        return
    draft, target = TableModel(V, seed, kd), TableModel(V, seed + 1, kt)
    try:
        a = _sampled(_Slots(shape), process, _Laws(draft, target, False), budget, batch)
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return
    t = _sampled(_Slots(shape), process, _Laws(draft, target, True), budget, batch)
    _bound_kernels_jit = _bound_kernels.JIT
    _bound_kernels.JIT = False
    try:
        n = _sampled(_Slots(shape), process, _Laws(draft, target, False), budget, batch)
    finally:
        _bound_kernels.JIT = _bound_kernels_jit
    for other in (t, n):
        assert (other.n_expanded, other.complete, other.pi_exact) == (a.n_expanded, a.complete, a.pi_exact)
        assert _rel(other.value, a.value) <= EXACT
        assert abs(other.remainder - a.remainder) <= EXACT * max(a.value, 1.0)
        np.testing.assert_allclose(other.per_depth, a.per_depth, rtol=EXACT, atol=1e-300)
    # the public entry is the fused route
    assert bound(shape, draft, target, process=process, budget=budget, batch=batch).value == a.value


# --------------------------------------------------------------------------- bad input, before any model call
class _Refuses:
    vocab_size = 4

    def next_dist(self, prefix):
        raise AssertionError("a model call before the input was checked")


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    (dict(budget=0), ValueError, "`budget`"),
    (dict(budget=-3), ValueError, "`budget`"),
    (dict(budget=MAX_BOUND_BUDGET + 1), ValueError, "`budget` must be at most"),
    (dict(budget=np.float32(4)), TypeError, "`budget`"),
    (dict(budget=True), TypeError, "`budget`"),
    (dict(batch=0), ValueError, "`batch`"),
    (dict(batch=10**6), ValueError, "`batch`"),
    (dict(method="nope"), ValueError, "`method`"),
    (dict(prefix=[4]), ValueError, "`prefix`"),
    (dict(process="wor", shape=TreeShape([(0,), (4,)])), ValueError, "process='wor' cannot draw the shape"),
    (dict(shape=TreeShape([])), ValueError, "`shape`"),
])
def test_bad_input_names_the_parameter_before_any_model_call(kwargs, exc, match):
    args = dict(shape=TreeShape.branching(2, 2), process="iid")
    args.update(kwargs)
    shape = args.pop("shape")
    with pytest.raises(exc, match=match):
        bound(shape, _Refuses(), _Refuses(), **args)


@pytest.mark.parametrize("bad", [np.array([0.5, np.nan, 0.5, 0.0]), np.array([0.5, 0.5, 0.5, 0.0]),
                                 np.array([0.5, -0.1, 0.6, 0.0]), np.array([0.5, 0.5, 0.0]),
                                 np.array([0.5, np.inf, 0.0, 0.0])])
@pytest.mark.parametrize("role", ["draft", "target"])
def test_bad_laws_are_refused_naming_the_model(bad, role):
    good = MemorylessModel(np.full(4, 0.25))

    class Bad:
        vocab_size = 4

        def next_dist(self, prefix):
            return bad.copy()

    draft, target = (Bad(), good) if role == "draft" else (good, Bad())
    for process in ("iid", "wor", "topk"):
        with pytest.raises(ValueError, match=f"`{role}[`.]"):
            bound(TreeShape.branching(2, 2), draft, target, process=process)


def test_unequal_vocabularies_are_refused():
    with pytest.raises(ValueError, match="share one vocabulary"):
        bound(TreeShape.branching(2), MemorylessModel([0.5, 0.5]), _Refuses(), process="iid")


def test_float32_laws_are_read_as_their_rescaled_float64_laws():
    # float32 laws are accepted (validate_distribution: within 2 V eps of 1, rescaled in float64): the bound equals
    # the bound of the rescaled float64 laws, to the bit
    rng = np.random.default_rng(4)
    p32, q32 = rng.dirichlet(np.ones(300)).astype(np.float32), rng.dirichlet(np.ones(300)).astype(np.float32)
    p64, q64 = p32.astype(np.float64) / p32.astype(np.float64).sum(), q32.astype(np.float64) / q32.astype(np.float64).sum()
    for process in ("iid", "wor"):
        a = bound(TreeShape.branching(3, 2), MemorylessModel(p32), MemorylessModel(q32), process=process, budget=9)
        b = bound(TreeShape.branching(3, 2), MemorylessModel(p64), MemorylessModel(q64), process=process, budget=9)
        assert a.value == b.value


# --------------------------------------------------------------------------- the law check's fast path
def _reference_check(x, tol=SIMPLEX_TOL):
    """validate_distribution with numba off (numpy's pairwise total decides): the result or the exception type."""
    from otspec import _validation_kernel as LK

    jit = LK.JIT
    LK.JIT = False
    try:
        return validate_distribution(x, "p", tol=tol)
    except ValueError as exc:
        return type(exc)
    finally:
        LK.JIT = jit


@settings(max_examples=200, deadline=None)
@given(n=st.sampled_from([1, 2, 3, 17, 1000, 50_000]), seed=st.integers(0, 2**31 - 1),
       off=st.sampled_from([0.0, 0.5, 0.9, 0.999, 1.0, 1.001, 1.1, 2.0, -0.999, -1.0, -1.001]),
       ulps=st.integers(-4, 4), extra=st.sampled_from(["none", "subnormal", "zeros", "nan", "neg", "inf"]))
def test_law_into_decides_as_the_numpy_reference(n, seed, off, ulps, extra):
    # totals placed at the tolerance's edge (1 + off * tol, a few ulp either side): wherever law_into accepts, the
    # numpy reference accepts with the same bits; validate_distribution (fast path on) decides as the reference
    from otspec import _validation_kernel as LK

    rng = np.random.default_rng(seed)
    x = rng.dirichlet(np.ones(n))
    if extra == "subnormal":
        x[rng.random(n) < 0.3] = 1e-310
    elif extra == "zeros":
        x[rng.random(n) < 0.5] = 0.0
    if not x.any():
        x[0] = 1.0
    x = x / math.fsum(x[x > 0].tolist())
    x[0] += off * SIMPLEX_TOL
    x[0] = x[0] + ulps * np.spacing(x[0])
    if extra in ("nan", "neg", "inf") and n > 1:
        x[1] = {"nan": np.nan, "neg": -1e-300, "inf": np.inf}[extra]
    keep = x.copy()
    ref = _reference_check(x)
    if LK.JIT:
        got = law_into(x)
        if got is not None:
            assert isinstance(ref, np.ndarray) and got.tobytes() == ref.tobytes()
            assert not got.flags.writeable
    try:
        full = validate_distribution(x, "p")
    except ValueError as exc:
        full = type(exc)
    if isinstance(ref, np.ndarray):
        assert isinstance(full, np.ndarray) and full.tobytes() == ref.tobytes()
    else:
        assert full is ref
    np.testing.assert_array_equal(x, keep)               # the input untouched


def test_law_into_refuses_or_matches_at_a_huge_vocabulary():
    from otspec import _validation_kernel as LK

    rng = np.random.default_rng(2)
    x = rng.random(2_000_000)
    x /= x.sum()
    ref = _reference_check(x)
    got = law_into(x)
    assert isinstance(ref, np.ndarray)
    if LK.JIT:
        assert got is not None and got.tobytes() == ref.tobytes()   # 4 n u = 9e-10 <= tol: decided in one read
    x[5] += 2e-9                                                    # past the tolerance: refused by both
    assert law_into(x) is None and _reference_check(x) is ValueError


# --------------------------------------------------------------------------- samplers against the exact law
@pytest.mark.parametrize("kind", ["ties", "zeros", "subnormal", "near1", "llm", "uniform"])
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_sample_rows_chi_square(kind, lib):
    # each row's draws against its exact law (Pearson, false-failure rate ALPHA per row); a zero-mass entry drawn
    # fails outright (chi2_gof's outside-support count)
    from otspec.decoding._sampling import sample_rows

    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    V = 40
    P = np.stack([validate_distribution(_law(rng, V, kind), "p") for _ in range(3)])
    N = 20_000
    if lib == "torch":
        torch = pytest.importorskip("torch")
        Pt = torch.from_numpy(np.repeat(P, N, axis=0))
        ids = sample_rows(Pt, np.random.default_rng(1)).numpy()
    else:
        ids = sample_rows(np.repeat(P, N, axis=0), np.random.default_rng(1))
    ids = ids.reshape(3, N)
    for r in range(3):
        res = chi2_gof(np.bincount(ids[r], minlength=V), P[r], alpha_fail=ALPHA)
        assert res.outside_support == 0 and res.passed, (kind, r, res)


@pytest.mark.parametrize(("process", "paths"), [("iid", [(0,), (1,), (0, 0)]), ("wor", [(0,), (1,), (0, 0), (1, 0)]),
                                                ("wor", [(0,), (2,), (2, 0)])])
@pytest.mark.parametrize("kinds", [("ties",), ("zeros", "subnormal"), ("near1", "dirichlet")])
def test_tree_draws_chi_square(process, paths, kinds):
    # sample_tree's realised trees against enumerate_trees' exact law (false-failure rate ALPHA)
    shape, V = TreeShape(paths), 4
    draft = TableModel(V, 11, kinds)
    try:
        trees = list(enumerate_trees(shape, draft, process=process))
    except ValueError as exc:
        assert "distinct children" in str(exc)
        return
    index = {tuple(t.tokens.tolist()): i for i, (t, _w) in enumerate(trees)}
    law = np.array([w for _t, w in trees])
    rng = np.random.default_rng(5)
    counts = np.zeros(len(trees), dtype=np.int64)
    for _ in range(4000):
        counts[index[tuple(sample_tree(shape, draft, process=process, rng=rng).tokens.tolist())]] += 1
    res = chi2_gof(counts, law / law.sum(), alpha_fail=ALPHA)
    assert res.outside_support == 0 and res.passed, res
