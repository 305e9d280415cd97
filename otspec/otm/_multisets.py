r"""One enumerator of the multisets of ``k`` i.i.d. draws, with their multinomial probabilities.

For ``k`` i.i.d. draws from ``p`` the multiset :math:`m` (token counts
:math:`m_x`, :math:`\sum_x m_x = k`) has probability

.. math::

    P(M = m) = \binom{k}{m} \prod_x p(x)^{m_x}
             = \frac{k!}{\prod_x m_x!} \prod_x p(x)^{m_x}.

Every exact computation over i.i.d. drafts that only depends on the drafts
through their multiset (the reduced OTM-k LP, SpecTr's step laws for
symmetric verifiers, its dynamic programme) enumerates them here, once.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["MultisetLaw", "multiset_law", "n_multisets", "token_counts"]


def n_multisets(m: int, k: int) -> int:
    """Number of multisets of size ``k`` over ``m`` symbols, :math:`\\binom{m + k - 1}{k}`."""
    return math.comb(m + k - 1, k)


def token_counts(drafts: np.ndarray, n: int) -> np.ndarray:
    """``(m, n)`` int64 counts of each token in each row of the ``(m, k)`` draft array."""
    m, k = drafts.shape
    out = np.zeros((m, n), dtype=np.int64)
    np.add.at(out, (np.repeat(np.arange(m), k), drafts.ravel()), 1)
    return out


@dataclass(frozen=True, eq=False)
class MultisetLaw:
    """The multisets of ``k`` draws from ``supp p`` and their probabilities.

    Attributes
    ----------
    drafts : (m, k) ndarray of int64
        Each multiset as a sorted row of token ids.
    weights : (m,) ndarray of float64
        :math:`P(M = m)` (summing to 1 up to rounding).
    n : int
        Vocabulary size of ``p``.
    """

    drafts: np.ndarray
    weights: np.ndarray
    n: int

    def counts(self) -> np.ndarray:
        """``(m, n)`` int64 token counts of each multiset."""
        return token_counts(self.drafts, self.n)

    def sets(self) -> list[tuple[int, ...]]:
        """Each multiset's distinct tokens, as a sorted tuple."""
        return [tuple(dict.fromkeys(row)) for row in self.drafts.tolist()]


def multiset_law(p: np.ndarray, k: int, *, max_size: int | None = None, what: str = "multisets") -> MultisetLaw:
    r"""Enumerate the multisets of ``k`` i.i.d. draws from ``p`` with their multinomial probabilities.

    Parameters
    ----------
    p : (n,) ndarray of float64
        A validated distribution (tokens with ``p = 0`` are never drawn).
    k : int
        Number of draws.
    max_size : int or None, keyword-only
        Refuse (ValueError, before enumerating) above this many multisets.
    what : str, keyword-only
        How the caller names the enumeration in the error message.

    Returns
    -------
    MultisetLaw

    Raises
    ------
    ValueError
        More than ``max_size`` multisets.
    """
    support = np.flatnonzero(p > 0)
    s = int(support.shape[0])
    size = n_multisets(s, k)
    if max_size is not None and size > max_size:
        raise ValueError(
            f"the {what} would enumerate {size} multisets (|supp p|={s}, k={k}), above the limit {max_size}"
        )
    flat = itertools.chain.from_iterable(itertools.combinations_with_replacement(support.tolist(), k))
    X = np.fromiter(flat, dtype=np.int64, count=size * k).reshape(size, k)
    # prod_x m_x! = prod over positions of (index within its run of equal tokens + 1)
    pos = np.arange(k)
    new = np.ones(X.shape, dtype=bool)
    new[:, 1:] = X[:, 1:] != X[:, :-1]
    start = np.maximum.accumulate(np.where(new, pos, 0), axis=1)
    run = pos - start + 1
    if k <= 170:  # k! is a finite double: the coefficient is exact while it stays below 2**53
        coef = float(math.factorial(k)) / np.prod(run.astype(np.float64), axis=1)
    else:
        coef = np.exp(math.lgamma(k + 1) - np.log(run).sum(axis=1))
    # prod_x p(x)**m_x, one power per distinct token, multiplied in increasing token order
    end = np.ones(X.shape, dtype=bool)
    end[:, :-1] = X[:, 1:] != X[:, :-1]
    prob = np.ones(size)
    for j in range(k):
        rows = np.flatnonzero(end[:, j])
        prob[rows] *= p[X[rows, j]] ** run[rows, j]
    weights = coef * prob
    return MultisetLaw(drafts=X, weights=weights, n=int(p.shape[0]))
