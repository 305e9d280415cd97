"""The fused host kernels of the exact alpha_k (otspec/otm/_alpha_kernel.py) against independent routes.

* the order read from the sorted int64 keys is ``np.argsort(q/p, kind="stable")`` exactly (fails without the
  re-sort of runs sharing their high bits: near-ties within 2**(bits - 52) would keep index order);
* the values, minimising prefixes and prefix sums are the numpy route's (``_prefix_sums``, ``_cut_values``,
  ``np.argmin``) on that order, bit for bit (fails on any other order of additions, a ``P**k`` above the split,
  an argmin that is not the first one, a missing clamp);
* the values equal the minimum over every subset by enumeration (small n), to 1e-12;
* the batched host call equals the per-row call bit for bit whatever ``workers``, and the numpy route (numpy's
  unstable argsort) to 1e-12.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import otspec
from otspec.otm import _alpha as A
from otspec.otm import _alpha_kernel as K
from otspec.otm._cut import ratio_order

KS = [1, 2, 3, 8, 17, 1100, 1101, 10**20]


def _numpy_on_stable_order(p, q, ks):
    """The numpy route's arithmetic on the stable order (what the fused kernels reproduce)."""
    order = ratio_order(p, q, stable=True)
    P, Q, S = A._prefix_sums(p, q, order)
    split = int(np.searchsorted(P, 0.5, side="right"))
    log_s = np.log1p(-S[split:])
    vals, args = [], []
    for k in ks:
        v = A._cut_values(P, Q, S, split, log_s, k)
        j = int(np.argmin(v))
        args.append(j)
        vals.append(min(1.0, max(0.0, v[j])))
    return np.array(vals), np.array(args), order, P, Q


def _case(rng, n, kind):
    p = rng.dirichlet(np.full(n, rng.choice([0.05, 1.0, 10.0])))
    q = rng.dirichlet(np.full(n, rng.choice([0.05, 1.0, 10.0])))
    zero = rng.random(n) < 0.3
    zero[rng.integers(n)] = False  # some mass left
    if kind == "p zeros":
        p[zero] = 0.0
    elif kind == "q zeros":
        q[zero] = 0.0
    elif kind == "ties":  # float32-like coarse laws: many exact ties of the ratio
        p, q = np.round(p * 32) + 1.0, np.round(q * 32)
        q[rng.integers(n)] += 1.0
    elif kind == "near ties":  # ratios one to a few ulp apart: runs of equal high bits in the keys
        q = p * (1.0 + rng.integers(0, 4, n) * 2.0**-52)
    elif kind == "subnormal":  # ratios past the largest double: +inf, tied with p = 0
        p[: n // 3] = 5e-324
    p, q = np.maximum(p, 0.0), np.maximum(q, 0.0)
    p, q = p / p.sum(), q / q.sum()
    return p, q


KINDS = ["plain", "p zeros", "q zeros", "ties", "near ties", "subnormal"]


@pytest.mark.parametrize("kind", KINDS)
def test_fused_is_the_numpy_route_on_the_stable_order_bit_for_bit(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    for n in [1, 2, 3, 5, 17, 64, 300, 2000]:
        for _ in range(4):
            p, q = _case(rng, n, kind)
            p0, q0 = p.copy(), q.copy()
            got = A._exact_fused(p, q, KS)
            want = _numpy_on_stable_order(p, q, KS)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(p, p0)  # inputs untouched
            np.testing.assert_array_equal(q, q0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 40), st.integers(0, 2**32 - 1), st.sampled_from(KINDS))
def test_fused_property(n, seed, kind):
    p, q = _case(np.random.default_rng(seed), n, kind)
    for g, w in zip(A._exact_fused(p, q, KS), _numpy_on_stable_order(p, q, KS)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("m", [K.INSERTION_MAX, K.INSERTION_MAX + 1, 3000])
def test_runs_of_near_ties_are_sorted_exactly(m):
    # every ratio within a few ulp of 1/m...: one run of equal high bits, re-sorted by insertion (<= INSERTION_MAX)
    # or by the merge sort; shuffled so index order is not the ratio's order
    rng = np.random.default_rng(m)
    p = np.full(m, 1.0 / m)
    q = p * (1.0 + rng.permutation(m) % 7 * 2.0**-52)
    q[rng.integers(0, m, 3)] = 0.0
    bits = K.index_bits(m)
    keys = K.ratio_keys(p, q, bits)
    keys.sort()
    assert np.count_nonzero(np.diff(keys >> bits) == 0) >= m - 10  # the runs are really there
    order = A._exact_fused(p, q, [8])[2]
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(order, np.argsort(np.where(p > 0, q / p, np.inf), kind="stable"))


def test_keys_are_the_ratio_bits_and_index():
    rng = np.random.default_rng(7)
    p, q = _case(rng, 1000, "p zeros")
    q[3] = -0.0  # sorts with the zeros
    bits = K.index_bits(1000)
    assert bits == 10
    keys = K.ratio_keys(p, q, bits)
    with np.errstate(divide="ignore"):
        ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf) + 0.0
    np.testing.assert_array_equal(keys >> bits, ratio.view(np.int64) >> bits)
    np.testing.assert_array_equal(keys & ((1 << bits) - 1), np.arange(1000))
    assert [K.index_bits(n) for n in (1, 2, 3, 4, 5, 49_152, 65_536, 65_537)] == [1, 1, 2, 2, 3, 16, 16, 17]


@pytest.mark.parametrize("seed", range(6))
def test_value_is_the_minimum_over_every_subset(seed):
    # independent of the sort: 1 + q(A) - p(A)**k minimised by enumeration of the 2**n subsets
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 11))
    p, q = _case(rng, n, KINDS[seed % len(KINDS)])
    masks = np.array(list(itertools.product([0.0, 1.0], repeat=n)))
    for k in [1, 2, 5, 40]:
        brute = min(1.0, max(0.0, float(np.min(1.0 + masks @ q - (masks @ p) ** k))))
        got = A._exact_fused(p, q, [k])[0][0]
        assert abs(got - brute) <= 1e-12


