r"""Leviathan et al.'s lenience: accept more drafts by loosening the ratio test.

Notation: ``p`` is the draft distribution and ``q`` the target. Leviathan,
Kalman and Matias (App. A.5) use the opposite letters (their ``p`` is the
target, their ``q`` the draft); every formula here is written in ours.

With lenience :math:`l \in (0, 1]` the draft :math:`x \sim p` is accepted
when :math:`l\,p(x) \le q(x)` and otherwise with probability
:math:`q(x) / (l\,p(x))`; after a rejection the output is drawn from the
usual residual :math:`(q - p)_+ / \sum (q - p)_+` (Algorithm 1 of the paper is
unchanged apart from the comparison). ``l = 1`` is speculative sampling.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._validation import as_float_array, first_bad_entry, validate_pair
from ..multidraft._maximal_coupling import RatioTestVerifier
from ._mentored import check_curve_points, kl_divergence

__all__ = ["LenientVerifier", "LenienceCurve", "lenient_verifier", "lenience_curve", "validate_lenience"]


def validate_lenience(l) -> float:
    """``l`` must be a real number in (0, 1]."""
    if isinstance(l, bool) or not isinstance(l, numbers.Real):
        raise TypeError(f"`l` must be a real number in (0, 1], got {type(l).__name__}")
    v = float(l)
    if not (0.0 < v <= 1.0):
        raise ValueError(f"`l` (lenience) must lie in (0, 1], got {l!r}")
    return v


class LenientVerifier(RatioTestVerifier):
    r"""Speculative sampling with lenience ``l`` (k = 1; lossy for ``l < 1``).

    .. math::

        K(y \mid x) = a_x \mathbb 1\{y = x\} + (1 - a_x)\,
        \frac{(q(y) - p(y))_+}{\sum_z (q(z) - p(z))_+},
        \qquad a_x = \min\Big(1, \frac{q(x)}{l\,p(x)}\Big).

    Acceptance :math:`A(l) = \sum_x \min(q(x)/l, p(x))` (the paper's
    :math:`\sum_x \min(p(x)/l, q(x))` in its letters) and output law
    :math:`\pi_l = \min(q/l, p) + (1 - A(l)) \cdot (q - p)_+ / \sum (q - p)_+`.
    A draft is only rejected where :math:`q(x) < l\,p(x) \le p(x)`, where the
    residual is zero, so :math:`P(Y = X) = A(l)` exactly. No token gets more
    than :math:`\max(q(x)/l, q(x)) = q(x)/l` (the paper's guarantee).

    Use :func:`lenient_verifier` to build it with validated inputs.

    Attributes
    ----------
    l : float
        The lenience.
    """

    def __init__(self, p: np.ndarray, q: np.ndarray, l: float):
        super().__init__(p, q)
        self.l = l
        self._scale = l
        with np.errstate(over="ignore"):  # a subnormal l: q / l = inf where q > 0, and min(inf, p) = p exactly
            acc = np.minimum(q / l, p)
        self._acc = min(math.fsum(acc.tolist()), 1.0)
        law = acc + (1.0 - self._acc) * self._res
        law.setflags(write=False)
        self._law = law

    @property
    def lossless(self) -> bool:
        """True only when the output law is exactly ``q`` (``l = 1``, or no draft is affected)."""
        return bool(np.array_equal(self._law, self.q)) or self.l == 1.0

    def acceptance(self) -> float:
        return self._acc

    def output_law(self) -> np.ndarray:
        return self.q if self.l == 1.0 else self._law

    def tv(self) -> float:
        r""":math:`\mathrm{TV}(q, \pi_l) = \frac12 \sum_y |q(y) - \pi_l(y)|`."""
        return 0.5 * math.fsum(np.abs(self.q - self.output_law()).tolist())

    def kl(self) -> float:
        r""":math:`\mathrm{KL}(q \,\|\, \pi_l)` in nats (``inf`` when :math:`\pi_l` misses target mass)."""
        return kl_divergence(self.q, self.output_law())

    def __repr__(self) -> str:
        return f"LenientVerifier(n={self.n}, l={self.l!r})"


def lenient_verifier(p, q, l, *, normalize: bool = False) -> LenientVerifier:
    r"""Speculative sampling with Leviathan et al.'s lenience ``l`` (App. A.5), as a verifier.

    .. math::

        a_x = \min\Big(1, \frac{q(x)}{l\,p(x)}\Big), \qquad
        A(l) = \sum_x p(x) a_x = \sum_x \min\Big(\frac{q(x)}{l}, p(x)\Big),

    and the output law :math:`\pi_l = \min(q/l, p) + (1 - A(l))\,(q-p)_+/\sum(q-p)_+`.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution (the paper's :math:`q`).
    q : (n,) array_like of float
        Target distribution (the paper's :math:`p`).
    l : float
        Lenience in ``(0, 1]``; ``1`` is lossless speculative sampling.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.

    Returns
    -------
    LenientVerifier
        ``acceptance()``, ``output_law()``, ``tv()`` and ``kl()`` are exact.

    Raises
    ------
    ValueError
        If ``l`` is outside ``(0, 1]`` or ``p``, ``q`` are not distributions
        of the same length.
    TypeError
        If ``l`` is not a real number.

    Notes
    -----
    Subnormal entries of ``p`` or ``q`` (below 2.2e-308) are set to exactly 0
    on input, as at every entry point of otspec, so the verifier is that of
    the same problem with those entries at zero. The acceptance test is strict,
    :math:`u\,l\,p(x) < q(x)` with :math:`u` uniform on :math:`[0, 1)`: a coin
    of exactly 0 never accepts a draft the target gives probability 0.

    See Also
    --------
    mentored : the KL-optimal acceptance for a given KL budget.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, App. A.5 (letters ``p``, ``q`` swapped).

    Examples
    --------
    >>> import otspec
    >>> v = otspec.lenient_verifier([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], 0.5)
    >>> round(v.acceptance(), 12)                   # min(0.4, 0.5) + 0.3 + 0.2
    0.9
    >>> v.output_law().round(12).tolist()
    [0.4, 0.3, 0.3]
    >>> round(v.tv(), 12)
    0.2
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    return LenientVerifier(p_, q_, validate_lenience(l))


@dataclass(frozen=True, eq=False)
class LenienceCurve:
    r"""Acceptance and distance to the target along lenience values (see :func:`lenience_curve`).

    Attributes
    ----------
    l : (m,) ndarray of float64
        Lenience values.
    acceptance : (m,) ndarray of float64
        :math:`A(l) = \sum_x \min(q(x)/l, p(x))`.
    kl : (m,) ndarray of float64
        :math:`\mathrm{KL}(q \| \pi_l)` (``inf`` where :math:`\pi_l` misses target mass).
    tv : (m,) ndarray of float64
        :math:`\mathrm{TV}(q, \pi_l)`.
    """

    l: np.ndarray
    acceptance: np.ndarray
    kl: np.ndarray
    tv: np.ndarray


def lenience_curve(p, q, ls, *, normalize: bool = False) -> LenienceCurve:
    r"""Acceptance, KL and TV of the lenient sampler for several lenience values.

    .. math::

        l \mapsto \Big(A(l) = \sum_x \min\big(\tfrac{q(x)}{l}, p(x)\big),\;
        \mathrm{KL}(q \,\|\, \pi_l),\; \mathrm{TV}(q, \pi_l)\Big).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    ls : (m,) array_like of float
        Lenience values, each in ``(0, 1]``.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1.

    Returns
    -------
    LenienceCurve

    Raises
    ------
    ValueError
        If a lenience value is outside ``(0, 1]``, or ``ls`` has more than
        ``MAX_CURVE_POINTS`` (10,000) values.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, ICML 2023, App. A.5 (letters swapped).

    Examples
    --------
    >>> import otspec
    >>> c = otspec.lenience_curve([0.5, 0.3, 0.2], [0.2, 0.3, 0.5], [1.0, 0.5])
    >>> c.acceptance.round(12).tolist(), c.tv.round(12).tolist()
    ([0.7, 0.9], [0.0, 0.2])
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    arr = np.atleast_1d(as_float_array(ls, "ls", "a 1-D array_like of lenience values", booleans=False))
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(f"`ls` must be a non-empty 1-D array of lenience values, got shape {arr.shape}")
    check_curve_points(arr.shape[0], "ls")
    bad = ~((arr > 0.0) & (arr <= 1.0))  # every value checked before any verifier is built (NaN too)
    if bad.any():
        raise ValueError(f"`ls` must hold lenience values `l` in (0, 1], got {first_bad_entry(arr, bad)}")
    cols = np.empty((3, arr.shape[0]))  # the three numbers of each verifier; its (V,) law is not kept
    for j, v in enumerate(arr):
        ver = LenientVerifier(p_, q_, float(v))
        cols[:, j] = (ver.acceptance(), ver.kl(), ver.tv())
    out = LenienceCurve(l=np.array(arr, copy=True), acceptance=cols[0].copy(), kl=cols[1].copy(), tv=cols[2].copy())
    for a in (out.l, out.acceptance, out.kl, out.tv):
        a.setflags(write=False)
    return out
