r"""Deterministic candidate sets (top-``k`` of ``p``, as EAGLE / SpecInfer trees draft) with recursive rejection.

The candidates :math:`C = (c_1, \dots, c_k)` are the ``k`` most likely
tokens of ``p`` (most likely first, ties by lower token id), drafted with
probability 1. Recursive rejection with the draft probability taken as 1
(SpecInfer, Miao et al., arXiv:2305.09781, multi-step speculative sampling, with a point-mass
draft): :math:`q_1 = q`; accept :math:`c_i` when :math:`u < q_i(c_i)`, else
:math:`q_{i+1} = q_i` with :math:`c_i` removed and renormalised; after ``k``
rejections draw from :math:`q_{k+1}`. Token :math:`c_i` is output with
probability exactly :math:`q(c_i)`, so the output law is ``q`` and the
acceptance is :math:`q(C)`, which is the optimum for this draft process:
:math:`\min_{\Omega_0}[1 + q(\Omega_0) - \mathbb 1\{C \subseteq \Omega_0\}] = q(C)`.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import as_rng, validate_k, validate_pair
from .._verifier import sample_from
from ..otm._without_replacement import _support_size_check
from ._greedy_drafts import top_tokens
from ._without_replacement import DraftProcessVerifier

__all__ = ["TopKVerifier", "top_k_verifier"]


class TopKVerifier(DraftProcessVerifier):
    r"""Top-``k`` candidate set with recursive rejection at draft probability 1 (lossless, acceptance ``q(C)``).

    Use :func:`top_k_verifier` to build it.

    Attributes
    ----------
    candidates : tuple of int
        :math:`C`, the only draft tuple.
    """

    draft_process = "deterministic"

    def __init__(self, p, q, k):
        self.k, self.p, self.q = k, p, q
        self.candidates = tuple(int(t) for t in top_tokens(p, k))
        self._alpha = min(1.0, math.fsum(q[list(self.candidates)].tolist()))

    def draft_law_of(self, drafts) -> float:
        return 1.0 if self._drafts(drafts) == self.candidates else 0.0

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        return self.candidates

    def conditional(self, drafts) -> np.ndarray:
        r"""Exact output law: :math:`c_i` with probability :math:`q(c_i)`, the rest as ``q`` — that is, ``q``."""
        self._drafts(drafts)
        return np.array(self.q)

    def sample(self, drafts, *, rng=None) -> int:
        xs = self._drafts(drafts)
        gen = as_rng(rng)
        law = np.array(self.q)
        for c in xs:
            mass = law.sum()
            if not mass > 0:
                break
            if self._coin(gen, mass, law[c]):  # u < q_i(c) with q_i = law / mass
                return c
            law[c] = 0.0
        if not law.sum() > 0:  # q(C) = 1: rejection of every candidate has probability 0
            return xs[-1]
        return sample_from(law, gen)

    def acceptance(self) -> float:
        return self._alpha

    def optimum(self) -> float:
        return self._alpha


def top_k_verifier(p, q, k: int, *, normalize: bool = False) -> TopKVerifier:
    r"""The top-``k`` candidates of ``p`` verified by recursive rejection with draft probability 1.

    .. math::

        P(Y \in C) = q(C), \qquad C = \operatorname{top}_k(p).

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    k : int
        Number of candidates.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    TopKVerifier

    Raises
    ------
    ValueError
        Invalid input, or fewer than ``k`` tokens with ``p > 0``.

    References
    ----------
    .. [1] Miao et al., "SpecInfer", arXiv:2305.09781 (multi-step speculative sampling: recursive rejection);
       Li et al., "EAGLE", arXiv:2401.15077 (top-k draft trees).

    Examples
    --------
    >>> import otspec
    >>> v = otspec.top_k_verifier([0.6, 0.3, 0.1], [0.2, 0.3, 0.5], 2)
    >>> v.candidates, round(v.acceptance(), 12)
    ((0, 1), 0.5)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    _support_size_check(p_, k)
    return TopKVerifier(p_, q_, k)
