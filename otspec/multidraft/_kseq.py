r"""k-sequential selection (k-Seq): SpecTr's Algorithm 2 as an exact verifier.

Notation: ``p`` is the draft distribution, ``q`` the target. The drafts
:math:`X_1, \dots, X_k` are i.i.d. from ``p``.

For a division factor :math:`\rho \ge 1`,

.. math::

    \beta(\rho) = \sum_x \min\Big(p(x), \frac{q(x)}{\rho}\Big), \qquad
    p_{\rm acc}(\rho) = 1 - (1 - \beta(\rho))^k .

k-Seq accepts :math:`X_i` with probability :math:`\min(1, q(X_i)/(\rho p(X_i)))`
for :math:`i = 1, \dots, k`, returns the first accepted draft, and samples the
residual (SpecTr eq. 5)

.. math::

    p_{\rm res}(x) = \frac{q(x) - \min(p(x), q(x)/\rho)\, p_{\rm acc}/\beta}{1 - p_{\rm acc}}

when all are rejected. The plan is a coupling of :math:`p^{\otimes k}` and
``q`` iff :math:`\rho \ge \rho^*`, the root of
:math:`f(\rho) = 1 - (1 - \beta(\rho))^k - \rho\beta(\rho)` (SpecTr eq. 6,
Lemma 4: :math:`f` decreases on :math:`[1, \infty)` and
:math:`\rho^* \in [1, \min(k, \max_x q(x)/p(x))]`).

Exact :math:`\rho^*` after one sort: on :math:`\rho \ge 1`,
:math:`\beta(\rho) = A(\rho) + B(\rho)/\rho` with :math:`A` the draft mass of
the tokens whose ratio :math:`q/p` is at least :math:`\rho` and :math:`B`
the target mass of the others, so :math:`\beta` is piecewise linear in
:math:`1/\rho` with breakpoints at the ratios. We evaluate
:math:`f = D - E^k` with :math:`D(\rho) = \sum_x (q(x) - \rho p(x))_+ = 1 - \rho\beta`
and :math:`E(\rho) = \sum_x (p(x) - q(x)/\rho)_+ = 1 - \beta`: sums of
non-negative terms, accurate where :math:`f` is flat (``p`` near ``q``,
where :math:`\rho^*` is ill-conditioned: :math:`f \approx -(\rho - 1)^k`).
Only the ratios inside the search interval (first :math:`[1, k]`) can be
breakpoints there; while more than ``max(SORT_MIN, n/32)`` of them are, a
bisection step on :math:`\rho` (one :math:`O(n)` evaluation of :math:`f`)
halves the interval, which changes nothing to exactness. One sort of the
remaining ratios and prefix/suffix sums give :math:`f` at any breakpoint in
:math:`O(1)`, a binary search finds the
breakpoint interval of the sign change, on which :math:`D` and :math:`E`
have constant coefficients, and the remaining smooth monotone equation
:math:`(Q_h - \rho P_h) = (P_l - Q_l/\rho)^k` is solved to machine precision
by Brent's method (``scipy.optimize.brentq``, ``rtol = 4 eps``).
"""

from __future__ import annotations

import numbers

import numpy as np

from .._validation import as_float_array, as_rng, validate_k, validate_pair
from .._verifier import Verifier, check_draw_count, coin_accept, validate_tol

__all__ = [
    "KSeq",
    "kseq",
    "kseq_beta",
    "kseq_p_acc",
    "kseq_residual",
    "kseq_rho_star",
]

#: A ``rho`` below :math:`\rho^*` at which eq. (6)'s validity condition
#: :math:`p_{\rm acc} \le \rho\beta` holds to this relative slack is taken as
#: rounding (e.g. a bisection end point) and the plan is built at :math:`\rho^*`.
RHO_REL_TOL = 1e-12


# --------------------------------------------------------------------------- helpers


