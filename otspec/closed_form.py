r"""Closed forms and bounds for :math:`\alpha_k` (SpecTr eq. 10, App. B.1, Lemma 3).

Notation: ``p`` is the draft distribution, ``q`` the target. The closed forms
keep the arithmetic of their inputs: floats give floats, and
:class:`fractions.Fraction` (or sympy ``Rational``) inputs give exact
rationals.
"""

from __future__ import annotations

import itertools
import math
import numbers
from fractions import Fraction

import numpy as np

from ._validation import validate_bool, validate_k, validate_pair, validate_positive_int

__all__ = [
    "bernoulli_alpha_k",
    "uniform_alpha_k",
    "alpha_k_upper_bound",
    "alpha_k_lower_bound",
    "lemma3_constant",
]

#: Largest enumeration ``2**n * n**k`` accepted by :func:`alpha_k_upper_bound`.
MAX_UPPER_BOUND_WORK = 20_000_000

#: Most bits of an exact power ``x**k`` of a rational (a :class:`fractions.Fraction` result of
#: :func:`bernoulli_alpha_k` / :func:`uniform_alpha_k`): ``k`` times the bits of ``x``'s numerator or denominator.
#: 10**6 bits take milliseconds; ``Fraction(1, 3)**10**12`` would take hours and terabytes. Float inputs (or
#: ``exact=False``) have no such limit.
MAX_EXACT_BITS = 1_000_000

#: Below this ``k``, :func:`lemma3_constant` is ``1 - (1 - 1/k)**k`` as before (within ``k`` ulps); from it on the
#: power's rounding would show (about 1e-5 off at ``k = 10**12``, ``0.0`` at ``2**63``) and the constant is
#: ``-expm1(k * log1p(-1/k))`` (a few ulps at every ``k``). :func:`bernoulli_alpha_k` on floats switches at the same
#: ``k`` (``1 - p`` rounds to 1 for ``p < 2**-53``: the power form gave 0 for ``1 - (1 - p)**k``).
_POWER_FORM_MAX_K = 1024


def _one_minus_power(log_b: float, k: int) -> float:
    """``1 - b**k`` from ``log_b = log(b)`` (``b`` in ``(0, 1]``) as ``-expm1(k log b)``, a few ulps at every ``k``;
    ``k`` clamped to ``2**1000`` (the float range: ``b**k`` is 0 in float there unless ``b`` is within about
    ``2**-900`` of 1)."""
    return -math.expm1(float(min(k, 2**1000)) * log_b)


def _exact_power_bits(x, k: int) -> int:
    """Bits of the exact power ``x**k`` of a rational ``x`` (0 for floats: their powers round)."""
    if isinstance(x, (float, np.floating)) or not hasattr(x, "denominator"):
        return 0
    num, den = abs(int(x.numerator)), int(x.denominator)
    return k * (max(num.bit_length(), den.bit_length()) - 1)


def _check_exact_power(x, k: int, what: str) -> None:
    bits = _exact_power_bits(x, k)
    if bits > MAX_EXACT_BITS:
        raise ValueError(f"`k` = {k:,}: the exact {what}**k would have about {bits:,} bits, above the limit "
                         f"MAX_EXACT_BITS = {MAX_EXACT_BITS:,}; pass float inputs (or exact=False) for a rounded value")


def _real_in_unit(x, name):
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        # sympy numbers are registered with the numbers ABCs; anything else is refused
        raise TypeError(f"`{name}` must be a real number (float, Fraction, sympy Rational), got {type(x).__name__}")
    if not (0 <= x <= 1):
        raise ValueError(f"`{name}` must lie in [0, 1], got {x!r}")
    return x


