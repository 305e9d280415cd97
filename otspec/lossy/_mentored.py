r"""Mentored decoding: the largest acceptance under a KL budget on the output law.

One draft :math:`X \sim p` is accepted with probability :math:`r_X`; on
rejection the output is drawn from :math:`s`. The output law is
:math:`\pi = p \odot r + s\,(1 - R)` with acceptance :math:`R = \sum_i p_i r_i`,
and mentored decoding solves

.. math::

    \max_{r, s} \; \sum_i p_i r_i \quad \text{s.t.} \quad
    \mathrm{KL}(q \,\|\, \pi) \le D, \quad \sum_i s_i = 1, \quad r, s \in [0, 1]^n.

Notation: ``p`` is the draft distribution and ``q`` the target, as in the
mentored-decoding note (Tran-Thien, 2023), whose letters agree with ours.

How the solution is computed
----------------------------
The note (its §4) shows the optimum is given by two thresholds
:math:`\alpha \le 1 \le \beta` on the ratio :math:`q_i/p_i`:
:math:`r_i = \min(q_i / (\alpha p_i), 1)`, and :math:`s_i \propto (q_i/\beta - p_i)_+`,
with :math:`1 - R = \sum_i (p_i - q_i/\alpha)_+ = \sum_i (q_i/\beta - p_i)_+`.
Here both thresholds are written as functions of the *rejection mass*
:math:`t = 1 - R \in [0, 1 - R_0]` (:math:`R_0 = \sum_i \min(p_i, q_i)`):
with the tokens sorted by ratio and prefix sums, :math:`\alpha(t)`,
:math:`\beta(t)` and :math:`\mathrm{KL}(t)` are explicit on each of at most
``n`` pieces, ``KL(t)`` is continuous, strictly decreasing and convex on
each piece (:math:`\mathrm{KL}'(t) = \alpha - \beta`). The root of
``KL(t) = D`` is bracketed by evaluating ``KL`` at every breakpoint, then found
inside its piece by safeguarded Newton iterations to machine precision.

Beyond the note: when ``q`` has zeros where ``p`` is positive, the note's
parametrisation (:math:`\alpha \in (0, 1]`, which forces :math:`r_i = 0` on
those tokens) stops short of :math:`R = 1`. For budgets between
:math:`\mathrm{KL}` at :math:`\alpha \to 0^+` and :math:`\mathrm{KL}(q\|p)` the
optimum has :math:`\alpha = 0`: every token with :math:`q_i > 0` is accepted
and the tokens with :math:`q_i = 0` are accepted with a common probability
:math:`1 - t / p(\{q = 0\})` (any split of that mass is optimal; the
Lagrangian of the convex reformulation below is flat in it). The
``t``-parametrisation covers both regimes with the same formulas.

Independent check: with :math:`a = p \odot r` and :math:`b = s (1 - R)` the
problem is convex (maximise :math:`\sum a` subject to :math:`0 \le a \le p`,
:math:`b \ge 0`, :math:`\sum (a + b) = 1`, :math:`\mathrm{KL}(q \| a + b) \le D`);
the test suite solves it with cvxpy's exponential cone (Clarabel) and finds
the same optimum.

Numerics: KL is evaluated as a sum of non-negative terms
:math:`q\,h(\pi/q - 1)`, :math:`h(u) = u - \ln(1 + u)` (no cancellation when
:math:`\pi \approx q`); running sums are accumulated in extended precision;
near :math:`t = 0`, where KL can grow like :math:`-\ln t` (target mass where
``p = 0``), Newton runs in :math:`\ln t`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._registry import validate_name
from .._validation import as_float_array, as_rng, validate_distribution, validate_pair, validate_probability
from .._verifier import Verifier, coin_accept, complement, sample_from
from ..multidraft._maximal_coupling import residual

__all__ = [
    "MentoredResult",
    "MentoredVerifier",
    "MentoredFrontier",
    "mentored",
    "mentored_verifier",
    "mentored_frontier",
    "kl_divergence",
    "MAX_CURVE_POINTS",
]

#: Most points of one curve (:func:`mentored_frontier`'s budgets, :func:`otspec.lossy.lenience_curve`'s lenience
#: values): every point is a solve over the vocabulary (tens of milliseconds for a budget at V = 1,000), so a grid of
#: a million points ran for hours; refused before any solve. Plots and reports use 50 to 200 points.
MAX_CURVE_POINTS = 10_000

_METHODS = ("exact", "bisection")
_EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.nextafter(0.0, 1.0))
# |ln(pi / q)| above this (pi / q past 2**1000 or below 2**-1000) is computed by logs: pi / q may overflow, or be
# subnormal and hold a few bits
_LOG_BIG = 1000 * math.log(2.0)


def _h(u, v=None) -> np.ndarray:
    r""":math:`h(u) = u - \ln(1 + u) \ge 0` for :math:`u > -1` (``inf`` at ``u = -1``), accurate near 0.

    ``q h(pi/q - 1) = q ln(q/pi) + pi - q``: summing these non-negative
    terms gives KL without the cancellation of :math:`\sum q \ln(q/\pi)`
    when :math:`\pi \approx q`. ``v``, when given, is ``1 + u`` computed
    independently (accurate when ``u`` is near ``-1``).
    """
    u = np.asarray(u, dtype=np.float64)
    with np.errstate(divide="ignore"):
        lv = np.log1p(u) if v is None else np.log(np.asarray(v, dtype=np.float64))
    out = np.asarray(u - lv, dtype=np.float64)
    small = np.abs(u) < 0.05
    if np.any(small):
        us = u[small]
        # alternating series sum_{k>=2} (-u)^k / k; 17 terms reach 1e-21 relative at |u| = 0.05
        acc = np.zeros_like(us)
        for k in range(18, 1, -1):
            acc = acc * (-us) + 1.0 / k
        out = np.array(out, copy=True)
        out[small] = us * us * acc
    return out


def _kl_terms(q: np.ndarray, pi: np.ndarray) -> np.ndarray:
    r""":math:`q\,h(\pi/q - 1) = \pi - q - q \ln(\pi/q) \ge 0` for arrays ``q > 0``, ``pi > 0`` (the terms of
    :func:`kl_divergence`).

    Where :math:`|\ln(\pi / q)| > 1000 \ln 2` (a subnormal ``q`` against a normal ``pi``: the ratio may
    overflow to ``inf`` and :math:`h` to ``inf - inf``; or ``pi = 5e-324`` against ``q = 0.2``: a subnormal
    quotient of a few bits, whose logarithm was off by 0.1) the term is
    :math:`(\pi - q) - q(\ln \pi - \ln q)`, every part finite and each logarithm of an exact input; elsewhere
    it is :func:`_h`'s, unchanged."""
    q = np.asarray(q, dtype=np.float64)
    pi = np.asarray(pi, dtype=np.float64)
    lr = np.log(pi) - np.log(q)
    big = np.abs(lr) > _LOG_BIG  # an overflowing (> 2**1000) or a subnormal (< 2**-1000) quotient: by logs
    qn = np.where(big, pi, q)  # u = 0 there: no overflow
    out = q * _h((pi - qn) / qn, pi / qn)
    if np.any(big):
        out = np.array(out, copy=True)
        out[big] = (pi[big] - q[big]) - q[big] * lr[big]
    return out


