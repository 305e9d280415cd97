r"""The shared pieces of the min-cut routes: the likelihood-ratio order and the result of a cut.

Both :func:`otspec.min_cut` (``k`` i.i.d. drafts) and
:func:`otspec.otm.min_cut_without_replacement` (``k`` distinct drafts) find a
minimising prefix of the tokens sorted by :math:`q/p` ascending and report it
as a :class:`MinCut`; they import these from here (neither imports the other).

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MinCut", "ratio_order"]


def ratio_order(p: np.ndarray, q: np.ndarray, *, descending: bool = False, stable: bool = True) -> np.ndarray:
    r"""Token order by the likelihood ratio :math:`q(x)/p(x)`, ascending by default.

    Tokens with :math:`p(x) = 0` have ratio :math:`+\infty` and come last
    (first with ``descending=True``); ties keep index order (stable sort).
    A ratio past the largest double (a subnormal :math:`p(x)`) is
    :math:`+\infty` too: it ties with the :math:`p(x) = 0` tokens, whose
    order moves a cut's draft mass by a subnormal amount at most.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(p > 0, q / np.where(p > 0, p, 1.0), np.inf)
    kind = "stable" if stable else None
    if descending:
        return np.argsort(-ratio, kind=kind)
    return np.argsort(ratio, kind=kind)


@dataclass(frozen=True, eq=False)
class MinCut:
    r"""The minimising prefix of a min-cut form of the optimal acceptance.

    Attributes
    ----------
    alpha : float
        The minimum, :math:`1 + q(\Omega_0) - P(S \subseteq \Omega_0)`:
        :math:`1 + q(\Omega_0) - p(\Omega_0)^k` for ``k`` i.i.d. drafts
        (:func:`otspec.min_cut`), the without-replacement chance for ``k``
        distinct drafts (:func:`otspec.otm.min_cut_without_replacement`).
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
