r"""The economics of speculative decoding (Leviathan, Kalman, Matias, §3).

With per-token acceptance :math:`\alpha` (the expected acceptance
:math:`E[\beta]`, assumed i.i.d. across positions), :math:`\gamma` drafts per
target call, a draft call costing :math:`c` target calls in time and
:math:`\hat c` in arithmetic:

* expected tokens per target call (eq. 1): :math:`\frac{1 - \alpha^{\gamma+1}}{1 - \alpha}`;
* walltime improvement (Theorem 3.8): :math:`\frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}`;
* operations factor (Theorem 3.11): :math:`\frac{(1 - \alpha)(\gamma \hat c + \gamma + 1)}{1 - \alpha^{\gamma+1}}`;
* the integer :math:`\gamma` maximising the walltime improvement (Figure 3);
* if :math:`\alpha > c` the improvement at :math:`\gamma = 1` is :math:`\frac{1+\alpha}{1+c} > 1`
  (Corollary 3.9).

Notation: in otspec ``p`` is the draft and ``q`` the target; Leviathan et al.
swap the letters (their :math:`M_p` is the target, :math:`M_q` the draft).
The functions here only take :math:`\alpha`, except :func:`expected_acceptance`,
which takes the pair in our letters.

All functions broadcast over array arguments (floats in, floats out for
scalars) and treat :math:`\alpha = 1` exactly (the geometric sum
:math:`1 + \alpha + \dots + \alpha^\gamma = \gamma + 1`); near
:math:`\alpha = 1` the ratio is evaluated as
:math:`-\mathrm{expm1}((\gamma+1)\,\mathrm{log1p}(\alpha - 1)) / (1 - \alpha)`,
accurate to a few ulp.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np

from ._validation import as_array, as_float_array, validate_pair, validate_positive_int
from .lossy._lenience import validate_lenience

__all__ = [
    "expected_tokens",
    "walltime_improvement",
    "operations_factor",
    "optimal_gamma",
    "improvement_lower_bound",
    "expected_acceptance",
]


def _real_array(x, name: str) -> np.ndarray:
    if isinstance(x, (str, bytes)) or x is None or isinstance(x, bool):
        raise TypeError(f"`{name}` must be a real number or array of them, got {type(x).__name__}")
    arr = as_float_array(x, name, "a real number or array of them")
    if np.asarray(x.detach() if hasattr(x, "detach") else x).dtype == bool:
        raise TypeError(f"`{name}` must be real, got booleans")
    return arr


def _alpha(alpha) -> np.ndarray:
    a = _real_array(alpha, "alpha")
    if not np.all((a >= 0.0) & (a <= 1.0)):
        bad = a[~((a >= 0.0) & (a <= 1.0))].ravel()[0]
        raise ValueError(f"`alpha` must lie in [0, 1], got {float(bad)!r}")
    return a


def _gamma(gamma) -> np.ndarray:
    if isinstance(gamma, bool):
        raise TypeError("`gamma` must be an integer >= 1, got bool")
    g = as_array(gamma, "gamma", "an integer >= 1 or an array of them")
    if g.dtype.kind == "f":
        if not np.all(np.isfinite(g)) or not np.all(g == np.floor(g)):
            raise TypeError(f"`gamma` must be an integer >= 1, got {gamma!r}")
        if np.any(g >= 2.0**63):  # the int64 cast below would wrap it (a RuntimeWarning and a wrong value)
            raise ValueError(f"`gamma` must be an integer in [1, 2**63), got {float(g.max())!r}")
        g = g.astype(np.int64)
    elif g.dtype.kind == "O" and all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))
                                     for v in g.ravel()):  # Python ints beyond int64
        raise ValueError(f"`gamma` must be an integer in [1, 2**63), got {max(int(v) for v in g.ravel())}")
    elif g.dtype.kind not in "iu":
        raise TypeError(f"`gamma` must be an integer >= 1, got {type(gamma).__name__}")
    if not np.all(g >= 1):
        raise ValueError(f"`gamma` must be an integer >= 1, got {int(g[g < 1].ravel()[0])}")
    if g.dtype.kind == "u" and np.any(g > np.iinfo(np.int64).max):  # 2**63 as uint64: int64 would wrap it negative
        raise ValueError(f"`gamma` must be an integer in [1, 2**63), got {int(g.max())}")
    return g.astype(np.int64)


def _cost(c, name: str) -> np.ndarray:
    a = _real_array(c, name)
    if not np.all((a >= 0.0) & np.isfinite(a)):
        bad = a[~((a >= 0.0) & np.isfinite(a))].ravel()[0]
        raise ValueError(f"`{name}` must be a finite cost ratio >= 0, got {float(bad)!r}")
    return a


def _out(x: np.ndarray):
    x = np.asarray(x, dtype=np.float64)
    return float(x) if x.ndim == 0 else x


def _geometric(a: np.ndarray, g: np.ndarray) -> np.ndarray:
    r""":math:`\sum_{i=0}^{\gamma} \alpha^i = (1 - \alpha^{\gamma+1})/(1 - \alpha)`, exact at :math:`\alpha = 1`."""
    a, g = np.broadcast_arrays(a, g)
    n = g.astype(np.float64) + 1.0  # gamma + 1 in float64: no int64 overflow at gamma = 2**63 - 1
    out = np.empty(a.shape, dtype=np.float64)
    one = a == 1.0
    out[one] = n[one]
    near = (~one) & (a >= 0.5)
    # 1 - alpha is exact for alpha in [0.5, 1] (Sterbenz), and so is log1p of -(1 - alpha)
    d = 1.0 - a[near]
    out[near] = -np.expm1(n[near] * np.log1p(-d)) / d
    far = (~one) & (a < 0.5)
    out[far] = (1.0 - a[far] ** n[far]) / (1.0 - a[far])
    return out


def expected_tokens(alpha, gamma):
    r"""Expected number of tokens per target-model call (Leviathan et al., eq. 1).

    .. math::

        E[\#\text{tokens}] = \frac{1 - \alpha^{\gamma+1}}{1 - \alpha}
        = \sum_{i=0}^{\gamma} \alpha^i, \qquad = \gamma + 1 \text{ at } \alpha = 1.

    Parameters
    ----------
    alpha : float or array_like of float
        Expected per-token acceptance, in ``[0, 1]``.
    gamma : int or array_like of int
        Drafts per iteration, ``>= 1``. Broadcast against ``alpha``.

    Returns
    -------
    float or ndarray of float64

    Raises
    ------
    ValueError
        If ``alpha`` is outside ``[0, 1]`` or ``gamma`` outside ``[1, 2**63)``.
    TypeError
        If ``gamma`` is not an integer.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, §3.1, eq. (1) and Figure 2.

    Examples
    --------
    >>> from otspec import speculative
    >>> speculative.expected_tokens(0.5, 2)
    1.75
    >>> speculative.expected_tokens(1.0, 7)
    8.0
    """
    return _out(_geometric(_alpha(alpha), _gamma(gamma)))


def walltime_improvement(alpha, gamma, c):
    r"""Expected walltime improvement factor of speculative decoding (Leviathan et al., Theorem 3.8).

    .. math::

        \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}.

    Parameters
    ----------
    alpha : float or array_like of float
        Expected per-token acceptance, in ``[0, 1]``.
    gamma : int or array_like of int
        Drafts per iteration, ``>= 1``.
    c : float or array_like of float
        Cost coefficient: time of a draft call over a target call, ``>= 0``.

    Returns
    -------
    float or ndarray of float64

    Raises
    ------
    ValueError
        If ``alpha`` is outside ``[0, 1]``, ``gamma < 1`` or ``c < 0``.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, Theorem 3.8, Tables 1 and 4.

    Examples
    --------
    >>> from otspec import speculative
    >>> round(speculative.walltime_improvement(0.6, 2, 0.0), 2)      # Table 1: 1.96X
    1.96
    >>> round(speculative.walltime_improvement(0.75, 7, 0.02), 1)    # Table 4: EXP 3.2
    3.2
    """
    a, g, cc = _alpha(alpha), _gamma(gamma), _cost(c, "c")
    return _out(_geometric(a, g) / (g * cc + 1.0))


def operations_factor(alpha, gamma, c_hat):
    r"""Expected factor of increase in arithmetic operations (Leviathan et al., Theorem 3.11).

    .. math::

        \frac{(1 - \alpha)(\gamma \hat c + \gamma + 1)}{1 - \alpha^{\gamma+1}}
        = \frac{\gamma \hat c + \gamma + 1}{\sum_{i=0}^{\gamma} \alpha^i}.

    Parameters
    ----------
    alpha : float or array_like of float
        Expected per-token acceptance, in ``[0, 1]``.
    gamma : int or array_like of int
        Drafts per iteration, ``>= 1``.
    c_hat : float or array_like of float
        Arithmetic per token of the draft model over the target's, ``>= 0``.

    Returns
    -------
    float or ndarray of float64

    Raises
    ------
    ValueError
        If ``alpha`` is outside ``[0, 1]``, ``gamma < 1`` or ``c_hat < 0``.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, Theorem 3.11 and Table 1.

    Examples
    --------
    >>> from otspec import speculative
    >>> round(speculative.operations_factor(0.6, 2, 0.0), 2)         # Table 1: 1.53X
    1.53
    >>> speculative.operations_factor(1.0, 3, 0.0)                   # every draft accepted
    1.0
    """
    a, g, ch = _alpha(alpha), _gamma(gamma), _cost(c_hat, "c_hat")
    return _out((g * ch + g + 1.0) / _geometric(a, g))


def optimal_gamma(alpha, c, *, max_gamma: int = 1000):
    r"""The number of drafts maximising the walltime improvement (Leviathan et al., §3.5, Figure 3).

    .. math::

        \gamma^*(\alpha, c) = \operatorname*{arg\,max}_{\gamma \in \{1, \dots, \gamma_{\max}\}}
        \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}.

    The objective is a concave function of :math:`\gamma` over an affine
    positive one, hence unimodal: the scan stops at the first decrease. Ties
    go to the smaller :math:`\gamma`. When the factor keeps increasing
    (``c = 0`` with ``alpha > 0``, or ``alpha = 1`` with ``c < 1``) the answer
    is ``max_gamma``. Whether speculative decoding helps at all is
    ``walltime_improvement(alpha, optimal_gamma(alpha, c), c) > 1``, which
    holds exactly when ``alpha > c`` (Corollary 3.9).

    Parameters
    ----------
    alpha : float or array_like of float
        Expected per-token acceptance, in ``[0, 1]``.
    c : float or array_like of float
        Cost coefficient, ``>= 0``.
    max_gamma : int, keyword-only
        Largest :math:`\gamma` considered.

    Returns
    -------
    int or ndarray of int64

    Raises
    ------
    ValueError
        If ``alpha`` is outside ``[0, 1]``, ``c < 0`` or ``max_gamma < 1``.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, §3.5 and Figure 3.

    Examples
    --------
    >>> from otspec import speculative
    >>> speculative.optimal_gamma(0.8, 0.05)
    8
    >>> speculative.optimal_gamma([0.5, 0.9, 0.99], 0.01).tolist()
    [5, 24, 113]
    >>> speculative.optimal_gamma(0.7, 0.0, max_gamma=64)  # free drafts: the cap
    64
    """
    a, cc = np.broadcast_arrays(_alpha(alpha), _cost(c, "c"))
    max_gamma = validate_positive_int(max_gamma, "max_gamma")
    out = np.empty(a.shape, dtype=np.int64)
    for idx in np.ndindex(a.shape):
        out[idx] = _argmax_gamma(float(a[idx]), float(cc[idx]), max_gamma)
    return int(out) if out.ndim == 0 else out


def _increases(a: float, c: float, g: int) -> bool:
    r"""Whether the walltime factor strictly increases from ``g`` to ``g + 1`` (``0 < a < 1``).

    With :math:`A = \alpha^{\gamma+1}`, :math:`f(\gamma+1) > f(\gamma)` iff
    :math:`A (1 - \alpha)(1 + \gamma c) > c (1 - A)`, compared in logarithms:
    no cancellation, no underflow of :math:`A`, and ``c = 0`` (free drafts: the
    factor grows for ever) gives :math:`\ln c = -\infty`, so "increases".
    Comparing the factor's rounded values instead sees ties once
    :math:`1 - \alpha^{\gamma+1}` rounds to 1 and stopped at an arbitrary
    :math:`\gamma` (162 for :math:`\alpha = 0.7`, ``c = 0``).
    """
    if c == 0.0:
        return True
    log_a = (g + 1) * math.log(a)
    lhs = log_a + math.log1p(-a) + math.log1p(g * c)
    rhs = math.log(c) + math.log(-math.expm1(log_a))
    if abs(lhs - rhs) > 1e-9 or g > _EXACT_TIE_GAMMA:
        return lhs > rhs
    # a near-tie (exact ties happen: a = 0.5, c = 0.2, g = 1): decide in exact rationals, so that
    # ties go to the smaller gamma as documented (the inputs are dyadic rationals)
    fa, fc = Fraction(a), Fraction(c)
    A = fa ** (g + 1)
    return A * (1 - fa) * (1 + g * fc) > fc * (1 - A)


#: Largest gamma at which a near-tie of the increment is decided in exact rationals
#: (``a**(g + 1)`` has at most ``53 (g + 1)`` bits); beyond it ties go by the logs.
_EXACT_TIE_GAMMA = 4096


def _argmax_gamma(a: float, c: float, max_gamma: int) -> int:
    """The smallest maximiser of the walltime factor over ``1..max_gamma`` (see :func:`optimal_gamma`)."""
    if a == 0.0:
        return 1  # f = 1 / (gamma c + 1): non-increasing
    if a == 1.0:
        return max_gamma if c < 1.0 else 1  # f = (gamma + 1) / (gamma c + 1)
    # f is quasi-concave in gamma (concave over affine): the increments change sign once,
    # so the answer is the first gamma whose increment is not positive (bisection)
    if not _increases(a, c, 1):
        return 1
    lo, hi = 1, max_gamma  # _increases(lo) is True; the answer lies in (lo, hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _increases(a, c, mid):
            lo = mid
        else:
            hi = mid
    return hi


def improvement_lower_bound(alpha, c):
    r"""Corollary 3.9's bound: the best walltime improvement is at least :math:`(1+\alpha)/(1+c)`.

    .. math::

        \max_{\gamma \ge 1} \frac{1 - \alpha^{\gamma+1}}{(1 - \alpha)(\gamma c + 1)}
        \;\ge\; \frac{1 + \alpha}{1 + c} \quad (\text{the value at } \gamma = 1),

    which exceeds 1, i.e. speculative decoding helps, exactly when :math:`\alpha > c`.

    Parameters
    ----------
    alpha : float or array_like of float
        Expected per-token acceptance, in ``[0, 1]``.
    c : float or array_like of float
        Cost coefficient, ``>= 0``.

    Returns
    -------
    float or ndarray of float64

    Raises
    ------
    ValueError
        If ``alpha`` is outside ``[0, 1]`` or ``c < 0``.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, Corollary 3.9.

    Examples
    --------
    >>> from otspec import speculative
    >>> speculative.improvement_lower_bound(0.6, 0.2)
    1.3333333333333335
    """
    a, cc = _alpha(alpha), _cost(c, "c")
    return _out((1.0 + a) / (1.0 + cc))


def expected_acceptance(p, q, *, l=1.0):
    r"""The paper's :math:`\alpha`: mean acceptance over contexts, optionally with lenience ``l``.

    .. math::

        \alpha = \frac1m \sum_{j=1}^m \sum_x \min\Big(\frac{q_j(x)}{l}, p_j(x)\Big)

    over ``m`` contexts (Corollary 3.6 for ``l = 1``, App. A.5 for ``l < 1``),
    where :math:`p_j` is the draft's and :math:`q_j` the target's next-token
    distribution in context ``j`` (the paper's letters are swapped).

    Parameters
    ----------
    p : (n,) or (m, n) array_like of float
        Draft distributions, one per row.
    q : (n,) or (m, n) array_like of float
        Target distributions, same shape.
    l : float, keyword-only
        Lenience in ``(0, 1]``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If shapes differ, a row is not a distribution or ``l`` is outside ``(0, 1]``.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, Corollary 3.6 and App. A.5 (Table 5).

    Examples
    --------
    >>> from otspec import speculative
    >>> speculative.expected_acceptance([[0.5, 0.5], [1.0, 0.0]], [[0.25, 0.75], [0.5, 0.5]])
    0.625
    >>> round(speculative.expected_acceptance([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], l=0.5), 12)
    0.9
    """
    import math


    lv = validate_lenience(l)
    what = "an array_like of distributions"
    P, Q = as_float_array(p, "p", what), as_float_array(q, "q", what)
    if P.ndim == 2 and Q.ndim == 2:
        if P.shape != Q.shape:
            raise ValueError(f"`p` and `q` must have the same shape, got {P.shape} and {Q.shape}")
        rows = [validate_pair(P[j], Q[j], normalizable=False) for j in range(P.shape[0])]
    else:
        rows = [validate_pair(p, q, normalizable=False)]
    if not rows:
        raise ValueError(f"`p` and `q` must hold at least one context, got shape {P.shape}")
    accs = [math.fsum(np.minimum(qj / lv, pj).tolist()) for pj, qj in rows]
    return math.fsum(accs) / len(accs)
