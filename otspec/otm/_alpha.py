r"""Exact optimal acceptance :math:`\alpha_k(p, q)` of OTM-k, in closed form after one sort.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import validate_ks, validate_pair

__all__ = ["alpha_k", "min_cut", "MinCut", "ratio_order", "int_power"]

_METHODS = ("exact", "lp", "lp-tuples")


def ratio_order(p: np.ndarray, q: np.ndarray, *, descending: bool = False, stable: bool = True) -> np.ndarray:
    r"""Token order by the likelihood ratio :math:`q(x)/p(x)`, ascending by default.

    Tokens with :math:`p(x) = 0` have ratio :math:`+\infty` and come last
    (first with ``descending=True``); ties keep index order (stable sort).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf)
    kind = "stable" if stable else None
    if descending:
        return np.argsort(-ratio, kind=kind)
    return np.argsort(ratio, kind=kind)


def int_power(x: np.ndarray, k: int) -> np.ndarray:
    """``x**k`` for a positive integer ``k`` by repeated squaring (exact to a few ulp, fast)."""
    result = None
    base = x
    while k:
        if k & 1:
            result = base.copy() if result is None else result * base
        k >>= 1
        if k:
            base = base * base
    return result


def _prefix_sums(p: np.ndarray, q: np.ndarray, order: np.ndarray):
    """Prefix sums P, Q (length n + 1) in ``order`` and the suffix masses S = 1 - P of ``p``.

    The suffix masses are summed from the end, so they keep full relative
    accuracy when small: :math:`P^k = (1 - S)^k` is then evaluated as
    ``exp(k * log1p(-S))``, which stays exact when ``P`` is within rounding
    of 1 and ``k`` is large (a plain ``P**k`` would amplify ``1 - P``'s
    rounding error ``k``-fold).
    """
    n = p.shape[0]
    po = p[order]
    P = np.empty(n + 1)
    Q = np.empty(n + 1)
    S = np.empty(n + 1)
    P[0] = Q[0] = 0.0
    np.cumsum(po, out=P[1:])
    np.cumsum(q[order], out=Q[1:])
    S[n] = 0.0
    S[:n] = np.cumsum(po[::-1])[::-1]
    # the full prefix is the whole simplex; pin it to remove accumulated rounding
    P[n] = Q[n] = 1.0
    S[0] = 1.0
    np.minimum(P, 1.0, out=P)
    np.minimum(Q, 1.0, out=Q)
    np.minimum(S, 1.0, out=S)
    return P, Q, S


def _cut_values(P: np.ndarray, Q: np.ndarray, S: np.ndarray, split: int, log_s: np.ndarray, k: int) -> np.ndarray:
    """``1 + Q_j - P_j**k`` for every prefix j, accurate where P is near 1."""
    vals = np.empty(P.shape[0])
    low = int_power(P[:split], k) if split else np.empty(0)
    np.subtract(Q[:split], low, out=low)
    vals[:split] = low
    vals[:split] += 1.0
    # 1 - P**k = -expm1(k * log1p(-S)) for the prefixes holding more than half the mass
    hi = np.multiply(log_s, k)
    np.expm1(hi, out=hi)
    np.subtract(Q[split:], hi, out=vals[split:])
    return vals


@dataclass(frozen=True, eq=False)
class MinCut:
    r"""The minimising prefix of the closed form of :math:`\alpha_k`.

    Attributes
    ----------
    alpha : float
        :math:`\alpha_k(p, q) = 1 + q(\Omega_0) - p(\Omega_0)^k`.
    omega0 : (m,) ndarray of int
        Token ids of the minimising set :math:`\Omega_0` (a prefix of the
        tokens sorted by :math:`q/p` ascending).
    order : (n,) ndarray of int
        The sort order used.
    size : int
        ``m = |Omega_0|``.
    p_mass, q_mass : float
        :math:`p(\Omega_0)` and :math:`q(\Omega_0)`.
    k : int
        Number of drafts.
    """

    alpha: float
    omega0: np.ndarray
    order: np.ndarray
    size: int
    p_mass: float
    q_mass: float
    k: int


def _exact(p: np.ndarray, q: np.ndarray, ks: np.ndarray):
    # any order of tied ratios gives the same minimum (the objective is concave
    # in the mass of a tie group), so the faster unstable sort is enough here
    order = ratio_order(p, q, stable=False)
    P, Q, S = _prefix_sums(p, q, order)
    split = int(np.searchsorted(P, 0.5, side="right"))
    log_s = np.log1p(-S[split:])
    out = np.empty(ks.shape[0])
    argmins = np.empty(ks.shape[0], dtype=np.int64)
    for i, k in enumerate(ks.tolist()):
        vals = _cut_values(P, Q, S, split, log_s, k)
        j = int(np.argmin(vals))
        argmins[i] = j
        out[i] = min(1.0, max(0.0, vals[j]))
    return out, argmins, order, P, Q


