"""The i.i.d. bound's host route after the chain evaluation and the rows' addresses in numpy, pinned to the floats
before.

* ``iid_row_sums`` (through ``iid_rows``, with and without caps of lower depths) against an independent numpy
  route: :math:`\\pi` by :func:`otspec.tree._bound._iid_pi` without numba, :math:`\\min(Q_u q, \\pi)` added lane
  by lane in block order and the lanes halved pairwise. Programs with one class a level (the chain evaluation) and
  without, depths 1-4, ``V`` from 2 to 5,000; rows with ties, zeros, subnormals, near one-hot rows.
* ``iid_chain`` against its definition on the programs of many shapes.
* The whole bound (``_sampled``, laws as rows of several arrays, budgets 1-512, depths 1-4) against the floats that
  the code before this change gave (commit 24cd376, written here as hex): value, per-depth sums, lower sums,
  remainder, expanded count. Regenerated once since, after ``_share`` summed what a budget leaves below a prefix
  as nonnegative terms instead of the row sum of caps minus the expanded children's caps: ten cases' ``per_depth``
  at depths >= 2 moved (with them seven values and six remainders; lower sums and counts kept their bits), each
  nearer the formula's exact rational value on the same entries (0.05-0.94 ulp off now, 0.57-504 ulp before;
  tests/test_tree_bound_routes_ck.py, docs/perf/trees.rst).
* ``_row_blocks`` against the code before (copied here) on rows of one or several arrays, rows not at a row's
  start, rows of non-contiguous or non-float64 arrays, rows that own their memory.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from otspec.tree import TreeShape
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K
from tests.digests import for_machine, machine

pytestmark = pytest.mark.skipif(not K.JIT, reason="the row kernels need numba (the fast extra)")

SHAPES = {
    "b5": TreeShape.branching(5),
    "b32": TreeShape.branching(3, 2),
    "b322": TreeShape.branching(3, 2, 2),
    "b2222": TreeShape.branching(2, 2, 2, 2),
    "mixed": TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)]),
    "uneven": TreeShape([(0,), (1,), (2,), (3,), (0, 0), (2, 0), (2, 1), (2, 2)]),
}


def _law(rng, V: int, kind: int) -> np.ndarray:
    """A law of ``V`` entries of one of six kinds: LLM-like, ties, near one-hot, half zeros, with subnormal entries,
    sharp LLM-like."""
    if kind == 1:
        return np.full(V, 1.0 / V)
    if kind == 2:
        x = np.full(V, 1e-9 / max(V - 1, 1))
        x[rng.integers(V)] = 1.0 - 1e-9 if V > 1 else 1.0
        return x
    z = rng.normal(0.0, 6.0 if kind == 5 else 3.0, V)
    x = np.exp(z - z.max())
    if kind == 3:
        x[rng.random(V) < 0.5] = 0.0
        x[rng.integers(V)] = 1.0
    x /= x.sum()
    if kind == 4:
        x[rng.random(V) < 0.2] = 5e-324
        x[rng.random(V) < 0.2] = 1e-310
    return x


class _ArrayLaws:
    """``laws(paths) -> (P rows, Q rows)``: each frontier's laws as rows of two draft arrays and two target arrays
    (the frontier split in two, each half's rows in a shuffled order), deterministic in the case's seed and the
    path."""

    def __init__(self, V: int, seed: int):
        self.V, self.seed, self.calls = V, seed, 0

    def _pair(self, path):
        rng = np.random.default_rng([self.seed, len(path), *path])
        k = (sum(path) + len(path)) % 6
        return _law(rng, self.V, k), _law(rng, self.V, (k + 1 + self.seed) % 6)

    def __call__(self, paths):
        self.calls += 1
        laws = [self._pair(tuple(s)) for s in paths]
        m = len(laws)
        rng = np.random.default_rng([self.seed, 7, m])
        Prows, Qrows = [None] * m, [None] * m
        for half in (range(0, m // 2), range(m // 2, m)):
            idx = list(half)
            fp, fq = rng.permutation(len(idx)), rng.permutation(len(idx))
            P = np.stack([laws[idx[t]][0] for t in fp]) if idx else np.zeros((0, self.V))
            Q = np.stack([laws[idx[t]][1] for t in fq]) if idx else np.zeros((0, self.V))
            for r, t in enumerate(fp.tolist()):
                Prows[idx[t]] = P[r]
            for r, t in enumerate(fq.tolist()):
                Qrows[idx[t]] = Q[r]
        return Prows, Qrows


#: (shape, V, seed, budget, batch) of the whole-bound cases, and the floats the code before gave (commit 24cd376):
#: value, per-depth sums, lower sums, remainder (hex) and the expanded count.
CASES = [
    ("b5", 2, 0, 1, 64), ("b5", 5, 1, 512, 5), ("b32", 3, 2, 2, 1), ("b32", 300, 3, 64, 7),
    ("b322", 5, 4, 512, 64), ("b322", 777, 5, 40, 9), ("b2222", 4, 6, 512, 16), ("b2222", 300, 7, 30, 64),
    ("mixed", 5, 8, 512, 3), ("mixed", 5000, 9, 12, 64), ("uneven", 3, 10, 7, 2), ("uneven", 1000, 11, 100, 64),
    ("b322", 300, 12, 512, 64), ("b2222", 50, 13, 512, 64),
]
PINNED = {
    ('b5', 2, 0, 1, 64): (
        '0x1.0000000000000p+0',
        ['0x1.0000000000000p+0'],
        ['0x1.0000000000000p+0'],
        '0x0.0p+0', 1),
    ('b5', 5, 1, 512, 5): (
        '0x1.e9dc054973a5fp-1',
        ['0x1.e9dc054973a5fp-1'],
        ['0x1.e9dc054973a5fp-1'],
        '0x0.0p+0', 1),
    ('b32', 3, 2, 2, 1): (
        '0x1.fa87bc49a64e1p-1',
        ['0x1.fa87bc49a64e1p-1', '0x0.024d116e1cc57p-1022'],
        ['0x1.fa87bc49a64e1p-1', '0x0.024d116e1cc57p-1022'],
        '0x0.0p+0', 2),
    ('b32', 300, 3, 64, 7): (
        '0x1.11d06307d96c4p-5',
        ['0x1.ce08aff681a08p-6', '0x1.56605864c4e03p-8'],
        ['0x1.ce08aff681a08p-6', '0x1.23913ee91536ep-9'],
        '0x1.892f71e074890p-9', 64),
    ('b322', 5, 4, 512, 64): (
        '0x1.536305129c3b7p-2',
        ['0x1.4a99a60e8009bp-2', '0x1.75214005bc2fep-8', '0x1.7a6d0202a07e4p-9'],
        ['0x1.4a99a60e8009bp-2', '0x1.75214005bc2fep-8', '0x1.7a6d0202a07e4p-9'],
        '0x0.0p+0', 27),
    ('b322', 777, 5, 40, 9): (
        '0x1.a9378fbea0367p-3',
        ['0x1.b74f4f1e5d36cp-4', '0x1.9b1fd05ee3362p-5', '0x1.0a726ecf88fe0p-4'],
        ['0x1.b74f4f1e5d36cp-4', '0x1.ac4e76be71e49p-7', '0x0.0p+0'],
        '0x1.6596018714f99p-4', 40),
    ('b2222', 4, 6, 512, 16): (
        '0x1.96c82b965fa93p-1',
        ['0x1.cc6cf7cb35178p-2', '0x1.318a67af04a37p-2', '0x1.d5923243aa918p-6', '0x1.23fd48e4aee65p-6'],
        ['0x1.cc6cf7cb35178p-2', '0x1.318a67af04a37p-2', '0x1.d5923243aa918p-6', '0x1.23fd48e4aee65p-6'],
        '0x0.0p+0', 55),
    ('b2222', 300, 7, 30, 64): (
        '0x1.3bcb838c814c3p-15',
        ['0x1.42db012b7e0cbp-17', '0x1.3971045782616p-17', '0x1.38bd9d817b2a4p-16', '0x1.37534396ecd4dp-15'],
        ['0x1.42db012b7e0cbp-17', '0x1.39693b3f46fb0p-17', '0x0.0p+0', '0x0.0p+0'],
        '0x1.3974e8e3a0148p-16', 30),
    ('mixed', 5, 8, 512, 3): (
        '0x1.e8ef61805c3f3p-8',
        ['0x1.e8779af4af54fp-8', '0x1.1f702dc5efdf9p-18', '0x1.7f5401db720d6p-19'],
        ['0x1.e8779af4af54fp-8', '0x1.1f702dc5efdf9p-18', '0x1.7f5401db720d6p-19'],
        '0x0.0p+0', 7),
    ('mixed', 5000, 9, 12, 64): (
        '0x1.4a104b39bfc6bp-4',
        ['0x1.313a75cafe875p-5', '0x1.7fb8de10dc400p-6', '0x1.4613634025cc3p-6'],
        ['0x1.313a75cafe875p-5', '0x1.254466385c64fp-11', '0x0.0p+0'],
        '0x1.5e510f0f9f948p-5', 12),
    ('uneven', 3, 10, 7, 2): (
        '0x1.ec8135589ff38p-1',
        ['0x1.97e32a5243c82p-1', '0x1.52782c1970adap-3'],
        ['0x1.97e32a5243c82p-1', '0x1.52782c1970adap-3'],
        '0x0.0p+0', 4),
    ('uneven', 1000, 11, 100, 64): (
        '0x1.e8766dfad306ap-4',
        ['0x1.79c2a58a7d902p-4', '0x1.bacf21c155da2p-6'],
        ['0x1.79c2a58a7d902p-4', '0x1.d78d55bd9ef88p-7'],
        '0x1.9e10edc50cbb8p-7', 100),
    ('b322', 300, 12, 512, 64): (
        '0x1.83a20884e20e0p-2',
        ['0x1.3bf4041efe02bp-2', '0x1.20d2951a5300cp-5', '0x1.1c9d8e14cd59ep-5'],
        ['0x1.3bf4041efe02bp-2', '0x1.1e3904d9152b2p-5', '0x1.85a66269eaafap-11'],
        '0x1.192084cc63848p-5', 512),
    ('b2222', 50, 13, 512, 64): (
        '0x1.bd0f5cb63c16fp-2',
        ['0x1.93c655ba25f8ap-2', '0x1.2d7e19ecae025p-5', '0x1.8f6b67813f55fp-9', '0x1.e9b3bdf77d7b1p-12'],
        ['0x1.93c655ba25f8ap-2', '0x1.2d7e19ecae025p-5', '0x1.8f6b63c6de1aap-9', '0x1.e95492efe1fa9p-12'],
        '0x1.7d236a9500000p-22', 512),
}


#: The two cases whose floats differ in the last bit on an AVX2 machine (the same code: 9e81b77 and after).
_AVX2 = {
    ('uneven', 1000, 11, 100, 64): (
        '0x1.e8766dfad306bp-4',
        ['0x1.79c2a58a7d902p-4', '0x1.bacf21c155da3p-6'],
        ['0x1.79c2a58a7d902p-4', '0x1.d78d55bd9ef88p-7'],
        '0x1.9e10edc50cbc0p-7', 100),
    ('b322', 300, 12, 512, 64): (
        '0x1.83a20884e20e0p-2',
        ['0x1.3bf4041efe02bp-2', '0x1.20d2951a5300cp-5', '0x1.1c9d8e14cd59ep-5'],
        ['0x1.3bf4041efe02bp-2', '0x1.1e3904d9152b2p-5', '0x1.85a66269eaafbp-11'],
        '0x1.192084cc63848p-5', 512),
}

#: The pinned floats per kind of machine (tests/digests.py): a sum's last bits follow the vector instructions.
PINNED_BY_MACHINE = {"x86_64 AVX512 numpy 2.4.6": PINNED, "x86_64 AVX2 numpy 2.4.6": {**PINNED, **_AVX2}}


def _bound(case):
    name, V, seed, budget, batch = case
    return B._sampled(B._Slots(SHAPES[name]), "iid", _ArrayLaws(V, seed), budget, batch)


def _floats(res) -> tuple:
    return (res.value.hex(), [x.hex() for x in res.per_depth.tolist()],
            [x.hex() for x in res.lower_per_depth.tolist()], res.remainder.hex(), res.n_expanded)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-V{c[1]}-budget{c[3]}" for c in CASES])
def test_bound_is_the_float_before(case):
    """The whole i.i.d. bound (laws as rows of several arrays per frontier: the rows grouped by array) against the
    floats of the code before, to the bit: value, per-depth sums, lower sums, remainder, expanded count."""
    assert _floats(_bound(case)) == for_machine(PINNED_BY_MACHINE, machine())[case]


def _reference_sums(p, q, Qu, pi_row, caps):
    """The lanes of the whole evaluation by numpy: each term added to lane ``v % BLOCK`` block by block, the lanes
    halved pairwise."""
    y = Qu * q
    terms = [np.where(y < pi_row, y, pi_row)] + [np.where(y < m * p, y, m * p) for m in caps]
    out = []
    for t in terms:
        L = np.zeros(K.BLOCK)
        for v0 in range(0, t.shape[0], K.BLOCK):
            b = min(K.BLOCK, t.shape[0] - v0)
            L[:b] = L[:b] + t[v0:v0 + b]
        w = K.BLOCK
        while w > 1:
            h = w // 2
            L[:h] = L[:h] + L[h:w]
            w = h
        out.append(L[0])
    return out


def _numpy_pi(slots, j, s, P, monkeypatch):
    """:math:`\\pi` of every entry of ``P`` by the numpy route of ``_iid_pi`` (no kernel)."""
    with monkeypatch.context() as mp:
        mp.setattr(K, "JIT", False)
        return B._iid_pi(slots, j, s, P)


def _numpy_mismatches(name, Vs, monkeypatch, row_sums=None) -> list:
    """Where ``iid_rows`` (or, given, ``row_sums`` with ``iid_row_sums``' signature, row by row) differs from numpy's
    whole evaluation at every depth of the shape ``name``, with and without caps: a list of cases."""
    slots = B._Slots(SHAPES[name])
    bad = []
    for j in range(slots.D):
        prog = K.iid_program(*slots.iid_classes(j))
        for V in Vs:
            rng = np.random.default_rng([len(name), j, V])
            m = 12
            P = np.stack([_law(rng, V, k % 6) for k in range(m)])
            Q = np.stack([_law(rng, V, (k + 2) % 6) for k in range(m)])
            # targets at the decision's edge too: the lower bound's threshold, one ulp either side
            Fs = np.zeros(prog[1][-1])
            Qu = np.array([1.0, 0.37, 1e-3, 1.0, 1.0, 0.5, 1.0, 1e-300, 1.0, 0.9, 1.0, 1.0])
            s = np.where(rng.random((m, max(j, 1))) < 0.2, 1.0, rng.random((m, max(j, 1))))
            s[1] = 5e-324
            s[2] = 1e-12
            # row 8: subnormal draft entries whose pi underflows (s f below half the least subnormal), the target at
            # the lower bound's threshold (which rounds up to the least subnormal)
            P[8] = rng.choice([5e-324, 1e-323, 1.5e-323, 1e-310, 2.2250738585072014e-308], V)
            s[8] = 0.1
            for i in (8, 9, 10, 11):
                x = min(K.iid_point(K.SLOPE_AT, s[i], j, *prog, Fs), 1.0)
                c = (x / K.SLOPE_AT) * (1.0 - 1e-12)
                thr = c * np.minimum(P[i], K.SLOPE_AT)
                Q[i] = [thr, thr, np.nextafter(thr, 0.0), np.nextafter(thr, np.inf)][i - 8]
            pi = _numpy_pi(slots, j, s[:, :j], P, monkeypatch)
            s_rows = np.ascontiguousarray(s if j else np.zeros((m, 1)))
            for caps in (np.zeros((m, 0)), np.tile([0.0, 7.0, 1e-300], (m, 1))):
                want = np.array([_reference_sums(P[i], Q[i], Qu[i], pi[i], caps[i]) for i in range(m)])
                got = np.full((m, 1 + caps.shape[1]), np.nan)
                ii = rng.permutation(m)
                if row_sums is None:
                    K.iid_rows(P, ii, Q, ii, ii, Qu, s_rows, j, *prog, np.ascontiguousarray(caps), got,
                               np.zeros((m, 0)), np.zeros((m, 0)))
                else:
                    for i in range(m):
                        L = np.zeros((1 + caps.shape[1], K.BLOCK))
                        row_sums(P[i], Q[i], Qu[i], s_rows[i], j, *prog, caps[i], got[i], L,
                                 *K.iid_sums_scratch(prog[1]), None)   # ck=None as the bound passes it
                if not np.array_equal(got.view(np.int64), want.view(np.int64)):
                    bad.append((name, j, V, caps.shape[1], np.flatnonzero((got != want).any(axis=1)).tolist()))
    return bad


@pytest.mark.parametrize("name", list(SHAPES))
def test_iid_rows_sums_against_numpy(name, monkeypatch):
    r"""``iid_rows`` without entries (``iid_row_sums``: the chain evaluation where the program has one class a
    level, the loops otherwise) against numpy's whole evaluation, bit for bit, at every depth of the shape, with and
    without caps, on adversarial rows, ``V`` from 2 to 5,000, ``s`` with ones, tiny and subnormal entries. (The code
    before failed it on ``b322``: a subnormal draft entry whose :math:`\pi` underflows to 0, decided as its
    target.)"""
    assert _numpy_mismatches(name, (2, 3, 5, 257, 1000, 5000), monkeypatch) == []


#: Broken copies of ``iid_row_sums``: (what is replaced, by what, why the check must catch it).
BROKEN = [
    ("und = y > (t if t >= DECIDE_FROM else 0.0)", "und = y > t", "the lower bound trusted below DECIDE_FROM"),
    ("                    z = union_point(s[j - lev] * z, term_cnt[term_start[lev]])",
     "                    z = union_point(s[lev - 1] * z, term_cnt[term_start[lev]])",
     "the chain's draft probabilities in the other order"),
    ("                    z = union_point(s[j - lev] * z, term_cnt[term_start[lev]])",
     "                    z = union_point(s[j - lev] * z, term_cnt[term_start[lev] - 1 + lev // 2])",
     "the chain's count of another level"),
]


@pytest.mark.parametrize("old,new,why", BROKEN, ids=[b[2] for b in BROKEN])
def test_the_numpy_check_catches_broken_kernels(old, new, why, monkeypatch):
    """Each broken copy of ``iid_row_sums`` (its Python source with the module's compiled helpers, run as Python)
    differs from numpy's whole evaluation: the check above can fail."""
    src = inspect.getsource(K.iid_row_sums.py_func)
    assert src.count(old) == 1, why
    ns = dict(vars(K))
    exec(compile(src.replace(old, new), "<broken iid_row_sums>", "exec"), ns)  # noqa: S102 - the test's own copy
    assert _numpy_mismatches("b322", (2, 5), monkeypatch, ns["iid_row_sums"]) != [], why
    assert _numpy_mismatches("b322", (2, 5), monkeypatch, K.iid_row_sums) == []


def _is_chain(levels) -> bool:
    """One class a level and, above level 0, one term a class (the definition, from the classes themselves)."""
    return all(len(lvl) == 1 for lvl in levels) and all(len(k) == 1 for lvl in levels[1:] for k in lvl)


def test_iid_chain_is_its_definition():
    """``iid_chain`` against the classes of :meth:`_Slots.iid_classes` on every depth of many shapes, chains and
    not."""
    seen = set()
    shapes = list(SHAPES.values()) + [TreeShape.branching(8, 7), TreeShape.branching(1, 1, 1),
                                      TreeShape([(0,), (0, 0), (0, 1), (0, 0, 0)]),
                                      TreeShape([(0,), (1,), (0, 0), (1, 0), (1, 1)])]
    for shape in shapes:
        slots = B._Slots(shape)
        for j in range(slots.D):
            levels, root = slots.iid_classes(j)
            prog = K.iid_program(levels, root)
            want = _is_chain(levels)
            assert K.iid_chain(prog[1], prog[2]) == want, (shape.paths, j)
            seen.add(want)
    assert seen == {True, False}


def _row_blocks_before(Prows: list, Qrows: list):
    """``_row_blocks`` of the code before (commit 24cd376), the reference."""
    V = Prows[0].shape[0]
    shape, strides, step, address = (V,), (8,), 8 * V, K.row_address
    bases: dict = {}
    of, at = [], []
    for x in (*Prows, *Qrows):
        if x.shape != shape or x.strides != strides or x.dtype != np.float64:
            return None
        base = x.base
        got = bases.get(id(base), bases)
        if got is bases:
            got = bases[id(base)] = _row_base_before(base, V)
        if got is None:
            return None
        k, off = divmod(address(x) - got[0], step)
        if off or not 0 <= k < got[1]:
            return None
        of.append(base)
        at.append(k)
    m = len(Prows)
    groups: dict = {}
    for i in range(m):
        a, b = of[i], of[m + i]
        groups.setdefault((id(a), id(b)), (a, b, []))[2].append(i)
    at = np.array(at, dtype=np.int64)
    out = []
    for P, Q, rows in groups.values():
        ii = np.array(rows, dtype=np.int64)
        out.append((P.reshape(-1, V), at[ii], Q.reshape(-1, V), at[m + ii], ii))
    return out


def _row_base_before(base, V):
    if not isinstance(base, np.ndarray) or base.dtype != np.float64 or not base.flags.c_contiguous or \
            base.ndim < 2 or base.shape[-1] != V:
        return None
    return base.ctypes.data, base.size // V


def _same(a, b) -> bool:
    """The same groups: the same arrays (shape and first entry's address) and the same index arrays."""
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and all(
        x[k].shape == y[k].shape and x[k].ctypes.data == y[k].ctypes.data for x, y in zip(a, b) for k in (0, 2)) and \
        all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in (1, 3, 4))


def _row_cases():
    rng = np.random.default_rng(5)
    V = 6
    A = rng.random((5, V))
    Bq = rng.random((4, V))
    C3 = rng.random((2, 3, V))                        # a 3-d base: its rows as (6, V)
    W = rng.random((3, V + 2))                        # rows of another width
    flat = rng.random(5 * V)                          # a 1-d base
    f32 = rng.random((3, V)).astype(np.float32)
    big = rng.random((4, 2 * V))
    yield [A[i] for i in (0, 3, 4)], [Bq[i] for i in (1, 0, 3)]                  # one array each
    yield [A[0], A[1]], [A[2], A[3]]                                             # draft and target in one array
    yield [A[4], Bq[0], A[1], Bq[2], A[0]], [Bq[3], A[2], Bq[1], A[3], C3[1, 2]]  # pairs of arrays interleaved
    yield [C3[0, 1], C3[1, 0]], [A[2], C3[0, 0]]                                 # a 3-d base
    yield [A[1]], [A.ravel()[V + 1:2 * V + 1]]                                   # a row not at a row's start
    yield [A[1]], [big[0, :V]]                                                   # the first half of a wider row
    yield [A[1]], [big[1, V:]]                                                   # its second half
    yield [A[1]], [flat[V:2 * V]]                                                # a row of a 1-d base
    yield [A[1], A[2]], [W[0, :V], A[0]]                                         # of an array of another width
    yield [A[1]], [f32[0]]                                                       # float32
    yield [A[0, ::-1]], [A[1]]                                                   # reversed (negative stride)
    yield [A[0]], [A[1].copy()]                                                  # owns its memory


def test_row_blocks_are_those_before():
    """``_row_blocks`` (each row's base numbered, the addresses' arithmetic in numpy) against the code before on rows
    of one array, of several arrays interleaved, of a 3-d array, rows not at a row's start, of another width,
    non-contiguous, float32, owning their memory: the same groups (arrays, rows, frontier positions) or None alike."""
    cases = list(_row_cases())
    nones = 0
    for Prows, Qrows in cases:
        if any(x.shape != Prows[0].shape or x.ndim != 1 for x in (*Prows, *Qrows)):
            continue
        want = _row_blocks_before(Prows, Qrows)
        got = B._row_blocks(Prows, Qrows)
        assert _same(got, want), (got, want)
        nones += want is None
    assert 0 < nones < len(cases)
