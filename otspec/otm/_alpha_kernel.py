r"""Fused host kernels of the exact :math:`\alpha_k` (:func:`otspec.alpha_k`): the ratio's sort keys, then the cut.

The closed form needs the tokens sorted by :math:`q/p` ascending (:math:`p = 0` last), then prefix sums and the
values :math:`1 + Q_j - P_j^k`. Here the sort is numpy's sort of ``int64`` keys, which is several times faster than
an argsort of the ratio (vectorised sorting networks where the CPU has them):

* :func:`ratio_keys`: each token's key is the bit pattern of its ratio (a non-negative double orders like its
  bits read as an integer) with the lowest ``bits`` bits replaced by its index (``bits`` enough for ``n - 1``);
  the keys are distinct, so any sort of them gives the same order;
* the caller sorts the keys (``ndarray.sort``: unstable and fast, the keys being distinct);
* :func:`prefix_from_keys`: the order is read from the low bits, and each run of keys sharing their high bits (ratios
  within a relative :math:`2^{\text{bits} - 52}` of each other, in index order) is re-sorted stably by the exact
  ratio, so the order is exactly ``np.argsort(ratio, kind="stable")`` (ties by index); then one forward pass (the
  two gathers and the prefix sums of :math:`p` and :math:`q`, added in ``np.cumsum``'s order, so the same bits),
  one backward pass (the suffix masses :math:`S_j = 1 - P_j` summed from the end, as the reversed ``np.cumsum``,
  from the gathered draft the forward pass leaves in their buffer);
* :func:`cut_min`: one pass per ``k`` (the values by repeated squaring where :math:`P_j \le 1/2`, ``Q_j`` minus
  ``expm1(k log1p(-S_j))`` above, those two functions numpy's, applied by the caller; the first minimum and its clip
  to ``[0, 1]``), the operations of
  :func:`otspec.otm._alpha._prefix_sums` and :func:`otspec.otm._alpha._cut_values` in their order, with no
  whole-row temporaries.

Plain Python on scalars, compiled by numba when installed (the ``fast`` extra, :data:`JIT`, releasing the GIL so
that a batch's rows run on several threads); without numba :mod:`otspec.otm._alpha` keeps its numpy route.
"""

from __future__ import annotations

import numpy as np

from .._jit import compile_in

#: Groups of keys sharing their high bits up to this size are re-sorted by insertion, larger ones by a merge sort.
INSERTION_MAX = 16
#: Beyond this ``k``, ``x**k`` underflows to 0 for every ``x <= 1/2`` in float64 (as in :mod:`otspec.otm._alpha`).
UNDERFLOW_K = 1100


def index_bits(n: int) -> int:
    """Low bits of a key that hold a token index below ``n`` (at least 1)."""
    return max(1, int(n - 1).bit_length())


def ratio_keys(p, q, bits):
    """``int64`` sort keys of ``q/p`` (``+inf`` where ``p = 0``), the index in the lowest ``bits`` bits.

    The ratio is :func:`otspec.otm.ratio_order`'s (``q / p`` where ``p > 0``), plus ``0.0`` so that a ``-0.0``
    sorts with the zeros.
    """
    n = p.shape[0]
    keys = np.empty(n, dtype=np.int64)
    ratio = keys.view(np.float64)
    for i in range(n):
        ratio[i] = (q[i] / p[i] if p[i] > 0 else np.inf) + 0.0
    high = ~((np.int64(1) << bits) - 1)
    for i in range(n):
        keys[i] = (keys[i] & high) | i
    return keys


def _ratio(p, q, i):
    """The ratio of token ``i``, as :func:`ratio_keys` computes it."""
    return (q[i] / p[i] if p[i] > 0 else np.inf) + 0.0


def _sort_group(p, q, order, lo, hi):
    """Sort ``order[lo:hi]`` (in index order) stably by the exact ratio."""
    m = hi - lo
    if m <= INSERTION_MAX:
        for a in range(lo + 1, hi):
            t = order[a]
            r = _ratio(p, q, t)
            b = a
            while b > lo and _ratio(p, q, order[b - 1]) > r:
                order[b] = order[b - 1]
                b -= 1
            order[b] = t
        return
    r = np.empty(m)
    for a in range(m):
        r[a] = _ratio(p, q, order[lo + a])
    perm = np.argsort(r, kind="mergesort")
    idx = order[lo:hi].copy()
    for a in range(m):
        order[lo + a] = idx[perm[a]]


