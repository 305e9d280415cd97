r"""Optimal acceptance of ``k`` drafts drawn *without replacement*, after one sort.

The drafts are ``k`` distinct tokens drawn sequentially from ``p``
renormalised over the tokens not yet drawn (Gumbel-top-k, stochastic beam):

.. math::

    P(X = (x_1, \dots, x_k)) = \prod_{i=1}^k \frac{p(x_i)}{1 - \sum_{j<i} p(x_j)}
    \qquad (x \text{ distinct}).

The max-flow argument of OTM-k never uses independence, so for this draft
process (docs/theory/without_replacement.rst; Hu et al., "Towards Optimal
Multi-draft Speculative Decoding", ICLR 2025, arXiv:2502.18779)

.. math::

    \alpha^{\mathrm{wor}}_k(p, q) = \min_{\Omega_0 \subseteq \Omega}
        \big[\, 1 + q(\Omega_0) - f(\Omega_0) \,\big],
    \qquad f(A) = P(\text{all } k \text{ drafts lie in } A).

**Structure (proved here).** A minimiser is again a prefix of the tokens
sorted by :math:`q/p` ascending (tokens with :math:`p = 0` last). Proof:
sampling without replacement proportionally to ``p`` is an exponential
race: token ``x`` arrives at :math:`E_x / p(x)` with independent
:math:`E_x \sim \mathrm{Exp}(1)` and the drafts are the first ``k``
arrivals. For a set ``A`` (complement mass :math:`c = 1 - p(A)`) and a
token ``z`` of mass ``m`` outside it, conditioning on the arrival time
``t`` of ``z`` gives

.. math::

    \frac{f(A + z) - f(A)}{m} = \int_0^\infty e^{-c t}\, W_A(t;\, c - m)\, dt,

with :math:`W_A(t; r) = E[\mathbb 1\{N_A(t) \le k-1\}\, \pi_r(t)]`,
:math:`N_A(t)` the number of tokens of ``A`` arrived by ``t`` and
:math:`\pi_r(t)` the chance that the missing :math:`k - 1 - N_A(t)`
arrivals of ``A`` come before an independent :math:`\mathrm{Exp}(r)`
clock. :math:`W_A` decreases in ``r`` and, for ``x`` outside ``A``,
:math:`e^{-p(x) t} W_A(t; r) \le W_{A+x}(t; r)` (on the event that ``x``
has not arrived by ``t`` the counts agree and ``A + x`` can only finish
sooner). Hence, for every ``B``, ``x, y`` outside ``B`` (distinct, positive
mass),

.. math::

    \frac{f(B + x) - f(B)}{p(x)} \;\le\; \frac{f(B + x + y) - f(B + x)}{p(y)}.

At a minimiser ``A``, removing ``x`` and adding ``y`` cannot help, so
:math:`q(x) \le f(A) - f(A - x)` and :math:`q(y) \ge f(A + y) - f(A)`;
the inequality then gives :math:`q(x)/p(x) \le q(y)/p(y)` for every
``x`` in ``A`` and ``y`` outside. When the ratios tie, both moves are
free (all inequalities are equalities), so the whole tie class can be
added: a minimiser is a prefix of *any* ratio order. Tokens with
:math:`p = 0` never enter a minimiser usefully (``f`` ignores them).

**Computing f on every prefix.** With :math:`c_j` the mass outside the
first ``j`` tokens and :math:`v = \log t`,

.. math::

    1 - f(A_j) = \int_{-\infty}^{\infty} P(N_{A_j}(e^v) < k)\; c_j e^v e^{-c_j e^v}\, dv,

a Poisson-binomial lower tail (success probabilities
:math:`1 - e^{-p(x) t}`) under one integral. Tokens are added one at a
time to a truncated Poisson-binomial recursion (``k`` states per node, each
update ``s[i] += (s[i-1] - s[i]) (1 - e^{-p t})``, so no cancellation and no
drift), and the integral is the trapezoid rule in ``v``: the integrand is
entire and decays exponentially as :math:`v \to -\infty` and
double-exponentially as :math:`v \to \infty`, so the rule converges
geometrically in the step, each halving about squaring the error. A fixed
step is not enough: the integrand's transition from 0 to 1 narrows like
:math:`1/\sqrt k` and its analytic strip shrinks with :math:`c_j`, so
step 1/4 errs by ``1e-4`` at ``n = 100, k = 64``. Instead the rule is
*error-controlled*: the first pass evaluates steps ``2h`` and ``h`` on
nested grids (``h = 1/8`` up to ``k = 63``, halved for every factor 4 of
``k`` beyond); every prefix whose two sums differ by more than
``QUAD_TOL = 1e-13`` gets the midpoints of the next halving (only the nodes
it needs, only the tokens before it), until all agree. The returned value
is the finer sum, whose quadrature error is then far below ``1e-13``. The
grid's left end is where the covered part :math:`P(N \ge k)` is below
``1e-18`` in all (the uncovered part there, ``c t e^{-c t}`` alone, is
summed in closed form); its right end where :math:`c_j t > 41.5`; a node
whose :math:`P(N < k)` falls below ``1e-30`` leaves the pass. Suffix masses
are compensated sums (full relative accuracy), and ``k = 1`` is exact
(:math:`1 - f = c_j`).

**Guarantee.** Absolute error at most ``1e-13 + 4 n eps`` on every prefix
(the second term a worst-case bound on the recursion's float64 rounding);
measured against exact rationals (one or two mass classes, ``k`` up to
``n``, ``n`` up to 49,152) the error stays below ``1e-14``. Cost
:math:`O(n \log n + n k M)`, ``M`` the nodes (200 to 400 on LLM-like pairs
at ``n = 49,152``), compiled by numba when installed (the ``fast`` extra;
``_race_kernel``).

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._array import parse_ks
from .._registry import validate_name
from .._validation import (
    as_float_array,
    first_bad_entry,
    sequence_like,
    validate_distribution,
    validate_drafts,
    validate_k,
    validate_pair,
    validate_positive_int,
    validate_probability,
)
from . import _race_kernel as rk
from ._cut import MinCut, ratio_order
from ._lp import _membership_plan

__all__ = [
    "alpha_k_without_replacement",
    "min_cut_without_replacement",
    "prob_within_without_replacement",
    "uncovered_prefixes",
    "wor_lp",
    "wor_plan",
    "wor_tuple_law",
    "wor_draft_prob",
]

#: Refinement stops when two successive step halvings agree to this, on every prefix.
QUAD_TOL = 1e-13
#: The grid stops where c t > _CUT for a prefix (its weight beyond is below 4e-17 in all).
_CUT = 41.5
#: The terms left out below the grid's first node, P(N >= k) there, add at most this.
_T_LOW = 1e-18
#: ... and the grid starts no higher than this log-time (the left tail is summed in closed form below it).
_V_LOW_MAX = -5.0
#: Coarsest step halvings (the first pass compares step 2h with h); beyond the last, the pass refuses.
_MAX_HALVINGS = 6
#: Largest n * max(k) * M (tokens x drafts x nodes of the first pass) the race pass runs.
MAX_RACE_WORK = 4e9
#: Largest number of ordered tuples (times n) the LP references build.
MAX_LP_VARIABLES = 2_000_000


def _support_size_check(p: np.ndarray, k: int) -> None:
    m = int(np.count_nonzero(p > 0))
    if m < k:
        raise ValueError(
            f"`k`={k} distinct drafts need at least k tokens with p > 0, but `p` has {m}"
        )


def _running_sums(x: np.ndarray) -> np.ndarray:
    """``cumsum(x)`` of non-negative ``x``, compensated: each addition's rounding error is recovered exactly
    (TwoSum on the computed running sums) and added back (a few ulps of each sum)."""
    s = np.cumsum(x)
    if x.shape[0] > 1:
        a, b, r = s[:-1], x[1:], s[1:]
        bb = r - a
        s[1:] += np.cumsum((a - (r - bb)) + (b - bb))
    return s


def suffix_masses(p: np.ndarray) -> np.ndarray:
    """``c[j] = sum(p[j:])`` for ``j = 0..n`` (``c[n] = 0``), a compensated running sum (a few ulps of ``c[j]``).

    A plain running sum of 49,152 equal masses drifts by ``5e-13`` relative,
    which the race integral would carry into ``f``; the compensated one
    (:func:`_running_sums`) keeps full relative accuracy.
    """
    out = np.zeros(p.shape[0] + 1)
    out[:-1] = _running_sums(np.ascontiguousarray(p[::-1], dtype=np.float64))[::-1]
    return out


def _two_draws_uncovered(p_sorted: np.ndarray, c: np.ndarray) -> np.ndarray:
    r"""``1 - f(first j tokens)`` at ``k = 2`` for ``j = 0..n``, in closed form (no race integral).

    With :math:`T` the total mass, :math:`c_j` the mass after the first ``j``
    tokens and :math:`A_j` those tokens, the first draw is ``i`` with
    chance :math:`p_i / T` and the second lies in :math:`A_j` with chance
    :math:`(T - c_j - p_i) / (T - p_i) = 1 - c_j / (T - p_i)`, so

    .. math::

        1 - f(A_j) = \frac{c_j}{T}\Big(1 + \sum_{i < j} \frac{p_i}{T - p_i}\Big),

    a sum of non-negative terms (no cancellation; :math:`T - p_i` is the
    mass of the other tokens, summed, not subtracted): relative error a few
    ``n eps``. Where :math:`c_j = 0` it is 0; where the prefix holds fewer
    than two tokens with ``p > 0`` it is 1, as the formula gives.
    """
    n = p_sorted.shape[0]
    pre = np.zeros(n + 1)
    pre[1:] = _running_sums(p_sorted)
    others = pre[:-1] + c[1:]  # T - p_i, as the masses before and after token i
    ratio = np.divide(p_sorted, others, out=np.zeros(n), where=others > 0)  # others = 0: c_j = 0 for j > i
    s = np.zeros(n + 1)
    s[1:] = _running_sums(ratio)
    return np.minimum(c * (1.0 + s) / c[0], 1.0)


def _left_tail(x: np.ndarray, h: float) -> np.ndarray:
    r"""``h * sum_{i >= 1} x r^{-i} exp(-x r^{-i})``, ``r = e^h``, for ``0 <= x <= e^{-5}`` (series in ``x``).

    .. math::

        \sum_{i \ge 1} x r^{-i} e^{-x r^{-i}} = \sum_{l \ge 0} \frac{(-1)^l x^{l+1}}{l!\,(r^{l+1} - 1)};

    fourteen terms leave less than ``1e-40``.
    """
    out = np.zeros_like(x)
    term = np.array(x, dtype=np.float64)
    for l in range(14):
        out += term / math.expm1((l + 1) * h) if l % 2 == 0 else -term / math.expm1((l + 1) * h)
        term = term * x / (l + 1)
    return h * out


def _first_step(K: int) -> float:
    """First (finer) trapezoid step: 1/8 up to k = 63, halved for every factor 4 of ``k`` beyond (measured)."""
    return 0.125 / 2.0 ** max(0, math.floor(math.log(max(K, 16) / 16, 4)))


def _race(p_sorted: np.ndarray, ks: np.ndarray, rows: np.ndarray | None = None, step: float | None = None,
          closed_two: bool = True):
    r"""``U[l, j] = 1 - f(first j tokens)`` for ``k = ks[l]`` (sorted, unique), by the error-controlled race integral.

    ``k = 1`` is ``c`` exactly and ``k = 2`` is in closed form (:func:`_two_draws_uncovered`; ``closed_two=False``
    integrates it too, the independent route its tests compare with). Prefixes outside ``rows`` (when given) are left
    at 0 unless exact. Returns ``(U, info)``, ``info`` a dict with the nodes and halvings used.
    """
    n = p_sorted.shape[0]
    L = ks.shape[0]
    K = int(ks[-1])
    c = suffix_masses(p_sorted)
    npos = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(p_sorted > 0, out=npos[1:])
    U = np.ones((L, n + 1))
    covers = npos[None, :] >= ks[:, None]
    U[covers] = 0.0  # c = 0 there: every draft inside; overwritten below where c > 0
    need = covers & (c[None, :] > 0)
    if rows is not None:
        need &= rows[None, :]
    if ks[0] == 1:  # one draft: P(it lies outside A) = c exactly
        U[0] = np.where(covers[0], c, 1.0)
        need[0] = False
    two = np.flatnonzero(ks == 2)
    if closed_two and two.size and c[0] > 0:  # two drafts: closed form
        U[two[0]] = np.where(covers[two[0]], _two_draws_uncovered(p_sorted, c), 1.0)
        need[two[0]] = False
    info = {"nodes": 0, "halvings": 0, "work": 0}
    if not need.any():
        return U, info
    kmin = int(ks[need.any(axis=1)].min())
    # below t0, P(N >= k) <= t^k / k!, so the terms left out add at most t0^(k+1) / (k+1)! <= _T_LOW
    v_lo = min(_V_LOW_MAX, (math.log(_T_LOW) + math.lgamma(kmin + 2)) / (kmin + 1))
    h = _first_step(K) if step is None else float(step) / 2
    active = need.T.copy()  # (n + 1, L): prefixes still refining
    S = np.zeros((n + 1, L))  # node sums of the current grid (all levels so far)
    first = True
    p_c = np.ascontiguousarray(p_sorted)  # the kernel's one compiled layout (a view may come strided)
    while True:
        live = active.any(axis=1)
        j_stop = int(np.flatnonzero(live)[-1]) + 1
        v_hi = math.log(_CUT / float(c[live].min()))
        if first:
            v = v_lo + h * np.arange(int(math.ceil((v_hi - v_lo) / h)) + 1)
            coarse = np.arange(v.shape[0]) % 2 == 0
            work = j_stop * K * v.shape[0]
            if work > MAX_RACE_WORK:
                raise ValueError(
                    f"the race pass would take n * k * M = {j_stop} * {K} * {v.shape[0]} steps, above the limit "
                    f"{MAX_RACE_WORK:.0e} (`k` is the number of distinct drafts; M the log-time grid)"
                )
        else:
            v = v_lo + h * (2 * np.arange(int(math.ceil((v_hi - v_lo) / (2 * h)))) + 1)
            coarse = np.zeros(v.shape[0], dtype=bool)
        t = np.exp(v)
        new = np.zeros((n + 1, L))
        new_coarse = np.zeros((n + 1, L))
        info["work"] += rk.race_pass(p_c, c, t, ks, live, j_stop, coarse, _CUT, new, new_coarse)
        info["nodes"] += v.shape[0]
        tail = _left_tail(c * math.exp(v_lo), h)[:, None]
        if first:
            fine = h * new + tail
            rough = 2 * h * new_coarse + _left_tail(c * math.exp(v_lo), 2 * h)[:, None]
            S = new
        else:
            rough = 2 * h * S + _left_tail(c * math.exp(v_lo), 2 * h)[:, None]
            S = np.where(active, S + new, S)
            fine = h * S + tail
        done = active & (np.abs(fine - rough) <= QUAD_TOL)
        U.T[done] = np.minimum(fine[done], 1.0)
        active &= ~done
        if not active.any():
            return U, info
        first = False
        h /= 2
        info["halvings"] += 1
        if info["halvings"] > _MAX_HALVINGS:  # pragma: no cover - not reached on any input tested
            raise FloatingPointError(
                f"the race integral did not settle to {QUAD_TOL:g} after {_MAX_HALVINGS} step halvings "
                f"on {int(active.sum())} prefixes (n = {n}, k = {K})"
            )


def uncovered_prefixes(p_sorted, k, *, step: float | None = None) -> np.ndarray:
    r"""``1 - f(first j tokens)`` for ``j = 0..n``, ``f(A)`` = P(all ``k`` drafts without replacement lie in ``A``).

    .. math::

        1 - f(A_j) = \int_{-\infty}^{\infty} P\big(N_{A_j}(e^v) < k\big)\, c_j e^v e^{-c_j e^v}\, dv,
        \qquad c_j = p(\text{tokens after the first } j),

    by the trapezoid rule in log-time, halving the step until two successive
    steps agree to ``QUAD_TOL`` (``1e-13``) on every prefix (module
    docstring). ``p_sorted`` is ``p`` in the order of the prefixes; ``k`` an
    int (returns ``(n + 1,)``) or a sequence of ints (returns
    ``(len(k), n + 1)``, one pass for all of them).

    Parameters
    ----------
    p_sorted : (n,) array_like of float
        Draft masses in the order of the prefixes (summing to 1).
    k : int or sequence of int
        Number(s) of draws without replacement.
    step : float, keyword-only
        The coarser of the first two trapezoid steps compared, in (0, 1]
        (default: 1/4 up to ``k = 63``, then halved for every factor 4 of ``k``).

    Returns
    -------
    (n + 1,) or (len(k), n + 1) ndarray of float64
        ``1 - f(first j tokens)``, ``j = 0..n`` (1 where fewer than ``k``
        tokens of the prefix have ``p > 0``). Absolute error at most
        ``1e-13 + 4 n eps`` (quadrature settled to ``1e-13``; the second
        term bounds the float64 rounding of the recursion, measured below
        ``1e-14`` at ``n = 49,152`` against exact rationals).

    Raises
    ------
    ValueError
        ``p_sorted`` not finite non-negative masses, ``step`` outside (0, 1], a ``k`` below 1,
        or a race pass above ``MAX_RACE_WORK`` steps.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.otm._without_replacement import uncovered_prefixes
    >>> u = uncovered_prefixes(np.array([0.5, 0.25, 0.25]), 2)
    >>> [round(float(x), 15) for x in u]
    [1.0, 1.0, 0.583333333333333, 0.0]
    """
    ks, _ = parse_ks(k)  # Python ints: a k past int64 is refused by no cast
    p_sorted = as_float_array(p_sorted, "p_sorted", "a 1-D array_like of masses", booleans=False)
    if p_sorted.ndim != 1:
        raise ValueError(f"`p_sorted` must be a 1-D array of finite non-negative masses, got shape {p_sorted.shape}")
    if not np.all(np.isfinite(p_sorted)) or np.any(p_sorted < 0):
        raise ValueError("`p_sorted` must be a 1-D array of finite non-negative masses, got "
                         f"{first_bad_entry(p_sorted, ~(p_sorted >= 0) | ~np.isfinite(p_sorted))}")
    # every k above n gives 1 at every prefix (fewer than k tokens): the same values at k = n + 1
    ks = np.array([min(kk, p_sorted.shape[0] + 1) for kk in ks], dtype=np.int64)
    if step is not None:
        step = validate_probability(step, "step", low_open=True)  # numpy floats too; the message shows the value
    uniq, inv = np.unique(ks, return_inverse=True)
    U, _ = _race(p_sorted, uniq.astype(np.int64), step=step)
    out = U[inv]
    return out[0] if np.ndim(k) == 0 else out


def _exact_all(p: np.ndarray, q: np.ndarray, ks) -> np.ndarray:
    """alpha_k without replacement for every k in ``ks``, one sort and one pass."""
    order = ratio_order(p, q)
    uniq, inv = np.unique(np.asarray(ks, dtype=np.int64), return_inverse=True)
    unc, _ = _race(p[order], uniq)
    Q = np.zeros(p.shape[0] + 1)
    np.cumsum(q[order], out=Q[1:])
    return np.clip((Q[None, :] + unc[inv]).min(axis=1), 0.0, 1.0)


def min_cut_without_replacement(p, q, k: int, *, normalize: bool = False) -> MinCut:
    r"""The minimising set of :math:`\alpha^{\mathrm{wor}}_k` (a prefix of the :math:`q/p`-ascending order).

    .. math::

        \alpha^{\mathrm{wor}}_k(p, q) = \min_{\Omega_0}\big[1 + q(\Omega_0) - P(S \subseteq \Omega_0)\big].

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    k : int
        Number of distinct drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    MinCut
        ``alpha``, ``omega0`` and ``p_mass``, ``q_mass`` of the minimiser.

    Raises
    ------
    ValueError, TypeError
        Invalid distributions or ``k``; fewer than ``k`` tokens with ``p > 0``.

    Examples
    --------
    >>> import otspec
    >>> cut = otspec.otm.min_cut_without_replacement([0.5, 0.3, 0.2], [0.1, 0.2, 0.7], 2)
    >>> cut.omega0.tolist(), round(cut.alpha, 12)
    ([0, 1], 0.785714285714)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    _support_size_check(p_, k)
    order = ratio_order(p_, q_)
    Q = np.zeros(p_.shape[0] + 1)
    np.cumsum(q_[order], out=Q[1:])
    vals = Q + _race(p_[order], np.array([k], dtype=np.int64))[0][0]
    j = int(np.argmin(vals))
    alpha = min(1.0, max(0.0, float(vals[j])))
    return MinCut(alpha=alpha, omega0=np.sort(order[:j]), order=order, size=j,
                  p_mass=float(p_[order[:j]].sum()), q_mass=float(Q[j]), k=k)


