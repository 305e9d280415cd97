"""The exact enumeration of the draws without replacement (task CE): the mass not yet drawn summed once a drawn set
(not once an ordered draw), the draws in a compiled kernel (numpy where numba is absent), every value bit for bit
the sequential enumeration it replaces (``itertools.permutations`` and ``math.fsum`` over the set left, kept below
as the reference)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otspec.tree import _bound, _process
from otspec.tree import _bound_kernels as _K
from otspec.tree._process import (
    _wor_blocks,
    _wor_enumeration,
    _wor_left_masses,
    _wor_rank_laws,
    _wor_sequences,
)


def _reference(p, need):
    """The enumeration before task CE, verbatim: every ordered draw, the set left summed by ``math.fsum`` at each draw."""
    support = np.flatnonzero(p > 0).tolist()
    for seq in itertools.permutations(support, need):
        w, left = 1.0, set(support)
        for t in seq:
            w *= float(p[t]) / math.fsum(float(p[x]) for x in left)
            left.discard(t)
        yield seq, w


def _reference_laws(p, ranks, V):
    """The draw laws of ``_DrawLaws``' enumerated rows before task CE: ``e[k, seq[r]] += w`` in the draws' order."""
    e = np.zeros((len(ranks), V))
    for seq, w in _reference(p, max(ranks) + 1):
        for k, r in enumerate(ranks):
            e[k, seq[r]] += w
    return e


def _bits(a):
    return np.asarray(a, dtype=np.float64).view(np.int64)


#: Masses the rows are made of: generic, tiny (1e-300, subnormal), ties, zeros.
_MASS = st.one_of(
    st.floats(0.0, 1.0, allow_subnormal=True),
    st.sampled_from([0.0, 0.0, 1e-300, 5e-324, 2.0**-60, 0.1, 0.25, 0.5, 1.0 / 3.0, 1.0]),
)


@st.composite
def _rows(draw):
    """A law row (supports 1-16 tokens, zeros between) and a number of draws 1-4, at most 6000 ordered draws (the
    reference is plain Python); normalised to sum 1 (with its rounding) half the time."""
    need = draw(st.integers(1, 4))
    cap = max(n for n in range(need, 17) if math.perm(n, need) <= 6000)
    masses = draw(st.lists(_MASS, min_size=1, max_size=cap))
    masses = [m for m in masses if m > 0] or [1.0]
    zeros = draw(st.lists(st.integers(0, len(masses)), max_size=4))
    for z in sorted(zeros, reverse=True):
        masses.insert(z, 0.0)
    p = np.array(masses)
    if draw(st.booleans()):
        p = p / p.sum()
    return p, need


@settings(max_examples=150)
@given(_rows())
def test_the_draws_are_the_sequential_enumeration_bit_for_bit(row):
    p, need = row
    ref = list(_reference(p, need))
    for jit in (True, False):
        seqs, w = _wor_enumeration(p, need, jit=jit)
        assert seqs.dtype == np.int64 and seqs.shape == (len(ref), need)
        assert [tuple(s) for s in seqs.tolist()] == [s for s, _ in ref]
        assert np.array_equal(_bits(w), _bits([x for _, x in ref]))
    got = list(_wor_sequences(p, need))
    assert [(s, x.hex()) for s, x in got] == [(s, x.hex()) for s, x in ref]
    assert all(type(x) is float and all(type(t) is int for t in s) for s, x in got)


@settings(max_examples=150)
@given(_rows(), st.data())
def test_the_rank_laws_are_the_sequential_accumulation_bit_for_bit(row, data):
    p, need = row
    ranks = sorted(set(data.draw(st.lists(st.integers(0, need - 1), max_size=3))) | {need - 1})
    V = p.shape[0] + data.draw(st.integers(0, 3))
    ref = _reference_laws(p, ranks, V)
    for jit in (True, False):
        assert np.array_equal(_bits(_wor_rank_laws(p, ranks, V, jit=jit)), _bits(ref))


def test_the_draw_laws_of_enumerated_rows_are_the_sequential_accumulation():
    # the bound's route: _DrawLaws enumerates rows of small support (here every row of V = 9, three draws)
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.full(9, 0.3), size=6)
    P[1, [0, 4]] = 0.0
    P[2, :] = 1.0 / 9.0                                  # ties
    P[3, 2] = 1e-300
    P[4] = np.round(P[4], 2)
    ranks = [0, 2]
    laws, exact = _bound._wor_draw_laws(P, ranks)
    assert exact
    for i in range(P.shape[0]):
        assert np.array_equal(_bits(laws[:, i]), _bits(_reference_laws(P[i], ranks, 9)))


@settings(max_examples=300)
@given(st.lists(st.one_of(st.floats(-1e300, 1e300), st.floats(-1e-300, 1e-300),
                          st.sampled_from([1.0, -1.0, 1e16, -1e16, 1e-16, 2.0**53, 2.0**-53, 5e-324, 0.5, 0.1])),
                max_size=40))
def test_the_kernels_sum_is_math_fsum(x):
    a = np.array(x, dtype=np.float64)
    want = math.fsum(x)
    for f in (_K.exact_sum, getattr(_K.exact_sum, "py_func", _K.exact_sum)):
        assert f(a, a.shape[0], np.empty(a.shape[0] + 1)).hex() == want.hex()


@pytest.mark.parametrize("x", [
    [1e-16, 1.0, 1e16],                                  # half-even rounding across the partials
    [1.0, 1e100, 1.0, -1e100],
    [2.0**53, 1.0, 2.0**-52],
    [2.0**53, 1.0, -(2.0**-52)],
    [0.1] * 10,
    [5e-324] * 7 + [1.0, -1.0],
    [1e308, -1e308, 1e-308],
    [1.0 + 2.0**-52, 2.0**-53, 2.0**-106],
    [],
])
def test_the_kernels_sum_at_ties_and_cancellations(x):
    a = np.array(x, dtype=np.float64)
    for f in (_K.exact_sum, getattr(_K.exact_sum, "py_func", _K.exact_sum)):
        assert f(a, a.shape[0], np.empty(a.shape[0] + 1)).hex() == math.fsum(x).hex()


def test_the_memoised_masses_are_math_fsum_of_the_set_left():
    rng = np.random.default_rng(3)
    vals = (rng.random(11) ** 6).tolist()
    need = 4
    left = _wor_left_masses(vals, need)
    off = _process._wor_set_offsets(len(vals), need)
    seen = set()
    for k in range(need):
        for c in itertools.combinations(range(len(vals)), k):
            at = off[k] + sum(math.comb(j, i + 1) for i, j in enumerate(c))
            seen.add(at)
            assert left[at].hex() == math.fsum(v for j, v in enumerate(vals) if j not in c).hex()
    assert seen == set(range(left.shape[0]))          # one entry a set, every entry one set


def test_the_mass_left_is_summed_once_a_drawn_set(monkeypatch):
    # 16 tokens, 4 draws: 43680 ordered draws, 1 + 16 + 120 + 560 = 697 drawn sets of fewer than 4 tokens (the
    # enumeration before: one fsum a draw, 174720)
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(16))
    sets = sum(math.comb(16, k) for k in range(4))
    calls = []
    fsum = math.fsum
    monkeypatch.setattr(math, "fsum", lambda it: calls.append(1) or fsum(it))
    routes = 2 if _process._K.WOR_JIT else 3  # without numba (the fast extra) the first walk is the numpy route too
    for _ in _wor_sequences(p, 4):
        pass
    monkeypatch.setattr(_process._K, "WOR_JIT", False)   # the numpy route: math.fsum itself
    for _ in _wor_sequences(p, 4):
        pass
    _wor_rank_laws(p, [1, 3], 16, jit=False)
    assert len(calls) == routes * sets
    # the kernel: its count of sums formed (one a set)
    off, binom = _process._wor_tables(16, 4)
    e = np.zeros((1, 16))
    got = _K.wor_enumerate(p, np.arange(16), 4, off, binom, np.array([3]), np.zeros((0, 4), dtype=np.int64),
                           np.zeros(0), e)
    assert got == sets


def test_the_blocks_are_the_one_array(monkeypatch):
    # above _WOR_BLOCK draws the generator forms them a first token at a time (numpy): the same draws, same bits
    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.full(8, 0.5))
    p[3] = 0.0
    whole = list(_wor_sequences(p, 3))
    monkeypatch.setattr(_process, "_WOR_BLOCK", 20)
    blocks = list(_wor_blocks(p, 3, 20))
    assert len(blocks) == 7
    assert list(_wor_sequences(p, 3)) == whole == list(_reference(p, 3))


@pytest.mark.parametrize("jit", [True, False])
def test_edges(jit):
    p = np.array([0.0, 0.5, 0.0, 0.5])
    seqs, w = _wor_enumeration(p, 3, jit=jit)                # fewer tokens than draws: none
    assert seqs.shape == (0, 3) and w.shape == (0,)
    assert not _wor_rank_laws(p, [2], 4, jit=jit).any()
    assert list(_wor_sequences(p, 0)) == list(_reference(p, 0)) == [((), 1.0)]
    seqs, w = _wor_enumeration(p, 2, jit=jit)
    assert seqs.tolist() == [[1, 3], [3, 1]] and w.tolist() == [0.5, 0.5]
    q = p.copy()
    _wor_enumeration(q, 2, jit=jit)
    _wor_rank_laws(q, [0, 1], 4, jit=jit)
    assert np.array_equal(q, p)                          # the row untouched
