"""The optimal verifier's status compares the size of the gap: an acceptance above alpha_k is never "optimal".

:math:`\\alpha_k(p, q)` is the optimum over every lossless ``k``-draft
verifier, so ``gap = alpha_k - acceptance`` is non-negative up to rounding.
The status is ``"optimal"`` only when ``|gap| <= tol``; an acceptance above
:math:`\\alpha_k` by at most the construction's float64 rounding bound (only
when a ``tol`` below it is asked for) is ``"rounding"``; by more, the
construction is wrong and raises ``RuntimeError`` with the numbers. The
former rule, ``gap <= tol`` on the signed gap, called any acceptance above
the optimum "optimal".

Independent routes: the forced acceptances are built through the private
constructor (a ``z`` that is not the law of any selection rule: ``z = q``
with :math:`\\alpha_k < 1`, whose ``acceptance`` is 1) or by replacing the
acceptance sum (monkeypatch); :math:`\\alpha_k` of the doc example is
0.86 in exact arithmetic (``1 + q(A) - p(A)^2`` over the subsets, by hand:
``A = {0}``, ``1 + 0.2 - 0.25 = 0.95``; ``A = {0, 1}``, ``1 + 0.5 - 0.64 = 0.86``);
the real verifiers' statuses are checked against the former rule, which
they satisfy wherever the gap is at least ``-tol`` (always, on every input
tried: hypothesis over pairs with ties, one-hot targets, subnormal masses,
zeros, and ``k`` from 1 to ``2^62``).

The leaner increments of the huge-``k`` route (no masked copies, in-place
powers, ``log1p(-1)`` left at -1 from ``k = 38`` on) are checked bit for bit
against the former masked formula, inputs untouched.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import otspec
from otspec.multidraft._optimal_verifier import OPTIMALITY_TOL, OptimalVerifier
from otspec.multidraft._priority_keys import PriorityKeyVerifier
from tests.test_optimal_verifier_slow_path_ca import _tiny_pair  # the huge-k tests' pairs

P3, Q3 = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.3, 0.5])
ALPHA3 = 0.86  # alpha_2(P3, Q3), by hand (module docstring)


def _invalid_z_verifier(tol=OPTIMALITY_TOL):
    """An ``OptimalVerifier`` whose ``z`` is ``q`` (not the law of its one order): acceptance 1 > alpha_2 = 0.86."""
    blocks = [(np.ones(1), np.arange(3)[None, :])]
    return OptimalVerifier(P3, Q3, 2, blocks, alpha=ALPHA3, status="optimal", method="direct", n_iter=0, tol=tol,
                           z=Q3.copy())


def test_alpha_of_the_example_by_hand():
    assert abs(float(otspec.alpha_k(P3, Q3, 2)) - ALPHA3) <= 1e-15


def test_invalid_z_is_an_internal_error_not_optimal():
    # former rule: gap = 0.86 - 1 = -0.14 <= tol, "optimal"
    with pytest.raises(RuntimeError, match=r"acceptance 1\.0 of the 'direct' construction .* exceeds alpha_k = 0\.86 "
                                           r"by 1\.400e-01"):
        _invalid_z_verifier()
    # a larger tol does not make it valid: still beyond tol
    with pytest.raises(RuntimeError, match="exceeds alpha_k"):
        _invalid_z_verifier(tol=0.1)


def test_valid_z_same_private_path_is_optimal():
    # the same private route with the optimal z (a valid selection law): no error, "optimal"
    v = otspec.optimal_verifier(P3, Q3, 2, method="direct")
    blocks = [(np.asarray(v.weights), np.asarray(v.orders))]
    w = OptimalVerifier(P3, Q3, 2, blocks, alpha=v.alpha, status="optimal", method="direct", n_iter=0,
                        tol=OPTIMALITY_TOL)
    assert w.status == "optimal" and abs(w.gap) <= w.tol
    np.testing.assert_allclose(w.z, v.z, rtol=0, atol=1e-15)


def _force(monkeypatch, cls, excess):
    """Replace ``cls``'s acceptance sum by ``alpha + excess``."""
    monkeypatch.setattr(cls, "_exact_acceptance", lambda self, alpha, tol: alpha + excess)


