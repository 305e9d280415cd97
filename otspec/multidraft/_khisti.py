r"""Khisti et al.'s canonical decomposition: importance-sampling selection, then single-draft speculative sampling.

Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft
Speculative Sampling: Canonical Architectures and Theoretical Limits"
(ICLR 2025, arXiv:2410.18234), canonical decomposition: an optimal token-level selection
for ``k`` drafts is, without loss, a two-step scheme. Step 1 (importance
sampling, IS) picks one of the drafts, :math:`Z \in S(X)`, with selection
probabilities :math:`\beta(y \mid x)`; step 2 speculative-samples ``Z``
against ``q`` as a single draft whose law is the selection law
:math:`z(y) = \sum_x P(X = x)\, \beta(y \mid x)`: accept when
:math:`u\, z(Z) < q(Z)`, else draw from :math:`(q - z)_+` normalised. The
output is exactly ``q`` and the acceptance is :math:`\sum_y \min(z(y), q(y))`.

The selection here is the optimal one, read off an optimal matching of
the membership LP over drafted sets (HiGHS): the matched mass
:math:`f(A, y)` is selected as is, the unmatched mass of a set is spread
over its tokens in proportion to ``q``; then
:math:`\sum_y \min(z, q) \ge \sum_{A, y} f(A, y) = \alpha_k`, so the
two-step scheme attains :math:`\alpha_k(p, q)` (the decomposition,
checked exactly). The paper's practical *weighted* IS scheme (weights
from a truncated LP) is not implemented: its weights could not be pinned
down from a primary source in this session.

For ``k = 2`` identical drafts the paper gives an explicit optimum and a
condition for acceptance 1, in the form

.. math::

    \alpha_2^\star = \min_{S \subseteq \Omega}\Big[\sum_{s \in S} q_s
       + \Big(\sum_{s \notin S} p_s\Big)^2 + 2 \sum_{s \in S} p_s \sum_{s \notin S} p_s\Big],
    \qquad
    \alpha_2^\star = 1 \iff \sum_{s \in S} q_s \ge \Big(\sum_{s \in S} p_s\Big)^2 \ \ \forall S,

(the full text of the theorems could not be re-read from a primary source in
this session: this is their form as recalled, written in otspec's letters,
and it is *checked*, not assumed: both sides are computed independently),
evaluated here by brute force over all :math:`2^n` subsets
(:func:`khisti_alpha2`, :func:`khisti_acceptance_one`) and compared with
:func:`otspec.alpha_k` (one sort) in the tests and the report.

Notation: ``p`` is the draft distribution, ``q`` the target.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._validation import as_rng, validate_k, validate_pair
from .._verifier import Verifier, coin_accept, sample_from, validate_tol
from ..otm._lp import check_plan_entries, membership_plan, set_weights
from ..otm._multisets import n_multisets

__all__ = ["KhistiVerifier", "khisti_verifier", "khisti_alpha2", "khisti_acceptance_one"]

#: Largest number of draft multisets the selection LP is built over.
MAX_MULTISETS = 200_000
#: Largest vocabulary the 2**n brute-force closed forms enumerate.
MAX_BRUTE_N = 20


class KhistiVerifier(Verifier):
    r"""Importance-sampling selection of one draft, then speculative sampling of it (Khisti et al.'s canonical decomposition).

    .. math::

        K(\cdot \mid x) = \sum_{y \in S(x)} \beta(y \mid x)\big[a_y \delta_y + (1 - a_y)\, r\big],
        \quad a_y = \min\Big(1, \frac{q(y)}{z(y)}\Big),\quad r = \frac{(q - z)_+}{\sum (q - z)_+}.

    Use :func:`khisti_verifier` to build it.

    Attributes
    ----------
    selection_law : (n,) ndarray
        :math:`z`, the law of the selected draft.
    """

    def __init__(self, p, q, k, sets, weights, select):
        self.k, self.p, self.q = k, p, q
        self._weights = weights
        self._index = {s: i for i, s in enumerate(sets)}
        self._select = select  # rows: selection probabilities given the set (support inside the set)
        z = np.zeros(p.shape[0])
        for s, w in zip(sets, self._weights):
            z += w * select[self._index[s]]
        self.selection_law = z
        self.selection_law.setflags(write=False)
        self._a = coin_accept(q, z)  # the strict coin u z(y) < q(y) of sample()
        res = np.maximum(q - z, 0.0)
        self._res = res / res.sum() if res.sum() > 0 else np.array(q)
        self._acc = min(1.0, math.fsum(np.minimum(z, q).tolist()))

    def sample_drafts(self, *, rng=None) -> tuple[int, ...]:
        """``k`` i.i.d. drafts from ``p``."""
        gen = as_rng(rng)
        return tuple(sample_from(self.p, gen) for _ in range(self.k))

    def conditional(self, drafts) -> np.ndarray:
        x = self._drafts(drafts)
        i = self._index.get(tuple(sorted(set(x))))
        if i is None:
            return np.array(self.q)
        beta = self._select[i]
        out = (beta * (1.0 - self._a)).sum() * self._res
        out += beta * self._a
        return out

    def sample(self, drafts, *, rng=None) -> int:
        x = self._drafts(drafts)
        gen = as_rng(rng)
        i = self._index.get(tuple(sorted(set(x))))
        if i is None:
            return sample_from(self.q, gen)
        y = sample_from(self._select[i], gen)
        if gen.random() * self.selection_law[y] < self.q[y]:
            return y
        return sample_from(self._res, gen)

    def acceptance(self) -> float:
        r""":math:`\sum_y \min(z(y), q(y))`, which equals :math:`\alpha_k(p, q)`."""
        return self._acc


def khisti_verifier(p, q, k: int, *, normalize: bool = False) -> KhistiVerifier:
    r"""Khisti et al.'s two-step verifier (IS selection, then single-draft speculative sampling), optimal selection.

    .. math::

        \max_\beta \sum_y \min(z_\beta(y), q(y)) = \alpha_k(p, q).

    The selection LP has many optima; it is solved on the tokens in a
    label-free order (ascending ``p``, then ``q``), so relabelling the
    vocabulary relabels the selection (as :func:`otspec.otm_lp`).

    Parameters
    ----------
    p, q : (n,) array_like of float
        Draft and target distributions.
    k : int
        Number of i.i.d. drafts.
    normalize : bool, keyword-only
        Rescale the inputs to sum to 1.

    Returns
    -------
    KhistiVerifier

    Raises
    ------
    ValueError
        Invalid input, or too many drafted sets (the selection is an LP over them), or a
        selection plan (sets x tokens) above :data:`otspec.otm._lp.MAX_PLAN_ENTRIES` entries.
    otspec.SolverError
        The LP fails its re-check.

    References
    ----------
    .. [1] Khisti et al., "Multi-Draft Speculative Sampling: Canonical Architectures
       and Theoretical Limits", ICLR 2025, arXiv:2410.18234 (canonical decomposition).

    Examples
    --------
    >>> import otspec
    >>> p, q = [0.6, 0.3, 0.1], [0.2, 0.3, 0.5]
    >>> v = otspec.khisti_verifier(p, q, 2)
    >>> round(v.acceptance(), 9), round(float(otspec.alpha_k(p, q, 2)), 9)
    (0.69, 0.69)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    k = validate_k(k)
    m = int(np.count_nonzero(p_ > 0))
    if n_multisets(m, k) > MAX_MULTISETS:
        raise ValueError(
            f"the selection LP of `k`={k} drafts enumerates C({m} + {k} - 1, {k}) = {n_multisets(m, k)} draft "
            f"multisets, above the limit {MAX_MULTISETS}"
        )
    check_plan_entries(n_multisets(m, k), q_.shape[0], f"the selection plan of `k` = {k} drafts over `p`'s "
                       f"{m} tokens and `q`'s {q_.shape[0]}")
    # solved in a label-free token order (ascending p, then q) and mapped back, as in otm_lp: the LP's optimal
    # selection is not unique, and the vertex returned depended on the token ids (a relabelled vocabulary got
    # another selection, seen downstream in SpecTr's draft selection over blocks)
    canon = np.lexsort((q_, p_))
    sets, w = set_weights(p_[canon], k)
    _, _, matched_c = membership_plan(sets, w, q_[canon])
    select = np.empty_like(matched_c)
    select[:, canon] = matched_c
    sets = _spread_leftover(select, sets, canon, w, q_)
    return KhistiVerifier(p_, q_, k, sets, w, select)


def _spread_leftover(select: np.ndarray, sets_c: list, canon: np.ndarray, w: np.ndarray, q: np.ndarray) -> list:
    r"""Complete the matched rows ``select`` (one per set, in place) to selection laws, and return the sets in token ids.

    Set ``i`` (``sets_c[i]``, in the canonical order's positions; ``canon`` maps them to token ids) gets its unmatched
    mass :math:`\max(w_i - \sum_y f_i(y), 0)` spread over its tokens in proportion to ``q`` (evenly where ``q`` is 0
    on all of them), then its row divided by its total; a row of total 0 (a set of rounding-level weight) selects its
    smallest token. The sets of one size are done at once, as ``(n, size)`` arrays: every entry is the same sum,
    product and quotient of the same operands as a loop over the sets does it (the rows' sums are numpy's sums of the
    same contiguous rows), so the same bits.
    """
    n = len(sets_c)
    size = np.fromiter(map(len, sets_c), dtype=np.int64, count=n)
    d = w - select.sum(axis=1)
    left = np.where(0.0 > d, 0.0, d)  # Python's max(d, 0.0): d itself where not below 0 (-0.0 and NaN kept)
    sets: list = [None] * n
    first = np.empty(n, dtype=np.int64)
    for m in np.unique(size).tolist():
        rows = np.flatnonzero(size == m)
        members = np.sort(canon[np.array([sets_c[i] for i in rows.tolist()], dtype=np.int64).reshape(-1, m)], axis=1)
        for i, a in zip(rows.tolist(), members.tolist()):
            sets[i] = tuple(a)
        first[rows] = members[:, 0]
        share = q[members]
        share = np.where((share.sum(axis=1) > 0)[:, None], share, 1.0)
        select[rows[:, None], members] += left[rows, None] * share / share.sum(axis=1)[:, None]
    tot = select.sum(axis=1)
    pos = tot > 0
    select[pos] /= tot[pos, None]
    zero = np.flatnonzero(~pos)
    select[zero, first[zero]] = 1.0  # a set of rounding-level weight: any selection inside it
    return sets


def _subset_sums(p: np.ndarray, q: np.ndarray):
    n = p.shape[0]
    if n > MAX_BRUTE_N:
        raise ValueError(f"the 2**n subset enumeration needs n <= {MAX_BRUTE_N}, got n = {n}")
    masks = np.array(list(itertools.product((0.0, 1.0), repeat=n)))
    # p(S^c) summed over the complement, never formed as 1 - p(S): a p(S) rounded past 1 would make it negative
    return masks @ p, masks @ q, (1.0 - masks) @ p


def khisti_alpha2(p, q, *, normalize: bool = False) -> float:
    r"""Khisti et al.'s explicit optimal acceptance of two identical drafts, by brute force over subsets.

    .. math::

        \alpha_2^\star = \min_{S}\Big[q(S) + p(S^c)^2 + 2\,p(S)\,p(S^c)\Big].

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of refusing.

    Returns
    -------
    float
        :math:`\alpha_2^\star` (equal to :func:`otspec.alpha_k` with ``k = 2``).

    Raises
    ------
    ValueError
        ``p`` or ``q`` not distributions of one length (brute force over the
        :math:`2^n` subsets: keep ``n`` small).
    TypeError
        Non-numeric input.

    References
    ----------
    .. [1] Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
       Canonical Architectures and Theoretical Limits", ICLR 2025, arXiv:2410.18234.

    Examples
    --------
    >>> import otspec
    >>> round(otspec.khisti_alpha2([0.6, 0.3, 0.1], [0.2, 0.3, 0.5]), 12)
    0.69
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    ps, qs, pc = _subset_sums(p_, q_)
    return float(np.min(qs + pc**2 + 2.0 * ps * pc))


def khisti_acceptance_one(p, q, *, normalize: bool = False, tol: float = 1e-12) -> bool:
    r"""Khisti et al.'s condition for acceptance 1 with two identical drafts: :math:`q(S) \ge p(S)^2` for every ``S``.

    Parameters
    ----------
    p : (n,) array_like of float
        Draft distribution.
    q : (n,) array_like of float
        Target distribution.
    normalize : bool, keyword-only
        Rescale ``p`` and ``q`` to sum to 1 instead of refusing.
    tol : float, keyword-only
        Slack allowed in :math:`q(S) \ge p(S)^2 - \mathrm{tol}`.

    Returns
    -------
    bool
        Whether two i.i.d. drafts can be accepted with probability 1.

    Raises
    ------
    ValueError
        ``p`` or ``q`` not distributions of one length (brute force over the
        :math:`2^n` subsets: keep ``n`` small).
    TypeError
        Non-numeric input.

    References
    ----------
    .. [1] Khisti, Ebrahimi, Dbouk, Behboodi, Memisevic, Louizos, "Multi-Draft Speculative Sampling:
       Canonical Architectures and Theoretical Limits", ICLR 2025, arXiv:2410.18234.

    Examples
    --------
    >>> import otspec
    >>> otspec.khisti_acceptance_one([0.5, 0.5], [0.4, 0.6]), otspec.khisti_acceptance_one([0.9, 0.1], [0.5, 0.5])
    (True, False)
    """
    p_, q_ = validate_pair(p, q, normalize=normalize)
    tol = validate_tol(tol)  # NaN answered False and inf True for every pair, None a bare TypeError
    ps, qs, _ = _subset_sums(p_, q_)
    return bool(np.all(qs >= ps**2 - tol))
