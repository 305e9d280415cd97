"""The last expanded depth without replacement when the slot weights of two ranks round apart.

``otspec.tree._bound._wor_rows`` decides most entries of a last-depth row with a lower bound on :math:`\\pi` that reads
``dW[n - 1]`` :math:`= W_{n-1} - W_n`, the weight of the slots with exactly ``n`` children (``W = A @ C``). On
``branching(8, 7)`` every slot has 7 children, so :math:`W_0 = \\dots = W_6` exactly, but ``A @ C`` rounds each column
in its own order and a difference can come out at -1e-19: the code refused the route then, and the whole frontier
took :math:`\\pi` at every entry (the row kernel ``wor_row`` on each row, the race on every row), about twice the time
of a frontier that took it. ``_rank_drops`` now checks the structure exactly (nested incidence, nonnegative weights)
and sets such a difference to 0.

Independent routes: the rows' sums against :math:`\\sum_x \\min(Q_u q_x, \\pi_x)` with :math:`\\pi` from the race's
laws (:func:`otspec.tree._bound._wor_draw_laws`, ``math.fsum``), and the kernel calls counted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from otspec.tree import TreeShape
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K
from otspec.tree._bound import _rank_drops, _wor_draw_laws

SLOTS = 8        # depth-1 slots of branching(8, 7), each with 7 children


def _llm_row(V: int, rng) -> np.ndarray:
    z = rng.normal(0.0, rng.uniform(1.0, 6.0), V)
    p = np.exp(z - z.max())
    return p / p.sum()


def _rounded_apart(m: int):
    """Slot weights ``(m, 8)`` whose ``A @ C`` (every slot with all 7 ranks) has a rank above the one before it (a
    negative rounded difference) on this machine's BLAS, or None where no seed gives one."""
    C = np.ones((SLOTS, 7))
    for seed in range(400):
        rng = np.random.default_rng(seed)
        A = rng.dirichlet(np.ones(SLOTS), size=m) * rng.uniform(0.0, 1.0, (m, 1))
        W = A @ C
        if (W[:, :-1] - W[:, 1:] < 0).any():
            return A
    return None


def test_rank_drops_keeps_the_route_where_equal_weights_round_apart():
    # the old test (every rounded difference >= 0) returns None here: this fails on it
    C = np.ones((SLOTS, 7))
    A = np.full((3, SLOTS), 0.1)
    W = A @ C
    W[:, 3] = np.nextafter(W[:, 2], np.inf)         # W_3 one ulp above W_2: the difference rounds to -1 ulp
    dW = _rank_drops(W, A, C)
    assert dW is not None
    assert (dW >= 0).all() and (dW[:, 2] == 0).all()
    exact = W - np.concatenate([W[:, 1:], np.zeros((3, 1))], axis=1)
    keep = exact >= 0
    assert np.array_equal(dW[keep], exact[keep])    # the other differences to the bit
    assert np.array_equal(dW[:, -1], W[:, -1])


def test_rank_drops_returns_the_differences_unchanged_where_none_is_negative():
    rng = np.random.default_rng(3)
    C = (np.arange(4)[None, :] <= np.arange(5)[:, None] % 4).astype(float)   # slot k: ranks 0 .. k mod 4 (nested)
    A = rng.uniform(0.0, 1.0, (6, 5))
    W = A @ C
    exact = W - np.concatenate([W[:, 1:], np.zeros((6, 1))], axis=1)
    assert (exact >= 0).all()
    assert np.array_equal(_rank_drops(W, A, C), exact)


def test_rank_drops_refuses_what_the_bound_does_not_hold_for():
    C = np.ones((SLOTS, 7))
    A = np.full((2, SLOTS), 0.1)
    bad_c = C.copy()
    bad_c[0, 2] = 0.0                               # a slot with rank 3 but no rank 2: columns not nested
    assert _rank_drops(A @ bad_c, A, bad_c) is None
    neg = A.copy()
    neg[1, 4] = -1e-3                               # a negative slot weight
    assert _rank_drops(neg @ C, neg, C) is None


def _counting(f, calls: dict, key: str):
    def counted(*a):
        calls[key] += 1
        return f(*a)

    return counted


def test_last_depth_frontier_with_rounded_weights_takes_the_decided_route(monkeypatch):
    """A frontier of ``branching(8, 7)`` whose ``A @ C`` rounds two equal ranks apart takes the decided route (the
    code before: ``wor_row_stats`` and ``wor_row`` on every row), and each row's sum is the exact sum within 1e-12
    (relative)."""
    V, m = 600, 11                                   # an odd count: this BLAS rounds its last row's columns apart
    A = _rounded_apart(m)
    if A is None:                                   # this BLAS sums the columns alike: the case does not arise
        pytest.skip("A @ C rounds every column alike here")
    rng = np.random.default_rng(5)
    slots = B._Slots(TreeShape.branching(8, 7))
    P = np.stack([_llm_row(V, rng) for _ in range(m)])
    Qu = 0.6
    pis = []
    for i in range(m):
        laws, _ = _wor_draw_laws(P[i:i + 1], list(range(7)), exact_limit=0)
        pis.append(np.minimum(1.0, A[i].sum() * laws[:, 0].sum(axis=0)))
    Q = np.stack([pi * rng.uniform(0.5, 1.5, V) for pi in pis]) / Qu
    Q /= Q.sum(axis=1, keepdims=True)
    calls = {"decide": 0, "stats": 0}
    for name, key in (("wor_rows_decide", "decide"), ("wor_row_decide", "decide"), ("wor_row_stats", "stats")):
        monkeypatch.setattr(K, name, _counting(getattr(K, name), calls, key))
    fr = [B._Prefix((i,), Qu, 0.5, A[i].copy(), (0.02,), {}) for i in range(m)]
    assert B._expand_rows(slots, "wor", fr, list(P), list(Q), 10**6)[0] is None
    if K.JIT:   # the decided route (one decide pass per row or array), not the stats of every row apart
        assert calls["decide"] > 0 and calls["stats"] == 0, calls
    for i, u in enumerate(fr):
        ref = math.fsum(np.minimum(Qu * Q[i], pis[i]).tolist())
        assert abs(u.exact - ref) <= 1e-12 * ref, (i, u.exact, ref)
