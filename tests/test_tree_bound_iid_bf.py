"""The i.i.d. bound's last expanded depth on the host (``otspec.tree._bound_kernels.iid_row_sums``) and the search's
picks (``otspec.tree._bound._Search.advance``), pinned bit for bit.

* ``iid_row_sums`` (the row sums without the entries: :math:`\\pi` only where the lower bound
  :math:`\\pi(S) \\min(p, S) / S` leaves the minimum open) against an independent numpy route: the whole
  evaluation's :math:`\\pi` (``iid_pi_kernel``), :math:`\\min(Q_u q, \\pi)` added lane by lane in block order and
  the lanes halved pairwise, the same floats in the same order; and against ``iid_row`` with the entries written
  (the whole evaluation), one call per row and one per array of rows (``iid_rows``). Adversarial rows: zeros, ties,
  subnormals, one-hot rows, entries at and beside ``SLOPE_AT``, target entries exactly at the decision threshold
  and between :math:`\\pi` and the bound, ``V`` below, at and past whole blocks.
* The check itself against deliberately broken copies of the kernel (run as Python): each is caught.
* The search's picks against the code before (its ``advance`` copied here): the same prefixes expanded in the same
  order, the same bound.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from otspec.models import random_markov_model
from otspec.tree import TreeShape
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K

pytestmark = pytest.mark.skipif(not K.JIT, reason="the row kernels need numba (the fast extra)")

SHAPES = [TreeShape.branching(8, 7), TreeShape.branching(3, 2, 2),
          TreeShape([(0,), (1,), (2,), (3,), (0, 0), (2, 0), (2, 1), (2, 2)]),
          TreeShape([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0)])]


def _slope(s, j, prog):
    """``c`` of ``iid_row_sums``: :math:`(1 - 10^{-12})\\, \\pi(S) / S` (the same operations) and :math:`\\pi(x)`
    at one entry (``iid_point``, capped at 1)."""
    Fs = np.zeros(prog[1][-1])

    def pi(x):
        return min(K.iid_point(x, s, j, *prog, Fs), 1.0)

    return (pi(K.SLOPE_AT) / K.SLOPE_AT) * (1.0 - 1e-12), pi


def _rows(V, s, j, prog, rng):
    """Adversarial ``(p, q, Qu)`` rows of width ``V`` (laws need not be normalised here: the kernel reads entries)."""
    S = K.SLOPE_AT
    c, pi = _slope(s, j, prog)
    tiny = [0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 1e-300]
    around = [S, np.nextafter(S, 0.0), np.nextafter(S, 1.0), 2 * S, 0.5 * S, 0.5, 1.0, 0.25]
    out = []
    z = rng.normal(0.0, 3.0, V)
    llm = np.exp(z - z.max())
    llm /= llm.sum()
    z2 = z + rng.normal(0.0, 1.0, V)
    llm2 = np.exp(z2 - z2.max())
    llm2 /= llm2.sum()
    out.append((llm, llm2, 1.0))
    out.append((llm, llm2, 0.37))
    out.append((llm2, llm, 1e-3))
    out.append((np.zeros(V), llm, 1.0))                              # draft zeros: pi = 0 everywhere
    out.append((llm, np.zeros(V), 1.0))                              # target zeros
    hot = np.zeros(V)
    hot[V // 2] = 1.0
    out.append((hot, hot.copy(), 1.0))                               # one-hot rows
    out.append((hot, llm, 0.5))
    tie = np.full(V, 1.0 / V)
    out.append((tie, tie.copy(), 1.0))                               # ties everywhere
    out.append((tie, np.full(V, 2.0 / V), 1.0))
    # entries from a pool of special values, mixed
    pool_p = np.array(tiny + around + [1e-6, 3e-4, 0.9e-3, 0.1])
    p = pool_p[rng.integers(0, pool_p.size, V)]
    # target: exactly at the threshold c min(p, S) (decided as Q_u q: q < pi), one ulp either side, between pi
    # and the bound (pi < q), far above pi, zero, subnormal
    thr = c * np.minimum(p, S)
    piv = np.array([pi(x) for x in p])
    mid = np.where(piv < thr, 0.5 * (piv + thr), thr)
    kind = rng.integers(0, 8, V)
    q = np.choose(kind, [thr, np.nextafter(thr, 0.0), np.nextafter(thr, np.inf), mid, np.minimum(1.0, 3 * piv + 1e-3),
                         np.zeros(V), np.full(V, 1e-310), piv])
    out.append((p, q, 1.0))
    # above SLOPE_AT: the target between pi and the old slope c p (undecided now, decided wrongly by c p)
    p2 = np.where(rng.random(V) < 0.5, 0.5, 2 * S)
    pi2 = np.array([pi(x) for x in p2])
    q2 = np.where(pi2 < c * p2, 0.5 * (pi2 + np.minimum(c * p2, 1.0)), pi2)
    out.append((p2, q2, 1.0))
    # at S: just above pi(S), below pi(S) / (1 - 1e-12) (caught only with the margin)
    out.append((np.full(V, S), np.full(V, pi(S) * (1 + 5e-13)), 1.0))
    # the first block all undecided, the rest decided (flags of a whole block before a partial one)
    q3 = llm.copy() * 1e-9
    q3[: min(V, K.BLOCK)] = 1.0
    q3[-1] = 1.0                                                     # and one in the last block
    out.append((llm, q3, 1.0))
    return out


def _reference(p, q, Qu, pi_row, caps=()):
    """The lanes of the whole evaluation by numpy: :math:`\\min(Q_u q, \\pi)` (and each cap's
    :math:`\\min(Q_u q, m\\, p)`) added to lane ``v % BLOCK`` block by block, the lanes halved pairwise."""
    y = Qu * q
    terms = [np.where(y < pi_row, y, pi_row)]
    for m in caps:
        z = m * p
        terms.append(np.where(y < z, y, z))
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
    return np.array(out)


def _mismatches(kernel, shapes=SHAPES, Vs=(1, 7, 256, 300, 777), seed=0):
    """Where ``kernel`` (``iid_row_sums``' signature) differs from the reference, or raises: a list of cases."""
    rng = np.random.default_rng(seed)
    bad = []
    for shape in shapes:
        slots = B._Slots(shape)
        for j in range(len(slots.n_at) - 1):
            prog = K.iid_program(*slots.iid_classes(j))
            for s in (rng.random(max(j, 1)), np.ones(max(j, 1))):
                for V in Vs:
                    for n, (p, q, Qu) in enumerate(_rows(V, s, j, prog, rng)):
                        pi_row = np.empty((1, V))
                        K.iid_pi_kernel(p[None, :], s[None, :], j, *prog, pi_row)
                        caps = np.array([0.0, 7.0, 1e-300][: j % 3 + 1])
                        want = _reference(p, q, Qu, pi_row[0], caps)
                        got = np.zeros(1 + caps.size)
                        L = np.zeros((1 + caps.size, K.BLOCK))
                        try:
                            # ck=None as the bound passes it: no second compilation for an omitted argument
                            kernel(p, q, Qu, s, j, *prog, caps, got, L, *K.iid_sums_scratch(prog[1]), None)
                        except Exception as e:  # noqa: BLE001 - a broken copy may index out of its rows
                            bad.append((shape.n, j, V, n, repr(e)))
                            continue
                        if not np.array_equal(got, want):
                            bad.append((shape.n, j, V, n, got.tolist(), want.tolist()))
    return bad


def test_iid_row_sums_are_the_whole_evaluation_bit_for_bit():
    """``iid_row_sums`` against the numpy lanes of the whole evaluation, bit for bit, on the adversarial rows of
    every depth of four shapes (several classes and terms per level), with and without caps of lower depths."""
    assert _mismatches(K.iid_row_sums) == []


def test_iid_row_without_entries_is_iid_row_with_them():
    """``iid_row`` without ``low``/``pi`` (the sums alone) against ``iid_row`` writing them (the whole evaluation),
    one call per row, and ``iid_rows`` over the rows of one array in a shuffled order (its buffers made once for
    the call) against both: the same sums bit for bit."""
    rng = np.random.default_rng(3)
    for shape in SHAPES[:2]:
        slots = B._Slots(shape)
        for j in range(len(slots.n_at) - 1):
            prog = K.iid_program(*slots.iid_classes(j))
            for V in (300, 1000):
                s = rng.random(max(j, 1))
                rows = _rows(V, s, j, prog, rng)
                P = np.stack([r[0] for r in rows])
                Q = np.stack([r[1] for r in rows])
                Qu = np.array([r[2] for r in rows])
                m = P.shape[0]
                mdc = np.zeros((m, 0))
                whole = np.zeros((m, 1))
                alone = np.zeros((m, 1))
                for i in range(m):
                    K.iid_row(P[i], Q[i], Qu[i], s, j, *prog, mdc[i], whole[i], np.empty(V), np.empty(V))
                    K.iid_row(P[i], Q[i], Qu[i], s, j, *prog, mdc[i], alone[i], np.empty(0), np.empty(0))
                # the rows of two arrays in two orders: row ii[k] is P[pr[k]], Q[qr[k]]
                fp, fq, ii = rng.permutation(m), rng.permutation(m), rng.permutation(m)
                pr, qr = np.argsort(fp)[ii], np.argsort(fq)[ii]
                grouped = np.zeros((m, 1))
                K.iid_rows(P[fp], pr, Q[fq], qr, ii, Qu, np.tile(s, (m, 1)), j, *prog, mdc, grouped,
                           np.zeros((m, 0)), np.zeros((m, 0)))
                assert np.array_equal(whole, alone), (shape.n, j, V)
                assert np.array_equal(whole, grouped), (shape.n, j, V)


#: Broken copies of ``iid_row_sums``: (what is replaced, by what, why the check must catch it).
BROKEN = [
    ("(1.0 - 1e-12)", "(1.0 + 1e-12)", "the margin the other way: q just above pi(S) decided as q"),
    ("            t = c * (x if x < SLOPE_AT else SLOPE_AT)\n            und", "            t = c * x\n            und",
     "the chord's slope above SLOPE_AT too"),
    ("mk[v] = 1 if y > (t if t >= DECIDE_FROM else 0.0) else 0",
     "mk[v] = 1 if y >= (t if t >= DECIDE_FROM else 0.0) else 0", "the flags' comparison not the sweep's"),
    ("            for v in range(b, BLOCK):\n                mk[v] = 0\n", "",
     "a partial block's flags past its end left from the block before"),
    ("acc = g if m == term_start[k] else g + (1.0 - g) * acc", "acc = g if m == term_start[k] else acc + (1.0 - acc) * g",
     "a class's terms combined the other way round"),
    ("L0[v] += y if y < pv else pv", "L0[v] += pv", "pi added where the target is the minimum"),
]


@pytest.mark.parametrize("old,new,why", BROKEN, ids=[b[2] for b in BROKEN])
def test_the_check_catches_broken_kernels(old, new, why):
    """Each broken copy of ``iid_row_sums`` (its Python source, run as Python with the module's compiled helpers)
    differs from the reference on the adversarial rows: the checks above can fail."""
    src = inspect.getsource(K.iid_row_sums.py_func)
    assert src.count(old) == 1, why
    ns = dict(vars(K))
    exec(compile(src.replace(old, new), "<broken iid_row_sums>", "exec"), ns)  # noqa: S102 - the test's own copy
    shapes = [SHAPES[0], SHAPES[3]]
    assert _mismatches(ns["iid_row_sums"], shapes=shapes, Vs=(7, 300)) != [], why


def _advance_before(self) -> list:
    """``_Search.advance`` as it was before the picks were taken by index arrays (the reference)."""
    self.calls += 1
    left = self.left
    n_alive = sum(int(c["alive"].sum()) for c in self.blocks)
    if left <= 0 or n_alive == 0:
        self.frontier = []
        return self.frontier
    blocks = self.blocks
    ids = [(b, k) for b, c in enumerate(blocks) for k in np.flatnonzero(c["alive"]).tolist()]
    pr = np.concatenate([c["pr"][c["alive"]] for c in blocks])
    dep = np.concatenate([c["depth"][c["alive"]] for c in blocks])
    order = np.concatenate([c["order"][c["alive"]] for c in blocks])
    x = np.concatenate([c["x"][c["alive"]] for c in blocks])
    take = min(self.batch, left)
    sel = np.lexsort((x, order, dep, -pr))[:take]
    picks = [ids[t] for t in sel.tolist()]
    per_block: dict = {}
    for n, (b, _k) in enumerate(picks):
        per_block.setdefault(b, []).append(n)
    made: list = [None] * len(picks)
    for b, ns in per_block.items():
        for n, c in zip(ns, B._children(self.slots, self.process, blocks[b], [picks[n][1] for n in ns])):
            made[n] = c
    frontier = []
    for (b, k), c in zip(picks, made):
        blocks[b]["alive"][k] = False
        blocks[b]["owner"][k].children.append(c)
        c.order = len(self.expanded)
        self.expanded.append(c)
        frontier.append(c)
    frontier.sort(key=lambda u: len(u.path))
    self.frontier = frontier
    return frontier


class _Laws:
    """``laws(paths) -> (P, Q)``: two Markov models' next-token laws, one stacked block per frontier (``tied``:
    uniform laws, every candidate of a depth tied with every other: the picks' order is the tie-breaks')."""

    def __init__(self, draft, target, tied=False):
        self.draft, self.target, self.tied, self.calls = draft, target, tied, 0

    def __call__(self, paths):
        self.calls += 1
        if self.tied:
            V = self.draft.vocab_size
            return np.full((len(paths), V), 1.0 / V), np.full((len(paths), V), 1.0 / V)
        return (np.stack([self.draft.next_dist(list(s)) for s in paths]),
                np.stack([self.target.next_dist(list(s)) for s in paths]))


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("shape,budget,batch", [(TreeShape.branching(3, 2, 2), 40, 7),
                                                (TreeShape.branching(4, 2, 2, 1), 60, 5),
                                                (TreeShape.branching(8, 7), 30, 64)])
def test_search_picks_are_those_before(monkeypatch, process, shape, budget, batch, tied):
    """The search with its picks taken by index arrays against its ``advance`` before (several candidate blocks
    alive at once, of several depths; batches smaller and larger than a block; laws with and without ties): the same
    prefixes expanded in the same order, each prefix's children in the same order, the same bound to the bit."""
    rng = np.random.default_rng(11)
    V = 40
    draft = random_markov_model(V, order=2, concentration=0.4, rng=rng)
    target = random_markov_model(V, order=2, concentration=0.4, rng=rng)
    got = {}
    made = []

    class Recording(B._Search):
        def __init__(self, *a):
            super().__init__(*a)
            made.append(self)

    monkeypatch.setattr(B, "_Search", Recording)
    for label in ("now", "before"):
        if label == "before":
            monkeypatch.setattr(Recording, "advance", _advance_before)
        res = B._sampled(B._Slots(shape), process, _Laws(draft, target, tied), budget, batch)
        search = made[-1]
        got[label] = (res, [u.path for u in search.expanded], [u.order for u in search.expanded],
                      {u.path: [c.path for c in u.children] for u in search.expanded})
    now, before = got["now"], got["before"]
    assert now[1] == before[1] and now[2] == before[2] and now[3] == before[3]
    assert 1 < len(now[1]) <= budget
    assert now[0].value == before[0].value
    assert now[0].per_depth.tolist() == before[0].per_depth.tolist()
    assert now[0].lower_per_depth.tolist() == before[0].lower_per_depth.tolist()
    assert (now[0].complete, now[0].n_expanded, now[0].n_calls) == (before[0].complete, before[0].n_expanded,
                                                                    before[0].n_calls)
