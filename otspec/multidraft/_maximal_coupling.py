r"""One draft: the maximal coupling (speculative sampling).

Notation: ``p`` is the draft distribution, ``q`` the target. Leviathan et al.
use the opposite letters (their ``p`` is the target).
"""

from __future__ import annotations

import numpy as np

from .._validation import as_rng, validate_pair
from .._verifier import Verifier, coin_accept, complement, sample_from

__all__ = ["MaximalCoupling", "RatioTestVerifier", "maximal_coupling", "residual"]


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r"""Normalised residual :math:`(q - p)_+ / \sum (q - p)_+`; ``q`` when ``p == q``.

    The fallback to ``q`` when the residual has no mass is the guarded
    normaliser: rejection then has probability zero, so any law is correct.
    """
    r = np.maximum(q - p, 0.0)
    s = r.sum()
    if not s > 0:
        return np.array(q, dtype=np.float64)
    return r / s


class RatioTestVerifier(Verifier):
    r"""One draft, a ratio test, then the residual: the shared shape of the k = 1 rules.

    .. math::

        K(y \mid x) = a_x \mathbb 1\{y = x\} + (1 - a_x)\,
        \frac{(q(y) - p(y))_+}{\sum_z (q(z) - p(z))_+},
        \qquad a_x = \min\Big(1, \frac{q(x)}{s\,p(x)}\Big),

    with the scale :math:`s = 1` for speculative sampling (the maximal
    coupling) and :math:`s = l` for Leviathan's lenience. Subclasses set
    ``_scale`` and implement :meth:`acceptance`.
    """

    _scale: float = 1.0

    def __init__(self, p: np.ndarray, q: np.ndarray):
        self.k = 1
        self.p = p
        self.q = q
        self._res = residual(p, q)
        self._res.setflags(write=False)

    @property
    def residual(self) -> np.ndarray:
        """The normalised residual law used after a rejection."""
        return self._res

    def _accept_prob(self, x: int) -> float:
        # the sampler's strict coin u s p(x) < q(x): never accepts a token of q(x) = 0, even one of p(x) = 0
        return coin_accept(self.q[x], self._scale * self.p[x])

    def conditional(self, drafts) -> np.ndarray:
        (x,) = self._drafts(drafts)
        a = self._accept_prob(x)
        out = (1.0 - a) * self._res
        out[x] += a
        return out

    def sample(self, drafts, *, rng=None) -> int:
        (x,) = self._drafts(drafts)
        gen = as_rng(rng)
        # u * s * p(x) < q(x), u in [0, 1): the strict division-free acceptance test (u = 0
        # must not accept a token with q(x) = 0)
        if gen.random() * self._scale * self.p[x] < self.q[x]:
            return x
        return sample_from(self._res, gen)


class MaximalCoupling(RatioTestVerifier):
    r"""Speculative sampling with one draft: the maximal coupling of ``p`` and ``q``.

    .. math::

        K(y \mid x) = \min\Big(1, \frac{q(x)}{p(x)}\Big) \mathbb 1\{y = x\}
        + \Big(1 - \min\Big(1, \frac{q(x)}{p(x)}\Big)\Big)
          \frac{(q(y) - p(y))_+}{\sum_z (q(z) - p(z))_+},

    which is lossless and accepts :math:`\sum_x \min(p(x), q(x)) = 1 - \mathrm{TV}(p, q)`,
    the optimum of OTM-1 (SpecTr §4; Leviathan et al., Algorithm 1, with
    the letters swapped).

    Use :func:`maximal_coupling` to construct it with validated inputs.
    """

    def acceptance(self) -> float:
        # 1 - TV(p, q) as 1 minus a non-negative sum: never above 1 in float64 (sum min(p, q) where below 1/2)
        return complement(np.maximum(self.p - self.q, 0.0).sum(), lambda: np.minimum(self.p, self.q).sum())


def maximal_coupling(p, q, *, normalize: bool = False) -> MaximalCoupling:
    r"""Speculative sampling (one draft) as a verifier.

    .. math::

        \max_{\pi \in \Pi(p, q)} P_\pi(Y = X) = \sum_x \min(p(x), q(x)).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of requiring it.

    Returns
    -------
    MaximalCoupling
        A lossless verifier with ``k = 1``.

    Raises
    ------
    ValueError, TypeError
        If ``p`` or ``q`` is not a distribution or their lengths differ.

    References
    ----------
    .. [1] Leviathan, Kalman, Matias, "Fast Inference from Transformers via
       Speculative Decoding", ICML 2023, Algorithm 1 (their ``p`` is our ``q``).
    .. [2] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, §4.

    Examples
    --------
    >>> import otspec
    >>> v = otspec.maximal_coupling([0.6, 0.4], [0.3, 0.7])
    >>> round(v.acceptance(), 12)
    0.7
    >>> v.conditional([0]).round(12).tolist()
    [0.5, 0.5]
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    return MaximalCoupling(p_, q_)
