"""k-Seq's batched rho* where beta(rho*) is tiny, and its acceptance where ``1 - E^k`` cancels, against mpmath.

The batched search (:func:`otspec.multidraft._batched._rho_star_rows`) reads the sign of ``f = D - E^k`` by the float
test ``D > E^k``, which places the root only to about ``eps (D + k E^k) / beta``: where ``beta(rho*)`` is tiny both
sides are near 1 and their difference has lost the bits that place the root (on torch, ``p = [1/2, 0, 1/2]``,
``q = [0, 1 - 1.5e-7, 1.5e-7]``, ``k = 2`` gave 1.9999999248174 for 1 + sqrt(1 - 1.5e-7) = 1.99999992499999719; with
an overlap of 1e-16 it gave 1 for 2). Those rows now take a second search in the ``c(beta) - rho`` form on a device
(numpy rows: the per-row search), and k-Seq's acceptance below 1/2 is the accepted mass ``1 - (1 - beta)^k`` by
``log1p``/``expm1`` (``1 - E^k`` gave 0 for an acceptance of 1e-300).

Independent routes: closed forms (the family ``p = [1/2, 0, 1/2]``, ``q = [0, 1 - e, e]``: ``beta(rho) = e / rho``,
so ``rho* = 1 + sqrt(1 - e)`` at ``k = 2`` and ``p_acc(rho*) = rho* beta(rho*) = 1 - D = e`` at every ``k``), and
mpmath at 50 digits on the laws' floats (rho* by 200 bisection steps of ``c(beta) - rho``,
``c(beta) = sum_{i<k} (1 - beta)^i``, a sum of positive terms: no cancellation at any beta). Nothing here is random
but hypothesis's draws (derandomized), so no test fails by chance.
"""

from __future__ import annotations

import array_api_compat
import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import otspec
from otspec._validation import validate_pair
from otspec.multidraft import _batched as MB
from otspec.multidraft import batched_kseq_acceptance, batched_kseq_rho_star

torch = pytest.importorskip("torch")

#: rho* of each route within this many ulps (2^-52 relative) of mpmath's: the c(beta) - rho form's error is about
#: 4 eps rho beta on f, whose slope is -beta (measured: at most 1.25 on the laws below, k = 2..8).
ULPS = 4
#: An acceptance within this many ulps of mpmath's at the exact rho*: the rounding of rho* (relative sensitivity
#: at most 1) and of beta's sum, log1p, expm1.
ACC_ULPS = 8


def _rel(x, exact) -> float:
    """``|x - exact| / exact`` in units of 2^-52 (mpmath)."""
    exact = mpmath.mpf(exact)
    return float(abs(mpmath.mpf(float(x)) - exact) / exact / mpmath.mpf(2) ** -52)


def ref_rho(p, q, k: int):
    """rho* of the float laws ``p, q`` by mpmath: 200 bisection steps on [1, k] of ``c(beta(rho)) - rho``."""
    with mpmath.workdps(50):
        pm = [mpmath.mpf(float(x)) for x in p]
        qm = [mpmath.mpf(float(x)) for x in q]

        def g(r):
            b = mpmath.fsum(min(a, c / r) for a, c in zip(pm, qm))
            return mpmath.mpf(0) if b == 0 else mpmath.fsum((1 - b) ** i for i in range(k)) - r

        lo, hi = mpmath.mpf(1), mpmath.mpf(k)
        if g(lo) <= 0:
            return lo
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if g(mid) > 0 else (lo, mid)
        return hi


def ref_acc(p, q, k: int, rho):
    """``1 - (1 - beta(rho))^k`` by mpmath (``-expm1(k log1p(-beta))``: exact at any beta)."""
    with mpmath.workdps(50):
        b = mpmath.fsum(min(mpmath.mpf(float(a)), mpmath.mpf(float(c)) / rho) for a, c in zip(p, q))
        return -mpmath.expm1(k * mpmath.log1p(-b))


def tiny_laws(eps: float, V: int = 5, seed: int = 0):
    """Laws whose overlap is about ``eps``: ``p`` on two tokens, ``q`` on the others but ``eps`` of its mass there
    (validated as the public functions validate: subnormal entries are 0)."""
    r = np.random.default_rng(seed)
    p, q = np.zeros(V), np.zeros(V)
    p[:2] = r.dirichlet([1.0, 1.0])
    q[2:] = r.dirichlet(np.ones(V - 2))
    q[:2] = eps * r.dirichlet([1.0, 1.0])
    q /= q.sum()
    return validate_pair(p, q)