@pytest.mark.parametrize("method, cls", [("keys", PriorityKeyVerifier), ("direct", OptimalVerifier),
                                         ("colgen", OptimalVerifier)])
def test_forced_acceptance_above_alpha_raises(monkeypatch, method, cls):
    _force(monkeypatch, cls, 1e-9)  # far beyond the rounding bound (1e-12 here)
    with pytest.raises(RuntimeError, match=rf"the '{method}' construction \(n=3, k=2\) exceeds alpha_k = 0\.86"):
        otspec.optimal_verifier(P3, Q3, 2, method=method)


@pytest.mark.parametrize("method, cls", [("keys", PriorityKeyVerifier), ("direct", OptimalVerifier),
                                         ("colgen", OptimalVerifier)])
def test_forced_acceptance_above_alpha_by_rounding(monkeypatch, method, cls):
    _force(monkeypatch, cls, 5e-13)  # within the rounding bound max(1e-12, 4 (n + k + m) eps) = 1e-12
    v = otspec.optimal_verifier(P3, Q3, 2, method=method)  # default tol: 1e-12 (keys, direct), 1e-10 (colgen)
    assert v.gap < 0 and v.status == "optimal" and v.success
    # a tol below the rounding bound: above alpha_k by more than tol, but by rounding alone
    # (former rule: "optimal", the signed gap being below any tol)
    v = otspec.optimal_verifier(P3, Q3, 2, method=method, tol=1e-13)
    assert v.status == "rounding" and not v.success and v.gap < -v.tol
    assert v.method == method  # returned as is: no fallback (no construction rounds better)
    assert "status='rounding'" in repr(v)


def test_forced_short_of_alpha_keeps_its_status(monkeypatch):
    # a positive gap above tol: as before ("suboptimal", then the fallback)
    _force(monkeypatch, OptimalVerifier, -1e-6)
    v = otspec.optimal_verifier(P3, Q3, 2, method="direct", max_iter=1)
    assert v.gap > v.tol and v.status == "suboptimal" and v.method == "direct"
    monkeypatch.undo()
    _force(monkeypatch, PriorityKeyVerifier, -1e-6)
    v = otspec.optimal_verifier(P3, Q3, 2)  # the layout "suboptimal": the mixture of orders instead
    assert isinstance(v, OptimalVerifier) and v.method == "direct" and v.status == "optimal"


# -- real verifiers: statuses as before ------------------------------------------------------------------

_KS = (1, 2, 3, 8, 64, 65, 10**4, 2**40, 2**62)
_SPECIAL = st.sampled_from([0.0, 1.0, 5e-324, 1e-310, 1e-300, 1e-17, 1e-9, 0.25, 0.5, 1 / 3])
_MASS = st.one_of(_SPECIAL, st.floats(0.0, 1.0), st.floats(1e-12, 1e-6))


@st.composite
def _pairs(draw):
    n = draw(st.integers(1, 10))
    p = np.array(draw(st.lists(_MASS, min_size=n, max_size=n)))
    kind = draw(st.sampled_from(["independent", "equal", "ties", "one-hot", "reversed"]))
    if kind == "independent":
        q = np.array(draw(st.lists(_MASS, min_size=n, max_size=n)))
    elif kind == "equal":
        q = p.copy()
    elif kind == "ties":
        q = np.full(n, draw(_MASS))
        p[: n // 2] = p[0]
    elif kind == "one-hot":
        q = np.zeros(n)
        q[draw(st.integers(0, n - 1))] = 1.0
    else:
        q = p[::-1].copy()
    if not p.sum() > 0:
        p = np.ones(n)
    if not q.sum() > 0:
        q = np.ones(n)
    return p / p.sum(), q / q.sum()


def _check_real(v):
    # no real input reaches an acceptance above alpha_k beyond tol; there the former and the new rule agree
    assert v.gap >= -v.tol, (v.gap, v.tol, v.status, v.method)
    assert (v.status == "optimal") == (v.gap <= v.tol) == (abs(v.gap) <= v.tol)


@given(_pairs(), st.sampled_from(_KS), st.sampled_from(["keys", "direct", "colgen"]))
def test_real_verifiers_never_above_alpha(pq, k, method):
    p, q = pq
    if method == "keys" and k >= 2**63:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # subnormal ratios in the LP's pricing
        v = otspec.optimal_verifier(p, q, k, method=method, normalize=True)
    _check_real(v)
    if method != "colgen":  # the closed-form constructions reach alpha_k on these pairs
        assert v.status == "optimal", (v.gap, v.tol, v.status)


def _llm_like(n, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, n)
    q = np.exp(logits - logits.max())
    d = logits + rng.normal(0.0, 1.0, n)
    p = np.exp(d - d.max())
    return p / p.sum(), q / q.sum()


def _dirichlet(n, a, seed):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(n, a)), rng.dirichlet(np.full(n, a))