def kl_divergence(q: np.ndarray, pi: np.ndarray) -> float:
    r""":math:`\mathrm{KL}(q \| \pi) = \sum_{q_i > 0} q_i \ln(q_i / \pi_i)`; ``inf`` if some :math:`\pi_i = 0 < q_i`.

    Computed as :math:`\sum_{q_i > 0} q_i h(\pi_i/q_i - 1) + \sum_{q_i = 0} \pi_i`
    with :math:`h(u) = u - \ln(1+u) \ge 0` (equal when both sum to 1), which
    keeps full relative accuracy when :math:`\pi \approx q`. Both must be
    distributions (checked as every law is, subnormal entries kept as given).

    Parameters
    ----------
    q : (n,) array_like of float
        The reference law (the target).
    pi : (n,) array_like of float
        The law compared with it.

    Returns
    -------
    float
        :math:`\mathrm{KL}(q \| \pi) \ge 0` in nats, ``inf`` when :math:`\pi` misses mass of ``q``.

    Raises
    ------
    ValueError
        ``q`` or ``pi`` not a distribution, or of different lengths.
    TypeError
        ``q`` or ``pi`` not an array_like of real numbers.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.lossy import kl_divergence
    >>> kl_divergence(np.array([0.5, 0.5]), np.array([0.5, 0.5]))
    0.0
    >>> kl_divergence(np.array([0.5, 0.5]), np.array([1.0, 0.0]))
    inf
    """
    q = validate_distribution(q, "q", flush=False, normalizable=False)
    pi = validate_distribution(pi, "pi", flush=False, normalizable=False)
    if q.shape != pi.shape:
        raise ValueError(f"`q` and `pi` must have the same length, got {q.shape[0]} and {pi.shape[0]}")
    m = q > 0
    if np.any(pi[m] <= 0):
        return math.inf
    terms = _kl_terms(q[m], pi[m])
    return max(math.fsum(terms.tolist()) + math.fsum(pi[~m].tolist()), 0.0)


def _validate_D(D) -> float:
    if isinstance(D, bool) or not isinstance(D, numbers.Real):
        raise TypeError(f"`D` must be a real number, got {type(D).__name__}")
    v = float(D)
    if not (v >= 0) or math.isnan(v):
        raise ValueError(f"`D` must be a non-negative KL budget (nats), got {D!r}")
    return v


# Running sums are accumulated in extended precision (80-bit long double where the
# platform has it) and rounded once: a float64 cumsum over n terms drifts by ~n eps,
# which at n = 32000 puts noise of ~1e-13 relative into KL(t) and stalls Newton.
def _suffix(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0] + 1)
    out[:-1] = np.cumsum(x[::-1].astype(np.longdouble))[::-1]
    return out


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0] + 1)
    out[1:] = np.cumsum(x.astype(np.longdouble))
    return out


