r"""The exactly optimal ``k``-draft verifier, in polynomial time.

A *priority order* :math:`\sigma` selects, among the distinct draft tokens,
the one that comes first in :math:`\sigma`. A mixture of priority orders
followed by one speculative-sampling step of the selected token ``Z``
against the target ``q`` is lossless whatever the mixture, and accepts
:math:`\sum_y \min(z(y), q(y))` with ``z`` the law of ``Z``. The laws ``z``
reachable this way form the base polytope of
:math:`g(A) = 1 - (1 - p(A))^k`, and the best of them reaches
:math:`\alpha_k(p, q)` exactly (docs, "Theory: the optimal verifier").

Notation: ``p`` is the draft distribution, ``q`` the target. Leviathan et
al. use the opposite letters (their ``p`` is the target).
"""

from __future__ import annotations

import numpy as np

from .._registry import unknown_name_message
from .._validation import validate_k, validate_pair, validate_positive_int
from .._verifier import complement, validate_tol
from ..otm._alpha import min_cut
from . import _submodular as sm
from ._priority_keys import PriorityKeyVerifier, build_keys
from ._selection import SelectThenSpeculate, above_noise

__all__ = ["OptimalVerifier", "optimal_verifier", "OPTIMALITY_TOL", "LP_OPTIMALITY_TOL"]

#: Default tolerance on the gap ``alpha_k - acceptance`` for the status ``"optimal"``
#: (direct construction; column generation defaults to :data:`LP_OPTIMALITY_TOL`).
OPTIMALITY_TOL = 1e-12


def _rounding_bound(n: int, k: int, blocks) -> float:
    """``max(OPTIMALITY_TOL, 4 (n + min(k, 64) + m) eps)``, ``m`` the number of orders of the mixture ``blocks``:
    the closed form :math:`\\alpha_k` is exact to about ``4 n eps`` (prefix sums), the ``k``-th powers add about
    ``k eps`` (above ``k = 64`` they come from prefix masses: their rounding no longer grows with ``k``) and the
    mixture sum :math:`\\sum_j w_j v_j` about ``m eps``."""
    m = 1 + sum(w.shape[0] - 1 for w, _ in blocks)
    return max(OPTIMALITY_TOL, 4 * (n + min(k, sm._DEPTH_MIN_K) + m) * np.finfo(float).eps)


#: Default gap tolerance of column generation: the master LP is solved by
#: HiGHS to a feasibility tolerance of 1e-10, so its weights are no more exact.
LP_OPTIMALITY_TOL = 1e-10

_METHODS = ("keys", "direct", "colgen")
_NOISE = 1e-12
#: Largest number of (rejectable, residual) cells summed exactly when the bound suffices.
_PAIR_BUDGET = 20_000_000
#: Cells per chunk of the pair sum (bounds its memory to a few tens of MB).
_CHUNK = 1 << 21
#: Orders of a direct mixture handed to column generation as its warm start.
_WARM = 200
#: The priority-key layout's compiled kernel takes ``k`` as an int64.
_KEYS_MAX_K = 2**63


class _Block:
    """One block of the chain: a mixture of orders of its tokens (token ids), with their ranks."""

    __slots__ = ("tokens", "weights", "cumw", "orders", "ranks", "after")

    def __init__(self, weights, orders, after, local, itype):
        self.weights = np.asarray(weights, dtype=np.float64)
        self.orders = np.ascontiguousarray(orders, dtype=itype)
        self.tokens = self.orders[0]
        self.after = float(after)  # draft mass of the tokens after this block
        self.cumw = np.cumsum(self.weights)
        self.cumw[-1] = 1.0
        m, size = self.orders.shape
        if m == 1:
            self.ranks = None  # rank = local index (the order itself)
        else:
            self.ranks = np.empty((m, size), dtype=itype)
            self.ranks[np.arange(m)[:, None], local[self.orders]] = np.arange(size, dtype=itype)[None, :]
        for arr in (self.weights, self.cumw, self.orders) + (() if self.ranks is None else (self.ranks,)):
            arr.setflags(write=False)


