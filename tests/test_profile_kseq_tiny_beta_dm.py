"""The profile's k-Seq rows where beta(rho*) is tiny, on torch as on numpy, against mpmath.

The profile's position solves every k-Seq rho* of the position in one search (:class:`RhoStar`) whose device rows
read the sign of ``f = D - E^k`` by the float test ``D > E^k``: where ``beta(rho*)`` is tiny that places the root only
to about ``eps (D + k E^k) / beta`` (73 ulps at an overlap of 1.5e-7; 1 for 2 at 1e-16). The rows it may misplace are
now found on the host from ``beta(rho*)``, read with the position's values, and solved again there exactly
(:func:`otspec.multidraft._kseq._rho_star_exact`), the k-Seq values of the position computed again from them; and
the profile's k-Seq acceptance below 1/2 is the accepted mass ``1 - (1 - beta)^k`` by ``log1p``/``expm1`` (``1 - E^k``
gave 0 for a true 5e-300). Independent routes: the numpy route (the per-row search on the host), and mpmath at 50
digits on the laws' floats (:mod:`tests.test_kseq_tiny_beta_di`'s references). Nothing here is random: the laws are
fixed, so no test fails by chance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import otspec.profile._quantities as PQ  # noqa: E402
from tests.test_kseq_tiny_beta_di import _rel, ref_acc, ref_rho  # noqa: E402

KS = (1, 2, 3)
L = 2
#: An acceptance within this many ulps of mpmath's at the exact rho* (tests/test_kseq_tiny_beta_di.py's bound: the
#: rounding of rho* and of beta's sum, log1p, expm1).
ACC_ULPS = 8
#: The device route's k-Seq values within this many ulps of the numpy route's (both at a root within 4 ulps of
#: mpmath's; a node's acceptance is q(x) / (rho p(x))).
ROUTE_ULPS = 16


def laws(eps: float, V: int = 5):
    """Three drafted rows of two depths: ``p`` on tokens 0, 1 and ``q`` on the others but ``eps`` of its mass on 0,
    1 (an overlap about ``eps`` at every depth), the drafts on tokens 0 and 1; ``eps = 0.3`` laws that overlap."""
    r = np.random.default_rng(7)
    k_max = 3
    P = np.zeros((k_max, L, V))
    Q = np.zeros((k_max, L + 1, V))
    base_p = r.dirichlet([1.0, 1.0], L)
    base_q = r.dirichlet(np.ones(V - 2), L + 1)
    for j in range(L):
        P[:, j, :2] = base_p[j]
    for j in range(L + 1):
        Q[:, j, 2:] = base_q[j] * (1.0 - eps)
        Q[:, j, :2] = eps * np.array([0.4, 0.6])
    X = np.array([[0, 1], [1, 0], [0, 0]], dtype=np.int64)
    return X, P, Q


def position(X, P, Q, lib: str, counts=None):
    """The k-Seq acceptance ``(L, len(KS))`` and reach ``{k: (L,)}`` of one subsampled position of the profile
    (:func:`prefill_batched`: the acceptance and every node's conditional law, one search of rho*, one read)."""
    if lib == "torch":
        P, Q = torch.from_numpy(P), torch.from_numpy(Q)
    b = PQ.Builds(X, P, Q, {})
    PQ.prefill_batched([b], ("kseq",), (), lambda name: KS, L, subsampled=[True], costly=((), ("kseq",)))
    return (np.asarray(b._batched[("kseq", KS, L)]),
            {k: np.asarray(b._batched[("reach", "kseq", k, L)]) for k in KS})


def _ulps(x, y) -> float:
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300))) / 2.0**-52


@pytest.mark.parametrize("eps", [0.3, 1.5e-7, 1e-16, 5e-300])
def test_acceptance_of_a_tiny_overlap_position_is_mpmath_s(eps):
    # k >= 2: k-Seq's acceptance at its exact rho* (the code before: 0 at 5e-300 on both routes, 1 - E^k; and its
    # device rho* 73 ulps off at 1.5e-7, whose E^k and reach follow it)
    X, P, Q = laws(eps)
    for lib in ("numpy", "torch"):
        acc, _ = position(X, P, Q, lib)
        for j in range(L):
            p, q = P[0, j], Q[0, j]
            for c, k in enumerate(KS):
                if k == 1:
                    continue
                want = ref_acc(p, q, k, ref_rho(p, q, k))
                assert _rel(acc[j, c], want) <= ACC_ULPS, (lib, eps, j, k, acc[j, c], float(want))


@pytest.mark.parametrize("eps", [1.5e-7, 1e-16, 1e-40])
def test_reach_of_a_tiny_overlap_position_is_the_numpy_route_s(eps):
    # every node's k-Seq law at its drafts follows rho* (a = q(x) / (rho* p(x))): the device's float-test root (the
    # code before) puts the reach 70 ulps or more off the numpy route's per-row root
    X, P, Q = laws(eps)
    acc_t, reach_t = position(X, P, Q, "torch")
    acc_n, reach_n = position(X, P, Q, "numpy")
    for k in KS:
        assert _ulps(reach_t[k], reach_n[k]) <= ROUTE_ULPS, (k, reach_t[k], reach_n[k])
    assert _ulps(acc_t[:, 1:], acc_n[:, 1:]) <= ROUTE_ULPS


def _reads(X, P, Q) -> int:
    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import bench_profile_ops as O
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    position(X, P, Q, "torch")  # warm-up: the constants made once per run
    c = O.Counts()
    with O.counting(c):
        position(X, P, Q, "torch")
    return c.reads


def test_reads_of_a_position():
    # laws that overlap: the position's one read (beta(rho*) travels in it); a tiny overlap: that read, then the
    # candidate rows' laws, roots and numbers of drafts (one read each), then each k-Seq part computed again (the
    # acceptance and the reach: one read each) -- a check that read every position's laws, or recomputed at every
    # position, fails the first count
    assert _reads(*laws(0.3)) == 1
    assert _reads(*laws(1e-16)) == 1 + 4 + 2
