r"""The union bound :math:`B^*` on every lossless tree verifier (``otspec.tree.bound(..., method="union")``).

A lossless verifier emits an accepted root path :math:`A` (length :math:`\tau`) of the realised tree with
:math:`A = Y_{1:\tau}`, :math:`Y \sim Q`. For every set :math:`T` of token paths of length :math:`d`,

.. math::

    P(\tau \ge d) \le P(A_{1:d} \in T) + P(Y_{1:d} \notin T) \le \Pi(T) + Q(T^c),

:math:`\Pi(T)` the probability that the realised tree has some root path in :math:`T` (a union, at most
:math:`\sum_{y \in T} \pi(y)`). So :math:`P(\tau \ge d) \le b^*_d = \min_T [Q(T^c) + \Pi(T)] \le b_d` and
:math:`\mathbb E[\tau] \le B^* = \sum_d \min(b^*_1, \dots, b^*_d) \le B` (the proof: docs/theory/trees.rst,
"A tighter bound: unions of root paths"). Any :math:`T` gives a valid bound, so the minimum is taken over a family:
the threshold sets :math:`\{y : \kappa(y) \le t\}` for the keys :math:`\kappa = \pi / Q` and :math:`\kappa = P / Q`,
swept over ``t``.

The prefixes, their laws, the order of expansion and the budget are those of the paths bound
(:func:`otspec.tree._bound._sampled`, whose expansion calls back :meth:`_Rows.add` with each block of rows); here
each expanded prefix's row is reduced to the sums over its children that the recursion for :math:`\Pi` reads.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .._array import to_host
from . import _bound
from ._bound import TreeBound, _block, _child_pi, _DrawLaws, _sampled, _Slots
from ._process import _wor_enumeration

__all__ = ["union_bound"]

#: Vocabularies up to this size sweep every distinct key of the expanded rows (the exact minimum over the
#: threshold family); above it, the fixed grid :data:`_GRID` of thresholds.
_EXACT_KEYS_V = 8
#: The thresholds of larger vocabularies: 0, 1 and 16 per decade from 1e-6 to 1e6 (fixed, so that the family does
#: not depend on the budget).
_GRID = np.unique(np.concatenate([[0.0, 1.0], np.logspace(-6.0, 6.0, 193)]))
#: The states the value is the least over: after ``m`` expanded prefixes for every ``m`` up to this, every power of
#: two, and the budget's last (the order of expansion does not depend on the budget, so each is the state that
#: budget ``m`` reaches).
_EVERY_STATE = 32
#: Largest number of ordered draws of a node enumerated (at vocabularies up to :data:`_EXACT_KEYS_V`) for the exact
#: union probability without replacement; above it the stated upper bounds.
_MAX_SEQUENCES = 5000
#: log(1 - f) below this is taken as -inf (exp of it is 0 in float64), keeping 0 * log finite in the sums.
_LOG_FLOOR = -1000.0


def _keys(num: np.ndarray, Qc: np.ndarray) -> np.ndarray:
    """``num / Qc`` with 0 where ``num`` is 0 (the path is never drawn: in every ``T``) and inf where only ``Qc`` is
    0 (the target never writes it: in no ``T``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(num > 0, num / np.where(Qc > 0, Qc, 1.0), 0.0)
    return np.where((num > 0) & (Qc <= 0), np.inf, k)


def _bins(key: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The bin of each entry among the sorted thresholds ``grid``: the entry is in :math:`T_g` iff its bin is
    at most ``g``."""
    return np.searchsorted(grid, key, side="left")


def _sums(bins: np.ndarray, w: np.ndarray, G: int, above: bool) -> np.ndarray:
    r"""``(..., G)``: per row of ``w`` (``(..., V)``; ``bins`` ``(n, V)``, its rows repeated along ``w``'s leading
    axes), :math:`\sum_{\text{bin} \le g} w`, or with ``above`` :math:`\sum_{\text{bin} > g} w` (summed from the
    top: sums of positive terms, no cancellation)."""
    V = w.shape[-1]
    bb = bins.reshape(-1, V)
    ww = np.ascontiguousarray(w).reshape(-1, V)
    nb = bb.shape[0]
    out = np.empty((ww.shape[0], G))
    for i in range(ww.shape[0]):
        h = np.bincount(bb[i % nb], weights=ww[i], minlength=G + 1)
        out[i] = np.cumsum(h[::-1])[::-1][1:] if above else np.cumsum(h)[:G]
    return out.reshape(w.shape[:-1] + (G,))


class _Row:
    """One expanded prefix: its place in the expansion, what its parent's row holds about it, and its children's
    sums (or, at small vocabularies, the children's entries themselves)."""

    __slots__ = ("order", "depth", "parent", "x", "p", "Q", "key", "Sp", "SQ", "SL", "lx", "entries", "M", "seqs",
                 "cand")

    def __init__(self, order, depth):
        self.order, self.depth = order, depth
        self.parent = self.x = -1
        self.seqs = None
        self.p = self.Q = 0.0
        self.key = (0.0, 0.0)
        self.Sp = self.SQ = self.SL = self.lx = self.entries = self.M = None
        self.cand: dict = {}


class _Rows:
    """The rows of the expanded prefixes, filled by the paths bound's expansion (:meth:`add`)."""

    def __init__(self, slots: _Slots, process: str):
        self.slots, self.process = slots, process
        self.rows: dict = {}           # order -> _Row
        self.by_path: dict = {}        # path -> order
        self.exact = None              # keys swept exactly (small vocabularies)
        self.V = None
        self.enumerated = True         # without replacement: every node's draws enumerated (Pi exact)

    def add(self, frontier, Pl, Ql, cand) -> None:
        """Reduce one block of rows (prefixes of one depth; laws as the expansion read them)."""
        P = np.asarray(to_host(_block(Pl)), dtype=np.float64)
        Qb = np.asarray(to_host(_block(Ql)), dtype=np.float64)
        m, V = P.shape
        if self.V is None:
            self.V, self.exact = V, V <= _EXACT_KEYS_V
        j = len(frontier[0].path)
        A = np.stack([u.A for u in frontier])
        s_all = np.array([u.s for u in frontier], dtype=np.float64).reshape(m, j)
        pi = np.asarray(to_host(_child_pi(self.slots, self.process, A, s_all, P, [u.path for u in frontier])[0]))
        Qc = np.array([u.Q for u in frontier])[:, None] * Qb
        Pc = np.prod(s_all, axis=1)[:, None] * P
        keys = np.stack([_keys(pi, Qc), _keys(Pc, Qc)])                 # (2, m, V): pi / Q and P / Q
        need = self.slots.need[j]
        if self.process == "wor" and need > 1:
            top = -np.sort(-np.partition(P, V - need, axis=1)[:, V - need:], axis=1)
            M = np.concatenate([np.zeros((m, 1)), np.cumsum(top, axis=1)[:, :need - 1]], axis=1)
        else:
            M = np.zeros((m, max(need, 1)))
        # without replacement: the law of each used rank's draw (exact, or the stated upper bound where the race
        # refuses a row: either keeps the union over the children an upper bound), (R, m, V)
        ranks = self.slots.ranks_below[j]
        laws = None
        if self.process == "wor" and ranks:
            dl = _DrawLaws(P, ranks, np, race=_bound._WOR_RACE)
            laws = np.stack([np.asarray(dl.law(k), dtype=np.float64) for k in range(len(ranks))])
        if self.exact:
            Sp = SQ = SL = None
        else:
            G = _GRID.shape[0]
            bins = _bins(keys, _GRID)                                         # (2, m, V)
            Sp = np.stack([_sums(bins[k], P, G, False) for k in range(2)])    # (2, m, G)
            SQ = np.stack([_sums(bins[k], Qc, G, True) for k in range(2)])
            SL = None if laws is None else np.stack([_sums(bins[k], laws, G, False) for k in range(2)])  # (2,R,m,G)
        local = {id(u): i for i, u in enumerate(frontier)}
        for i, u in enumerate(frontier):
            r = _Row(u.order, j)
            if j:
                par = self.rows[self.by_path[u.path[:-1]]]
                r.parent = par.order
                r.p, r.Q, r.key, r.lx = par.cand[u.path[-1]]
                r.x = u.path[-1]
            r.M = M[i]
            if self.process == "wor" and ranks:
                n_seq = math.perm(int(np.count_nonzero(P[i] > 0)), need)
                if self.exact and n_seq <= _MAX_SEQUENCES:
                    r.seqs = _wor_enumeration(P[i], need)
                else:
                    self.enumerated = False
            if self.exact:
                r.entries = (keys[:, i].copy(), P[i].copy(), Qc[i].copy(), None if laws is None else laws[:, i].copy())
            else:
                r.Sp, r.SQ = Sp[:, i], SQ[:, i]
                r.SL = None if SL is None else SL[:, :, i]                   # (2, R, G)
            self.rows[u.order] = r
            self.by_path[u.path] = u.order
        if cand is not None:
            for owner, x in zip(cand["owner"], cand["x"].tolist()):
                i = local[id(owner)]
                self.rows[owner.order].cand[x] = (float(P[i, x]), float(Qc[i, x]),
                                                  (float(keys[0, i, x]), float(keys[1, i, x])),
                                                  None if laws is None else laws[:, i, x].copy())

    # ------------------------------------------------------------------ the value of one state
    def state(self, m: int) -> np.ndarray:
        """``(D,)``: :math:`\\min_t [Q(T_t^c) + \\Pi(T_t)]` at each depth over both key families, from the first ``m``
        expanded prefixes (an upper bound on :math:`P(\\tau \\ge d)` each)."""
        R = [self.rows[i] for i in range(m)]
        D = self.slots.D
        out = np.full(D, np.inf)
        for kk in range(2):
            if self.exact:
                grid = np.unique(np.concatenate([[0.0]] + [r.entries[0][kk] for r in R]))
                grid = grid[np.isfinite(grid)]
                G = grid.shape[0]
                bins = [_bins(r.entries[0][kk], grid) for r in R]
                Sp = [_sums(bb[None], r.entries[1][None], G, False)[0] for bb, r in zip(bins, R)]
                SQ = [_sums(bb[None], r.entries[2][None], G, True)[0] for bb, r in zip(bins, R)]
                SL = [None if r.entries[3] is None else _sums(bb[None], r.entries[3], G, False)
                      for bb, r in zip(bins, R)]
            else:
                grid = _GRID
                Sp = [r.Sp[kk] for r in R]
                SQ = [r.SQ[kk] for r in R]
                SL = [None if r.SL is None else r.SL[kk] for r in R]
            bins = [int(np.searchsorted(grid, r.key[kk], side="left")) for r in R]
            ebins = [_bins(r.entries[0][kk], grid) for r in R] if self.exact else None
            for d in range(1, D + 1):
                out[d - 1] = min(out[d - 1], float(np.min(self._depth(R, d, Sp, SQ, SL, bins, grid.shape[0],
                                                                       ebins))))
        return out

    def _depth(self, R, d: int, Sp, SQ, SL, bins, G: int, ebins=None) -> np.ndarray:
        """``(G,)``: :math:`Q(T_g^c) + \\Pi(T_g)` for the paths of length ``d``, by the recursion over the slots from
        the rows of depth ``d - 1`` up to the root (``SL``: each row's sums of its draws' laws, without
        replacement; ``ebins``: each row's entries' bins, at small vocabularies, for the enumerated draws)."""
        slots = self.slots
        g = np.arange(G)
        Gnext = None            # (rows of depth j + 1, slots of depth j + 1, G)
        idx_next = None         # positions of those rows
        QTc = np.zeros(G)
        for j in range(d - 1, -1, -1):
            idx = [i for i, r in enumerate(R) if r.depth == j]
            if not idx:                # nothing expanded at this depth: the rows above hold units only
                continue
            pos = {i: k for k, i in enumerate(idx)}
            n = len(idx)
            kids = slots.by_depth[j + 1]
            a = np.zeros((n, len(kids), G))
            sp = np.stack([Sp[i] for i in idx])                       # (n, G)
            sq = np.stack([SQ[i] for i in idx])
            wor = self.process == "wor"
            if wor:   # the union over the children: b_c = sum_x P(draw r(c) = x) g(c, ux), per child slot
                cols = [slots.ranks_below[j].index(slots.rank[c]) for c in kids]
                sl = np.stack([SL[i] for i in idx])[:, cols, :]       # (n, kids, G)
                b = np.zeros((n, len(kids), G))
            if j == d - 1:
                a += sp[:, None, :]                                   # every child slot: its path in T or not
                QTc += sq.sum(axis=0)
                if wor:
                    b += sl
            else:
                has = (slots.N[kids, d] > 0).astype(np.float64)       # child slots with paths of length d below
                unexp, sq_un = sp.copy(), sq.copy()
                for k, i in enumerate(idx_next or ()):
                    r = R[i]
                    at = pos[r.parent]
                    inT = g >= bins[i]
                    unexp[at] -= r.p * inT
                    sq_un[at] -= r.Q * ~inT
                    a[at] += r.p * Gnext[k]
                    if wor:
                        lx = r.lx[cols][:, None]                      # (kids, 1): the child's laws at its token
                        sl[at] -= lx * inT
                        b[at] += lx * Gnext[k]
                np.maximum(unexp, 0.0, out=unexp)
                np.maximum(sq_un, 0.0, out=sq_un)
                a += unexp[:, None, :] * has[None, :, None]
                QTc += sq_un.sum(axis=0)
                if wor:
                    b += np.maximum(sl, 0.0) * has[None, :, None]
            # the slots of depth j: 1 - prod over child slots c of (1 - f_c), f_c = a_c (i.i.d.) or the stated
            # bound a_c / (1 - M_{r(c)}) (without replacement)
            if self.process == "wor":
                Mr = np.stack([R[i].M for i in idx])                      # (n, need)
                ranks = [slots.rank[c] for c in kids]
                den = np.stack([1.0 - Mr[:, r] if r < Mr.shape[1] else np.ones(n) for r in ranks], axis=1)
                f = a / den[:, :, None]
            else:
                f = a
            with np.errstate(divide="ignore"):
                L = np.maximum(np.log1p(-np.minimum(f, 1.0)), _LOG_FLOOR)
            inc = np.zeros((len(slots.by_depth[j]), len(kids)))
            for c_pos, c in enumerate(kids):
                inc[slots.pos[slots.parent[c]], c_pos] = 1.0
            Gcur = -np.expm1(np.einsum("wc,ncg->nwg", inc, L))
            if wor:       # the smaller of the two upper bounds
                np.minimum(Gcur, np.minimum(np.einsum("wc,ncg->nwg", inc, b), 1.0), out=Gcur)
                if ebins is not None:
                    self._enumerated_rows(R, idx, idx_next, pos, j, d, kids, ebins, Gnext, Gcur)
            Gnext = Gcur
            idx_next = idx
        return QTc + Gnext[0, 0]

    def _enumerated_rows(self, R, idx, idx_next, pos, j, d, kids, ebins, Gnext, Gcur) -> None:
        """Without replacement, the rows whose ordered draws are enumerated: :math:`g(v) = 1 - \\sum_s w(s)
        \\prod_{c} (1 - h_c(s_{r(c)}))` exactly, ``h_c(x)`` = ``g(c, ux)`` (``Gnext`` at an expanded child, 1 at a
        unit in ``T`` with slots of depth ``d`` below ``c``, else 0; the indicator of ``T`` at depth ``d``), into
        ``Gcur``."""
        slots = self.slots
        G = Gcur.shape[2]
        g = np.arange(G)
        kidpos = {c: k for k, c in enumerate(kids)}
        has = (slots.N[kids, d] > 0).astype(np.float64)
        below: dict = {}
        for k, i in enumerate(idx_next or ()):
            below.setdefault(pos[R[i].parent], []).append((R[i].x, k))
        for at, i in enumerate(idx):
            r = R[i]
            if r.seqs is None:
                continue
            inT = (ebins[i][:, None] <= g[None, :]).astype(np.float64)           # (V, G)
            if j == d - 1:
                H = np.broadcast_to(inT, (len(kids),) + inT.shape)
            else:
                H = has[:, None, None] * inT[None]
                for x, k in below.get(at, ()):
                    H[:, x, :] = Gnext[k]
            S, W = r.seqs
            for wp, w in enumerate(slots.by_depth[j]):
                prod = np.ones((W.shape[0], G))
                for c in slots.children[w]:
                    prod *= 1.0 - H[kidpos[c], S[:, slots.rank[c]], :]
                Gcur[at, wp] = 1.0 - W @ prod


def _states(budget: int, n: int) -> list[int]:
    """The numbers of expanded prefixes whose states the value is the least over (see :data:`_EVERY_STATE`)."""
    s = set(range(1, min(n, _EVERY_STATE) + 1))
    s.update(2**k for k in range(int(math.log2(max(n, 1))) + 1))
    s.add(n)
    return sorted(m for m in s if 1 <= m <= n)


def union_bound(slots: _Slots, process: str, laws, budget: int, batch: int) -> TreeBound:
    r""":math:`B^*` of the module's docstring for a sampled process (``"iid"``, ``"wor"``), by the paths bound's
    search and budget: at each depth the least :math:`Q(T^c) + \Pi(T)` over the threshold sets and over the states
    of :func:`_states`, and never above the paths bound's :math:`\hat b_d` (also an upper bound on
    :math:`P(\tau \ge d)`).

    :math:`\Pi(T)` by the recursion over the shape's slots, a slot :math:`v` of depth :math:`j` holding :math:`u`:
    :math:`g(v) = 1 - \prod_c (1 - f_c)`, :math:`a_c = \sum_x p(x \mid u)\, g(c, ux)`; i.i.d. children
    :math:`f_c = a_c` (exact); without replacement, at vocabularies up to :data:`_EXACT_KEYS_V` with at most
    :data:`_MAX_SEQUENCES` ordered draws per node, the draws enumerated (exact: :meth:`_Rows._enumerated_rows`), else
    the smaller of two upper bounds: :math:`f_c = \min(1, a_c /
    (1 - M_{r(c)}(u)))`, :math:`M_r(u)` the mass of the ``r`` most likely tokens (given the earlier draws, the draw
    of rank ``r`` lands on ``x`` with probability at most :math:`p(x) / (1 - M_r)`), and the union over the
    children :math:`\min(1, \sum_c \sum_x P(\text{draw } r(c) = x)\, g(c, ux))`. At a path of length ``d``
    :math:`g = 1[y \in T]`; at an unexpanded prefix :math:`ux` above it, the whole subtree is in :math:`T`
    (:math:`g = 1` at a slot with slots of depth ``d`` below, an upper bound) when :math:`\kappa(ux) \le t`, else
    in :math:`T^c` (adding :math:`Q(ux)`)."""
    rows = _Rows(slots, process)
    res = _sampled(slots, process, laws, budget, batch, on_rows=rows.add)
    n = len(rows.rows)
    best = np.array(res.per_depth, dtype=np.float64)
    for m in _states(budget, n):
        best = np.minimum(best, rows.state(m))
    best.setflags(write=False)
    value = math.fsum(np.minimum.accumulate(best).tolist())
    # i.i.d.: exact; without replacement: one draw per node (f_c = a_c) or every node's draws enumerated
    exact = process == "iid" or max(slots.need) <= 1 or rows.enumerated
    return dataclasses.replace(res, value=value, per_depth=best, pi_exact=bool(res.pi_exact and exact),
                               method="union")


_bound.BOUND_METHODS["union"] = union_bound