def _newton(f, lo: float, hi: float, x: float, D: float, *, log: bool, max_iter: int = 200):
    """Root of the decreasing ``f`` (returns ``(value, derivative)``) on ``[lo, hi]``.

    Newton steps in ``t`` (or in ``y = ln t`` with ``log=True``), each guarded by
    the bracket (bisection when a step leaves it); stops when ``|f| <= 4 eps D``,
    when the step is below the resolution of the variable, or when the bracket
    collapses. Returns the iterate with the smallest ``|f|`` and the step count.
    """
    to_y = math.log if log else (lambda v: v)
    from_y = math.exp if log else (lambda v: v)
    ylo, yhi, y = to_y(lo), to_y(hi), to_y(x)
    best_y, best_f = y, math.inf
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported after the loop
        t = from_y(y)
        fx, dfx = f(t)
        if log:
            dfx = dfx * t  # d f / d y
        if abs(fx) < best_f:
            best_y, best_f = y, abs(fx)
        if abs(fx) <= 4 * _EPS * D:
            break  # KL(t) = D to rounding
        if fx > 0:
            ylo = max(ylo, y)
        else:
            yhi = min(yhi, y)
        if dfx < 0 and math.isfinite(dfx):
            step = fx / dfx
            if abs(step) <= 2 * np.spacing(abs(y)):
                break  # the Newton step is below the resolution of the variable
            yn = y - step
        else:
            yn = 0.5 * (ylo + yhi)
        if not (ylo < yn < yhi):
            yn = 0.5 * (ylo + yhi)  # leaves the bracket or revisits an end: bisect
        if yn == y or yhi - ylo <= 2 * np.spacing(max(abs(ylo), abs(yhi))):
            break
        y = yn
    return float(from_y(best_y)), it