_CASES = [("doc", lambda k: (P3, Q3)), ("llm-like 300", lambda k: _llm_like(300, 8)),
          ("dir0.1 300", lambda k: _dirichlet(300, 0.1, 1)), ("dir1 200", lambda k: _dirichlet(200, 1.0, 0)),
          ("tiny 0", lambda k: _tiny_pair(k, 0, 0.005, 0.5)), ("tiny 137", lambda k: _tiny_pair(k, 137, 0.01, 1.0))]


_CASE_KS = [(label, make, k) for label, make in _CASES for k in (1, 2, 8, 64, 65, 10**4, 10**6, 2**40)
            if k >= 64 or not label.startswith("tiny")]  # the tiny masses are U(lo, hi) / k: huge k only


@pytest.mark.parametrize("label, make, k", _CASE_KS, ids=[f"{c[0]}-{c[2]}" for c in _CASE_KS])
@pytest.mark.parametrize("method", ["keys", "direct"])
def test_real_verifiers_status_unchanged(label, make, k, method):
    p, q = make(k)
    v = otspec.optimal_verifier(p, q, k, method=method)
    _check_real(v)
    assert v.status == "optimal", (v.gap, v.tol, v.status, v.method)


# -- the increments of the huge-k route, leaner: the same bits as the plain formula -------------------------


def _increments_reference(x, c, k, depth=None):
    """``-c**k expm1(k log1p(-x/c))`` cell by cell, the former masked form (powers from ``depth`` when given)."""
    out = np.zeros(x.shape[0])
    pos = c > 0
    if depth is not None:
        pos &= depth < 1.0
    if not pos.any():
        return out
    cp = c[pos]
    with np.errstate(divide="ignore"):
        t = np.log1p(-np.minimum(x[pos] / cp, 1.0))
    t *= float(k)  # float(k): numpy 1.26 makes a Python int past int64 an object operand (numpy 2 converts it so)
    np.expm1(t, out=t)
    ck = cp ** float(k) if depth is None else np.exp(float(k) * np.log1p(-np.maximum(depth[pos], 0.0)))
    out[pos] = -t * ck
    return out


@pytest.mark.parametrize("k", [1, 2, 17, 37, 38, 64, 65, 10**4, 2**62, 10**30])
def test_increments_bit_for_bit(k):
    from otspec.multidraft._submodular import _increments_transcendental

    rng = np.random.default_rng(k % 2**32)
    for trial in range(60):
        m = int(rng.integers(1, 200))
        c = rng.uniform(0.0, 1.0, m) ** rng.choice([1, 5, 50])
        x = c * rng.uniform(0.0, 1.2, m)  # x > c too (the ratio is capped at 1)
        x[rng.integers(0, m)] = c[rng.integers(0, m)]
        j = rng.integers(0, m)
        x[j] = c[j]  # x = c: log1p(-1) = -inf, the case the k >= 38 route leaves at -1
        if trial % 3 == 0:
            c[rng.integers(0, m)] = 0.0
        if trial % 4 == 0:
            c[rng.integers(0, m)] = 5e-324
        d = 1.0 - c
        if trial % 5 == 0:
            d[rng.integers(0, m)] = 1.0
        d[rng.integers(0, m)] = -1e-17
        x0, c0, d0 = x.copy(), c.copy(), d.copy()
        for dep in (None, d):
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                got = _increments_transcendental(x, c, k, dep)
                want = _increments_reference(x, c, k, dep)
            np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))
        # inputs untouched
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(c, c0)
        np.testing.assert_array_equal(d, d0)
