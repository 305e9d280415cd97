"""The last expanded depth's first pass without replacement (``otspec.tree._bound_kernels.wor_row_last`` with its
draft statistics): the head and the second draw's sums taken in the pass that decides the entries, against
``wor_row_stats`` (the separate sweeps they replace) bit for bit, and ``wor_row_decide`` forming the race's power
sums only for rows with entries left after the recheck."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.tree import _bound_kernels as K
from tests.test_tree_bound import _row_of_kind

pytestmark = pytest.mark.skipif(not K.JIT, reason="numba is not installed")

N = 48


def _first(p, q, Qu, dW, Kh):
    """``wor_row_last`` with the draft's statistics and ``row_first_finish``: ``(lo, idx, head, hval, st)``."""
    V = p.shape[0]
    idx, lo = np.empty(V, np.int32), np.zeros(3)
    hs, hi = K.first_scratch(Kh)
    hs[:] = np.nan                      # the pass sets its own scratch: stale values must not leak
    hi[:] = 7
    hc = K.wor_row_last(p, q, Qu, dW, idx, lo, None, hs, hi)
    head, hval, st_ = np.empty(Kh, np.int64), np.empty(Kh), np.zeros(7)
    st_[0] = lo[0]
    K.row_first_finish(p, Kh, hc, hs, hi, head, hval, st_)
    return lo, idx[:int(lo[1])].copy(), head, hval, st_


@settings(max_examples=60, deadline=None)
@given(V=st.integers(2, 3000), kind=st.sampled_from(["llm", "grid", "one-hot", "flat", "rising", "tiers"]),
       seed=st.integers(0, 10**6), Kh=st.sampled_from([1, 3, 32]), scale=st.sampled_from([0.05, 0.9, 3.0]))
def test_first_pass_stats_are_the_row_stats_bit_for_bit(V, kind, seed, Kh, scale):
    """The head, its values and ``st`` (support, most likely token, head size, the tail's largest, the mass outside
    the most likely token, S1, S2) from the first pass equal ``wor_row_stats``' (without the race) to the bit, and
    the decided entries and sum equal ``wor_row_last``'s without the statistics. The most likely token sits in any
    lane (``_row_of_kind`` puts it at a random column; V across block boundaries), so this fails where its lane is
    not summed again without it (S1, S2 and the mass then include it), where another lane is redone
    (``top // BLOCK``), or where the head's scratch is not reset (filled with NaN and 7 here)."""
    rng = np.random.default_rng(seed)
    p = _row_of_kind(kind, V, rng)
    q = _row_of_kind(["llm", "grid", "flat", "tiers"][seed % 4], V, rng)
    W = np.sort(rng.uniform(0.0, 1.0, 7))[::-1]
    dW = np.ascontiguousarray(W - np.append(W[1:], 0.0))
    Kh = min(Kh, V)
    lo, idx, head, hval, st_ = _first(p, q, float(scale), dW, Kh)
    idx0, lo0 = np.empty(V, np.int32), np.zeros(3)
    K.wor_row_last(p, q, float(scale), dW, idx0, lo0)
    np.testing.assert_array_equal(lo, lo0)
    np.testing.assert_array_equal(idx, idx0[:int(lo0[1])])
    head0, hval0, nu0, st0 = np.empty(Kh, np.int64), np.empty(Kh), np.zeros(N + 1), np.zeros(7)
    mark = np.zeros(V, dtype=bool)
    K.wor_row_stats(p, Kh, False, head0, hval0, nu0, mark, st0)
    np.testing.assert_array_equal(head, head0)
    np.testing.assert_array_equal(hval, hval0)
    assert st_.tobytes() == st0.tobytes(), (st_, st0)


def _recheck_row(V=3000, seed=4):
    """A draft row, ``dW`` and a target whose entries the first pass leaves (``Q_u q`` above its linear lower bound
    on pi) and the recheck decides (``Q_u q`` at 0.9 of the recheck's tighter lower bound) at a few small tokens."""
    rng = np.random.default_rng(seed)
    p = _row_of_kind("llm", V, rng)
    dW = np.zeros(7)
    dW[-1] = 0.9
    q = 0.5 * np.array([K.wor_lower(dW, x) for x in p.tolist()])     # decided by the first pass
    _, _, _, _, st_ = _first(p, q, 1.0, dW, 32)
    top = int(st_[1])
    small = [v for v in np.argsort(p)[V // 2:V // 2 + 40].tolist() if v != top][:5]
    for v in small:
        q[v] = 0.9 * K.wor_recheck_lower(p[v], v, top, p[top], st_[5], st_[6], dW)
    return p, q, dW, small


def test_decide_forms_no_power_sums_where_the_recheck_decides_every_entry_left():
    """A row whose entries left by the first pass are all decided by the recheck: ``wor_row_decide`` returns 0 with
    ``st`` in full (``wor_row_stats``' values) and the race's power sums not formed (``nu`` 0); with one of those
    entries raised above pi's bound it forms them, equal to the sweep of ``wor_row_stats`` with the race, bit for
    bit."""
    p, q, dW, small = _recheck_row()
    V, Kh = p.shape[0], 32
    lo, idx, _, _, _ = _first(p, q, 1.0, dW, Kh)
    assert sorted(idx.tolist()) == sorted(small)     # the first pass leaves exactly these
    head0, hval0, nu0, st0 = np.empty(Kh, np.int64), np.empty(Kh), np.zeros(N + 1), np.zeros(7)
    mark = np.zeros(V, dtype=bool)
    K.wor_row_stats(p, Kh, True, head0, hval0, nu0, mark, st0)
    assert nu0[1] > 0
    for raise_one in (False, True):
        qq = q.copy()
        if raise_one:
            qq[small[0]] = 1.0                           # above any pi (pi <= 1)
        head, hval, nu, st_ = np.empty(Kh, np.int64), np.empty(Kh), np.full(N + 1, np.nan), np.zeros(7)
        idx, lo = np.empty(V, np.int32), np.zeros(3)
        code = K.wor_row_decide(p, qq, 1.0, dW, idx, lo, Kh, True, V // 16, head, hval, nu, mark, st_)
        assert not mark.any()
        assert st_.tobytes() == st0.tobytes()
        np.testing.assert_array_equal(head, head0)
        if raise_one:
            assert code == 2 and lo[1] == 1 and idx[0] == small[0]
            assert nu.tobytes() == nu0.tobytes()
        else:
            assert code == 0 and lo[1] == 0
            assert (nu == 0).all()                   # not formed (a NaN would show a skipped reset)