class _Problem:
    """Sorted ratios and prefix sums of one (p, q) pair, shared by every budget ``D``.

    Tokens split into the alpha side (``q < p``, ratios ascending), the beta
    side (``q > p``, ratios descending, ``p = 0`` first) and the rest
    (``q == p``, never touched: ``r = 1``, ``s = 0``). On a piece where the
    first ``J`` alpha-side tokens are below alpha and the first ``K``
    beta-side tokens above beta, with rejection mass ``t``:

    * ``1/alpha - 1 = (Da[J] - t) / Qa[J]`` and ``1/beta - 1 = (t - Db[K]) / Qb[K]``
      (``Da``, ``Db`` prefix sums of ``|p - q|``: the note's eqs. 24 and 27);
    * ``KL(t) = Qa[J] h(1/alpha - 1) + Ha[J] + Hb[K] + Qb[K] h(1/beta - 1)``
      with ``h(u) = u - ln(1 + u)`` and ``Ha``, ``Hb`` suffix sums of
      ``q h(p/q - 1)`` over the tokens in between (``q/pi = q/p`` there); when
      ``Qa[J] = 0`` (alpha = 0, only ``q = 0`` tokens below) the first term is
      their output mass ``Da[J] - t``.
    """

    def __init__(self, p: np.ndarray, q: np.ndarray):
        self.p, self.q, self.n = p, q, p.shape[0]
        # --- alpha side: q < p (includes q = 0 < p), ratios ascending ---
        ia = np.flatnonzero(q < p)
        ra = q[ia] / p[ia]
        o = np.argsort(ra, kind="stable")
        self.ia, self.ra = ia[o], ra[o]
        self.pa, self.qa = p[self.ia], q[self.ia]
        m = self.ia.shape[0]
        self.Pa, self.Qa = _prefix(self.pa), _prefix(self.qa)
        self.Da = _prefix(self.pa - self.qa)
        # t at which alpha reaches the j-th ratio (the first j tokens lie below it)
        with np.errstate(divide="ignore", invalid="ignore"):
            A = self.Pa[:m] - np.where(self.ra > 0, self.Qa[:m] / np.where(self.ra > 0, self.ra, 1.0), 0.0)
        A[self.ra == 0] = 0.0  # q = 0 tokens lie below every alpha >= 0
        self.A = np.maximum.accumulate(np.maximum(A, 0.0)) if m else A
        ha = np.zeros(m)
        pos = self.qa > 0
        ha[pos] = _kl_terms(self.qa[pos], self.pa[pos])
        self.Ha = _suffix(ha)
        # P0: draft mass on tokens the target never produces
        self.P0 = math.fsum(self.pa[~pos].tolist())
        # --- beta side: q > p (includes p = 0 < q, ratio +inf, first), ratios descending ---
        ib = np.flatnonzero(q > p)
        with np.errstate(divide="ignore"):
            rb = np.where(p[ib] > 0, q[ib] / np.where(p[ib] > 0, p[ib], 1.0), np.inf)
        o = np.argsort(-rb, kind="stable")
        self.ib, self.rb = ib[o], rb[o]
        self.pb, self.qb = p[self.ib], q[self.ib]
        mb = self.ib.shape[0]
        self.Pb, self.Qb = _prefix(self.pb), _prefix(self.qb)
        self.Db = _prefix(self.qb - self.pb)
        finite = np.isfinite(self.rb)
        # t at which beta reaches the k-th ratio (the first k tokens lie above it)
        B = np.where(finite, self.Qb[:mb] / np.where(finite, self.rb, 1.0), 0.0) - self.Pb[:mb]
        self.B = np.maximum.accumulate(np.maximum(B, 0.0)) if mb else B
        hb = np.zeros(mb)
        pf, qf = self.pb[finite], self.qb[finite]
        hb[finite] = _kl_terms(qf, pf)  # p/q, not 1 + (p - q)/q: p << q loses it (by logs where p/q is subnormal)
        self.Hb = _suffix(hb)
        self.has_inf = bool(np.any(~finite))
        # t_max = 1 - R_0 = sum (p - q)_+ = sum (q - p)_+ (speculative sampling's rejection
        # mass); the two sums differ by rounding when p or q sums to 1 only within tolerance
        self.t_max = min(float(self.Da[m]), float(self.Db[mb]))
        # KL(q || p), the budget from which R = 1
        # (the textbook sum, the user's definition of the threshold; the solver's stable
        # form may differ by rounding when p or q sums to 1 only within tolerance)
        if self.has_inf:
            self.kl_qp = math.inf
        else:
            m_ = q > 0
            self.kl_qp = max(math.fsum((q[m_] * np.log(q[m_] / p[m_])).tolist()), 0.0)
        # smallest rejection mass used when KL(q || p) = inf: the target mass where
        # p = 0 gets pi_i >= q_i t, kept positive in floating point by this floor
        self.t_floor = 0.0
        if self.has_inf:
            q_inf = self.qb[~finite]
            # 2**10 ulps of headroom: the chain w / sum(w) * t runs through subnormals
            self.t_floor = min(max(_TINY, 2.0**10 * _TINY / float(q_inf.min())), self.t_max)

    # -- the piecewise-explicit functions of t ---------------------------------
    def pieces(self, t):
        """Active-set sizes (J below alpha, K above beta) at rejection mass(es) ``t``."""
        return np.searchsorted(self.A, t, side="right"), np.searchsorted(self.B, t, side="right")

    def thresholds(self, t, J, K):
        """alpha(t), beta(t) on the piece (J, K)."""
        Qa, Qb = self.Qa[J], self.Qb[K]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # 1/alpha = 1 + (Da - t)/Qa >= 1 (not (Pa - t)/Qa, which cancels when q is tiny)
            ua = np.maximum((self.Da[J] - t) / np.where(Qa > 0, Qa, 1.0), 0.0)
            alpha = np.where(Qa > 0, 1.0 / (1.0 + ua), 0.0)
            beta = np.where(Qb > 0, Qb / (t + self.Pb[K]), 1.0)
        return alpha, beta

    def kl(self, t, J, K):
        """KL(q || pi(t)) on the piece (J, K), as a sum of non-negative terms."""
        t = np.asarray(t, dtype=np.float64)
        Qa, Qb, Da, Db, Pb = self.Qa[J], self.Qb[K], self.Da[J], self.Db[K], self.Pb[K]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            qa = np.where(Qa > 0, Qa, 1.0)
            qb = np.where(Qb > 0, Qb, 1.0)
            # 1/alpha = (Pa - t)/Qa and 1/beta = (t + Pb)/Qb, each also as 1 + u
            ua = np.maximum((Da - t) / qa, 0.0)  # 1/alpha - 1 >= 0
            lo = np.where(Qa > 0, Qa * _h(ua, 1.0 + ua), Da - t)
            hi = np.where(Qb > 0, Qb * _h((t - Db) / qb, (t + Pb) / qb), 0.0)
        return lo + self.Ha[J] + self.Hb[K] + hi

    def kl_at(self, t):
        t = np.asarray(t, dtype=np.float64)
        J, K = self.pieces(t)
        return self.kl(t, J, K)

    # -- solvers -----------------------------------------------------------------
    def solve_exact(self, D: float) -> tuple[float, int, int, int]:
        """Rejection mass t with KL(t) = D, to machine precision; returns (t, J, K, iterations)."""
        bps = np.concatenate(([0.0, self.t_max], self.A, self.B))
        bps = np.unique(bps[(bps >= 0.0) & (bps <= self.t_max)])
        kls = self.kl_at(bps)
        # KL is decreasing in t: the last breakpoint with KL >= D starts the piece
        above = np.flatnonzero(kls >= D)
        if above.shape[0] == 0:
            # D is below KL(q || p) only by rounding of the two formulas: R = 1 (or, with
            # target mass where p = 0, the floor that keeps pi positive there)
            J, K = self.pieces(self.t_floor)
            return self.t_floor, int(J), int(K), 0
        i = int(above[-1])
        if kls[i] == D or i + 1 == bps.shape[0]:
            J, K = self.pieces(bps[i])
            return float(bps[i]), int(J), int(K), 0
        lo, hi = float(bps[i]), float(bps[i + 1])
        J, K = self.pieces(0.5 * (lo + hi))
        J, K = int(J), int(K)
        Qa, Qb, Da, Db = float(self.Qa[J]), float(self.Qb[K]), float(self.Da[J]), float(self.Db[K])
        Pb = float(self.Pb[K])
        const = float(self.Ha[J] + self.Hb[K]) - D

        def f(t):
            # KL(t) - D on this piece and its derivative alpha - beta (finite on (lo, hi])
            if Qa > 0:
                ua = max((Da - t) / Qa, 0.0)
                va = 1.0 + ua  # = 1/alpha
                val, da = Qa * float(_h(ua, va)), -ua / va
            else:
                val, da = Da - t, -1.0
            ub, vb = (t - Db) / Qb, (t + Pb) / Qb  # vb = 1 + ub = 1/beta
            val += const + Qb * float(_h(ub, vb))
            return val, da + ub / vb if vb > 0 else -math.inf

        fl = float(kls[i]) - D
        if math.isfinite(fl):
            # Newton in t: f is convex and decreasing on the piece, so from the left
            # end the iterates increase monotonically to the root
            t, it = _newton(f, lo, hi, lo, D, log=False)
        else:
            # f(0) = inf (target mass where p = 0): KL ~ -Q ln t near 0, so iterate
            # in y = ln t. If even the least positive double is not enough the root
            # underflows; any t >= root is feasible (KL decreases in t), take that one.
            tf = self.t_floor
            if tf >= hi or f(tf)[0] <= 0:
                J2, K2 = self.pieces(tf)
                return tf, int(J2), int(K2), 1
            t, it = _newton(f, tf, hi, hi, D, log=True)
        if t < self.t_floor:
            J, K = (int(v) for v in self.pieces(self.t_floor))
            t = self.t_floor
        return t, J, K, it

    def t_of_alpha(self, alpha: float) -> float:
        """Rejection mass at threshold alpha in (0, 1]: the note's eq. 24."""
        J = int(np.searchsorted(self.ra, alpha, side="right"))
        t = self.Pa[J] - self.Qa[J] / alpha
        return float(min(max(t, 0.0), self.t_max))

    def solve_bisection(self, D: float, tol: float, max_iter: int) -> tuple[float, int, int, int]:
        """The note's Algorithm 1: bisection on alpha until KL is within [(1-tol) D, (1+tol) D]."""
        if self.has_inf and float(self.kl_at(self.t_floor)) <= D:
            # not in the note: the root underflows (see solve_exact); R = 1 to rounding
            J, K = self.pieces(self.t_floor)
            return self.t_floor, int(J), int(K), 0
        kl0 = float(self.kl_at(self.P0))  # KL at alpha -> 0+ (the end of the note's range)
        if D >= kl0 and self.P0 > 0:
            # not in the note: with zeros of q where p > 0 the optimum has alpha = 0
            # for these budgets; bisect the rejection mass t in [0, P0] instead
            t_min, t_hi = 0.0, self.P0
            for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported after the loop
                t = 0.5 * (t_min + t_hi)
                delta = float(self.kl_at(t))
                if delta < (1 - tol) * D:
                    t_hi = t  # too close to q: reject less
                elif delta > (1 + tol) * D:
                    t_min = t
                else:
                    break
            else:
                raise RuntimeError(f"bisection did not reach `tol`={tol} in `max_iter`={max_iter} iterations")
        else:
            a_min, a, a_max = 0.0, 0.5, 1.0
            for it in range(1, max_iter + 1):  # noqa: B007 - `it` is reported after the loop
                t = self.t_of_alpha(a)
                delta = float(self.kl_at(t))
                if delta < (1 - tol) * D:
                    # KL too small: lower alpha. The note writes "alpha <- (alpha_min + alpha)/2;
                    # alpha_max <- alpha", which sets alpha_max to the *new* alpha and can stall;
                    # the bisection needs alpha_max set to the old one.
                    a_max, a = a, 0.5 * (a_min + a)
                elif delta > (1 + tol) * D:
                    a_min, a = a, 0.5 * (a + a_max)
                else:
                    break
                if a in (a_min, a_max):
                    # not in the note: float alpha cannot get closer to the root
                    raise RuntimeError(
                        "bisection on alpha cannot resolve `D` to `tol`: near this root 1 - R = "
                        "sum (p_i - q_i/alpha)_+ is too small for alpha to fix it (one ulp of alpha "
                        "moves KL by more than the tolerance); use method='exact'"
                    )
            else:
                raise RuntimeError(f"bisection did not reach `tol`={tol} in `max_iter`={max_iter} iterations")
        J, K = self.pieces(t)
        return t, int(J), int(K), it

    # -- the solution at a rejection mass t ------------------------------------
    def build(self, t: float, J: int, K: int):
        """(r, s, alpha, beta, law) at rejection mass t on the piece (J, K)."""
        p, q, n = self.p, self.q, self.n
        alpha, beta = (float(v) for v in self.thresholds(np.float64(t), J, K))
        r = np.ones(n)
        lo = self.ia[:J]
        if t == 0.0:
            pass  # nothing is rejected: r = 1
        elif alpha > 0:
            # r_i = q_i / (alpha p_i) below alpha (the note's eq. 23), as (q_i/p_i) (1/alpha)
            # so that neither product underflows
            inv_alpha = 1.0 + max((float(self.Da[J]) - t) / float(self.Qa[J]), 0.0)
            r[lo] = np.minimum(self.ra[:J] * inv_alpha, 1.0)
        elif J:
            # alpha = 0 regime (only q = 0 tokens below): accept them with a common probability
            r[lo] = min(max(1.0 - t / self.P0, 0.0), 1.0)
        w = np.zeros(n)
        if K and t > 0:
            inv_beta = (t + self.Pb[K]) / self.Qb[K]  # 1/beta, no overflow when t is tiny
            w[self.ib[:K]] = np.maximum(self.qb[:K] * inv_beta - self.pb[:K], 0.0)
        total = w.sum()
        s = w / total if total > 0 else np.array(q, dtype=np.float64)  # guarded: rejection has probability 0
        # the law with the solver's rejection mass t (more accurate than 1 - sum(p r) when t is tiny)
        law = p * r + s * t
        return r, s, alpha, beta, law


