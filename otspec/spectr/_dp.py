r"""The best block efficiency any per-position plan can reach in DraftSelection (dynamic programming).

Beyond the paper. Algorithm 3 applies, at every position, *some* coupling of
:math:`p^{\otimes k}` and ``q``; any choice keeps Theorem 2. What follows a
position depends only on the output :math:`Y` and on how many drafts agree
with it (their continuations are fresh i.i.d. draws), so the value of a
state (context, depth, surviving nodes) satisfies a Bellman equation whose
one-step problem is a transportation LP with a count-dependent reward:

.. math::

    V(c, d, m) = \max_{\pi \in \Pi(P_M, q)} \sum_{M, y} \pi(M, y)\,
    \big(1 + \mathbb 1\{n_y(M) \ge 1\}\, V^+(c y, d + 1, n_y(M))\big),

over multisets ``M`` of the :math:`k = m k_{d+1}` draft tokens (law
:math:`P_M`), with :math:`V^+ = V` before the last position and ``1`` (the
bonus token) at it. Per-position optimal plans (the OTM-k LP) maximise
only :math:`P(n_Y(M) \ge 1)` and can lose to k-Seq; this optimum dominates
every verifier and is non-decreasing in ``K`` for i.i.d. drafts.
"""

from __future__ import annotations

import math

import numpy as np

from .._validation import validate_positive_int
from ..otm._highs import solve_lp
from ..otm._multisets import multiset_law
from ._common import context_key, next_dist, validate_branching, validate_models, validate_prefix
from ._exact import MAX_NODES, _check_sizes

__all__ = ["optimal_block_efficiency"]

#: Default largest number of LP variables (multisets x tokens) of one position.
MAX_DP_VARIABLES = 200_000


def _transport_max(weights: np.ndarray, q: np.ndarray, reward: np.ndarray) -> float:
    r"""max sum pi * reward over partial couplings of (weights, q), as a certified upper bound.

    The LP is :math:`\max \sum \pi r` s.t. row sums :math:`\le w`, column sums
    :math:`\le q`, :math:`\pi \ge 0` (partial transport), solved and
    re-checked by the package's one HiGHS helper. Its primal value can sit below
    the optimum by the solver's tolerances (3.7e-9 was seen: an "optimum" below
    a verifier's achieved block efficiency). So the value returned is the dual
    objective :math:`w \cdot u + q \cdot v` of the solver's dual solution
    *repaired to exact feasibility* (:math:`v \leftarrow \max(v, 0)`,
    :math:`u_M \leftarrow \max(0, \max_y r_{My} - v_y)`): by weak duality
    it is never below the optimum (up to float rounding), and it exceeds the
    primal value by at most the solver's duality gap.
    """
    r, n = reward.shape
    nv = r * n
    index = np.empty(2 * nv, dtype=np.int32)
    index[0::2] = np.repeat(np.arange(r), n)
    index[1::2] = r + np.tile(np.arange(n), r)
    starts = np.arange(0, 2 * nv + 1, 2)
    rhs = np.concatenate([weights, q])
    sol = solve_lp(reward.ravel(), starts, index, np.ones(2 * nv), np.full(r + n, -np.inf), rhs)
    sol.raise_for_status("SpecTr transport LP")
    y = np.maximum(sol.row_dual, 0.0)  # maximisation: HiGHS's duals of the <= rows are >= 0
    v = y[r:]
    u = np.maximum((reward - v[None, :]).max(axis=1), 0.0)
    bound = math.fsum(np.concatenate([weights * u, q * v]).tolist())
    return bound


def optimal_block_efficiency(
    draft,
    target,
    k,
    L,
    *,
    branching=None,
    prefix=(),
    max_variables: int = MAX_DP_VARIABLES,
    max_nodes: int = MAX_NODES,
    cache: dict | None = None,
) -> float:
    r"""The largest block efficiency of DraftSelection over all per-position plans (exact DP).

    .. math::

        \max_{\pi_1, \pi_2, \dots} \mathbb E[\tau],

    each :math:`\pi_t` a coupling of the live drafts' law
    :math:`\mathcal M_s(\cdot \mid \text{prefix})^{\otimes k}` and
    :math:`\mathcal M_b(\cdot \mid \text{prefix})` chosen with knowledge of
    the history, solved by backward induction over (context, depth,
    surviving nodes) with one transportation LP per state (see the module
    notes). Every verifier's :func:`block_efficiency` is at most this value
    up to float rounding: each one-step LP's value is a certified upper bound
    (the solver's dual solution repaired to exact feasibility, weak duality),
    above the true optimum by at most the solver's duality gap (below 1e-9).

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching; None: i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    max_variables : int, keyword-only
        Refuse a position whose LP would have more variables (multisets of
        the live drafts times tokens), checked a priori with ``|supp p| = V``.
    max_nodes : int, keyword-only
        As in :func:`length_law`.
    cache : dict or None, keyword-only
        A dict to keep state values in across calls (e.g. one call per
        context); entries are keyed by the models' identities and the
        branching, so one dict may serve several pairs.

    Returns
    -------
    float
        The optimum :math:`\mathbb E[\tau]`.

    Raises
    ------
    ValueError
        Invalid inputs or an LP / recursion above the stated limits.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import block_efficiency, optimal_block_efficiency
    >>> draft, target = MemorylessModel([0.5, 0.3, 0.2]), MemorylessModel([0.2, 0.3, 0.5])
    >>> best = optimal_block_efficiency(draft, target, 2, 3)
    >>> bool(best >= block_efficiency(draft, target, 2, 3, verifier="lp") - 1e-9)
    True
    """
    K = k  # SpecTr's letter for the number of draft sequences
    n = validate_models(draft, target)
    ks = validate_branching(K, L, branching)
    ctx0 = validate_prefix(prefix, n)
    max_variables = validate_positive_int(max_variables, "max_variables")
    max_nodes = validate_positive_int(max_nodes, "max_nodes")

    class _Sym:
        symmetric, sequential = True, False

    _check_sizes(draft, target, n, ks, _Sym, max(1, max_variables // n), max_nodes,
                 limit_name="`max_variables` // V")  # the parameter of this function, not block_efficiency's
    memo: dict = {} if cache is None else cache
    if not isinstance(memo, dict):
        raise TypeError(f"`cache` must be a dict or None, got {type(cache).__name__}")

    def value(ctx, d, m):
        key = (id(draft), id(target), ks, context_key(draft, ctx), context_key(target, ctx), d, m)
        v = memo.get(key)
        if v is not None:
            return v
        p = next_dist(draft, ctx, n, "draft")
        q = next_dist(target, ctx, n, "target")
        law = multiset_law(p, m * ks[d])
        counts, weights = law.counts(), law.weights
        cont = np.ones((n, counts.max() + 1))  # cont[y, c]: tokens from here on, given (y, c)
        for y in range(n):
            for c in range(1, cont.shape[1]):
                if np.any(counts[:, y] == c):
                    cont[y, c] = 2.0 if d + 1 == len(ks) else 1.0 + value(ctx + (y,), d + 1, c)
        reward = cont[np.arange(n)[None, :], counts]
        v = _transport_max(weights, q, reward)
        memo[key] = v
        return v

    return value(ctx0, 0, 1)