def _one_minus_pow(beta, k: int):
    r""":math:`1 - (1 - \beta)^k` without cancellation for small :math:`\beta`."""
    b = np.asarray(beta, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return -np.expm1(k * np.log1p(-np.minimum(b, 1.0)))


def _p_acc(beta: float, E: float, k: int) -> float:
    r""":math:`1 - E^k` with :math:`E = 1 - \beta`, from whichever of the two is small."""
    if beta < 0.5:
        return float(_one_minus_pow(beta, k))
    with np.errstate(divide="ignore"):
        return float(-np.expm1(k * np.log(E)))


def _validate_rho(rho, name: str = "rho"):
    """A finite real number (or array of them) > 0, returned as float64."""
    if isinstance(rho, (bool, np.bool_, str, bytes)) or rho is None:
        raise TypeError(f"`{name}` must be a real number, got {type(rho).__name__}")
    if isinstance(rho, numbers.Real):
        arr = np.asarray(float(rho))
    else:
        arr = as_float_array(rho, name, "a real number or an array of them", booleans=False)
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"`{name}` must be finite and > 0, got {rho!r}")
    return arr


def _beta(p: np.ndarray, q: np.ndarray, rho):
    r""":math:`\beta(\rho) = \sum_x \min(p(x), q(x)/\rho)` for a scalar or an array of ``rho``."""
    r = np.asarray(rho, dtype=np.float64)
    with np.errstate(over="ignore"):  # a subnormal rho: q / rho = inf where q > 0, and min(p, inf) = p exactly
        if r.ndim == 0:
            return float(np.minimum(p, q / float(r)).sum())
        return np.array([np.minimum(p, q / v).sum() for v in r.ravel()]).reshape(r.shape)


def _DE(p: np.ndarray, q: np.ndarray, rho: float, buf=None) -> tuple[float, float, float]:
    r""":math:`D = \sum (q - \rho p)_+ = 1 - \rho\beta`, :math:`E = \sum (p - q/\rho)_+ = 1 - \beta` and
    :math:`\beta = \sum \min(p, q/\rho)` (summed: ``1 - E`` loses a small one).

    Both are sums of non-negative terms, so they keep their relative accuracy
    where :math:`f = D - E^k` is nearly flat (``p`` close to ``q``), unlike
    :math:`1 - (1-\beta)^k - \rho\beta` evaluated as written. ``buf`` (an
    (n,) float64 work array) avoids allocating temporaries in loops: large
    temporaries measured up to 8x slower through page faults.
    """
    if buf is None:
        buf = np.empty_like(p)
    np.multiply(p, rho, out=buf)
    np.subtract(q, buf, out=buf)
    np.maximum(buf, 0.0, out=buf)
    D = float(buf.sum())
    np.divide(q, rho, out=buf)
    np.minimum(p, buf, out=buf)
    beta = float(buf.sum())
    np.subtract(p, buf, out=buf)  # p - min(p, q/rho) = (p - q/rho)_+, the same rounding
    E = float(buf.sum())
    return D, E, beta


def _f_over_beta(D: float, E: float, beta: float, k: int, rho: float) -> float:
    r""":math:`f(\rho) / \beta = c(\beta) - \rho`, :math:`c(\beta) = (1 - (1 - \beta)^k) / \beta`: the sign of
    :math:`f` (SpecTr eq. 6) to full relative accuracy; 0 when :math:`\beta = 0` (disjoint supports: :math:`f = 0`).

    Of its two forms the one with the smaller rounding error is taken: :math:`(D - E^k) / \beta`, where ``D`` and
    ``E`` are sums of non-negative terms (accurate where :math:`f` is flat, ``p`` close to ``q``; its error about
    :math:`\epsilon (D + k E^k)` on :math:`f`), or :math:`c(\beta) - \rho` with :math:`c` from ``log1p``/``expm1``
    (error about :math:`4 \epsilon \rho \beta` on :math:`f`). Where :math:`\beta` is tiny the first is a
    difference of two numbers near 1: at :math:`\beta = 1.5 \cdot 10^{-16}` both round to 1 or its neighbour, and
    the root came out 2.4 for a true :math:`\rho^* = 3 - 4 \cdot 2^{-53}`."""
    if not beta > 0.0:
        return 0.0
    Ek = E**k
    if D + k * Ek <= 4.0 * rho * beta:
        return (D - Ek) / beta
    return float(_one_minus_pow(beta, k)) / beta - rho


