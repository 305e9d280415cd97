r"""The exactly optimal ``k``-draft verifier by independent priority keys (no decomposition).

Each draft draws its own *key* :math:`S_i`, uniform on a set :math:`E_{x_i}
\subseteq [0, 1]` of Lebesgue measure :math:`p(x_i)` (the sets of the
tokens tile :math:`[0, 1]`); the draft with the largest key is selected.
The keys are then i.i.d. uniform on :math:`[0, 1]`, their maximum has
density :math:`k s^{k-1}`, and token ``x`` is selected with probability
:math:`z(x) = \mu(E_x)`, :math:`\mu([s_1, s_2]) = s_2^k - s_1^k`. Every
point of the base polytope of :math:`g(A) = 1 - (1 - p(A))^k` is reached by
such a *layout*, with at most ``2 n + 1`` intervals in all, found by one
stack pass after a sort (docs, "Theory: the optimal verifier", section
"Priority keys"). Followed by one speculative-sampling step of the selected
token against ``q``, the layout of an optimal ``z`` attains
:math:`\alpha_k(p, q)`.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import numpy as np

from .._verifier import complement, sample_from
from . import _keys_kernel as kk
from . import _submodular as sm
from ._selection import SelectThenSpeculate, above_noise

__all__ = ["PriorityKeyVerifier"]

_EPS = float(np.finfo(float).eps)
#: Above this ``k`` the layout is kept in the depth coordinate ``x = s - 1`` (at or below it, in ``s`` itself).
DEPTH_MIN_K = 64


def key_layout(pD: np.ndarray, zD: np.ndarray, b: float, k: int, *, jit: bool = True, above: float | None = None):
    r"""Intervals of suffix mass realising a base ``zD`` of :math:`g_D(A) = c^k - (c - p(A))^k`.

    .. math::

        \text{find } E_x \subseteq [b, c],\ \text{disjoint},\ |E_x| = p_x,\
        \mu(E_x) = z_x, \qquad \mu([s_1, s_2]) = s_2^k - s_1^k,\ c = b + p(D).

    Parameters
    ----------
    pD, zD : (m,) ndarray of float64
        Draft masses (positive) and a base of :math:`g_D` (the law to realise).
    b : float
        Draft mass after the block (its intervals lie in ``[b, c]``).
    k : int
        Number of drafts.
    jit : bool, keyword-only
        Use the numba-compiled kernel when numba is installed.
    above : float, keyword-only
        Draft mass before the block (``1 - c``, summed on its own). Given, the
        layout is built and returned in the *depth coordinate*
        :math:`x = s - 1 = -(\text{mass above } s)` (the block's top is
        ``-above``), where every end keeps full relative accuracy however
        close ``s`` is to 1; the powers are then :math:`s^k = e^{k \operatorname{log1p}(x)}`.
        ``None`` (default): the suffix mass ``s`` itself.

    Returns
    -------
    token : (P,) ndarray of int64
        Block-local token of each interval (``P <= 2 m + 1``).
    top : (P,) ndarray of float64
        Upper end of each interval: its suffix mass ``s``, or ``s - 1`` when ``above`` is given.
    length : (P,) ndarray of float64
        Its length; the interval is ``[top - length, top]``.
    """
    m = pD.shape[0]
    if m == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    order = np.argsort(-(zD / pD), kind="stable")
    if above is None:
        c, off = float(sm.suffix_masses(pD[order], b)[0]), 0
    else:
        c, off = -float(above), 1
    kern = kk.layout_kernel if jit else kk.layout_kernel_py
    tok, hi, ln, n = kern(np.ascontiguousarray(pD[order]), np.ascontiguousarray(zD[order]), c, int(k), off)
    return order[tok[:n]], hi[:n].copy(), ln[:n].copy()


def _power(x: np.ndarray, k: int, origin: int) -> np.ndarray:
    """``max(s, 0)**k`` at the positions ``s = origin + x`` (``origin = 1``: ``exp(k log1p(x))``, exact near ``x = 0``)."""
    if origin == 0:
        return np.maximum(x, 0.0) ** k
    out = np.zeros(x.shape)
    inside = x > -1.0
    out[inside] = np.exp(float(k) * np.log1p(x[inside]))
    return out


def _measure(top: np.ndarray, length: np.ndarray, k: int, origin: int) -> np.ndarray:
    r""":math:`\mu([s - w, s]) = s^k - (s - w)^k` of intervals with tops ``s = origin + top``; cut at ``s = 0``."""
    if origin == 0:
        return sm.increments(np.minimum(length, top), top, k)
    s = top + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(s > 0.0, np.minimum(length / s, 1.0), 1.0)
        t = float(k) * np.log1p(-r)
    return -np.expm1(t) * _power(top, k, origin)


class PriorityKeyVerifier(SelectThenSpeculate):
    r"""Selection by the largest of independent per-draft keys, then speculative sampling.

    Draft :math:`x_i` draws a key :math:`S_i` uniform on the set
    :math:`E_{x_i}` (intervals of :math:`[0, 1]` of total length
    :math:`p(x_i)`, the sets of all tokens tiling :math:`[0, 1]`); the draft
    with the largest key is selected, ``Z``, with law
    :math:`z(x) = \mu(E_x) = \sum_{[s_1, s_2] \subseteq E_x} s_2^k - s_1^k`;
    ``Z`` is accepted with probability :math:`\min(1, q(Z)/z(Z))`, otherwise
    the output is drawn from :math:`(q - z)_+ / \sum (q - z)_+`:

    .. math::

        K(y \mid x) = \sum_u \pi(u \mid x) \Big[ a(u)\, \mathbb 1\{y = u\}
            + \big(1 - a(u)\big) r(y) \Big], \qquad a = \min(1, q / z),

    with :math:`\pi(\cdot \mid x)` the law of the winning draft's token.
    The output law is exactly ``q`` whatever the sets; with the sets built
    for an optimal ``z`` the acceptance is :math:`\alpha_k(p, q)`.

    Use :func:`otspec.optimal_verifier` (``method="keys"``, the default)
    to construct it.

    Attributes
    ----------
    k : int
        Number of drafts.
    p, q : (n,) ndarray of float64, read-only
        Draft and target distributions.
    z : (n,) ndarray of float64, read-only
        Law of the selected token, summed from the intervals.
    pieces : tuple of three (P,) ndarrays, read-only
        ``(token, top, length)``: the intervals ``[top - length, top]`` of
        each token's key set, grouped by token (``P <= 2 n + 1``), ``top``
        in suffix mass ``s`` (rounded to float64 from the stored depth
        coordinate when ``origin == 1``).
    origin : int
        The coordinate the layout is stored, sampled and measured in: the
        intervals' ends are kept as ``x = s - origin``. ``0`` (``k <= 64``):
        the suffix mass itself. ``1`` (``k > 64``): the depth coordinate
        ``x = s - 1``, minus the draft mass above ``s``, which keeps full
        relative accuracy where the law of the largest key sits (within
        about ``1/k`` of ``s = 1``, where float64 ``s`` has spacing
        ``1.1e-16``), with :math:`s^k = e^{k \operatorname{log1p}(x)}`.
    layout : tuple of three (P,) ndarrays, read-only
        ``(token, x, length)``: the intervals as stored (``top = origin + x``).
    alpha, gap, status, method, tol
        As for :class:`otspec.OptimalVerifier`; ``method`` is ``"keys"``. The
        default ``tol`` is ``max(1e-12, 4 n eps)`` at every ``k``; ``status``
        is ``"optimal"`` when ``|gap| <= tol``. A larger
        gap that the float64 rounding bound of the interval ends explains
        (``origin == 0``: it grows with ``k``; ``origin == 1``: it does not,
        beyond the greedy ``z``'s own rounding) has the status
        ``"rounding"`` (on either side of :math:`\alpha_k`), any other
        positive gap ``"suboptimal"``; an acceptance above
        :math:`\alpha_k` beyond that bound raises :class:`RuntimeError`
        (no valid layout accepts more than the optimum).
    n_pieces : int
        Number of intervals ``P``.
    """

    def __init__(self, p, q, k, token, top, length, *, alpha, tol, bound=None, origin=0, slack=None):
        self.k = k
        self._origin = int(origin)
        self.p = p
        self.q = q
        n = p.shape[0]
        srt = np.argsort(token, kind="stable")
        token, top, length = token[srt], top[srt], length[srt]
        self._ptr = np.searchsorted(token, np.arange(n + 1))
        self._token, self._top, self._length = token, top, length
        # cumulative length inside each token's set (for drawing a key)
        cum = np.cumsum(length)
        start = np.concatenate([[0.0], cum])[self._ptr[:-1]]
        self._cum = cum - np.repeat(start, np.diff(self._ptr))
        # mu([top - length, top]); an interval reaching below 0 by rounding is cut at 0
        z = np.bincount(token, weights=_measure(top, length, k, self._origin), minlength=n)
        self._init_speculative(z)
        # `bound`: the float64 rounding bound of the layout (see build_keys); `tol`: the status tolerance;
        # `slack` (default `bound`): the rounding bound of an acceptance above alpha_k (given with a user tol)
        bound = float(tol) if bound is None else float(bound)
        acceptance = self._exact_acceptance(float(alpha), max(float(tol), bound))
        within = float(alpha) - acceptance <= bound
        self._init_report(alpha, acceptance, tol, "rounding" if within else "suboptimal", "keys", 0,
                          slack=bound if slack is None else slack)
        # tokens with an interval too short to show in float64 at its position (a mass like 1e-300
        # near s = 0.5): the interval is a point, which may sit inside another token's interval
        self._flat = np.zeros(n, dtype=bool)
        self._flat[token[(top - length >= top) & (length > 0)]] = True
        # the tops in suffix mass (the stored array itself when origin = 0)
        self._s_top = top if self._origin == 0 else top + float(self._origin)
        for arr in (self._ptr, self._token, self._top, self._length, self._cum, self._flat, self._s_top):
            arr.setflags(write=False)

    # -- reported structure ---------------------------------------------
    @property
    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(token, top, length)`` of every interval of the key sets, grouped by token, ``top`` in suffix mass."""
        return self._token, self._s_top, self._length

    @property
    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(token, x, length)``: the intervals as stored, ``top = origin + x`` (see :attr:`origin`)."""
        return self._token, self._top, self._length

    @property
    def origin(self) -> int:
        """``0``: the layout is stored in suffix mass ``s``; ``1``: in the depth coordinate ``x = s - 1``."""
        return self._origin

    @property
    def n_pieces(self) -> int:
        """Number of intervals of the key sets."""
        return int(self._token.shape[0])

    # -- exact quantities -----------------------------------------------
    def _exact_acceptance(self, alpha: float, tol: float) -> float:
        r""":math:`\sum_y \min(z, q)`, plus the pair term when it can be nonzero.

        A rejected ``Z = x`` (``z > q``) and a residual draw ``y`` (``q > z``)
        that is also a draft add :math:`(1 - a_x) r_y P(Z = x, y \in S)`. The
        term vanishes when every interval of every residual cell lies above
        every interval of every rejectable token (a rejected token then wins
        only when no residual cell was drafted): the case of the optimal
        layout, whose rejectable tokens lie in :math:`\Omega_0` and residual
        cells in ``H``. Rounding noise of the interval sums (cells with
        ``|z - q|`` at the rounding level of the layout, up to ``tol`` on
        each side) is left out. Otherwise it is summed exactly:
        :math:`P(Z = x, y \notin S) = \sum_{[l, h] \subseteq E_x} (h - L_y)^k - (l - L_y)^k`
        with :math:`L_y` the length of :math:`E_y` below the interval.
        """
        p, q, z, k = self.p, self.q, self._z, self.k
        # sum(min(z, q)) as 1 - (mass the residual must supply): a probability never above 1 in float64 (the sum
        # itself where below 1/2)
        base = complement(np.maximum(q - z, 0.0).sum(), lambda: np.minimum(z, q).sum())
        noise = max(tol, 1e-12)
        rej = above_noise(np.where(p > 0, z - q, 0.0), noise)
        resid = above_noise(np.where(p > 0, q - z, 0.0), noise)
        if rej.size == 0 or resid.size == 0:
            return base
        # lowest interval end of each residual cell, highest of each rejectable token (segment reductions)
        starts = self._ptr[:-1]
        keyed = np.flatnonzero(self._ptr[1:] > starts)
        lo_min = np.full(self.n, np.inf)
        hi_max = np.full(self.n, -np.inf)
        if keyed.size:
            lo_min[keyed] = np.minimum.reduceat(self._top - self._length, starts[keyed])
            hi_max[keyed] = np.maximum.reduceat(self._top, starts[keyed])
        lo_res = float(lo_min[resid].min())
        hi_rej = float(hi_max[rej].max())
        if hi_rej <= lo_res:
            return base
        if alpha - base <= tol:
            # a lossless verifier accepts at most alpha_k: base <= acceptance <= alpha <= base + tol
            return base
        extra = 0.0
        for x in rej:
            sl = slice(self._ptr[x], self._ptr[x + 1])
            th, tl = self._top[sl], self._top[sl] - self._length[sl]
            win = float(_measure(th, self._length[sl], k, self._origin).sum())
            for y in resid:
                L = self._length_below(y, tl)
                lose = float(np.sum(_power(th - L, k, self._origin) - _power(tl - L, k, self._origin)))
                extra += (1.0 - self._a[x]) * self._res[y] * max(win - lose, 0.0)
        return base + extra

    def _length_below(self, y: int, s: np.ndarray) -> np.ndarray:
        """Length of token ``y``'s key set below each of the points ``s``."""
        sl = slice(self._ptr[y], self._ptr[y + 1])
        top, ln = self._top[sl], self._length[sl]
        lo = top - ln
        return np.clip(s[:, None] - lo[None, :], 0.0, ln[None, :]).sum(axis=1)

    def selection_law(self, drafts) -> np.ndarray:
        r"""(n,) law of the selected token given the drafts (before the speculative step).

        With :math:`F_t(s)` the fraction of token ``t``'s key set below
        ``s`` and :math:`m_t` its multiplicity among the drafts, the interval
        :math:`[l, h]` of token ``x`` contributes
        :math:`(F_x(h)^{m_x} - F_x(l)^{m_x}) \prod_{t \ne x} F_t(l)^{m_t}`
        (no other present token has key mass inside it). Tokens with
        ``p = 0`` have no key set: they are selected only when every draft
        is such a token (then the smallest id). When a drafted token's
        interval is too short to show in float64 at its position (a point,
        possibly inside another token's interval: masses near ``1e-300``), the
        law is renormalised and :meth:`sample` draws from it (not from keys),
        so the two agree by construction; such tuples have probability below
        ``1e-16``.
        """
        x = self._drafts(drafts)
        toks, mult = np.unique(np.asarray(x, dtype=np.int64), return_counts=True)
        keyed = self._ptr[toks + 1] > self._ptr[toks]
        if not keyed.any():  # only tokens with p = 0 drafted: the smallest id
            law = np.zeros(self.n)
            law[int(toks[0])] = 1.0
            return law
        toks, mult = toks[keyed], mult[keyed]
        sl = [slice(self._ptr[t], self._ptr[t + 1]) for t in toks]
        owner = np.concatenate([np.full(s.stop - s.start, i) for i, s in enumerate(sl)])
        top = np.concatenate([self._top[s] for s in sl])
        ln = np.concatenate([self._length[s] for s in sl])
        total = np.array([float(self._length[s].sum()) for s in sl])
        order = np.argsort(top - ln, kind="stable")
        below = np.zeros(toks.shape[0])
        law = np.zeros(self.n)
        for i in order:
            o = owner[i]
            f_lo = below / total
            others = np.prod(np.delete(f_lo, o) ** np.delete(mult, o))
            f_hi = min((below[o] + ln[i]) / total[o], 1.0)
            law[toks[o]] += (f_hi ** mult[o] - f_lo[o] ** mult[o]) * others
            below[o] += ln[i]
        if self._flat[toks].any():
            law /= law.sum()
        return law

    def _pick(self, x, gen) -> int:
        """The draft with the largest key (one key per draft, uniform on its token's intervals).

        A drafted token whose key set is a float64 point: a draw from :meth:`selection_law` instead.
        """
        if any(self._flat[t] for t in x):
            return sample_from(self.selection_law(x), gen)
        best, y = -np.inf, -1
        for t in x:
            a, b = int(self._ptr[t]), int(self._ptr[t + 1])
            if a == b:  # p = 0: no key set; wins only among such drafts (the smallest id)
                if best == -np.inf and (y < 0 or t < y):
                    y = int(t)
                continue
            cum = self._cum[a:b]
            u = gen.random() * cum[-1]
            j = a + min(int(np.searchsorted(cum, u, side="right")), b - a - 1)
            key = self._top[j] - (u - (cum[j - a] - self._length[j]))
            if key > best:
                best, y = key, int(t)
        return y

    def __repr__(self) -> str:
        return (
            f"PriorityKeyVerifier(n={self.n}, k={self.k}, n_pieces={self.n_pieces}, "
            f"status={self.status!r}, gap={self.gap:.1e})"
        )


def build_keys(p_, q_, ps, qs, supp, k, in0, alpha, tol, *, depth=None):
    """The priority-key verifier of the optimal ``z`` (two greedy passes), layouts of ``H`` then ``Omega_0``.

    Above ``k = DEPTH_MIN_K`` (or with ``depth=True``) the layout is built in the depth coordinate
    ``x = s - 1`` (``H`` from ``x = 0`` down, ``Omega_0`` from ``x = -p(H)``); at or below it in suffix
    mass ``s``, as before (bit for bit).
    """
    z, H, O, s = sm.optimal_selection_law(ps, qs, k, in0)
    origin = int(k > DEPTH_MIN_K if depth is None else bool(depth))
    above_O = float(ps[H].sum()) if origin else None
    toks, tops, lens = [], [], []
    for idx, b, above in ((H, s, 0.0 if origin else None), (O, 0.0, above_O)):
        if idx.size:
            t, top, ln = key_layout(ps[idx], z[idx], b, k, above=above)
            toks.append(supp[idx[t]])
            tops.append(top)
            lens.append(ln)
    token = np.concatenate(toks) if toks else np.zeros(0, dtype=np.int64)
    top = np.concatenate(tops) if tops else np.zeros(0)
    length = np.concatenate(lens) if lens else np.zeros(0)
    n = p_.shape[0]
    if origin == 0:
        # the closed form alpha_k is exact to about 4 (n + k) eps; each interval end
        # is a sum/solution at scale <= 1 (absolute error <= 4 eps), which moves its
        # mu by at most 4 eps times the density k s**(k-1) <= k top**(k-1), twice
        bound = max(1e-12, 4 * (n + k) * _EPS + 8 * k * _EPS * float(np.sum(top ** max(k - 1, 0))))
    else:
        # the closed form alpha_k is exact to about 4 n eps at every k (it takes P**k as exp(k log1p(-S)));
        # each end x = -t is a sum/solution with relative error <= 4 eps (absolute 4 eps t), which moves
        # its mu by at most 4 eps t k s**(k-1), twice; k t (1 - t)**(k-1) <= 1 for every t and k, so the
        # bound is at most 4 (n + 2 P) eps at every k
        depth = -top
        dens = float(k) * _power(top, k - 1, origin)
        # (the greedy z takes every power c**k of a suffix mass from its complement d = 1 - c, a prefix
        # mass, on both passes and on both paths: its rounding is of the same k-independent form, no k-fold term)
        bound = max(1e-12, 4 * n * _EPS + 8 * _EPS * float(np.sum(depth * dens)))
    if tol is None:
        # the status tolerance does not depend on k: a larger gap is reported ("rounding" when
        # the bound above explains it), not called optimal
        tol = max(1e-12, 4 * n * _EPS)
        return PriorityKeyVerifier(p_, q_, k, token, top, length, alpha=alpha, tol=tol, bound=bound, origin=origin)
    # a user tol: the status against it alone (as before), the rounding bound still guards an acceptance above alpha_k
    return PriorityKeyVerifier(p_, q_, k, token, top, length, alpha=alpha, tol=tol, origin=origin, slack=bound)
