"""k-Seq's rho*: the values of the full 80-step bisection, bit for bit, in far fewer ops.

The bisection (:func:`otspec.multidraft._batched._bisect`, the reference) halves ``[lo, hi]``
(``1 <= lo <= hi <= k``) by ``mid = 0.5 * (a + b)``; after :func:`otspec.multidraft._batched._bisect_steps` steps the
state no longer changes, whatever the test of ``mid`` (it need not even be monotone), so the state of :data:`_BISECT`
steps is reached sooner. :func:`otspec.multidraft._batched._rho_star_rows` instead finds the same end ``b`` -- the
first float of ``[lo, hi]`` where the (monotone) test fails -- by a few rounds of many candidates on the floats' bits
(:func:`otspec.multidraft._batched._first_false`).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec.multidraft._batched as MB


def _bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _states(a: float, b: float, test, steps: int) -> list:
    """The states ``(a, b)`` after each of ``steps`` steps of the bisection (Python floats: IEEE binary64, rounded to
    nearest, as the arrays' arithmetic)."""
    out = []
    for _ in range(steps):
        mid = 0.5 * (a + b)
        if test(mid):
            a = mid
        else:
            b = mid
        out.append((a, b))
    return out


KS = st.sampled_from([1, 2, 3, 4, 5, 8, 16, 100, 256])


@settings(max_examples=400, deadline=None)
@given(k=KS, u=st.floats(0, 1), v=st.floats(0, 1), salt=st.integers(0, 2**32 - 1), near=st.integers(-52, 2),
       how=st.sampled_from(["bits", "threshold", "every-few"]))
def test_the_state_is_still_after_bisect_steps_whatever_the_test(k, u, v, salt, near, how):
    # intervals anywhere in [1, k], those straddling a binade boundary 2^e by a few ulps to a few units included;
    # tests of mid that flip at every few floats (not monotone), or a threshold: the state at _bisect_steps(k) is the
    # state at _BISECT, and unchanged at every step in between
    k = float(k)
    a, b = 1.0 + u * (k - 1.0), 1.0 + v * (k - 1.0)
    if near <= 0 and k > 2.0:  # around the largest binade boundary below k
        e = 2.0 ** int(np.floor(np.log2(k - 1e-9)))
        a, b = max(1.0, e - u * 2.0**near), min(k, e + v * 2.0**near)
    a, b = min(a, b), max(a, b)
    t = a + (b - a) * ((salt % 1000) / 999.0)
    test = {"bits": lambda m: ((_bits(m) * 2654435761 + salt) >> 3) & 1 == 0, "threshold": lambda m: m < t,
            "every-few": lambda m: (_bits(m) * 40503 + salt) % 7 < 3}[how]
    n = MB._bisect_steps(k)
    assert n <= MB._BISECT
    got = _states(a, b, test, MB._BISECT)
    assert all(s == got[-1] for s in got[n - 1:])


def test_the_whole_interval_of_every_k_is_still_after_bisect_steps():
    for k in (1, 2, 3, 4, 7, 8, 9, 64, 256):
        for test in (lambda m: True, lambda m: False, lambda m: _bits(m) & 1 == 0):
            got = _states(1.0, float(k), test, MB._BISECT)
            assert got[MB._bisect_steps(k) - 1] == got[-1]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_rho_star_rows_equal_the_full_bisection_bit_for_bit(monkeypatch, lib):
    # rho* and E(rho*) of rows of every k of 1..6 alone and of several k at once (ties, p = q, zeros), by the grid on
    # the floats' bits and by the bisection of _BISECT steps: the same bits (torch's pow for k > 3 on the CPU rounds by
    # a value's place in its array, which is the same here for both: 40 rows, every value in a vector lane)
    r = np.random.default_rng(3)
    n, V = 40, 17
    P = r.random((n, V)) ** 3 * (r.random((n, V)) < 0.7)
    P[:, 0] += 1e-3
    Q = r.random((n, V)) ** 2 * (r.random((n, V)) < 0.8)
    Q[:, 1] += 1e-3
    Q[0], Q[1, :4] = P[0], P[1, :4]
    P, Q = P / P.sum(1, keepdims=True), Q / Q.sum(1, keepdims=True)
    if lib == "torch":
        torch = pytest.importorskip("torch")
        P, Q = torch.from_numpy(P), torch.from_numpy(Q)
    import array_api_compat

    xp = array_api_compat.array_namespace(P)
    ks = np.array([2 + i % 5 for i in range(n)], dtype=np.float64)
    calls = [(k, None) for k in range(1, 7)] + [((xp.asarray(ks), (2, 3, 4, 5, 6)), None)]

    def run():
        out = []
        for k, _ in calls:
            rho, E = MB._rho_star_rows(P, Q, k, xp)
            out.append((np.asarray(rho).tobytes(), np.asarray(E).tobytes()))
        return out

    fewer = run()
    monkeypatch.setattr(MB, "_bisect_steps", lambda k: MB._BISECT)
    monkeypatch.setattr(MB, "_BISECT_ONLY", True)
    assert run() == fewer


def _split(r, n: int, flat: bool):
    """``n`` rows' ``(lo, hi, Pl, Ql, Ph, Qh)`` of :func:`_rho_star_rows`' shape ``(n, 1)``: random splits of a law, or
    (``flat``) splits where f is flat near its root (most mass below, E close to 1: many floats of rho where
    D and E^k lie within an ulp of each other, the rows where the last bit of the power decides)."""
    if flat:
        Pl = 1.0 - 10.0 ** r.uniform(-3, -1, n)
        Ql = r.uniform(0.01, 0.3, n)
    else:
        Pl, Ql = r.uniform(0, 1, n), r.uniform(0, 1, n)
    Ph, Qh = np.clip(1.0 - Pl, 0, None), np.clip(1.0 - Ql, 0, None)
    lo = np.maximum(1.0, Ql / np.maximum(Pl, 1e-300))
    hi = np.maximum(lo, r.uniform(1.0, 6.0, n))
    lo = np.where(r.random(n) < 0.2, 1.0, lo)
    return [x.reshape(n, 1) for x in (lo, hi, Pl, Ql, Ph, Qh)]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("flat", [False, True])
def test_the_grid_ends_where_the_bisection_ends_bit_for_bit(lib, flat):
    # _first_false against the bisection of _BISECT steps on the same test (a power by products: the same value in
    # every place of an array, on either library), k = 2..6 and mixed, rows where the test holds at lo and fails at
    # hi (where _rho_star_rows keeps b) and all others: the same b wherever it is kept
    r = np.random.default_rng(11 if flat else 5)
    n = 300
    conv = (lambda a: a) if lib == "numpy" else pytest.importorskip("torch").from_numpy
    import array_api_compat

    for k in (2, 3, 4, 5, 6):
        lo, hi, Pl, Ql, Ph, Qh = (conv(x) for x in _split(r, n, flat))
        xp = array_api_compat.array_namespace(lo)

        def power(x, k=k):
            out = x
            for _ in range(k - 1):
                out = out * x
            return out

        got = np.asarray(MB._first_false(lo, hi, Pl, Ql, Ph, Qh, power, float(k), xp))
        old = MB._bisect_steps
        try:
            MB._bisect_steps = lambda k_hi: MB._BISECT
            want = np.asarray(MB._bisect(lo, hi, Pl, Ql, Ph, Qh, power, float(k), xp))
        finally:
            MB._bisect_steps = old
        kept = (np.asarray(MB._go_up(lo, Pl, Ql, Ph, Qh, power, xp))
                & ~np.asarray(MB._go_up(hi, Pl, Ql, Ph, Qh, power, xp)))
        assert kept.sum() >= 20
        np.testing.assert_array_equal(got[kept], want[kept])
        assert np.all((np.asarray(lo) <= got) & (got <= np.asarray(hi)))


def test_the_grid_rounds_close_every_interval():
    # the spacing of each round is ceil(w / (M + 1)) of the last, down to one float: 6 rounds of 511 candidates for
    # k <= 4 (the floats of [1, 4] are 2^53 apart), 9 of 63 (numpy); never more ops than the bisection's steps
    one = int(np.float64(1.0).view(np.int64))
    for k in (2, 3, 4, 5, 8, 64, 256):
        w = int(np.float64(k).view(np.int64)) - one
        for M in (15, 63, 511, 2047):
            rounds = MB._grid_rounds(float(k), M)
            assert rounds[-1] == 1
            for s in rounds:
                assert (M + 1) * s >= w  # the M candidates a + s .. a + M s and b leave at most s
                w = s
            w = int(np.float64(k).view(np.int64)) - one
    assert len(MB._grid_rounds(4.0, 511)) == 6 and len(MB._grid_rounds(4.0, 63)) == 9
    assert MB._grid_points(np) == 63