@dataclass(frozen=True, eq=False)
class MentoredResult:
    r"""Solution of mentored decoding for one budget ``D`` (see :func:`mentored`).

    Attributes
    ----------
    r : (n,) ndarray of float64
        Acceptance probability of each draft token; at a token of draft probability 0 (never drafted, but a
        user may pass it to the verifier) that of the strict coin :math:`u\,p_x < q_x`: 1 where
        :math:`q_x > 0`, 0 where :math:`q_x = 0`, as every verifier of the package.
    s : (n,) ndarray of float64
        Law of the output after a rejection (sums to 1).
    alpha : float
        Lower threshold on :math:`q_i/p_i` (``r_i = min(q_i/(alpha p_i), 1)``);
        ``0`` in the regime where only tokens with :math:`q_i = 0` are rejected.
    beta : float
        Upper threshold (``s_i ∝ (q_i/beta - p_i)_+``); ``inf`` when ``R = 1``
        is forced on a target with mass where ``p = 0``.
    acceptance : float
        :math:`R = \sum_i p_i r_i`.
    kl : float
        Achieved :math:`\mathrm{KL}(q \| \pi)` (recomputed from ``law``; ``<= D`` up to rounding).
    law : (n,) ndarray of float64
        Output law :math:`\pi = p \odot r + s (1 - R)`.
    D : float
        The budget.
    method : str
        ``"exact"`` or ``"bisection"``.
    iterations : int
        Newton (exact) or bisection steps taken.
    p, q : (n,) ndarray of float64
        Draft and target.
    """

    r: np.ndarray
    s: np.ndarray
    alpha: float
    beta: float
    acceptance: float
    kl: float
    law: np.ndarray
    D: float
    method: str
    iterations: int
    p: np.ndarray
    q: np.ndarray

    @property
    def verifier(self) -> "MentoredVerifier":
        """The k = 1 verifier that implements this solution (an attribute, as ``OTMResult.verifier``)."""
        return MentoredVerifier(self)

    def __repr__(self) -> str:
        return (
            f"MentoredResult(n={self.r.shape[0]}, D={self.D!r}, acceptance={self.acceptance!r}, "
            f"kl={self.kl!r}, alpha={self.alpha!r}, beta={self.beta!r}, method={self.method!r})"
        )