def _f(p, q, k, rho, buf=None):
    r""":math:`f(\rho) / \beta(\rho)`, :math:`f = 1 - (1-\beta)^k - \rho\beta = D - E^k` (SpecTr Lemma 4): its sign
    and root are :math:`f`'s (:func:`_f_over_beta`)."""
    rho = float(rho)
    return _f_over_beta(*_DE(p, q, rho, buf), k, rho)


#: The exact search sorts at most this many ratios (or ``n / 32`` if larger); a few
#: bisection steps on :math:`\rho` first narrow the bracket until that many remain.
SORT_MIN = 256


def _rho_star_exact(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """Exact root of f after one sort of the ratios in a bracket (see the module docstring)."""
    if k == 1:
        return 1.0  # f(rho) = beta - rho*beta <= 0 for every rho >= 1
    buf = np.empty_like(p)
    f_a = _f(p, q, k, 1.0, buf)
    if f_a <= 0.0:
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = q / p  # +inf where p = 0 < q, nan where p = q = 0 (such tokens play no part)
    a, b = 1.0, float(k)
    f_b = _f(p, q, k, b, buf)
    if f_b > 0.0:  # only by rounding (f(k) <= 0 exactly, Lemma 4): k is valid
        return b
    # rho* lies in (a, b] with f(a) > 0 >= f(b). Only ratios strictly inside (a, b) can be
    # breakpoints there; while many are, halve the bracket (one O(n) evaluation of f each).
    # (counting with a full mask each step is faster than tracking the index subset, whose
    # large temporaries measured several times slower at n = 65,536)
    target = max(SORT_MIN, p.shape[0] >> 5)
    while np.count_nonzero((r > a) & (r < b)) > target:
        mid = 0.5 * (a + b)
        if not a < mid < b:
            break
        f_mid = _f(p, q, k, mid, buf)
        if f_mid <= 0.0:
            b, f_b = mid, f_mid
        else:
            a, f_a = mid, f_mid
    sel = np.flatnonzero((r > a) & (r < b))
    # on [a, b] a token with ratio <= a is always on the low side (a tie adds zero) and one with
    # ratio >= b always on the high side
    below = r <= a
    above = r >= b
    Pb, Qb = float((p * below).sum()), float((q * below).sum())  # faster than sum(where=)
    Pa, Qa = float((p * above).sum()), float((q * above).sum())
    sel = sel[np.argsort(r[sel])]  # the one sort (ties are grouped below: their order is irrelevant)
    rm, ps, qs = r[sel], p[sel], q[sel]
    m = rm.shape[0]
    # f = D - E^k, D = sum over ratios > rho of (q - rho p), E = sum over ratios < rho of
    # (p - q/rho): prefix sums for the low side, suffix sums for the high side
    Ppre = np.full(m + 1, Pb)
    Qpre = np.full(m + 1, Qb)
    Ppre[1:] += np.cumsum(ps)
    Qpre[1:] += np.cumsum(qs)
    Psuf = np.full(m + 1, Pa)
    Qsuf = np.full(m + 1, Qa)
    Psuf[:m] += np.cumsum(ps[::-1])[::-1]
    Qsuf[:m] += np.cumsum(qs[::-1])[::-1]
    # evaluation points: a, each distinct ratio inside (a, b), and b; for a point,
    # jlo = number of inner ratios below it, jhi = number at or below it
    if m:
        new = np.flatnonzero(rm[1:] != rm[:-1]) + 1
        starts = np.concatenate(([0], new))
        ends = np.concatenate((new, [m]))
    else:
        starts = ends = np.zeros(0, dtype=np.int64)
    pts = np.concatenate(([a], rm[starts], [b]))
    jlo = np.concatenate(([0], starts, [m]))
    jhi = np.concatenate(([0], ends, [m]))
    last = pts.shape[0] - 1

    def f_at(i: int) -> float:
        if i == 0:
            return f_a  # evaluated term by term (exact zeros when p == q)
        if i == last:
            return f_b
        rho = float(pts[i])
        E = max(float(Ppre[jlo[i]]) - float(Qpre[jlo[i]]) / rho, 0.0)
        D = max(float(Qsuf[jhi[i]]) - rho * float(Psuf[jhi[i]]), 0.0)
        beta = float(Qpre[jhi[i]]) / rho + float(Psuf[jhi[i]])  # ties at rho: q / rho = p
        return _f_over_beta(D, E, beta, k, rho)

    # f is non-increasing (Lemma 4), f(a) > 0 >= f(b): binary search for the first point with f <= 0
    lo_i, hi_i = 0, last
    while hi_i - lo_i > 1:
        mid_i = (lo_i + hi_i) // 2
        if f_at(mid_i) <= 0.0:
            hi_i = mid_i
        else:
            lo_i = mid_i
    idx = hi_i
    if f_at(idx) == 0.0:
        return float(pts[idx])
    lo, hi = float(pts[idx - 1]), float(pts[idx])
    # on (lo, hi) no ratio lies strictly inside: the split, hence all four sums, is constant
    j = int(jhi[idx - 1])
    Pl, Ql, Ph, Qh = float(Ppre[j]), float(Qpre[j]), float(Psuf[j]), float(Qsuf[j])

    def F(rho):
        return _f_over_beta(max(Qh - rho * Ph, 0.0), max(Pl - Ql / rho, 0.0), Ql / rho + Ph, k, rho)

    f_lo, f_hi = F(lo), F(hi)
    if f_lo <= 0.0:
        return lo
    if f_hi >= 0.0:
        return hi
    from scipy.optimize import brentq

    root = brentq(F, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=200)
    return float(root)


def _rho_star_bisect(p: np.ndarray, q: np.ndarray, k: int, tol: float) -> float:
    """SpecTr's bisection over [1, k]; returns the upper (valid) end of the final bracket."""
    lo, hi = 1.0, float(k)
    buf = np.empty_like(p)
    if k == 1 or _f(p, q, k, 1.0, buf) <= 0.0:
        return 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:  # tolerance below the float spacing
            break
        if _f(p, q, k, mid, buf) <= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def _check_rho(rho, rho_star: float, p: np.ndarray, q: np.ndarray, k: int) -> float:
    r = _validate_rho(rho)
    if r.ndim:  # one coupling takes one rho (float() of an array of shape (0,) was numpy's TypeError)
        raise TypeError(f"`rho` must be a real number, got an array of shape {r.shape}")
    rho = float(r)
    if rho < rho_star:
        # validity is p_acc(rho) <= rho * beta(rho) (SpecTr eq. 6); a rho that meets it to
        # a relative RHO_REL_TOL (a bisection end point, or a flat f near p == q) is rounding
        # f(rho) <= RHO_REL_TOL * rho * beta = RHO_REL_TOL * (1 - D): f <= 0 up to rounding
        if _f(p, q, k, rho) <= RHO_REL_TOL * rho:
            return rho_star
        raise ValueError(
            f"`rho` must be >= rho* = {rho_star!r} for k-Seq to be a valid coupling "
            f"(SpecTr Theorem 1: the residual of eq. 5 would be negative), got {rho!r}"
        )
    return rho


def _kseq_parts(p: np.ndarray, q: np.ndarray, k: int, rho: float):
    """Per-token acceptance, min(p, q/rho), beta, E = 1 - beta, p_acc and the residual."""
    # min(1, q/(rho p)), the probability of the strict coin u rho p < q: 0 where q = 0, 1 where p = 0 < q
    accept = coin_accept(q, rho * p)
    mins = np.minimum(p, q / rho)
    beta = float(mins.sum())
    E = float((p - mins).sum())  # chance that one draft is rejected, summed without cancellation
    p_acc = _p_acc(beta, E, k)
    # c = p_acc / beta = sum_{i<k} (1 - beta)^i, and c <= rho exactly when rho >= rho*;
    # clamping makes the residual non-negative to the last bit (c = rho* at rho = rho*).
    c = p_acc / beta if beta > 0 else float(k)
    c = min(c, rho)
    hi = q >= rho * p  # min(p, q/rho) = p
    v = np.where(hi, q - p * c, q * (1.0 - c / rho))
    np.maximum(v, 0.0, out=v)
    total = float(v.sum())
    res = v / total if total > 0 else np.array(q, dtype=np.float64)
    return accept, mins, beta, E, p_acc, res


def _draw(cdf: np.ndarray, law: np.ndarray, gen: np.random.Generator) -> int:
    """Inverse-CDF draw from a precomputed cumulative sum (O(log n))."""
    u = gen.random() * cdf[-1]
    i = int(np.searchsorted(cdf, u, side="right"))
    i = min(i, law.shape[0] - 1)
    while law[i] <= 0 and i > 0:
        i -= 1
    return i


def _sample_iid(cdf: np.ndarray, law: np.ndarray, k: int, gen: np.random.Generator) -> tuple[int, ...]:
    check_draw_count(k)
    u = gen.random(k) * cdf[-1]
    idx = np.minimum(np.searchsorted(cdf, u, side="right"), law.shape[0] - 1)
    out = []
    for i in idx.tolist():
        while law[i] <= 0 and i > 0:
            i -= 1
        out.append(int(i))
    return tuple(out)


# --------------------------------------------------------------------------- public


def kseq_beta(p, q, rho, *, normalize: bool = False):
    r"""SpecTr's :math:`\beta_{p,q}(\rho)`.

    .. math::

        \beta_{p,q}(\rho) = \sum_{x \in \Omega} \min\Big(p(x), \frac{q(x)}{\rho}\Big).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    rho : float or array_like of float
        Division factor(s), finite and > 0.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    float or ndarray of float64
        :math:`\beta(\rho)`, of the shape of ``rho``.

    Raises
    ------
    ValueError, TypeError
        Invalid distributions or ``rho``.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Algorithm 2 and eq. (6).

    Examples
    --------
    >>> import otspec
    >>> otspec.kseq_beta([0.5, 0.5], [1.0, 0.0], 1.5)
    0.5
    >>> otspec.kseq_beta([0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0], [1.0, 2.0, 4.0]).tolist()
    [0.5, 0.5, 0.25]
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    r = _validate_rho(rho)
    return _beta(p_, q_, r)


def kseq_p_acc(p, q, k: int, rho, *, normalize: bool = False):
    r"""Probability that k-Seq accepts one of its drafts, :math:`p_{\rm acc}(\rho)`.

    .. math::

        p_{\rm acc}(\rho) = 1 - \big(1 - \beta_{p,q}(\rho)\big)^k .

    For :math:`\rho \ge \rho^*` this is a lower bound on the acceptance
    :math:`P(Y \in S(X))` of k-Seq, with equality at :math:`\rho = \rho^*`
    (see :meth:`KSeq.acceptance`).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of drafts.
    rho : float or array_like of float
        Division factor(s), finite and > 0 (any value; validity is not checked here).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    float or ndarray of float64

    Raises
    ------
    ValueError, TypeError
        Invalid distributions, ``k`` or ``rho``.

    References
    ----------
    .. [1] Sun et al., "SpecTr", NeurIPS 2023, Algorithm 2, line 1.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.kseq_p_acc([0.5, 0.5], [1.0, 0.0], 2, 1.5), 12)
    0.75
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    r = _validate_rho(rho)
    vals = [_p_acc(_beta(p_, q_, float(v)), _DE(p_, q_, float(v))[1], k) for v in r.ravel()]
    return vals[0] if r.ndim == 0 else np.array(vals).reshape(r.shape)


