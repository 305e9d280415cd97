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
of two large numbers. Above ``k = 64`` the greedy passes of
:func:`optimal_selection_law`, the Carathéodory decomposition
(:func:`decompose_block`, its block totals, vertices and exit sets) and the
greedy vertices of column generation (:func:`order_vertex`) take every power
of a suffix mass from its complement instead (``above=``, the draft mass
before the block, :func:`huge_above`), :math:`c^k = e^{k \operatorname{log1p}(-d)}` with
``d = 1 - c`` the mass before it summed on its own (:func:`prefix_depths`):
``c`` itself carries an absolute rounding of a few ``eps`` near 1, which
``c**k`` amplifies ``k``-fold.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import numpy as np

from ..otm._highs import new_highs

__all__ = [
    "increments",
    "suffix_masses",
    "prefix_depths",
    "vertex",
    "prefix_slack",
    "max_violation",
    "saturation_fill",
    "block_total",
    "exit_set",
    "decompose_block",
    "flatten_tree",
    "top_blocks",
    "node_size",
    "optimal_selection_law",
    "order_vertex",
    "huge_above",
    "ColumnGeneration",
    "column_generation",
]


def suffix_masses(pD: np.ndarray, b: float) -> np.ndarray:
    """``c[j] = b + sum(pD[j:])`` for ``j = 0..m`` (length ``m + 1``, ``c[m] = b``).

    Summed in blocks of ``_SUM_BLOCK`` (a running sum inside each block, then
    one over the block totals): relative error about ``(B + m/B) eps``
    instead of the ``m eps`` of one running sum. The ``k``-th powers taken
    of these masses amplify their error ``k``-fold; with one running sum the
    construction lost 1.2e-10 of acceptance at ``n = 2000``, ``k = 64``
    (``q`` failed the prefix test by 3.4e-12 of rounding alone).
    """
    m = pD.shape[0]
    c = np.empty(m + 1)
    c[m] = b
    if m:
        c[:m] = _suffix_sums(pD)
        c[:m] += b
    return c


def prefix_depths(pD: np.ndarray, above: float) -> np.ndarray:
    r"""``d[j] = above + sum(pD[:j])`` for ``j = 0..m``: the complements ``1 - c[j]`` of :func:`suffix_masses`.

    Sums of non-negative terms, so each has full relative accuracy; the
    ``k``-th powers of the suffix masses at huge ``k`` are taken from these
    (:math:`c^k = e^{k \operatorname{log1p}(-d)}`), never from ``c`` itself.
    """
    d = np.empty(pD.shape[0] + 1)
    d[0] = above
    np.cumsum(pD, out=d[1:])
    d[1:] += above
    return d


#: Block length of the two-level suffix sums.
_SUM_BLOCK = 128