class OptimalVerifier(SelectThenSpeculate):
    r"""A mixture of priority-order selection rules followed by speculative sampling.

    With probability ``weights[j]`` the rule selects, among the distinct
    drafts, the token that comes first in ``orders[j]``; the selected token
    ``Z`` (law ``z``) is accepted with probability :math:`\min(1, q(Z)/z(Z))`,
    and otherwise the output is drawn from the residual
    :math:`(q - z)_+ / \sum (q - z)_+`:

    .. math::

        K(y \mid x) = \sum_j w_j \Big[ a(\sigma_j(x))\, \mathbb 1\{y = \sigma_j(x)\}
            + \big(1 - a(\sigma_j(x))\big) r(y) \Big],
        \qquad a = \min(1, q / z),

    with :math:`\sigma_j(x)` the first token of order ``j`` present in ``x``.
    The output law is exactly ``q`` for any weights and orders.

    The mixture is stored as a *chain of blocks* (the tight sets of ``z``,
    nested): every order lists the blocks in the same sequence, and only the
    order inside a block varies. Each block keeps its own few orders, so a
    chain of ``n`` singletons costs ``O(n)``, not ``m x n``; the global
    ``orders``/``weights`` (the blocks read at one shared quantile) are built
    only when asked for.

    Use :func:`optimal_verifier` to construct it.

    Attributes
    ----------
    k : int
        Number of drafts.
    p, q : (n,) ndarray of float64, read-only
        Draft and target distributions.
    orders : (m, n) ndarray of int, read-only
        The priority orders, one per row (a permutation of ``range(n)``;
        tokens with ``p = 0`` come last in every order). Materialised on
        first access: ``m x n`` integers.
    weights : (m,) ndarray of float64, read-only
        Mixture weights (positive, summing to 1).
    z : (n,) ndarray of float64, read-only
        Law of the selected token, :math:`z = \sum_j w_j v_{\sigma_j}` with
        :math:`v_\sigma` the greedy vertex of :math:`\sigma`.
    alpha : float
        :math:`\alpha_k(p, q)`, the optimum (closed form, one sort).
    gap : float
        ``alpha - acceptance()``, signed; zero up to rounding when ``status == "optimal"``.
    status : str
        ``"optimal"`` when ``|gap| <= tol``; ``"rounding"`` when the
        acceptance exceeds :math:`\alpha_k` by more than ``tol`` but no more
        than the rounding bound :math:`\max(10^{-12}, 4 (n + \min(k, 64) + m) \varepsilon)`
        (only with a ``tol`` below it); otherwise why the construction
        stopped short (``"suboptimal"``, ``"max_iter"``, ``"stalled"``,
        ``"solver:<HiGHS status>"``). An acceptance above :math:`\alpha_k`
        beyond the rounding bound (impossible for a valid selection rule,
        :math:`\alpha_k` being the optimum) raises :class:`RuntimeError`.
    method : str
        The construction that produced the mixture (``"direct"``,
        ``"direct+colgen"`` after a fallback, or ``"colgen"``).
    n_iter : int
        Carathéodory steps (direct) or pricing rounds (column generation).
    tol : float
        The gap tolerance behind ``status``.
    n_blocks : int
        Blocks of the chain (tokens with ``p = 0`` form the last one).
    """

    def __init__(self, p, q, k, blocks, *, alpha, status, method, n_iter, tol, z=None):
        self.k = k
        self.p = p
        self.q = q
        n = p.shape[0]
        itype = np.int32 if n < 2**31 else np.int64
        self._itype = itype
        supp = p > 0
        zero = np.flatnonzero(~supp).astype(itype)
        blocks = [(np.asarray(w, dtype=np.float64), np.atleast_2d(np.asarray(o))) for w, o in blocks]
        if zero.size:
            blocks.append((np.ones(1), zero[None, :]))
        local = np.empty(n, dtype=itype)
        block_of = np.empty(n, dtype=itype)
        for b, (_, o) in enumerate(blocks):
            local[o[0]] = np.arange(o.shape[1], dtype=itype)
            block_of[o[0]] = b
        # draft mass after each block (suffix sums in chain order)
        masses = np.array([float(p[o[0]].sum()) for _, o in blocks])
        after = np.concatenate([np.cumsum(masses[::-1])[::-1][1:], [0.0]]) if masses.size else masses
        # draft mass before each block, summed on its own (the powers' coordinate above k = 64)
        before = np.concatenate([[0.0], np.cumsum(masses[:-1])]) if masses.size else masses
        self._blocks = [_Block(w, o, a_, local, itype) for (w, o), a_ in zip(blocks, after)]
        self._local = local
        self._block_of = block_of
        if z is None:
            # z: the vertex of the chain order on single-order blocks, in one pass;
            # the mixture sum_j w_j v_j on the others
            base = np.concatenate([blk.tokens for blk in self._blocks]) if self._blocks else np.zeros(0, dtype=itype)
            z = np.zeros(n)
            bs = base[supp[base]]
            z[bs] = sm.vertex(p[bs], 0.0, k, sm.huge_above(k, 0.0))
            for blk, ab in zip(self._blocks, before):
                if blk.ranks is None:
                    continue
                zb = np.zeros(n)
                for w, o in zip(blk.weights, blk.orders):
                    zb[o] += w * sm.vertex(p[o], blk.after, k, sm.huge_above(k, ab))
                z[blk.tokens] = zb[blk.tokens]
        else:  # accumulated by the decomposition, vertex by vertex (same sum, grouped by node)
            z = np.array(z, dtype=np.float64)
        self._init_speculative(z)
        self._global = None
        acceptance = self._exact_acceptance(float(alpha), float(tol))
        # how far the acceptance can exceed alpha_k by rounding alone: the direct default tol, with this mixture's m
        self._init_report(alpha, acceptance, tol, status, method, n_iter, slack=_rounding_bound(n, k, blocks))
        for arr in (self._local, self._block_of):
            arr.setflags(write=False)

    # -- reported structure ---------------------------------------------
    def _materialise(self):
        """The global mixture: every block read at one shared quantile ``u`` (built once, ``m x n``)."""
        if self._global is None:
            cuts = np.unique(np.concatenate([blk.cumw[:-1] for blk in self._blocks] + [np.empty(0)]))
            cuts = cuts[(cuts > 0) & (cuts < 1)]
            edges = np.concatenate([[0.0], cuts, [1.0]])
            w = np.diff(edges)
            keep = w > 0
            u = 0.5 * (edges[:-1] + edges[1:])[keep]
            w = w[keep]
            n = self.n
            orders = np.empty((u.shape[0], n), dtype=self._itype)
            col = 0
            for blk in self._blocks:
                size = blk.tokens.shape[0]
                j = np.minimum(np.searchsorted(blk.cumw, u, side="right"), blk.weights.shape[0] - 1)
                orders[:, col : col + size] = blk.orders[j]
                col += size
            ranks = np.empty_like(orders)
            pos = np.arange(n, dtype=self._itype)
            for j in range(orders.shape[0]):
                ranks[j, orders[j]] = pos
            w = w / w.sum()
            for arr in (orders, ranks, w):
                arr.setflags(write=False)
            self._global = (w, orders, ranks)
        return self._global

    @property
    def orders(self) -> np.ndarray:
        """(m, n) priority orders, one per row (materialised on first access)."""
        return self._materialise()[1]

    @property
    def weights(self) -> np.ndarray:
        """(m,) mixture weights."""
        return self._materialise()[0]

    @property
    def n_blocks(self) -> int:
        """Blocks of the chain (a block's orders differ only inside it)."""
        return len(self._blocks)

    @property
    def n_orders(self) -> int:
        """Number of mixture components ``m`` (the union of the blocks' breakpoints, plus one)."""
        cuts = np.unique(np.concatenate([blk.cumw[:-1] for blk in self._blocks] + [np.empty(0)]))
        return int(np.count_nonzero((cuts > 0) & (cuts < 1))) + 1

    # -- exact quantities -----------------------------------------------
    def _separated(self, rej: np.ndarray, resid: np.ndarray) -> bool:
        """Whether every order puts every residual cell before every rejectable token (then no pair term)."""
        br, bz = self._block_of[resid], self._block_of[rej]
        last, first = int(br.max()), int(bz.min())
        if last != first:
            return last < first  # blocks keep their chain order in every order
        blk = self._blocks[last]
        lr = self._local[resid[br == last]]
        lz = self._local[rej[bz == last]]
        if blk.ranks is None:
            return int(lr.max()) < int(lz.min())
        return bool(np.all(blk.ranks[:, lr].max(axis=1) < blk.ranks[:, lz].min(axis=1)))

    def _exact_acceptance(self, alpha: float, tol: float) -> float:
        r""":math:`P(Y \in S(X)) = \sum_y \min(z, q)` plus the chance that a rejection's residual draw hits a draft.

        The second term vanishes when every order puts the residual's
        support (``z < q``) before every rejectable token (``z > q``), the
        case of an optimal mixture (checked on the chain of blocks, without
        materialising the orders); otherwise it is summed exactly, pair by
        pair: for ``Z`` at position ``i`` of an order and ``y`` after it,
        :math:`P(Z, y \in S) = [c^k - (c - p_Z)^k] - [(c - p_y)^k - (c - p_y - p_Z)^k]`
        with ``c`` the mass from position ``i`` on (above ``k = 64`` every
        power from its complement, :func:`_pair_term_from_depths`). Rounding noise (the
        smallest ``|z - q|`` cells, up to a total of 1e-12 on each side) is
        left out, an error of at most 2e-12.

        The pair sum is evaluated in row chunks of at most ``_CHUNK`` cells
        (bounded memory). When it would exceed ``_PAIR_BUDGET`` cells (long
        vocabulary tails at full vocabulary size) and ``alpha - base <= tol``,
        it is not evaluated: the acceptance of a lossless verifier cannot
        exceed :math:`\alpha_k`, so ``0 <= extra <= alpha - base <= tol`` and
        ``base`` is exact to within ``tol``.
        """
        p, q, k, z = self.p, self.q, self.k, self._z
        # sum(min(z, q)) as 1 - (mass the residual must supply): a probability never above 1 in float64 (the sum
        # itself where below 1/2)
        base = complement(np.maximum(q - z, 0.0).sum(), lambda: np.minimum(z, q).sum())
        # Rounding noise where z = q in exact arithmetic is left out: a rejectable
        # token Z adds at most (1 - a(Z)) z(Z) = (z - q)_+(Z), a residual cell y at
        # most P(reject) r(y) = (q - z)_+(y); the smallest of each, up to a total
        # of _NOISE each, are skipped.
        rej = above_noise(np.where(p > 0, z - q, 0.0), _NOISE)
        resid = above_noise(np.where(p > 0, q - z, 0.0), _NOISE)
        if rej.size == 0 or resid.size == 0 or self._separated(rej, resid):
            return base
        _, orders, ranks = self._materialise()
        weights = self.weights
        last_res = ranks[:, resid].max(axis=1)
        first_rej = ranks[:, rej].min(axis=1)
        flagged = np.flatnonzero(first_rej < last_res)
        # cells of the pair sum: only rejectable tokens ranked before the last
        # residual cell, and residual cells ranked after the first rejectable token
        # (counted only when it matters: the bound |flagged| |rej| |resid| already within the budget decides alike)
        if alpha - base <= tol and flagged.size * rej.size * resid.size > _PAIR_BUDGET:
            work = sum(
                int(np.count_nonzero(ranks[j, rej] < last_res[j]))
                * int(np.count_nonzero(ranks[j, resid] > first_rej[j]))
                for j in flagged
            )
            if work > _PAIR_BUDGET:
                return base
        extra = 0.0
        for j in flagged:
            o = orders[j]
            c = sm.suffix_masses(p[o], 0.0)[:-1]  # mass from each position on
            dep = None if sm.huge_above(k, 0.0) is None else sm.prefix_depths(p[o], 0.0)[:-1]  # mass before it
            zs = rej[ranks[j, rej] < last_res[j]]
            ys = resid[ranks[j, resid] > first_rej[j]]
            yj = ranks[j, ys][None, :]
            py = p[ys][None, :]
            ry = self._res[ys][None, :]
            step = max(1, _CHUNK // max(1, ys.size))
            for s0 in range(0, zs.size, step):
                zc = zs[s0 : s0 + step]
                rj = ranks[j, zc][:, None]
                ci = c[ranks[j, zc]][:, None]
                pz = p[zc][:, None]
                if dep is None:
                    with np.errstate(invalid="ignore"):
                        both = ci**k - np.maximum(ci - pz, 0) ** k - (
                            np.maximum(ci - py, 0) ** k - np.maximum(ci - py - pz, 0) ** k
                        )
                else:
                    both = _pair_term_from_depths(ci[:, 0], dep[ranks[j, zc]], pz[:, 0], py[0], k, rj < yj)
                both = np.where(rj < yj, np.maximum(both, 0.0), 0.0)
                terms = (1.0 - self._a[zc])[:, None] * ry * both
                extra += weights[j] * float(terms.sum())
        return base + extra

    def _select(self, S, j=None):
        """The block of the first present token and, per order of that block, the selected token."""
        S = np.asarray(S, dtype=np.int64)
        bid = self._block_of[S]
        b = int(bid.min())
        cand = S[bid == b]
        blk = self._blocks[b]
        loc = self._local[cand]
        if blk.ranks is None:
            return blk, cand[np.argmin(loc)]
        if j is None:
            return blk, cand[np.argmin(blk.ranks[:, loc], axis=1)]
        return blk, cand[np.argmin(blk.ranks[j, loc])]

    def selection_law(self, drafts) -> np.ndarray:
        """(n,) law of the selected token given the drafts (before the speculative step)."""
        x = self._drafts(drafts)
        blk, sel = self._select(np.unique(np.array(x, dtype=np.int64)))
        if blk.ranks is None:
            law = np.zeros(self.n)
            law[int(sel)] = 1.0
            return law
        return np.bincount(sel, weights=blk.weights, minlength=self.n)

    def _pick(self, x, gen) -> int:
        """The selected draft: one quantile picks the order of the first drafted block."""
        u = gen.random()
        bo = self._block_of
        b = min(bo[i] for i in x)
        blk = self._blocks[b]
        cand = [i for i in x if bo[i] == b]
        loc = self._local
        if blk.ranks is None:
            return int(min(cand, key=loc.__getitem__))
        j = min(int(np.searchsorted(blk.cumw, u, side="right")), blk.weights.shape[0] - 1)
        rk = blk.ranks[j]
        return int(min(cand, key=lambda i: rk[loc[i]]))

    def __repr__(self) -> str:
        return (
            f"OptimalVerifier(n={self.n}, k={self.k}, n_blocks={self.n_blocks}, "
            f"status={self.status!r}, gap={self.gap:.1e})"
        )


def _pair_term_from_depths(c, d, pz, py, k, after):
    r""":math:`[c^k - (c - p_Z)^k] - [(c - p_y)^k - (c - p_y - p_Z)^k]` with every power from its complement.

    Rows: the tokens ``Z`` (``c`` the mass from ``Z``'s position on, ``d``
    its complement, the mass before ``Z`` summed on its own, ``pz`` the
    mass of ``Z``); columns: the tokens ``y`` (mass ``py``); evaluated on
    the cells where ``after`` (``y`` after ``Z``), zero elsewhere.
    :math:`(c - p_y)^k` has complement ``d + p_y``
    (:func:`_submodular.increments` with ``depth``), so no ``c**k`` of a
    suffix sum is formed (huge ``k``).
    """
    both = np.zeros(after.shape)
    iz, iy = np.nonzero(after)
    if iz.size:
        # one call for both increments, one per Z then one per cell (elementwise: the same values as two calls)
        nz = pz.shape[0]
        pyy = py[iy]
        inc = sm.increments(np.concatenate([pz, pz[iz]]), np.concatenate([c, c[iz] - pyy]), k,
                            np.concatenate([d, d[iz] + pyy]))
        both[iz, iy] = inc[:nz][iz] - inc[nz:]
    return both


def _direct(ps, qs, k, in0, max_iter):
    """Two greedy passes for an optimal ``z``, then its decomposition; blocks in support positions."""
    z, H, O, s = sm.optimal_selection_law(ps, qs, k, in0)
    budget = [max_iter]
    children = []
    zmix = np.zeros(ps.shape[0])
    # above k = 64 the powers come from the mass before each block: 0 before H, p(H) before Omega_0
    if H.size:
        children.append(sm.decompose_block(H, ps[H], z[H], s, k, 1e-12, budget, zmix, sm.huge_above(k, 0.0)))
    if O.size:
        above_O = sm.huge_above(k, float(ps[H].sum()))
        children.append(sm.decompose_block(O, ps[O], z[O], 0.0, k, 1e-12, budget, zmix, above_O))
    blocks = []
    for node in sm.top_blocks(["chain", children, ps.shape[0]]):
        if node[0] == "leaf":
            blocks.append((np.ones(1), node[1][None, :]))
        else:
            blocks.append(sm.flatten_tree(node))
    n_iter = max_iter - budget[0]
    return blocks, zmix, ("optimal" if budget[0] > 0 else "max_iter"), n_iter


def _lift(blocks, supp):
    """Blocks of support positions -> blocks of token ids (nothing to do when every token has p > 0)."""
    if supp.shape[0] and int(supp[-1]) == supp.shape[0] - 1:
        return blocks
    return [(w, supp[np.asarray(o)]) for w, o in blocks]


def optimal_verifier(
    p,
    q,
    k,
    *,
    method: str = "keys",
    tol: float | None = None,
    max_iter: int | None = None,
    normalize: bool = False,
) -> OptimalVerifier | PriorityKeyVerifier:
    r"""The exactly optimal ``k``-draft verifier: an optimal selection rule plus one speculative step.

    .. math::

        \max_{z \in B(g)} \sum_y \min\big(z(y), q(y)\big) = \alpha_k(p, q)
          = \min_{\Omega_0 \subseteq \Omega} \big[1 + q(\Omega_0) - p(\Omega_0)^k\big],
        \qquad g(A) = 1 - (1 - p(A))^k,

    where :math:`B(g)` is the base polytope of ``g``, whose vertices are the
    laws of the priority-order selection rules. The verifier selects one
    draft by a rule whose selected-token law ``z`` is an optimal point of
    :math:`B(g)`, then accepts it with probability :math:`\min(1, q/z)` or
    resamples from :math:`(q - z)_+`; it is lossless and its acceptance
    :math:`P(Y \in S(X))` equals :math:`\alpha_k(p, q)`.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (small model).
    q : (n,) array_like of float
        Target distribution (large model).
    k : int
        Number of i.i.d. drafts.
    method : {"keys", "direct", "colgen"}, keyword-only
        ``"keys"`` (default): the optimal ``z`` by two greedy passes on the
        min-cut split, realised directly by *independent priority keys*:
        each draft draws a key uniform on its token's set of intervals of
        :math:`[0, 1]` (total length ``p``), the largest key wins
        (:class:`otspec.PriorityKeyVerifier`; the sets come from one stack
        pass after a sort, at most ``2 n + 1`` intervals; no decomposition).
        If it misses :math:`\alpha_k` by more than ``tol`` it falls back to
        ``"direct"``. ``"direct"``: the same ``z`` decomposed into a mixture
        of priority orders along chains of tight sets
        (:class:`otspec.OptimalVerifier`, with ``orders`` and ``weights``); if
        the result misses :math:`\alpha_k` by more than ``tol`` it falls back
        to column generation warm-started with the orders found.
        ``"colgen"``: column generation only (master LP over the orders found
        so far in HiGHS, pricing by one sort).
    tol : float, keyword-only
        Largest ``|gap|``, ``gap = alpha_k - acceptance``, reported as ``"optimal"``;
        default ``max(OPTIMALITY_TOL, 4 (n + min(k, 64) + m) eps)`` for ``"direct"``
        with ``m`` the number of orders (1e-12, or the rounding bound of the
        closed form :math:`\alpha_k`, the ``k``-th powers and the
        ``m``-term mixture sum when ``n + k + m`` exceeds about 1100; above
        ``k = 64`` the powers come from prefix masses and round by a
        ``k``-independent amount) and
        :data:`LP_OPTIMALITY_TOL` (1e-10, the LP's feasibility tolerance)
        for ``"colgen"`` and the fallback.
    max_iter : int, keyword-only
        Budget of Carathéodory steps (direct; default ``4 n``) or pricing
        rounds (column generation; default ``n + 200``; the fallback after
        a direct construction gets at most 50 rounds). When the fallback
        does not improve on the direct mixture, the direct one is returned.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.

    Returns
    -------
    PriorityKeyVerifier or OptimalVerifier
        The verifier (``PriorityKeyVerifier`` for ``"keys"``, else
        ``OptimalVerifier`` with its ``orders`` and ``weights``), with its
        selected-token law ``z``, ``alpha``, ``gap``, ``tol`` and ``status``. A construction that stops
        short of :math:`\alpha_k` says so in ``status`` and ``gap``; it is
        still lossless. ``status`` is ``"optimal"`` when ``|gap| <= tol``,
        ``"rounding"`` when the gap exceeds ``tol`` by no more than the
        construction's float64 rounding bound (the key layout's bound, or an
        acceptance above :math:`\alpha_k` by rounding alone when ``tol`` is
        below the bound), else ``"suboptimal"``, ``"max_iter"``,
        ``"stalled"`` or ``"solver:<HiGHS status>"``.

    Raises
    ------
    ValueError
        If ``p``/``q`` are not distributions of the same length, ``k < 1``,
        ``k >= 2**63`` with ``method="keys"``, ``method`` is unknown or
        ``tol`` is negative or not finite.
    TypeError
        If ``k`` or ``max_iter`` is not an integer, or ``tol`` not a real number.
    RuntimeError
        If the construction's acceptance exceeds :math:`\alpha_k` by more
        than its float64 rounding bound (an internal error: no valid
        selection rule accepts more than the optimum; the message gives
        the numbers).

    See Also
    --------
    alpha_k : the optimal acceptance in closed form.
    otm_lp : the optimal transport plan by linear programming (small inputs).

    Notes
    -----
    ``"keys"``: one sort for the min cut, the greedy passes below, one sort
    per side of the cut and one stack pass (amortised :math:`O(1)` per
    token, compiled by numba when the ``fast`` extra is installed); 15--40
    argsorts of the vocabulary on real next-token laws at ``n = 49152``
    (docs, "Measured performance"). Its default ``tol`` is
    ``max(1e-12, 4 n eps)``, the same at every ``k``. Up to ``k = 64`` the
    layout is stored in suffix mass ``s``: its float64 interval ends cost up
    to :math:`4 (n + k)\varepsilon + 8 k \varepsilon \sum_j s_j^{k-1}` over
    the intervals' tops :math:`s_j` (the key law's density is
    :math:`k s^{k-1}`; measured gaps at most ``4e-11`` at ``k = 64`` on
    ``n = 49,152``). Above ``k = 64`` it is stored in the depth coordinate
    :math:`x = s - 1` (minus the draft mass above ``s``, with full relative
    accuracy where the law of the largest key sits, within about ``1/k`` of
    ``s = 1``; :math:`s^k = e^{k \operatorname{log1p}(x)}`), and the greedy pass's powers
    on ``H`` come from prefix masses, so an end :math:`x_j = -t_j` costs
    :math:`8 \varepsilon\, k t_j (1 - t_j)^{k-1} \le 8 \varepsilon`: the
    bound :math:`4 n \varepsilon + 8 \varepsilon \sum_j k t_j
    (1 - t_j)^{k-1} \le 4 (n + 2P)\varepsilon` does not grow with ``k``
    (measured gaps below ``1e-12`` at every ``k`` from ``65`` to ``2^62``
    on ``n = 49,152``; formerly ``5e-9`` at ``k = 10^4``, ``4e-7`` at
    ``10^6`` and ``8e-2`` at ``2^40``). A gap above ``tol`` that the bound
    explains gets the status ``"rounding"`` and is returned as is (no
    fallback: the mixture of orders rounds no better at such ``k``, and
    takes hours). It can still happen only at ``k <= 64`` (the suffix-mass
    bound above): above it both greedy passes, on their fast path
    (``z = q`` when :math:`\alpha_k = 1`) and on their slow path (taken
    when :math:`\alpha_k < 1`), take every power of a suffix mass ``c``
    from its complement, the prefix mass ``d = 1 - c`` summed on its own
    (:math:`c^k = e^{k \operatorname{log1p}(-d)}`, never ``c**k``, which
    amplifies the rounding of ``c`` ``k``-fold and overflows at
    ``k = 2^62`` once ``c`` rounds above 1), so the greedy ``z`` rounds by
    a ``k``-independent amount too (measured gaps below ``1e-12`` at every
    ``k`` from ``65`` to ``2^62`` on ``n = 49,152`` Dirichlet(0.1) pairs
    with :math:`\alpha_k` from 0.39 to 0.99; formerly up to ``1.3e-2`` at
    ``2^40``).
    ``acceptance()`` and ``gap`` are exact for the intervals as stored, and
    ``z`` sums to 1 within ``4 n eps``. ``sample`` costs :math:`O(k \log n)` and ``conditional``
    :math:`O(I k)` for the ``I`` intervals of the drafted tokens.

    ``"direct"``: one sort for the min cut and :math:`O(n)` more for the greedy
    pass on :math:`\Omega_0`; the pass on ``H`` costs :math:`O(|W|)` per
    token, with ``W`` the tokens capped by ``q`` and not yet in a tight set
    (short on LLM-like pairs; :math:`O(n)` outright when
    :math:`\alpha_k = 1`); each Carathéodory step is a sort and a few scans
    of the block it splits, and the decomposition stops refining a branch
    once its weight is below 1e-18; everything runs on an explicit work
    stack (no recursion). Measured: tens of milliseconds at ``n = 1000``;
    at ``n = 49152`` (real next-token laws) a few hundred milliseconds for
    ``k = 2`` and seconds for ``k >= 8``, where one large block without
    tight sets needs one step per peeled token (docs, "Measured
    performance"). The mixture is kept as a chain of blocks, each with its
    own orders: ``sample`` costs :math:`O(k + \log m)`, ``conditional``
    :math:`O(m_B k + n)` for the ``m_B`` orders of the first drafted block,
    and the blocks take :math:`2 \sum_B m_B |B|` int32 entries (orders and
    ranks; far below ``m n`` when the tight chain is long). ``orders`` and
    ``weights`` materialise the global ``(m, n)`` mixture on first access.
    Above ``k = 64`` (``"direct"``, ``"colgen"`` and the fallback) every
    power of a suffix mass ``c`` -- in the decomposition's vertices, block
    totals and exit sets, the column generation's greedy vertices, ``z`` and
    the pair term of ``acceptance()`` -- is taken from the draft mass ``d``
    before it, :math:`c^k = e^{k \operatorname{log1p}(-d)}`, each block
    carrying the mass before it; measured direct gaps at most ``9.9e-13`` at
    every ``k`` from ``65`` to ``2^62`` on ``n <= 1000`` (docs, "Measured
    performance"; formerly ``z`` off by up to ``1.4e-3`` in its
    sum at ``2^40`` with status ``"optimal"`` under a tolerance that grew as
    ``4 k eps``, and an overflow or an empty ``argmin`` at ``2^62``); any
    ``k`` is accepted (``k >= 2^63`` too).

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", NeurIPS 2023, eq. (4) (the OTM-k LP
       whose optimum this verifier attains).
    .. [2] Fujishige, "Submodular Functions and Optimization", 2nd ed.,
       Elsevier 2005, §3 (base polytopes, greedy vertices).

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> v = otspec.optimal_verifier(p, q, 2)
    >>> v.status, round(v.acceptance(), 12), round(float(otspec.alpha_k(p, q, 2)), 12)
    ('optimal', 0.86, 0.86)
    >>> chk = otspec.check_lossless(v)
    >>> bool(chk.max_marginal_error < 1e-12), bool(chk.acceptance_error < 1e-12)
    (True, True)
    """
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(unknown_name_message("method", method, _METHODS))
    tol = validate_tol(tol, allow_none=True)
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    n = p_.shape[0]
    if max_iter is not None:
        max_iter = validate_positive_int(max_iter, "max_iter")
    supp = np.flatnonzero(p_ > 0)
    ps, qs = p_[supp], q_[supp]
    cut = min_cut(p_, q_, k)
    alpha = cut.alpha
    in0 = np.zeros(n, dtype=bool)
    in0[cut.omega0] = True
    in0 = in0[supp]

    if method == "keys":
        if k >= _KEYS_MAX_K:
            raise ValueError(f"`k`={k} is beyond the priority-key layout (`method`='keys' takes k < 2**63, where the "
                             f"compiled layout counts drafts in int64); use method='direct'")
        keyed = build_keys(p_, q_, ps, qs, supp, k, in0, alpha, tol)
        if keyed.success or keyed.status == "rounding":
            # "rounding": the optimal layout, short of alpha_k only by its float64 interval ends or the
            # greedy z's rounding (bounds in build_keys); the mixture of orders is no more exact there
            return keyed
        method = "direct"  # fall back to the mixture of priority orders (and column generation)
    direct = None
    if method == "direct":
        budget = 4 * supp.shape[0] if max_iter is None else max_iter
        blocks, zmix, status, n_iter = _direct(ps, qs, k, in0, budget)
        zfull = np.zeros(n)
        zfull[supp] = zmix
        dtol = _rounding_bound(n, k, blocks) if tol is None else tol
        direct = OptimalVerifier(p_, q_, k, _lift(blocks, supp), alpha=alpha, status=status,
                                 method="direct", n_iter=n_iter, tol=dtol, z=zfull)
        if direct.success or direct.status == "rounding":
            # "rounding": above alpha_k by its rounding alone (a tol below the bound): no LP does better
            return direct
        # warm start: the direct mixture's orders (at most _WARM of them), in support positions
        pos = np.full(n, -1, dtype=np.int64)
        pos[supp] = np.arange(supp.shape[0])
        init = pos[direct.orders[:_WARM, : supp.shape[0]]]
        used = "direct+colgen"
        budget = 50 if max_iter is None else max_iter
    else:
        init = ()
        used = "colgen"
        budget = supp.shape[0] + 200 if max_iter is None else max_iter
    tol = LP_OPTIMALITY_TOL if tol is None else tol
    w, orders, status, n_iter = sm.column_generation(ps, qs, k, alpha, init_orders=init, tol=tol, max_iter=budget)
    orders = np.asarray(orders).reshape(len(orders), supp.shape[0])
    v = OptimalVerifier(p_, q_, k, [(w, supp[orders])], alpha=alpha, status=status, method=used, n_iter=n_iter, tol=tol)
    if direct is not None and not direct.gap > v.gap:
        return direct
    return v