def alpha_k_without_replacement(p, q, k, *, method: str = "exact", normalize: bool = False):
    r"""Optimal acceptance of ``k`` distinct drafts drawn sequentially without replacement from ``p``.

    .. math::

        \alpha^{\mathrm{wor}}_k(p, q) = \max_{\pi}\ P(Y \in S(X))
        = \min_{\Omega_0 \subseteq \Omega} \big[\, 1 + q(\Omega_0) - P(S(X) \subseteq \Omega_0) \,\big],

    the maximum over couplings :math:`\pi` of the without-replacement tuple
    law and ``q``. The minimiser is a prefix of the tokens sorted by
    :math:`q/p` ascending (module docstring), so ``method="exact"`` costs one
    sort and one error-controlled pass of a truncated Poisson-binomial
    recursion over a log-time grid: :math:`O(n \log n + n k M)`, ``M`` a few
    hundred nodes.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int or sequence of int
        Number of distinct drafts; a sequence returns an array.
    method : {"exact", "lp"}, keyword-only
        ``"lp"``: the membership-cost LP over ordered distinct tuples
        (:func:`wor_lp`), the small-input reference.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    float or ndarray
        :math:`\alpha^{\mathrm{wor}}_k`. The exact method's absolute error is
        at most ``1e-13 + 4 n eps`` at every ``n`` and ``k`` it accepts (the
        trapezoid rule refined until successive halvings agree to ``1e-13``;
        the second term bounds float64 rounding, measured below ``1e-14``
        against exact rationals); the LP's is its re-check tolerance ``1e-9``.

    Raises
    ------
    ValueError
        Invalid distributions, ``k < 1``, fewer than ``k`` tokens with
        ``p > 0``, unknown ``method``, an LP too large, or a race pass above
        ``MAX_RACE_WORK`` (``n * k * M``) steps.
    TypeError
        ``k`` not an integer.

    References
    ----------
    .. [1] Hu, Zheng, Viswanathan, Chen, Rossi, Wu, Manocha, Huang, "Towards
       Optimal Multi-draft Speculative Decoding", ICLR 2025, arXiv:2502.18779.

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.6, 0.3, 0.1], [0.2, 0.3, 0.5]
    >>> round(otspec.alpha_k(p, q, 2, replacement=False), 10)
    0.7928571429
    >>> round(float(otspec.alpha_k(p, q, 2)), 10)
    0.69
    """
    validate_name(method, "method", ("exact", "lp"))
    p_, q_ = validate_pair(p, q, normalize=normalize)
    ks, scalar = parse_ks(k)  # Python ints: a k past int64 gets the support message, not an OverflowError
    for kk in ks:
        _support_size_check(p_, kk)
    if method == "exact":
        vals = _exact_all(p_, q_, ks)
    else:
        vals = np.array([wor_lp(p_, q_, kk) for kk in ks])
    return float(vals[0]) if scalar else vals