def _power(x, k):
    """``x**k`` by repeated squaring, the operations of :func:`otspec._array.int_power` on a scalar."""
    result = x
    first = True
    base = x
    while k:
        if k & 1:
            if first:
                result = base
                first = False
            else:
                result = result * base
        k >>= 1
        if k:
            base = base * base
    return result


def prefix_from_keys(p, q, keys, bits, order, P, Q, S):
    r"""The order and the prefix sums of the minimum cut from the sorted keys of :func:`ratio_keys`.

    Writes the order (``(n,)``) and the prefix sums ``P``, ``Q`` and suffix masses ``S`` (``(n + 1,)`` each,
    clamped to ``[., 1]``, the full prefix pinned to 1); returns the split, the first prefix with
    :math:`P_j > 1/2` (``np.searchsorted(P, 0.5, side="right")``).
    """
    n = p.shape[0]
    low = (np.int64(1) << bits) - 1
    for j in range(n):
        order[j] = keys[j] & low
    # runs of equal high bits: re-sorted by the exact ratio (the run is in index order, the sort stable)
    lo = 0
    for j in range(1, n + 1):
        if j == n or (keys[j] >> bits) != (keys[lo] >> bits):
            if j - lo > 1:
                _sort_group(p, q, order, lo, j)
            lo = j
    # forward: the gathers and np.cumsum's additions
    P[0] = 0.0
    Q[0] = 0.0
    ap = 0.0
    aq = 0.0
    split = n + 1
    for j in range(n):
        t = order[j]
        pt = p[t]
        S[j] = pt  # the gathered draft, read back by the backward pass
        ap = ap + pt if j else pt
        aq = aq + q[t] if j else q[t]
        P[j + 1] = ap if ap < 1.0 else 1.0
        Q[j + 1] = aq if aq < 1.0 else 1.0
    P[n] = 1.0
    Q[n] = 1.0
    # np.searchsorted(P, 0.5, side="right") on the non-decreasing P
    for j in range(n + 1):
        if P[j] > 0.5:
            split = j
            break
    # backward: the suffix masses as the reversed np.cumsum
    S[n] = 0.0
    acc = 0.0
    for j in range(n - 1, -1, -1):
        acc = acc + S[j] if j < n - 1 else S[j]
        S[j] = acc if acc < 1.0 else 1.0
    S[0] = 1.0
    return split


def cut_min(P, Q, split, kk, hi):
    r"""One ``k``'s value :math:`\min(1, \max(0, \min_j 1 + Q_j - P_j^k))` and its first minimising prefix: by
    repeated squaring where :math:`j <` ``split`` (``kk``: ``k`` capped at ``UNDERFLOW_K + 1``, beyond which those
    powers are 0), and ``Q[j] - hi[j - split]`` above, ``hi`` = ``expm1(k * log1p(-S[split:]))`` formed by the
    caller with numpy's own functions (on AVX-512 numpy dispatches its own vectorised ``log1p`` and ``expm1``,
    whose last bits may differ from the C library's: the values stay numpy's on every machine)."""
    best = np.inf
    arg = 0
    found = False
    for j in range(P.shape[0]):
        if j < split:
            lowv = _power(P[j], kk) if kk <= UNDERFLOW_K else 0.0
            v = (Q[j] - lowv) + 1.0
        else:
            v = Q[j] - hi[j - split]
        if not found or v < best or (v != v and best == best):
            best = v
            arg = j
            found = True
    t = best if best > 0.0 else 0.0
    return (t if t < 1.0 else 1.0), arg


#: Whether the kernels are compiled by numba (the ``fast`` extra); without it :mod:`otspec.otm._alpha` keeps its
#: numpy route (these functions still run as CPython, for tests).
JIT = compile_in(globals(), ("_ratio", "_sort_group", "_power", "ratio_keys", "prefix_from_keys", "cut_min"), nogil=True)
