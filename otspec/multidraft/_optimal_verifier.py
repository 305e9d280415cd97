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

import sys

import numpy as np

from .._validation import as_rng, validate_k, validate_pair, validate_positive_int
from .._verifier import Verifier
from ..otm._alpha import min_cut
from . import _submodular as sm

__all__ = ["OptimalVerifier", "optimal_verifier", "OPTIMALITY_TOL", "LP_OPTIMALITY_TOL"]

#: Default tolerance on the gap ``alpha_k - acceptance`` for the status ``"optimal"``
#: (direct construction; column generation defaults to :data:`LP_OPTIMALITY_TOL`).
OPTIMALITY_TOL = 1e-12
#: Default gap tolerance of column generation: the master LP is solved by
#: HiGHS to a feasibility tolerance of 1e-10, so its weights are no more exact.
LP_OPTIMALITY_TOL = 1e-10

_METHODS = ("direct", "colgen")
_NOISE = 1e-12
#: Largest number of (rejectable, residual) cells summed exactly when the bound suffices.
_PAIR_BUDGET = 20_000_000
#: Cells per chunk of the pair sum (bounds its memory to a few tens of MB).
_CHUNK = 1 << 21


def _above_noise(excess: np.ndarray) -> np.ndarray:
    """Indices of the positive entries of ``excess`` left after skipping the smallest ones up to a total of ``_NOISE``."""
    pos = np.flatnonzero(excess > 0)
    if pos.size == 0:
        return pos
    srt = pos[np.argsort(excess[pos], kind="stable")]
    csum = np.cumsum(excess[srt])
    return np.sort(srt[csum > _NOISE])