def prob_within_without_replacement(p, omega0, k: int) -> float:
    r""":math:`P(S \subseteq \Omega_0)` for ``k`` draws without replacement from ``p`` (exponential race).

    .. math::

        P(S \subseteq \Omega_0) = 1 - \int_0^\infty P\big(N_{\Omega_0}(t) < k\big)\, c\, e^{-c t}\, dt,
        \qquad c = 1 - p(\Omega_0).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    omega0 : sequence of int
        The token set :math:`\Omega_0`.
    k : int
        Number of draws without replacement.

    Returns
    -------
    float
        :math:`P(S \subseteq \Omega_0)`, absolute error at most
        ``1e-13 + 4 |Omega_0| eps`` (error-controlled quadrature, see
        :func:`uncovered_prefixes`).

    Raises
    ------
    ValueError
        Invalid ``p``, ``k`` or ``omega0``; fewer than ``k`` tokens with ``p > 0``.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.otm.prob_within_without_replacement([0.5, 0.25, 0.25], [0, 1], 2), 12)
    0.416666666667
    """
    p_ = validate_distribution(p, "p", normalizable=False)
    k = validate_k(k)
    _support_size_check(p_, k)
    ids = np.asarray(omega0)
    if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= p_.shape[0])):
        raise ValueError(f"`omega0` must be a 1-D sequence of token ids in [0, {p_.shape[0]})")
    inside = np.zeros(p_.shape[0], dtype=bool)
    inside[ids.astype(np.int64)] = True
    order = np.concatenate([np.flatnonzero(inside), np.flatnonzero(~inside)])
    rows = np.zeros(p_.shape[0] + 1, dtype=bool)
    rows[int(inside.sum())] = True
    U, _ = _race(p_[order], np.array([k], dtype=np.int64), rows=rows)
    return 1.0 - float(U[0, int(inside.sum())])


