r"""Optimal acceptance of ``k`` drafts drawn *without replacement*, after one sort.

The drafts are ``k`` distinct tokens drawn sequentially from ``p``
renormalised over the tokens not yet drawn (Gumbel-top-k, stochastic beam):

.. math::

    P(X = (x_1, \dots, x_k)) = \prod_{i=1}^k \frac{p(x_i)}{1 - \sum_{j<i} p(x_j)}
    \qquad (x \text{ distinct}).

The max-flow argument of OTM-k never uses independence, so for this draft
process (MATH.md §9; Hu et al., "Towards Optimal Multi-draft Speculative
Decoding", ICLR 2025, arXiv:2502.18779)

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
first ``j`` tokens,

.. math::

    1 - f(A_j) = \int_0^\infty P(N_{A_j}(t) < k)\; c_j e^{-c_j t}\, dt,

a Poisson-binomial lower tail (success probabilities
:math:`1 - e^{-p(x) t}`) under one integral. Tokens are added one at a
time to a truncated Poisson-binomial recursion (``k`` states per node,
every update a convex combination, so no cancellation), and the integral
is the trapezoid rule in :math:`v = \log t` on a fixed grid: the integrand
is analytic in a strip of width :math:`\pi/2` around the real ``v`` axis
and decays double-exponentially as :math:`v \to \infty`, exponentially as
:math:`v \to -\infty`, so the rule converges geometrically in the step
(step 0.25: agreement with exact enumeration to about ``1e-14``). Cost
:math:`O(n \log n + n k M)` with ``M`` the grid size,
:math:`M \approx 4 \log(45 / (10^{-18} c_{\min}))`, a few hundred nodes
whatever ``n`` (``c_min`` the smallest positive suffix mass).

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._validation import (
    validate_distribution,
    validate_drafts,
    validate_k,
    validate_ks,
    validate_pair,
    validate_positive_int,
)
from ._alpha import MinCut, ratio_order
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

#: Step of the trapezoid rule in log-time.
STEP = 0.25
#: The grid starts where c t < _T_LOW for every c <= 1 (the integrand is below it per unit log-time).
_T_LOW = 1e-18
#: ... and ends where exp(-c_min t) < exp(-_DECAY).
_DECAY = 45.0
#: Prefixes processed per vectorised chunk of the race pass, and the chunk buffer's size bound (floats).
_CHUNK = 128
_CHUNK_FLOATS = 1 << 22
#: Largest n * k * M (tokens x drafts x grid nodes) the race pass runs.
MAX_RACE_WORK = 4e9
#: Largest number of ordered tuples (times n) the LP references build.
MAX_LP_VARIABLES = 2_000_000


def _support_size_check(p: np.ndarray, k: int) -> None:
    m = int(np.count_nonzero(p > 0))
    if m < k:
        raise ValueError(
            f"`k`={k} distinct drafts need at least k tokens with p > 0, but `p` has {m}"
        )


def uncovered_prefixes(p_sorted: np.ndarray, k, *, step: float = STEP) -> np.ndarray:
    r"""``1 - f(first j tokens)`` for ``j = 0..n``, ``f(A)`` = P(all ``k`` drafts without replacement lie in ``A``).

    ``p_sorted`` is ``p`` in the order of the prefixes; ``k`` an int (returns
    ``(n + 1,)``) or a sequence of ints (returns ``(len(k), n + 1)``, one pass
    for all of them). See the module docstring for the exponential-race
    integral and its accuracy.

    Parameters
    ----------
    p_sorted : (n,) array_like of float
        Draft masses in the order of the prefixes.
    k : int or sequence of int
        Number(s) of draws without replacement.
    step : float, keyword-only
        Quadrature step of the exponential-race integral, in (0, 1].

    Returns
    -------
    (n + 1,) or (len(k), n + 1) ndarray of float64
        ``1 - f(first j tokens)``, ``j = 0..n``.

    Raises
    ------
    ValueError
        ``p_sorted`` not finite non-negative masses, ``step`` outside (0, 1], a ``k`` below 1.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.otm._without_replacement import uncovered_prefixes
    >>> u = uncovered_prefixes(np.array([0.5, 0.25, 0.25]), 2)
    >>> [round(float(x), 6) for x in u]
    [1.0, 1.0, 0.583333, 0.0]
    """
    ks = validate_ks(k)[0]
    p_sorted = np.asarray(p_sorted, dtype=np.float64)
    if p_sorted.ndim != 1 or not np.all(np.isfinite(p_sorted)) or np.any(p_sorted < 0):
        raise ValueError("`p_sorted` must be a 1-D array of finite non-negative masses")
    if not (isinstance(step, (int, float)) and 0 < step <= 1):
        raise ValueError(f"`step` must lie in (0, 1], got {step!r}")
    n = p_sorted.shape[0]
    suffix = np.zeros(n + 1)
    if n:
        suffix[:n] = np.cumsum(p_sorted[::-1])[::-1]
    positive = suffix[suffix > 0]
    out = np.zeros((ks.shape[0], n + 1))
    if positive.size:
        v_lo, v_hi = math.log(_T_LOW), math.log(_DECAY / float(positive.min()))
        t = np.exp(np.arange(v_lo, v_hi + step, step))
        K, M = int(ks.max()), t.shape[0]
        if n * K * M > MAX_RACE_WORK:
            raise ValueError(
                f"the race pass would take n * k * M = {n} * {K} * {M} steps, above the limit {MAX_RACE_WORK:.0e} "
                "(k is the number of distinct drafts; M the log-time grid)"
            )
        chunk = max(1, min(_CHUNK, _CHUNK_FLOATS // (K * M)))
        tail = np.zeros((K, M))  # tail[i] = P(N(t) = i), i < max(k)
        tail[0] = 1.0
        tmp = np.empty((K - 1, M))
        buf = np.empty((chunk, K, M))
        rows = ks - 1
        for start in range(0, n + 1, chunk):
            stop = min(start + chunk, n + 1)
            x = np.outer(p_sorted[start:min(stop, n)], -t)
            keep, move = np.exp(x), -np.expm1(x)  # P(token not arrived by t), P(arrived)
            for i in range(stop - start):
                buf[i] = tail  # the prefix of the first start + i tokens
                if start + i < n:
                    np.multiply(tail[:-1], move[i], out=tmp)
                    tail *= keep[i]
                    tail[1:] += tmp
            ct = suffix[start:stop, None] * t[None, :]
            weights = ct * np.exp(-ct)
            # integral of P(N = i) per prefix and count, then summed over i < k
            per_count = np.einsum("jim,jm->ji", buf[: stop - start], weights)
            out[:, start:stop] = step * np.cumsum(per_count, axis=1)[:, rows].T
    np.clip(out, 0.0, 1.0, out=out)
    return out[0] if np.ndim(k) == 0 else out


def _exact_all(p: np.ndarray, q: np.ndarray, ks) -> np.ndarray:
    """alpha_k without replacement for every k in ``ks``, one sort and one pass."""
    order = ratio_order(p, q)
    unc = uncovered_prefixes(p[order], list(ks))
    Q = np.zeros(p.shape[0] + 1)
    np.cumsum(q[order], out=Q[1:])
    return np.clip((Q[None, :] + unc).min(axis=1), 0.0, 1.0)


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
    vals = Q + uncovered_prefixes(p_[order], k)
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
    sort and one pass of a truncated Poisson-binomial recursion over a fixed
    log-time grid: :math:`O(n \log n + n k M)`, ``M`` a few hundred.

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
        :math:`\alpha^{\mathrm{wor}}_k`; absolute error about ``1e-13`` (exact
        method) or the LP's re-check tolerance ``1e-9``.

    Raises
    ------
    ValueError
        Invalid distributions, ``k < 1``, fewer than ``k`` tokens with
        ``p > 0``, unknown ``method``, or an LP too large.
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
    if method not in ("exact", "lp"):
        raise ValueError(f"`method` must be 'exact' or 'lp', got {method!r}")
    p_, q_ = validate_pair(p, q, normalize=normalize)
    ks, scalar = validate_ks(k)
    for kk in ks.tolist():
        _support_size_check(p_, kk)
    if method == "exact":
        vals = _exact_all(p_, q_, ks.tolist())
    else:
        vals = np.array([wor_lp(p_, q_, kk) for kk in ks.tolist()])
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
        :math:`P(S \subseteq \Omega_0)`.

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
    p_ = validate_distribution(p, "p")
    k = validate_k(k)
    _support_size_check(p_, k)
    ids = np.asarray(omega0)
    if ids.ndim != 1 or (ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= p_.shape[0])):
        raise ValueError(f"`omega0` must be a 1-D sequence of token ids in [0, {p_.shape[0]})")
    inside = np.zeros(p_.shape[0], dtype=bool)
    inside[ids.astype(np.int64)] = True
    order = np.concatenate([np.flatnonzero(inside), np.flatnonzero(~inside)])
    return 1.0 - float(uncovered_prefixes(p_[order], k)[int(inside.sum())])


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
    p_ = validate_distribution(p, "p")
    return _wor_draft_prob(p_, validate_drafts(drafts, len(drafts) if hasattr(drafts, "__len__") else 1, p_.shape[0]))


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
    p_, q_ = validate_pair(p, q)
    k = validate_k(k)
    tuples, w = wor_tuple_law(p_, k, max_tuples=MAX_LP_VARIABLES)
    return _membership_plan(tuples, w, q_)[0]


def wor_plan(p: np.ndarray, q: np.ndarray, k: int, *, max_sets: int = 200_000):
    r"""Optimal plan over the drafted *sets* (the LP of :func:`wor_lp` reduced by symmetry).

    Returns ``(sets, set_weights, rows, alpha)``; ``rows[i]`` is the joint mass
    of set ``sets[i]`` with each output token.
    """
    support = np.flatnonzero(p > 0).tolist()
    n_sets = math.comb(len(support), k)
    if n_sets > max_sets:
        raise ValueError(
            f"the without-replacement plan enumerates C({len(support)}, {k}) = {n_sets} draft sets, "
            f"above the limit {max_sets}"
        )
    sets = list(itertools.combinations(support, k))
    w = np.array([math.fsum(_wor_draft_prob(p, perm) for perm in itertools.permutations(s)) for s in sets])
    alpha, rows, _ = _membership_plan(sets, w, q)
    return sets, w, rows, alpha
