"""The CPU route's numba passes over the vocabulary (``otspec.decoding._tree_device``) against their torch references.

* ``_level_sums`` (a level's mass :math:`\\sum_x (q - t p)_+` in one read): its terms are those of torch's ``addcmul``
  and ``clamp_`` (one fused multiply-add each), summed in another order than torch's ``sum``: within the rounding of
  a sum of ``V`` non-negative terms of the exact sum of those terms (``math.fsum``), 0 exactly where torch's is;
* ``_residual_draw`` (the residual's draw with its running sums never written, only checkpoints kept): the total and
  the token of ``torch.cumsum`` and ``torch.searchsorted`` on the residual ``torch.addcmul(...).clamp_(min=0)``, bit
  for bit, uniforms 0 and next to 1 included;
* ``_wor_rows`` (the draws without replacement reading the rows only): the draws, totals and flags of the
  draw-by-draw rule (a full ``torch.cumsum`` per draw), bit for bit, up to a few thousand tokens; ``_iid_rows`` (the
  i.i.d. draws): those of one ``torch.cumsum`` and ``torch.searchsorted``, bit for bit;
* ``verify_tree_t(host=True)`` with the passes on against torch's passes on laws of a few thousand tokens: the same
  accepted node and token, the exact law within 1e-12 relative.

Rows: dense, sparse (exact zeros), tied values, one-hot, no mass, tiny (subnormal) and huge entries, laws from
``-inf`` logits, ``V`` from 1 to 3,000.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import otspec.tree as T  # noqa: E402
from otspec.decoding import _tree_device as TD  # noqa: E402
from tests.test_tree_decoding_passes import _draws_wor_full  # noqa: E402

torch.set_num_threads(1)
pytestmark = pytest.mark.skipif(not TD._PASSES_COMPILED, reason="the CPU route's passes are compiled by numba (the "
                                                                "fast extra)")
EPS = 2.0**-53


def _row(rng, mode: str, V: int) -> np.ndarray:
    if mode == "dense":
        return rng.gamma(0.3, size=V)
    if mode == "sparse":
        return np.where(rng.random(V) < 0.3, rng.gamma(0.5, size=V), 0.0)
    if mode == "ties":
        return rng.integers(0, 3, size=V) / 7.0
    if mode == "one-hot":
        w = np.zeros(V)
        w[rng.integers(V)] = 1.0
        return w
    if mode == "zero":
        return np.zeros(V)
    if mode == "tiny":
        return rng.random(V) * 1e-310  # subnormal
    if mode == "huge":
        return rng.random(V) * (1e300 / V)
    logits = np.where(rng.random(V) < 0.5, -np.inf, rng.normal(size=V) * 4)
    logits[0] = 0.0
    return torch.softmax(torch.from_numpy(logits), -1).numpy()


MODES = ["dense", "sparse", "ties", "one-hot", "zero", "tiny", "huge", "-inf logits"]


@st.composite
def _pairs(draw, V_max: int = 3000):
    """Rows ``q`` and ``p`` of one mode each (``B`` rows, ``V`` tokens; ``p = q`` too), normalised or not, and a level
    ``t`` per row (0, 1, the ratio ``q/p`` at some token, or random)."""
    B = draw(st.integers(1, 4))
    V = draw(st.integers(1, V_max))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    mq, mp = draw(st.sampled_from(MODES)), draw(st.sampled_from(MODES + ["equal"]))
    Q = np.stack([_row(rng, mq, V) for _ in range(B)])
    P = Q.copy() if mp == "equal" else np.stack([_row(rng, mp, V) for _ in range(B)])
    if draw(st.booleans()):
        Q = Q / np.maximum(Q.sum(1, keepdims=True), 1e-300)
        P = P / np.maximum(P.sum(1, keepdims=True), 1e-300)
    kind = draw(st.sampled_from(["zero", "ratio", "random", "one"]))
    if kind == "zero":
        t = np.zeros(B)
    elif kind == "one":
        t = np.ones(B)
    elif kind == "ratio":  # a level where some term is exactly 0 in exact arithmetic
        j = rng.integers(V, size=B)
        pj = P[np.arange(B), j]
        with np.errstate(over="ignore"):  # a ratio past the largest float: a finite level instead
            t = np.minimum(np.where(pj > 0, Q[np.arange(B), j] / np.where(pj > 0, pj, 1.0), 1.0), 1e300)
    else:
        t = rng.random(B) * 3
    return np.ascontiguousarray(Q), np.ascontiguousarray(P), t


def _terms(Q, P, t):
    """The terms ``(q - t p)_+`` as torch's ``addcmul`` and ``clamp_`` round them."""
    Qt, Pt = torch.from_numpy(Q), torch.from_numpy(P)
    return torch.addcmul(Qt, Pt, torch.from_numpy(-t)[:, None]).clamp_(min=0.0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_pairs(), data=st.data())