# ----------------------------------------------------------------------------- exact small-input references
def wor_draft_prob(p, drafts) -> float:
    r"""Probability of an ordered draft tuple drawn without replacement from ``p`` (0 for repeats).

    .. math::

        P(X = x) = \prod_{i=1}^k \frac{p(x_i)}{\sum_{y \notin \{x_1..x_{i-1}\}} p(y)}.

    The mass still available is summed directly over the tokens not drawn (not
    ``1 - drawn``), so it keeps full relative accuracy when small.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    drafts : sequence of int
        The ordered draft tuple.

    Returns
    -------
    float
        Its probability (0 when a token repeats).

    Raises
    ------
    ValueError
        ``p`` not a distribution, an id outside ``[0, n)``.
    TypeError
        Non-integer ids.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.otm.wor_draft_prob([0.5, 0.25, 0.25], [1, 0]), 12)
    0.166666666667
    """
    p_ = validate_distribution(p, "p", normalizable=False)
    return _wor_draft_prob(p_, validate_drafts(drafts, len(drafts) if sequence_like(drafts) else 1, p_.shape[0]))


def _wor_draft_prob(p: np.ndarray, drafts) -> float:
    xs = tuple(int(x) for x in drafts)
    if len(set(xs)) < len(xs):
        return 0.0
    free = np.ones(p.shape[0], dtype=bool)
    w = 1.0
    for x in xs:
        rest = float(p[free].sum())
        if not (rest > 0 and p[x] > 0):
            return 0.0
        w *= float(p[x]) / rest
        free[x] = False
    return w


