r"""Private helpers: the coverage function :math:`g(A) = 1 - (1 - p(A))^k` and its base polytope.

Everything here works on a *block*: a set ``D`` of tokens (given by their
draft masses ``pD``, all positive) that sits in front of the tokens of mass
``b`` (the tokens that come after ``D`` in a chain). The block function is
the minor

.. math::

    g_D(A) = g(T \cup A) - g(T) = a^k - (a - p(A))^k, \qquad a = p(D) + b,

where ``T`` is the set of tokens before ``D`` (so :math:`1 - p(T) = a`).
With ``b = 0`` and ``D`` the whole support this is ``g`` itself.

Numerics: every quantity is computed from *suffix* masses (the mass at or
after a position, summed from the end) and per-element increments
:math:`c^k - (c - x)^k = -c^k \operatorname{expm1}(k \log1p(-x/c))`, which
keep full relative accuracy where ``p(A)`` is close to 1 and ``k`` is large
(``g`` is then nearly flat and ``1 - (1 - P)^k`` would lose everything).
Set functions of prefixes are sums of these increments, never differences
of two large numbers.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "increments",
    "suffix_masses",
    "vertex",
    "prefix_slack",
    "saturation_fill",
    "tight_chain",
    "exit_ratio",
    "max_violation",
]


def suffix_masses(pD: np.ndarray, b: float) -> np.ndarray:
    """``c[j] = b + sum(pD[j:])`` for ``j = 0..m`` (length ``m + 1``, ``c[m] = b``)."""
    m = pD.shape[0]
    c = np.empty(m + 1)
    c[m] = 0.0
    if m:
        c[:m] = np.cumsum(pD[::-1])[::-1]
    c += b
    return c


def increments(x: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    r"""``c**k - (c - x)**k`` elementwise, with full relative accuracy (``0 <= x <= c``)."""
    out = np.zeros(x.shape[0])
    pos = c > 0
    if not np.any(pos):
        return out
    cp = c[pos]
    ratio = np.minimum(x[pos] / cp, 1.0)
    with np.errstate(divide="ignore"):
        t = np.log1p(-ratio)
    t *= k
    np.expm1(t, out=t)
    out[pos] = -t * cp**k
    return out


def vertex(pD: np.ndarray, b: float, k: int) -> np.ndarray:
    r"""Greedy vertex of :math:`B(g_D)` for the order in which ``pD`` is given.

    The ``j``-th token gets :math:`g_D(\text{first } j) - g_D(\text{first } j - 1)
    = c_j^k - (c_j - p_j)^k` with :math:`c_j` the mass at or after position ``j``
    (plus ``b``): the chance that token ``j`` is drafted and none before it is.
    """
    c = suffix_masses(pD, b)
    return increments(pD, c[:-1], k)


def prefix_slack(pD: np.ndarray, wD: np.ndarray, b: float, k: int, order: np.ndarray):
    r"""Slacks :math:`g_D(\text{first } j) - w(\text{first } j)` of the prefixes of ``order``.

    Returns ``(slack, v)`` with ``slack`` of length ``m + 1`` (``slack[0] = 0``)
    and ``v`` the greedy vertex of ``order`` (in order positions).
    """
    v = vertex(pD[order], b, k)
    s = np.empty(v.shape[0] + 1)
    s[0] = 0.0
    np.cumsum(v - wD[order], out=s[1:])
    return s, v


def _ratio_desc(pD: np.ndarray, wD: np.ndarray) -> np.ndarray:
    # minimisers of g_D - w are prefixes of this order (ties: whole groups)
    return np.argsort(-(wD / pD), kind="stable")


def max_violation(pD: np.ndarray, wD: np.ndarray, b: float, k: int) -> float:
    r"""Largest :math:`w(A) - g_D(A)` over all ``A`` (a prefix scan), and the total gap.

    ``w`` lies in :math:`B(g_D)` iff the returned value is ``<= 0`` and
    :math:`w(D) = g_D(D)`; the function returns
    ``max(max_A (w(A) - g_D(A)), |w(D) - g_D(D)|)``.
    """
    order = _ratio_desc(pD, wD)
    s, _ = prefix_slack(pD, wD, b, k, order)
    return float(max(-s.min(), abs(s[-1])))


def saturation_fill(pD, b, k, z0, upper, visit) -> np.ndarray:
    r"""Greedy fill of the polymatroid :math:`P(g_D) \cap \{z \le u\}` from ``z0``.

    Visit the tokens in ``visit`` order and raise each :math:`z(e)` by
    :math:`\min(u(e) - z(e), \operatorname{sat}(e))`, with the saturation
    capacity :math:`\operatorname{sat}(e) = \min_{A \ni e} g_D(A) - z(A)`.
    By the prefix structure, the minimising ``A`` is ``e`` together with a
    prefix of the other tokens sorted by ``z/p`` descending, so each capacity
    is one sort and one scan. Whatever the visiting order, the result is a
    maximal point of the polymatroid (Edmonds' greedy algorithm).
    """
    z = np.array(z0, dtype=np.float64)
    m = pD.shape[0]
    idx = np.arange(m)
    for e in visit:
        room = upper[e] - z[e]
        if not room > 0:
            continue
        others = idx[idx != e]
        po = pD[others]
        o = np.argsort(-(z[others] / po), kind="stable")
        po = po[o]
        pe = pD[e]
        # prefix slacks of the others, with e (and b) counted after them
        c = suffix_masses(po, b + pe)
        v = increments(po, c[:-1], k)
        slack = np.empty(m)
        slack[0] = 0.0
        np.cumsum(v - z[others][o], out=slack[1:])
        # marginal of e after each prefix: c_i^k - (c_i - p_e)^k, c_i = mass from e on
        marg = increments(np.full(m, pe), c, k)
        sat = float(np.min(slack + marg)) - z[e]
        if sat > 0:
            z[e] += min(room, sat)
    return z


def tight_chain(pD, xD, b, k, tol):
    """Order by ``x/p`` descending and the positions ``j`` whose prefix is tight (``slack <= tol``)."""
    order = _ratio_desc(pD, xD)
    s, v = prefix_slack(pD, xD, b, k, order)
    tight = np.flatnonzero(s[1:] <= tol) + 1
    return order, s, v, tight


def exit_ratio(pD, v, d, b, k, tol, max_iter=60):
    r"""Largest ``t`` with ``v + t d`` in :math:`B(g_D)` (``v`` a vertex, ``d(D) = 0``).

    .. math::

        t^* = \min_{A:\ d(A) > 0} \frac{g_D(A) - v(A)}{d(A)},

    by Dinkelbach iterations, each a prefix scan of ``g_D - (v + t d)``.
    The scan treats slacks above ``-tol`` as non-negative.
    """
    pos = d > 0
    # singletons give a valid starting upper bound
    gs = increments(pD[pos], np.full(int(pos.sum()), pD.sum() + b), k)
    t = float(np.min((gs - v[pos]) / d[pos]))
    for _ in range(max_iter):
        w = v + t * d
        order = _ratio_desc(pD, w)
        s, vw = prefix_slack(pD, w, b, k, order)
        j = int(np.argmin(s))
        if s[j] >= -tol:
            break
        A = order[:j]
        num = float(np.sum(vw[:j] - v[A]))
        den = float(np.sum(d[A]))
        if not den > 0:
            break
        t_new = num / den
        if not t_new < t:
            break
        t = t_new
    return t


# ---------------------------------------------------------------------------
# Carathéodory decomposition of a point of B(g_D) into priority orders
# ---------------------------------------------------------------------------


def block_total(pD: np.ndarray, b: float, k: int) -> float:
    r""":math:`g_D(D) = a^k - b^k` with :math:`a = p(D) + b`, accurately."""
    P = float(pD.sum())
    return float(increments(np.array([P]), np.array([P + b]), k)[0])


def exit_set(pD, v, d, b, k, tol, max_iter=100):
    r"""Exit ratio and exit set of the ray ``v + t d`` from :math:`B(g_D)`.

    .. math::

        t^* = \min_{A:\ d(A) > 0} \frac{g_D(A) - v(A)}{d(A)}

    by Dinkelbach iterations (each a prefix scan of ``g_D - (v + t d)``),
    started from the best singleton. Returns ``(t, mask)`` with ``mask`` the
    minimising set (non-empty, proper, ``d(A) > 0``).
    """
    m = pD.shape[0]
    pos = np.flatnonzero(d > 0)
    gs = increments(pD[pos], np.full(pos.shape[0], pD.sum() + b), k)
    ratios = (gs - v[pos]) / d[pos]
    i = int(np.argmin(ratios))
    t = float(ratios[i])
    mask = np.zeros(m, dtype=bool)
    mask[pos[i]] = True
    for _ in range(max_iter):
        w = v + t * d
        order = _ratio_desc(pD, w)
        s, vw = prefix_slack(pD, w, b, k, order)
        j = int(np.argmin(s[1:m])) + 1 if m > 1 else 0
        if j == 0 or s[j] >= -tol:
            break
        A = order[:j]
        den = float(np.sum(d[A]))
        if not den > 0:
            break
        t_new = float(np.sum(vw[:j] - v[A])) / den
        if not t_new < t:
            break
        t = t_new
        mask = np.zeros(m, dtype=bool)
        mask[A] = True
    return t, mask


def couple(parts):
    """Quantile coupling of block mixtures given in chain order.

    ``parts`` is a list of ``(weights, orders)`` per block (``orders`` a list
    of index arrays). Component ``i`` of the result concatenates, for every
    block, the component whose cumulative-weight interval holds the segment
    ``i``; the law of the selected token only depends on each block's
    marginal mixture, so any coupling is exact.
    """
    if len(parts) == 1:
        return parts[0]
    cums = [np.cumsum(w) for w, _ in parts]
    for c in cums:
        c[-1] = 1.0
    brk = np.unique(np.concatenate(cums))
    brk = brk[brk > 0]
    lo = 0.0
    weights, orders = [], []
    for hi in brk:
        if hi - lo <= 0:
            continue
        mid = 0.5 * (lo + hi)
        pieces = []
        for (_, ords), c in zip(parts, cums):
            i = min(int(np.searchsorted(c, mid)), len(ords) - 1)
            pieces.append(ords[i])
        weights.append(hi - lo)
        orders.append(np.concatenate(pieces))
        lo = hi
    return np.array(weights), orders


def decompose_block(idx, pD, x, b, k, tol, budget):
    r"""Write ``x`` (a point of :math:`B(g_D)`) as a mixture of priority orders of ``D``.

    ``idx`` are the token ids of ``D``; returns ``(weights, orders)`` with
    each order an array of token ids. Tight prefixes split the block into
    independent sub-blocks; otherwise one Carathéodory step moves from the
    vertex ``v`` of the ``x/p``-descending order through ``x`` to the
    boundary ``y = v + t d`` and records the new tight set, so that
    ``x = (1 - 1/t) v + (1/t) y``. ``budget`` is a one-element list counting
    the remaining Carathéodory steps (shared across the recursion).
    """
    m = pD.shape[0]
    if m == 1:
        return np.ones(1), [idx]
    total = block_total(pD, b, k)
    x = np.maximum(x, 0.0)
    sx = float(x.sum())
    if sx > 0:
        x = x * (total / sx)
    else:
        x = np.full(m, total / m)
    atol = tol * max(total, np.finfo(float).tiny)
    order = _ratio_desc(pD, x)
    s, v = prefix_slack(pD, x, b, k, order)
    tight = np.flatnonzero(s[1:m] <= atol) + 1
    if tight.size:
        cuts = np.concatenate([[0], tight, [m]])
        P = pD[order]
        suffix = suffix_masses(P, b)
        parts = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            sub = order[lo:hi]
            parts.append(decompose_block(idx[sub], pD[sub], x[sub], float(suffix[hi]), k, tol, budget))
        return couple(parts)
    d = x[order] - v
    if np.max(np.abs(d)) <= atol or budget[0] <= 0:
        return np.ones(1), [idx[order]]
    budget[0] -= 1
    t, mask = exit_set(pD[order], v, d, b, k, atol)
    t = max(t, 1.0)
    y = v + t * d
    A = order[mask]
    R = order[~mask]
    bA = b + float(pD[R].sum())
    part_a = decompose_block(idx[A], pD[A], y[mask], bA, k, tol, budget)
    part_r = decompose_block(idx[R], pD[R], y[~mask], b, k, tol, budget)
    wy, oy = couple([part_a, part_r])
    lam = 1.0 - 1.0 / t
    if lam <= 0:
        return wy, oy
    return np.concatenate([[lam], wy / t]), [idx[order]] + oy


# ---------------------------------------------------------------------------
# the optimal selected-token law (two greedy passes on the min-cut split)
# ---------------------------------------------------------------------------


def optimal_selection_law(ps, qs, k, in0):
    r"""An optimal selected-token law ``z`` on the support of ``p``.

    ``in0`` marks the min-cut set :math:`\Omega_0` (low ``q/p``), ``H`` is
    the rest, :math:`s = p(\Omega_0)`. On ``H`` (block function
    :math:`g(A) = 1 - (s + p(H \setminus A))^k`), fill the polymatroid under
    the box ``z <= q``; on :math:`\Omega_0` (contraction
    :math:`g'(A) = s^k - (s - p(A))^k`) raise ``z = q`` to a base. Both
    passes visit tokens by ``q/p`` descending.
    """
    H = np.flatnonzero(~in0)
    O = np.flatnonzero(in0)
    s = float(ps[O].sum())
    z = np.zeros(ps.shape[0])
    if H.size:
        pH, qH = ps[H], qs[H]
        visit = np.argsort(-(qH / pH), kind="stable")
        z[H] = saturation_fill(pH, s, k, np.zeros(H.size), qH, visit)
    if O.size:
        pO, qO = ps[O], qs[O]
        visit = np.argsort(-(qO / pO), kind="stable")
        z[O] = saturation_fill(pO, 0.0, k, qO.copy(), np.full(O.size, np.inf), visit)
    return z, H, O, s


# ---------------------------------------------------------------------------
# column generation over priority orders (master LP in HiGHS, warm-started)
# ---------------------------------------------------------------------------


def order_vertex(ps: np.ndarray, order: np.ndarray, k: int) -> np.ndarray:
    """Greedy vertex of :math:`B(g)` (support tokens only) for a full order, in token positions."""
    v = np.empty(ps.shape[0])
    v[order] = vertex(ps[order], 0.0, k)
    return v


class ColumnGeneration:
    r"""Master LP :math:`\max \sum_e u_e` s.t. :math:`u \le V\lambda`, :math:`u \le q`, :math:`\sum \lambda = 1`.

    Columns are greedy vertices of :math:`B(g)` (priority orders); pricing
    for the row duals :math:`y` is the greedy vertex of the order by ``y``
    descending (Edmonds), one sort.
    """

    def __init__(self, ps, qs, k):
        import highspy

        self.highspy = highspy
        self.ps, self.qs, self.k = ps, qs, k
        m = ps.shape[0]
        self.m = m
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("primal_feasibility_tolerance", 1e-10)
        h.setOptionValue("dual_feasibility_tolerance", 1e-10)
        # presolve misjudges columns with tiny entries (seen: "Infeasible" on a
        # feasible master with a 1e-90 vertex entry) and defeats warm starts
        h.setOptionValue("presolve", "off")
        inf = highspy.kHighsInf
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        h.addVars(m, np.zeros(m), np.array(qs, dtype=np.float64))
        h.changeColsCost(m, np.arange(m, dtype=np.int32), np.ones(m))
        # rows 0..m-1: u_e - (V lambda)_e <= 0; row m: sum lambda = 1
        starts = np.arange(m + 1, dtype=np.int32)
        h.addRows(m, np.full(m, -inf), np.zeros(m), m, starts[:m], np.arange(m, dtype=np.int32), np.ones(m))
        h.addRows(1, np.ones(1), np.ones(1), 0, np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
        self.h = h
        self.orders: list[np.ndarray] = []
        self.vertices: list[np.ndarray] = []
        self.keys: set = set()

    def add(self, order: np.ndarray) -> bool:
        key = order.tobytes()
        if key in self.keys:
            return False
        self.keys.add(key)
        v = order_vertex(self.ps, order, self.k)
        nz = np.flatnonzero(v > 0)
        idx = np.concatenate([nz, [self.m]]).astype(np.int32)
        val = np.concatenate([-v[nz], [1.0]])
        self.h.addCol(0.0, 0.0, self.highspy.kHighsInf, idx.shape[0], idx, val)
        self.orders.append(order)
        self.vertices.append(v)
        return True

    def solve(self):
        self.h.run()
        status = self.h.getModelStatus()
        name = self.h.modelStatusToString(status)
        sol = self.h.getSolution()
        x = np.array(sol.col_value)
        y = np.array(sol.row_dual)
        obj = float(self.h.getInfo().objective_function_value)
        ok = status == self.highspy.HighsModelStatus.kOptimal
        return ok, name, obj, x[self.m:], y

    def price(self, y):
        r"""Most improving order for row duals ``y``; returns ``(order, reduced_cost)``."""
        ye = y[: self.m]
        mu = y[self.m]
        # HiGHS row duals of this maximisation: y_e >= 0 on the rows u_e <= (V lambda)_e,
        # mu on the convexity row; the reduced cost of a new lambda column is y.v - mu
        w = ye
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = self.qs / self.ps
        order = np.lexsort((-ratio, -w)).astype(np.int64)
        v = order_vertex(self.ps, order, self.k)
        rc = float(w @ v) - mu
        return order, rc, v


def column_generation(ps, qs, k, alpha, *, init_orders=(), tol=1e-12, max_iter=500):
    r"""Column generation for the optimal mixture of priority orders.

    Stops when the master objective reaches ``alpha - tol`` (the optimum is
    known in closed form), when pricing finds no improving order, or after
    ``max_iter`` pricing rounds. Returns ``(weights, orders, status, n_iter)``.
    """
    cg = ColumnGeneration(ps, qs, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = qs / ps
    for o in init_orders:
        cg.add(np.asarray(o, dtype=np.int64))
    cg.add(np.argsort(-ratio, kind="stable"))
    cg.add(np.argsort(ratio, kind="stable"))
    status = "max_iter"
    it = 0
    lam = None
    while True:
        ok, name, obj, lam, y = cg.solve()
        if not ok:
            status = f"solver:{name}"
            break
        if obj >= alpha - tol:
            status = "optimal"
            break
        if it >= max_iter:
            status = "max_iter"
            break
        order, rc, _ = cg.price(y)
        if rc <= tol or not cg.add(order):
            status = "stalled"
            break
        it += 1
    if lam is None or not np.all(np.isfinite(lam)):
        return np.ones(1), [cg.orders[0]], status, it
    lam = np.maximum(lam, 0.0)
    keep = np.flatnonzero(lam > 0)
    if keep.size == 0:
        keep = np.array([int(np.argmax(lam))])
        lam = np.ones_like(lam)
    w = lam[keep]
    w = w / w.sum()
    return w, [cg.orders[i] for i in keep], status, it