def test_level_sums_are_the_sums_of_torchs_terms(case, data):
    Q, P, t = case
    B = Q.shape[0]
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, B - 1), min_size=1))), dtype=np.int64)
    out = np.full(len(rows), np.nan)
    TD._level_sums(Q, P, rows, -t[rows], out)
    W = _terms(Q, P, t)
    want = W.sum(-1).numpy()[rows]
    V = Q.shape[1]
    for k, r in enumerate(rows):
        exact = math.fsum(W[r].tolist())
        assert abs(out[k] - exact) <= V * EPS * exact  # a sum of V non-negative terms, any order
        assert (out[k] == 0) == (want[k] == 0) == (exact == 0)
        assert abs(out[k] - want[k]) <= 2 * V * EPS * exact


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_pairs(), plain=st.booleans(), data=st.data())
def test_residual_draw_equals_the_running_sums_and_searchsorted(case, plain, data):
    """The total and the token of the residual's draw, bit for bit as draw_rows' "cdf" rule on the residual formed by
    torch (``plain``: ``p = q`` and ``m = 0``, the row ``q`` itself), for uniforms anywhere in ``[0, 1)``, 0 and the
    largest below 1 included."""
    Q, P, t = case
    if plain:
        P, t = Q, np.zeros(Q.shape[0])
    W = _terms(Q, P, t)
    c = torch.cumsum(W, -1)
    u = data.draw(st.sampled_from([0.0, 1.0 - EPS, 0.5]) | st.floats(0.0, 1.0, exclude_max=True))
    for b in range(Q.shape[0]):
        y, tot = TD._residual_draw(Q[b], P[b], -t[b], u)
        assert tot == float(c[b, -1])  # bit for bit (nan never: no bad rows here)
        at = u * tot
        i = int(torch.searchsorted(c[b : b + 1], torch.tensor([[at]], dtype=torch.float64), right=True))
        top = int(torch.searchsorted(c[b : b + 1], c[b : b + 1, -1:].contiguous(), right=False))
        assert y == min(i if i < Q.shape[1] else top, Q.shape[1] - 1)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_pairs(), most=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_wor_rows_equal_the_draw_by_draw_rule(case, most, seed):
    """The draws without replacement from rows only read: the draws, flags and first totals of a full running sum per
    draw, bit for bit; the rows left as they were."""
    P = torch.from_numpy(case[1])
    B = P.shape[0]
    need = torch.from_numpy(np.random.default_rng(seed).integers(1, most + 1, size=B))
    before = P.clone()
    want = _draws_wor_full(P, most, need, torch.Generator().manual_seed(seed))
    totals: list = []
    got = TD._draws_wor(P, most, need, torch.Generator().manual_seed(seed), rule="cdf", host=True, totals=totals)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert totals == torch.cumsum(P, -1)[:, -1].tolist()
    assert torch.equal(P, before)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_pairs(), k=st.integers(0, 6), seed=st.integers(0, 2**31 - 1))
def test_iid_rows_equal_the_running_sums_and_searchsorted(case, k, seed):
    """The i.i.d. draws from rows only read: the draws of one running sum per row and ``k`` uniforms, bit for bit."""
    P = torch.from_numpy(case[1])
    want = TD._draws(P, k, torch.Generator().manual_seed(seed))
    got = TD._draws(P, k, torch.Generator().manual_seed(seed), host=True)
    assert torch.equal(got, want)