def _routes(P, Q, k):
    """rho* of the numpy batch, the torch batch and the per-row search, each ``(B,)`` numpy."""
    n = np.asarray(batched_kseq_rho_star(P, Q, k))
    t = batched_kseq_rho_star(torch.from_numpy(P), torch.from_numpy(Q), k).numpy()
    one = np.array([otspec.kseq_rho_star(p, q, k) for p, q in zip(P, Q)])
    return n, t, one


@pytest.mark.parametrize("eps", [1.5e-7, 1e-12, 1e-16, 1e-40, 1e-300])
def test_rho_star_at_a_tiny_overlap_is_the_closed_form(eps):
    # p = [1/2, 0, 1/2], q = [0, 1 - e, e], k = 2: rho* = 1 + sqrt(1 - e). The float test alone (torch before)
    # gave 1.9999999248174 at e = 1.5e-7 (73 ulps off), 1 at e = 1e-16 (for 2)
    P = np.array([[0.5, 0.0, 0.5]])
    Q = np.array([[0.0, 1.0 - eps, eps]])
    with mpmath.workdps(50):
        exact = 1 + mpmath.sqrt(1 - mpmath.mpf(float(Q[0, 2])))  # beta = e / rho: rho = 2 - e / rho
    for got in _routes(P, Q, 2):
        assert _rel(got[0], exact) <= ULPS, (got[0], exact)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("eps", [0.3, 1e-9, 5e-300])
def test_acceptance_at_a_tiny_overlap_is_the_overlap(k, eps):
    # the same family: p_acc(rho*) = rho* beta(rho*) = 1 - D(rho*) = e at every k (k = 1: sum min(p, q) = e).
    # 1 - E^k gave 0 at e = 5e-300 (and lost ~7 digits at 1e-9)
    P = np.array([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]])
    Q = np.array([[0.0, 1.0 - eps, eps], [eps, 1.0 - eps, 0.0]])
    for A, B in ((P, Q), (torch.from_numpy(P), torch.from_numpy(Q))):
        got = np.asarray(batched_kseq_acceptance(A, B, k))
        for i in range(2):
            assert _rel(got[i], Q[i].min(where=Q[i] > 0, initial=1.0)) <= ACC_ULPS, (k, eps, i, got[i])


@pytest.mark.parametrize("k", [2, 3, 5, 8])
def test_tiny_beta_rows_of_every_route_are_mpmath_s(k):
    # overlaps from 1e-3 (normal rows) to 1e-300 and none (disjoint supports: rho* = 1, acceptance 0)
    laws = [tiny_laws(eps, seed=s) for eps in (1e-3, 1.5e-7, 1e-16, 1e-100, 1e-300, 0.0) for s in (0, 1)]
    P, Q = np.array([a for a, _ in laws]), np.array([b for _, b in laws])
    routes = _routes(P, Q, k)
    acc = [np.asarray(batched_kseq_acceptance(P, Q, k)),
           batched_kseq_acceptance(torch.from_numpy(P), torch.from_numpy(Q), k).numpy()]
    for i in range(P.shape[0]):
        exact = ref_rho(P[i], Q[i], k)
        for name, got in zip(("numpy", "torch", "per-row"), routes):
            assert _rel(got[i], exact) <= ULPS, (name, i, got[i], exact)
        want = ref_acc(P[i], Q[i], k, exact)
        for got in acc:
            assert (got[i] == 0.0 and want == 0) or _rel(got[i], want) <= ACC_ULPS, (i, got[i], want)


def _flag(P, Q, k):
    """The rows the float test places to more than ``_TINY_BETA_ULPS`` ulps (numpy), at the float search's root."""
    S = MB._ratio_sorted(P, Q, np)
    kf, power = MB._per_row_k(k, P.shape[0], np)
    rho = MB._root_rows(S, kf, power, float(k), np)
    return MB._tiny_beta_flags(P, Q, rho, kf, np)[:, 0]


@st.composite
def mixed_batches(draw):
    """A batch of normal rows (Dirichlet pairs) and tiny-overlap rows (overlap 10^-e, e in [4, 300]), shuffled."""
    k = draw(st.integers(2, 6))
    V = draw(st.integers(3, 9))
    seed = draw(st.integers(0, 2**32 - 1))
    exps = draw(st.lists(st.floats(4.0, 300.0), min_size=1, max_size=3))
    n_normal = draw(st.integers(1, 4))
    r = np.random.default_rng(seed)
    rows = [validate_pair(r.dirichlet(np.full(V, 0.7)), r.dirichlet(np.full(V, 0.7))) for _ in range(n_normal)]
    rows += [tiny_laws(10.0 ** -e, V, int(r.integers(2**31))) for e in exps]
    order = r.permutation(len(rows))
    return k, np.array([rows[i][0] for i in order]), np.array([rows[i][1] for i in order])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_batches())