def wor_tuple_law(p, k: int, *, max_tuples: int = 1_000_000):
    r"""Every ordered distinct ``k``-tuple of ``supp p`` with its without-replacement probability.

    Returns
    -------
    tuples : list of tuple of int
    weights : (m,) ndarray of float64
    """
    p_ = np.asarray(p, dtype=np.float64)
    k = validate_k(k)
    max_tuples = validate_positive_int(max_tuples, "max_tuples")
    support = np.flatnonzero(p_ > 0).tolist()
    _support_size_check(p_, k)
    m = math.perm(len(support), k)
    if m > max_tuples:
        raise ValueError(f"enumerating {m} ordered draft tuples exceeds `max_tuples`={max_tuples}")
    tuples = list(itertools.permutations(support, k))
    return tuples, np.array([_wor_draft_prob(p_, x) for x in tuples])


def wor_lp(p, q, k: int):
    r"""The without-replacement OTM LP over ordered distinct tuples (HiGHS), the small-input reference.

    .. math::

        \max_{f \ge 0} \sum_{x} \sum_{y \in S(x)} f(x, y)
        \quad\text{s.t.}\quad \sum_y f(x, y) \le P(X = x),\ \ \sum_x f(x, y) \le q(y),

    over ordered distinct tuples ``x`` of ``supp p``.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of drafts without replacement.

    Returns
    -------
    alpha : float
        The LP optimum (re-checked within ``LP_CHECK_TOL``).

    Raises
    ------
    ValueError
        Invalid ``p``, ``q`` or ``k``; more tuples than ``MAX_LP_VARIABLES``.
    SolverError
        HiGHS does not return an optimal, re-checked solution.

    References
    ----------
    .. [1] Hu, Zheng, Viswanathan, Chen, Rossi, Wu, Manocha, Huang, "Towards Optimal Multi-draft
       Speculative Decoding", ICLR 2025, arXiv:2502.18779.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.otm.wor_lp([0.6, 0.3, 0.1], [0.2, 0.3, 0.5], 2), 9)
    0.792857143
    """
    p_, q_ = validate_pair(p, q, normalizable=False)
    k = validate_k(k)
    tuples, w = wor_tuple_law(p_, k, max_tuples=MAX_LP_VARIABLES)
    return _membership_plan(tuples, w, q_)[0]