def min_cut(p, q, k: int, *, normalize: bool = False) -> MinCut:
    r"""The minimum cut of the OTM-k flow network, found by one sort.

    .. math::

        \alpha_k(p, q) = \min_{\Omega_0 \subseteq \Omega}
            \big[\, 1 + q(\Omega_0) - p(\Omega_0)^k \,\big],

    and a minimiser is a prefix of the tokens sorted by :math:`q(x)/p(x)`
    ascending (tokens with :math:`p(x) = 0` last).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of i.i.d. drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    MinCut
        The value and the minimising set.

    Raises
    ------
    ValueError, TypeError
        On invalid distributions or ``k``.

    Examples
    --------
    >>> import otspec
    >>> cut = otspec.min_cut([0.5, 0.5], [0.9, 0.1], 2)
    >>> cut.omega0.tolist(), round(cut.alpha, 12)
    ([1], 0.85)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    ks, scalar = validate_ks(k)
    if not scalar:
        raise TypeError("`k` must be a single integer for `min_cut`")
    vals, argmins, order, P, Q = _exact(p_, q_, ks)
    j = int(argmins[0])
    omega0 = np.sort(order[:j])
    return MinCut(
        alpha=float(vals[0]),
        omega0=omega0,
        order=order,
        size=j,
        p_mass=float(P[j]),
        q_mass=float(Q[j]),
        k=int(ks[0]),
    )


def alpha_k(p, q, k, *, method: str = "exact", normalize: bool = False, validate: bool = True,
            replacement: bool = True):
    r"""Optimal acceptance probability of ``k`` i.i.d. drafts (OTM-k).

    .. math::

        \alpha_k(p, q) = \max_{\pi \in \Pi(p^{\otimes k}, q)}
            P_{(X, Y) \sim \pi}\big(Y \in S(X)\big)
          = \min_{\Omega_0 \subseteq \Omega}
            \big[\, 1 + q(\Omega_0) - p(\Omega_0)^k \,\big],

    where :math:`S(x)` is the set of distinct tokens of the draft tuple
    :math:`x \in \Omega^k`. The minimum is attained at a prefix of the
    tokens sorted by :math:`q/p` ascending, so ``method="exact"`` costs one
    sort for every ``k`` at once.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (small model).
    q : (n,) array_like of float
        Target distribution (large model).
    k : int or sequence of int
        Number of drafts; a sequence returns an array, one value per entry.
    method : {"exact", "lp", "lp-tuples"}, keyword-only
        ``"exact"``: the sort-based closed form, :math:`O(n \log n)`.
        ``"lp"``: the membership-cost LP reduced by symmetry to
        distinct-token sets, solved with HiGHS (see :func:`otm_lp`).
        ``"lp-tuples"``: SpecTr's LP (eq. 4) as written, :math:`n^{k+1}`
        variables, built with cvxpy (tiny inputs only).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.
    replacement : bool, keyword-only
        ``False``: the ``k`` drafts are distinct, drawn without replacement
        (:func:`otspec.otm.alpha_k_without_replacement`; ``method`` ``"lp"``
        and ``"lp-tuples"`` both give its LP over ordered distinct tuples).
    validate : bool, keyword-only
        ``False`` skips the checks of ``p`` and ``q`` (the escape for hot
        loops over inputs already known to be float64 distributions of equal
        length; invalid input then gives an undefined result). ``k`` and
        ``method`` are always checked, and the LP methods always validate.

    Returns
    -------
    float or (len(k),) ndarray of float64
        :math:`\alpha_k(p, q)`. The exact method's absolute error is at most
        about :math:`4 n \varepsilon` (prefix sums in float64); the LP
        methods are accurate to the solver's feasibility tolerance (1e-9).

    Raises
    ------
    ValueError
        If ``p``/``q`` are not distributions of the same length, ``k < 1``,
        ``method`` is unknown, or an LP would be too large.
    TypeError
        If ``k`` is not an integer (or sequence of integers).
    otspec.SolverError
        If an LP method fails or its solution fails the feasibility re-check.

    See Also
    --------
    min_cut : the minimising set.
    otm_lp : the LP with its optimal plan as a verifier.

    Notes
    -----
    Proof sketch (docs, "Theory"): the acceptance-only LP is a bipartite
    max-flow from distinct-token sets ``A`` (capacity :math:`P(S(X) = A)`)
    to tokens (capacity :math:`q(y)`); a cut with tokens :math:`\Omega_0`
    on the source side costs :math:`1 - p(\Omega_0)^k + q(\Omega_0)`.
    This also shows that SpecTr's Lemma 3 upper bound is tight.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", NeurIPS 2023, eq. (4), Lemma 3 eq. (9).

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.75, 0.25], [0.25, 0.75]
    >>> round(float(otspec.alpha_k(p, q, 1)), 12)
    0.5
    >>> otspec.alpha_k(p, q, [1, 2, 3]).round(6).tolist()
    [0.5, 0.6875, 0.828125]
    """
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"`method` must be one of {_METHODS}, got {method!r}")
    if replacement is False:
        from ._without_replacement import alpha_k_without_replacement

        return alpha_k_without_replacement(p, q, k, method="exact" if method == "exact" else "lp", normalize=normalize)
    if replacement is not True:
        raise TypeError(f"`replacement` must be a bool, got {type(replacement).__name__}")
    if validate or normalize or method != "exact":
        p_, q_ = validate_pair(p, q, normalize=normalize)
    else:
        p_ = np.asarray(p, dtype=np.float64)
        q_ = np.asarray(q, dtype=np.float64)
    ks, scalar = validate_ks(k)
    if method == "exact":
        vals = _exact(p_, q_, ks)[0]
    else:
        from ._lp import otm_lp, otm_lp_tuples

        solve = otm_lp if method == "lp" else otm_lp_tuples
        vals = np.empty(ks.shape[0])
        for i, kk in enumerate(ks.tolist()):
            vals[i] = solve(p_, q_, kk, raise_on_failure=True).alpha
    return float(vals[0]) if scalar else vals