def check_curve_points(m: int, name: str) -> None:
    """Refuse a curve of more than :data:`MAX_CURVE_POINTS` points (``name`` the parameter), before any solve."""
    if m > MAX_CURVE_POINTS:
        raise ValueError(f"`{name}` has {m:,} points, above the limit MAX_CURVE_POINTS = {MAX_CURVE_POINTS:,} (one "
                         "solve over the vocabulary each)")


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _solve(prob: _Problem, D: float, method: str, tol: float, max_iter: int) -> MentoredResult:
    p, q = prob.p, prob.q
    its = 0
    if D == 0.0:
        # speculative sampling exactly (the same arithmetic as maximal_coupling); pi = q
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(q >= p, 1.0, q / np.where(p > 0, p, 1.0))
        s = residual(p, q)
        alpha = beta = 1.0
        law = np.array(q, dtype=np.float64)
    elif prob.t_max == 0.0 or D >= prob.kl_qp:
        # R = 1: accept every draft (p == q, or the budget covers KL(q || p)); pi = p
        J, K = prob.pieces(0.0)
        _, s, alpha, beta, _ = prob.build(0.0, int(J), int(K))
        r = np.ones(prob.n)
        law = np.array(p, dtype=np.float64)
        if prob.t_max == 0.0:
            alpha = beta = 1.0
    else:
        if method == "exact":
            t, J, K, its = prob.solve_exact(D)
        else:
            t, J, K, its = prob.solve_bisection(D, tol, max_iter)
        r, s, alpha, beta, law = prob.build(t, J, K)
    # A draft of probability 0 leaves the objective and pi unchanged whatever r is (the note's r_i = min(q_i /
    # (alpha p_i), 1) is undefined there); it takes the acceptance of the strict coin u * p < q of every other
    # verifier (coin_accept): accepted when q > 0, never when q = p = 0 (r = 1 there emitted, for a user-supplied
    # draft, a token the target excludes)
    r = np.where(p > 0, r, coin_accept(q, p))
    # R = 1 - sum p (1 - r): exactly 1 when every draft is accepted, accurate near 1 (sum p r where below 1/2)
    R = min(max(complement(math.fsum((p * (1.0 - r)).tolist()), lambda: math.fsum((p * r).tolist())), 0.0), 1.0)
    return MentoredResult(
        r=_ro(r),
        s=_ro(np.array(s, dtype=np.float64)),
        alpha=float(alpha),
        beta=float(beta),
        acceptance=float(R),
        kl=kl_divergence(q, law),
        law=_ro(law),
        D=D,
        method=method,
        iterations=int(its),
        p=p,
        q=q,
    )


def _check_method(method, tol, max_iter):
    validate_name(method, "method", _METHODS)  # an array: no "truth value is ambiguous" error
    tol = validate_probability(tol, "tol", low_open=True, high_open=True)
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
        raise ValueError(f"`max_iter` must be a positive integer, got {max_iter!r}")
    return tol, int(max_iter)