def kseq_rho_star(p, q, k: int, *, tol=None, normalize: bool = False) -> float:
    r"""The smallest valid division factor :math:`\rho^*` of k-Seq.

    .. math::

        \rho^* = \min\{\rho \ge 1 :\ 1 - (1 - \beta_{p,q}(\rho))^k \le \rho\,\beta_{p,q}(\rho)\},

    the root of SpecTr eq. (6) (unique when :math:`\beta > 0`; ``1`` when
    every root is valid, e.g. ``k = 1``, ``p == q`` or disjoint supports).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of drafts.
    tol : float or None, keyword-only
        ``None`` (default): exact, from the piecewise-linear structure of
        :math:`\beta` in :math:`1/\rho` after one sort of the ratios
        :math:`q/p` that lie in the search interval (narrowed first by a few
        :math:`O(n)` bisection steps while it holds many), then Brent's method
        on the last linear piece: :math:`O(n \log n)` at worst, machine precision. A positive
        float: the paper's bisection over :math:`[1, k]` to this bracket
        width (:math:`O(n \log((k-1)/\mathrm{tol}))`); the upper, valid end
        of the bracket is returned, so the result lies in
        :math:`[\rho^*, \rho^* + \mathrm{tol}]` up to rounding.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    float
        :math:`\rho^* \in [1, \min(k, \max_x q(x)/p(x))]` (SpecTr Lemma 4).

    Raises
    ------
    ValueError, TypeError
        Invalid distributions, ``k`` or ``tol``.

    See Also
    --------
    kseq : the verifier built at :math:`\rho^*`.

    References
    ----------
    .. [1] Sun et al., "SpecTr", NeurIPS 2023, Theorem 1, eq. (6), Lemma 4
       and App. C.1 ("computation efficiency": binary search over [1, k]).

    Examples
    --------
    >>> import otspec
    >>> p = [0.25] * 4
    >>> q = [0.5, 0.5, 0.0, 0.0]  # U(2) inside U(4): rho* = r (1 - (1 - 1/r)^k) with r = 2
    >>> otspec.kseq_rho_star(p, q, 3)
    1.75
    >>> abs(otspec.kseq_rho_star(p, q, 3, tol=1e-9) - 1.75) <= 1e-9
    True
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    if tol is None:
        return _rho_star_exact(p_, q_, k)
    return _rho_star_bisect(p_, q_, k, validate_tol(tol, positive=True, allow_none=True))


def kseq_residual(p, q, k: int, rho=None, *, normalize: bool = False) -> np.ndarray:
    r"""The residual law :math:`p_{\rm res}` that k-Seq samples when all drafts are rejected.

    .. math::

        p_{\rm res}(x) = \frac{q(x) - \min(p(x), q(x)/\rho)\, p_{\rm acc}(\rho)/\beta(\rho)}
                              {1 - p_{\rm acc}(\rho)}
        \quad (\text{SpecTr eq. 5}).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of drafts.
    rho : float or None
        Division factor, at least :math:`\rho^*`; ``None`` means :math:`\rho^*`.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    (n,) ndarray of float64
        Non-negative, summing to 1. When :math:`p_{\rm acc} = 1` the residual
        is never used and ``q`` is returned (the guarded normaliser).

    Raises
    ------
    ValueError
        If ``rho`` is below :math:`\rho^*` (the message gives :math:`\rho^*`),
        or on invalid inputs.
    TypeError
        On inputs of the wrong type.

    References
    ----------
    .. [1] Sun et al., "SpecTr", NeurIPS 2023, Algorithm 2, eq. (5).

    Examples
    --------
    >>> import otspec
    >>> otspec.kseq_residual([0.5, 0.5], [0.25, 0.75], 2).round(12).tolist()
    [0.0, 1.0]
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    rho_star = _rho_star_exact(p_, q_, k)
    r = rho_star if rho is None else _check_rho(rho, rho_star, p_, q_, k)
    res = _kseq_parts(p_, q_, k, r)[5]
    return res


