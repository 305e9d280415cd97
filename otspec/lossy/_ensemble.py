r"""transformers' ensemble verification (``assistant_ensemble_weight = w``): speculative sampling of a mixture.

Rule (transformers ``generation/utils.py``, ``_speculative_sampling`` with
``assistant_ensemble_weight``, from DIVERSED: Wang, Kasa et al., "Relaxed
Speculative Decoding via Dynamic Ensemble Verification", arXiv:2604.07622,
static ensemble): a drafted ``x`` is accepted with probability

.. math::

    a_w(x) = \min\Big(1,\ 1 - w + w\,\frac{q(x)}{p(x)}\Big),

else the output is drawn from :math:`(q - p)_+` normalised (the usual
residual). In transformers' own letters (their ``p`` is the target, ``q``
the draft) the ratio reads :math:`1 - w + w\,p/q`; transformers' test
``test_ensemble_weight_increases_acceptance`` pins the same numbers. This
is speculative sampling of the mixture :math:`r_w = w q + (1 - w) p`
against ``p`` (:math:`(r_w - p)_+ = w (q - p)_+`), so the output law is
exactly :math:`r_w`, the acceptance :math:`\sum_x \min(p, r_w) = 1 - w\,\mathrm{TV}(p, q)`
and :math:`\mathrm{TV}(r_w, q) = (1 - w)\,\mathrm{TV}(p, q)`; ``w = 1`` is lossless.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import as_rng, validate_pair, validate_probability
from .._verifier import coin_accept, sample_from
from ..multidraft._maximal_coupling import RatioTestVerifier
from ._mentored import kl_divergence

__all__ = ["EnsembleVerifier", "ensemble_verifier"]


class _LossyRule:
    """Mixin of the engines' lossy rules: a stated output law ``r``, and TV and KL to ``q`` from it."""

    _law: np.ndarray

    @property
    def lossless(self) -> bool:
        return bool(np.array_equal(self._law, self.q))

    def output_law(self) -> np.ndarray:
        return self._law

    def tv(self) -> float:
        r""":math:`\mathrm{TV}(r, q) = \frac12 \sum_y |r(y) - q(y)|`."""
        return 0.5 * math.fsum(np.abs(self._law - self.q).tolist())

    def kl(self) -> float:
        r""":math:`\mathrm{KL}(q \,\|\, r)` in nats (``inf`` when ``r`` misses target mass)."""
        return kl_divergence(self.q, self._law)


class EnsembleVerifier(_LossyRule, RatioTestVerifier):
    r"""Ensemble verification with weight ``w`` (transformers' ``assistant_ensemble_weight``), ``k = 1``.

    .. math::

        K(y \mid x) = a_w(x)\,\delta_x(y) + (1 - a_w(x))\,\frac{(q(y) - p(y))_+}{\sum_z (q(z) - p(z))_+}.

    Use :func:`ensemble_verifier` to build it.
    """

    def __init__(self, p, q, w):
        super().__init__(p, q)
        self.w = w
        mix = w * q + (1.0 - w) * p
        self._mix = mix  # accept when u p(x) < mix(x)
        self._acc = min(1.0, math.fsum(np.minimum(p, mix).tolist()))
        law = np.minimum(p, mix) + (1.0 - self._acc) * self.residual
        law.setflags(write=False)
        self._law = law

    def _accept_prob(self, x: int) -> float:
        return coin_accept(self._mix[x], self.p[x])  # the strict coin of sample(), 0 where mix(x) = 0

    def sample(self, drafts, *, rng=None) -> int:
        (x,) = self._drafts(drafts)
        gen = as_rng(rng)
        if gen.random() * self.p[x] < self._mix[x]:  # strict coin: u p(x) < (1 - w) p(x) + w q(x)
            return x
        return sample_from(self.residual, gen)

    def acceptance(self) -> float:
        r""":math:`\sum_x \min(p(x), r_w(x)) = 1 - w\,\mathrm{TV}(p, q)`."""
        return self._acc

    def __repr__(self) -> str:
        return f"EnsembleVerifier(n={self.n}, w={self.w!r})"


def ensemble_verifier(p, q, w: float, *, normalize: bool = False) -> EnsembleVerifier:
    r"""transformers' ensemble verification with ``assistant_ensemble_weight = w`` as a verifier.

    .. math::

        a_w(x) = \min\big(1, 1 - w + w\,q(x)/p(x)\big), \qquad
        \text{output law } r_w = w\,q + (1 - w)\,p.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    w : float
        Ensemble weight in [0, 1] (1: lossless speculative sampling; 0: every draft accepted).
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    EnsembleVerifier
        With exact ``acceptance()``, ``output_law()``, ``tv()`` and ``kl()``.

    Raises
    ------
    ValueError, TypeError
        Invalid distributions or ``w`` outside [0, 1].

    References
    ----------
    .. [1] Wang, Kasa et al., "DIVERSED: Relaxed Speculative Decoding via Dynamic
       Ensemble Verification", AISTATS 2026, arXiv:2604.07622 (static ensemble);
       Hugging Face transformers, ``generation/utils.py``, ``_speculative_sampling``.

    Examples
    --------
    >>> import otspec
    >>> v = otspec.ensemble_verifier([0.75, 0.25], [0.25, 0.75], 0.5)
    >>> round(v.acceptance(), 12), v.output_law().round(12).tolist(), round(v.tv(), 12)
    (0.75, [0.5, 0.5], 0.25)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    return EnsembleVerifier(p_, q_, validate_probability(w, "w"))