def mentored(p, q, D, *, method: str = "exact", tol: float = 1e-6, max_iter: int = 1100,
             normalize: bool = False) -> MentoredResult:
    r"""Mentored decoding: maximal acceptance subject to :math:`\mathrm{KL}(q \| \pi) \le D`.

    .. math::

        \max_{r, s \in [0,1]^n,\ \sum_i s_i = 1} \sum_i p_i r_i
        \quad \text{s.t.} \quad \mathrm{KL}(q \,\|\, \pi) \le D,
        \qquad \pi_i = p_i r_i + s_i \Big(1 - \sum_j p_j r_j\Big).

    The optimum has two thresholds :math:`\alpha \le 1 \le \beta` on
    :math:`q_i/p_i`: tokens with ratio :math:`\le \alpha` are accepted with
    probability :math:`q_i/(\alpha p_i)`, tokens in between always, and the
    rejected mass is sent to the tokens with ratio :math:`\ge \beta` in
    proportion to :math:`q_i/\beta - p_i`, so that :math:`q/\pi` equals
    :math:`\alpha` below, :math:`q/p` in between and :math:`\beta` above.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    D : float
        KL budget in nats, ``D >= 0``. ``D = 0`` is speculative sampling
        (lossless); ``D >= KL(q || p)`` accepts every draft.
    method : {"exact", "bisection"}, keyword-only
        ``"exact"`` (default): bracket the root of the piecewise-explicit,
        monotone ``KL`` in the rejection mass among the sorted-ratio
        breakpoints, then Newton to machine precision, so the KL constraint is
        tight to rounding. ``"bisection"``: the note's Algorithm 1, bisection
        on :math:`\alpha` until ``KL`` lies in ``[(1 - tol) D, (1 + tol) D]``
        (the note's update of :math:`\alpha_{\max}` is corrected; see the source).
    tol : float, keyword-only
        Relative tolerance on ``D`` for ``method="bisection"`` (the note's
        :math:`\gamma`), in ``(0, 1)``.
    max_iter : int, keyword-only
        Iteration cap for ``method="bisection"``.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.

    Returns
    -------
    MentoredResult
        ``r``, ``s``, ``alpha``, ``beta``, ``acceptance``, ``kl``, ``law``;
        ``result.verifier`` is the k = 1 verifier.

    Raises
    ------
    ValueError
        If ``D < 0``, ``p``/``q`` are not distributions on the same
        vocabulary, ``method`` is unknown or ``tol``/``max_iter`` are out of range.
    TypeError
        If ``D`` is not a real number.
    RuntimeError
        If ``method="bisection"`` does not reach ``tol`` in ``max_iter`` steps.

    Notes
    -----
    ``p`` and ``q`` are used as given (each sums to 1 within
    :data:`otspec.SIMPLEX_TOL`), except that subnormal entries (positive but
    below the smallest normal double, 2.2e-308) are set to exactly 0 on input,
    as at every entry point of otspec: the result *is* the result of the same
    problem with those entries at zero (they carry less than ``n * 2.3e-308`` of
    mass, and their reciprocals overflowed, which gave ``acceptance = 1`` and a
    NaN ``kl`` for ``q = [1, 5e-324]``). Entries down to 2.2e-308 (``1e-300``)
    are kept and handled exactly. When no token has :math:`q_i < p_i` in
    floating point, nothing can be rejected and :math:`\pi = p`; if ``q`` then
    still puts (rounding-level) mass where ``p = 0``, ``kl`` is infinite.
    When the optimal rejection mass underflows (huge ``D`` with target mass
    where ``p = 0``) the least positive double that keeps :math:`\pi > 0` is
    used, which satisfies the budget. ``kl`` is computed as
    :math:`\sum_{q_i>0} q_i h(\pi_i/q_i - 1) + \sum_{q_i=0} \pi_i` with
    :math:`h(u) = u - \ln(1+u)`, accurate when :math:`\pi \approx q`.

    See Also
    --------
    mentored_frontier : the whole acceptance/KL trade-off.
    lenient_verifier : Leviathan et al.'s lenience, a non-optimal trade-off.

    References
    ----------
    .. [1] V. Tran-Thien, "Mentored decoding", 2023, §4 (the thresholds,
       eqs. 23–28) and Algorithm 1 (bisection).

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> res = otspec.mentored(p, q, 0.0)             # speculative sampling
    >>> round(res.acceptance, 12)
    0.7
    >>> res = otspec.mentored(p, q, 0.05)
    >>> round(res.acceptance, 6), abs(res.kl - 0.05) < 1e-15
    (0.829466, True)
    >>> otspec.mentored(p, q, 1.0).acceptance         # D >= KL(q || p)
    1.0
    >>> r = otspec.mentored([0.5, 0.5], [1.0, 5e-324], 0.01)  # a subnormal entry is 0
    >>> r.acceptance == otspec.mentored([0.5, 0.5], [1.0, 0.0], 0.01).acceptance, bool(r.kl <= 0.01 + 1e-15)
    (True, True)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    D = _validate_D(D)
    tol, max_iter = _check_method(method, tol, max_iter)
    return _solve(_Problem(p_, q_), D, method, tol, max_iter)


class MentoredVerifier(Verifier):
    r"""The k = 1 verifier of a mentored-decoding solution (lossy: its output law is :math:`\pi`).

    .. math::

        K(y \mid x) = r_x \mathbb 1\{y = x\} + (1 - r_x)\, s_y,
        \qquad \sum_x p_x K(y \mid x) = \pi_y = p_y r_y + s_y (1 - R).

    Build it with :func:`mentored_verifier` or ``mentored(...).verifier``.
    Rejection only happens on tokens with :math:`r_x < 1`, where
    :math:`s_x = 0`, so the acceptance :math:`P(Y = X)` is exactly :math:`R`.

    Attributes
    ----------
    result : MentoredResult
        The solution it implements.
    """

    def __init__(self, result: MentoredResult):
        if not isinstance(result, MentoredResult):
            raise TypeError(f"`result` must be a MentoredResult, got {type(result).__name__}")
        self.k = 1
        self.p = result.p
        self.q = result.q
        self.result = result

    @property
    def lossless(self) -> bool:
        """False unless ``D = 0`` (or the pair needs no correction)."""
        return bool(self.result.kl == 0.0)

    def conditional(self, drafts) -> np.ndarray:
        (x,) = self._drafts(drafts)
        rx = float(self.result.r[x])
        out = (1.0 - rx) * self.result.s
        out[x] += rx
        return out

    def acceptance(self) -> float:
        return self.result.acceptance

    def output_law(self) -> np.ndarray:
        return self.result.law

    def sample(self, drafts, *, rng=None) -> int:
        (x,) = self._drafts(drafts)
        gen = as_rng(rng)
        if gen.random() < self.result.r[x]:
            return x
        return sample_from(self.result.s, gen)


def mentored_verifier(p, q, D, *, method: str = "exact", tol: float = 1e-6, max_iter: int = 1100,
                      normalize: bool = False) -> MentoredVerifier:
    r"""Mentored decoding (k = 1) as a verifier; see :func:`mentored`.

    .. math::

        K(y \mid x) = r_x \mathbb 1\{y = x\} + (1 - r_x)\, s_y,
        \quad (r, s) = \arg\max \Big\{ \textstyle\sum_i p_i r_i :
        \mathrm{KL}(q \,\|\, p \odot r + s (1 - \sum_j p_j r_j)) \le D \Big\}.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    D : float
        KL budget (nats), ``D >= 0``.
    method, tol, max_iter, normalize
        As in :func:`mentored`.

    Returns
    -------
    MentoredVerifier
        ``lossless`` is False for ``D > 0``; ``output_law()`` is :math:`\pi`.

    Raises
    ------
    ValueError, TypeError
        As in :func:`mentored`.

    References
    ----------
    .. [1] V. Tran-Thien, "Mentored decoding", 2023, §4.

    Examples
    --------
    >>> import otspec
    >>> v = otspec.mentored_verifier([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 0.05)
    >>> chk = otspec.check_lossless(v)
    >>> bool(chk.max_law_error < 1e-15), bool(chk.acceptance_error < 1e-15)
    (True, True)
    """
    return mentored(p, q, D, method=method, tol=tol, max_iter=max_iter, normalize=normalize).verifier


@dataclass(frozen=True, eq=False)
class MentoredFrontier:
    r"""The optimal acceptance/KL trade-off at budgets ``D`` (see :func:`mentored_frontier`).

    Attributes
    ----------
    D : (m,) ndarray of float64
        The budgets.
    acceptance : (m,) ndarray of float64
        Optimal acceptance :math:`R^*(D)` (non-decreasing, concave in ``D``).
    kl : (m,) ndarray of float64
        Achieved :math:`\mathrm{KL}(q \| \pi)` (equals ``min(D, KL(q || p))`` to rounding).
    alpha, beta : (m,) ndarray of float64
        The thresholds.
    kl_qp : float
        :math:`\mathrm{KL}(q \| p)`: the budget from which :math:`R^* = 1`.
    acceptance0 : float
        :math:`R_0 = \sum_i \min(p_i, q_i)`, the lossless acceptance.
    """

    D: np.ndarray
    acceptance: np.ndarray
    kl: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    kl_qp: float
    acceptance0: float


def mentored_frontier(p, q, Ds, *, normalize: bool = False) -> MentoredFrontier:
    r"""The optimal acceptance as a function of the KL budget: :math:`D \mapsto R^*(D)`.

    .. math::

        R^*(D) = \max \Big\{ \sum_i p_i r_i :
        \mathrm{KL}\big(q \,\big\|\, p \odot r + s\,(1 - \textstyle\sum_j p_j r_j)\big) \le D \Big\},

    from :math:`R^*(0) = \sum_i \min(p_i, q_i)` (speculative sampling) to
    :math:`R^*(D) = 1` for :math:`D \ge \mathrm{KL}(q \| p)`. The sort and prefix
    sums are shared by all budgets.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    Ds : (m,) array_like of float
        Budgets, each ``>= 0``.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    MentoredFrontier

    Raises
    ------
    ValueError
        If a budget is negative or not finite-or-inf, or ``Ds`` is empty / not 1-D or has more than
        ``MAX_CURVE_POINTS`` (10,000) budgets.

    References
    ----------
    .. [1] V. Tran-Thien, "Mentored decoding", 2023, §5 (both problems share solutions).

    Examples
    --------
    >>> import otspec
    >>> fr = otspec.mentored_frontier([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [0.0, 0.05, 1.0])
    >>> fr.acceptance.round(6).tolist()
    [0.7, 0.829466, 1.0]
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    Ds_ = as_float_array(Ds, "Ds", "a 1-D array_like of floats")
    if Ds_.ndim != 1 or Ds_.shape[0] == 0:
        raise ValueError(f"`Ds` must be a non-empty 1-D array, got shape {Ds_.shape}")
    check_curve_points(Ds_.shape[0], "Ds")
    bad = np.isnan(Ds_) | (Ds_ < 0)
    if np.any(bad):
        raise ValueError(f"`Ds` must hold non-negative KL budgets, got {float(Ds_[bad][0])!r}")
    prob = _Problem(p_, q_)
    cols = np.empty((4, Ds_.shape[0]))  # the four numbers of each solve; its (V,) arrays are not kept
    for j, D in enumerate(Ds_):
        r = _solve(prob, float(D), "exact", 1e-6, 200)
        cols[:, j] = (r.acceptance, r.kl, r.alpha, r.beta)
    return MentoredFrontier(
        D=_ro(Ds_),
        acceptance=_ro(cols[0].copy()),
        kl=_ro(cols[1].copy()),
        alpha=_ro(cols[2].copy()),
        beta=_ro(cols[3].copy()),
        kl_qp=float(prob.kl_qp),
        acceptance0=float(np.minimum(p_, q_).sum()),
    )
