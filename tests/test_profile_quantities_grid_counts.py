"""k-Seq's rho* search by counts and the verifiers' per-``k`` quantities over every ``k`` at once, bit for bit.

:func:`otspec.multidraft._batched._first_false` takes each round's first false candidate as the number of true ones
(the test is true then false along a row) and returns ``b = min(a + 1, hi)`` instead of carrying ``b``; these tests
hold it to the full bisection (:func:`otspec.multidraft._batched._bisect` of :data:`_BISECT` steps) on adversarial
rows: ties, zeros, ``p = q``, roots at an end of the bracket or one float inside it. The batched-``k`` forms of
:func:`otspec.profile._quantities_batched.acceptance_rows` are held to one ``k`` at a time (the former loop, here).
"""

from __future__ import annotations

import math

import array_api_compat
import numpy as np
import pytest

import otspec.multidraft._batched as MB
from otspec.profile import _quantities_batched as QB

torch = pytest.importorskip("torch")
LIBS = [lambda a: a, torch.from_numpy]


def _adversarial_laws(V: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose rho* lies at 1, at k, at a breakpoint, between two tied breakpoints, with zeros on either side."""
    r = np.random.default_rng(23)
    rows = []
    u = np.full(V, 1.0 / V)
    rows.append((u, u))  # p = q: rho* = 1
    p = np.zeros(V)
    p[0] = 1.0
    rows.append((p, u))  # all draft mass on one token: E(rho) = 1 - 1 / (V rho), root near k
    q = np.zeros(V)
    q[:2] = 0.5
    rows.append((u, q))  # target on two tokens, ties among the other ratios (all 0)
    rows.append((np.r_[np.full(V // 2, 2.0 / V), np.zeros(V - V // 2)], u))  # p = 0 < q: ratios +inf
    t = np.r_[np.full(3, 0.2), np.full(V - 3, 0.4 / (V - 3))]
    rows.append((t, t[::-1].copy()))  # tied ratios on both sides of 1
    z = u.copy()
    z[[1, 4]] = 0.0
    rows.append((z / z.sum(), z[::-1] / z.sum()))  # p = q = 0 on some tokens: NaN ratios, weightless
    for _ in range(10):
        a = r.random(V) ** 4 * (r.random(V) < 0.6)
        b = r.random(V) ** 2 * (r.random(V) < 0.6)
        a[0] += 1e-12
        b[1] += 1e-12
        rows.append((a / a.sum(), b / b.sum()))
    P = np.stack([a for a, _ in rows])
    Q = np.stack([b for _, b in rows])
    return P, Q


@pytest.mark.parametrize("conv", LIBS, ids=["numpy", "torch"])
def test_rho_star_by_counts_is_the_bisections_on_adversarial_rows(monkeypatch, conv):
    # every row's rho* and E(rho*) (roots at 1, at k, at a breakpoint, in a tie; zeros, NaN ratios) as the full
    # bisection's, bit for bit, one k and mixed; fails with b = a (the last true float) or b = a + 2
    P, Q = (conv(x) for x in _adversarial_laws())
    xp = array_api_compat.array_namespace(P)
    n = int(P.shape[0])
    kf = xp.asarray(np.array([2.0 + i % 3 for i in range(n)]))
    calls = [2, 3, 4, 7, (kf, (2, 3, 4))]

    def run():
        return [tuple(np.asarray(a).tobytes() for a in MB._rho_star_rows(P, Q, k, xp)) for k in calls]

    got = run()
    monkeypatch.setattr(MB, "_bisect_steps", lambda k: MB._BISECT)
    monkeypatch.setattr(MB, "_BISECT_ONLY", True)
    assert run() == got


def _brackets(r, n: int):
    """``(lo, hi, Pl, Ql, Ph, Qh)``, ``(n, 1)`` each: random brackets of ``[1, 4]``, zero masses on either side."""
    Pl, Ql = r.uniform(0.2, 0.9, n), r.uniform(0.0, 0.5, n)
    Ph, Qh = 1.0 - Pl, 1.0 - Ql
    Ph[::7] = 0.0
    Ql[::5] = 0.0
    lo = np.maximum(1.0, Ql / Pl)
    hi = np.minimum(4.0, lo + r.uniform(0.0, 3.0, n))
    return [x.reshape(n, 1) for x in (lo, hi, Pl, Ql, Ph, Qh)]


def _full_bisection(lo, hi, Pl, Ql, Ph, Qh, power, xp):
    old = MB._bisect_steps
    try:
        MB._bisect_steps = lambda k_hi: MB._BISECT
        return np.asarray(MB._bisect(lo, hi, Pl, Ql, Ph, Qh, power, 4.0, xp))
    finally:
        MB._bisect_steps = old


@pytest.mark.parametrize("conv", LIBS, ids=["numpy", "torch"])
def test_first_false_by_counts_on_brackets_with_the_root_at_an_end(conv):
    # _first_false (counts, b = min(a + 1, hi)) against the bisection of _BISECT steps on every row where the test
    # holds at lo and fails at hi, and within [lo, hi] on every row: random brackets, then brackets built around each
    # root b (its two floats [b - 1, b]; [lo, b]: the root at hi; [b - 1, hi]: one float above lo; [b, b]: empty);
    # fails with b carried as a, as a + 2, or hi dropped
    r = np.random.default_rng(31)
    host = _brackets(r, 240)

    def power(x):
        return x * x

    def check(lo, hi, Pl, Ql, Ph, Qh):
        lo, hi, Pl, Ql, Ph, Qh = (conv(np.ascontiguousarray(x)) for x in (lo, hi, Pl, Ql, Ph, Qh))
        xp = array_api_compat.array_namespace(lo)
        got = np.asarray(MB._first_false(lo, hi, Pl, Ql, Ph, Qh, power, 4.0, xp))
        want = _full_bisection(lo, hi, Pl, Ql, Ph, Qh, power, xp)
        up = np.asarray(MB._go_up(lo, Pl, Ql, Ph, Qh, power, xp))
        kept = up & ~np.asarray(MB._go_up(hi, Pl, Ql, Ph, Qh, power, xp))
        np.testing.assert_array_equal(got[kept], want[kept])
        assert np.all((np.asarray(lo) <= got) & (got <= np.asarray(hi)))
        return want, kept

    want, kept = check(*host)
    assert kept.sum() >= 100
    lo, hi, rest = host[0][kept], host[1][kept], [x[kept].reshape(-1, 1) for x in host[2:]]
    b = want[kept]
    below = np.nextafter(b, 0.0)
    for name, a, c in (("two floats", below, b), ("root at hi", lo, b), ("one above lo", below, hi)):
        w, inside = check(a.reshape(-1, 1), c.reshape(-1, 1), *rest)
        assert inside.all(), name  # the test holds at b - 1 and fails at b: the root stays inside
        np.testing.assert_array_equal(w[:, 0], b, err_msg=name)
    check(b.reshape(-1, 1), b.reshape(-1, 1), *rest)  # empty brackets: within [lo, hi]


def _old_acceptance(name, P, Q, ks, xp):
    """One ``k`` at a time: the loops :func:`acceptance_rows` ran before its batched forms (the reference)."""
    P, Q = QB._simplex(P, xp), QB._simplex(Q, xp)
    V = int(P.shape[-1])
    n = QB._count_positive(P, xp)
    out = []
    if name == "multiround":
        t, logs = Q, []
        for i in range(max(ks)):
            if i:
                t = QB._residual(P, t, xp)
            logs.append(xp.log1p(-xp.clip(xp.sum(xp.minimum(P, t), axis=-1), None, 1.0)))
        cum = xp.cumulative_sum(xp.stack(logs, axis=-1), axis=-1)
        out = [-xp.expm1(cum[..., k - 1]) for k in ks]
    elif name == "top-k":
        qC = xp.cumulative_sum(MB._take_along(Q, QB.top_ids(P, min(max(ks), V), xp), xp), axis=-1)
        out = [xp.where(n < k, math.nan, xp.clip(qC[..., min(k, V) - 1], None, 1.0)) for k in ks]
    else:
        K = min(max(ks), V) - 1
        if K:
            ids = QB.top_ids(P, K, xp)
            qT = xp.cumulative_sum(MB._take_along(Q, ids, xp), axis=-1)
            pos = xp.arange(V)
        for k in ks:
            if k > V:
                out.append(xp.full(tuple(P.shape[:-1]), math.nan, dtype=xp.float64))
                continue
            if k == 1:
                val = xp.sum(xp.minimum(P / xp.sum(P, axis=-1, keepdims=True), Q), axis=-1)
            else:
                inT = xp.any(ids[..., : k - 1, None] == pos, axis=-2)
                law = xp.where(inT, 0.0, P)
                last = law / xp.sum(law, axis=-1, keepdims=True)
                val = qT[..., k - 2] + xp.sum(xp.where(inT, 0.0, xp.minimum(last, Q)), axis=-1)
            out.append(xp.where(n < k, math.nan, xp.clip(val, None, 1.0)))
    return xp.stack(out, axis=-1)


@pytest.mark.parametrize("conv", LIBS, ids=["numpy", "torch"])
@pytest.mark.parametrize("name", ["multiround", "greedy-drafts", "top-k"])
def test_every_k_at_once_is_one_k_at_a_time(conv, name):
    # the (..., k, V) blocks of greedy drafts, top-k's columns and multi-round's stacked rounds: the values of one k
    # at a time, bit for bit, on rows with ties, zeros, p = q and fewer than k tokens; ks whole (1..m) or not
    P, Q = _adversarial_laws(V=6)
    P, Q = conv(P.reshape(2, 8, 6)), conv(Q.reshape(2, 8, 6))
    xp = array_api_compat.array_namespace(P)
    for ks in ((1, 2, 3, 4), (2, 4), (3,), (1, 2, 3, 4, 5, 6, 7), (2, 9)):
        if name == "multiround" and max(ks) > 6:
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            got = np.asarray(QB.acceptance_rows(name, P, Q, ks, xp))
            want = np.asarray(_old_acceptance(name, P, Q, ks, xp))
        assert got.shape == want.shape == (2, 8, len(ks))
        np.testing.assert_array_equal(got, want)


def test_the_renormalised_laws_are_kept_only_while_the_tensors_are_unwritten():
    # a second verifier on the same laws reuses their renormalised rows; a law written in place in between is
    # renormalised again (its version counter moved): fails if the cache ignored the version
    P, Q = (torch.from_numpy(x) for x in _adversarial_laws())
    xp = array_api_compat.array_namespace(P)
    first = QB.acceptance_rows("top-k", P, Q, (1, 2), xp)
    again = QB.acceptance_rows("top-k", P, Q, (1, 2), xp)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    P[-1] = torch.flip(P[-1], (0,))
    moved = QB.acceptance_rows("top-k", P, Q, (1, 2), xp)
    fresh = QB.acceptance_rows("top-k", P.clone(), Q.clone(), (1, 2), xp)
    np.testing.assert_array_equal(moved.numpy(), fresh.numpy())
    assert not np.array_equal(moved.numpy(), first.numpy(), equal_nan=True)