def _suffix_sums(x: np.ndarray) -> np.ndarray:
    """``x[j:].sum()`` for every ``j``, summed in blocks (see :func:`suffix_masses`)."""
    m = x.shape[0]
    if m <= 2 * _SUM_BLOCK:
        return np.cumsum(x[::-1])[::-1]
    nb = -(-m // _SUM_BLOCK)
    buf = np.zeros(nb * _SUM_BLOCK)
    buf[:m] = x[::-1]
    r = buf.reshape(nb, _SUM_BLOCK)
    np.cumsum(r, axis=1, out=r)
    offsets = np.cumsum(r[:, -1])
    r[1:] += offsets[:-1, None]
    return buf[:m][::-1]


def increments(x: np.ndarray, c: np.ndarray, k: int, depth: np.ndarray | None = None) -> np.ndarray:
    r"""``c**k - (c - x)**k`` elementwise, with full relative accuracy (``0 <= x <= c``).

    Large arrays with ``k <= 16`` use the multiply-add form where
    ``x <= c / 2`` (then ``c - x`` is exact to a relative ``eps``) and the
    ``log1p``/``expm1`` form elsewhere. ``depth`` (huge ``k``): the
    complement ``1 - c`` of each mass, summed on its own (the mass before
    it); then ``c**k = exp(k log1p(-depth))`` (see :func:`_increments_transcendental`).
    """
    if depth is not None:
        return _increments_transcendental(x, c, k, depth)
    if 2 <= k <= _HORNER_MAX_K and x.shape[0] >= _HORNER_MIN_SIZE * k:
        small = x <= 0.5 * c
        if small.all():
            return _increments_between(x, c, c - x, k)
        out = np.empty(x.shape[0])
        out[small] = _increments_between(x[small], c[small], c[small] - x[small], k)
        big = ~small
        out[big] = _increments_transcendental(x[big], c[big], k)
        return out
    return _increments_transcendental(x, c, k)


def _increments_transcendental(x: np.ndarray, c: np.ndarray, k: int, depth: np.ndarray | None = None) -> np.ndarray:
    r"""``c**k - (c - x)**k`` as ``-c**k expm1(k log1p(-x/c))``.

    With ``depth`` (the complement ``1 - c``, summed on its own from the
    masses before ``c``), :math:`c^k = e^{k \operatorname{log1p}(-\mathrm{depth})}`:
    a suffix mass ``c`` near 1 carries an absolute rounding of a few ``eps``,
    which ``c**k`` amplifies ``k``-fold (``1e-3`` relative at ``k = 2^40``,
    and ``inf`` at ``k = 2^62`` once ``c`` rounds above 1); the depth has
    full relative accuracy, so :math:`c^k` is off by at most about
    :math:`k\,\mathrm{depth}\,e^{-k\,\mathrm{depth}}\,\varepsilon \le \varepsilon`.
    The ratio ``x/c`` takes ``c`` itself (relative accuracy suffices there).
    """
    pos = c > 0
    if depth is not None:
        pos &= depth < 1.0
    every = bool(pos.all())
    if every:  # the usual case: no masked copies (the same values, element by element)
        cp, xp, dp = c, x, depth
    elif not pos.any():
        return np.zeros(x.shape[0])
    else:
        cp, xp, dp = c[pos], x[pos], (None if depth is None else depth[pos])
    t = np.divide(xp, cp)
    np.minimum(t, 1.0, out=t)
    np.negative(t, out=t)
    if k >= _EXPM1_FLOOR_K:
        # x = c: log1p(-1) = -inf left at -1 (no warning to silence); k * -1 <= -38 and expm1 of it rounds to
        # -1 exactly, as expm1(-inf) does: the same value
        np.log1p(t, out=t, where=t > -1.0)
    else:
        with np.errstate(divide="ignore"):
            np.log1p(t, out=t)
    t *= float(k)  # k past int64 (method="direct"): an in-place product with the int raised on numpy 1.26
    np.expm1(t, out=t)
    np.negative(t, out=t)
    if dp is None:
        t *= cp ** float(k)  # k past uint64: numpy 1.26 made cp**k an object array
    else:
        ck = np.maximum(dp, 0.0)
        np.negative(ck, out=ck)
        np.log1p(ck, out=ck)
        ck *= float(k)
        np.exp(ck, out=ck)
        t *= ck
    if every:
        return t
    out = np.zeros(x.shape[0])
    out[pos] = t
    return out


def vertex(pD: np.ndarray, b: float, k: int, above: float | None = None) -> np.ndarray:
    r"""Greedy vertex of :math:`B(g_D)` for the order in which ``pD`` is given.

    The ``j``-th token gets :math:`g_D(\text{first } j) - g_D(\text{first } j - 1)
    = c_j^k - (c_j - p_j)^k` with :math:`c_j` the mass at or after position ``j``
    (plus ``b``): the chance that token ``j`` is drafted and none before it is.
    ``above`` (huge ``k``): the draft mass before the block, ``1 - c_0``;
    given, :math:`c_j^k` is taken from the complement ``above + p(first j)``
    (:func:`prefix_depths`), never from the suffix sum.
    """
    c = suffix_masses(pD, b)
    if above is not None:
        return increments(pD, c[:-1], k, depth=prefix_depths(pD, above)[:-1])
    if 2 <= k <= _HORNER_MAX_K and pD.shape[0] >= _HORNER_MIN_SIZE * k:
        return _increments_between(pD, c[:-1], c[1:], k)
    return increments(pD, c[:-1], k)


#: From this ``k`` on, ``expm1(-k)`` rounds to ``-1`` exactly (``e**-38 < 2**-54``), as ``expm1(-inf)`` does.
_EXPM1_FLOOR_K = 38

#: Largest ``k``, and smallest block per unit of ``k``, for the multiply-add form of the increments.
_HORNER_MAX_K = 16
_HORNER_MIN_SIZE = 32


def _increments_between(x, c, d, k):
    r"""``c**k - d**k = x * sum_{i<k} c^(k-1-i) d^i`` for ``d = c - x`` given separately.

    All terms are non-negative, so the result has relative error of order
    ``k eps`` with no transcendental functions; ``d`` is the next suffix mass,
    never computed as the difference ``c - x``.
    """
    # the first step of the Horner loop from h = dp = 1 done by hand (no ones arrays)
    h = c + d
    dp = np.array(d, dtype=np.float64)
    for _ in range(k - 2):
        h *= c
        dp *= d
        h += dp
    h *= x
    return h


def prefix_slack(pD: np.ndarray, wD: np.ndarray, b: float, k: int, order: np.ndarray, above: float | None = None):
    r"""Slacks :math:`g_D(\text{first } j) - w(\text{first } j)` of the prefixes of ``order``.

    Returns ``(slack, v)`` with ``slack`` of length ``m + 1`` (``slack[0] = 0``)
    and ``v`` the greedy vertex of ``order`` (in order positions). ``above``
    (huge ``k``): the draft mass before the block (see :func:`vertex`).
    """
    v = vertex(pD[order], b, k, above)
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


def saturation_fill(pD, b, k, z0, upper, visit, above=None) -> np.ndarray:
    r"""Greedy fill of the polymatroid :math:`P(g_D) \cap \{z \le u\}` from ``z0``.

    Visit the tokens in ``visit`` order and raise each :math:`z(e)` by
    :math:`\min(u(e) - z(e), \operatorname{sat}(e))`, with the saturation
    capacity :math:`\operatorname{sat}(e) = \min_{A \ni e} g_D(A) - z(A)`.
    By the prefix structure, the minimising ``A`` is ``e`` together with a
    prefix of the other tokens sorted by ``z/p`` descending, so each capacity
    is one sort and one scan. Whatever the visiting order, the result is a
    maximal point of the polymatroid (Edmonds' greedy algorithm). ``above``
    (huge ``k``): the draft mass before the block; given, every power of a
    suffix mass is taken from its complement (:func:`prefix_depths`).
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
        dep = None if above is None else prefix_depths(po, above)
        v = increments(po, c[:-1], k, None if dep is None else dep[:-1])
        slack = np.empty(m)
        slack[0] = 0.0
        np.cumsum(v - z[others][o], out=slack[1:])
        # marginal of e after each prefix: c_i^k - (c_i - p_e)^k, c_i = mass from e on
        marg = increments(np.full(m, pe), c, k, dep)
        sat = float(np.min(slack + marg)) - z[e]
        if sat > 0:
            z[e] += min(room, sat)
    return z


# ---------------------------------------------------------------------------
# Carathéodory decomposition of a point of B(g_D) into priority orders
# ---------------------------------------------------------------------------


def block_total(pD: np.ndarray, b: float, k: int, above: float | None = None) -> float:
    r""":math:`g_D(D) = a^k - b^k` with :math:`a = p(D) + b`, accurately.

    ``above`` (huge ``k``): the draft mass before the block, ``1 - a``; given,
    :math:`a^k` is taken from it (:func:`increments`), never from ``P + b``.
    """
    P = float(pD.sum())
    return float(increments(np.array([P]), np.array([P + b]), k, _depth_of(above))[0])


def _depth_of(above: float | None) -> np.ndarray | None:
    """``above`` as the one-element depth array of :func:`increments` (``None`` stays ``None``)."""
    return None if above is None else np.array([above], dtype=np.float64)


def _others_masses(pD: np.ndarray) -> np.ndarray:
    """``sum(pD) - pD[j]`` for every ``j``, as a sum of the other (non-negative) masses: full relative accuracy."""
    before = np.zeros(pD.shape[0])
    np.cumsum(pD[:-1], out=before[1:])
    return before + suffix_masses(pD, 0.0)[1:]


def exit_set(pD, v, d, b, k, tol, max_iter=100, return_scan=False, above=None):
    r"""Exit ratio and exit set of the ray ``v + t d`` from :math:`B(g_D)`.

    .. math::

        t^* = \min_{A:\ d(A) > 0} \frac{g_D(A) - v(A)}{d(A)}

    by Dinkelbach iterations (each a prefix scan of ``g_D - (v + t d)``),
    started from the best singleton. Returns ``(t, mask)`` with ``mask`` the
    minimising set (non-empty, proper, ``d(A) > 0``), or with
    ``return_scan=True`` also ``(order, vertex)`` of the last prefix scan when
    it was taken at the returned ``t`` (else ``None``): the ``(v + t d)/p``
    order and its greedy vertex, which the sub-block cut off by ``mask``
    reuses when it is a prefix of that order. ``above`` (huge ``k``): the
    draft mass before the block; given, every power of a suffix mass is
    taken from its complement (:func:`vertex`), the co-singleton's
    ``above + p(D \ {e})`` from the other masses summed on their own.
    """
    m = pD.shape[0]
    # starting upper bound: the best singleton {e} (d(e) > 0) or co-singleton
    # D \ {e} (d(e) < 0, since d(D) = 0); g_D(D) - g_D(D \ {e}) = (b + p_e)^k - b^k
    pos = np.flatnonzero(d > 0)
    neg = np.flatnonzero(d < 0)
    if above is None:
        gs = increments(pD[pos], np.full(pos.shape[0], pD.sum() + b), k)
        last = increments(pD[neg], pD[neg] + b, k)
    else:  # one call for both (elementwise: the same values as two calls; no multiply-add form above k = 16)
        both = increments(np.concatenate([pD[pos], pD[neg]]),
                          np.concatenate([np.full(pos.shape[0], pD.sum() + b), pD[neg] + b]), k,
                          np.concatenate([np.full(pos.shape[0], above), above + _others_masses(pD)[neg]]))
        gs, last = both[: pos.shape[0]], both[pos.shape[0]:]
    r_single = (gs - v[pos]) / d[pos]
    r_co = (v[neg] - last) / (-d[neg])
    i = int(np.argmin(r_single))
    mask = np.zeros(m, dtype=bool)
    if neg.size and float(np.min(r_co)) < float(r_single[i]):
        i = int(np.argmin(r_co))
        t = float(r_co[i])
        mask[:] = True
        mask[neg[i]] = False
    else:
        t = float(r_single[i])
        mask[pos[i]] = True
    scan = None
    for _ in range(max_iter):
        w = v + t * d
        order = _ratio_desc(pD, w)
        s, vw = prefix_slack(pD, w, b, k, order, above)
        scan = (order, vw)
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
        scan = None  # the scan was taken at the previous t
        mask = np.zeros(m, dtype=bool)
        mask[A] = True
    return (t, mask, scan) if return_scan else (t, mask)


# A mixture of priority orders of a block is kept as a tree, read with one
# uniform u in [0, 1) shared by the whole tree (a quantile coupling):
#   ["leaf", order]                  the single order ``order`` (token ids)
#   ["split", lam, order, child]     u < lam: ``order``; else child at (u - lam) / (1 - lam)
#   ["chain", children, size]        blocks in chain order, each read at the same u;
#                                    the order is the concatenation of the children's
# The law of the selected token depends on each block's mixture only through
# its marginal, so the coupling (same u everywhere) is exact. Every walk over
# the tree below uses an explicit stack (the tree can be as deep as the
# number of Carathéodory steps).


def node_size(node) -> int:
    """Number of tokens of a tree node."""
    return int(node[2]) if node[0] == "chain" else int(node[-1].shape[0] if node[0] == "leaf" else node[2].shape[0])


def tree_breakpoints(node) -> np.ndarray:
    """Sorted breakpoints in (0, 1) of the piecewise-constant map u -> order."""
    # each task: (node, offset, scale): the node's breakpoints b map to offset + scale * b
    out = []
    stack = [(node, 0.0, 1.0)]
    while stack:
        nd, off, sc = stack.pop()
        if nd[0] == "split":
            lam = nd[1]
            out.append(off + sc * lam)
            stack.append((nd[3], off + sc * lam, sc * (1.0 - lam)))
        elif nd[0] == "chain":
            stack.extend((c, off, sc) for c in nd[1])
    if not out:
        return np.empty(0)
    return np.unique(np.array(out))


def _fill_orders(node, u, out):
    """Write the order of ``node`` at each quantile ``u[r]`` into row ``r`` of ``out``."""
    stack = [(node, u, np.arange(u.shape[0]), 0)]
    while stack:
        nd, uu, rows, col = stack.pop()
        if nd[0] == "leaf":
            o = nd[1]
            out[rows, col : col + o.shape[0]] = o[None, :]
        elif nd[0] == "split":
            lam, o, child = nd[1], nd[2], nd[3]
            first = uu < lam
            if np.any(first):
                out[rows[first], col : col + o.shape[0]] = o[None, :]
            rest = ~first
            if np.any(rest):
                stack.append((child, (uu[rest] - lam) / (1.0 - lam), rows[rest], col))
        else:
            for c in nd[1]:
                stack.append((c, uu, rows, col))
                col += node_size(c)


def flatten_tree(node, size: int | None = None):
    """Materialise the tree as ``(weights, orders)`` with ``orders`` of shape ``(m, size)``."""
    size = node_size(node) if size is None else size
    brk = tree_breakpoints(node)
    brk = brk[(brk > 0) & (brk < 1)]
    edges = np.concatenate([[0.0], brk, [1.0]])
    w = np.diff(edges)
    keep = w > 0
    lo, hi = edges[:-1][keep], edges[1:][keep]
    w = w[keep]
    u = 0.5 * (lo + hi)
    out = np.empty((u.shape[0], size), dtype=np.int32 if size < 2**31 else np.int64)
    _fill_orders(node, u, out)
    return w / w.sum(), out


def top_blocks(node) -> list:
    """The non-chain nodes of the tree's top-level chain, in chain order; consecutive leaves merged into one."""
    blocks: list = []
    stack = [node]
    while stack:
        nd = stack.pop()
        if nd[0] == "chain":
            stack.extend(reversed(nd[1]))
        elif nd[0] == "leaf" and blocks and blocks[-1][0] == "leaf":
            blocks[-1] = ["leaf", np.concatenate([blocks[-1][1], nd[1]])]
        else:
            blocks.append(nd)
    return blocks


#: Mixture components whose weight falls below this are not decomposed further
#: (their block keeps one vertex): the change in ``z`` is at most twice this.
WEIGHT_FLOOR = 1e-18


def _chain_of_tight_prefixes(idx, pD, x, b, order, tight, m, above=None):
    """Children of a block cut at its tight prefixes: runs of singletons become one leaf; larger pieces are tasks.

    A task's last entry is the draft mass before its piece (``None`` when ``above`` is).
    """
    cuts = np.concatenate([[0], tight, [m]])
    suffix = suffix_masses(pD[order], b)
    depth = None if above is None else prefix_depths(pD[order], above)
    children: list = []
    tasks = []
    pos = 0  # first position not yet assigned to a child
    # only the pieces of two or more tokens are visited; the singletons between
    # them form one leaf each (no Python work per singleton)
    for i in np.flatnonzero(np.diff(cuts) > 1).tolist():
        lo, hi = int(cuts[i]), int(cuts[i + 1])
        if lo > pos:
            children.append(["leaf", idx[order[pos:lo]]])
        sub = order[lo:hi]
        children.append(None)
        tasks.append((children, len(children) - 1, idx[sub], pD[sub], x[sub], float(suffix[hi]),
                      None if depth is None else float(depth[lo])))
        pos = hi
    if pos < m:
        children.append(["leaf", idx[order[pos:m]]])
    return children, tasks


def decompose_block(idx, pD, x, b, k, tol, budget, zacc=None, above=None):
    r"""Write ``x`` (a point of :math:`B(g_D)`) as a mixture of priority orders of ``D``.

    ``idx`` are the token ids of ``D``; returns a mixture tree (see above),
    built with an explicit work stack (no recursion). Tight prefixes split a
    block into independent sub-blocks (a chain; runs of singletons form one
    leaf); otherwise one Carathéodory step moves from the vertex ``v`` of the
    ``x/p``-descending order through ``x`` to the boundary ``y = v + t d``
    and records the new tight set, so that ``x = (1 - 1/t) v + (1/t) y``
    with ``y`` split along that set. ``budget`` is a one-element list
    counting the remaining Carathéodory steps.

    ``zacc`` (optional, indexed like ``idx``): the law of the selected token
    under the mixture is added to it, each order's greedy vertex times its
    weight, as the vertices are computed (the same sum as over the
    materialised orders, grouped by node of the tree).

    ``above`` (huge ``k``): the draft mass before the block, ``1 - p(D) - b``;
    given, every power of a suffix mass in the block and its sub-blocks is
    taken from its complement (:func:`prefix_depths`, :func:`vertex`), each
    sub-block's complement summed on its own (``above`` plus the masses
    before it), never ``c**k`` of a suffix sum.
    """
    root: list = [None]
    # task: (holder, slot, idx, pD, x, b, scale, pre): decompose and store the node in
    # holder[slot]; pre is None or the greedy vertex of the tokens in their given
    # order, when that order is already x/p descending (the exit scan of the parent);
    # ab: the draft mass before the tokens (None below huge k)
    stack = [(root, 0, idx, pD, x, b, 1.0, None, above)]
    while stack:
        holder, slot, idx, pD, x, b, scale, pre, ab = stack.pop()
        m = pD.shape[0]
        if m == 1:
            holder[slot] = ["leaf", idx]
            if zacc is not None:
                zacc[idx] += scale * block_total(pD, b, k, ab)
            continue
        total = block_total(pD, b, k, ab)
        x = np.maximum(x, 0.0)
        sx = float(x.sum())
        x = x * (total / sx) if sx > 0 else np.full(m, total / m)
        atol = tol * max(total, np.finfo(float).tiny)
        if pre is None:
            order = _ratio_desc(pD, x)
            s, v = prefix_slack(pD, x, b, k, order, ab)
        else:  # no sort and no vertex: both come from the parent's exit scan
            order = np.arange(m)
            v = pre
            s = np.empty(m + 1)
            s[0] = 0.0
            np.cumsum(v - x, out=s[1:])
        tight = np.flatnonzero(s[1:m] <= atol) + 1
        if tight.size:
            children, tasks = _chain_of_tight_prefixes(idx, pD, x, b, order, tight, m, ab)
            holder[slot] = ["chain", children, m]
            if zacc is not None:  # the singleton runs (leaves) keep the vertex of this order
                big = np.zeros(m, dtype=bool)
                cuts = np.concatenate([[0], tight, [m]])
                for i in np.flatnonzero(np.diff(cuts) > 1).tolist():
                    big[cuts[i] : cuts[i + 1]] = True
                zacc[idx[order[~big]]] += scale * v[~big]
            stack.extend((c, j, i_, p_, x_, b_, scale, None, a_) for (c, j, i_, p_, x_, b_, a_) in tasks)
            continue
        d = x[order] - v
        if np.max(np.abs(d)) <= atol or budget[0] <= 0 or scale < WEIGHT_FLOOR:
            holder[slot] = ["leaf", idx[order]]
            if zacc is not None:
                zacc[idx[order]] += scale * v
            continue
        budget[0] -= 1
        pDo = pD[order]
        t, mask, scan = exit_set(pDo, v, d, b, k, atol, return_scan=True, above=ab)
        if not t >= 1.0:
            t, scan = 1.0, None
        y = v + t * d
        A = order[mask]
        R = order[~mask]
        bA = b + float(pD[R].sum())
        child = ["chain", [None, None], m]
        lam = 1.0 - 1.0 / t
        holder[slot] = ["split", lam, idx[order], child] if lam > 0 else child
        if zacc is not None and lam > 0:
            zacc[idx[order]] += (scale * lam) * v
        abR = None if ab is None else ab + float(pD[A].sum())  # R comes after A
        stack.append((child[1], 1, idx[R], pD[R], y[~mask], b, scale / t, None, abR))
        nA = int(mask.sum())
        if scan is not None and bool(mask[scan[0][:nA]].all()):
            # A is the first nA tokens of the exit scan's (y/p descending) order, and
            # g_A(S) = g_D(S) for S in A (R comes after A): its order and vertex are
            # those of the scan, cut at nA
            first = scan[0][:nA]
            stack.append((child[1], 0, idx[order[first]], pDo[first], y[first], bA, scale / t, scan[1][:nA], ab))
        else:
            stack.append((child[1], 0, idx[A], pD[A], y[mask], bA, scale / t, None, ab))
    return root[0]


# ---------------------------------------------------------------------------
# the optimal selected-token law (two greedy passes on the min-cut split)
# ---------------------------------------------------------------------------


#: Above this ``k`` the fast path of :func:`_fill_high` takes its powers from prefix masses (as the key layout does).
_DEPTH_MIN_K = 64


def huge_above(k: int, above: float) -> float | None:
    """``above`` (the draft mass before a block) where ``k > 64``, else ``None``: the powers' coordinate.

    Above ``k = 64`` every power of a suffix mass is taken from its
    complement, the mass before it (the ``above=`` of :func:`vertex`,
    :func:`block_total`, :func:`decompose_block`); up to ``k = 64`` the
    suffix masses are kept (bit for bit the former values).
    """
    return float(above) if k > _DEPTH_MIN_K else None


def _fill_high(pH, qH, b, k):
    r"""Greedy fill of :math:`P(g_H) \cap \{z \le q\}` visiting ``q/p`` descending (positions in that order).

    Invariant: the visited tokens are ``U`` (the maximal tight set, tight
    because each of its tokens was capped by its saturation capacity) and
    ``W`` (tokens capped by ``q``, so ``z/p = q/p``, kept in visiting
    order). By the prefix structure the capacity of the next token ``e`` is

    .. math::

        \operatorname{sat}(e) = \min_{0 \le i \le |W|}
            \Big[\sum_{l < i} \big(\Delta(p_{W_l}, R_l) - z_{W_l}\big)
                  + \Delta(p_e, R_i)\Big],
        \qquad \Delta(x, c) = c^k - (c - x)^k,

    with :math:`R_i` the mass outside ``U`` and ``W[:i]`` (suffix sums):
    prefixes shorter than ``U`` are dominated (their slack is ``>= 0 =``
    slack of ``U`` and :math:`\Delta` grows with ``c``). So each step costs
    :math:`O(|W|)`, and ``W`` stays short on LLM-like pairs.
    """
    m = pH.shape[0]
    suf = suffix_masses(pH, b)  # suf[j] = b + mass of positions >= j
    # fast path: if q itself lies in P(g_H) (prefix test along q/p descending,
    # i.e. the given order), no token is ever capped by its capacity and the
    # greedy returns z = q (this is the case alpha_k = 1, e.g. p = q)
    # (to the rounding of the prefix sums, 4 m eps)
    # vert[j]: capacity of token j when W is empty
    huge = k > _DEPTH_MIN_K
    P = None
    if not (huge and m):
        vert = increments(pH, suf[:-1], k)
    else:
        # huge k: c_j = 1 - (mass before j), so c_j**k = exp(k log1p(-P_j)) from the prefix masses P_j
        # (exact where c_j is near 1; c_j**k from the suffix sum amplifies its rounding k-fold), the
        # total pinned at 1 as in the closed form alpha_k; k <= 64 keeps the former values bit for bit
        P = np.zeros(m)
        np.cumsum(pH[:-1], out=P[1:])
        with np.errstate(divide="ignore"):
            vert = -np.expm1(float(k) * np.log1p(-np.minimum(pH / suf[:-1], 1.0))) * np.exp(float(k) * np.log1p(-P))
    S = np.cumsum(vert - qH)
    if m and float(S.min()) >= -4.0 * m * np.finfo(float).eps:
        return np.array(qH, dtype=np.float64)
    z = np.zeros(m)
    # while W is empty the capacity of token j is vert[j] (U = all tokens
    # before j, tight): runs of tokens with vert < q are capped at once
    uncapped = np.flatnonzero(vert >= qH)
    W: list[int] = []
    # huge k: pU = p(U), the mass of the visited tokens outside W, summed on its own (reset to the
    # prefix mass P[j] whenever W is empty), so that 1 - R_i = pU + p(W[:i]) has full relative accuracy
    pU = 0.0
    j = 0
    while j < m:
        pe = pH[j]
        if not W:
            nxt = int(uncapped[np.searchsorted(uncapped, j)]) if uncapped.size and uncapped[-1] >= j else m
            if nxt > j:
                z[j:nxt] = np.maximum(vert[j:nxt], 0.0)
                j = nxt
                continue
            if huge:
                pU = float(P[j])
        if W:
            Wa = np.array(W)
            pw = pH[Wa]
            # R_i = suf[j] + p(W[i:]) for i = 0..|W|
            R = suffix_masses(pw, float(suf[j]))
            # huge k: R_i**k from the complement 1 - R_i = pU + p(W[:i]) (never from R_i itself)
            dep = prefix_depths(pw, pU) if huge else None
            inc_w = increments(pw, R[:-1], k, None if dep is None else dep[:-1])
            slack = np.empty(len(W) + 1)
            slack[0] = 0.0
            np.cumsum(inc_w - z[Wa], out=slack[1:])
            vals = slack + increments(np.full(len(W) + 1, pe), R, k, dep)
            i = int(np.argmin(vals))
            sat = float(vals[i])
        elif huge:
            i = 0
            sat = float(vert[j])  # the same capacity, its power from the prefix mass
        else:
            i = 0
            sat = float(increments(np.array([pe]), np.array([suf[j]]), k)[0])
        if sat < qH[j]:
            z[j] = max(sat, 0.0)
            if huge:
                pU += (float(pw[:i].sum()) if i else 0.0) + float(pe)
            del W[:i]  # U absorbs W[:i] and e: the new tight set
        else:
            z[j] = qH[j]
            W.append(j)
        j += 1
    return z


def _fill_low(pO, qO, k, above=None):
    r"""Raise ``z = q`` on :math:`\Omega_0` to a base of :math:`g'(A) = s^k - (s - p(A))^k`, visiting ``q/p`` descending.

    With ``S_t = g'(T_t) - q(T_t)`` the slacks of the prefixes ``T_t`` of the
    visiting order, the raised tokens are the suffix-minimum records of
    ``S``: the first token is raised by :math:`\min_{t \ge 1} S_t`, which
    makes the (last) minimising prefix tight; every token inside it has
    capacity 0, and the next token after it is raised by the next
    record's drop. The records (``S_t`` strictly below every later slack)
    are found in one vectorised pass, :math:`O(m)` after the sort. ``above``
    (used above ``k = 64``): the draft mass outside :math:`\Omega_0`,
    ``1 - s``; the powers of the suffix masses then come from their
    complements ``above + p(first j)`` (:func:`prefix_depths`).
    """
    m = pO.shape[0]
    z = np.array(qO, dtype=np.float64)
    if m == 0:
        return z
    c = suffix_masses(pO, 0.0)
    S = np.empty(m + 1)
    S[0] = 0.0
    dep = None if above is None else prefix_depths(pO, above)[:-1]
    np.cumsum(increments(pO, c[:-1], k, dep) - qO, out=S[1:])
    T = S[1:]
    run = np.minimum.accumulate(T[::-1])[::-1]  # run[i] = min S[i+1:]
    # the last minimiser of S[t:] is the first record at or after t, so the
    # visited tokens are 0 and every record t < m (a prefix length = next token)
    rec = np.empty(m, dtype=bool)
    rec[-1] = True
    rec[:-1] = T[:-1] < run[1:]
    visited = np.flatnonzero(rec[:-1]) + 1
    visited = np.concatenate([[0], visited])
    z[visited] += np.maximum(run[visited] - S[visited], 0.0)
    return z


def optimal_selection_law(ps, qs, k, in0, *, reference=False):
    r"""An optimal selected-token law ``z`` on the support of ``p``.

    ``in0`` marks the min-cut set :math:`\Omega_0` (low ``q/p``), ``H`` is
    the rest, :math:`s = p(\Omega_0)`. On ``H`` (block function
    :math:`g(A) = 1 - (s + p(H \setminus A))^k`), fill the polymatroid under
    the box ``z <= q``; on :math:`\Omega_0` (contraction
    :math:`g'(A) = s^k - (s - p(A))^k`) raise ``z = q`` to a base. Both
    passes visit tokens by ``q/p`` descending. ``reference=True`` uses the
    generic :func:`saturation_fill` (one sort per token) instead of the
    linear-time passes.
    """
    H = np.flatnonzero(~in0)
    O = np.flatnonzero(in0)
    s = float(ps[O].sum())
    # above k = 64 the powers of suffix masses come from their complements: 0 before H, p(H) before Omega_0
    # (the same sum as the key layout's depth of Omega_0 and the closed form's p(Omega_0)**k)
    huge = k > _DEPTH_MIN_K
    above_O = huge_above(k, float(ps[H].sum()))
    z = np.zeros(ps.shape[0])
    if H.size:
        pH, qH = ps[H], qs[H]
        visit = np.argsort(-(qH / pH), kind="stable")
        if reference:
            z[H] = saturation_fill(pH, s, k, np.zeros(H.size), qH, visit, 0.0 if huge else None)
        else:
            z[H[visit]] = _fill_high(pH[visit], qH[visit], s, k)
    if O.size:
        pO, qO = ps[O], qs[O]
        visit = np.argsort(-(qO / pO), kind="stable")
        if reference:
            z[O] = saturation_fill(pO, 0.0, k, qO.copy(), np.full(O.size, np.inf), visit, above_O)
        else:
            z[O[visit]] = _fill_low(pO[visit], qO[visit], k, above_O)
    return z, H, O, s


# ---------------------------------------------------------------------------
# column generation over priority orders (master LP in HiGHS, warm-started)
# ---------------------------------------------------------------------------


def order_vertex(ps: np.ndarray, order: np.ndarray, k: int) -> np.ndarray:
    """Greedy vertex of :math:`B(g)` (support tokens only) for a full order, in token positions.

    Above ``k = 64`` the powers come from the prefix masses (:func:`huge_above`).
    """
    v = np.empty(ps.shape[0])
    v[order] = vertex(ps[order], 0.0, k, huge_above(k, 0.0))
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
        # presolve misjudges columns with tiny entries (seen: "Infeasible" on a
        # feasible master with a 1e-90 vertex entry) and defeats warm starts
        h = new_highs(presolve=False)
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