def bernoulli_alpha_k(p, q, k: int):
    r"""Exact :math:`\alpha_k` for Bernoulli draft and target (SpecTr eq. 10).

    .. math::

        \alpha_k(\mathrm{Ber}(p), \mathrm{Ber}(q))
          = \min\{q, 1 - (1-p)^k\} + \min\{1 - q, 1 - p^k\}.

    Parameters
    ----------
    p : float or Fraction
        Draft probability of the token 1.
    q : float or Fraction
        Target probability of the token 1.
    k : int
        Number of drafts.

    Returns
    -------
    float or Fraction
        Exact in the inputs' arithmetic (a Fraction for Fraction inputs). Floats with ``k >= 1024`` take
        :math:`1 - (1 - p)^k = -\operatorname{expm1}(k \operatorname{log1p}(-p))` and :math:`1 - p^k =
        -\operatorname{expm1}(k \log p)` (a few ulps at every ``k``; the powers of the rounded ``1 - p`` lost
        ``p`` below ``2**-53``); below ``1024`` the powers, within ``k`` ulps.

    Raises
    ------
    ValueError
        If ``p`` or ``q`` is outside [0, 1] or ``k < 1``; rational inputs whose exact power ``p**k`` or
        ``(1 - p)**k`` would have more than :data:`MAX_EXACT_BITS` bits (pass floats).
    TypeError
        If they are not real numbers, or ``k`` is not an integer.

    References
    ----------
    .. [1] Sun et al., "SpecTr", NeurIPS 2023, eq. (10).

    Examples
    --------
    >>> from fractions import Fraction
    >>> import otspec
    >>> otspec.closed_form.bernoulli_alpha_k(Fraction(1, 4), Fraction(3, 4), 2)
    Fraction(11, 16)
    """
    p = _real_in_unit(p, "p")
    q = _real_in_unit(q, "q")
    k = validate_k(k)
    _check_exact_power(p, k, "p")
    _check_exact_power(1 - p, k, "(1 - p)")
    if k >= _POWER_FORM_MAX_K and isinstance(p, (float, np.floating)):
        pf = float(p)
        drawn = 1.0 if pf == 1.0 else _one_minus_power(math.log1p(-pf), k)  # 1 - (1 - p)^k
        not_all = 1.0 if pf == 0.0 else _one_minus_power(math.log(pf), k)  # 1 - p^k
        return min(q, drawn) + min(1 - q, not_all)
    return min(q, 1 - (1 - p) ** k) + min(1 - q, 1 - p**k)


def uniform_alpha_k(d_p: int, d_q: int, k: int, *, exact: bool = False):
    r"""Exact :math:`\alpha_k` for nested uniform distributions (SpecTr App. B.1).

    With the draft :math:`p = U(d_p)` and the target :math:`q = U(d_q)` on
    nested supports (the smaller inside the larger) and :math:`r = d_p / d_q`,

    .. math::

        \alpha_k = 1 - (1 - 1/r)^k \quad (d_q \le d_p), \qquad
        \alpha_k = d_p / d_q \quad (d_q \ge d_p).

    Parameters
    ----------
    d_p : int
        Support size of the draft.
    d_q : int
        Support size of the target.
    k : int
        Number of drafts.
    exact : bool, keyword-only
        Return a :class:`fractions.Fraction` instead of a float.

    Returns
    -------
    float or Fraction

    Raises
    ------
    ValueError, TypeError
        If a size or ``k`` is not a positive integer, or ``exact`` not a bool; ``exact=True`` where the
        Fraction would have more than :data:`MAX_EXACT_BITS` bits (the float is then computed as
        ``-expm1(k log(1 - d_q/d_p))``, within a few ulps).

    References
    ----------
    .. [1] Sun et al., "SpecTr", arXiv v2, Appendix B.1 and Figure 5.

    Examples
    --------
    >>> import otspec
    >>> otspec.closed_form.uniform_alpha_k(4, 2, 2, exact=True)
    Fraction(3, 4)
    """
    d_p = validate_positive_int(d_p, "d_p")
    d_q = validate_positive_int(d_q, "d_q")
    k = validate_k(k)
    exact = validate_bool(exact, "exact")
    if d_q >= d_p:
        val = Fraction(d_p, d_q)
        return val if exact else float(val)
    inv_r = Fraction(d_q, d_p)
    if _exact_power_bits(1 - inv_r, k) > MAX_EXACT_BITS:
        if exact:
            _check_exact_power(1 - inv_r, k, "(1 - d_q/d_p)")
        # the rounded value without the bignum: 1 - t**k = -expm1(k log t), t = 1 - d_q/d_p, log t read from the
        # correctly rounded d_q/d_p (log1p) or t (log), whichever is the smaller
        log_t = math.log1p(-float(inv_r)) if inv_r < Fraction(1, 2) else math.log(float(1 - inv_r))
        return _one_minus_power(log_t, k)
    val = 1 - (1 - inv_r) ** k
    return val if exact else float(val)


def lemma3_constant(k: int) -> float:
    r"""The constant :math:`1 - (1 - 1/k)^k \ge 1 - 1/e` of SpecTr Lemma 3.

    Parameters
    ----------
    k : int
        Number of drafts (``>= 1``).

    Returns
    -------
    float
        :math:`1 - (1 - 1/k)^k`, decreasing in ``k`` towards :math:`1 - 1/e`; from ``k = 1024`` on computed as
        ``-expm1(k log1p(-1/k))`` (a few ulps at every ``k``; the power rounds by ``k`` ulps).

    Raises
    ------
    ValueError
        ``k < 1``.
    TypeError
        ``k`` not an integer.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Lemma 3.

    Examples
    --------
    >>> from otspec.closed_form import lemma3_constant
    >>> lemma3_constant(1), lemma3_constant(2)
    (1.0, 0.75)
    """
    k = validate_k(k)
    if k < _POWER_FORM_MAX_K:
        return 1.0 - (1.0 - 1.0 / k) ** k
    # 1/k of the clamped k (float(k) overflows past 2**1024); from k = 2**60 on, k log1p(-1/k) is -1.0 in float
    return _one_minus_power(math.log1p(-1.0 / float(min(k, 2**1000))), k)


