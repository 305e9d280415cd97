"""The column walks of the last depth's first pass without replacement, chunk by chunk
(``otspec.tree._bound_kernels.head_insert`` and the undecided entries of ``wor_row_last``): a block is walked column
by column only in its chunks of ``CHUNK`` columns that hold an entry to take, up to the chunk's last one. The head
against a sort of every column so far, the left columns against the walk of every column (the code before, kept
here in plain Python), bit for bit, on blocks built to put the entries at the chunks' edges, in partial chunks, and
on thresholds that rise inside a chunk."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.tree import _bound_kernels as K

pytestmark = pytest.mark.skipif(not K.JIT, reason="numba is not installed")


def _head_of(values, Kh):
    """The running head after every column of ``values`` (column ``v`` the token id ``v``): the ``Kh + 1`` largest
    positive entries, decreasing, ties by lower id (an entry equal to the threshold does not enter, an equal one
    enters after those there), as ``(hv, hi, c, thr)`` with zeros past ``c``."""
    order = sorted((v for v in range(len(values)) if values[v] > 0.0), key=lambda v: (-values[v], v))[:Kh + 1]
    hv, hi = np.zeros(Kh + 1), np.zeros(Kh + 1, np.int64)
    hv[:len(order)] = [values[v] for v in order]
    hi[:len(order)] = order
    c = len(order)
    return hv, hi, c, (hv[Kh] if c == Kh + 1 else 0.0)


def _last_every_column(p, q, Qu, dW):
    """``wor_row_last``'s decided sum lanes and left columns as they were (every column of a block with an
    undecided entry walked): ``(out, idx)``."""
    V, P = p.shape[0], K.SLOPE_AT
    c = (K.wor_lower(dW, P) / P) * (1.0 - 1e-9)
    Lq, Ls, idx = np.zeros(K.BLOCK), np.zeros(K.BLOCK, np.int64), []
    for v0 in range(0, V, K.BLOCK):
        b = min(K.BLOCK, V - v0)
        qc = np.zeros(K.BLOCK)
        m = 0
        for v in range(b):
            x, y = p[v0 + v], Qu * q[v0 + v]
            Ls[v] += 1 if x > 0.0 else 0
            und = x > P or y > c * x
            qc[v] = y
            Lq[v] += 0.0 if und else y
            m += 1 if und else 0
        if m > 0:
            for v in range(b):
                x = p[v0 + v]
                if x > P:
                    y = qc[v]
                    if y <= K.wor_lower(dW, x) * (1.0 - 1e-9):
                        Lq[v] += y
                        continue
                    idx.append(v0 + v)
                elif qc[v] > c * x:
                    idx.append(v0 + v)
    return np.array([float(Ls.sum()), float(len(idx)), K.lane_total(Lq)]), np.array(idx, dtype=np.int32)


def _spiky(rng, n, where):
    """``n`` values: a flat floor with rising spikes at the columns ``where`` (ties among them on purpose)."""
    x = rng.uniform(0.5, 1.0, n) * 1e-6
    for k, v in enumerate(where):
        x[v] = [1e-3, 2e-3, 2e-3, 5e-2, 0.3][k % 5] * (1.0 + 0.1 * k)
    return x


@settings(max_examples=80, deadline=None)
@given(b=st.integers(1, K.BLOCK), Kh=st.sampled_from([1, 2, 5, 32]), seed=st.integers(0, 10**6),
       edges=st.booleans(), ties=st.booleans())
def test_head_insert_is_the_sorted_head(b, Kh, seed, edges, ties):
    """The head after each of two blocks (the second starting from the first's head and threshold) is the sorted
    head of every column so far, to the bit: values, ids (ties by lower id), count and threshold. Fails where the
    walk stops on the threshold as it rises (entries counted above the chunk's starting value but not counted off
    by the walk: it then runs past the chunk), where the block's last partial chunk is not walked, or where an
    entry at a chunk's first or last column is skipped (the spikes sit there with ``edges``)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(2):
        if ties:
            pb = rng.choice([1e-4, 2e-4, 2e-4, 3e-4, 0.0], size=b)
        else:
            cols = [v for v in range(b) if v % K.CHUNK in (0, K.CHUNK - 1)] if edges else \
                list(rng.choice(b, size=min(b, 7), replace=False))
            pb = _spiky(rng, b, sorted(cols))
        blocks.append(np.ascontiguousarray(pb))
    hv, hi, c, thr = np.zeros(Kh + 1), np.zeros(Kh + 1, np.int64), 0, 0.0
    for k, pb in enumerate(blocks):
        c, thr = K.head_insert(pb, k * b, b, Kh, hv, hi, c, thr)
        rv, ri, rc, rthr = _head_of(np.concatenate(blocks[:k + 1]), Kh)
        assert (c, thr) == (rc, rthr)
        np.testing.assert_array_equal(hv, rv)
        np.testing.assert_array_equal(hi, ri)


@settings(max_examples=60, deadline=None)
@given(V=st.integers(1, 1300), seed=st.integers(0, 10**6), Qu=st.sampled_from([0.01, 0.5, 1.0, 3.0]),
       edges=st.booleans())
def test_last_pass_left_columns_are_the_walk_of_every_column(V, seed, Qu, edges):
    """``wor_row_last``'s support, left columns (in order) and decided sum equal the walk of every column's to the
    bit. The rows put large entries (above ``SLOPE_AT``, decided by the lower bound itself or left) and small
    entries whose target is above the slope's bound at chunk edges (``edges``) or anywhere, and ``V`` ends blocks
    in a partial chunk. Fails where an undecided entry of a chunk is not counted (it is then never walked: a column
    missing from ``idx`` and its target added to neither), where the walk stops before a chunk's last one, or where
    a large decided entry is counted as left."""
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.2, 1.0, V) * 1e-5
    q = rng.uniform(0.0, 1.0, V) * p            # mostly decided by the slope
    cols = [v for v in range(V) if v % K.CHUNK in (0, 1, K.CHUNK - 1)] if edges else \
        list(rng.choice(V, size=min(V, 12), replace=False))
    for k, v in enumerate(cols):
        if k % 3 == 0:
            p[v] = 2e-3 * (1 + k % 7)           # large: the lower bound decides or leaves it
            q[v] = p[v] * [0.5, 1.0, 8.0][(k // 3) % 3]
        else:
            q[v] = p[v] * (50.0 if k % 3 == 1 else 0.9)
    p /= p.sum()
    q /= q.sum()
    W = np.sort(rng.uniform(0.0, 1.0, 7))[::-1]
    dW = np.ascontiguousarray(W - np.append(W[1:], 0.0))
    idx, out = np.empty(V, np.int32), np.zeros(3)
    K.wor_row_last(p, q, float(Qu), dW, idx, out)
    ref, ridx = _last_every_column(p, q, float(Qu), dW)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(idx[:int(out[1])], ridx)