#: Largest number of drafted sets the plan over sets is built on.
MAX_PLAN_SETS = 200_000
#: Largest (drafted sets) x 2^k x k the set weights' subset recursion runs (about a second of numpy).
MAX_PLAN_WORK = 2e8
#: Sets per block of the subset recursion (bounds its memory to (block, 2^k) floats).
_SET_BLOCK = 4096


def plan_size_check(n_support: int, k: int, *, max_sets: int = MAX_PLAN_SETS) -> int:
    """Refuse (ValueError naming ``k``) a plan over drafted sets above the limits; return the number of sets."""
    n_sets = math.comb(n_support, k)
    if n_sets > max_sets:
        raise ValueError(
            f"the without-replacement plan enumerates C({n_support}, {k}) = {n_sets} draft sets, "
            f"above the limit {max_sets} (`k`={k} distinct drafts from {n_support} tokens with p > 0)"
        )
    work = n_sets * (2**k) * k
    if work > MAX_PLAN_WORK:
        raise ValueError(
            f"the without-replacement plan's set weights take C({n_support}, {k}) * 2^{k} * {k} = {work:.2e} steps, "
            f"above the limit {MAX_PLAN_WORK:.0e} (`k`={k} distinct drafts; lower `k`)"
        )
    return n_sets


def set_weights_without_replacement(p: np.ndarray, sets: np.ndarray) -> np.ndarray:
    r""":math:`P(S = A)` for each row ``A`` of ``sets`` (``(m, k)`` token ids), by a recursion over subsets.

    .. math::

        P(\text{first } |B| \text{ draws} = B) = \sum_{x \in B}
            P(\text{first } |B| - 1 \text{ draws} = B - x)\,
            \frac{p(x)}{c_A + p(A \setminus (B - x))},

    over the subsets ``B`` of ``A`` (``c_A`` the mass outside ``A``, so every
    denominator is a sum of non-negative masses: no cancellation). Costs
    :math:`2^k k` per set instead of the :math:`k!\,k` of summing over orderings.
    """
    m, k = sets.shape
    out = np.empty(m)
    full = (1 << k) - 1
    bits = [np.flatnonzero([(b >> i) & 1 for i in range(k)]) for b in range(full + 1)]
    for s0 in range(0, m, _SET_BLOCK):
        A = sets[s0 : s0 + _SET_BLOCK]
        pa = p[A]  # (b, k)
        mask = np.ones((A.shape[0], p.shape[0]), dtype=bool)
        mask[np.arange(A.shape[0])[:, None], A] = False
        c = np.where(mask, p[None, :], 0.0).sum(axis=1)
        # rest[b] = c_A + p(A \ B), from the masses of the members not in B
        P = np.zeros((A.shape[0], full + 1))
        P[:, 0] = 1.0
        for b in range(1, full + 1):
            left = c + pa[:, np.setdiff1d(np.arange(k), bits[b], assume_unique=True)].sum(axis=1)
            acc = np.zeros(A.shape[0])
            for i in bits[b]:
                prev = b & ~(1 << int(i))
                acc += P[:, prev] * pa[:, i] / (left + pa[:, i])
            P[:, b] = acc
        out[s0 : s0 + _SET_BLOCK] = P[:, full]
    return out


def wor_plan(p: np.ndarray, q: np.ndarray, k: int, *, max_sets: int = MAX_PLAN_SETS):
    r"""Optimal plan over the drafted *sets* (the LP of :func:`wor_lp` reduced by symmetry).

    Returns ``(sets, set_weights, rows, alpha)``; ``rows[i]`` is the joint mass
    of set ``sets[i]`` with each output token. The set weights come from
    :func:`set_weights_without_replacement`; the sizes are checked first
    (:func:`plan_size_check`), before anything is enumerated.
    """
    support = np.flatnonzero(p > 0)
    plan_size_check(support.shape[0], k, max_sets=max_sets)
    sets = list(itertools.combinations(support.tolist(), k))
    w = set_weights_without_replacement(p, np.array(sets, dtype=np.int64).reshape(len(sets), k))
    alpha, rows, _ = _membership_plan(sets, w, q)
    return sets, w, rows, alpha