def alpha_k_upper_bound(p, q, k: int, *, normalize: bool = False) -> float:
    r"""SpecTr's Lemma 3 upper bound :math:`\bar\alpha_k`, computed from its definition.

    .. math::

        \bar\alpha_k(p, q) = \min_{\Omega_0 \subseteq \Omega} \Big\{
          \sum_{y \in \Omega_0} \min\{q(y), 1 - (1 - p(y))^k\}
          + \sum_{x \in \Omega^k} \min\Big\{\prod_{i=1}^k p(x_i),
             \sum_{y \in S(x) \cap \Omega_0^c} q(y)\Big\} \Big\}

    by enumeration of all :math:`2^n` sets and :math:`n^k` tuples (small
    inputs only). The package proves :math:`\bar\alpha_k = \alpha_k`; this
    function exists to check that independently.

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    k : int
        Number of drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``2**n * n**k`` or ``k`` exceeds 20,000,000 (the size is in the
        message; checked before any of it is built, so a huge ``k`` is
        refused at once), or the inputs are invalid.

    References
    ----------
    .. [1] Sun et al., "SpecTr", arXiv v2, Lemma 3, eq. (9).

    Examples
    --------
    >>> import otspec
    >>> round(otspec.alpha_k_upper_bound([0.75, 0.25], [0.25, 0.75], 2), 12)
    0.6875
    """
    return _upper_bound(p, q, k, normalize, "alpha_k_upper_bound")


def _upper_bound(p, q, k, normalize: bool, caller: str) -> float:
    """:func:`alpha_k_upper_bound`'s value; ``caller`` (the public function called) named in the size guard."""
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    n = p_.shape[0]
    # sized before any big integer or tuple is built: n**k for a huge k (or k columns of the one tuple at n = 1)
    # would hang or exhaust memory
    small = k <= MAX_UPPER_BOUND_WORK and (n == 1 or k * math.log2(n) + n <= math.log2(MAX_UPPER_BOUND_WORK) + 1)
    work = (2**n) * (n**k) if small else None
    if work is None or work > MAX_UPPER_BOUND_WORK:
        shown = f" = {work}" if work is not None else ""
        raise ValueError(
            f"{caller} enumerates 2**n * n**k = 2**{n} * {n}**{k}{shown} terms, "
            f"above the limit {MAX_UPPER_BOUND_WORK}; use alpha_k (equal, proved tight)"
        )
    tuples = np.array(list(itertools.product(range(n), repeat=k)), dtype=np.int64).reshape(-1, k)
    ptup = np.prod(p_[tuples], axis=1)
    member = np.zeros((tuples.shape[0], n))
    np.put_along_axis(member, tuples, 1.0, axis=1)
    with np.errstate(divide="ignore"):  # log1p(-1) = -inf at p = 1: 1 - 0**k = 1
        # 1 - (1 - p)^k as -expm1(k log1p(-p)) (_one_minus_power): the power rounded 1 - 1e-300 to 1 and gave 0
        # for k e-300, which put the bound below alpha_k
        first = np.minimum(q_, -np.expm1(float(min(k, 2**1000)) * np.log1p(-p_)))
    best = np.inf
    masks = np.array(list(itertools.product((0.0, 1.0), repeat=n)))  # rows: indicator of Omega_0
    chunk = max(1, 4_000_000 // max(1, tuples.shape[0]))
    for start in range(0, masks.shape[0], chunk):
        m = masks[start : start + chunk]
        outside = member @ (q_[:, None] * (1.0 - m.T))  # (T, chunk)
        vals = m @ first + np.minimum(ptup[:, None], outside).sum(axis=0)
        best = min(best, float(vals.min()))
    return best


def alpha_k_lower_bound(p, q, k: int, *, normalize: bool = False) -> float:
    r"""SpecTr's Lemma 3 lower bound :math:`(1 - (1 - 1/k)^k)\, \bar\alpha_k(p, q)`.

    Parameters, returns and raises as :func:`alpha_k_upper_bound`.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of i.i.d. drafts (``>= 1``).
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of refusing.

    Returns
    -------
    float
        :math:`(1 - (1 - 1/k)^k)\, \bar\alpha_k(p, q) \le \alpha_k(p, q)`.

    Raises
    ------
    ValueError
        ``p`` or ``q`` not a distribution (negative, not summing to 1), different lengths, ``k < 1``.
    TypeError
        Non-numeric input.

    References
    ----------
    .. [1] Sun et al., "SpecTr", arXiv v2, Lemma 3.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.alpha_k_lower_bound([0.75, 0.25], [0.25, 0.75], 2), 12)
    0.515625
    """
    return lemma3_constant(k) * _upper_bound(p, q, k, normalize, "alpha_k_lower_bound")
