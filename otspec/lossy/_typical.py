r"""Typical acceptance (Medusa §3.3.1; vLLM's ``TypicalAcceptanceSampler``), with the engines' defaults.

Rule (Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads", arXiv:2401.10774, §3.3.1; vLLM
``vllm/model_executor/layers/typical_acceptance_sampler.py``): a drafted
``x`` is accepted when

.. math::

    q(x) > \min\big(\varepsilon,\ \delta \exp(-H_\gamma(q))\big),
    \qquad H_\gamma(q) = -\sum_y q(y) \ln\big(q(y) + \gamma\big),

with vLLM's defaults :math:`\varepsilon = 0.09` (``posterior_threshold``),
:math:`\delta = 0.3` (``posterior_alpha``) and its guard :math:`\gamma =
10^{-5}` inside the logarithm. A rejected draft is replaced by the target's
most likely token (vLLM ``_get_recovered_token_ids``: ``argmax`` of the
target probabilities, the first maximum on ties). No coin is drawn: the
rule is deterministic given the draft, and its exact output law is

.. math::

    r(y) = p(y)\,\mathbb 1\{y \in \mathcal A\} + \Big(1 - \sum_{x \in \mathcal A} p(x)\Big)\,\mathbb 1\{y = y^\star\},

with :math:`\mathcal A` the accepted tokens and :math:`y^\star = \arg\max q`.
:math:`\mathrm{KL}(q \| r)` is infinite whenever ``q`` has mass outside
:math:`\mathcal A \cup \{y^\star\}`; the TV distance is always finite.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._validation import validate_pair
from .._verifier import Verifier
from ._ensemble import _LossyRule

__all__ = ["TypicalAcceptanceVerifier", "typical_acceptance_verifier", "VLLM_DEFAULTS"]

#: vLLM's defaults (SpeculativeConfig): posterior_threshold, posterior_alpha, and the entropy guard.
VLLM_DEFAULTS = {"epsilon": 0.09, "delta": 0.3, "guard": 1e-5}


def _nonneg(x, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(x).__name__}")
    v = float(x)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"`{name}` must be a finite real number >= 0, got {x!r}")
    return v


class TypicalAcceptanceVerifier(_LossyRule, Verifier):
    r"""Typical acceptance with a greedy replacement token (``k = 1``, deterministic).

    Use :func:`typical_acceptance_verifier` to build it.

    Attributes
    ----------
    threshold : float
        :math:`\min(\varepsilon, \delta \exp(-H_\gamma(q)))`.
    accepted : (n,) ndarray of bool
        :math:`\mathcal A`, the tokens accepted when drafted.
    replacement : int
        :math:`y^\star`, the token emitted after a rejection.
    """

    def __init__(self, p, q, epsilon, delta, guard):
        self.k, self.p, self.q = 1, p, q
        self.epsilon, self.delta, self.guard = epsilon, delta, guard
        entropy = -math.fsum((q * np.log(q + guard)).tolist())
        self.threshold = min(epsilon, delta * math.exp(-entropy))
        self.accepted = q > self.threshold
        self.accepted.setflags(write=False)
        self.replacement = int(np.argmax(q))
        law = np.where(self.accepted, p, 0.0)
        law[self.replacement] += max(1.0 - math.fsum(law.tolist()), 0.0)
        law.setflags(write=False)
        self._law = law

    def conditional(self, drafts) -> np.ndarray:
        (x,) = self._drafts(drafts)
        out = np.zeros(self.n)
        out[x if self.accepted[x] else self.replacement] = 1.0
        return out

    def sample(self, drafts, *, rng=None) -> int:
        (x,) = self._drafts(drafts)
        return x if self.accepted[x] else self.replacement

    def acceptance(self) -> float:
        r""":math:`P(Y = X) = p(\mathcal A) + p(y^\star)\mathbb 1\{y^\star \notin \mathcal A\}`.

        A rejected draft equal to :math:`y^\star` is re-emitted, so it counts as accepted.
        """
        acc = math.fsum(self.p[self.accepted].tolist())
        if not self.accepted[self.replacement]:
            acc += float(self.p[self.replacement])
        return min(acc, 1.0)

    def accept_rate(self) -> float:
        r""":math:`p(\mathcal A)`, the fraction of drafts the engine counts as accepted."""
        return min(math.fsum(self.p[self.accepted].tolist()), 1.0)

    def __repr__(self) -> str:
        return f"TypicalAcceptanceVerifier(n={self.n}, epsilon={self.epsilon!r}, delta={self.delta!r})"


def typical_acceptance_verifier(p, q, *, epsilon: float = 0.09, delta: float = 0.3, guard: float = 1e-5,
                                normalize: bool = False) -> TypicalAcceptanceVerifier:
    r"""Typical acceptance as vLLM runs it, as a verifier with its exact output law.

    .. math::

        \text{accept } x \iff q(x) > \min\big(\varepsilon, \delta\, e^{-H_\gamma(q)}\big),
        \qquad \text{else emit } \arg\max_y q(y).

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    epsilon : float, keyword-only
        ``posterior_threshold`` (vLLM default 0.09).
    delta : float, keyword-only
        ``posterior_alpha`` (vLLM default 0.3).
    guard : float, keyword-only
        The constant inside vLLM's entropy logarithm (``1e-5``).
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    TypicalAcceptanceVerifier

    Raises
    ------
    ValueError, TypeError
        Invalid distributions or a negative / non-finite parameter.

    References
    ----------
    .. [1] Cai et al., "Medusa", arXiv:2401.10774, §3.3.1; vLLM,
       ``vllm/model_executor/layers/typical_acceptance_sampler.py`` (defaults in
       ``SpeculativeConfig``: posterior_threshold 0.09, posterior_alpha 0.3).

    Examples
    --------
    >>> import otspec
    >>> v = otspec.typical_acceptance_verifier([0.5, 0.3, 0.2], [0.6, 0.35, 0.05])
    >>> v.accepted.tolist(), v.output_law().round(12).tolist()
    ([True, True, False], [0.7, 0.3, 0.0])
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    return TypicalAcceptanceVerifier(p_, q_, _nonneg(epsilon, "epsilon"), _nonneg(delta, "delta"),
                                     _nonneg(guard, "guard"))