class KSeq(Verifier):
    r"""k-sequential selection (SpecTr Algorithm 2) as an exact verifier.

    .. math::

        K(y \mid x_1, \dots, x_k) = \sum_{i=1}^k \Big[\prod_{j<i} (1 - a(x_j))\Big] a(x_i)\,
            \mathbb 1\{y = x_i\} + \prod_{j=1}^k (1 - a(x_j))\; p_{\rm res}(y),
        \qquad a(x) = \min\Big(1, \frac{q(x)}{\rho\, p(x)}\Big).

    Lossless for :math:`\rho \ge \rho^*`. Its acceptance is, exactly,

    .. math::

        P(Y \in S(X)) = p_{\rm acc}(\rho) + \sum_y p_{\rm res}(y)
            \big[(1 - \beta)^k - (1 - \beta - e(y))^k\big],
        \qquad e(y) = (p(y) - q(y)/\rho)_+ ,

    the second term being the chance that every draft is rejected and the
    residual lands on one of them (:math:`e(y)` is the per-draft chance of
    drawing :math:`y` and rejecting it). At :math:`\rho = \rho^*` every term
    vanishes (the residual lives where :math:`e = 0`) and the acceptance is
    :math:`p_{\rm acc}(\rho^*)`.

    Build it with :func:`kseq`.

    Attributes
    ----------
    k : int
        Number of drafts.
    p, q : (n,) ndarray of float64, read-only
        Draft and target distributions.
    rho : float
        Division factor in use.
    rho_star : float
        :math:`\rho^*` (exact).
    beta : float
        :math:`\beta(\rho)`, the chance that one draft is accepted.
    p_acc : float
        :math:`p_{\rm acc}(\rho) = 1 - (1 - \beta)^k`.
    accept_probs : (n,) ndarray of float64, read-only
        :math:`a(x) = \min(1, q(x)/(\rho p(x)))` per token.
    residual : (n,) ndarray of float64, read-only
        :math:`p_{\rm res}`.
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, k: int, rho: float, rho_star: float):
        self.k = k
        self.p = p
        self.q = q
        self.rho = float(rho)
        self.rho_star = float(rho_star)
        accept, mins, beta, E, p_acc, res = _kseq_parts(p, q, k, self.rho)
        self.beta = beta
        self._E = E
        self.p_acc = p_acc
        for a in (accept, res):
            a.setflags(write=False)
        self.accept_probs = accept
        self.residual = res
        self._mins = mins
        self._res_cdf = np.cumsum(res)
        self._p_cdf = np.cumsum(p)

    def conditional(self, drafts) -> np.ndarray:
        r"""Exact law :math:`K(\cdot \mid x_1..x_k)` of the output (SpecTr Algorithm 2), :math:`O(k + n)`."""
        xs = self._drafts(drafts)
        out = np.zeros(self.n)
        rem = 1.0
        for x in xs:
            a = float(self.accept_probs[x])
            out[x] += rem * a
            rem *= 1.0 - a
            if rem == 0.0:
                return out
        out += rem * self.residual
        return out

    def acceptance(self) -> float:
        r"""Exact :math:`P(Y \in S(X))`, :math:`X \sim p^{\otimes k}` (closed form above, :math:`O(n)`)."""
        E, k = self._E, self.k
        if not E > 0.0:
            return self.p_acc
        e = np.maximum(self.p - self._mins, 0.0)  # (p - q/rho)_+ : draw y, reject it
        # E^k - (E - e)^k = E^k [1 - (1 - e/E)^k], without cancellation
        hit = E**k * _one_minus_pow(np.minimum(e / E, 1.0), k)
        extra = float(np.sum(self.residual * hit))  # not np.dot: BLAS threads cost ms on small vectors
        return min(1.0, self.p_acc + extra)

    def sample(self, drafts, *, rng=None) -> int:
        """Run Algorithm 2 on the drafts: :math:`O(k + \\log n)` (the residual's CDF is precomputed)."""
        xs = self._drafts(drafts)
        gen = as_rng(rng)
        p, q, rho = self.p, self.q, self.rho
        for x in xs:
            # strict division-free test u * rho * p(x) < q(x)  <=>  u < min(1, q/(rho p)), u in [0, 1)
            if gen.random() * rho * p[x] < q[x]:
                return x
        return _draw(self._res_cdf, self.residual, gen)

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        """Draw ``k`` i.i.d. drafts from ``p`` (the draft law this verifier assumes)."""
        return _sample_iid(self._p_cdf, self.p, self.k, as_rng(rng))

    def __repr__(self) -> str:
        return f"KSeq(n={self.n}, k={self.k}, rho={self.rho!r}, rho_star={self.rho_star!r})"


def kseq(p, q, k: int, *, rho=None, normalize: bool = False) -> KSeq:
    r"""SpecTr's k-sequential selection (k-Seq) as a lossless verifier.

    .. math::

        \alpha(\pi^{\text{k-Seq}}_{\rho^*}) = 1 - (1 - \beta_{p,q}(\rho^*))^k
        \ \ge\ \big(1 - (1 - 1/k)^k\big)\, \alpha_k(p, q)
        \ \ge\ (1 - e^{-1})\, \alpha_k(p, q).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (small model).
    q : (n,) array_like of float
        Target distribution (large model).
    k : int
        Number of i.i.d. drafts.
    rho : float or None, keyword-only
        Division factor. ``None`` (default): the exact :math:`\rho^*` of
        :func:`kseq_rho_star`, which maximises the acceptance of the
        family. A value below :math:`\rho^*` is refused (a value within a
        relative ``1e-12`` below it, the rounding of a bisection, is taken
        as :math:`\rho^*`).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    KSeq
        The verifier; ``acceptance()`` is the exact :math:`P(Y \in S(X))`.

    Raises
    ------
    ValueError
        If ``rho < rho*`` (the message states :math:`\rho^*`), or on invalid
        distributions, ``k`` or ``rho``.
    TypeError
        On inputs of the wrong type.

    See Also
    --------
    kseq_rho_star, kseq_beta, kseq_p_acc, kseq_residual, alpha_k

    Notes
    -----
    For :math:`\rho < \rho^*` the residual (SpecTr eq. 5) has a negative
    entry, except in the degenerate case where every token with
    :math:`q > 0` has ratio :math:`q/p \ge \rho^*`; there the plan is the
    same for every such :math:`\rho` as at :math:`\rho^*`, so refusing loses
    nothing.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", NeurIPS 2023, Algorithm 2, Theorem 1,
       Lemma 4, App. B.2 (uniform pairs).

    Examples
    --------
    >>> import otspec
    >>> v = otspec.kseq([0.25] * 4, [0.5, 0.5, 0.0, 0.0], 2)
    >>> v.rho_star, v.acceptance(), otspec.alpha_k([0.25] * 4, [0.5, 0.5, 0.0, 0.0], 2)
    (1.5, 0.75, 0.75)
    >>> v.conditional([2, 0]).tolist()
    [1.0, 0.0, 0.0, 0.0]
    >>> otspec.kseq([0.75, 0.25], [0.25, 0.75], 2, rho=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `rho` must be >= rho* = 1.5930... for k-Seq to be a valid coupling ...
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    rho_star = _rho_star_exact(p_, q_, k)
    r = rho_star if rho is None else _check_rho(rho, rho_star, p_, q_, k)
    return KSeq(p_, q_, k, r, rho_star)