def test_iid_rows_with_uniforms_at_the_ends():
    """Uniforms 0, 1 - 2**-53 (rounded up to the total: the first token reaching it), repeated and unordered."""
    P = np.array([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0], [0.0] * 6, [1e-310, 0.0, 3e-310, 0.0, 0.0, 0.0]])
    u = np.array([[1.0 - EPS, 0.0, 0.5, 0.5, 0.3], [0.2, 0.0, 1.0 - EPS, 0.9, 0.1], [0.99, 0.0, 0.5, 1.0 - EPS, 0.2]])
    picks = np.zeros((3, 5), dtype=np.int64)
    TD._iid_rows(P, u, picks)
    c = torch.cumsum(torch.from_numpy(P), -1)
    at = torch.from_numpy(u) * c[:, -1:]
    i = torch.searchsorted(c, at, right=True)
    top = torch.searchsorted(c, c[:, -1:].contiguous(), right=False)
    assert picks.tolist() == torch.where(i < 6, i, top).clamp_(max=5).tolist()


def test_wor_rows_at_a_real_vocabulary():
    """The same on softmax rows of ``V = 128,256`` tokens, two to four draws."""
    g = torch.Generator().manual_seed(0)
    P = torch.softmax(torch.randn(3, 128_256, generator=g, dtype=torch.float64) * 4, -1)
    for most in (2, 4):
        need = torch.full((3,), most)
        for seed in range(3):
            want = _draws_wor_full(P, most, need, torch.Generator().manual_seed(seed))
            got = TD._draws_wor(P, most, need, torch.Generator().manual_seed(seed), rule="cdf", host=True)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


SHAPE = T.TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (2, 0)])


@pytest.mark.parametrize("rule", ["specinfer", "sequoia", "target-only"])
@pytest.mark.parametrize("V", [50, 3000])
def test_verify_with_the_passes_equals_torchs_passes(rule, V, monkeypatch):
    """verify_tree_t reading the host, the numba passes on against off (torch's passes: the route without host reads,
    bit for bit): the same accepted node and token, the exact law within 1e-12 relative, the target laws as they were;
    sparse and dense laws, children drawn from the draft law (so that some are rejected)."""
    rng = np.random.default_rng(V)
    n1 = SHAPE.n + 1
    for trial in range(40):
        logits = rng.normal(size=(2, n1, V)) * 3
        if trial % 2:
            logits[rng.random((2, n1, V)) < 0.7] = -np.inf
            logits[:, :, 0] = 0.0
        P, Q = (torch.softmax(torch.from_numpy(x), -1).numpy() for x in logits)
        toks = [-1] + [int(rng.choice(V, p=P[SHAPE.parents[v]])) for v in range(1, n1)]
        tree = T.DraftTree(SHAPE, SHAPE.parents, np.array(toks))
        lay = TD.TreeLayoutT.of_tree(tree)
        Pin = torch.from_numpy(np.ascontiguousarray(P[lay.inner_np]))
        Qt = torch.from_numpy(Q)
        Qin = Qt[torch.from_numpy(lay.inner_np)]
        before = Qin.clone()

        def q_at(v, Qt=Qt):
            return Qt.index_select(0, v)

        got = TD.verify_tree_t(rule, lay, torch.tensor(toks), Pin, Qin, q_at, torch.Generator().manual_seed(trial),
                               work={}, host=True)
        with monkeypatch.context() as m:
            m.setattr(TD, "_PASSES_COMPILED", False)
            want = TD.verify_tree_t(rule, lay, torch.tensor(toks), Pin, Qin, q_at,
                                    torch.Generator().manual_seed(trial), work={}, host=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        np.testing.assert_allclose(got[2].numpy(), want[2].numpy(), rtol=1e-12, atol=0)
        assert torch.equal(Qin, before)


def test_the_passes_run_only_where_addcmul_rounds_once(monkeypatch):
    """The passes' terms are one fused multiply-add: they are on only where torch's addcmul rounds as they do (this
    CPU), checked on a case where rounding the product first gives 0; a torch that rounds twice leaves them off."""
    assert TD._addcmul_fuses()
    real = torch.addcmul
    monkeypatch.setattr(torch, "addcmul", lambda q, p, m: q + p * m)  # the product rounded first
    assert not TD._addcmul_fuses()
    monkeypatch.setattr(torch, "addcmul", real)
    q, p = np.full(70, -1.0), np.full(70, 1.0 + 2.0**-30)
    assert TD._residual_draw(q, p, 1.0 - 2.0**-30, 0.5)[1] == 0.0  # every term -2**-60, clamped
    out = np.zeros(1)
    TD._level_sums(-q[None], p[None], np.array([0]), np.array([-(1.0 - 2.0**-30)]), out)
    assert out[0] == 70 * 2.0**-60  # 1 - (1 + 2**-30)(1 - 2**-30) = 2**-60 once rounded, per term
