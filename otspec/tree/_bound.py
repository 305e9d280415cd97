r"""An upper bound on every lossless tree verifier of a draft process, at any vocabulary size (anytime).

A lossless verifier emits an accepted root path :math:`A` (length
:math:`\tau`) of the realised tree :math:`T` and one more token; with
:math:`Y \sim Q` the output completed by the target, :math:`A = Y_{1:\tau}`.
For every token path :math:`y` of length :math:`d`,
:math:`P(A_{1:d} = y) \le \min(Q(y), \pi(y))`, :math:`\pi(y)` the probability
that :math:`y` is a root path of :math:`T`, so

.. math::

    P(\tau \ge d) \le b_d = \sum_{|y| = d} \min\big(Q(y), \pi(y)\big), \qquad
    \mathbb E[\tau] \le B = \sum_{d=1}^{D} \min(b_1, \dots, b_d),

which bounds the coupling optimum :math:`\mathrm{OPT}_c` and so the one-token
optimum :math:`\mathrm{OPT}_1` of :func:`otspec.tree.optimum` (the proof:
docs/theory/trees.rst, "An upper bound at any vocabulary"). :func:`bound`
computes it from the draft's and the target's laws at a budget of expanded
prefixes; every prefix left unexpanded adds an upper bound on what lies
below it, so the value only tightens as the budget grows and equals
:math:`B` once every prefix that matters is expanded.

Notation: ``p`` is the draft law and ``q`` the target law at a prefix;
:math:`P`, :math:`Q` their probabilities of a token path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .. import _validation_kernel as _LK
from .._array import copy_of, namespace, to_host
from .._validation import SIMPLEX_TOL, law_total_accepts, validate_positive_int
from ..models import checked_tables, next_law, validate_model_pair, validate_sequence
from . import _bound_kernels as _K
from ._process import (
    DETERMINISTIC_PROCESSES,
    LawCache,
    _child_groups,
    _eagle2_tree,
    _support_error,
    _topk_tree,
    _wor_rank_laws,
    as_tree_shape,
    validate_process,
)

__all__ = ["DEFAULT_BOUND_BATCH", "MAX_BOUND_BUDGET", "MAX_BOUND_BATCH", "TreeBound", "bound"]

#: The bounds of :func:`bound` other than ``method="paths"``: ``name -> fn(slots, process, laws, budget, batch)`` on
#: the search of :func:`_sampled`, registered by the module that defines each (above this one, so that no import runs
#: back up): ``"union"`` by :mod:`otspec.tree._bound_union`, which the package imports.
BOUND_METHODS: dict = {}
#: Largest ``budget`` of :func:`bound` (expanded prefixes; each costs a draft and a target law of ``V`` entries).
MAX_BOUND_BUDGET = 100_000
#: Largest ``batch`` of :func:`bound` (prefixes scored per model call).
MAX_BOUND_BATCH = 4096
#: Default prefixes scored per model call.
DEFAULT_BOUND_BATCH = 64
#: Largest ``batch * V`` (entries of one frontier's law array): a few float64 temporaries of this size.
_MAX_FRONTIER_ENTRIES = 2**26
#: Entries of a frontier's laws evaluated together by the i.i.d. recursion on the host (blocks of rows and
#: columns: its few dozen passes then run on temporaries that stay in the CPU's cache; 3x faster at V = 49,152
#: than blocks of 8 whole rows).
_CHUNK_ENTRIES = 2**15
#: Entries of the temporaries of the race's power sums on the device route (blocks of columns times the powers).
_POWER_ENTRIES = 2**26
#: Largest number of ordered draws without replacement enumerated for the exact law of the ``r``-th draw
#: (times ``V``, per prefix); above it ranks >= 2 get the stated upper bound.
_MAX_WOR_ENUMERATION = 2_000_000


@dataclass(frozen=True, eq=False)
class TreeBound:
    r"""Result of :func:`bound`.

    Attributes
    ----------
    value : float
        The upper bound :math:`\hat B = \sum_d \min(\hat b_1, \dots, \hat b_d) \ge B \ge \mathrm{OPT}_c \ge
        \mathrm{OPT}_1` on :math:`\mathbb E[\tau]`; :math:`\hat B = B` when ``complete`` and ``pi_exact``.
    per_depth : (D,) ndarray of float64
        :math:`\hat b_d \ge b_d \ge P(\tau \ge d)`, ``d = 1..D`` (before the running minimum).
    lower_per_depth : (D,) ndarray of float64
        The part of :math:`\hat b_d` computed exactly (paths whose parent prefix was expanded): :math:`\le b_d`
        with ``pi_exact``.
    remainder : float
        ``value`` minus :math:`\sum_d \min(e_1, \dots, e_d)` (``e`` = ``lower_per_depth``): what the budget left
        open. With ``pi_exact``, :math:`B` lies in ``[value - remainder, value]``; 0 when ``complete``.
    n_expanded : int
        Prefixes whose draft and target laws were read (the root included).
    n_calls : int
        Batched model calls per model (one per frontier).
    complete : bool
        Every prefix with :math:`\min(Q, \pi) > 0` above the last depth was expanded (no remainder).
    pi_exact : bool
        :math:`\pi` exact everywhere (``"iid"``; ``"wor"`` where the law of each draw was enumerated or
        computed by the exponential race, to a relative 1e-12, each race law of rank :math:`r` raised on the safe
        side by at most :math:`1.5 \cdot 10^{-13}\, p` for the nodes before the quadrature's first node
        :math:`t_0 = 5 \cdot 10^{-3}` (bounded by the row's elementary symmetric polynomials): each :math:`\hat b_d`
        by at most :math:`1.5 \cdot 10^{-13}` times the number of slots of rank >= 2 at depth ``d``); False where the stated
        upper bound on a draw's law was used (``value`` is then still an upper bound).
    process : str
    budget : int
    method : str
        ``"paths"`` (:math:`B`) or ``"union"`` (:math:`B^* \le B`: ``value`` and ``per_depth`` are
        :math:`\hat B^*` and :math:`\hat b^*_d`; ``lower_per_depth`` and ``remainder`` still bracket :math:`B`;
        ``pi_exact`` says whether :math:`\Pi(T)` was exact for every swept set: i.i.d. children, one draw per
        node, or every node's ordered draws enumerated at small vocabularies).
    """

    value: float
    per_depth: np.ndarray
    lower_per_depth: np.ndarray
    remainder: float
    n_expanded: int
    n_calls: int
    complete: bool
    pi_exact: bool
    process: str
    budget: int
    method: str = "paths"


# --------------------------------------------------------------------------- the shape's slots
class _Slots:
    """The shape's structure as the recursions read it: slots by depth, children, descendant counts."""

    def __init__(self, shape):
        self.D = int(shape.max_depth)
        n = shape.n
        self.depth = [int(d) for d in shape.depth]
        self.rank = [int(r) for r in shape.ranks]
        self.parent = [int(r) for r in shape.parents]
        self.children: list = [[] for _ in range(n + 1)]
        for i in range(1, n + 1):
            self.children[int(shape.parents[i])].append(i)
        self.by_depth = [[i for i in range(n + 1) if self.depth[i] == j] for j in range(self.D + 1)]
        self.pos = {}
        for slots in self.by_depth:
            for k, i in enumerate(slots):
                self.pos[i] = k
        # N[i, d]: slots at depth d in the subtree of slot i (itself included at its own depth)
        N = np.zeros((n + 1, self.D + 1))
        for i in range(n, -1, -1):
            N[i, self.depth[i]] = 1.0
            for c in self.children[i]:
                N[i] += N[c]
        self.N = N
        self.n_at = [len(s) for s in self.by_depth]
        # ranks used below each depth, and the (slot, rank) incidence of a depth's children
        self.ranks_below = [sorted({self.rank[c] for w in self.by_depth[j] for c in self.children[w]})
                            for j in range(self.D + 1)]
        self.need = [max(self.ranks_below[j]) + 1 if self.ranks_below[j] else 0 for j in range(self.D + 1)]
        self._iid_classes: dict = {}
        self._child_index: dict = {}

    def child_index(self, j: int):
        """For the slots of depth ``j + 1`` (in :attr:`by_depth` order): their parent's position among the slots of
        depth ``j``, and the column of their rank among :attr:`ranks_below` ``[j]`` (int arrays, made once)."""
        got = self._child_index.get(j)
        if got is None:
            col = {r: k for k, r in enumerate(self.ranks_below[j])}
            kids = self.by_depth[j + 1]
            got = self._child_index[j] = (np.array([self.pos[self.parent[c]] for c in kids], dtype=np.int64),
                                          np.array([col[self.rank[c]] for c in kids], dtype=np.int64))
        return got

    def incidence(self, j: int):
        """``(C, beta)``: ``C[w, r]`` = 1 if depth-``j`` slot ``w`` has a child of the ``r``-th used rank;
        ``beta[d][w, r]`` = depth-``d`` slots below that child."""
        ranks = self.ranks_below[j]
        col = {r: k for k, r in enumerate(ranks)}
        C = np.zeros((self.n_at[j], len(ranks)))
        beta = np.zeros((self.D + 1, self.n_at[j], len(ranks)))
        for k, w in enumerate(self.by_depth[j]):
            for c in self.children[w]:
                C[k, col[self.rank[c]]] = 1.0
                beta[:, k, col[self.rank[c]]] = self.N[c]
        return ranks, C, beta

    def iid_classes(self, j: int):
        """Levels ``j, j - 1, ..., 0`` of the i.i.d. recursion for a path of length ``j + 1``, slots merged by
        the shape of their subtree down to depth ``j + 1``: ``[{key: ((child key, count), ...)}]`` per level,
        level ``j`` keyed by the number of children, and the root's key."""
        got = self._iid_classes.get(j)
        if got is not None:
            return got
        key = {w: ("leafs", len(self.children[w])) for w in self.by_depth[j]}
        levels = [{k: k for k in set(key.values())}]
        for i in range(j - 1, -1, -1):
            lvl = {}
            for w in self.by_depth[i]:
                k = tuple(sorted(Counter(key[c] for c in self.children[w]).items()))
                key[w] = k
                lvl[k] = k
            levels.append(lvl)
        got = (levels, key[0])
        self._iid_classes[j] = got
        return got


# --------------------------------------------------------------------------- arrays: numpy on the host, torch on a device
def _xp(X):
    """The namespace of a law array: numpy itself for ndarrays (the CPU route), else the array-API namespace of
    the tensor (torch on the models' device; the same algorithm)."""
    return np if isinstance(X, np.ndarray) else namespace(X)


def _as_laws(X, xp):
    """float64 laws in the namespace ``xp`` (numpy arrays as given; tensors converted on their device)."""
    if xp is np:
        return np.asarray(X, dtype=np.float64)
    return X if X.dtype == xp.float64 else xp.astype(X, xp.float64, copy=False)


def _count_positive(X, xp) -> np.ndarray:
    """The number of positive entries of each row of ``X``, host int64 (numpy without an integer temporary)."""
    if xp is np:
        return np.count_nonzero(X > 0, axis=1).astype(np.int64)
    return to_host(xp.sum(xp.astype(X > 0, xp.int64), axis=1)).astype(np.int64)


def _clip1(X, xp):
    """min(X, 1) elementwise."""
    return np.minimum(X, 1.0) if xp is np else xp.clip(X, None, 1.0)


# --------------------------------------------------------------------------- laws of the draws
#: The exact law of a draw without replacement by the exponential race (:class:`_Race`): Taylor terms and power
#: sums kept, the trapezoidal rule's first node (the part before it bounded and added to each law:
#: :func:`_left_end`), the largest p_max(tail) t over the nodes, the head's first size, and the most nodes of one row.
_RACE_TERMS = 48
_RACE_T0 = 5e-3
_RACE_UMAX = 1.0
_RACE_HEAD = 32
_RACE_MAX_NODES = 4000
#: Whether the bound takes the race's exact laws (else the stated upper bound on ranks >= 2).
_WOR_RACE = True
#: The stated tolerance of the race's laws (relative; the checks below keep the estimated error far under it).
WOR_LAW_RTOL = 1e-12
#: The trapezoidal rule's proven relative error over the whole log t line that sets its step (:func:`_race_step`).
_RACE_RULE_RTOL = 1e-15
#: The strips' half-widths over which :func:`_race_rule_error` takes its minimum (any one gives a proven bound).
_RACE_STRIPS = np.linspace(1e-3, 0.5 * np.pi - 1e-3, 2048)


def _race_rule_error(r: int, h: float) -> float:
    r"""A proven bound on the relative error of the trapezoidal rule of step ``h`` in :math:`\log t`, over the
    whole line, for every law of rank ``r`` of the exponential race (:class:`_Race`): :math:`|\hat\ell - \ell|
    \le E_r(h)\, \ell` with

    .. math::

        E_r(h) = \min_{0 < a < \pi/2} \frac{2 \cos(a)^{-(r+1)}}{e^{2 \pi a / h} - 1}

    (the minimum over :data:`_RACE_STRIPS`; each ``a`` gives a bound). Proof: with :math:`v = \log t` the
    integrand :math:`f(v) = t\, p_y e^{-p_y t} [z^r] \prod_{x \ne y} (a_x + b_x z)`, :math:`a_x = e^{-p_x t}`,
    :math:`b_x = 1 - a_x`, is entire in :math:`v`. On the line :math:`\operatorname{Im} v = \beta`,
    :math:`|\beta| < a`, :math:`t = \tau e^{i\beta}` and :math:`c = \cos\beta \ge \cos a`: :math:`|a_x| =
    e^{-p_x \tau c}` and :math:`|b_x| = |\int_0^{p_x \tau} e^{i\beta} e^{-s e^{i\beta}} ds| \le (1 - e^{-p_x
    \tau c}) / c`, so by the triangle inequality over the sets of rung clocks :math:`|[z^r] \prod (a_x + b_x z)|
    \le c^{-r} P(N_{-y}(\tau c) = r)` and :math:`\int |f(v)|\, d\operatorname{Re} v \le c^{-r} p_y
    \int_0^\infty e^{-p_y \tau c} P(N_{-y}(\tau c) = r)\, d\tau = c^{-(r+1)} \ell`. The integrand tends to 0
    uniformly in the strip at both ends (like :math:`\tau` on the left, like :math:`\tau e^{-p_y \tau c}` on the
    right), so Trefethen and Weideman, "The exponentially convergent trapezoidal rule", SIAM Review 56(3), 2014,
    Thm 5.1 (with :math:`M = \cos(a)^{-(r+1)} \ell`) gives the bound, for nodes at any offset. It holds for a
    tail token's law :math:`p_y \sum_n C_n x^n` too (the rule applied to each Taylor coefficient is the rule
    applied to the law), and for the ranks' laws combined with nonnegative weights with :math:`\max_k E_{r_k}`
    (:math:`E_r` increases with ``r``)."""
    a = _RACE_STRIPS
    with np.errstate(over="ignore"):             # e^{2 pi a / h} beyond the floats at tiny steps: the bound is 0
        lg = math.log(2.0) - (r + 1) * np.log(np.cos(a)) - np.log(np.expm1(2.0 * np.pi * a / h))
    return float(np.exp(lg.min()))


@functools.lru_cache(maxsize=64)
def _race_step(rmax: int) -> float:
    r"""The race's step in :math:`\log t` for ranks up to ``rmax``: the largest multiple of 1/1024 (at most 1/2,
    at least 1/1024) whose proven relative error :func:`_race_rule_error` is at most :data:`_RACE_RULE_RTOL` (for ``rmax`` = 6,
    the ranks of ``branching(8, 7)``, about 1/5.4; the error grows with the step, so the search by bisection)."""
    lo, hi = 1, 512                       # in units of 1/1024
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _race_rule_error(int(rmax), mid / 1024) <= _RACE_RULE_RTOL:
            lo = mid
        else:
            hi = mid - 1
    return lo / 1024


class _Race:
    r"""The laws of the draws of ranks :math:`r \ge 2` without replacement, exact to :data:`WOR_LAW_RTOL`, for
    the rows ``rows`` of the host array ``P``, by the exponential race (Efraimidis & Spirakis, "Weighted random
    sampling with a reservoir", Inf. Process. Lett. 97(5), 2006: successive draws without replacement are the
    order of independent clocks :math:`E_x \sim \mathrm{Exp}(p_x)`):

    .. math::

        P(\text{draw } r = y) = p_y \int_0^\infty e^{-p_y t}\, P\big(N_{-y}(t) = r\big)\, dt,

    :math:`N_{-y}(t)` the number of clocks other than ``y`` rung by ``t`` (a Poisson-binomial count). Per row, the
    ``K`` most likely tokens (the head) get the integral itself (:func:`_bound_kernels.race_row`); every other
    token ``y`` (the tail) gets :math:`p_y \sum_n C_n x^n`, :math:`x = p_y / p_{\max}` (:math:`p_{\max}` the
    tail's largest probability), the Taylor series of the same integral written with the whole row's count
    :math:`N(t)` deflated by ``y``'s clock, cut per entry where the terms left are below 1e-17 of the first.

    The trapezoidal rule in :math:`\log t` has the step :func:`_race_step` of the largest rank, whose error over
    the whole line is proven at most :data:`_RACE_RULE_RTOL` of each law (:func:`_race_rule_error`: the
    integrand's bound on a strip around the real line), and it stops where the nodes left out on the right add
    at most :data:`_bound_kernels.RACE_RIGHT_TOL` :math:`p_y` (:func:`_bound_kernels.race_right_sum`). A row is
    accepted when (i) that stop was reached within :data:`_RACE_MAX_NODES` nodes, (ii) :math:`p_{\max} t \le`
    :data:`_RACE_UMAX` at the last node (the tail's power series and deflation then converge fast and lose no
    digits), (iii) the Taylor series has converged at
    :math:`x = 1`. So each law is within :math:`10^{-15} \ell + 10^{-17} p_y` of the rule's sum over the
    whole line plus what :func:`_left_end` adds (at most :math:`1.5 \cdot 10^{-13}\, p_y`, on the safe side),
    and the roundings. Otherwise the head grows (x4) and the row is done again; a row that fails with every token
    in the head keeps the stated upper bound (``ok`` False). The quadrature starts at :data:`_RACE_T0`; the nodes
    before it are bounded and added to every law (:func:`_left_end`: each law exceeds the rule's sum over the
    whole line by at most :math:`1.5 \cdot 10^{-13}\, p_y`, on the safe side). ``heads`` (a boolean per row of ``P``; None: all):
    the rows whose head tokens get their laws in the first round (the others' ``HL`` stay 0: rows where no head
    token's law is read); a grown head gets them in every row. ``stats`` (None: from the host rows of ``P``):
    ``stats(rows, K) -> (head, kh, hval, pmax, nu)`` of a grown head of ``K`` tokens, as ``first``'s entries
    (the laws of a device: :func:`_race_stats_t`). ``weights`` (``(m, ranks)``, nonnegative; None: each rank's
    laws): only the ranks' laws combined by them are kept (``C[:, 0]``, ``HL[:, 0]``, ``combined`` True), what
    :math:`\pi` reads where no expected slot count or candidate is needed
    (:func:`_bound_kernels.race_rows_weighted`); the error bounds and the check (iii) then hold for the combination."""

    def __init__(self, P, ranks: list, rows, first: dict | None = None, heads=None, stats=None, weights=None):
        m, V = len(P), P[0].shape[0]
        self.ranks = list(ranks)
        self.combined = weights is not None
        wts = np.zeros((m, 0)) if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
        nk, N = (1 if self.combined else len(self.ranks)), _RACE_TERMS
        deg = max(self.ranks) + 1
        h = _race_step(deg - 1)
        s = _stirling(deg, N)
        r_arr = np.asarray(self.ranks, dtype=np.int64)
        support = np.count_nonzero(P > 0, axis=1) if first is None else first["support"]
        self.ok = np.zeros(m, bool)
        self.pmax = np.ones(m)
        got: dict = {}
        todo = [int(i) for i in rows]
        K = min(_RACE_HEAD, V)
        mark = np.zeros(V, bool)
        while todo:
            n = len(todo)
            want = np.ones(n, bool) if heads is None else heads[todo]
            heads = None                                   # a grown head: every row's laws
            if first is not None:
                # the first round from the rows' one pass (:func:`_bound_kernels.wor_row_stats`): the head, its
                # probabilities, the tail's largest probability and power sums
                head, kh = first["head"][todo], first["kh"][todo]
                ph, pmax, nu = first["hval"][todo], first["pmax"][todo], first["nu"][todo]
                first = None
            elif stats is not None:
                # a grown head where the rows are (a device's laws): ``stats(rows, K)`` as the first round's
                head, kh, ph, pmax, nu = stats(todo, K)
            else:
                sub = np.ascontiguousarray(P[todo]) if isinstance(P, np.ndarray) else np.stack([P[i] for i in todo])
                part = np.argpartition(-sub, K - 1, axis=1)[:, :K] if K < V else np.tile(np.arange(V), (n, 1))
                head = np.take_along_axis(part, np.lexsort((part, -np.take_along_axis(sub, part, axis=1)), axis=1),
                                          axis=1)
                head = np.ascontiguousarray(head, dtype=np.int64)
                kh = np.minimum(K, support[todo]).astype(np.int64)
                ph = np.where(np.arange(K) < kh[:, None], np.take_along_axis(sub, head, axis=1), 0.0)
                pmax = np.zeros(n)
                nu = np.zeros((n, N + 1))
                _K.race_moments(sub, head, mark, pmax, nu)
            HL, HL2 = np.zeros((n, nk, K)), np.zeros((n, nk, K))
            C, C2 = np.zeros((n, nk, N + 1)), np.zeros((n, nk, N + 1))
            info = np.zeros((n, 3))
            _K.race_rows_weighted(ph, kh, pmax, nu, r_arr, np.ascontiguousarray(wts[todo]), deg, h,
                                  math.log(_RACE_T0), s, _RACE_MAX_NODES, HL, HL2, C, C2, info, want)
            _left_end(self.ranks, wts[todo] if self.combined else None, ph, want, HL, HL2, C, C2, pmax, nu, h)
            tail = pmax > 0
            good = (info[:, 2] > 0) & (~tail | (pmax * info[:, 0] <= _RACE_UMAX))
            c0 = C[:, :, 0]
            good &= ~tail | np.all((c0 > 0) & (np.abs(C[:, :, -4:]).sum(axis=2) <= 1e-16 * c0), axis=1)
            th = _race_thresholds(C)
            t = np.asarray(todo, dtype=np.int64)
            if good.any():      # each accepted row's head (its first kh tokens), laws, coefficients, thresholds
                got[len(got)] = (t[good], head[good], kh[good], HL[good], C[good], np.where(tail, pmax, 1.0)[good],
                                 th[good])
            todo = t[~good & (kh < support[t])].tolist()
            K = min(V, 4 * K)
        Kmax = max([int(g[2].max()) for g in got.values()] + [1])
        self.head = np.full((m, Kmax), -1, dtype=np.int64)
        self.HL = np.zeros((m, nk, Kmax))
        self.C = np.zeros((m, nk, N + 1))
        self.theta = np.full((m, N + 1), np.inf)
        for i, hd, kh, HL, C, pm, th in got.values():
            Kr = min(hd.shape[1], Kmax)
            inside = np.arange(Kr) < kh[:, None]                  # (rows, Kr): the head's places
            self.ok[i] = True
            self.head[i, :Kr] = np.where(inside, hd[:, :Kr], -1)
            self.HL[i, :, :Kr] = np.where(inside[:, None, :], HL[:, :, :Kr], 0.0)
            self.C[i] = C
            self.pmax[i] = pm
            self.theta[i] = th
        self.hr, self.hc = np.nonzero(self.head >= 0)             # the head's entries: row, place, token
        self.hv = self.head[self.hr, self.hc]


def _left_end(ranks, wts, ph, want, HL, HL2, C, C2, pmax, nu, h: float | None = None) -> None:
    r"""Add to the race's laws (in place) an upper bound on the nodes that the trapezoidal rule leaves out before
    its first node :math:`t_0` (:data:`_RACE_T0`), so that each law is at least the rule's sum over the whole
    line of :math:`\log t`. The rule's node :math:`t` adds :math:`h\, t\, F(t)`, :math:`F(t) = p_y e^{-p_y t}
    P(N_{-y}(t) = r)` (step :math:`h`, None: :func:`_race_step` of the largest rank; the sums of step :math:`2h`,
    ``HL2`` and ``C2``, the same with :math:`2h`). With :math:`q_x = 1 - e^{-p_x t} \le p_x t (1 - a_x)`,
    :math:`a_x = p_x t / 2 - (p_x t)^2 / 6 \ge 0`, :math:`\prod_S (1 - a_x) \le e^{-\sum_S a_x}` and
    :math:`e^{-u} \le 1 - u + u^2 / 2` (:math:`u \ge 0`), summing over the sets :math:`S` of :math:`r` tokens
    other than ``y`` that have rung:

    .. math::

        F(t) \le p_y t^r \Big[e_r\, \big(1 - s t + c\, t^2\big) + \frac{t}{2}\, \big((s - p_y)\, e_r -
        (r + 1)\, e_{r+1}\big)\Big], \qquad c = s / 6 + s^2 / 2,

    :math:`e_k = e_k(p_{-y})` the elementary symmetric polynomials of the row without ``y``, :math:`s = \sum_x p_x`
    (:math:`\sum_{|S| = r} p(S) \prod_S p_x = (s - p_y) e_r - (r + 1) e_{r+1}`). The left-out nodes :math:`t_k =
    t_0 e^{-kh}`, :math:`k \ge 1`, then add at most that bound with :math:`t^{m}` replaced by :math:`h \sum_k
    t_k^{m+1} = h\, t_0^{m+1} / (e^{(m+1) h} - 1)`. The row's :math:`e_k(p)`, ``k <= max(ranks) + 1``, from the
    head's probabilities ``ph`` (times :math:`\prod_c (1 + p_c z)`) and the tail's power sums :math:`\sum_x
    p_x^i = p_{\max}^i \nu_i` (Newton's identities); a head token's :math:`e_k(p_{-c})` by dividing out its
    factor (:math:`e_k(p_{-c}) = e_k(p) - p_c e_{k-1}(p_{-c})`); a tail token's as the exact polynomial
    :math:`e_k(p_{-y}) = \sum_{j \le k} (-p_y)^j e_{k-j}(p)`, so its bound is a polynomial in :math:`p_y =
    p_{\max} x`, added to the Taylor coefficients ``C[:, k, 0 .. r + 1]``; each bound raised by :math:`10^{-12} p_y
    h \sum_k t_k^{r+1}` (far above the rounding of these sums of terms of size at most 1). With the weights ``wts``
    (``(n, ranks)``, the combined race) their combinations. Since also :math:`F(t) \ge p_y t^r \sum_S \prod_S
    p_x (1 - s t + t\, p(S) / 2)`, each law exceeds the rule's whole sum by at most :math:`p_y\, e_r\, c\, h\,
    t_0^{r+3} / (e^{(r+3) h} - 1)` (:math:`1.5 \cdot 10^{-13}\, p_y` at rank 2, :math:`t_0 = 5 \cdot 10^{-3}`,
    :math:`h \ge 1/8`; at most :math:`c\, e_r t_0^{r+3} / (r + 3)` at any step) plus the margin, on the safe
    side of the rule (proof in the theory page of the trees, the bound's section)."""
    n = ph.shape[0]
    h = _race_step(max(ranks)) if h is None else h
    _K.race_left_end(np.ascontiguousarray(ph, dtype=np.float64), np.ascontiguousarray(pmax, dtype=np.float64),
                     np.ascontiguousarray(nu, dtype=np.float64), np.asarray(ranks, dtype=np.int64),
                     np.zeros((n, 0)) if wts is None else np.ascontiguousarray(wts, dtype=np.float64),
                     np.asarray(want, dtype=bool), h, _RACE_T0, HL, HL2, C, C2)


@functools.lru_cache(maxsize=16)
def _stirling(kmax: int, nmax: int) -> np.ndarray:
    """:func:`_bound_kernels.stirling_table`, computed once per size (read only)."""
    s = _K.stirling_table(kmax, nmax)
    s.flags.writeable = False
    return s


def _race_thresholds(C: np.ndarray) -> np.ndarray:
    r"""``theta[i, d]``: entries of row ``i`` with :math:`x \le \theta_d` need the Taylor terms up to degree ``d``
    only (what the terms above leave, :math:`x^{d+1} \sum_{n > d} |C_n|` for :math:`x \le 1`, is below 1e-17 of
    :math:`C_0` for every rank); nondecreasing in ``d``, the last infinite. ``C``: ``(m, ranks, N + 1)``. Compiled
    (:func:`_bound_kernels.race_thresholds`: the same operations, so the same values, without numpy's dozen
    temporaries per call) where the race's kernels are."""
    if _K.RACE_JIT:
        out = np.empty((C.shape[0], C.shape[2]))
        _K.race_thresholds(np.ascontiguousarray(C, dtype=np.float64), out)
        return out
    N = C.shape[2] - 1
    above = np.cumsum(np.abs(C)[:, :, ::-1], axis=2)[:, :, ::-1]           # above[..., d] = sum_{n >= d} |C_n|
    rest = above[:, :, 1:]                                                  # sum_{n > d}, d = 0 .. N - 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        th = np.where(rest > 0, (1e-17 * C[:, :, :1] / np.where(rest > 0, rest, 1.0))
                      ** (1.0 / np.arange(1, N + 1)), np.inf)
    th = np.concatenate([th.min(axis=1), np.full((C.shape[0], 1), np.inf)], axis=1)
    return np.minimum.accumulate(th[:, ::-1], axis=1)[:, ::-1]


def _wor_draw_laws(P, ranks, *, exact_limit: int | None = None, race: bool = True):
    r"""``(laws, exact)``: ``laws[k, i]`` = :math:`P(\text{draw } r_k = \cdot)` for draws without replacement
    from the row ``P[i]`` (each with at least ``max(ranks) + 1`` tokens of positive probability).

    Exact by enumeration of the ordered draws when there are few (at most ``exact_limit / V`` per row); otherwise
    rank 0 is ``p``, rank 1 the closed form :math:`p_y \sum_{x \ne y} p_x / (1 - p_x)` (:func:`_second_draw`),
    and ranks :math:`r \ge 2` the exponential race (:class:`_Race`, exact to :data:`WOR_LAW_RTOL`), or, with
    ``race=False`` and in the rows the race refuses, the upper bound

    .. math::

        P(\text{draw } r = y) \le \min\Big(\frac{p_y}{1 - M_r(y)},\
        1 - P(\text{draw } 0 = y) - P(\text{draw } 1 = y)\Big),

    :math:`M_r(y)` the mass of the ``r`` most likely tokens other than ``y`` (given the earlier draws
    :math:`S \not\ni y`, the next is ``y`` with probability :math:`p_y / (1 - p(S)) \le p_y / (1 - M_r(y))`).
    ``P`` a numpy array or a tensor (the laws come back in its namespace); :class:`_DrawLaws` streams them one
    rank at a time.
    """
    P = np.atleast_2d(P) if isinstance(P, np.ndarray) else P
    xp = _xp(P)
    dl = _DrawLaws(P, ranks, xp, exact_limit=exact_limit, race=race)
    laws = [dl.law(k) for k in range(len(ranks))]
    return (np.stack(laws) if xp is np else xp.stack(laws)), dl.exact


class _DrawLaws:
    """The laws of the draws of the used ranks without replacement from each row of ``P`` (see
    :func:`_wor_draw_laws`), one rank at a time (``law(k)``, an ``(m, V)`` array) or at a few entries
    (``at(k, rows, cols)``), without holding all ranks at once."""

    def __init__(self, P, ranks, xp, *, exact_limit: int | None = None, fused: bool = False, race: bool = True):
        self.P, self.ranks, self.xp = P, list(ranks), xp
        self.kept: dict = {}
        m, V = P.shape
        need = max(ranks) + 1
        limit = _MAX_WOR_ENUMERATION if exact_limit is None else exact_limit
        support = _count_positive(P, xp).tolist()
        small = [i for i, n in enumerate(support) if math.perm(int(n), need) * V <= limit]
        self.small = {}
        if small:
            rows = to_host(P[xp.asarray(small, device=_device(P))] if xp is not np else P[small])
            for i, row in zip(small, rows):
                self.small[i] = _wor_rank_laws(row, self.ranks, V)
        self.n_big = m - len(small)
        self.exact = self.n_big == 0 or need <= 2
        # ranks >= 2 of the rows not enumerated: the exponential race (exact to WOR_LAW_RTOL), else the upper bound
        self.race = None
        self._rt = None
        self.kk = [-1] * len(self.ranks)
        if need > 2 and self.n_big and race:
            big = [i for i in range(m) if i not in self.small]
            self.race = _Race(np.ascontiguousarray(to_host(P), dtype=np.float64), [r for r in self.ranks if r >= 2], big)
            self.kk = [self.race.ranks.index(r) if r >= 2 else -1 for r in self.ranks]
            self.exact = bool(np.all(self.race.ok[big]))
            if xp is not np:
                dev = _device(P)
                self.race_x = {a: xp.asarray(getattr(self.race, a), device=dev)
                               for a in ("C", "theta", "pmax", "head", "HL", "ok")}
        self.bounded = need > 2 and self.n_big and not self.exact   # some row keeps the stated upper bound
        # the fused kernels (numba, numpy arrays, no enumerated row): the second draw's terms only, no law whole
        self.fused = bool(fused and _K.JIT and xp is np and not small and need > 1)
        if self.fused:
            self.P = P = np.ascontiguousarray(P)
            self.top1, self.t, self.S1, self.S2 = _second_draw_terms(P)
            self.P1 = None
        else:
            self.P1 = _second_draw(P) if need > 1 and self.n_big else None
        if self.bounded:
            # the `need` most likely tokens of each row, by decreasing p (ties by lower id)
            if xp is np:
                part = np.argpartition(-P, need - 1, axis=1)[:, :need]
                top = np.take_along_axis(part, np.argsort(-np.take_along_axis(P, part, axis=1), axis=1,
                                                          kind="stable"), axis=1)
            else:
                top = xp.topk(P, need, dim=1).indices
            self.top = top
            self.ptop = xp.take_along_axis(P, top, axis=1)                   # (m, need), decreasing
            self.base = self._rest_mass()                                    # mass outside the need largest
            if not self.fused:                                               # 1 - P(draw 0 = y) - P(draw 1 = y)
                self.room = xp.clip(1.0 - P - self.P1, 0.0, 1.0)

    def _rest_mass(self):
        """Per row, the mass outside the ``need`` most likely tokens, summed over the others (no cancellation)."""
        xp, P = self.xp, self.P
        rest = copy_of(P, xp)
        rows = xp.reshape(xp.arange(P.shape[0], device=_device(P)), (-1, 1)) if xp is not np else \
            np.arange(P.shape[0])[:, None]
        rest[rows, self.top] = 0.0
        return xp.sum(rest, axis=1)

    def _tails(self, r):
        """(mass outside the r largest, the same outside the r + 1 largest) per row, as (m, 1) columns."""
        xp = self.xp
        tail_r = self.base + xp.sum(self.ptop[:, r:], axis=1)
        tail_r1 = tail_r - self.ptop[:, r]
        return tail_r[:, None], tail_r1[:, None]

    def law(self, k: int, v0: int = 0, v1: int | None = None):
        """``(m, v1 - v0)``: the law of the draw of the ``k``-th used rank in every row, at the tokens
        ``v0 <= y < v1`` (the whole vocabulary by default; numpy only for a part)."""
        xp, P, r = self.xp, self.P, self.ranks[k]
        V = P.shape[1]
        v1 = V if v1 is None else v1
        part = (v0, v1) != (0, V)
        if not self.n_big:                                   # every row enumerated
            out = xp.zeros_like(P[:, v0:v1])
        elif r == 0:
            out = P[:, v0:v1]
        elif r == 1:
            out = self.P1[:, v0:v1]
        elif not self.bounded:
            out = self._race_law(k, v0, v1, None)
        else:
            out = self._race_law(k, v0, v1, self._bound_law(r, v0, v1, part))
        if self.small:
            out = copy_of(out, xp)
            for i, e in self.small.items():
                out[i] = xp.asarray(e[k], device=_device(P)) if xp is not np else e[k, v0:v1]
        return out

    def _race_terms(self, v0: int, v1: int):
        """What every rank's race law at the tokens ``v0 <= y < v1`` shares (kept for the last columns asked): the
        powers :math:`x^n`, ``n <= DCAP``, set to 0 above each entry's Taylor degree (0 at the head's entries,
        whose laws replace the sums), the largest degree, the entries above :data:`_bound_kernels.DCAP` (summed
        on their own: place, ``x``, degree, :math:`x^{DCAP}`) and the head's entries in the columns."""
        if self._rt is not None and self._rt[0] == (v0, v1):
            return self._rt[1]
        xp, race = self.xp, self.race
        arr = race.__dict__ if xp is np else self.race_x
        theta = arr["theta"]
        Pb = self.P[:, v0:v1]
        x = Pb / arr["pmax"][:, None]
        sel = (race.hv >= v0) & (race.hv < v1)
        hr, hc, hcol = race.hr[sel], race.hc[sel], race.hv[sel] - v0
        if xp is not np:
            dev = _device(Pb)
            hr, hc, hcol = (xp.asarray(a, device=dev) for a in (hr, hc, hcol))
        xd = copy_of(x, xp)
        xd[hr, hcol] = 0.0
        d = xp.zeros(x.shape, dtype=xp.int64) if xp is not np else np.zeros(x.shape, dtype=np.int64)
        for n in range(theta.shape[1] - 1):
            gt = xd > theta[:, n:n + 1]
            if not bool(xp.any(gt)):
                break
            d = d + (gt if xp is np else xp.astype(gt, xp.int64))
        top = int(d.max(initial=0)) if xp is np else int(to_host(xp.max(d)))
        pw, masked = xp.ones_like(Pb), []
        for n in range(1, min(top, _K.DCAP) + 1):                  # x^n, 0 above an entry's degree
            pw = pw * x
            masked.append(xp.where(d >= n, pw, 0.0))
        far = None
        if top > _K.DCAP:                                           # entries that need more: x, degree, x^DCAP
            re, ce = np.nonzero(d > _K.DCAP) if xp is np else xp.nonzero(d > _K.DCAP)
            far = (re, ce, x[re, ce], d[re, ce], pw[re, ce])
        got = (Pb, masked, top, far, (hr, hc, hcol))
        self._rt = ((v0, v1), got)
        return got

    def _race_law(self, k: int, v0: int, v1: int, bounded):
        """The race's law of the ``k``-th used rank (>= 2) at the tokens ``v0 <= y < v1`` of every row (rows the race
        refused: ``bounded``): :math:`p \\sum_n C_n x^n` summed by ascending powers up to each entry's degree (the
        first :data:`_bound_kernels.DCAP` for the whole block, the rest entry by entry), the head's laws put in: the
        operations of :func:`_bound_kernels.wor_pi_kernel` on each entry."""
        xp, race, kk = self.xp, self.race, self.kk[k]
        if race is None:
            return bounded
        arr = race.__dict__ if xp is np else self.race_x
        C, HL = arr["C"], arr["HL"]
        Pb, masked, top, far, (hr, hc, hcol) = self._race_terms(v0, v1)
        acc = xp.zeros_like(Pb) + C[:, kk, 0:1]
        for n, pwn in enumerate(masked, start=1):
            acc = acc + C[:, kk, n:n + 1] * pwn
        if far is not None:
            re, ce, xe, de, pe = far
            ae, Ce = acc[re, ce], C[re, kk, :]
            for n in range(_K.DCAP + 1, top + 1):
                pe = pe * xe
                ae = ae + Ce[:, n] * xp.where(de >= n, pe, 0.0)
            acc[re, ce] = ae
        out = Pb * acc
        out[hr, hcol] = HL[hr, kk, hc]
        if bounded is not None:
            ok = race.ok[:, None] if xp is np else self.race_x["ok"][:, None]
            out = xp.where(ok, out, bounded)
        return out

    def _bound_law(self, r: int, v0: int, v1: int, part: bool):
        """The stated upper bound on the law of the draw of rank ``r >= 2`` at the tokens ``v0 <= y < v1``."""
        xp, P = self.xp, self.P
        tail_r, tail_r1 = self._tails(r)
        top, ptop = self.top[:, :r], self.ptop[:, :r]
        at_top = ptop / (tail_r1 + ptop)                 # the r most likely tokens: S holds the others
        if xp is np:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):     # inf where tail_r is subnormal
                b = P[:, v0:v1] / tail_r
                if part:
                    rr, cc = np.nonzero((top >= v0) & (top < v1))
                    b[rr, top[rr, cc] - v0] = at_top[rr, cc]
                else:
                    b[np.arange(P.shape[0])[:, None], top] = at_top
            np.minimum(b, self.room[:, v0:v1], out=b)
        else:
            b = P / tail_r
            b[xp.reshape(xp.arange(P.shape[0], device=_device(P)), (-1, 1)), top] = at_top
            b = xp.minimum(b, self.room)
        return b

    def at(self, k: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """The law of the ``k``-th used rank at the entries ``(rows[i], cols[i])`` (numpy float64)."""
        if self.fused:
            return self._fused_at(k, rows, cols)
        law = self.kept[k] if k in self.kept else self.law(k)
        return to_host(_gather(law, rows, cols, self.xp))

    def tails(self) -> np.ndarray:
        """``(m, need)``: the mass outside the ``r`` most likely tokens per row, ``r < need`` (the ``_tails``
        of each rank; zeros when no rank above 1 is used)."""
        m = self.P.shape[0]
        if not hasattr(self, "top"):
            return np.zeros((m, 1))
        need = self.top.shape[1]
        out = np.zeros((m, need))
        for r in range(2, need):
            out[:, r] = self._tails(r)[0][:, 0]
        return out

    def _fused_at(self, k: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """:meth:`at` from the second draw's terms: the operations of :func:`_bound_kernels.wor_pi_kernel` on the
        entries (so bit for bit its laws and those of :meth:`law`)."""
        P, r = self.P, self.ranks[k]
        p = P[rows, cols]
        if r == 0:
            return p.copy()
        at_top1 = cols == self.top1[rows]
        p1 = np.where(at_top1, p * self.S2[rows], p * (self.S1[rows] - self.t[rows, cols]))
        p1 = np.clip(p1, 0.0, 1.0)
        if r == 1:
            return p1
        exact = None if self.race is None else _race_at(self.race, self.kk[k], p, rows, cols)
        if not self.bounded:
            return exact
        room = np.clip((1.0 - p) - p1, 0.0, 1.0)
        tail_r, tail_r1 = (x[:, 0] for x in self._tails(r))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):     # inf where tail_r is subnormal
            b = p / tail_r[rows]
            for c in range(r):
                hit = self.top[rows, c] == cols
                pc = self.ptop[rows, c]
                b[hit] = (pc / (tail_r1[rows] + pc))[hit]
        b = np.minimum(b, room)
        return b if exact is None else np.where(self.race.ok[rows], exact, b)


def _race_at(race: _Race, kk: int, p: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The race's law of its ``kk``-th rank at the entries ``(rows, cols)`` (values ``p``), by the operations of
    :meth:`_DrawLaws._race_law` on each entry (compiled: :func:`_bound_kernels.race_at`, the same operations)."""
    if _K.RACE_JIT:
        out = np.empty(p.shape[0])
        _K.race_at(np.ascontiguousarray(p, dtype=np.float64), race.pmax, race.theta, race.C, race.head, race.HL,
                   np.ascontiguousarray(rows, dtype=np.int64), np.ascontiguousarray(cols, dtype=np.int64), kk, out)
        return out
    x = p / race.pmax[rows]
    th = race.theta[rows]
    d = np.zeros(p.shape, dtype=np.int64)
    for n in range(th.shape[1] - 1):
        d += x > th[:, n]
    C = race.C[rows, kk]
    acc = np.zeros_like(p) + C[:, 0]
    pw = np.ones_like(p)
    with np.errstate(over="ignore", invalid="ignore"):
        for n in range(1, int(d.max(initial=0)) + 1):
            pw = pw * x
            acc = acc + C[:, n] * np.where(d >= n, pw, 0.0)
        out = p * acc
    hit = race.head[rows] == cols[:, None]
    hr, hc = np.nonzero(hit)
    out[hr] = race.HL[rows[hr], kk, hc]
    return out


def _device(X):
    import array_api_compat

    return array_api_compat.device(X)


def _gather(X, rows: np.ndarray, cols: np.ndarray, xp):
    """``X[rows, cols]`` for host index arrays, in ``X``'s namespace."""
    if xp is np:
        return X[rows, cols]
    dev = _device(X)
    return X[xp.asarray(rows, device=dev), xp.asarray(cols, device=dev)]


def _second_draw_terms(P: np.ndarray):
    """``(top, t, S1, S2)`` of :func:`_second_draw` for a numpy block, by the kernel: each row's most likely token,
    the terms :math:`t_x = p_x / (1 - p_x)` with the top's zeroed, their sum before (``S1``) and after (``S2``);
    the sums are numpy's, as in :func:`_second_draw`."""
    m = P.shape[0]
    rows = np.arange(m)
    top = np.argmax(P, axis=1)
    others = P.copy()
    others[rows, top] = 0.0
    rest_top = np.sum(others, axis=1)
    t = others                                              # reused as the terms' buffer
    _K.second_draw_t(P, top, rest_top, t)
    S1 = np.sum(t, axis=1)
    t[rows, top] = 0.0
    S2 = np.sum(t, axis=1)
    return top, t, S1, S2


def _second_draw(P):
    r""":math:`P(\text{draw } 1 = y) = p_y \sum_{x \ne y} p_x / (1 - p_x)` for every row (at least two tokens of
    positive probability); for the most likely token :math:`1 - p_x` and the sum over :math:`x \ne y` are summed
    from the other entries (no cancellation). Numpy arrays or tensors (the result in their namespace)."""
    if isinstance(P, np.ndarray):
        P = np.atleast_2d(P)
    xp = _xp(P)
    m = P.shape[0]
    rows = np.arange(m) if xp is np else xp.arange(m, device=_device(P))
    top = xp.argmax(P, axis=1)
    rest = 1.0 - P
    others = P.copy() if xp is np else P.clone()
    others[rows, top] = 0.0
    rest[rows, top] = xp.sum(others, axis=1)
    if xp is np:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(rest > 0, P / np.where(rest > 0, rest, 1.0), 0.0)
    else:
        t = xp.where(rest > 0, P / xp.where(rest > 0, rest, 1.0), 0.0)
    S = xp.sum(t, axis=1)
    out = P * (S[:, None] - t)
    t[rows, top] = 0.0
    out[rows, top] = P[rows, top] * xp.sum(t, axis=1)
    return xp.clip(out, 0.0, 1.0)


# --------------------------------------------------------------------------- prefixes
class _Prefix:
    """A token path below the context: its target and draft path data and the caps on what lies below it."""

    __slots__ = ("path", "Q", "pi", "A", "s", "caps", "S", "rest", "exact", "children", "order", "dropped")

    def __init__(self, path, Q, pi, A, s, caps):
        self.path, self.Q, self.pi, self.A, self.s, self.caps = path, Q, pi, A, s, caps
        self.S: dict = {}          # d -> sum over every child x of cap_d(ux)   (d >= depth + 2; the host routes)
        self.rest: dict = {}       # d -> the same over the children that are not candidates (what _share reads)
        self.exact = 0.0           # sum over x of min(Q(ux), pi(ux))            (level depth + 1)
        self.children: list = []   # expanded children
        self.order = -1            # position in the order of expansion
        self.dropped = 0           # children with min(Q, pi) > 0 that its expansion left out (above the last depth)


def _expand(slots: _Slots, process: str, frontier: list, Pl, Ql, keep: int):
    """Expand the prefixes of one depth ``j`` with their laws ``Pl``, ``Ql`` (rows; numpy arrays, or tensors on
    the models' device): set their exact level and caps, and return ``(candidates, pi_exact, dropped)``: the
    children at depths below ``D`` with min(Q, pi) > 0, at most ``keep`` per prefix (the largest, ties by lower
    token id), as host arrays (:func:`_child`), and the number of such children left out.

    Every step is one array operation over the whole ``(m, V)`` block (no loop over prefixes): the children's
    :math:`\\pi` (:func:`_child_pi`), min(Q, pi) and its row sums, the caps of the lower depths and their row
    sums (:attr:`_Prefix.S`), the candidates (:func:`_top_per_row`), whose values alone come back to the host, and
    the caps' row sums over the children that are not candidates (:attr:`_Prefix.rest`, :func:`_rest_sums`)."""
    xp = _xp(Pl)
    dev = None if xp is np else _device(Pl)
    j = len(frontier[0].path)
    D = slots.D
    m = len(frontier)
    Qu = np.array([u.Q for u in frontier])
    A = np.stack([u.A for u in frontier])
    s_all = np.array([u.s for u in frontier]).reshape(m, j)
    Qc = (Qu[:, None] if xp is np else xp.asarray(Qu, device=dev)[:, None]) * Ql
    ranks = slots.ranks_below[j]
    more = j + 1 < D
    pi, md, draws, pi_exact = _child_pi(slots, process, A, s_all, Pl, [u.path for u in frontier],
                                        keep_draws=more)
    low = xp.minimum(Qc, pi)
    caps = {d: xp.minimum(Qc, v) for d, v in md.items()}
    exact = to_host(xp.sum(low, axis=1))
    S = {d: to_host(xp.sum(c, axis=1)) for d, c in caps.items()}
    for i, u in enumerate(frontier):
        u.exact = float(exact[i])
        u.S = {d: float(S[d][i]) for d in S}
    if not more:
        return None, pi_exact, 0
    r, x, dropped = _top_per_row(low, keep, xp, owners=frontier)
    _set_rest(frontier, _rest_sums(caps, r, x, xp) if r.size else S)
    if r.size == 0:
        return None, pi_exact, dropped
    cand = dict(pr=to_host(_gather(low, r, x, xp)), owner=[frontier[i] for i in r.tolist()], x=x,
                Q=to_host(_gather(Qc, r, x, xp)), pi=to_host(_gather(pi, r, x, xp)), p=to_host(_gather(Pl, r, x, xp)),
                caps={d: to_host(_gather(c, r, x, xp)) for d, c in caps.items()},
                dr=None if draws is None else np.stack([draws.at(k, r, x) for k in range(len(ranks))]))
    return cand, pi_exact, dropped


def _rest_sums(caps: dict, r: np.ndarray, x: np.ndarray, xp) -> dict:
    """``{d: (m,) host array}``: each row's caps ``caps[d]`` (``(m, V)``, numpy or a tensor of ``xp``) summed over the
    entries that are not candidates (``(r, x)``: the candidates' rows and columns), each term nonnegative (the
    remainder of :func:`_share` with no subtraction)."""
    if not caps:
        return {}
    some = next(iter(caps.values()))
    if xp is np:
        keep = np.ones(some.shape, dtype=bool)
        keep[r, x] = False
        return {d: np.sum(np.where(keep, c, 0.0), axis=1) for d, c in caps.items()}
    dev = _device(some)
    keep = xp.ones(some.shape, dtype=xp.bool, device=dev)
    keep[xp.asarray(r, device=dev), xp.asarray(x, device=dev)] = False
    zero = xp.zeros((), dtype=some.dtype, device=dev)
    return {d: to_host(xp.sum(xp.where(keep, c, zero), axis=1)) for d, c in caps.items()}


def _set_rest(frontier: list, rest: dict) -> None:
    """Note on each prefix of ``frontier`` its row of ``rest`` (``{d: (m,) host array}``, :func:`_rest_sums`)."""
    cols = {d: v.tolist() for d, v in rest.items()}
    for i, u in enumerate(frontier):
        u.rest = {d: v[i] for d, v in cols.items()}


def _host_rows(P, Q):
    """``(P rows, Q rows)``: a frontier's laws as lists of contiguous float64 rows, read where they are (rows of a
    numpy block are views, a list's rows are taken as given), when the fused row kernels run (numba, host
    arrays); else None (the numpy route without numba, tensors)."""
    if not _K.JIT:
        return None
    out = []
    for X in (P, Q):
        if isinstance(X, np.ndarray):
            if X.ndim != 2:
                return None
            X = np.ascontiguousarray(X, dtype=np.float64)
            out.append([X[i] for i in range(X.shape[0])])
        elif isinstance(X, (list, tuple)) and all(isinstance(x, np.ndarray) for x in X):
            out.append([np.ascontiguousarray(x, dtype=np.float64) for x in X])
        else:
            return None
    return out[0], out[1]


#: The dtype of the host rows the row kernels read.
_F64 = np.dtype(np.float64)


def _row_base(base, V: int):
    """``(address, rows)`` of ``base`` viewed as ``(rows, V)`` (a C-contiguous float64 array of at least two
    dimensions whose last is ``V``, e.g. the laws of a model's tree call), or None."""
    if not isinstance(base, np.ndarray) or base.dtype != np.float64 or not base.flags.c_contiguous or \
            base.ndim < 2 or base.shape[-1] != V:
        return None
    return _K.row_address(base.reshape(-1)), base.size // V     # a view (C-contiguous); numpy's ctypes costs ~20 us


def _row_blocks(Prows: list, Qrows: list):
    """A frontier's host rows as groups ``(P, pr, Q, qr, ii)``: rows ``ii`` of the frontier are rows ``pr`` of the
    ``(n, V)`` array ``P`` and ``qr`` of ``Q`` (views of the rows' base arrays, no copy; one group per pair of
    arrays, e.g. one per model call the rows came from), so that ``P[pr[k]]`` is ``Prows[ii[k]]`` itself. None
    where a row is not a row of such an array (rows read one by one): ``V`` contiguous float64 whose first entry is
    the first entry of a row of its base (a C-contiguous float64 array, e.g. the laws of a model's tree call, viewed
    as ``(n, V)``; :func:`_row_base`, checked once per base)."""
    V = Prows[0].shape[0]
    shape, step, address = (V,), 8 * V, _K.row_address
    rows = (*Prows, *Qrows)
    for x in rows:
        if x.shape != shape or x.strides != (8,) or (x.dtype is not _F64 and x.dtype != _F64):
            return None
    # each row's base (numbered in order of first appearance) and address; the arithmetic on the addresses in numpy
    # (Python's divmod of 48-bit integers costs more than the address itself)
    of: dict = {}                                     # id(base) -> (number, base)
    bi = np.array([of.setdefault(id(x.base), (len(of), x.base))[0] for x in rows], dtype=np.int64)
    addr = np.array([address(x) for x in rows], dtype=np.int64)
    a0, n = np.empty(len(of), dtype=np.int64), np.empty(len(of), dtype=np.int64)
    for k, base in of.values():
        got = _row_base(base, V)
        if got is None:
            return None
        a0[k], n[k] = got
    at, off = np.divmod(addr - a0[bi], step)
    if off.any() or (at < 0).any() or (at >= n[bi]).any():
        return None
    m = len(Prows)
    pair = bi[:m] * len(of) + bi[m:]                  # the (draft, target) bases of each row of the frontier
    by = [b for _k, b in of.values()]
    out = []
    for key in dict.fromkeys(pair.tolist()):
        ii = np.flatnonzero(pair == key)
        P, Q = by[key // len(of)], by[key % len(of)]
        out.append((P.reshape(-1, V), at[ii], Q.reshape(-1, V), at[m + ii], ii))
    return out


def _block(X):
    """A frontier's laws as one ``(m, V)`` block (a list of rows stacked: numpy rows, or tensors on their device)."""
    if not isinstance(X, (list, tuple)):
        return X
    if all(isinstance(x, np.ndarray) for x in X):
        return np.stack(X)
    return namespace(X[0]).stack(list(X))


def _row_gather(rows: list, r: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``rows[r[i]][x[i]]`` for host index arrays (``r`` nondecreasing), one fancy index per row."""
    out = np.empty(r.shape[0])
    if r.size == 0:
        return out
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    for a, b in zip(starts.tolist(), starts[1:].tolist() + [r.size]):
        out[a:b] = rows[int(r[a])][x[a:b]]
    return out


def _expand_rows(slots: _Slots, process: str, frontier: list, Prows: list, Qrows: list, keep: int, chk=None,
                 resolve=None):
    r""":func:`_expand` by the fused row kernels (numba): each prefix's draft and target rows read where they are,
    in one kernel call per row that computes :math:`\pi` of every child, the exact level and the caps' row sums
    (and, above the last depth, the candidates' values); the same ``(candidates, pi_exact, dropped)``. The row
    sums are summed over :data:`_bound_kernels.BLOCK` lanes (within ~1e-13 of numpy's pairwise sums). A row with
    candidates and caps of lower depths gets one more pass once they are chosen (:func:`_bound_kernels.rest_row`:
    the caps summed over the children that are not candidates, :attr:`_Prefix.rest`).

    With ``chk`` (``(m, 2)``, i.i.d. children only) the kernels also check both rows as laws in the same pass
    (:func:`_bound_kernels.check_block`): ``chk[i]`` the draft's and the target's totals, NaN where an entry is
    bad; the caller must resolve them (:meth:`_Unchecked.resolve`) before it uses what this returns. Without
    replacement ``resolve`` instead (``resolve(chk)`` -> ``{(model, row): copy}``, :meth:`_Unchecked.resolve` of
    the frontier's laws, which raises where one is refused): called once the last depth's pass has checked the rows
    (:func:`_bound_kernels.wor_rows_decide`), before anything computed from them is read further (with ``None``
    before any kernel where no kernel checks them); rows that it copied are expanded again from the copies."""
    j = len(frontier[0].path)
    D = slots.D
    m = len(frontier)
    V = Prows[0].shape[0]
    Qu = np.array([u.Q for u in frontier])
    s_all = np.array([u.s for u in frontier], dtype=np.float64).reshape(m, j)
    more = j + 1 < D
    depths = list(range(j + 2, D + 1))
    # the slot weights: read by the caps of the lower depths (none at the last depth, i.i.d.) and the draws
    A = np.stack([u.A for u in frontier]) if depths or process == "wor" else None
    sums = np.empty((m, 1 + len(depths)))
    low = np.empty((m, V if more else 0))
    pi = np.empty((m, V if more else 0))
    draws = None
    if process != "wor":
        if depths:
            _r, _C, beta = slots.incidence(j)
            mdc = np.ascontiguousarray(np.stack([A @ beta[d].sum(axis=1) for d in depths], axis=1))
        else:
            mdc = np.zeros((m, 0))
        prog = _K.iid_program(*slots.iid_classes(j))
        s_rows = s_all if j else np.zeros((m, 1))
        blocks = _row_blocks(Prows, Qrows)
        if blocks is not None:                  # rows of arrays (a model call's): one call per array
            for g in blocks:
                if chk is None:
                    _K.iid_rows(*g, Qu, s_rows, j, *prog, mdc, sums, low, pi)
                else:
                    _K.iid_rows(*g, Qu, s_rows, j, *prog, mdc, sums, low, pi, chk)
        elif chk is None:
            for i in range(m):
                _K.iid_row(Prows[i], Qrows[i], float(Qu[i]), s_rows[i], j, *prog, mdc[i], sums[i], low[i], pi[i])
        else:
            ck = _K.check_scratch()
            for i in range(m):
                _K.iid_row(Prows[i], Qrows[i], float(Qu[i]), s_rows[i], j, *prog, mdc[i], sums[i], low[i], pi[i], ck)
                chk[i] = ck[-2:]
        pi_exact = True
    else:
        got = _wor_rows(slots, j, A, Prows, Qrows, Qu, [u.path for u in frontier], depths, sums, low, pi, resolve)
        if isinstance(got, dict):        # rows the check copied (an entry flushed): again, from the copies
            Prows, Qrows = list(Prows), list(Qrows)
            for (k, i), law in got.items():
                (Prows, Qrows)[k][i] = law
            return _expand_rows(slots, process, frontier, Prows, Qrows, keep)
        if got is None:   # a row enumerated or refused by the race: the block route, the whole frontier
            return _expand(slots, process, frontier, np.stack(Prows), np.stack(Qrows), keep)
        draws, mdc = got
        pi_exact = True
    if depths:
        for u, ex, caps in zip(frontier, sums[:, 0].tolist(), sums[:, 1:].tolist()):
            u.exact = ex
            u.S = dict(zip(depths, caps))
    else:
        for u, ex in zip(frontier, sums[:, 0].tolist()):
            u.exact = ex
            u.S = {}
    if not more:
        return None, pi_exact, 0
    r, x, dropped = _top_per_row(low, keep, np, owners=frontier)
    if depths:
        # the caps' sums over the children that are not candidates (i.i.d.: mdc[i, e] * p; else md = mdc[i, e, x])
        E = len(depths)
        rest = np.zeros((m, E))
        none, no_md = np.zeros(E), np.zeros((E, 0))
        starts = np.searchsorted(r, np.arange(m + 1))          # r nondecreasing: row i's candidates in [a, b)
        for i in range(m):
            if starts[i] == starts[i + 1]:
                rest[i] = sums[i, 1:]                          # no candidate: every child's cap
                continue
            _K.rest_row(Prows[i], Qrows[i], float(Qu[i]), mdc[i] if draws is None else none,
                        no_md if draws is None else mdc[i], np.sort(x[starts[i]:starts[i + 1]]), rest[i])
        _set_rest(frontier, {d: rest[:, e] for e, d in enumerate(depths)})
    if r.size == 0:
        return None, pi_exact, dropped
    Pg, Qg = _row_gather(Prows, r, x), Qu[r] * _row_gather(Qrows, r, x)
    if draws is None:
        caps = {d: np.minimum(Qg, mdc[r, e] * Pg) for e, d in enumerate(depths)}
    else:
        caps = {d: np.minimum(Qg, mdc[r, e, x]) for e, d in enumerate(depths)}
    cand = dict(pr=low[r, x], owner=[frontier[i] for i in r.tolist()], x=x, Q=Qg, pi=pi[r, x], p=Pg, caps=caps,
                dr=None if draws is None else draws.at(Pg, r, x))
    return cand, pi_exact, dropped


class _RowDraws:
    """The laws of the draws of the used ranks without replacement at a few entries of a frontier's rows (the
    candidates): rank 0 ``p``, rank 1 the closed form (as :func:`_bound_kernels.wor_row`), ranks >= 2 the race's
    (:func:`_race_at`)."""

    def __init__(self, ranks, st, race):
        self.ranks, self.st, self.race = list(ranks), st, race

    def at(self, p: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``(ranks, n)``: each used rank's law at the entries ``(rows[i], cols[i])``, whose draft values are ``p``."""
        st = self.st[rows]
        den = 1.0 - p
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(den > 0, p / np.where(den > 0, den, 1.0), 0.0)
        p1 = np.clip(np.where(cols == st[:, 1].astype(np.int64), p * st[:, 6], p * (st[:, 5] - t)), 0.0, 1.0)
        out = []
        for r in self.ranks:
            out.append(p.copy() if r == 0 else p1 if r == 1 else _race_at(self.race, self.race.ranks.index(r), p, rows, cols))
        return np.stack(out)


def _wor_rows(slots: _Slots, j: int, A, Prows, Qrows, Qu, paths, depths, sums, low, pi, resolve=None):
    r"""The fused row route of :func:`_expand_rows` for draws without replacement: one pass per draft row for what
    the draws' laws need (:func:`_bound_kernels.wor_row_stats`: support, the most likely tokens, the second
    draw's sums, the race's power sums), the race's quadrature per row, then one pass per row over both laws
    (:func:`_bound_kernels.wor_row`), the ranks' laws combined by their slot weights before the sums.

    At the last expanded depth (no caps, no candidates) the rows' sums need :math:`\pi` only where it can be the
    minimum: one pass per row over both laws decides the entries below a lower bound on :math:`\pi`
    (:func:`_bound_kernels.wor_row_last`, which takes the draft row's head and second draw's sums in the same
    pass); a row with entries left gets a tighter bound from the second draw's closed form
    (:func:`_bound_kernels.wor_row_recheck`) and, with entries still left, the race's power sums in a second sweep,
    all in one kernel call per row (:func:`_bound_kernels.wor_row_decide`); the rows with entries still left get
    the race's quadrature, and :math:`\pi` at those entries alone (:func:`_bound_kernels.wor_row_at`; a row
    with more than ``V // 16`` left, at every entry). The sums are those of the whole evaluation up to the order
    of the additions (the decided entries' :math:`\min` is :math:`Q` itself).
    ``(draws at entries, md)`` (``md[e]`` the expected slot counts of depth ``depths[e]`` when written), or None
    where a row is enumerated (few ordered draws) or refused by the race (the block route then). With ``resolve``
    (:func:`_expand_rows`) the laws are checked in the last depth's pass and resolved right after it (elsewhere
    before any kernel): a dict where it copied rows (the caller expands them again)."""
    m = len(Prows)
    V = Prows[0].shape[0]
    ranks, C, beta = slots.incidence(j)
    need = slots.need[j]
    K = min(_RACE_HEAD, V)
    race_on = need > 2 and _WOR_RACE
    N = _RACE_TERMS
    head = np.empty((m, K), dtype=np.int64)
    hval = np.empty((m, K))
    nu = np.zeros((m, N + 1))
    st = np.zeros((m, 7))
    mark = np.zeros(V, dtype=bool)
    W = A @ C                                                # (m, R): slot weight of each used rank
    # the last expanded depth (no caps, no candidates): a lower bound on pi decides most entries in one pass
    # (_bound_kernels.wor_row_last); the rows' stats and the race only for the rows with entries left
    last = not depths and low.shape[1] == 0 and ranks == list(range(need))
    if last:
        dW = _rank_drops(W, A, C)
        last = dW is not None
    lo = np.zeros((m, 3))
    heads = np.zeros(m, bool) if last else None
    left: dict = {}                                          # row -> the columns left (at most V // 16 kept)
    whole: set = set()                                       # rows with more left: pi at every entry (wor_row)
    idx = np.empty(V if last else 0, dtype=np.int32)
    blocks = None
    chk = None
    if resolve is not None:
        if last:
            chk = np.full((m, 2), np.nan)
        elif copied := resolve(None):
            return copied
    if not last:
        for i in range(m):
            _K.wor_row_stats(Prows[i], K, race_on, head[i], hval[i], nu[i], mark, st[i])
    else:
        big = V // 16
        # per row: the entries a lower bound on pi decides and the row's stats (the draft's head and second-draw
        # sums), in one pass over both laws; with entries left, the second draw's tighter bound (the recheck), and
        # the race's power sums only where it leaves some; one call per array the rows are rows of (a model call's
        # laws), else one call per row
        blocks = _row_blocks(Prows, Qrows)
        if blocks is not None:
            codes = np.zeros(m, dtype=np.int64)
            kept = np.empty((m, big), dtype=np.int32)
            for g in blocks:
                if chk is None:
                    _K.wor_rows_decide(*g, Qu, dW, idx, lo, K, race_on, big, head, hval, nu, mark, st, codes, kept)
                else:
                    _K.wor_rows_decide(*g, Qu, dW, idx, lo, K, race_on, big, head, hval, nu, mark, st, codes, kept,
                                       chk)
            got_left = [(i, int(c), kept[i, :int(lo[i, 1])].copy() if c >= 2 else None)
                        for i, c in enumerate(codes.tolist()) if c]
        else:
            got_left = []
            Qf = Qu.tolist()
            ck = None if chk is None else _K.check_scratch()
            for i in range(m):
                if ck is None:
                    c = _K.wor_row_decide(Prows[i], Qrows[i], Qf[i], dW[i], idx, lo[i], K, race_on, big, head[i],
                                          hval[i], nu[i], mark, st[i])
                else:
                    c = _K.wor_row_decide(Prows[i], Qrows[i], Qf[i], dW[i], idx, lo[i], K, race_on, big, head[i],
                                          hval[i], nu[i], mark, st[i], ck)
                    chk[i] = ck[-2:]
                if c:
                    got_left.append((i, c, idx[:int(lo[i, 1])].copy() if c >= 2 else None))
        if chk is not None and (copied := resolve(chk)):
            return copied
        for i, c, cols in got_left:
            if c == 1:
                whole.add(i)
            else:
                left[i] = cols
            heads[i] = c != 2                       # the head's laws only where one is read
    rows = sorted(set(left) | whole) if last else list(range(m))
    support = st[:, 0].astype(np.int64)
    for i in np.flatnonzero(support < need).tolist():
        raise _support_error("wor", need, paths[i], Prows[i])
    if need > 2 and any(math.perm(int(n), need) * V <= _MAX_WOR_ENUMERATION for n in support.tolist()):
        return None
    if need > 2 and not race_on:
        return None
    E = len(depths)
    coef = [A @ beta[d] for d in depths]                     # (m, R) each: depth-d slots below each rank's child
    w01, c01 = _first_two_weights(ranks, W, coef)
    race = None
    if race_on:
        # at the last depth pi reads the ranks' laws only combined by their slot weights: the race combines them
        race = _Race(Prows, [r for r in ranks if r >= 2], rows,
                     first=dict(support=support, head=head, hval=hval, kh=st[:, 2].astype(np.int64), pmax=st[:, 3],
                                nu=nu), heads=heads, weights=W[:, [k for k, r in enumerate(ranks) if r >= 2]] if last
                     else None)
        if not race.ok[rows].all():
            return None
        H, Hmd, HLw, HLmd = _race_weights(race, ranks, W, coef)
        rhead, theta, pmax = race.head, race.theta, race.pmax
    else:
        H, Hmd, HLw, HLmd = np.zeros((m, 1)), np.zeros((m, E, 1)), np.zeros((m, 1)), np.zeros((m, E, 1))
        rhead, theta, pmax = np.full((m, 1), -1, dtype=np.int64), np.zeros((m, 1)), np.ones(m)
    md = np.empty((m, E, low.shape[1]))
    top = st[:, 1].astype(np.int64)
    if last:
        at = None
        if blocks is not None and left:         # the entries left of rows of arrays: one call per array
            at = np.zeros(m)
            for g in blocks:
                _K.wor_rows_at(*g, Qu, codes, kept, lo, st, w01, H, race_on, pmax, theta, rhead, HLw, at)
        for i in range(m):
            if i in whole:
                _K.wor_row(Prows[i], Qrows[i], float(Qu[i]), int(top[i]), float(st[i, 5]), float(st[i, 6]), w01[i],
                           H[i], c01[i], Hmd[i], race_on, float(pmax[i]), theta[i], rhead[i], HLw[i], HLmd[i],
                           sums[i], low[i], pi[i], md[i])
                continue
            sums[i, 0] = lo[i, 2]
            if i in left:
                sums[i, 0] += at[i] if at is not None else \
                    _K.wor_row_at(Prows[i], Qrows[i], float(Qu[i]), left[i], int(top[i]), float(st[i, 5]),
                                  float(st[i, 6]), w01[i], H[i], race_on, float(pmax[i]), theta[i], rhead[i], HLw[i])
        return _RowDraws(ranks, st, race), md
    for i in range(m):
        _K.wor_row(Prows[i], Qrows[i], float(Qu[i]), int(top[i]), float(st[i, 5]), float(st[i, 6]), w01[i], H[i],
                   c01[i], Hmd[i], race_on, float(pmax[i]), theta[i], rhead[i], HLw[i], HLmd[i], sums[i], low[i], pi[i],
                   md[i])
    return _RowDraws(ranks, st, race), md


def _rank_drops(W, A, C):
    r"""``dW[:, n - 1]`` :math:`= W_{n-1} - W_n` (:math:`W_R = 0`): the weight of the slots with exactly ``n``
    children, which the last depth's lower bound on :math:`\pi` reads (:func:`_bound_kernels.wor_row_last`), from
    ``W = A @ C`` (``(m, R)``, the slot weight of each rank, ranks ``0 .. R - 1``); None where the slot weights are
    not nonincreasing in the rank. They are by the structure (checked here, exactly): a slot with a child of rank
    ``r`` has one of every lower rank (``C``'s columns nested) and the slot weights ``A`` are nonnegative. ``A @ C``
    rounds each column in its own order, so where two columns are equal in exact arithmetic (``branching(8,7)``:
    every slot has 7 children, :math:`W_0 = \dots = W_6`) a difference can round below 0 (-1e-19): the route was
    then refused, and the whole frontier took :math:`\pi` at every entry (one of the four last-depth frontiers
    of the real pair's ``branching(8,7)`` bound). Such a difference is set to 0, nearer the exact value
    (:math:`\ge 0`) than the rounded one; the lower bound's margin (a factor :math:`1 - 10^{-9}`) is far above what
    the rounding of ``W`` moves it (relative :math:`O(R^2 u)`). Where every difference is :math:`\ge 0` they are
    returned as they are (the same bits)."""
    if not ((C[:, :-1] >= C[:, 1:]).all() and (A >= 0).all()):
        return None
    dW = W - np.concatenate([W[:, 1:], np.zeros((W.shape[0], 1))], axis=1)
    return np.where(dW < 0, 0.0, dW)


def _first_two_weights(ranks, W, coef):
    """``(w01, c01)``: the slot weights of the ranks 0 and 1 (``(m, 2)``, 0 where unused) and their slot counts
    at each lower depth (``(m, E, 2)``), from ``W`` (``(m, R)``) and ``coef`` (``E`` arrays ``(m, R)``)."""
    m, E = W.shape[0], len(coef)
    w01 = np.zeros((m, 2))
    c01 = np.zeros((m, E, 2))
    for k, r in enumerate(ranks):
        if r < 2:
            w01[:, r] = W[:, k]
            for e in range(E):
                c01[:, e, r] = coef[e][:, k]
    return w01, c01


def _race_weights(race: _Race, ranks, W, coef):
    r"""``(H, Hmd, HLw, HLmd)``: the race's Taylor coefficients (``(m, N + 1)``) and head laws (``(m, Kh)``) of the
    ranks >= 2 combined by their slot weights ``W``, and the same with the slot counts ``coef`` of each lower
    depth (``(m, E, .)``): the law of the draws' union that :math:`\pi` and the caps read."""
    m, E = W.shape[0], len(coef)
    Kh, N1 = race.head.shape[1], race.C.shape[2]
    H, Hmd = np.zeros((m, N1)), np.zeros((m, E, N1))
    HLw, HLmd = np.zeros((m, Kh)), np.zeros((m, E, Kh))
    if race.combined:                                         # combined by W in the quadrature (no slot counts)
        return race.C[:, 0].copy(), Hmd, race.HL[:, 0].copy(), HLmd
    for k, r in enumerate(ranks):
        if r < 2:
            continue
        q = race.ranks.index(r)
        H += W[:, k, None] * race.C[:, q]
        HLw += W[:, k, None] * race.HL[:, q]
        for e in range(E):
            Hmd[:, e] += coef[e][:, k, None] * race.C[:, q]
            HLmd[:, e] += coef[e][:, k, None] * race.HL[:, q]
    return H, Hmd, HLw, HLmd


# --------------------------------------------------------------------------- the device route: torch tensors, few reads
def _to_device(a, like):
    """A host array as a float64 tensor on ``like``'s device (one copy)."""
    import torch

    return torch.as_tensor(np.ascontiguousarray(a, dtype=np.float64), device=like.device)


def _read(parts) -> np.ndarray:
    """The tensors ``parts`` flattened into one float64 host array: one read of the device for all of them."""
    import torch

    flat = [t.reshape(-1) for t in parts]
    if not any(t.dtype == torch.float64 for t in flat):
        flat[0] = flat[0].to(torch.float64)
    # the other dtypes (counts, indices, masks) converted to float64 by the concatenation's type promotion (exact:
    # integers below 2**53), not by one conversion op per part
    return torch.cat(flat).to("cpu").numpy()


def _run_reads(steps: list) -> list:
    """Run the generators ``steps`` together, each yielding the tensors it needs on the host and receiving them
    as one flat float64 array (:func:`_read`'s) until it returns: every round one read of what all of them ask
    (several frontiers' or families' expansions in as many reads as the one that asks most, not one read each);
    their return values, in order. The same values as one read per generator (the same tensors, copied)."""
    return _Reads(steps).finish()


class _Reads:
    """The generators ``steps`` of :func:`_run_reads`, started (each run to its first read) and advanced one round
    at a time: :meth:`ask` gives the round's tensors (every pending generator's, concatenated: one flat tensor,
    float64 as :func:`_read` makes it; None when all are done), :meth:`give` hands its host copy back, so that a
    caller can read a round together with tensors of its own (the profile's first round of the bound with the
    walk's tree values: one read for both); :meth:`finish` reads the rest and returns the generators' values.

    :meth:`add` starts more generators in the same rounds and :meth:`until` runs rounds until some of them are done,
    the others advancing in the same reads (the search's last-depth expansions, whose values no later choice reads:
    :func:`_sampled`). A generator that raises is set aside; :meth:`until` and :meth:`finish` then run every
    generator to its end and raise the exception of the first one started that raised (the one the host's route,
    which runs them one after the other, raises)."""

    def __init__(self, steps: list):
        self.steps: list = []
        self.out: list = []
        self.pending: dict = {}
        self.raised: dict = {}
        self.add(steps)

    def add(self, steps: list) -> list:
        """Start the generators ``steps`` (each run to its first read); their indices."""
        ids = []
        for g in steps:
            i = len(self.steps)
            self.steps.append(g)
            self.out.append(None)
            ids.append(i)
            self._advance(i, None)
        return ids

    def _advance(self, i, got) -> None:
        try:
            self.pending[i] = self.steps[i].send(got)
        except StopIteration as stop:
            self.out[i] = stop.value
        except Exception as exc:  # noqa: BLE001 - re-raised in order by _raise
            self.raised[i] = exc

    def _raise(self) -> None:
        if self.raised:
            while self.pending:
                self.give(_read([t for parts in self.pending.values() for t in parts]))
            raise self.raised[min(self.raised)]

    def until(self, ids: list) -> list:
        """Run rounds (one read each, every pending generator advanced) until the generators ``ids`` are done;
        their values."""
        while not self.raised and any(i in self.pending for i in ids):
            self.give(_read([t for parts in self.pending.values() for t in parts]))
        self._raise()
        return [self.out[i] for i in ids]

    def ask(self):
        """The round's tensors as one flat float64 tensor (one read of it serves the round: :func:`_read`'s
        concatenation, unread), or None."""
        import torch

        if not self.pending:
            return None
        flat = [t.reshape(-1) for _, parts in self.pending.items() for t in parts]
        if not any(t.dtype == torch.float64 for t in flat):
            flat[0] = flat[0].to(torch.float64)
        return torch.cat(flat)

    def give(self, host) -> None:
        """Advance every pending generator by its share of ``host`` (the round's :meth:`ask`, read)."""
        asked = list(self.pending.items())
        self.pending.clear()
        sizes = [sum(int(t.numel()) for t in parts) for _, parts in asked]
        host = np.asarray(host, dtype=np.float64).reshape(-1)
        for (i, _), got in zip(asked, np.split(host, np.cumsum(sizes)[:-1])):
            self._advance(i, got)

    def finish(self) -> list:
        """Run every round left, one read each (:func:`_read`); the generators' return values, in order."""
        while self.pending and not self.raised:
            self.give(_read([t for parts in self.pending.values() for t in parts]))
        self._raise()
        return self.out


def _power_sums(y, N: int):
    r"""``(m, N)``: :math:`\sum_x y_x^n`, ``n = 1 .. N``, over the columns of the ``(m, V)`` tensor ``y``, as one
    batched matrix product per block of columns: with :math:`n = b + s a` (:math:`s = \lceil \sqrt{N + 1}\,
    \rceil`), :math:`\sum_x y_x^b\, (y_x^s)^a` for every pair, from the ``s`` powers :math:`y^b` and the
    powers :math:`(y^s)^a` (about :math:`2 \sqrt N` products of the block, not ``N``; every term positive)."""
    import torch

    m, V = y.shape
    s = math.isqrt(N) + 1                                     # ceil(sqrt(N + 1))
    t = -(-(N + 1) // s)                                      # s * t >= N + 1 powers 0 .. s t - 1
    step = max(1, _POWER_ENTRIES // max(1, m * (s + t)))
    out = None
    for v0 in range(0, V, step):
        yc = y[:, v0:v0 + step]
        lo = torch.empty((m, s, yc.shape[1]), dtype=y.dtype, device=y.device)
        hi = torch.empty((m, t, yc.shape[1]), dtype=y.dtype, device=y.device)
        lo[:, 0] = 1.0
        for b in range(1, s):
            torch.mul(lo[:, b - 1], yc, out=lo[:, b])
        hi[:, 0] = 1.0
        if t > 1:
            torch.mul(lo[:, s - 1], yc, out=hi[:, 1])        # y^s
        for a in range(2, t):
            torch.mul(hi[:, a - 1], hi[:, 1], out=hi[:, a])
        part = torch.bmm(lo, hi.transpose(1, 2))              # [b, a]: sum_x y^b (y^s)^a
        out = part if out is None else out.add_(part)
    return out.transpose(1, 2).reshape(m, s * t)[:, 1:N + 1]  # n = b + s a, in order


class _Columns:
    """Per-row host values (``(m, c)``) that a pass over a device block reads as columns: Python floats where every
    row holds the same (the contexts of a batch: nothing copied), else one ``(m, c)`` tensor on ``like``'s device
    (one copy); ``cols(k)`` is column ``k`` (a float or an ``(m, 1)`` tensor)."""

    def __init__(self, host: np.ndarray, like):
        host = np.asarray(host, dtype=np.float64)
        self.same = host.shape[0] == 1 or bool((host == host[0]).all())
        self.vals = host[0].tolist() if self.same else _to_device(host, like)

    def __call__(self, k: int):
        return self.vals[k] if self.same else self.vals[:, k:k + 1]


def _second_draw_t(P):
    r""":func:`_second_draw` of an ``(m, V)`` tensor: the same arithmetic on the same values (so the same bits), each
    row's most likely token reached by one gather or scatter along the row instead of an advanced index (one op, not
    an index tensor and an ``index_put``), and :math:`t_x = p_x / (1 - p_x)` divided where ``1 - p_x > 0`` is
    kept."""
    import torch

    top = torch.argmax(P, dim=1, keepdim=True)
    rest = 1.0 - P
    rest.scatter_(1, top, torch.sum(P.scatter(1, top, 0.0), dim=1, keepdim=True))
    t = (P / rest).masked_fill_(rest <= 0, 0.0)
    out = P * (torch.sum(t, dim=1, keepdim=True) - t)
    t.scatter_(1, top, 0.0)
    out.scatter_(1, top, P.gather(1, top) * torch.sum(t, dim=1, keepdim=True))
    return out.clamp_(0.0, 1.0)


def _race_stats_t(P, K: int, rows=None, extra=(), support=None):
    """:func:`_race_stats_steps` in one read of its own."""
    return _run_reads([_race_stats_steps(P, K, rows, extra, support)])[0]


def _race_stats_steps(P, K: int, rows=None, extra=(), support=None):
    r"""What the exponential race needs of the rows ``rows`` (None: all) of the ``(m, V)`` tensor ``P``, computed
    where ``P`` is and read in one copy with the ``(m,)`` float64 tensors ``extra`` (a generator: it yields the
    tensor to read and takes the host copy, :func:`_run_reads`): ``(support, head, kh, hval,
    pmax, nu, extra, head_t)`` (host arrays but ``head_t``, ``len(rows)`` rows) as
    :func:`_bound_kernels.wor_row_stats` gives them: the support, the ``K`` most likely tokens by decreasing
    probability (-1 past the ``kh`` positive ones) and their probabilities, the tail's largest probability (0
    without a tail) and its power sums :math:`\nu_n = \sum_x (p_x / p_{\max})^n`, ``n = 1 ..``
    :data:`_RACE_TERMS`, over every tail token (:func:`_power_sums`; the host's kernel leaves out at most 1e-22 of
    each token's powers: the sums agree to a relative 1e-16); ``head_t`` the head as a tensor where ``P`` is (its places past
    ``kh`` hold tokens of probability 0)."""
    import torch

    N = _RACE_TERMS
    sub = P if rows is None else P[torch.as_tensor(list(rows), dtype=torch.long, device=P.device)]
    m, V = sub.shape
    K = min(K, V)
    vals, idx = torch.topk(sub, min(K + 1, V), dim=1)
    pmax = vals[:, K] if K < V else torch.zeros(m, dtype=sub.dtype, device=sub.device)
    tail = (pmax > 0)[:, None]
    y = (sub / torch.where(tail, pmax[:, None], 1.0)).scatter_(1, idx[:, :K], 0.0)
    nu = _power_sums(y, N) * tail
    # (the indices converted by the concatenation's type promotion; ``support``: the rows' supports where the
    # caller has them, float64)
    sup = torch.sum(sub > 0, dim=1, dtype=sub.dtype) if support is None else support
    host = yield [torch.cat([sup[:, None], vals[:, :K], idx[:, :K], pmax[:, None], nu] + [e[:, None] for e in extra],
                            dim=1)]
    host = host.reshape(m, 1 + 2 * K + 1 + N + len(extra))
    support = host[:, 0].astype(np.int64)
    kh = np.minimum(K, support)
    inside = np.arange(K)[None, :] < kh[:, None]
    head = np.where(inside, host[:, 1 + K:1 + 2 * K], -1).astype(np.int64)
    hval = np.where(inside, host[:, 1:1 + K], 0.0)
    pm = host[:, 1 + 2 * K]
    nu_h = np.concatenate([np.zeros((m, 1)), host[:, 2 + 2 * K:2 + 2 * K + N]], axis=1)
    return support, head, kh, hval, pm, nu_h, [host[:, 2 + 2 * K + N + i] for i in range(len(extra))], idx[:, :K]


#: Largest number of head entries (rows times head sizes, summed over the heads) that :class:`_GrownHeads` computes
#: and reads ahead of the growths that need them (each entry comes back with its value: 2**18 entries, 4 MB).
_MAX_GROWN_ENTRIES = 2**18


class _GrownHeads:
    r"""The ``stats(todo, K)`` of :class:`_Race` on the device (what a grown head of ``K`` tokens needs of the rows
    ``todo`` of the tensor ``P``: :func:`_race_stats_steps`'s ``(head, kh, hval, pmax, nu)``), the later heads read
    with the first: a growth gets the stats of every head the race may grow its rows to (``K``, ``min(V, 4 K)``,
    ... up to ``V``, :class:`_Race`'s sequence, while their entries stay within :data:`_MAX_GROWN_ENTRIES`), each
    by :func:`_race_stats_t`'s own arithmetic on the same rows (the same block of the same rows, so the same values
    to the bit on any device), all in one read; a later growth
    of the same rows takes its stats from that read, a growth of fewer rows (some accepted) reads its heads again,
    for those rows. One read for all the growths of a frontier's race whose rows grow together, instead of one per
    growth (``branching(16, 4)``'s context at V = 3,000: one read, not four).

    ``Q`` (set by the caller; None: not read): the target's block of the same rows. Where a read holds every head
    up to ``V`` (no growth can read again) and the whole blocks ``P`` and ``Q`` fit with them within
    :data:`_MAX_GROWN_ENTRIES`, they are read in the same copy (``laws``, ``(2, m, V)``, the values of
    :func:`_host_route_steps`'s read): a race refused after its last growth then goes to the host's route without a
    read of its own (``branching(16, 4)`` at V = 300 .. 3,000: 4 reads a bound, not 5)."""

    Q = None
    laws = None

    def __init__(self, P):
        self.P = P
        self.rows: list = []
        self.got: dict = {}                               # head size -> stats of the rows ``self.rows``

    def __call__(self, todo, K: int):
        todo = [int(i) for i in todo]
        if todo != self.rows or K not in self.got:
            # the later heads only while their entries stay small (_MAX_GROWN_ENTRIES): at a large V the heads up
            # to V would bring rows x V values back for growths that may never come; past it, a growth reads again
            levels, V = [K], self.P.shape[1]
            entries = len(todo) * K
            while levels[-1] < V and entries + len(todo) * min(V, 4 * levels[-1]) <= _MAX_GROWN_ENTRIES:
                levels.append(min(V, 4 * levels[-1]))
                entries += len(todo) * levels[-1]
            steps = _race_levels_steps(self.P, levels, todo)
            laws = self.Q is not None and self.laws is None and levels[-1] == V and \
                entries + 2 * int(self.P.numel()) <= _MAX_GROWN_ENTRIES
            if laws:          # every head read: the race's last chance; its laws with them, for a refusal
                steps = _with_tensors(steps, [self.P, self.Q])
            got = _run_reads([steps])[0]
            if laws:
                got, host = got
                self.laws = host.reshape(2, *self.P.shape)
            self.rows, self.got = todo, dict(zip(levels, got))
        return self.got[K]


def _with_tensors(steps, extra: list):
    """The one-read generator ``steps`` (:func:`_run_reads`) with the tensors ``extra`` read in the same copy after
    its own: ``(steps' value, the extra tensors' host values, flat)``."""
    parts = next(steps)
    n = sum(int(t.numel()) for t in parts)
    host = yield list(parts) + list(extra)
    try:
        steps.send(host[:n])
    except StopIteration as stop:
        return stop.value, host[n:]
    raise RuntimeError("a one-read generator asked for a second read")


def _race_levels_steps(P, levels: list, rows: list):
    """The stats ``(head, kh, hval, pmax, nu)`` of the rows ``rows`` of the tensor ``P`` for each head size in
    ``levels``, each by :func:`_race_stats_steps` on those rows (gathered once: the same block as
    :func:`_race_stats_t`'s), in one read (a generator, :func:`_run_reads`)."""
    import torch

    sub = P[torch.as_tensor(list(rows), dtype=torch.long, device=P.device)]      # gathered once for every head
    steps = [_race_stats_steps(sub, k) for k in levels]
    parts = [next(g) for g in steps]
    sizes = [sum(int(t.numel()) for t in p) for p in parts]
    host = yield [t for p in parts for t in p]
    out = []
    for g, got in zip(steps, np.split(np.asarray(host), np.cumsum(sizes)[:-1])):
        try:
            g.send(got)
        except StopIteration as stop:
            out.append(stop.value[1:6])
    return out


def _wor_pi_steps(slots: _Slots, j: int, frontier: list, P, Qc, w01, c01, depths, last: bool, Q=None):
    r"""The children's :math:`\pi` and expected slot counts below them, draws without replacement, for the
    ``(m, V)`` tensor ``P`` of one depth's prefixes, where ``P`` is: rank 0 is ``p``, rank 1 the closed form
    (:func:`_second_draw`), ranks >= 2 the exponential race (its power sums here, :func:`_race_stats_t`; its
    quadrature per row on the host, :class:`_Race`, small arrays both ways), combined by their slot weights before
    the Taylor sum, which runs by Horner's rule over the whole block, to the largest degree any row needs (each
    entry's own degree on the host: the terms above it are below 1e-17 of the first). At the last expanded depth
    (``last``) the rows whose lower bound :math:`w_0 p + w_1 \ell_1 \ge Q` everywhere need no race.

    ``w01(r)``, ``c01(2 e + r)``: the slot weight of rank ``r`` and its slot count at the ``e``-th lower depth,
    per row (:class:`_Columns`).

    Returns ``(pi, mds, P1, race, support)``: ``pi`` clipped at 1, ``mds`` the ``E`` slot counts, the second
    draw's law, the :class:`_Race` (None without ranks >= 2) and the supports as a tensor (checked by the caller
    with its one read), or None where the host's route must take the frontier (rows whose draws are
    enumerated, the race refused or off), or, where the race is refused after its heads grew to ``V`` and the
    laws were read with them (``Q``, the target's block: :class:`_GrownHeads`), those laws (``(2, m, V)`` host
    values: the host's route needs no read of its own). A generator (:func:`_run_reads`): the race's power sums are
    the one read it yields."""
    import torch

    ranks, C, beta = slots.incidence(j)
    need = slots.need[j]
    m, V = P.shape
    E = len(depths)
    race_on = need > 2
    if race_on and (not _WOR_RACE or math.perm(V, need) * V <= _MAX_WOR_ENUMERATION):
        return None                   # the race off, or every row's draws enumerated (its support at most V)
    P1 = _second_draw_t(P) if need > 1 else torch.zeros_like(P)
    base_pi = w01(0) * P + w01(1) * P1
    base_md = [c01(2 * e) * P + c01(2 * e + 1) * P1 for e in range(E)]
    support = torch.sum(P > 0, dim=1, dtype=P.dtype)
    race = None
    if race_on:
        paths = [u.path for u in frontier]
        K = min(_RACE_HEAD, V)
        # one read: the supports, the race's power sums and, at the last depth, the rows where the lower bound
        # leaves entries undecided (only they take the race's quadrature)
        und = [torch.sum(base_pi < Qc, dim=1, dtype=P.dtype)] if last else []
        st = yield from _race_stats_steps(P, K, extra=und, support=support)
        sup, head_t = st[0], st[7]
        rows = np.flatnonzero(st[6][0] > 0).tolist() if last else list(range(m))
        for i in np.flatnonzero(sup < need).tolist():
            raise _support_error("wor", need, paths[i], P[i].to("cpu").numpy())
        if any(math.perm(int(n), need) * V <= _MAX_WOR_ENUMERATION for n in sup.tolist()):
            return None
        if rows:
            first = dict(support=sup, head=np.full((m, K), -1, np.int64), hval=np.zeros((m, K)),
                         kh=np.zeros(m, np.int64), pmax=np.zeros(m), nu=np.zeros((m, _RACE_TERMS + 1)))
            for key, v in zip(("head", "kh", "hval", "pmax", "nu"), st[1:6]):
                first[key][rows] = v[rows]
            grown = _GrownHeads(P)
            grown.Q = Q                          # the laws read with the last heads, for a refusal
            race = _Race(P, [r for r in ranks if r >= 2], rows, first=first, stats=grown)
            if not race.ok[rows].all():
                return getattr(grown, "laws", None)
            A = np.stack([u.A for u in frontier])
            W, coef = A @ C, [A @ beta[d] for d in depths]
            H, Hmd, HLw, HLmd = _race_weights(race, ranks, W, coef)
            N = race.C.shape[2] - 1
            # the largest Taylor degree of a tail entry (x <= 1): thresholds below 1, over the rows with a tail
            top = int(np.max(np.sum(race.theta[:, :N] < 1.0, axis=1), initial=0))
            Kh = race.head.shape[1]
            grown = Kh != K                      # a row's head grown: the head itself goes to the device
            host = np.concatenate([np.stack([H] + [Hmd[:, e] for e in range(E)], axis=1)[:, :, :top + 1]
                                   .reshape(m, -1), np.stack([HLw] + [HLmd[:, e] for e in range(E)], axis=1)
                                   .reshape(m, -1), race.pmax[:, None]]
                                  + ([race.head.astype(np.float64)] if grown else []), axis=1)
            got = _to_device(host, P)
            Hs = got[:, :(1 + E) * (top + 1)].reshape(m, 1 + E, top + 1)
            at = (1 + E) * (top + 1)
            HL = got[:, at:at + (1 + E) * Kh].reshape(m, 1 + E, Kh)
            pmax = got[:, at + (1 + E) * Kh]
            # the head's places (rows not raced: H and HL are 0 there, so any token does)
            if grown:
                head = got[:, at + (1 + E) * Kh + 1:].to(torch.long)
                valid = head >= 0
                hidx = torch.where(valid, head, 0)
                hm = torch.zeros_like(P).scatter_add_(1, hidx, valid.to(P.dtype)) > 0
                HLv = HL * valid[:, None, :]
            else:                                # every place a token, distinct in its row (a top-k's indices)
                hidx, HLv = head_t, HL
                hm = torch.zeros(P.shape, dtype=torch.bool, device=P.device).scatter_(1, hidx, True)
            x = (P / pmax[:, None]).masked_fill(hm, 0.0)
            acc = Hs[:, :, top, None].expand(m, 1 + E, V)
            for n in range(top - 1, -1, -1):
                acc = torch.addcmul(Hs[:, :, n, None], acc, x[:, None, :])
            hv = torch.zeros(m, 1 + E, V, dtype=P.dtype, device=P.device).scatter_add_(
                2, hidx[:, None, :].expand(m, 1 + E, Kh), HLv)
            add = torch.where(hm[:, None, :], hv, P[:, None, :] * acc)
            base_pi = base_pi + add[:, 0]
            base_md = [b + add[:, 1 + e] for e, b in enumerate(base_md)]
    return torch.clip(base_pi, None, 1.0), base_md, P1, race, support


def _top_t(low, keep: int, pos=None):
    """``(vals, idx, taken)``: per row the at most ``keep`` largest positive entries of ``low`` with their columns
    (``(m, min(keep, V))`` tensors), ties (:func:`_order_key`) at the ``keep``-th value taken by lower column (the
    host's :func:`_top_per_row`), the other places -1; ``taken`` (``(m, V)`` bool) marks the entries returned with
    their value (at most ``keep`` a row, every one positive). ``pos``: ``low > 0`` where already formed. Two
    ``topk``, a ``cumsum``, no read."""
    import torch

    m, V = low.shape
    if pos is None:
        pos = low > 0
    if keep < V:
        lo, hi = _key_edges(torch.topk(low, keep, dim=1).values[:, -1:], torch)   # the keep-th's key (_order_key)
        gt = low >= hi
        eq = (low >= lo) & (low < hi)
        room = keep - torch.sum(gt, dim=1, keepdim=True)
        pos = gt | (eq & (torch.cumsum(eq, dim=1, dtype=torch.int64) <= room))
    vals, idx = torch.topk(torch.where(pos, low, -1.0), min(keep, V), dim=1)
    return vals, idx, pos


def _expand_t(slots: _Slots, process: str, frontier: list, Pl, Ql, keep: int):
    """:func:`_expand_t_steps` with reads of its own (one per step)."""
    return _run_reads([_expand_t_steps(slots, process, frontier, Pl, Ql, keep)])[0]


def _expand_t_steps(slots: _Slots, process: str, frontier: list, Pl, Ql, keep: int):
    r""":func:`_expand` where the laws are (torch tensors on the models' device, ``(m, V)`` float64 blocks): the
    children's :math:`\pi` (i.i.d.: :func:`_iid_pi`'s recursion over the whole block; without replacement
    :func:`_wor_pi_steps`), min(Q, pi), the caps of the lower depths summed over the children that are not
    candidates (:attr:`_Prefix.rest`: the target's path probability zeroed at the candidates, so the same number
    of torch ops as the whole row sums; :attr:`_Prefix.S` is not formed on this route), the candidates of each row
    (:func:`_top_t`) and their values, all read in one copy (without replacement and ranks >= 2, one more read
    before it for the race's power sums, which at the last depth also names the rows that need the race). The same
    ``(candidates, pi_exact, dropped)``; the host's route on the laws read in one copy (:func:`_host_route_steps`)
    where :func:`_wor_pi_steps` declines. A generator (:func:`_run_reads`): each read is yielded (the tensors to read) and
    its host copy sent back, so that the expansions of several frontiers (the profile's families and prompts) share
    their reads."""
    import torch

    j = len(frontier[0].path)
    D, m, V = slots.D, len(frontier), Pl.shape[1]
    more = j + 1 < D
    depths = list(range(j + 2, D + 1))
    E = len(depths)
    Qu = np.array([u.Q for u in frontier])
    A = np.stack([u.A for u in frontier])
    s_all = np.array([u.s for u in frontier], dtype=np.float64).reshape(m, j)
    ranks, C, beta = slots.incidence(j)
    race, P1, support = None, None, None
    if process != "wor":
        mdc = np.stack([A @ beta[d].sum(axis=1) for d in depths], axis=1) if depths else np.zeros((m, 0))
        cols = _Columns(np.concatenate([Qu[:, None], mdc, s_all], axis=1), Pl)
        Qc = cols(0) * Ql
        pi = _iid_pi(slots, j, s_all if cols.same else cols.vals[:, 1 + E:], Pl)
        mds = [cols(1 + e) * Pl for e in range(E)]
    else:
        w01, c01 = _first_two_weights(ranks, A @ C, [A @ beta[d] for d in depths])
        cols = _Columns(np.concatenate([Qu[:, None], w01, c01.reshape(m, 2 * E)], axis=1), Pl)
        Qc = cols(0) * Ql
        got = yield from _wor_pi_steps(slots, j, frontier, Pl, Qc, lambda r: cols(1 + r), lambda k: cols(3 + k),
                                       depths, not more, Ql)
        if got is None or isinstance(got, np.ndarray):    # rows enumerated or refused by the race: the host's
            # route, one read (none where the laws came with the race's last heads)
            return (yield from _host_route_steps(slots, process, frontier, Pl, Ql, keep,
                                                 None if got is None else got))
        pi, mds, P1, race, support = got
    low = torch.minimum(Qc, pi)
    K = min(keep, V) if more else 0
    positive = low > 0 if more else None
    taken = None
    if K > 0:
        vals, idx, taken = _top_t(low, K, positive)
    # the caps summed over the children that are not candidates (their target path probability zeroed), for
    # _share (:attr:`_Prefix.rest`); the candidates' caps are formed on the host from their gathered Q and md
    Qr = Qc if taken is None or not E else Qc.masked_fill(taken, 0.0)
    parts = [torch.stack([torch.sum(low, dim=1)] + [torch.sum(torch.minimum(Qr, md), dim=1) for md in mds], dim=1)]
    sizes = [m * (1 + E)]
    if support is not None:
        parts.append(support)
        sizes.append(m)
    if more:
        parts.append(torch.sum(positive, dim=1))
        sizes.append(m)
    if K > 0:
        fields = [low, Qc, pi, Pl] + ([P1] if P1 is not None else []) + list(mds)
        parts += [vals, idx, torch.stack([torch.gather(f, 1, idx) for f in fields], dim=2)]
        sizes += [m * K, m * K, m * K * len(fields)]
    host = np.split((yield parts), np.cumsum(sizes)[:-1])
    sums = host[0].reshape(m, 1 + E)
    for i, u in enumerate(frontier):
        u.exact = float(sums[i, 0])
    _set_rest(frontier, dict(zip(depths, sums[:, 1:].T)))
    at = 1
    if support is not None:
        need = slots.need[j]
        for i in np.flatnonzero(host[at] < need).tolist():
            raise _support_error("wor", need, frontier[i].path, Pl[i].to("cpu").numpy())
        at += 1
    pi_exact = True                                   # the race's rows all accepted (else the block route)
    if not more:
        return None, pi_exact, 0
    npos = host[at].astype(np.int64)
    dropped = _note_dropped(frontier, npos, keep)
    if K <= 0:
        return None, pi_exact, dropped
    vals = host[at + 1].reshape(m, K)
    cols = host[at + 2].reshape(m, K).astype(np.int64)
    G = host[at + 3].reshape(m, K, -1)
    rr, kk = np.nonzero(vals > 0)
    order = np.lexsort((cols[rr, kk], -_order_key(vals[rr, kk]), rr))
    rr, kk = rr[order], kk[order]
    x = cols[rr, kk]
    if rr.size == 0:
        return None, pi_exact, dropped
    g = G[rr, kk]
    p = g[:, 3]
    dr = None
    if process == "wor":
        p1 = g[:, 4]
        dr = np.stack([p.copy() if r == 0 else p1 if r == 1 else
                       _race_at(race, race.ranks.index(r), p, rr.astype(np.int64), x) for r in ranks])
    off = 5 if P1 is not None else 4
    cand = dict(pr=g[:, 0], owner=[frontier[i] for i in rr.tolist()], x=x, Q=g[:, 1], pi=g[:, 2], p=p,
                caps={d: np.minimum(g[:, 1], g[:, off + e]) for e, d in enumerate(depths)}, dr=dr)
    return cand, pi_exact, dropped


def _host_route_steps(slots: _Slots, process: str, frontier: list, Pl, Ql, keep: int, host=None):
    """The expansion of one depth's rows by the host's route (:func:`_laws_block`'s: the numba row kernels, else
    :func:`_expand` on numpy blocks) on their laws read in one copy (a generator, :func:`_run_reads`: the tensors
    ``Pl`` and ``Ql`` are its one read), where :func:`_wor_pi_steps` declines (rows whose draws are enumerated,
    the race refused or off): the numpy route's arithmetic on the same rows, so its values to the bit, in one read
    instead of the block route's reads on the tensors (a few per rank and field). ``host``: those laws already read
    (``(2, m, V)``, with the race's last heads: :class:`_GrownHeads`), then no read."""
    m, V = Pl.shape
    if host is None:
        host = (yield [Pl, Ql]).reshape(2, m, V)
    run, P, Q = _laws_block(host[0], host[1])
    return run(slots, process, frontier, P, Q, keep)


#: Low bits of a candidate's min(Q, pi) that its place in the order of expansion ignores (:func:`_order_key`).
_KEY_DROP = 22


def _order_key(v, xp=np):
    r"""The key that orders candidates for expansion: ``v`` (non-negative float64, numpy or a tensor of ``xp``)
    rounded to 31 significant bits, as int64 (monotone in ``v``).

    Without replacement the routes (fused kernels, numpy, torch) and the race's head and tail compute a child's
    :math:`\pi` to a relative 1e-12 but not to the bit, so tied draft probabilities give values a few ulp apart in
    an order that depends on the route; ordered by the values themselves, a budget that cuts through such a tie
    expanded other prefixes on each route (bounds 1.5% apart at ``V = 50`` with a uniform draft). Values within
    :math:`2^{-31}` relative share a key and are ordered by depth, parent and token alike on every route (the key's
    bin edges are dyadic numbers of 32 significant bits, which a tie's value lies within a few ulp of only by
    chance)."""
    if xp is np:
        b = np.ascontiguousarray(v, dtype=np.float64).view(np.int64)
    else:
        import torch

        b = v.contiguous().view(torch.int64)
    return (b + (1 << (_KEY_DROP - 1))) >> _KEY_DROP


def _key_edges(kth, xp=np):
    """``(lo, hi)``: the smallest positive double of key :func:`_order_key` ``(kth)`` (at least the smallest
    subnormal) and the smallest double of the next key, as float64 arrays of ``xp`` (``lo <= v < hi`` exactly where
    ``v > 0`` has ``kth``'s key); five elementwise ops on ``kth``."""
    half = 1 << (_KEY_DROP - 1)
    if xp is np:
        c = (np.ascontiguousarray(kth, dtype=np.float64).view(np.int64) + half) & -(1 << _KEY_DROP)
        return np.maximum(c - half, 1).view(np.float64), (c + half).view(np.float64)
    import torch

    c = (kth.view(torch.int64) + half) & -(1 << _KEY_DROP)        # the key times 2**_KEY_DROP
    return torch.clamp(c - half, min=1).view(torch.float64), (c + half).view(torch.float64)


def _note_dropped(owners, npos: np.ndarray, keep: int) -> int:
    """The children with min(Q, pi) > 0 that a budget of ``keep`` per row leaves out (``npos`` positive per row),
    noted on each row's prefix (``owners``, when given: its own search counts them) and summed."""
    per = np.maximum(npos - keep, 0)
    if owners is not None:
        for u, n in zip(owners, per.tolist()):
            u.dropped = int(n)
    return int(per.sum())


def _top_per_row(low, keep: int, xp, owners=None):
    """``(rows, cols, dropped)`` (host int64): per row the at most ``keep`` largest positive entries of ``low``,
    rows in order, each row's entries by decreasing value, ties by lower column (the order of
    :func:`otspec.tree._process._ranked` on each row; values are compared by their :func:`_order_key`, as the
    search orders them), and the number of positive entries left out (also noted on
    each row's prefix in ``owners``, when given).

    One partition of the whole block finds each row's ``keep``-th largest value; only the entries at or above it
    come to the host."""
    m, V = low.shape
    pos = low > 0
    npos = _count_positive(low, xp)
    dropped = _note_dropped(owners, npos, keep)
    if keep <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), dropped
    if keep < V and int(npos.max()) > keep:
        if xp is np:
            kth = np.partition(low, V - keep, axis=1)[:, V - keep]
        else:
            kth = xp.topk(low, keep, dim=1).values[:, -1]
        pos = pos & (low >= _key_edges(kth, xp)[0][:, None])      # every entry of the keep-th's key or above
    if xp is np:
        rows, cols = np.nonzero(pos)
        vals = low[rows, cols]
    else:
        rows, cols = (to_host(v).astype(np.int64) for v in xp.nonzero(pos))
        vals = to_host(low[pos])
    order = np.lexsort((cols, -_order_key(vals), rows))
    rows, cols = rows[order], cols[order]
    within = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
    ok = within < keep
    return rows[ok].astype(np.int64), cols[ok].astype(np.int64), dropped


def _slot_weights(slots: _Slots, process: str, u: _Prefix, p: float, draws) -> np.ndarray:
    """P(slot ``w`` holds ``ux``) for the slots ``w`` of depth ``|u| + 1``: the parent slot's weight times the
    probability that ``w``'s draw is ``x`` (``p = p(x | u)`` for i.i.d. children; ``draws[k]``, the law of the
    draw of the ``k``-th used rank at ``x``, without replacement)."""
    j = len(u.path)
    child_slots = slots.by_depth[j + 1]
    if process != "wor":
        return np.full(len(child_slots), u.A[0] * p)
    parent_pos, rank_col = slots.child_index(j)
    return u.A[parent_pos] * draws[rank_col]  # elementwise: the same products as one by one


def _child(slots: _Slots, process: str, cand: dict, k: int) -> _Prefix:
    """The prefix of candidate ``k`` of a block returned by :func:`_expand`."""
    u, x = cand["owner"][k], int(cand["x"][k])
    p = float(cand["p"][k])
    A = _slot_weights(slots, process, u, p, None if cand["dr"] is None else cand["dr"][:, k])
    return _Prefix(u.path + (x,), float(cand["Q"][k]), float(cand["pi"][k]), A, u.s + (p,),
                   {d: float(c[k]) for d, c in cand["caps"].items()})


def _children(slots: _Slots, process: str, cand: dict, ks: list) -> list:
    """The prefixes of candidates ``ks`` of one block of :func:`_expand` (host arrays, owners of one depth), as
    :func:`_child` makes each (the same slot weights: the same products, elementwise over the candidates); other
    blocks one by one."""
    owners = [cand["owner"][k] for k in ks]
    j = len(owners[0].path)
    fields = [cand[n] for n in ("x", "p", "Q", "pi")] + list(cand["caps"].values())
    if cand["dr"] is not None:
        fields.append(cand["dr"])
    if any(len(u.path) != j for u in owners) or not all(isinstance(f, np.ndarray) for f in fields):
        return [_child(slots, process, cand, k) for k in ks]
    kk = np.asarray(ks, dtype=np.int64)
    p = cand["p"][kk]
    if process != "wor":
        A = np.repeat((np.array([u.A[0] for u in owners]) * p)[:, None], len(slots.by_depth[j + 1]), axis=1)
    else:
        parent_pos, rank_col = slots.child_index(j)
        A = np.stack([u.A for u in owners])[:, parent_pos] * cand["dr"][:, kk].T[:, rank_col]
    keys = list(cand["caps"])
    caps = [dict(zip(keys, v)) for v in zip(*[c[kk].tolist() for c in cand["caps"].values()])] if keys else \
        [{} for _ in ks]
    return [_Prefix(u.path + (x,), Q, pi, a, u.s + (pn,), cp)                  # a: A's rows, as A[n]
            for u, x, pn, Q, pi, a, cp in zip(owners, cand["x"][kk].tolist(), p.tolist(), cand["Q"][kk].tolist(),
                                              cand["pi"][kk].tolist(), A, caps)]


def _child_pi(slots: _Slots, process: str, A: np.ndarray, s_all: np.ndarray, Pl, paths, *,
              keep_draws: bool = False):
    """``(pi, md, draws, pi_exact)`` for the children ``x`` of the prefixes ``paths`` of one depth ``j`` (rows as
    ``Pl``, their slot weights the rows of ``A`` and their draft path probabilities the rows of ``s_all``):
    :math:`\\pi(ux)`; ``md[d]``, the expected number of depth-``d`` slots below the slots holding ``ux``, for
    ``d >= j + 2``; without replacement the laws of the draws (:class:`_DrawLaws`, kept with ``keep_draws``)."""
    xp = _xp(Pl)
    dev = None if xp is np else _device(Pl)
    j = s_all.shape[1]
    ranks, C, beta = slots.incidence(j)
    depths = range(j + 2, slots.D + 1)

    def col(v):
        return v[:, None] if xp is np else xp.asarray(v, device=dev)[:, None]

    if process != "wor":
        md = {d: col(A @ beta[d].sum(axis=1)) * Pl for d in depths}
        return _iid_pi(slots, j, s_all, Pl), md, None, True
    need = slots.need[j]
    support = _count_positive(Pl, xp)
    for i in np.flatnonzero(support < need).tolist():
        raise _support_error("wor", need, paths[i], to_host(Pl[i]))
    draws = _DrawLaws(Pl, ranks, xp, fused=True, race=_WOR_RACE)
    W = A @ C                                                # (m, R)
    coef = {d: A @ beta[d] for d in depths}                  # depth-d slots below each child of each rank
    V = Pl.shape[1]
    if draws.fused:
        # one pass per row: every rank's law at an entry in registers, combined into pi and the slot counts
        m = Pl.shape[0]
        dummy = not hasattr(draws, "top")
        pi = np.empty((m, V))
        mds = np.empty((len(coef), m, V))
        rc = draws.race
        if rc is None:
            rargs = (np.zeros(m, bool), np.zeros((m, 1, 1)), np.zeros((m, 1)), np.ones(m), np.full((m, 1), -1),
                     np.zeros((m, 1, 1)))
        else:
            rargs = (rc.ok, rc.C, rc.theta, rc.pmax, rc.head, rc.HL)
        _K.wor_pi_kernel(draws.P, draws.t, draws.top1, draws.S1, draws.S2, np.asarray(ranks, dtype=np.int64),
                         np.ascontiguousarray(W), np.stack([coef[d] for d in depths]) if coef else
                         np.zeros((0, m, len(ranks))),
                         np.zeros((m, 1), np.int64) if dummy else np.ascontiguousarray(draws.top, dtype=np.int64),
                         np.zeros((m, 1)) if dummy else np.ascontiguousarray(draws.ptop), draws.tails(), pi, mds,
                         np.asarray(draws.kk, dtype=np.int64), *rargs)
        return pi, dict(zip(depths, mds)), (draws if keep_draws else None), draws.exact
    # one rank's law at a time (never all ranks held), on the host in blocks of columns that stay in cache
    step = V if (xp is not np or keep_draws) else max(1, min(V, _CHUNK_ENTRIES // max(1, Pl.shape[0])))
    pi = xp.empty_like(Pl) if step < V else None
    md = {d: xp.empty_like(Pl) for d in depths} if step < V else {}
    for v0 in range(0, V, step):
        v1 = min(V, v0 + step)
        pib, mdb = None, {}
        for k in range(len(ranks)):
            law = draws.law(k, v0, v1) if step < V else draws.law(k)
            if keep_draws:
                draws.kept[k] = law
            pib = col(W[:, k]) * law if pib is None else pib + col(W[:, k]) * law
            for d, c in coef.items():
                mdb[d] = col(c[:, k]) * law if d not in mdb else mdb[d] + col(c[:, k]) * law
        if step == V:
            pi, md = pib, mdb
        else:
            pi[:, v0:v1] = pib
            for d in depths:
                md[d][:, v0:v1] = mdb[d]
    return _clip1(pi, xp), md, (draws if keep_draws else None), draws.exact


def _union(a, n: int):
    """:math:`1 - (1 - a)^n = a \\sum_{i < n} (1 - a)^i` by Horner's rule: positive terms only, so accurate for
    tiny ``a`` too (no cancellation in ``1 - (1 - a)^n``)."""
    if n == 1:
        return a * 1.0
    r = 1.0 - a
    h = 1.0 + r
    for _ in range(n - 2):
        h *= r
        h += 1.0
    h *= a
    return h


def _iid_pi(slots: _Slots, j: int, s_all: np.ndarray, Pl):
    r""":math:`\pi(ux)` for every child ``x`` of each prefix ``u`` of depth ``j``, i.i.d. children:
    :math:`f = 1` at depth ``j + 1``, :math:`f(v) = 1 - \prod_{c} (1 - p(y_{i+1} \mid y_{1:i}) f(c))`,
    :math:`\pi = f(\text{root})`. Slots with the same subtree shape are evaluated once; ``1 - prod`` is summed
    as :math:`g_1 + (1 - g_1)(g_2 + (1 - g_2)(\dots))` over groups of equal children, each
    :math:`g = 1 - (1 - a)^n` by :func:`_union` (positive terms throughout), capped at 1. ``s_all[i]``: the draft's
    probabilities along prefix ``i``. Numpy: blocks of :data:`_CHUNK_ENTRIES` that stay in cache; a tensor:
    the whole array at once."""
    xp = _xp(Pl)
    levels, root = slots.iid_classes(j)
    m, V = Pl.shape
    if xp is np and _K.JIT:
        # the fused kernel: one pass over each row, every slot product in registers (the same operations)
        out = np.empty((m, V))
        _K.iid_pi_kernel(np.ascontiguousarray(Pl), np.ascontiguousarray(s_all, dtype=np.float64), j,
                         *_K.iid_program(levels, root), out)
        return out
    if xp is np:
        out = np.empty_like(Pl)
        cols = min(V, _CHUNK_ENTRIES)
        rows = max(1, _CHUNK_ENTRIES // cols)
    else:
        out, rows, cols = None, m, V
        if j and isinstance(s_all, np.ndarray):
            s_all = xp.asarray(s_all, device=_device(Pl))
    for c0 in range(0, m, rows):
        for v0 in range(0, V, cols):
            t = Pl[c0:c0 + rows, v0:v0 + cols]
            f = {k: _union(t, k[1]) if k[1] else xp.zeros_like(t) for k in levels[0]}
            for lev, lvl in enumerate(levels[1:], start=1):
                s = s_all[c0:c0 + rows, j - lev][:, None]        # slots at depth j - lev; children hold y_{j-lev+1}
                g = {}
                for k in lvl:
                    acc = None
                    for ck, cnt in reversed(k):
                        gk = _union(s * f[ck], cnt)
                        acc = gk if acc is None else gk + (1.0 - gk) * acc
                    g[k] = xp.zeros_like(t) if acc is None else acc
                f = g
            if xp is np:
                np.minimum(f[root], 1.0, out=out[c0:c0 + rows, v0:v0 + cols])
            else:
                out = _clip1(f[root], xp)
    return out


def _root_path_probability(shape, draft, path, *, process: str, prefix=()) -> tuple[float, bool]:
    """``(pi(path), exact)`` by the recursions of :func:`bound` (``"iid"``, ``"wor"``; the tests' route to
    compare with the realised trees enumerated)."""
    V = draft.vocab_size
    slots = _Slots(shape)
    if len(path) > slots.D:
        return 0.0, True
    laws = _ModelLaws(draft, draft, V, tuple(prefix))
    u = _Prefix((), 1.0, 1.0, np.ones(1), (), {})
    exact = True
    for j, x in enumerate(path):
        Pl = np.stack(laws([u.path])[0])
        pi, _md, draws, ex = _child_pi(slots, process, u.A[None, :], np.array([u.s]).reshape(1, j), Pl, [u.path],
                                       keep_draws=True)
        exact &= ex
        if j + 1 == len(path):
            return float(pi[0, x]), exact
        dr = None if draws is None else np.array([draws.at(k, np.zeros(1, np.int64), np.array([x]))[0]
                                                  for k in range(len(slots.ranks_below[j]))])
        A = _slot_weights(slots, process, u, float(Pl[0, x]), dr)
        u = _Prefix(u.path + (x,), 0.0, float(pi[0, x]), A, u.s + (float(Pl[0, x]),), {})
    return 1.0, exact


# --------------------------------------------------------------------------- laws of the models at prefixes
def _readonly_view(x: np.ndarray) -> np.ndarray:
    """A read-only view of ``x`` (``x`` itself is not changed)."""
    v = x.view()
    v.flags.writeable = False
    return v


class _Given:
    """A model whose next law is the array already returned (its check by :func:`otspec.models.next_law`, the
    same messages, without a second call of the model)."""

    def __init__(self, row):
        self.row = row

    def next_dist(self, prefix):
        return self.row


class _Unchecked:
    """The laws of one :meth:`_ModelLaws.unchecked` call read in place and not checked yet: ``entries`` of
    ``(model, row index, array)`` in the order :meth:`_ModelLaws.__call__` checks them."""

    def __init__(self, laws: _ModelLaws, paths: list):
        self.laws, self.paths = laws, paths
        self.entries: list = []

    def add(self, k: int, i: int, row: np.ndarray) -> None:
        self.entries.append((k, i, row))

    def resolve(self, chk) -> dict:
        """Check every pending law, in order: where ``chk`` (``(m, 2)``, the draft's and the target's totals of
        each row from the row kernels' pass, NaN where an entry is bad; None: none) accepts its total
        (:func:`otspec._validation.law_total_accepts`) the law is the array itself, as the check in place would give
        it; every other law is checked by :func:`otspec.models.next_law` (``in_place=True``) on the array already
        returned, which raises the error and message that the check on reading raises. Returns ``{(model, row):
        law}`` for the laws that that check copied (an entry flushed to 0): what was computed from those rows must
        be computed again from the copies. Empties the list."""
        laws, V = self.laws, self.laws.V
        copied = {}
        entries, self.entries = self.entries, []
        tot = None if chk is None else chk.tolist()      # the totals as Python floats (float(chk[i, k]), read once)
        for k, i, row in entries:
            if tot is not None and law_total_accepts(tot[i][k], V):
                continue
            name = ("draft", "target")[k]
            law = next_law(_Given(row), laws.ctx + self.paths[i], V, name, out=laws.blocks[k][i], in_place=True)
            if not np.shares_memory(law, row):
                copied[(k, i)] = law
        return copied


class _ModelLaws:
    """Draft and target laws at a batch of prefixes through the Model protocol (``next_dist``), each checked on
    reading (:func:`otspec.models.next_law`) and copied into a block of rows per model that the next call
    overwrites: the rows of a call are valid until the next call.

    The search (:func:`_sampled`) reads a frontier's laws before it asks for the next frontier's, and keeps
    nothing of them but what it computed (the union bound's reductions copy the rows they keep), and it expands
    each prefix once, so the laws need no memo: one frontier's ``2 m V`` entries are written and read where a
    cache of every law (:class:`otspec.tree._process.LawCache`) wrote each into fresh memory, mapped and zeroed
    by the system page by page, and read it back from memory (4 frontiers of 64 prefixes at ``V = 49,152``:
    50 MB written and read again against 201 MB). The copy itself stays: a model may return an array that it
    later overwrites (its own buffer, a view of one), which the bound must not read.

    But for a model that declares ``fresh_laws`` (:class:`otspec.models.Model`: no array it returned is written
    again), whose laws are read where they are, each checked in one read and not copied
    (:func:`otspec.models.next_law` with ``in_place=True``; a law with an entry to flush or refuse is copied as
    above): the target's where it declares it, the draft's where both declare it. Within a call the draft is
    called for every prefix before the target, so a draft's law read in place could be overwritten by a target
    that does not declare it and shares the draft's memory (one buffer behind both); the target's laws are read
    before either model is called again (the next call), so only the models' own promises are relied on. The
    blocks are still allocated, but untouched (no page mapped) unless a law is copied.

    :meth:`unchecked` is the same call with the check of the laws read in place left to the row kernels' own pass
    over them (:class:`_Unchecked`)."""

    def __init__(self, draft, target, V, ctx):
        self.models = (draft, target)
        self.V, self.ctx = V, ctx
        self.blocks = [np.empty((0, V)), np.empty((0, V))]
        self.calls = 0
        fresh = [getattr(m, "fresh_laws", False) is True for m in self.models]
        self.in_place = (fresh[0] and fresh[1], fresh[1])
        # otspec's own table models whose every law was checked when they were made (otspec.models.checked_tables:
        # set by their constructors only, never by a caller): those laws are read in place with no second check
        self.checked = tuple(checked_tables(m) or None for m in self.models)

    def unchecked(self, paths):
        """``(P rows, Q rows, pending)``: :meth:`__call__` where the laws read in place (``in_place``, numba
        installed) are not checked yet: each law that :func:`otspec.models.next_law` would check in place (a
        C-contiguous float64 array of shape ``(V,)``) is returned as it is (read-only) and listed in ``pending``
        (:class:`_Unchecked`, None where none is), which must be resolved before anything computed from the rows is
        used. A law of one of otspec's own table models that was checked when the model was made
        (:func:`otspec.models.checked_tables`: a row of one of its tables, each of which :func:`otspec.models.next_law`
        returns as it is) is returned as it is and not listed: its check is not done twice. Every other law is
        checked as :meth:`__call__` checks it, and an error (a refused law, a model's own)
        first resolves the laws pending before it, so the first law refused in the order of :meth:`__call__`
        (the draft's laws, then the target's) is the one reported, with its message."""
        if not (_LK.JIT and (self.in_place[0] or self.in_place[1])):
            P, Q = self(paths)
            return P, Q, None
        self.calls += 1
        V, ctx, n = self.V, self.ctx, len(paths)
        pending = _Unchecked(self, list(paths))
        add = pending.entries.append
        shape, f64, ndarray, view = (V,), _F64, np.ndarray, _readonly_view
        prefixes = [tuple(ctx + s) for s in paths]      # one tuple per path, handed to both models
        out = []
        for k, name in enumerate(("draft", "target")):
            if self.blocks[k].shape[0] < n:
                self.blocks[k] = np.empty((n, V))
            block, fresh, checked = self.blocks[k], self.in_place[k], self.checked[k]
            ask = self.models[k].next_dist
            rows = []
            keep = rows.append
            try:
                for i, s in enumerate(prefixes):
                    row = ask(s)
                    if fresh and type(row) is ndarray and row.shape == shape and row.dtype == f64:
                        flags = row.flags
                        if flags.c_contiguous:
                            if checked is None or (id(row) not in checked and id(row.base) not in checked):
                                add((k, i, row))
                            keep(view(row) if flags.writeable else row)
                            continue
                    keep(next_law(_Given(row), s, V, name, out=block[i], in_place=fresh))
            except Exception:
                pending.resolve(None)                # a law refused before this one is reported first
                raise
            out.append(rows)
        if not pending.entries:
            pending = None
        return out[0], out[1], pending

    def __call__(self, paths):
        self.calls += 1
        out = []
        for k, name in enumerate(("draft", "target")):
            if self.blocks[k].shape[0] < len(paths):
                self.blocks[k] = np.empty((len(paths), self.V))
            model, block, ctx, V, fresh = self.models[k], self.blocks[k], self.ctx, self.V, self.in_place[k]
            out.append([next_law(model, ctx + s, V, name, out=block[i], in_place=fresh) for i, s in enumerate(paths)])
        return out[0], out[1]                                # rows where they are (no stacking copy)


class _TreeAttentionLaws:
    """Draft and target laws at a batch of prefixes from decoding models (``score_tree``, e.g.
    :class:`otspec.decoding.HFCausalLM`): the prefixes and their ancestors as one tree, one tree-attention call
    per model; the context stays in each model's cache but for its last token (the root)."""

    def __init__(self, draft, target, ctx):
        self.models = (draft, target)
        self.ctx = np.asarray(ctx, dtype=np.int64)
        self.states: list = [None, None]
        self.calls = 0
        self.later: list = []      # (bad-row flags on the device, name, paths): read once by check_later

    def check_later(self) -> None:
        """Read the bad-row flags of the laws left on an accelerator (:func:`_check_tree_laws`), all in one host
        read, and raise for the first bad row (the calls' order, the draft's before the target's). Empties them."""
        later, self.later = self.later, []
        if not later:
            return
        import torch

        bad = torch.cat([f for f, _n, _p in later]).cpu().numpy()
        if not bad.any():
            return
        i = int(np.flatnonzero(bad)[0])
        for flags, name, paths in later:
            if i < flags.shape[0]:
                _check_tree_laws(bad[:0], [], True, name, self.ctx, paths, at=i)
            i -= flags.shape[0]

    def __call__(self, paths):
        self.calls += 1
        nodes = sorted({path[:k] for path in paths for k in range(1, len(path) + 1)}, key=lambda s: (len(s), s))
        index = {(): 0}
        parents, tokens = [-1], [-1]
        for i, s in enumerate(nodes, start=1):
            index[s] = i
            parents.append(index[s[:-1]])
            tokens.append(s[-1])
        rows = [index[s] for s in paths]
        out = []
        for k, lm in enumerate(self.models):
            state, pending = self.states[k], self.ctx[-1:]
            if state is None:
                state, pending = lm.new_state(), self.ctx
            laws = _tree_laws(lm, state, np.array(parents), np.array(tokens), pending)
            lm.select(state, 0, self.ctx.shape[0] - 1)
            self.states[k] = state
            got = [laws[r] for r in rows] if isinstance(laws, np.ndarray) else laws[_device_index(rows, laws)]
            own = callable(getattr(lm, "tree_logits", None))           # the softmax is _tree_laws' own
            name = ("draft", "target")[k]
            if own and not isinstance(laws, np.ndarray):    # on an accelerator: flags read with the bound's end
                self.later.append((laws[_device_index(rows, laws), 0].isnan(), name, paths))
            else:
                _check_tree_laws(laws, rows, own, name, self.ctx, paths)
            out.append(got)
        return out[0], out[1]

    def one(self, k: int):
        """The law of model ``k`` (0 draft, 1 target) after one path, as a ``path -> law`` callable."""
        return lambda path: self([tuple(path)])[k][0]


def _tree_laws(lm, state, parents, tokens, pending):
    """The laws at every node of a tree from a decoding model (the softmax of ``tree_logits`` in float64, as
    ``score_tree``; a model without ``tree_logits``: its own ``score_tree``): a tensor on the model's device when its
    logits are on an accelerator (the bound's arithmetic then runs there), else a numpy array. Not checked yet
    (:func:`_check_tree_laws`)."""
    if not callable(getattr(lm, "tree_logits", None)):
        return np.asarray(lm.score_tree(state, parents, tokens, pending=pending), dtype=np.float64)
    import torch

    laws = torch.softmax(lm.tree_logits(state, parents, tokens, pending=pending).to(torch.float64), dim=-1)
    return laws.numpy() if laws.device.type == "cpu" else laws


def _check_tree_laws(laws, rows: list, own: bool, name: str, ctx, paths: list, at: int | None = None) -> None:
    """Refuse the laws ``laws[rows]`` of one tree call (:func:`_tree_laws`) that are not laws, naming the first
    by its prefix (the context ``ctx`` and ``paths[i]``, the path of ``rows[i]``). ``own`` (the softmax of the
    logits in float64, done here): a row from finite logits is a law by construction (each entry ``exp(l_x - max l) / sum`` in
    ``[0, 1]``, finite, summing to 1 within a few ``V`` ulps), and a row from a NaN or ``+inf`` logit, or from no
    finite logit, is NaN in every entry (the max or the sum is NaN), so its first entry is read: one value per row
    (on an accelerator the flags stay there, :meth:`_TreeAttentionLaws.check_later`, which names row ``at``).
    Otherwise (a model's own ``score_tree``) every entry: finite, non-negative, each row's total within
    ``SIMPLEX_TOL`` of 1. Nothing is changed: the rows handed on are the model's, as before."""
    if own:
        bad = np.isnan(laws[rows, 0]) if at is None else np.ones(1, dtype=bool)
        if bad.any():
            i = int(np.flatnonzero(bad)[0]) if at is None else at
            raise ValueError(f"`{name}` gave no law after the prefix {tuple(int(t) for t in ctx) + tuple(paths[i])}: "
                             "its logits there hold a NaN or +inf, or no finite value")
        return
    X = np.asarray(laws)[rows]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(X).all(axis=1) & (X >= 0).all(axis=1)
        ok &= np.abs(X.sum(axis=1) - 1.0) <= SIMPLEX_TOL
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"`{name}.score_tree` gave no law after the prefix "
                         f"{tuple(int(t) for t in ctx) + tuple(paths[i])}: its row must be finite, non-negative and "
                         f"sum to 1 within {SIMPLEX_TOL:g}")


def _device_index(rows, X):
    """``rows`` (host ints) as an index array on ``X``'s device."""
    return namespace(X).asarray(rows, device=_device(X))


def _is_decoding_model(m) -> bool:
    return callable(getattr(m, "score_tree", None)) and callable(getattr(m, "new_state", None))


def _setup_models(draft, target, prefix):
    """``(V, ctx, laws)``: the Model protocol (``next_dist``) or two decoding models (``score_tree``)."""
    dec = (_is_decoding_model(draft), _is_decoding_model(target))
    if not any(dec):
        V = validate_model_pair(draft, target)
        ctx = validate_sequence(prefix, V, "prefix")
        return V, ctx, None
    if not all(dec):
        raise TypeError("`draft` and `target` must both be models with `next_dist` or both decoding models with "
                        f"`score_tree`, got {type(draft).__name__} and {type(target).__name__}")
    vs, vb = int(draft.vocab_size), int(target.vocab_size)
    if vs != vb:
        raise ValueError(f"`draft` and `target` must share one vocabulary, got vocab_size {vs} (draft) and {vb} "
                         "(target)")
    ctx = validate_sequence(prefix, vs, "prefix")
    if not ctx:
        raise ValueError("`prefix` must hold at least one token with decoding models (the root is scored after the "
                         "context's last token), got an empty prefix")
    return vs, ctx, _TreeAttentionLaws(draft, target, ctx)


def _validate_budget(budget, name: str, limit: int) -> int:
    b = validate_positive_int(budget, name)
    if b > limit:
        raise ValueError(f"`{name}` must be at most {limit}, got {b}")
    return b


def bound(shape, draft, target, *, process, prefix=(), budget: int = 256,
          batch: int = DEFAULT_BOUND_BATCH, method: str = "paths") -> TreeBound:
    r"""Upper bound on the expected accepted draft tokens of every lossless verifier of a draft-tree process.

    .. math::

        \mathbb E[\tau] \;\le\; \mathrm{OPT}_c \;\le\; B = \sum_{d=1}^{D} \min(b_1, \dots, b_d),
        \qquad b_d = \sum_{|y| = d} \min\big(Q(y), \pi(y)\big),

    :math:`Q(y)` the target's probability of the token path :math:`y` after
    the context and :math:`\pi(y)` the probability that :math:`y` is a root
    path of the realised tree. For i.i.d. children (``"iid"``), with
    :math:`f = 1` at the slots of depth :math:`d` and, for a slot :math:`v`
    of depth :math:`j` holding :math:`y_j`,

    .. math::

        f(v) = 1 - \prod_{c \text{ child slot of } v} \big(1 - p(y_{j+1} \mid y_{1:j})\, f(c)\big),
        \qquad \pi(y) = f(\text{root});

    without replacement (``"wor"``) the children of a node hold distinct
    tokens and :math:`f(v) = \sum_c P(\text{draw } r(c) = y_{j+1})\, f(c)`,
    :math:`r(c)` the child's rank. On a deterministic tree (``"topk"``,
    ``"eagle2"``) :math:`\pi \in \{0, 1\}` and
    :math:`B = \sum_{v \ne 0} Q(x_{1:d(v)})`, which every lossless verifier
    attains (the target-only rule).

    Anytime: prefixes are expanded (their draft and target laws read, one
    batched call per model for up to ``batch`` of them) in decreasing order
    of :math:`\min(Q, \pi)`, starting at the context. The paths of depth
    :math:`d'` below a prefix :math:`u` left unexpanded sum to at most
    :math:`\min(Q(u), m_{d'}(u))`, :math:`m_{d'}(u)` the expected number of
    depth-:math:`d'` slots below the slots that hold :math:`u` (which bounds
    :math:`\sum_y \pi(y)` over them); each expanded prefix's share is the
    smaller of that cap and the sum over its children. The value is an upper
    bound at every budget, never increases with it, and equals :math:`B`
    once every prefix with :math:`\min(Q, \pi) > 0` above depth :math:`D` is
    expanded (``complete``).

    Parameters
    ----------
    shape : TreeShape, sequence of rank paths or Eagle2Params
    draft, target : Model or LanguageModel
        Draft :math:`M_s` and target :math:`M_b` models on one vocabulary:
        both with ``vocab_size`` and ``next_dist(prefix)`` (one call per
        prefix), or both decoding models with ``score_tree``
        (:class:`otspec.decoding.HFCausalLM`, :class:`otspec.decoding.CallableLM`:
        each frontier is scored in one tree-attention call per model, the
        context kept in the cache).
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
    prefix : sequence of int, keyword-only
        The context (at least one token with decoding models).
    budget : int, keyword-only
        Prefixes to expand, the context included (1 to :data:`MAX_BOUND_BUDGET`;
        default 256). Unused by the deterministic processes, whose tree is
        built and scored whole.
    batch : int, keyword-only
        Prefixes scored per model call (1 to :data:`MAX_BOUND_BATCH`). The
        order of expansion does not depend on ``budget``, so a larger budget
        expands a superset of the prefixes.
    method : {"paths", "union"}, keyword-only
        ``"paths"`` (default): :math:`B` above. ``"union"``: the tighter
        :math:`B^* = \sum_d \min(b^*_1, \dots, b^*_d)`,
        :math:`b^*_d = \min_T [Q(T^c) + \Pi(T)] \le b_d` over sets
        :math:`T` of paths of length :math:`d`, :math:`\Pi(T)` the
        probability that the tree has some root path in :math:`T`
        (threshold sets swept; :math:`\Pi` exact for i.i.d. children and,
        where each node's ordered draws are enumerated (:math:`V \le 8`),
        without replacement, else an upper bound; :math:`B^* = \alpha_k` at depth 1
        with :math:`k` i.i.d. drafts; the same prefixes and budget;
        :mod:`otspec.tree._bound_union`, docs/theory/trees.rst, "A tighter
        bound: unions of root paths"). On deterministic trees
        :math:`B^* = B`.

    Returns
    -------
    TreeBound
        ``value``, the per-depth :math:`\hat b_d`, the remainder the budget
        left, and whether :math:`\pi` was exact.

    Raises
    ------
    TypeError, ValueError
        Bad models, shape, process or ``method`` (before any model call); laws of unequal
        vocabularies; ``budget`` or ``batch`` below 1 or above their limits;
        a ``"wor"`` shape with more ranks at a node than the vocabulary has
        tokens (before any model call) or than the draft's support at a
        prefix that the tree can hold (the message names the prefix), among
        the prefixes expanded: a prefix left unexpanded (by the budget, or
        with :math:`\min(Q, \pi) = 0`, e.g. a target probability of 0) is
        never read, and the bound is returned.

    Notes
    -----
    For ``"wor"``, :math:`P(\text{draw } r = y)` is computed exactly by
    enumerating the ordered draws when there are few (small vocabularies or
    supports); otherwise rank 0 is :math:`p`, rank 1 is the closed form
    :math:`p_y \sum_{x \ne y} p_x / (1 - p_x)`, and ranks :math:`r \ge 2` the
    exponential race, :math:`p_y \int_0^\infty e^{-p_y t} P(N_{-y}(t) = r)\,
    dt` (:math:`N_{-y}(t)` the number of other clocks :math:`\mathrm{Exp}(p_x)`
    rung by ``t``), by a checked quadrature to a relative
    1e-12 (docs/theory/trees.rst, "An upper bound at any vocabulary"). A row whose
    quadrature fails its checks would keep the upper bound
    :math:`\min(p_y / (1 - M_r(y)), 1 - P(\text{draw } 0 = y)
    - P(\text{draw } 1 = y))`, :math:`M_r(y)` the mass of the ``r`` most
    likely other tokens: an upper bound on :math:`\pi` keeps the value an
    upper bound, and ``pi_exact`` says which was used.

    On the host with numba (the ``fast`` extra) each expanded prefix's draft
    and target laws are read where they are (no stacked copy of a frontier),
    in one fused kernel call per prefix that computes :math:`\pi` of every
    child (the i.i.d. recursion; without replacement the laws of every used
    rank's draw, combined before the sum), its minimum with :math:`Q` and
    every row sum the bound needs; without numba the same arithmetic runs as
    whole ``(prefixes, V)`` numpy arrays in cache-sized blocks (the two agree
    to a relative 1e-12: the kernels sum over lanes, numpy pairwise). With
    decoding models whose logits are on an accelerator the laws stay there as
    float64 tensors and the same arithmetic runs on the device, batched over
    each frontier's rows (one pass of a few kernels per depth): every row sum
    and the candidates' values come back in one read per call (the depths
    of a frontier read together; the last expanded depth's, whose row sums
    no later choice reads, with a later frontier's read or once after the
    search); without
    replacement the race's power sums are taken there too (one more read,
    which at the last depth also names the rows whose lower bound on
    :math:`\pi` leaves entries undecided), its quadrature runs on the host on
    those small arrays (for those rows alone), and its Taylor sums by
    Horner's rule over the block to the largest degree a row needs (the
    routes agree to 1e-12; a depth whose rows' draws are enumerated or whose
    race is refused is read once and takes the host's route).

    See Also
    --------
    otspec.tree.optimum : :math:`\mathrm{OPT}_1` and :math:`\mathrm{OPT}_c`, exact LPs at small vocabularies.
    otspec.tree.value : one verifier's exact :math:`\mathbb E[\tau]`.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, eq. (3) and Theorem 1 (on one chain :math:`B = \sum_d (1 -
       \mathrm{TV}(P_{1:d}, Q_{1:d}))`, the block bound, attained by block verification).
    .. [2] Miao et al., "SpecInfer", arXiv:2305.09781, §3 (i.i.d. children); Chen et al., "Sequoia",
       arXiv:2402.12374, §3.2 (children drawn without replacement); Li et al., "EAGLE-2",
       arXiv:2406.16858, §4.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import TreeShape, bound
    >>> p, q = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    >>> bound(TreeShape.chains(1, 2), p, q, process="iid").value   # (1 - TV(P_1, Q_1)) + (1 - TV(P_2, Q_2))
    1.4375
    >>> r = bound(TreeShape([(0,), (1,)]), p, q, process="iid")     # sum_x min(q(x), 1 - (1 - p(x))**2)
    >>> r.value, r.complete, r.pi_exact
    (1.0, True, True)
    >>> p, q = MemorylessModel([0.5, 0.25, 0.25]), MemorylessModel([0.2, 0.4, 0.4])
    >>> s = TreeShape([(0,), (1,)])        # two i.i.d. root drafts: B = 1, B* = SpecTr's alpha_2(p, q)
    >>> bound(s, p, q, process="iid").value, round(bound(s, p, q, process="iid", method="union").value, 12)
    (1.0, 0.95)
    """
    if not isinstance(method, str):
        raise TypeError(f"`method` must be a str ('paths' or 'union'), got {type(method).__name__}")
    if method != "paths" and method not in BOUND_METHODS:
        names = " or ".join(repr(m) for m in ("paths", *sorted(BOUND_METHODS)))
        raise ValueError(f"`method` must be {names}, got {method!r}")
    shape = as_tree_shape(shape, process)
    process = validate_process(process, shape)
    V, ctx, tree_laws = _setup_models(draft, target, prefix)
    budget = _validate_budget(budget, "budget", MAX_BOUND_BUDGET)
    batch = _validate_budget(batch, "batch", MAX_BOUND_BATCH)
    if batch * V > _MAX_FRONTIER_ENTRIES:
        raise ValueError(f"`batch` * V = {batch} * {V} law entries per call is above the limit "
                         f"{_MAX_FRONTIER_ENTRIES}; pass a smaller `batch`")
    if shape.n < 1:
        raise ValueError("`shape` must have at least one draft node, got the root alone")
    if process in DETERMINISTIC_PROCESSES:
        if tree_laws is None:
            dl, tl = LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target")
        else:
            dl, tl = tree_laws.one(0), tree_laws.one(1)
        res = _deterministic(shape, dl, tl, process, budget)
        if tree_laws is not None:
            tree_laws.check_later()
        return res if method == "paths" else dataclasses.replace(res, method=method)   # B* = B, attained
    if process == "wor":
        for _par, _ch, ranks in _child_groups(shape):
            if max(ranks) + 1 > V:
                raise ValueError(
                    f"process='wor' cannot draw the shape: a node has a child of rank {max(ranks)}, which needs "
                    f"{max(ranks) + 1} distinct tokens, but the vocabulary has V={V}"
                )
    laws = _ModelLaws(draft, target, V, ctx) if tree_laws is None else tree_laws
    run = _sampled if method == "paths" else BOUND_METHODS[method]
    if tree_laws is None:
        return run(_Slots(shape), process, laws, budget, batch)
    try:
        res = run(_Slots(shape), process, laws, budget, batch)
    except Exception:
        tree_laws.check_later()         # a bad law left on an accelerator is reported first
        raise
    tree_laws.check_later()
    return res


class _Search:
    """The anytime search of :func:`bound` for one context: the prefixes expanded, the candidate blocks left, the
    next frontier. A driver scores each frontier, expands it (:func:`_expand`, :func:`_expand_rows`,
    :func:`_expand_t`: rows of several searches may share one call; each prefix keeps its own results) and calls
    :meth:`absorb` with each call's candidates and :meth:`advance`; :meth:`result` gives the bound."""

    def __init__(self, slots: _Slots, process: str, budget: int, batch: int):
        self.slots, self.process, self.budget, self.batch = slots, process, budget, batch
        self.root = _Prefix((), 1.0, 1.0, np.ones(1), (), {})
        self.root.order = 0
        self.expanded = [self.root]
        self.blocks: list = []       # candidate blocks of _expand; `alive` marks the unexpanded ones
        self.pi_exact = True
        self.frontier = [self.root]  # to expand next (empty: done)
        self.calls = 0

    @property
    def left(self) -> int:
        """Prefixes the budget still allows, counted when the frontier was taken (every child per row then)."""
        return self.budget - len(self.expanded)

    def absorb(self, cand, pi_exact: bool) -> None:
        """Take one expansion call's candidates (those whose owner is this search's) and exactness."""
        self.pi_exact &= bool(pi_exact)
        if cand is None:
            return
        cand["alive"] = np.ones(cand["x"].shape[0], dtype=bool)
        cand["depth"] = np.array([len(u.path) + 1 for u in cand["owner"]])
        cand["order"] = np.array([u.order for u in cand["owner"]])
        self.blocks.append(cand)

    def advance(self) -> list:
        """After the frontier's expansion: the next frontier, the largest min(Q, pi) first (compared by
        :func:`_order_key`, so that every route expands the same prefixes; ties by depth, the parent's order of
        expansion, token: an order that does not depend on the budget, so a larger budget
        expands a superset); empty when the budget is spent or no candidate is left."""
        self.calls += 1
        left = self.left
        blocks = self.blocks
        alive = [np.flatnonzero(c["alive"]) for c in blocks]   # each block's unexpanded candidates
        if left <= 0 or sum(a.size for a in alive) == 0:
            self.frontier = []
            return self.frontier
        bid = np.concatenate([np.full(a.size, b, dtype=np.int64) for b, a in enumerate(alive)])
        kid = np.concatenate(alive)
        pr = np.concatenate([c["pr"][a] for c, a in zip(blocks, alive)])
        dep = np.concatenate([c["depth"][a] for c, a in zip(blocks, alive)])
        order = np.concatenate([c["order"][a] for c, a in zip(blocks, alive)])
        x = np.concatenate([c["x"][a] for c, a in zip(blocks, alive)])
        take = min(self.batch, left)
        sel = np.lexsort((x, order, dep, -_order_key(pr)))[:take]
        pb, pk = bid[sel], kid[sel]                       # the picks' blocks and candidates, in the order taken
        made: list = [None] * sel.size
        for b in dict.fromkeys(pb.tolist()):              # each block's picks made together (their places in made)
            ns = np.flatnonzero(pb == b)
            for n, c in zip(ns.tolist(), _children(self.slots, self.process, blocks[b], pk[ns].tolist())):
                made[n] = c
            blocks[b]["alive"][pk[ns]] = False
        first = len(self.expanded)
        for n, (b, k, c) in enumerate(zip(pb.tolist(), pk.tolist(), made)):
            blocks[b]["owner"][k].children.append(c)
            c.order = first + n
        self.expanded.extend(made)
        frontier = sorted(made, key=lambda u: len(u.path))  # stable: the order of expansion within a depth
        self.frontier = frontier
        return frontier

    def unexpanded_caps(self) -> dict:
        """``{id(prefix): {d: list}}``: the caps at depth ``d`` of each prefix's candidate children left unexpanded
        (what :func:`_share` adds for them). A block's candidates of one owner are contiguous (rows in order)."""
        out: dict = {}
        for c in self.blocks:
            ks = np.flatnonzero(c["alive"])
            if ks.size == 0 or not c["caps"]:
                continue
            order = c["order"][ks]
            starts = np.flatnonzero(np.r_[True, order[1:] != order[:-1]]).tolist()
            vals = {d: v[ks].tolist() for d, v in c["caps"].items()}
            owners = c["owner"]
            for a, b in zip(starts, starts[1:] + [ks.size]):
                got = out.setdefault(id(owners[int(ks[a])]), {})
                for d, v in vals.items():
                    got.setdefault(d, []).extend(v[a:b])
        return out

    def result(self, n_calls: int | None = None) -> TreeBound:
        D, expanded = self.slots.D, self.expanded
        dropped = sum(u.dropped for u in expanded)
        complete = all(not c["alive"].any() for c in self.blocks) and dropped == 0
        lower = np.array([math.fsum([u.exact for u in expanded if len(u.path) == d - 1]) for d in range(1, D + 1)])
        opened = self.unexpanded_caps()
        hat = np.array([_share(self.root, d, opened) for d in range(1, D + 1)])
        if complete:
            # every path with min(Q, pi) > 0 is counted exactly: the exact part is b_d too (without the rounding of
            # subtracting the caps again, which would leave a remainder of 1e-17)
            hat = np.minimum(hat, lower)
        value = math.fsum(np.minimum.accumulate(hat).tolist())
        low_value = math.fsum(np.minimum.accumulate(lower).tolist())
        hat.setflags(write=False)
        lower.setflags(write=False)
        return TreeBound(
            value=value, per_depth=hat, lower_per_depth=lower, remainder=max(0.0, value - low_value),
            n_expanded=len(expanded), n_calls=self.calls if n_calls is None else n_calls, complete=bool(complete),
            pi_exact=bool(self.pi_exact), process=self.process, budget=self.budget,
        )


def _laws_block(Pl, Ql, rows=None):
    """``(run, P, Q)``: a frontier's laws as the expansion reads them and the expansion to run: host rows for the
    fused row kernels (:func:`_expand_rows`), else one float64 block, numpy (:func:`_expand`) or a tensor where it
    is (:func:`_expand_t`). ``rows``: :func:`_host_rows` of the same laws where the caller has it (None: taken
    here)."""
    rows = _host_rows(Pl, Ql) if rows is None else rows
    if rows is not None:
        return _expand_rows, rows[0], rows[1]
    Pl, Ql = _block(Pl), _block(Ql)
    xp = _xp(Pl)
    return (_expand if xp is np else _expand_t), _as_laws(Pl, xp), _as_laws(Ql, xp)


def _depth_runs(frontier: list) -> list:
    """``(a, b)`` of each run of equal depth in a frontier sorted by depth."""
    starts = [0] + [i for i in range(1, len(frontier)) if len(frontier[i].path) != len(frontier[i - 1].path)]
    return list(zip(starts, starts[1:] + [len(frontier)]))


#: Law entries (rows times ``V``) of the last-depth expansions that the torch route of :func:`_sampled` may hold
#: unread (each holds a few ``(rows, V)`` temporaries until its reads); above it they are read with the next round.
_DEFERRED_ENTRIES = 2**24


def _sampled(slots: _Slots, process: str, laws, budget: int, batch: int, on_rows=None) -> TreeBound:
    """The anytime search for one context; ``on_rows(prefixes, P, Q, candidates)`` (optional) sees every block of
    expanded rows with its laws (the union bound's reductions, :mod:`otspec.tree._bound_union`).

    On the torch route every depth's reads are shared (each round one read for all of them), and the expansions of
    the last expanded depth (``D - 1``: their row sums feed the value only, never a candidate, so no later choice
    waits for them) are not read when they are made: they advance in the rounds of later frontiers, and whatever
    is left of them is read after the search (every round one read for all): an i.i.d. bound of a depth-2 shape
    reads once for the context and once at the end, not once per call. The same expansions on the same tensors:
    the same values, bit for bit, read at other times (at most :data:`_DEFERRED_ENTRIES` law entries held)."""
    search = _Search(slots, process, budget, batch)
    frontier = search.frontier
    reads = _Reads([])
    held: list = []                        # (generator index, entries) of the last-depth expansions not read yet
    while frontier:
        # expand the frontier: one batched call per model, its rows grouped by depth (contiguous blocks) for the
        # recursions; the laws as numpy arrays or as tensors on the models' device (kept there)
        paths = [u.path for u in frontier]
        pending = None
        if isinstance(laws, _ModelLaws):
            Pl, Ql, pending = laws.unchecked(paths)
        else:
            Pl, Ql = laws(paths)
        host = _host_rows(Pl, Ql)          # the rows for the fused kernels, taken once per frontier
        fused = host is not None and (process == "iid" or (
            on_rows is None and len(paths[0]) == len(paths[-1]) and len(paths[0]) + 1 == slots.D))
        if pending is not None and not fused:
            Pl, Ql, _ = _checked_rows(pending, None, Pl, Ql)  # no kernel checks them in its pass: checked apart
            pending, host = None, None
        run, Pl, Ql = _laws_block(Pl, Ql, host)
        left = search.left
        runs = _depth_runs(frontier)
        if pending is not None:             # the fused kernels check the rows in their pass, then the laws resolved
            _fused_checked(slots, process, frontier, runs, pending, Pl, Ql, left, search, on_rows)
            frontier = search.advance()
            continue
        if run is _expand_t:
            ids = reads.add([_expand_t_steps(slots, process, frontier[a:b], Pl[a:b], Ql[a:b], left) for a, b in runs])
            last = [len(frontier[a].path) + 1 >= slots.D and on_rows is None for a, _ in runs]
            held += [(i, (b - a) * Pl.shape[1]) for i, z, (a, b) in zip(ids, last, runs) if z]
            need = [i for i, z in zip(ids, last) if not z]
            if sum(n for _, n in held) > _DEFERRED_ENTRIES:        # too much held: read it with these rounds
                need += [i for i, _ in held]
                held = []
            got = dict(zip(need, reads.until(need)))
        for k, (a, b) in enumerate(runs):
            if run is _expand_t:
                if ids[k] not in got:
                    continue                  # read later (absorbed after the search)
                cand, ex, _drop = got.pop(ids[k])
            else:
                cand, ex, _drop = run(slots, process, frontier[a:b], Pl[a:b], Ql[a:b], left)
            search.absorb(cand, ex)
            if on_rows is not None:
                on_rows(frontier[a:b], Pl[a:b], Ql[a:b], cand)
        if run is _expand_t:
            for cand, ex, _drop in got.values():                    # held from earlier frontiers, read now
                search.absorb(cand, ex)
        frontier = search.advance()
    if held:
        for cand, ex, _drop in reads.until([i for i, _ in held]):
            search.absorb(cand, ex)
    return search.result(laws.calls)


def _checked_rows(pending: _Unchecked, chk, Pl: list, Ql: list):
    """``(P rows, Q rows, copied)`` once the laws ``pending`` are resolved (:meth:`_Unchecked.resolve` with the
    kernels' totals ``chk``, None: each checked apart): the rows a check copied replaced by their copies, and the
    ``(model, row)`` of those."""
    copied = pending.resolve(chk)
    if copied:
        Pl, Ql = list(Pl), list(Ql)
        for (k, i), law in copied.items():
            (Pl, Ql)[k][i] = law
    return Pl, Ql, copied


def _fused_checked(slots: _Slots, process: str, frontier: list, runs: list, pending: _Unchecked, Pl: list, Ql: list,
                   left: int, search, on_rows) -> None:
    """One frontier's expansions by :func:`_expand_rows` with the laws' check in the kernels' pass: every run
    expanded, then the laws resolved in the order of the check on reading (the first refused raises its error and
    message before anything computed is absorbed), the runs with a row that the check copied (an entry flushed)
    expanded again from the copies, then everything absorbed in order."""
    if process != "iid":        # one run, of the last depth (the check resolved in _wor_rows)
        got = _expand_rows(slots, process, frontier, Pl, Ql, left, resolve=pending.resolve)
        search.absorb(got[0], got[1])
        return
    m = len(frontier)
    chk = np.full((m, 2), np.nan)
    got = [_expand_rows(slots, process, frontier[a:b], Pl[a:b], Ql[a:b], left, chk=chk[a:b]) for a, b in runs]
    Pl, Ql, copied = _checked_rows(pending, chk, Pl, Ql)
    if copied:
        redo = {i for _k, i in copied}
        got = [_expand_rows(slots, process, frontier[a:b], Pl[a:b], Ql[a:b], left)
               if any(a <= i < b for i in redo) else g for g, (a, b) in zip(got, runs)]
    for (cand, ex, _drop), (a, b) in zip(got, runs):
        search.absorb(cand, ex)
        if on_rows is not None:
            on_rows(frontier[a:b], Pl[a:b], Ql[a:b], cand)


def _share(u: _Prefix, d: int, opened: dict) -> float:
    r"""Upper bound on the sum over the paths of length ``d`` below ``u`` of min(Q, pi).

    Below depth ``|u| + 1`` each child ``x`` of ``u`` adds its cap :math:`\mathrm{cap}_d(ux)` (an upper bound on
    what lies below it) or, expanded, its own share: the sum (``math.fsum``, rounded once) of ``u.rest[d]`` (the
    caps of the children that were not candidates, summed in the expansion's pass), the caps of the candidates
    left unexpanded (``opened``: :meth:`_Search.unexpanded_caps`) and the expanded children's shares. Nonnegative
    terms only, so the sum's rounding is relative to it: formed as the row sum of every cap minus the expanded
    children's caps, it kept the row sum's rounding, relative to the row sum (a remainder of 1e-11 under caps of 1
    off by 2e-16, the numpy and torch routes 3e-5 apart, their row sums rounded in different orders)."""
    j = len(u.path)
    if d == j + 1:
        inner = u.exact
    else:
        terms = [u.rest.get(d, 0.0)]
        terms += opened.get(id(u), {}).get(d, [])
        terms += [_share(c, d, opened) for c in u.children]
        inner = math.fsum(terms)
    cap = u.caps.get(d, math.inf)
    return min(cap, inner)


def _deterministic(shape, dl, tl, process, budget) -> TreeBound:
    tree = _topk_tree(shape, dl) if process == "topk" else _eagle2_tree(shape, dl)
    paths = tree.paths()
    D = int(tree.max_depth)
    Qp = {(): 1.0}
    per = [[] for _ in range(D)]
    for path in paths[1:]:
        Qp[path] = Qp[path[:-1]] * float(tl(path[:-1])[path[-1]])
        per[len(path) - 1].append(Qp[path])
    b = np.array([math.fsum(t) for t in per])
    value = math.fsum(b.tolist())
    b.setflags(write=False)
    n_internal = len({path[:-1] for path in paths[1:]})
    return TreeBound(value=value, per_depth=b, lower_per_depth=b, remainder=0.0, n_expanded=n_internal,
                     n_calls=n_internal, complete=True, pi_exact=True, process=process, budget=budget)