def test_mixed_batches_host_torch_and_per_row_agree(case):
    k, P, Q = case
    n, t, one = _routes(P, Q, k)
    xp = array_api_compat.array_namespace(torch.zeros(1))
    plain = MB._rho_star_rows(torch.from_numpy(P), torch.from_numpy(Q), k, xp, tiny_beta=False)[0].numpy()
    flag = _flag(P, Q, k)
    assert flag.any()  # the tiny rows are flagged (a flag that never fires would leave them to the float test)
    for i in range(P.shape[0]):
        if flag[i]:  # every route within ULPS of mpmath (the float test alone: up to 2^52 ulps off)
            exact = ref_rho(P[i], Q[i], k)
            for name, got in (("numpy", n), ("torch", t), ("per-row", one)):
                assert _rel(got[i], exact) <= ULPS, (name, i, got[i], exact)
        else:  # a normal row: torch's value is the float test's, bit for bit, and the routes agree to 1e-12
            assert t[i] == plain[i], i
            assert abs(t[i] - n[i]) <= 1e-12 * n[i] and abs(one[i] - n[i]) <= 1e-12 * n[i], (i, t[i], n[i], one[i])


def test_acceptance_at_or_above_one_half_keeps_one_minus_e_to_the_k():
    # rows of acceptance >= 1/2: 1 - E^k, bit for bit (E of _rho_star_rows); below: the accepted mass, not 1 - E^k
    r = np.random.default_rng(3)
    P, Q = r.dirichlet(np.full(6, 0.4), 40), r.dirichlet(np.full(6, 0.4), 40)
    for k in (2, 4):
        got = np.asarray(batched_kseq_acceptance(P, Q, k))
        rho, E = MB._rho_star_rows(P, Q, k, np)
        old = np.clip(1.0 - E**k, 0.0, 1.0)
        hi = got >= 0.5
        assert hi.any() and (~hi).any()
        np.testing.assert_array_equal(got[hi], old[hi])
        for i in np.flatnonzero(~hi):
            assert _rel(got[i], ref_acc(P[i], Q[i], k, mpmath.mpf(float(rho[i])))) <= 2, i


def test_the_torch_route_reads_nothing_to_the_host():
    # the tiny rows' flag and second search run on the tensors' device: no item/tolist/bool/numpy of a tensor
    from torch.overrides import TorchFunctionMode

    reads = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.numpy,
             torch.Tensor.__array__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
    seen = []

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in reads:
                seen.append(func)
            return func(*args, **(kwargs or {}))

    laws = [tiny_laws(1e-200, seed=1), tiny_laws(1e-3, seed=2)]
    P = torch.from_numpy(np.array([a for a, _ in laws]))
    Q = torch.from_numpy(np.array([b for _, b in laws]))
    with Reads():
        rho = batched_kseq_rho_star(P, Q, 3, validate=False)
        acc = batched_kseq_acceptance(P, Q, 3, validate=False)
    assert seen == []
    assert _rel(float(rho[0]), ref_rho(laws[0][0], laws[0][1], 3)) <= ULPS and float(acc[0]) > 0.0


def test_rows_with_their_own_k_take_the_second_search_too():
    # one number of drafts per row (the profile's stacked requests), on torch with the tiny rows' second search: each
    # row within ULPS of mpmath for its own k (a power or a c(beta) taken with another row's k would miss by far)
    laws = [tiny_laws(eps, seed=s) for eps in (1e-3, 1e-16, 1e-250) for s in (0, 1)]
    P = torch.from_numpy(np.array([a for a, _ in laws]))
    Q = torch.from_numpy(np.array([b for _, b in laws]))
    ks = [2, 5, 3, 2, 5, 3]
    kf = torch.tensor(ks, dtype=torch.float64)
    xp = array_api_compat.array_namespace(P)
    rho = MB._rho_star_rows(None, None, (kf, sorted(set(ks))), xp, MB._ratio_sorted(P, Q, xp))[0].numpy()
    for i, k in enumerate(ks):
        assert _rel(rho[i], ref_rho(laws[i][0], laws[i][1], k)) <= ULPS, (i, k, rho[i])