class OptimalVerifier(Verifier):
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

    Use :func:`optimal_verifier` to construct it.

    Attributes
    ----------
    k : int
        Number of drafts.
    p, q : (n,) ndarray of float64, read-only
        Draft and target distributions.
    orders : (m, n) ndarray of int, read-only
        The priority orders, one per row (a permutation of ``range(n)``;
        tokens with ``p = 0`` come last in every order).
    weights : (m,) ndarray of float64, read-only
        Mixture weights (positive, summing to 1).
    z : (n,) ndarray of float64, read-only
        Law of the selected token, :math:`z = \sum_j w_j v_{\sigma_j}` with
        :math:`v_\sigma` the greedy vertex of :math:`\sigma`.
    alpha : float
        :math:`\alpha_k(p, q)`, the optimum (closed form, one sort).
    gap : float
        ``alpha - acceptance()``; zero up to rounding when ``status == "optimal"``.
    status : str
        ``"optimal"`` when ``gap <= tol``; otherwise why the construction
        stopped short (``"max_iter"``, ``"stalled"``, ``"solver:<HiGHS status>"``).
    method : str
        The construction that produced the mixture (``"direct"``,
        ``"direct+colgen"`` after a fallback, or ``"colgen"``).
    n_iter : int
        Carathéodory steps (direct) or pricing rounds (column generation).
    tol : float
        The gap tolerance behind ``status``.
    """

    def __init__(self, p, q, k, orders, weights, *, alpha, status, method, n_iter, tol):
        self.k = k
        self.p = p
        self.q = q
        n = p.shape[0]
        itype = np.int32 if n < 2**31 else np.int64
        orders = np.ascontiguousarray(orders, dtype=itype)
        weights = np.asarray(weights, dtype=np.float64)
        ranks = np.empty(orders.shape, dtype=itype)
        positions = np.arange(n, dtype=itype)
        for j in range(orders.shape[0]):
            ranks[j, orders[j]] = positions
        self._orders = orders
        self._ranks = ranks
        self._weights = weights
        self._cumw = np.cumsum(weights)
        self._cumw[-1] = 1.0
        z = np.zeros(n)
        supp = p > 0
        full = bool(supp.all())
        for w, o in zip(weights, orders):
            os_ = o if full else o[supp[o]]
            z[os_] += w * sm.vertex(p[os_], 0.0, k)
        self._z = z
        with np.errstate(divide="ignore", invalid="ignore"):
            # a(y) = min(1, q/z); tokens never selected (z = 0) keep a = 1
            a = np.where(z > q, q / np.where(z > 0, z, 1.0), 1.0)
        self._a = a
        r = np.maximum(q - z, 0.0)
        rs = r.sum()
        self._res = r / rs if rs > 0 else np.array(q)
        self._res_cdf = np.cumsum(self._res)
        self._res_last = int(np.flatnonzero(self._res > 0)[-1]) if np.any(self._res > 0) else n - 1
        self._acceptance = self._exact_acceptance(float(alpha), float(tol))
        self._alpha = float(alpha)
        self._gap = float(self._alpha - self._acceptance)
        self._status = "optimal" if self._gap <= tol else (status if status != "optimal" else "suboptimal")
        self._method = str(method)
        self._n_iter = int(n_iter)
        self._tol = float(tol)
        for arr in (self._orders, self._ranks, self._weights, self._z, self._a, self._res):
            arr.setflags(write=False)

    # -- reported structure ---------------------------------------------
    @property
    def orders(self) -> np.ndarray:
        """(m, n) priority orders, one per row."""
        return self._orders

    @property
    def weights(self) -> np.ndarray:
        """(m,) mixture weights."""
        return self._weights

    @property
    def z(self) -> np.ndarray:
        """(n,) law of the selected token."""
        return self._z

    @property
    def residual(self) -> np.ndarray:
        """(n,) normalised residual :math:`(q - z)_+ / \\sum (q - z)_+` drawn after a rejection."""
        return self._res

    @property
    def alpha(self) -> float:
        """:math:`\\alpha_k(p, q)`, the optimum (closed form)."""
        return self._alpha

    @property
    def gap(self) -> float:
        """``alpha - acceptance()`` (zero up to rounding when optimal)."""
        return self._gap

    @property
    def status(self) -> str:
        """``"optimal"`` when ``gap <= tol``, else why the construction stopped short."""
        return self._status

    @property
    def method(self) -> str:
        """The construction used: ``"direct"``, ``"direct+colgen"`` or ``"colgen"``."""
        return self._method

    @property
    def n_iter(self) -> int:
        """Carathéodory steps (direct) or pricing rounds (column generation)."""
        return self._n_iter

    @property
    def tol(self) -> float:
        """The gap tolerance behind ``status``."""
        return self._tol

    @property
    def n_orders(self) -> int:
        """Number of mixture components ``m``."""
        return int(self._weights.shape[0])

    @property
    def success(self) -> bool:
        """``status == "optimal"``."""
        return self.status == "optimal"

    # -- exact quantities -----------------------------------------------
    def _exact_acceptance(self, alpha: float, tol: float) -> float:
        r""":math:`P(Y \in S(X)) = \sum_y \min(z, q)` plus the chance that a rejection's residual draw hits a draft.

        The second term vanishes when every order puts the residual's
        support (``z < q``) before every rejectable token (``z > q``), the
        case of an optimal mixture; otherwise it is summed exactly, pair by
        pair: for ``Z`` at position ``i`` of an order and ``y`` after it,
        :math:`P(Z, y \in S) = [c^k - (c - p_Z)^k] - [(c - p_y)^k - (c - p_y - p_Z)^k]`
        with ``c`` the mass from position ``i`` on. Rounding noise (the
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
        base = float(np.minimum(z, q).sum())
        # Rounding noise where z = q in exact arithmetic is left out: a rejectable
        # token Z adds at most (1 - a(Z)) z(Z) = (z - q)_+(Z), a residual cell y at
        # most P(reject) r(y) = (q - z)_+(y); the smallest of each, up to a total
        # of _NOISE each, are skipped.
        rej = _above_noise(np.where(p > 0, z - q, 0.0))
        resid = _above_noise(np.where(p > 0, q - z, 0.0))
        if rej.size == 0 or resid.size == 0:
            return base
        ranks = self._ranks
        last_res = ranks[:, resid].max(axis=1)
        first_rej = ranks[:, rej].min(axis=1)
        flagged = np.flatnonzero(first_rej < last_res)
        # cells of the pair sum: only rejectable tokens ranked before the last
        # residual cell, and residual cells ranked after the first rejectable token
        work = sum(
            int(np.count_nonzero(ranks[j, rej] < last_res[j])) * int(np.count_nonzero(ranks[j, resid] > first_rej[j]))
            for j in flagged
        )
        if work > _PAIR_BUDGET and alpha - base <= tol:
            return base
        extra = 0.0
        for j in flagged:
            o = self._orders[j]
            c = sm.suffix_masses(p[o], 0.0)[:-1]  # mass from each position on
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
                with np.errstate(invalid="ignore"):
                    both = ci**k - np.maximum(ci - pz, 0) ** k - (np.maximum(ci - py, 0) ** k - np.maximum(ci - py - pz, 0) ** k)
                both = np.where(rj < yj, np.maximum(both, 0.0), 0.0)
                terms = (1.0 - self._a[zc])[:, None] * ry * both
                extra += self._weights[j] * float(terms.sum())
        return base + extra

    def selection_law(self, drafts) -> np.ndarray:
        """(n,) law of the selected token given the drafts (before the speculative step)."""
        x = self._drafts(drafts)
        S = np.unique(np.array(x, dtype=np.int64))
        sel = S[np.argmin(self._ranks[:, S], axis=1)]
        return np.bincount(sel, weights=self._weights, minlength=self.n)

    def conditional(self, drafts) -> np.ndarray:
        law = self.selection_law(drafts)
        acc = law * self._a
        out = (float(law.sum()) - float(acc.sum())) * self._res
        out += acc
        return out

    def acceptance(self) -> float:
        return self._acceptance

    def sample(self, drafts, *, rng=None) -> int:
        x = self._drafts(drafts)
        gen = as_rng(rng)
        j = min(int(np.searchsorted(self._cumw, gen.random(), side="right")), self._weights.shape[0] - 1)
        rk = self._ranks[j]
        y = min(x, key=rk.__getitem__)
        # division-free acceptance test u * z(y) <= q(y)
        if gen.random() * self._z[y] <= self.q[y]:
            return int(y)
        # inverse CDF on the precomputed cumulative residual, O(log n)
        c = self._res_cdf
        i = int(np.searchsorted(c, gen.random() * c[-1], side="right"))
        i = min(i, self._res_last)
        while self._res[i] <= 0 and i > 0:  # skip zero-mass cells (rounding at a boundary)
            i -= 1
        return i

    def __repr__(self) -> str:
        return (
            f"OptimalVerifier(n={self.n}, k={self.k}, n_orders={self.n_orders}, "
            f"status={self.status!r}, gap={self.gap:.1e})"
        )


def _direct(ps, qs, k, in0, max_iter):
    """Two greedy passes for an optimal ``z``, then its decomposition; orders in support positions."""
    z, H, O, s = sm.optimal_selection_law(ps, qs, k, in0)
    budget = [max_iter]
    children = []
    limit = sys.getrecursionlimit()
    # the recursion depth is at most the number of tokens (each level splits a block)
    sys.setrecursionlimit(max(limit, 10 * ps.shape[0] + 1000))
    try:
        if H.size:
            children.append(sm.decompose_block(H, ps[H], z[H], s, k, 1e-12, budget))
        if O.size:
            children.append(sm.decompose_block(O, ps[O], z[O], 0.0, k, 1e-12, budget))
        w, orders = sm.flatten_tree(("chain", children), ps.shape[0])
    finally:
        sys.setrecursionlimit(limit)
    n_iter = max_iter - budget[0]
    return w, orders, ("optimal" if budget[0] > 0 else "max_iter"), n_iter


def _full_orders(orders_supp, supp, zero):
    """Lift orders of support positions to permutations of all tokens (``p = 0`` tokens last)."""
    n = supp.shape[0] + zero.shape[0]
    itype = np.int32 if n < 2**31 else np.int64
    if isinstance(orders_supp, np.ndarray) and orders_supp.ndim == 2:
        orders_supp = orders_supp.astype(itype, copy=False)
    else:
        orders_supp = np.asarray(orders_supp, dtype=itype).reshape(len(orders_supp), supp.shape[0])
    if zero.shape[0] == 0:
        return orders_supp  # supp is arange(n): support positions are token ids
    m = orders_supp.shape[0]
    out = np.empty((m, n), dtype=itype)
    out[:, : supp.shape[0]] = supp.astype(itype)[orders_supp]
    out[:, supp.shape[0] :] = zero[None, :]
    return out


def optimal_verifier(
    p,
    q,
    k,
    *,
    method: str = "direct",
    tol: float | None = None,
    max_iter: int | None = None,
    normalize: bool = False,
) -> OptimalVerifier:
    r"""The exactly optimal ``k``-draft verifier: a mixture of priority orders plus one speculative step.

    .. math::

        \max_{z \in B(g)} \sum_y \min\big(z(y), q(y)\big) = \alpha_k(p, q)
          = \min_{\Omega_0 \subseteq \Omega} \big[1 + q(\Omega_0) - p(\Omega_0)^k\big],
        \qquad g(A) = 1 - (1 - p(A))^k,

    where :math:`B(g)` is the base polytope of ``g``, whose vertices are the
    laws of the priority-order selection rules. The verifier selects a
    draft by a mixture of at most ``n + 1`` priority orders, then accepts it
    with probability :math:`\min(1, q/z)` or resamples from
    :math:`(q - z)_+`; it is lossless and its acceptance
    :math:`P(Y \in S(X))` equals :math:`\alpha_k(p, q)`.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (small model).
    q : (n,) array_like of float
        Target distribution (large model).
    k : int
        Number of i.i.d. drafts.
    method : {"direct", "colgen"}, keyword-only
        ``"direct"``: the optimal ``z`` by two greedy passes on the min-cut
        split, then a Carathéodory decomposition into priority orders along
        chains of tight sets; if the result misses :math:`\alpha_k` by more
        than ``tol`` it falls back to column generation warm-started with
        the orders found. ``"colgen"``: column generation only (master LP
        over the orders found so far in HiGHS, pricing by one sort).
    tol : float, keyword-only
        Largest gap ``alpha_k - acceptance`` reported as ``"optimal"``;
        default ``max(OPTIMALITY_TOL, 4 (n + k) eps)`` for ``"direct"``
        (1e-12, or the error bound of the closed form :math:`\alpha_k`
        itself when ``n + k`` exceeds about 1100) and :data:`LP_OPTIMALITY_TOL` (1e-10, the
        LP's feasibility tolerance) for ``"colgen"`` and the fallback.
    max_iter : int, keyword-only
        Budget of Carathéodory steps (direct; default ``4 n``) or pricing
        rounds (column generation; default ``n + 200``; the fallback after
        a direct construction gets at most 50 rounds). When the fallback
        does not improve on the direct mixture, the direct one is returned.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.

    Returns
    -------
    OptimalVerifier
        The verifier, with its ``orders``, ``weights``, selected-token law
        ``z``, ``alpha``, ``gap`` and ``status``. A construction that stops
        short of :math:`\alpha_k` says so in ``status`` and ``gap``; it is
        still lossless.

    Raises
    ------
    ValueError
        If ``p``/``q`` are not distributions of the same length, ``k < 1``,
        ``method`` is unknown or ``tol`` is negative or not finite.
    TypeError
        If ``k`` or ``max_iter`` is not an integer, or ``tol`` not a real number.

    See Also
    --------
    alpha_k : the optimal acceptance in closed form.
    otm_lp : the optimal transport plan by linear programming (small inputs).

    Notes
    -----
    Cost: one sort for the min cut and :math:`O(n)` more for the greedy
    pass on :math:`\Omega_0`; the pass on ``H`` costs :math:`O(|W|)` per
    token, with ``W`` the tokens capped by ``q`` and not yet in a tight set
    (short on LLM-like pairs; :math:`O(n)` outright when
    :math:`\alpha_k = 1`); each Carathéodory step is a sort and a few scans
    of the block it splits, and the decomposition stops refining a branch
    once its weight is below 1e-18. Measured: about 50 ms at ``n = 1000``,
    ``k = 8`` and 1-3 s at ``n = 32768`` (docs, "Measured performance").
    ``sample`` costs :math:`O(k + \log n)` and ``conditional``
    :math:`O(m k + n)` for ``m`` orders; the orders take :math:`2 m n`
    int32 entries (orders and their ranks).

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
        raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}")
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating, np.integer)):
            raise TypeError(f"`tol` must be a real number or None, got {type(tol).__name__}")
        tol = float(tol)
        if not (np.isfinite(tol) and tol >= 0):
            raise ValueError(f"`tol` must be a finite number >= 0, got {tol!r}")
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    n = p_.shape[0]
    if max_iter is not None:
        max_iter = validate_positive_int(max_iter, "max_iter")
    supp = np.flatnonzero(p_ > 0)
    zero = np.flatnonzero(p_ == 0)
    ps, qs = p_[supp], q_[supp]
    cut = min_cut(p_, q_, k)
    alpha = cut.alpha
    in0 = np.zeros(n, dtype=bool)
    in0[cut.omega0] = True
    in0 = in0[supp]

    direct = None
    if method == "direct":
        budget = 4 * supp.shape[0] if max_iter is None else max_iter
        w, orders, status, n_iter = _direct(ps, qs, k, in0, budget)
        # the closed form alpha_k is itself exact to about 4 n eps (prefix sums),
        # and k-th powers add about k eps
        dtol = max(OPTIMALITY_TOL, 4 * (n + k) * np.finfo(float).eps) if tol is None else tol
        direct = OptimalVerifier(p_, q_, k, _full_orders(orders, supp, zero), w, alpha=alpha, status=status,
                                 method="direct", n_iter=n_iter, tol=dtol)
        if direct.success:
            return direct
        init = orders
        used = "direct+colgen"
        budget = 50 if max_iter is None else max_iter
    else:
        init = ()
        used = "colgen"
        budget = supp.shape[0] + 200 if max_iter is None else max_iter
    tol = LP_OPTIMALITY_TOL if tol is None else tol
    w, orders, status, n_iter = sm.column_generation(ps, qs, k, alpha, init_orders=init, tol=tol, max_iter=budget)
    v = OptimalVerifier(p_, q_, k, _full_orders(orders, supp, zero), w,
                        alpha=alpha, status=status, method=used, n_iter=n_iter, tol=tol)
    if direct is not None and not direct.gap > v.gap:
        return direct
    return v
