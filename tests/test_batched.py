"""Batched per-position quantities: (..., V) numpy arrays and torch tensors in, same type and device out.

Every batched value is checked against the per-row numpy call (the
independent route: one sort per row, float64) to 1e-12, on hypothesis
batches with ragged zeros, ties, 1e-300 entries and p = q rows.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec

from .strategies import pairs

TOL = 1e-12


@st.composite
def batches(draw, max_rows=6, min_n=1, max_n=6):
    """A (rows, n) batch of (p, q) pairs on one vocabulary, with p = q rows mixed in."""
    n = draw(st.integers(min_n, max_n))
    rows = draw(st.integers(1, max_rows))
    P, Q = [], []
    for _ in range(rows):
        p, q = draw(pairs(n, n))
        if draw(st.booleans()) and draw(st.booleans()):
            q = p.copy()
        P.append(p)
        Q.append(q)
    return np.stack(P), np.stack(Q)


def _per_row(P, Q, k):
    flat_p = P.reshape(-1, P.shape[-1])
    flat_q = Q.reshape(-1, Q.shape[-1])
    vals = [otspec.alpha_k(p, q, k) for p, q in zip(flat_p, flat_q)]
    return np.asarray(vals).reshape(P.shape[:-1] + np.shape(vals[0]))


@given(pq=batches(), k=st.integers(1, 40))
def test_batched_alpha_equals_per_row(pq, k):
    P, Q = pq
    Pc, Qc = P.copy(), Q.copy()
    got = otspec.alpha_k(P, Q, k)
    assert isinstance(got, np.ndarray) and got.shape == P.shape[:-1] and got.dtype == np.float64
    np.testing.assert_allclose(got, _per_row(P, Q, k), rtol=0, atol=TOL)
    np.testing.assert_array_equal(P, Pc)  # inputs never mutated
    np.testing.assert_array_equal(Q, Qc)


@given(pq=batches(max_rows=4, max_n=5), ks=st.lists(st.integers(1, 12), min_size=1, max_size=4))
def test_batched_alpha_sequence_of_k_and_leading_axes(pq, ks):
    P, Q = pq
    # two leading axes: (rows, 2, n)
    P3 = np.stack([P, P[::-1]], axis=1)
    Q3 = np.stack([Q, Q[::-1]], axis=1)
    got = otspec.alpha_k(P3, Q3, ks)
    assert got.shape == P3.shape[:-1] + (len(ks),)
    np.testing.assert_allclose(got, _per_row(P3, Q3, ks), rtol=0, atol=TOL)


def test_batched_alpha_large_vocabulary_and_chunks():
    # rows longer than one chunk and batches spanning several chunks
    rng = np.random.default_rng(0)
    for rows, n in [(3, 200_000), (70, 10_000)]:
        logits = rng.normal(0.0, 3.0, (rows, n))
        Q = np.exp(logits - logits.max(axis=-1, keepdims=True))
        Q /= Q.sum(axis=-1, keepdims=True)
        P = np.exp(logits + rng.normal(0.0, 1.0, (rows, n)) - logits.max(axis=-1, keepdims=True))
        P /= P.sum(axis=-1, keepdims=True)
        got = otspec.alpha_k(P, Q, [1, 2, 8, 16])
        np.testing.assert_allclose(got, _per_row(P, Q, [1, 2, 8, 16]), rtol=0, atol=TOL)


def test_huge_k_is_the_limit_not_an_overflow():
    # issue 15: alpha_k(p, q, 10**20) raised OverflowError; the answer is the limit q(supp p)
    p, q = [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]
    assert otspec.alpha_k(p, q, 10**20) == pytest.approx(0.5, abs=1e-15)
    assert otspec.alpha_k([0.5, 0.5], [0.9, 0.1], 10**20) == 1.0
    assert otspec.alpha_k([0.5, 0.5], [0.9, 0.1], [2, 10**20]).tolist()[1] == 1.0
    P = np.array([p, [0.25, 0.25, 0.5]])
    Q = np.array([q, [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(otspec.alpha_k(P, Q, 10**20), [0.5, 1.0], rtol=0, atol=1e-15)
    assert otspec.min_cut([0.5, 0.5], [0.9, 0.1], 10**20).alpha == 1.0


def test_batched_errors_name_the_parameter():
    P = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="`p` and `q` must have the same shape"):
        otspec.alpha_k(P, np.full((2, 4), 0.25), 2)
    with pytest.raises(ValueError, match="every row of `q` must sum to 1"):
        otspec.alpha_k(P, np.full((2, 3), 0.3), 2)
    with pytest.raises(ValueError, match="`p` must be non-negative"):
        otspec.alpha_k(np.array([[1.5, -0.5, 0.0]] * 2), P, 2)
    with pytest.raises(ValueError, match="`q` must be finite"):
        otspec.alpha_k(P, np.array([[np.nan, 0.5, 0.5]] * 2), 2)
    with pytest.raises(TypeError, match="`p` must be real-valued"):
        otspec.alpha_k(P.astype(complex), P, 2)
    with pytest.raises(TypeError, match="`q` must hold real numbers"):
        otspec.alpha_k(P, np.ones((2, 3), dtype=bool), 2)
    with pytest.raises(ValueError, match="`method` must be 'exact'"):
        otspec.alpha_k(P, P, 2, method="lp")
    with pytest.raises(ValueError, match="`p` must have a non-empty last"):
        otspec.alpha_k(np.zeros((2, 0)), np.zeros((2, 0)), 2)
    with pytest.raises(ValueError, match="`k`"):
        otspec.alpha_k(P, P, 0)
    with pytest.raises(TypeError, match="`k`"):
        otspec.alpha_k(P, P, 2.5)
    with pytest.raises(ValueError, match="positive total"):
        otspec.alpha_k(np.zeros((2, 3)), P, 2, normalize=True)


def test_batched_normalize_and_float32():
    rng = np.random.default_rng(3)
    W, U = rng.random((4, 30)), rng.random((4, 30))
    got = otspec.alpha_k(W, U, 3, normalize=True)
    ref = [otspec.alpha_k(w, u, 3, normalize=True) for w, u in zip(W, U)]
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)
    # float32 rows (summing to 1 only to float32 precision) are accepted and
    # renormalised in float64: the value of the renormalised float64 laws
    P32 = (W / W.sum(-1, keepdims=True)).astype(np.float32)
    Q32 = (U / U.sum(-1, keepdims=True)).astype(np.float32)
    got32 = otspec.alpha_k(P32, Q32, 3)
    assert got32.dtype == np.float64
    P64 = P32.astype(np.float64)
    Q64 = Q32.astype(np.float64)
    ref32 = [otspec.alpha_k(p / p.sum(), q / q.sum(), 3) for p, q in zip(P64, Q64)]
    np.testing.assert_allclose(got32, ref32, rtol=0, atol=TOL)


# -- torch ---------------------------------------------------------------------------


torch = pytest.importorskip("torch")


@given(pq=batches(max_rows=4), k=st.integers(1, 20))
def test_torch_in_torch_out(pq, k):
    P, Q = pq
    Pt, Qt = torch.from_numpy(P.copy()), torch.from_numpy(Q.copy())
    got = otspec.alpha_k(Pt, Qt, k)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    assert got.device == Pt.device and tuple(got.shape) == P.shape[:-1]
    np.testing.assert_allclose(got.numpy(), _per_row(P, Q, k), rtol=0, atol=TOL)
    assert torch.equal(Pt, torch.from_numpy(P))  # not mutated


def test_torch_one_position_and_sequence_of_k():
    p = torch.tensor([0.75, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.75], dtype=torch.float64)
    a = otspec.alpha_k(p, q, 2)
    assert isinstance(a, torch.Tensor) and a.shape == () and float(a) == pytest.approx(0.6875, abs=1e-15)
    seq = otspec.alpha_k(p, q, [1, 2, 3])
    assert tuple(seq.shape) == (3,)
    np.testing.assert_allclose(seq.numpy(), [0.5, 0.6875, 0.828125], rtol=0, atol=1e-15)
    # float32 logits' softmax, as a model would produce them
    logits = torch.randn(2, 5, 1000, generator=torch.Generator().manual_seed(0))
    P32 = torch.softmax(logits, dim=-1)
    Q32 = torch.softmax(1.3 * logits, dim=-1)
    got = otspec.alpha_k(P32, Q32, 4)
    P64, Q64 = P32.double().numpy(), Q32.double().numpy()
    ref = _per_row(P64 / P64.sum(-1, keepdims=True), Q64 / Q64.sum(-1, keepdims=True), 4)
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=TOL)


def test_torch_errors():
    P = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="same array library"):
        otspec.alpha_k(P, P.numpy(), 2)
    with pytest.raises(ValueError, match="every row of `p`"):
        otspec.alpha_k(P * 1.1, P, 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_in_cuda_out():
    rng = np.random.default_rng(1)
    P = rng.dirichlet(np.ones(5000), size=8)
    Q = rng.dirichlet(np.ones(5000), size=8)
    got = otspec.alpha_k(torch.from_numpy(P).cuda(), torch.from_numpy(Q).cuda(), [2, 8])
    assert got.is_cuda and got.dtype == torch.float64
    np.testing.assert_allclose(got.cpu().numpy(), _per_row(P, Q, [2, 8]), rtol=0, atol=TOL)


# -- the other per-position quantities ------------------------------------------------------

from otspec.multidraft import (  # noqa: E402
    batched_kseq_acceptance,
    batched_kseq_rho_star,
    batched_maximal_coupling_acceptance,
)
from otspec.multidraft._kseq import _f  # noqa: E402


@given(pq=batches(), k=st.integers(1, 12))
def test_batched_kseq_and_maximal_coupling_equal_per_row(pq, k):
    P, Q = pq
    rho = batched_kseq_rho_star(P, Q, k)
    acc = batched_kseq_acceptance(P, Q, k)
    tv = batched_maximal_coupling_acceptance(P, Q)
    assert rho.shape == acc.shape == tv.shape == P.shape[:-1]
    for i in range(P.shape[0]):
        p, q = P[i], Q[i]
        ref = otspec.kseq_rho_star(p, q, k)
        # rho* is ill-conditioned where f is flat: two float routes may return different
        # roots; then both must be roots within rounding and f must be flat between them
        if abs(rho[i] - ref) > TOL:
            lo, hi = sorted((float(rho[i]), ref))
            assert max(abs(_f(p, q, k, x)) for x in np.linspace(lo, hi, 5)) <= 1e-14
        assert abs(acc[i] - otspec.kseq_p_acc(p, q, k, ref)) <= TOL
        assert abs(tv[i] - otspec.maximal_coupling(p, q).acceptance()) <= TOL


def test_batched_kseq_torch_and_leading_axes():
    rng = np.random.default_rng(4)
    P = rng.dirichlet(np.ones(300), size=(2, 3))
    Q = rng.dirichlet(np.ones(300), size=(2, 3))
    got = batched_kseq_acceptance(torch.from_numpy(P), torch.from_numpy(Q), 4)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 3)
    ref = [[otspec.kseq_p_acc(P[i, j], Q[i, j], 4, otspec.kseq_rho_star(P[i, j], Q[i, j], 4)) for j in range(3)]
           for i in range(2)]
    np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=TOL)
    tv = batched_maximal_coupling_acceptance(torch.from_numpy(P), torch.from_numpy(Q))
    np.testing.assert_allclose(tv.numpy(), np.minimum(P, Q).sum(-1), rtol=0, atol=TOL)
    with pytest.raises(TypeError, match="`k`"):
        batched_kseq_rho_star(P, Q, [2, 3])


def test_vectorised_array_api_route_equals_per_row():
    """The array-API route (what CUDA arrays take) on host arrays: numpy and torch namespaces, per-row values to 1e-12."""
    import array_api_compat

    from otspec.otm._alpha import _exact_batched

    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.full(40, 0.3), size=(3, 4))
    Q = rng.dirichlet(np.full(40, 0.3), size=(3, 4))
    P[0, 0, :5] = 0.0
    P[0, 0] /= P[0, 0].sum()
    Q[1, 2] = P[1, 2]  # p = q row
    ks = np.array([1, 2, 5, 16])
    want = np.array([[otspec.alpha_k(P[i, j], Q[i, j], ks) for j in range(4)] for i in range(3)])
    got = _exact_batched(P, Q, ks, array_api_compat.array_namespace(P))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    torch = pytest.importorskip("torch")
    Pt, Qt = torch.from_numpy(P), torch.from_numpy(Q)
    got_t = _exact_batched(Pt, Qt, ks, array_api_compat.array_namespace(Pt))
    assert isinstance(got_t, torch.Tensor)
    np.testing.assert_allclose(got_t.numpy(), want, rtol=0, atol=1e-12)


def test_threads_give_the_same_values_bit_for_bit():
    rng = np.random.default_rng(12)
    P = rng.dirichlet(np.ones(5000), size=16)
    Q = rng.dirichlet(np.ones(5000), size=16)
    serial = otspec.alpha_k(P, Q, [2, 8], workers=1)
    for w in (None, -1, 2, 64):
        np.testing.assert_array_equal(otspec.alpha_k(P, Q, [2, 8], workers=w), serial)


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (1.5, TypeError), (True, TypeError)])
def test_workers_validation(bad, exc):
    P = np.full((2, 3), 1 / 3)
    with pytest.raises(exc, match="`workers`"):
        otspec.alpha_k(P, P, 2, workers=bad)


@pytest.mark.parametrize("p,q,k", [
    ([0.5, 0.0, 0.5], [0.0, 1.0 - 1.48366070e-07, 1.48366070e-07], 2),
    ([0.5, 0.0, 0.5], [0.0, 1.0 - 3e-12, 3e-12], 5),
    ([0.25, 0.25, 0.5], [1e-9, 1.0 - 2e-9, 1e-9], 3),
])
def test_batched_kseq_rho_star_where_beta_is_tiny(p, q, k):
    # beta(rho*) tiny: D and E^k both near 1, the float test D > E^k places the root only to eps (D + k E^k) / beta;
    # the batched call equals the per-row search (within a few ulps of a 1,200-bit root, tests/test_kseq.py) to 4 ulps
    # (the float test alone gave 1.99999992164 against 1.99999992582 in the first case)
    P, Q = np.array([p, [0.5, 0.5, 0.0]]), np.array([q, [0.25, 0.25, 0.5]])
    got = batched_kseq_rho_star(P, Q, k)
    want = otspec.kseq_rho_star(np.array(p), np.array(q), k)
    assert abs(got[0] - want) <= 4 * np.spacing(want)
    assert abs(got[1] - otspec.kseq_rho_star(P[1], Q[1], k)) <= TOL  # a row of overlapping laws: the float test