@pytest.mark.skipif(not K.JIT, reason="the fused route runs with numba only")
def test_batched_host_equals_the_rows_and_the_numpy_route():
    rng = np.random.default_rng(11)
    V = 4000
    rows = [_case(rng, V, KINDS[i % len(KINDS)]) for i in range(7)]
    P = np.stack([r[0] for r in rows])
    Q = np.stack([r[1] for r in rows])
    ks = [1, 8, 10**20]
    per_row = np.array([otspec.alpha_k(P[i], Q[i], ks) for i in range(len(rows))])
    for w in (1, 2):
        np.testing.assert_array_equal(otspec.alpha_k(P, Q, ks, workers=w), per_row)
    numpy_route = np.array([A._exact_numpy(P[i], Q[i], ks)[0] for i in range(len(rows))])
    np.testing.assert_allclose(per_row, numpy_route, rtol=0, atol=1e-12)
    cut = otspec.min_cut(P[0], Q[0], 8)
    assert cut.alpha == per_row[0, 1]
    assert abs(1.0 + cut.q_mass - cut.p_mass**8 - cut.alpha) <= 1e-12


@pytest.mark.skipif(not K.JIT, reason="compiled and plain kernels compared only with numba")
def test_compiled_kernels_match_their_python():
    rng = np.random.default_rng(3)
    p, q = _case(rng, 300, "near ties")
    bits = K.index_bits(300)
    keys = K.ratio_keys(p, q, bits)
    np.testing.assert_array_equal(keys, K.ratio_keys.py_func(p, q, bits))
    keys.sort()
    outs = []
    for pre, cut in ((K.prefix_from_keys, K.cut_min), (K.prefix_from_keys.py_func, K.cut_min.py_func)):
        bufs = [np.empty(300, np.int64), np.empty(301), np.empty(301), np.empty(301)]
        split = pre(p, q, keys, bits, *bufs)
        hi = np.expm1(np.log1p(-bufs[3][split:]) * 1e20)
        bufs += [np.array([split]), np.array(cut(bufs[1], bufs[2], split, 3, hi)),
                 np.array(cut(bufs[1], bufs[2], split, 1101, hi))]
        outs.append(bufs)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
