r"""The optimal verifier for ``k`` drafts drawn without replacement, and the shared base of non-i.i.d. draft processes.

A verifier whose drafts are not ``k`` i.i.d. draws from ``p`` states its draft
law through :meth:`otspec.Verifier.draft_law_of` (which
:func:`otspec.check_lossless` enumerates with) and draws drafts with
``sample_drafts``. Its acceptance is compared with the optimum for *its own*
draft process, :math:`\alpha_D = \min_{\Omega_0} [1 + q(\Omega_0) - P_D(S \subseteq \Omega_0)]`
(docs/theory/without_replacement.rst).

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import as_rng, validate_k, validate_pair
from .._verifier import Verifier, complement, sample_from
from ..otm._without_replacement import (
    _support_size_check,
    _wor_draft_prob,
    alpha_k_without_replacement,
    plan_size_check,
    wor_plan,
)

__all__ = ["DraftProcessVerifier", "WithoutReplacementVerifier", "without_replacement_verifier"]


class DraftProcessVerifier(Verifier):
    """Base of verifiers whose drafts follow a named process other than ``k`` i.i.d. draws.

    Subclasses set ``draft_process`` and implement :meth:`draft_law_of`,
    :meth:`sample_drafts` and :meth:`optimum` (the optimal acceptance of any
    lossless verifier for the same draft process).
    """

    draft_process: str = "iid"

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def optimum(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _coin(self, gen: np.random.Generator, scale: float, value: float) -> bool:
        """The strict acceptance coin ``u * scale < value`` with ``u`` uniform on [0, 1)."""
        return gen.random() * scale < value


class WithoutReplacementVerifier(DraftProcessVerifier):
    r"""The optimal lossless verifier of ``k`` distinct drafts drawn without replacement from ``p``.

    .. math::

        K(\cdot \mid x) = \pi(S(x), \cdot) / P(S = S(x)),

    with :math:`\pi` an optimal plan of the membership-cost LP over drafted
    sets (:func:`otspec.otm.wor_plan`, HiGHS, repaired to exact feasibility):
    lossless to rounding, acceptance :math:`\alpha^{\mathrm{wor}}_k(p, q)`.

    Use :func:`without_replacement_verifier` to build it.

    Attributes
    ----------
    alpha : float
        :math:`\alpha^{\mathrm{wor}}_k` by the exact min-cut route.
    n_sets : int
        Number of drafted sets carried by the plan.
    """

    draft_process = "without_replacement"

    def __init__(self, p, q, k, sets, weights, rows, alpha):
        self.k, self.p, self.q = k, p, q
        self._index = {s: i for i, s in enumerate(sets)}
        self._weights = weights
        tot = rows.sum(axis=1, keepdims=True)
        self._rows = np.where(tot > 0, rows / np.where(tot > 0, tot, 1.0), q[None, :])
        self._rows.setflags(write=False)
        self.alpha = float(alpha)
        # P(Y in S) = 1 - sum_A P(S = A) K(outside A | A): 1 minus non-negative masses, never above 1
        inside = np.zeros(self._rows.shape, dtype=bool)
        for i, s in enumerate(sets):
            inside[i, list(s)] = True
        off_set = np.where(inside, 0.0, self._rows).sum(axis=1)
        self._acceptance = complement(math.fsum((weights * off_set).tolist()),
                                      lambda: math.fsum((weights * np.where(inside, self._rows, 0.0).sum(axis=1)).tolist()))

    @property
    def n_sets(self) -> int:
        return len(self._index)

    def draft_law_of(self, drafts) -> float:
        r""":math:`\prod_i p(x_i) / (1 - \sum_{j<i} p(x_j))` for distinct drafts, 0 for a repeat."""
        return _wor_draft_prob(self.p, self._drafts(drafts))

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        """``k`` distinct drafts, each from ``p`` renormalised over the tokens not yet drawn."""
        gen = as_rng(rng)
        w = np.array(self.p)
        out = []
        for _ in range(self.k):
            x = sample_from(w, gen)
            out.append(x)
            w[x] = 0.0
        return tuple(out)

    def conditional(self, drafts) -> np.ndarray:
        x = self._drafts(drafts)
        i = self._index.get(tuple(sorted(set(x))))
        return np.array(self.q) if i is None else np.array(self._rows[i])

    def acceptance(self) -> float:
        """Exact :math:`P(Y \\in S(X))` of the plan as a kernel (equals ``alpha`` to the LP tolerance; at most 1)."""
        return self._acceptance

    def optimum(self) -> float:
        return self.alpha


def without_replacement_verifier(p, q, k: int, *, normalize: bool = False) -> WithoutReplacementVerifier:
    r"""The optimal verifier for ``k`` distinct drafts drawn sequentially without replacement from ``p``.

    .. math::

        \max_\pi P(Y \in S(X)) = \alpha^{\mathrm{wor}}_k(p, q)
        = \min_{\Omega_0}\big[1 + q(\Omega_0) - P(S \subseteq \Omega_0)\big].

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    k : int
        Number of distinct drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    WithoutReplacementVerifier
        Lossless; ``acceptance()`` is :math:`\alpha^{\mathrm{wor}}_k` to the LP tolerance.

    Raises
    ------
    ValueError
        Invalid distributions; fewer than ``k`` tokens with ``p > 0``; more than
        ``MAX_PLAN_SETS`` (200,000) drafted sets (the plan is built over all of
        them), or set weights above ``MAX_PLAN_WORK`` (``C(m, k) 2^k k`` steps
        for ``m`` tokens with ``p > 0``): both checked before any enumeration,
        in microseconds.
    otspec.SolverError
        The LP fails its re-check.

    Notes
    -----
    The weight of each drafted set, :math:`P(S = A)`, is a sum over the
    :math:`k!` orders of ``A``; it is computed by a recursion over the
    :math:`2^k` subsets of ``A`` instead (each step adds one member,
    :func:`otspec.otm._without_replacement.set_weights_without_replacement`),
    so ``n = 12, k = 11`` takes a fraction of a second (about 80 minutes by
    orderings). The plan itself is one membership LP over the sets (HiGHS).

    References
    ----------
    .. [1] Hu et al., "Towards Optimal Multi-draft Speculative Decoding", ICLR 2025,
       arXiv:2502.18779 (the optimal acceptance for sampling without replacement).

    Examples
    --------
    >>> import otspec
    >>> v = otspec.without_replacement_verifier([0.6, 0.3, 0.1], [0.2, 0.3, 0.5], 2)
    >>> chk = otspec.check_lossless(v)
    >>> bool(chk.max_marginal_error < 1e-12), round(v.acceptance(), 9), round(v.alpha, 9)
    (True, 0.792857143, 0.792857143)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    _support_size_check(p_, k)
    plan_size_check(int(np.count_nonzero(p_ > 0)), k)
    sets, w, rows, _ = wor_plan(p_, q_, k)
    return WithoutReplacementVerifier(p_, q_, k, sets, w, rows, alpha_k_without_replacement(p_, q_, k))
