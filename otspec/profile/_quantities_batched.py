r"""Batched closed forms of the profile's costly per-position quantities, in the laws' namespace (on their device).

At a profiled position the per-depth acceptance of multi-round sampling, of
greedy and top-k draft sets and of typical acceptance, and the conditional
laws that the expected accepted tokens given the drafts (:math:`E[\tau_L \mid X]`)
of k-Seq, multi-round sampling and typical acceptance need at every node of the
drawn draft tree, all follow from a few passes over ``(rows, V)`` blocks of
the laws. Here they are computed for every depth (and every node of a depth)
at once, in the namespace of the laws (numpy arrays, or torch tensors left on
their device), so that only small arrays of finished values reach the host;
the same arithmetic as the host verifiers of :mod:`otspec.multidraft` and
:mod:`otspec.lossy` (their ``acceptance()`` and ``conditional()``, the
independent route of the tests), on each row renormalised as the host
verifiers' supports are.

Notation: ``p`` is the draft's law, ``q`` the target's.

References
----------
.. [1] Miao et al., "SpecInfer", arXiv:2305.09781 (multi-step speculative sampling: multi-round rejection).
.. [2] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport", arXiv:2310.15141, Algorithm 2 (k-Seq)
   and Algorithm 3 (draft selection along a tree).
.. [3] Hu et al., "Towards Optimal Multi-draft Speculative Decoding", arXiv:2502.18779 (greedy draft sets).
.. [4] Cai et al., "Medusa", arXiv:2401.10774, §3.3.1 (typical acceptance).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from .._array import to_host
from ..decoding._tree_device import ranked_rows_t
from ..lossy._mentored import _LOG_BIG
from ..lossy._typical import VLLM_DEFAULTS
from ..multidraft._batched import (
    _arange,
    _cached,
    _const,
    _is_torch,
    _ratio_sorted,
    _reshape,
    _rho_star_rows,
    _sub_div,
    _take,
    _take_along,
    _tiny_beta_rows,
    _where,
)
from ..multidraft._greedy_drafts import top_tokens

__all__ = ["ACC_BATCHED", "REACH_BATCHED", "REACH_ONE_DRAFT", "RhoStar", "acceptance_rows", "top_ids", "reach_nodes",
           "reach_parts", "node_conditional", "node_rows"]

#: Token-level verifiers whose per-depth acceptance (and, when lossy, the total variation and KL of the output
#: law) :func:`acceptance_rows` computes for every depth at once.
ACC_BATCHED = ("multiround", "greedy-drafts", "top-k", "typical")
#: Token-level verifiers whose conditional law at every node of a draft tree :func:`reach_parts` computes for all
#: the nodes of a depth at once (k-Seq at its exact rho* only: a given ``rho`` is built on the host).
REACH_BATCHED = ("kseq", "multiround", "typical")
#: Token-level verifiers whose conditional law at a node with one draft ``x`` accepts it with the maximal coupling's
#: probability :math:`\min(1, q(x)/p(x))`, computed for every such node of the tree at once (their nodes with several
#: drafts are built on the host): the optimal verifier (Sun et al., SpecTr, arXiv:2310.15141, eq. (4); otspec's
#: priority keys) and Khisti et al.'s canonical decomposition (arXiv:2410.18234, §3) attain :math:`\alpha_1 =
#: \sum_y \min(p(y), q(y))` with one draft, and every coupling of ``p`` and ``q`` that does so has
#: :math:`P(Y = x \mid X = x) = \min(1, q(x)/p(x))` (its mass on the diagonal at ``x`` is at most
#: :math:`\min(p(x), q(x))`, and these sum to :math:`\alpha_1`).
REACH_ONE_DRAFT = ("optimal", "khisti")


def _device(x):
    import array_api_compat

    return array_api_compat.device(x)


def _simplex(A, xp):
    """Each row divided by its sum: the renormalisation of the host verifiers' supports."""
    return A / xp.sum(A, axis=-1, keepdims=True)


def _residual(P, T, xp):
    r"""Row by row :math:`(T - P)_+ / \sum (T - P)_+`, or ``T`` where that has no mass (the host's ``residual``)."""
    r = xp.clip(T - P, 0.0, None)
    s = xp.sum(r, axis=-1, keepdims=True)
    return xp.where(s > 0.0, r / s, T)  # 0 / 0 (NaN, under the callers' errstate) only where T is taken


def top_ids(P, K: int, xp):
    """The ``K`` most likely tokens of every row of ``(..., V)`` laws, most likely first, ties by the lower id.

    The order of :func:`otspec.multidraft._greedy_drafts.top_tokens` (the host verifiers' draft sets): numpy row
    by row with it, a torch tensor on its device by top-``K`` passes
    (:func:`otspec.decoding._tree_device.ranked_rows_t`, no sort of the vocabulary), any other array by a stable
    descending sort. Returns ``(..., K)`` int64 ids in the laws' namespace.
    """
    shape = tuple(P.shape[:-1])
    V = int(P.shape[-1])
    flat = _reshape(P, (math.prod(shape), V), xp)
    if isinstance(P, np.ndarray):
        ids = np.stack([top_tokens(row, K) for row in flat]) if flat.shape[0] else np.zeros((0, K), np.int64)
        return ids.astype(np.int64).reshape(shape + (K,))
    import array_api_compat

    if array_api_compat.is_torch_array(P):
        return _reshape(ranked_rows_t(flat, K)[0], shape + (K,), xp)
    return xp.argsort(P, axis=-1, descending=True, stable=True)[..., :K]


def _count_positive(P, xp, keepdims: bool = False):
    """The number of positive entries of each row, int64 (on torch one sum of the bool array: int64 already)."""
    import array_api_compat

    if array_api_compat.is_torch_array(P):
        return (P > 0.0).sum(-1, keepdim=keepdims)
    return xp.sum(xp.astype(P > 0.0, xp.int64), axis=-1, keepdims=keepdims)


def _multiround(P, Q, ks, xp):
    r""":math:`1 - \prod_{i \le k} (1 - \beta_i)`, :math:`\beta_i = \sum \min(p, q_i)`, :math:`q_{i+1}` the residual."""
    T = [Q]
    for _ in range(max(ks) - 1):
        T.append(_residual(P, T[-1], xp))
    T = xp.stack(T, axis=-2)  # (..., rounds, V): every round's beta at once, each row's sum its own
    logs = xp.log1p(-xp.clip(xp.sum(xp.minimum(P[..., None, :], T), axis=-1), None, 1.0))
    cum = xp.cumulative_sum(logs, axis=-1)  # the host's sum of the k logs, in order
    return _columns(-xp.expm1(cum), ks, xp)


def _columns(A, ks, xp):
    """Columns ``k - 1`` for ``k`` in ``ks`` of ``(..., m)`` values of ``k = 1 .. m``: ``A`` itself when ``ks`` is
    ``1 .. m``."""
    if list(ks) == list(range(1, int(A.shape[-1]) + 1)):
        return A
    return [A[..., k - 1] for k in ks]


def _greedy_drafts(P, Q, ks, xp):
    r""":math:`q(T) + \sum_{x \notin T} \min(p'(x), q(x))`, ``T`` the top ``k - 1`` of ``p``, ``p'`` ``p`` off ``T``
    renormalised (NaN where ``p`` has fewer than ``k`` tokens).

    Every ``k`` of ``2 .. max(ks)`` at once: ``T`` of ``k`` the tokens of ranks ``< k - 1`` (a running count of
    each token's matches with the ranked ids), one ``(..., k, V)`` block of the laws off ``T``, each row's sums its
    own; ``k = 1`` (no ``T``) apart."""
    n = _count_positive_kept(P, xp)
    V = int(P.shape[-1])
    m = min(max(ks), V)  # k > V: undefined (NaN), below
    K = m - 1
    one = xp.sum(xp.minimum(P / xp.sum(P, axis=-1, keepdims=True), Q), axis=-1, keepdims=True)  # k = 1
    if K:
        ids = _top_ids_kept(P, m, xp)[..., :K]  # the top m's first K (top-k's m, ranked once for both)
        qT = xp.cumulative_sum(_take_along(Q, ids, xp), axis=-1)
        pos = _arange(0, V, 1, P, xp)
        inT = _any_so_far(ids[..., None] == pos, xp)  # (..., K, V): ranks < k - 1
        zero = _const(0.0, P)
        law = _where(inT, zero, P[..., None, :], xp)
        last = law / xp.sum(law, axis=-1, keepdims=True)
        # last is 0 on T already (0 / its sum; NaN everywhere where nothing is left, a NaN replaced below)
        val = xp.concat([one, qT + xp.sum(xp.minimum(last, Q[..., None, :]), axis=-1)], axis=-1)
    else:
        val = one
    kk = _arange(1, m + 1, 1, P, xp)
    val = _where(n < kk, _const(math.nan, P), xp.clip(val, None, 1.0), xp)  # (..., m): k = 1 .. m
    if list(ks) == list(range(1, m + 1)):
        return val
    nan = xp.full(tuple(P.shape[:-1]), math.nan, dtype=xp.float64, device=_device(P))
    return [nan if k > V else val[..., k - 1] for k in ks]


#: :func:`_top_ids_kept`' and :func:`_count_positive_kept`' last torch laws (weak references), version and array, by
#: kind: ``{kind: (ref(P), version, K, array)}``.
_LAST_RANKS: dict = {}


def _kept(kind: str, P, K: int, make):
    """``make()`` for ``P``, or for torch laws the array kept from the last call of ``kind`` on the same unwritten
    tensor (its version counter unchanged) with the same ``K``: greedy draft sets and top-k rank and count the same
    renormalised laws of a position (:func:`_simplex_pair` gives both the same tensor) once, not once each."""
    import array_api_compat

    if not array_api_compat.is_torch_array(P):
        return make()
    last = _LAST_RANKS.get(kind)
    if last is not None and last[0]() is P and last[1] == P._version and last[2] == K:
        return last[3]
    out = make()
    _LAST_RANKS[kind] = (weakref.ref(P), P._version, K, out)  # one new tuple: a reader sees the old or the new whole
    return out


def _top_ids_kept(P, K: int, xp):
    """:func:`top_ids` of ``P``, kept (:func:`_kept`): the ``K`` most likely tokens of every row, most likely first,
    ties by the lower id (the first ``K - 1`` of them are :func:`top_ids` with ``K - 1``: the order is total)."""
    return _kept("top", P, K, lambda: top_ids(P, K, xp))


def _count_positive_kept(P, xp):
    """:func:`_count_positive` of ``P`` with ``keepdims``, kept (:func:`_kept`)."""
    return _kept("positive", P, 0, lambda: _count_positive(P, xp, keepdims=True))


def _any_so_far(eq, xp):
    """Whether any of ``eq[..., :i + 1, :]`` is true, for every ``i`` (a running count along axis -2 above 0; on torch
    the bool array counted as it is, int64)."""
    import array_api_compat

    if array_api_compat.is_torch_array(eq):
        return eq.cumsum(-2) > 0
    return xp.cumulative_sum(xp.astype(eq, xp.int64), axis=-2) > 0


def _top_k(P, Q, ks, xp):
    """``q(C)``, ``C`` the top ``k`` of ``p`` (NaN where ``p`` has fewer than ``k`` tokens)."""
    n = _count_positive_kept(P, xp)
    V = int(P.shape[-1])
    m = min(max(ks), V)
    qC = xp.cumulative_sum(_take_along(Q, _top_ids_kept(P, m, xp), xp), axis=-1)
    kk = _arange(1, m + 1, 1, P, xp)
    val = _where(n < kk, _const(math.nan, P), xp.clip(qC, None, 1.0), xp)  # (..., m): k = 1 .. m
    if list(ks) == list(range(1, m + 1)):
        return val
    return [xp.where(n[..., 0] < k, math.nan, val[..., min(k, V) - 1]) for k in ks]


def _typical_rule(Q, xp, options: dict, keepdims: bool = False):
    r"""The threshold :math:`\min(\varepsilon, \delta e^{-H_\gamma(q)})` of every row and its first argmax
    (``(..., 1)`` each with ``keepdims``)."""
    o = {**VLLM_DEFAULTS, **options}
    minus_H = xp.sum(Q * xp.log(Q + o["guard"]), axis=-1, keepdims=keepdims)  # exp(-H) of it: -(-x) is x
    return xp.clip(o["delta"] * xp.exp(minus_H), None, o["epsilon"]), xp.argmax(Q, axis=-1, keepdims=keepdims)


def _h_series(u, xp):
    """:math:`u^2 \\sum_{k \\ge 2} (-u)^{k-2} / k`, the host's series for :math:`u - \\ln(1 + u)` at small ``|u|``
    (finite ``u``).

    The host's Horner steps ``acc = acc * (-u) + 1/k`` from ``acc = 0``, ``k = 18 .. 2``, float for float in two ops
    a step: ``acc * (-u) + c`` is ``c - acc * u`` (a product's negation is exact, ``c + (-x)`` is ``c - x``), and the
    first step gives ``1/18`` exactly (``0 * (-u) + 1/18``), so the second is ``1/17 - u * (1/18)``."""
    acc = 1.0 / 17 - u * (1.0 / 18)
    for k in range(16, 1, -1):
        acc = 1.0 / k - acc * u
    return u * u * acc


def kl_rows(q, pi, xp, keepdims: bool = False):
    r""":math:`\mathrm{KL}(q \| \pi)` of every row, as :func:`otspec.lossy._mentored.kl_divergence` (``inf`` where
    :math:`\pi` misses mass of ``q``), by its non-negative terms :math:`q\,h(\pi/q - 1)` (``(..., 1)`` with
    ``keepdims``)."""
    m = q > 0.0
    miss = xp.any(m & (pi <= 0.0), axis=-1, keepdims=keepdims)
    one, zero = _const(1.0, q), _const(0.0, q)
    qs, ps = _where(m, q, one, xp), _where(m & (pi > 0.0), pi, one, xp)
    # pi / q past 2**1000 may overflow, below 2**-1000 be subnormal (a few bits): that term by logs, as the host's
    # (_kl_terms); the logarithms are the log form's own, so the mask costs what the product test did
    lr = xp.log(ps) - xp.log(qs)
    big = xp.abs(lr) > _LOG_BIG
    qn = _where(big, ps, qs, xp)
    u, v = (ps - qn) / qn, ps / qn
    small = xp.abs(u) < 0.05
    # the series at every u on torch (where u is not small its value, maybe inf or NaN, is not taken; numpy would
    # warn of the overflow)
    h = _where(small, _h_series(u if _is_torch(u) else _where(small, u, zero, xp), xp), u - xp.log(v), xp)
    terms = _where(big, (ps - qs) - qs * lr, q * h, xp)
    # terms is 0 already where q is 0 (qs = ps = 1 there: u = 0, h = 0 * 0 * acc = 0, q * h = 0)
    val = xp.sum(terms, axis=-1, keepdims=keepdims) + xp.sum(_where(m, zero, pi, xp), axis=-1, keepdims=keepdims)
    return _where(miss, _const(math.inf, q), xp.clip(val, 0.0, None), xp)


def _typical(P, Q, xp, options: dict):
    """Typical acceptance's acceptance, and its output law's total variation and KL from ``q``: ``(..., 3)``."""
    thr, y1 = _typical_rule(Q, xp, options, keepdims=True)  # (..., 1) each
    acc = Q > thr
    zero = _const(0.0, P)
    law = _where(acc, P, zero, xp)
    kept = xp.sum(law, axis=-1, keepdims=True)
    rest = xp.clip(1.0 - kept, 0.0, None)
    if _is_torch(law):  # the rest added at y* alone (one op; law + 0 elsewhere is law)
        out = law.scatter_add(-1, y1, rest)
    else:
        out = law + _where(_arange(0, int(P.shape[-1]), 1, P, xp) == y1, rest, zero, xp)
    # p(y*) where y* is not accepted, else 0: P - law is 0 where accepted (p - p) and p elsewhere (p - 0)
    a = xp.clip(kept + _take_along(P - law, y1, xp), None, 1.0)
    tv = 0.5 * xp.sum(xp.abs(out - Q), axis=-1, keepdims=True)
    return xp.concat([a, tv, kl_rows(Q, out, xp, keepdims=True)], axis=-1)


def acceptance_rows(name: str, P, Q, ks, xp, options: dict | None = None):
    r"""Per-depth acceptance of verifier ``name`` for every row of ``(..., V)`` laws and each ``k`` of ``ks``.

    .. math::

        \text{multiround: } 1 - \prod_{i=1}^k \big(1 - \textstyle\sum_x \min(p, q_i)\big),\qquad
        \text{greedy-drafts: } q(T_{k-1}) + \sum_{x \notin T_{k-1}} \min(p', q),\qquad
        \text{top-k: } q(T_k),

        \text{typical: } p(\mathcal A) + p(y^\star)\,\mathbb 1\{y^\star \notin \mathcal A\},
        \ \tfrac12 \lVert r - q \rVert_1,\ \mathrm{KL}(q \| r),

    with :math:`q_1 = q`, :math:`q_{i+1} = (q_i - p)_+ / \sum (q_i - p)_+` (Miao et al.,
    arXiv:2305.09781), :math:`T_m` the ``m`` most likely tokens of ``p`` (ties by the
    lower id) and :math:`p'` the draft law off :math:`T_{k-1}` renormalised (Hu et al.,
    arXiv:2502.18779), :math:`\mathcal A = \{x : q(x) > \min(\varepsilon, \delta e^{-H_\gamma(q)})\}`,
    :math:`y^\star = \arg\max q` and ``r`` the output law of typical acceptance (Cai et al.,
    arXiv:2401.10774, §3.3.1, with vLLM's defaults). The values of the host verifiers'
    ``acceptance()`` (and ``output_law()``) on each row renormalised, to rounding.

    Parameters
    ----------
    name : {"multiround", "greedy-drafts", "top-k", "typical"}
    P, Q : (..., V) float64 arrays of namespace ``xp`` (numpy, torch on any device)
        Draft and target laws (rows summing to 1 up to rounding; zeros and ties allowed).
    ks : sequence of int
        Numbers of drafts (``(1,)`` for ``"typical"``).
    xp : namespace
    options : dict, optional
        ``"typical"``'s ``epsilon``, ``delta``, ``guard`` (vLLM's defaults otherwise).

    Returns
    -------
    (..., len(ks)) array, or (..., 3) for ``"typical"`` (acceptance, total variation, KL)
        float64, namespace and device of ``P``; NaN where the draft set is undefined (fewer than ``k``
        tokens with ``p > 0`` for ``"greedy-drafts"`` and ``"top-k"``).

    Examples
    --------
    >>> import numpy as np, otspec
    >>> from otspec.profile._quantities_batched import acceptance_rows
    >>> P, Q = np.array([[0.6, 0.3, 0.1]]), np.array([[0.2, 0.3, 0.5]])
    >>> acceptance_rows("greedy-drafts", P, Q, (2,), np).round(12).tolist()
    [[0.75]]
    >>> round(otspec.greedy_draft_verifier(P[0], Q[0], 2).acceptance(), 12)
    0.75
    """
    P, Q = _simplex_pair(P, Q, xp)
    with np.errstate(divide="ignore", invalid="ignore"):
        if name == "typical":
            cols = _typical(P, Q, xp, options or {})
        else:
            cols = {"multiround": _multiround, "greedy-drafts": _greedy_drafts, "top-k": _top_k}[name](P, Q, ks, xp)
    return xp.stack(cols, axis=-1) if isinstance(cols, list) else cols  # typical's: (..., 3) already


#: :func:`_simplex_pair`'s last torch laws and their renormalised rows: ``(P, Q, versions, (Ps, Qs))``.
_LAST_SIMPLEX: list = []


def _simplex_pair(P, Q, xp):
    """:func:`_simplex` of ``P`` and ``Q``; for torch tensors the last pair's rows are kept and given again while the
    same two tensors come back unwritten (their version counters unchanged): the verifiers of a position renormalise
    the same laws once, not once each."""
    import array_api_compat

    if not array_api_compat.is_torch_array(P):
        return _simplex(P, xp), _simplex(Q, xp)
    versions = (P._version, Q._version)
    if _LAST_SIMPLEX and _LAST_SIMPLEX[0] is P and _LAST_SIMPLEX[1] is Q and _LAST_SIMPLEX[2] == versions:
        return _LAST_SIMPLEX[3]
    out = (_simplex(P, xp), _simplex(Q, xp))
    _LAST_SIMPLEX[:] = [P, Q, versions, out]
    return out


def reach_nodes(X: np.ndarray, groups, L: int) -> list[tuple[tuple[int, ...], int]]:
    """Every node ``(alive rows, depth)`` of the draft trees of ``groups`` (lists of rows of ``X``), depths ``< L``:
    the rows that share the prefix ``X[r, :depth]``, split by their next token (in increasing order)."""
    seen: dict = {}
    stack = [(tuple(g), 0) for g in groups]
    while stack:
        alive, j = stack.pop()
        if j == L or (alive, j) in seen:
            continue
        seen[(alive, j)] = None
        toks = X[list(alive), j]
        for y in np.unique(toks).tolist():
            stack.append((tuple(r for r, t in zip(alive, toks.tolist()) if t == y), j + 1))
    return sorted(seen, key=lambda node: (node[1], node[0]))


def reach_parts(name: str, P, Q, X: np.ndarray, nodes, xp, options: dict | None = None, rho=None, *,
                block: int | None = None, flat: bool = False):
    r"""Each node's per-draft acceptance and final law at its drafts, for every node of a draft tree at once.

    .. math::

        K(y \mid x_1..x_n) = \sum_{i=1}^n \Big[\prod_{l<i} (1 - a_l)\Big] a_i \mathbb 1\{y = x_i\}
        + \prod_{i=1}^n (1 - a_i)\, r(y),

    the exact conditional law of ``name`` at a node with ``n`` drafts (``conditional()`` of
    the host verifiers): k-Seq (Sun et al., arXiv:2310.15141, Algorithm 2) at its exact
    :math:`\rho^*` for ``n`` drafts, :math:`a_i = \min(1, q(x_i)/(\rho^* p(x_i)))`,
    ``r`` its residual (SpecTr eq. 5); multi-round rejection (Miao et al., arXiv:2305.09781),
    :math:`a_i = \min(1, q_i(x_i)/p(x_i))`, :math:`r = q_{n+1}`; typical acceptance (one draft),
    :math:`a_1 = \mathbb 1\{x_1 \in \mathcal A\}`, :math:`r = \mathbb 1\{\cdot = y^\star\}`.
    Computed for every depth at once: one ``(laws, V)`` block of the distinct prefixes of
    every depth (one sort of the ratios for k-Seq's :math:`\rho^*` of every number of drafts
    and depth), every node's values gathered from it (each row's arithmetic is the row's
    alone, so a depth's values are those of a block of that depth alone);
    :func:`node_conditional` finishes each node's law at its drafts on the host. The tree's
    structure is read from the host's ``X``: the index arrays go to the laws' device in one
    copy.

    Parameters
    ----------
    name : {"kseq", "multiround", "typical"}
    P, Q : (R, >= L, V) float64 arrays of namespace ``xp``
        The laws along the ``R`` drafted rows (``P[r, j] = p(. | c, X[r, :j])``).
    X : (R, >= L) ndarray of int (host memory)
        The drafts.
    nodes : list of (tuple of int, int)
        :func:`reach_nodes`' output (every node's rows share the prefix of its depth).
    xp : namespace
    options : dict, optional
        ``"typical"``'s options.
    rho : RhoStar, optional
        The position's gathered k-Seq :math:`\rho^*` requests: this tree's are added to it, and a function
        returning the array is returned instead (call it after ``rho.solve()``).
    block : int, optional, keyword-only
        Rows per prompt when ``X`` stacks several prompts' drafts (rows ``i * block`` to ``(i + 1) * block - 1``
        prompt ``i``'s): a prefix's law is then its own prompt's.
    flat : bool, keyword-only
        Return the ``(2, len(nodes) * n_max)`` array the values are computed in (no device op to lay them out by
        node: the caller reshapes its host copy, :func:`node_rows`).

    Returns
    -------
    (len(nodes), 2, n_max) array of float64, namespace and device of ``P``
        ``[i, 0, l]``: :math:`a_l` of the ``l``-th draft of node ``i``; ``[i, 1, l]``: ``r`` at that draft
        (entries past the node's number of drafts are padding). With ``flat``, ``(2, len(nodes) * n_max)``:
        ``[0, i * n_max + l]`` and ``[1, i * n_max + l]``.
    """
    V = int(P.shape[-1])
    n_max = max(len(a) for a, _ in nodes)
    pack = _Pack()
    laws: dict = {}  # the host's part: which laws (a prefix at a depth: its first row), nodes, drafts and instances
    lw = np.empty(len(nodes), dtype=np.int64)
    for i, (a, j) in enumerate(nodes):
        key = (a[0] // block if block else 0, tuple(X[a[0], :j].tolist()), j)
        lw[i] = laws.setdefault(key, (len(laws), a[0] * int(P.shape[1]) + j, a[0] * int(Q.shape[1]) + j))[0]
    n = np.array([len(a) for a, _ in nodes], dtype=np.int64)
    toks = np.array([[X[a[min(i, len(a) - 1)], j] for i in range(n_max)] for a, j in nodes], dtype=np.int64)
    plan = _PLANS[name](pack, lw, n, toks, len(laws), V)
    at_p, at_q = pack.add([v[1] for v in laws.values()]), pack.add([v[2] for v in laws.values()])
    idx = pack.send(xp, P)  # one copy of every index array to the laws' device
    solver = RhoStar(xp) if rho is None else rho
    with np.errstate(divide="ignore", invalid="ignore"):  # every depth's laws in one block, in the nodes' order
        Pj, Qj = _node_laws(P, Q, idx[at_p], idx[at_q], [v[1:] for v in laws.values()], xp)
        staged = _kseq_stage(Pj, Qj, plan, idx, xp, solver) if name == "kseq" else None

    def finish():
        with np.errstate(divide="ignore", invalid="ignore"):  # (2, nodes n_max): every draft of every node
            out = _PARTS[name](Pj, Qj, plan, idx, xp, options or {}, (solver, staged))
        return out if flat else xp.permute_dims(xp.reshape(out, (2, len(nodes), n_max)), (1, 0, 2))

    return finish if rho is not None else finish()


#: :func:`_node_laws`' last torch laws (weak references), their version counters and rows, and its two blocks:
#: ``[(ref(P), ref(Q), key, blocks)]`` (one slot, None before the first call).
_LAST_NODE_LAWS: list = [None]


def _node_laws(P, Q, at_p, at_q, rows: list, xp):
    """The rows ``at_p`` of ``P`` and ``at_q`` of ``Q`` (flat row indices on the laws' device; ``rows`` their host
    copy, ``[(p row, q row), ...]``), each renormalised (:func:`_simplex`). For torch tensors the last call's blocks
    are given again while the same two tensors come back unwritten at the same rows: the node laws of a position's
    token-level families (k-Seq, multi-round, typical: the same nodes) are gathered and renormalised once."""
    V = int(P.shape[-1])
    import array_api_compat

    torch_laws = array_api_compat.is_torch_array(P)
    if torch_laws:
        key = (P._version, Q._version, tuple(rows))
        last = _LAST_NODE_LAWS[0]
        if last is not None and last[0]() is P and last[1]() is Q and last[2] == key:
            return last[3]
    out = (_simplex(_take(xp.reshape(P, (-1, V)), at_p, xp, 0), xp),
           _simplex(_take(xp.reshape(Q, (-1, V)), at_q, xp, 0), xp))
    if torch_laws:  # one new tuple in the slot: a reader in another thread sees the old entry or the new one whole
        _LAST_NODE_LAWS[0] = (weakref.ref(P), weakref.ref(Q), key, out)  # the laws themselves not kept alive
    return out


#: The device copies of :meth:`_Pack.send` with ``static``, by content and device (bounded: cleared when full).
_SENT: dict = {}
_MAX_SENT = 256


class _Pack:
    """Host int arrays gathered for one copy to the device: ``add`` gives a handle, ``send`` the arrays there."""

    def __init__(self):
        self.arrays: list[np.ndarray] = []

    def add(self, a) -> int:
        self.arrays.append(np.asarray(a, dtype=np.int64))
        return len(self.arrays) - 1

    def send(self, xp, like, *, static: bool = False) -> list:
        """The arrays on ``like``'s device, in one copy; ``static``: indices that recur from one position to the next
        (a plan's tree layouts), copied once per run and device and reused (the tensors are never written)."""
        if not static:
            return self._send(xp, like)
        key = (str(_device(like)), tuple((a.shape, a.tobytes()) for a in self.arrays))
        got = _SENT.get(key)
        if got is None:
            if len(_SENT) >= _MAX_SENT:
                _SENT.clear()
            got = _SENT[key] = self._send(xp, like)
        return got

    def _send(self, xp, like) -> list:
        flat = np.concatenate([a.ravel() for a in self.arrays]) if self.arrays else np.zeros(0, np.int64)
        dev = xp.asarray(flat, device=_device(like))
        if hasattr(dev, "split_with_sizes"):  # torch: every piece in one op, 1-D pieces as they come
            return [p if a.ndim == 1 else p.reshape(a.shape)
                    for a, p in zip(self.arrays, dev.split_with_sizes([a.size for a in self.arrays]))]
        out, at = [], 0
        for a in self.arrays:
            out.append(xp.reshape(dev[at:at + a.size], a.shape))
            at += a.size
        return out


class RhoStar:
    r"""k-Seq's :math:`\rho^*` requests of a position, gathered and solved in one search.

    .. math::

        \rho^*_i = \min\{\rho \ge 1 : 1 - (1 - \beta_i(\rho))^{k_i} \le \rho\, \beta_i(\rho)\}

    for every row ``i`` of every block added (SpecTr, Sun et al., arXiv:2310.15141, Algorithm 2): ``add`` a block of
    rows (the laws ``(P, Q)``, ``(n, V)`` each, or their sorted form :func:`otspec.multidraft._batched._ratio_sorted`)
    with one number of drafts per row, ``solve`` once (:func:`otspec.multidraft._batched._rho_star_rows` on the
    blocks' rows stacked: the per-depth acceptances and the draft tree's nodes of every depth and prompt of a position
    in one pass of a fixed number of ops, instead of one per block and number of drafts; blocks of laws are stacked
    first and every row's ratios sorted at once), then ``get`` each block's ``(rho, E(rho))``, ``(n,)`` each. Every
    row's values are those of a call for its rows and ``k`` alone (the same per-row arithmetic; torch's ``pow`` may
    round the last bit differently where a row lands on another lane of its vectorised kernel: within 1e-15
    relative). Every row's :math:`\beta(\rho^*)` comes with them (:attr:`beta`); on a device the rows whose
    :math:`\beta(\rho^*)` is tiny are solved again exactly on the host when :meth:`check_part`'s array is read
    (with the position's values, stored before them), and the values computed from the solver's rows are then
    computed again (:meth:`refreshed`): every row within a few ulps of the exact root, as on numpy.
    """

    _ROWS = ("P2", "Q2", "D1", "E1", "ro", "Pcum", "Qcum", "Pp", "Qp", "Ps", "Qs", "tot_p", "tot_q")

    def __init__(self, xp, *, tiny_beta: bool = False):
        self.xp = xp
        self.tiny_beta = tiny_beta  # a device's tiny-beta rows by the second search on the device (no check_part)
        self.blocks: list = []
        self.got: list | None = None

    def add(self, S, ks, kf=None) -> int:
        """A block of rows: ``S`` the laws ``(P, Q)`` (``(n, V)`` each, the laws' namespace) or their sorted form
        (a dict of :func:`~otspec.multidraft._batched._ratio_sorted`), with ``k`` drafts each (``ks`` an int) or
        ``kf`` (``(n,)`` float64, the laws' namespace) of the distinct ints ``ks`` (each ``>= 2``); its handle."""
        if self.got is not None:
            raise RuntimeError("RhoStar.add after solve")
        xp = self.xp
        n, like = (int(S[0].shape[0]), S[0]) if isinstance(S, tuple) else (S["B"], S["P2"])
        if kf is None:
            ks = (int(ks),)
            kf = _full_k(n, ks[0], like, xp)
        self.blocks.append((S, kf, tuple(int(k) for k in ks), n))
        return len(self.blocks) - 1

    def solve(self) -> None:
        if self.got is not None:
            return
        self.got = []
        if not self.blocks:
            return
        xp = self.xp
        ks = sorted({k for _, _, kk, _ in self.blocks for k in kk})
        sizes = [n for *_, n in self.blocks]
        if all(isinstance(b[0], tuple) for b in self.blocks):  # laws: stacked, then one sort of every row's ratios
            S = _ratio_sorted(*(_concat([b[0][i] for b in self.blocks], xp) for i in (0, 1)), xp)
        else:
            got = [_ratio_sorted(*b[0], xp) if isinstance(b[0], tuple) else b[0] for b in self.blocks]
            S = got[0] if len(got) == 1 else dict({key: xp.concat([g[key] for g in got], axis=0) for key in self._ROWS},
                                                 shape=(sum(sizes),), B=sum(sizes), V=got[0]["V"])
        kf = _concat([b[1] for b in self.blocks], xp)
        k = (kf, ks) if len(ks) > 1 else ks[0]
        # tiny_beta off (the default): a device's rows keep the float test here (the second search in the
        # c(beta) - rho form would double this solve's ops at every position); the rows it places only to more than
        # 256 ulps are found on the host from beta(rho*), read with the position's values (check_part), and solved
        # again there. Numpy rows take the per-row search in _rho_star_rows itself.
        rho, E, beta = _rho_star_rows(None, None, k, xp, S, tiny_beta=self.tiny_beta, beta=True)
        n = sum(sizes)
        rho, E, beta = (_reshape(a, (n,), xp) for a in (rho, E, beta))
        self._solved = (S, kf, k, rho, E)
        self.beta = beta
        self.beta_host = beta if isinstance(beta, np.ndarray) else None
        self._split(rho, E)

    def _split(self, rho, E) -> None:
        """``self.got``: each block's rows of the solver's ``(rho, E)``."""
        sizes = [n for *_, n in self.blocks]
        self.got = []
        if len(sizes) > 1 and hasattr(rho, "split_with_sizes"):  # torch: each block's rows in one op per array
            self.got.extend(zip(rho.split_with_sizes(sizes), E.split_with_sizes(sizes)))
            return
        at = 0
        for n in sizes:
            self.got.append((rho[at:at + n], E[at:at + n]))
            at += n

    def rows(self, i: int) -> slice:
        """Block ``i``'s rows among the solver's (of :attr:`beta`, :attr:`beta_host`)."""
        at = sum(b[3] for b in self.blocks[:i])
        return slice(at, at + self.blocks[i][3])

    #: Set by the store of :meth:`check_part` when some row was solved again: the values computed from the rows
    #: before (k-Seq's parts of the position) are then computed again (:meth:`refreshed`).
    fixed = False

    def check_part(self):
        r"""``(beta, store)`` for :func:`otspec.profile._quantities.read_parts`, or None (numpy laws, no rows): the
        solver's :math:`\beta(\rho^*)` of every row (the array :meth:`solve` computed: no op), whose store, run
        before any store of a value that depends on :math:`\rho^*`, keeps its host copy (:attr:`beta_host`), finds
        the rows where the float test :math:`D > E^k` places the root only to more than 256 ulps
        (:math:`\beta(\rho^*)` tiny), solves those rows again exactly on the host
        (:func:`otspec.multidraft._kseq._rho_star_exact`, per row) and puts their :math:`\rho^*`,
        :math:`E(\rho^*)` and :math:`\beta(\rho^*)` in place (:attr:`fixed`).

        The float test flags a row only where :math:`D + k E^k > 256 \rho \beta`; as :math:`D \le \sum q`,
        :math:`E \le \sum p` and :math:`\rho \ge 1`, that needs :math:`\beta < (\sum q + k (\sum p)^k) / 256`,
        below :math:`(k + 1) / 128` on laws that sum to 1: only the rows below that (none, where the laws overlap by
        more) are copied to the host, in a read of their own, and tested there as
        :func:`otspec.multidraft._batched._tiny_beta_rows` tests them; every other row keeps its bits."""
        if not self.blocks or self.got is None or self.tiny_beta or isinstance(self.beta, np.ndarray):
            return None
        return self.beta, self._check

    def _k_rows(self, n: int) -> np.ndarray:
        """Every row's number of drafts (host float64)."""
        k = self._solved[2]
        return to_host(self._solved[1]).reshape(-1) if isinstance(k, tuple) else np.full(n, float(k))

    def _check(self, beta_host: np.ndarray) -> None:
        xp = self.xp
        beta_host = np.array(beta_host, dtype=np.float64)
        self.beta_host = beta_host
        k = self._solved[2]
        k_max = max(k[1]) if isinstance(k, tuple) else k
        cand = np.flatnonzero(beta_host < (k_max + 1.0) / 128.0)  # each row's own k read only past this test
        if cand.size == 0:
            return
        k_rows = self._k_rows(beta_host.shape[0])
        S, kf, k, rho, E = self._solved
        dev = _device(rho)
        at = xp.asarray(cand, device=dev)
        P2, Q2 = to_host(_take(S["P2"], at, xp, 0)), to_host(_take(S["Q2"], at, xp, 0))
        r0 = to_host(_take(rho, at, xp, 0)).reshape(-1, 1)
        kc = k_rows[cand].reshape(-1, 1)
        r1 = _tiny_beta_rows(P2, Q2, r0, (kc, None) if isinstance(k, tuple) else k, kc)
        moved = np.flatnonzero(r1[:, 0] != r0[:, 0])
        if moved.size == 0:
            return
        at = xp.asarray(cand[moved], device=dev)
        r = r1[moved]
        new = xp.asarray(r[:, 0], device=dev)
        with np.errstate(divide="ignore", invalid="ignore"):  # E(rho*) of those rows as _rho_star_rows forms it
            E_new = xp.sum(xp.clip(_sub_div(_take(S["P2"], at, xp, 0), _take(S["Q2"], at, xp, 0), new[:, None], xp),
                                   0.0, None), axis=-1)
            beta_host[cand[moved]] = np.minimum(P2[moved], Q2[moved] / r).sum(axis=-1)
        rho, E = _put_rows(rho, at, new, xp), _put_rows(E, at, E_new, xp)
        self._solved = (S, kf, k, rho, E)
        self._split(rho, E)
        self.fixed = True

    def refreshed(self, compute, store):
        """``store`` of a part whose array ``compute()`` gave from this solver's values: given the values computed
        again (and read on their own) when :meth:`check_part`'s store solved some row again, else the values
        read."""
        host_fix = getattr(compute, "host_fix", None)

        def put(vals):
            if self.fixed:
                vals = to_host(compute()).reshape(vals.shape)
            store(vals if host_fix is None else host_fix(vals))
        return put

    def get(self, i: int):
        """Block ``i``'s ``(rho, E(rho))`` (solving first if not yet solved)."""
        self.solve()
        return self.got[i]


def _put_rows(A, at, vals, xp):
    """A copy of the 1-D ``A`` with ``A[at] = vals`` (``at`` distinct indices); ``A`` itself is not written."""
    if _is_torch(A):
        return A.index_put((at,), vals)
    out = xp.asarray(A, copy=True)
    out[at] = vals
    return out


def _full_k(n: int, k: int, like, xp):
    """``(n,)`` float64 ``k`` on ``like``'s device (a block's numbers of drafts); on torch made there once per run
    (never written: :meth:`RhoStar.solve` concatenates it)."""
    import array_api_compat

    if not array_api_compat.is_torch_array(like):
        return xp.full((n,), float(k), dtype=xp.float64, device=_device(like))
    import torch

    dev = like.device
    return _cached(("k", n, k, str(dev)), lambda: torch.full((n,), float(k), dtype=torch.float64, device=dev))


def _ones(n: int, like, xp):
    """``(n,)`` float64 ones on ``like``'s device; on torch made there once per run and ``n`` (never written: read or
    concatenated)."""
    import array_api_compat

    if not array_api_compat.is_torch_array(like):
        return xp.ones(n, dtype=xp.float64, device=_device(like))
    import torch

    dev = like.device
    return _cached(("ones", n, str(dev)), lambda: torch.ones(n, dtype=torch.float64, device=dev))


def _concat(arrays: list, xp):
    """``arrays`` concatenated along their first axis (the one array itself, no copy, when alone)."""
    return arrays[0] if len(arrays) == 1 else xp.concat(arrays, axis=0)


def _flat_at(A, idx, xp):
    """``A.reshape(-1)[idx]``: values of a ``(..., V)`` block at flat indices (an int array of namespace ``xp``)."""
    return _take(A, idx, xp)


def _kseq_plan(pack, lw, n, toks, I, V):
    """The instances (law, number of drafts) of k-Seq at the nodes (those with one draft first: their rho* is 1), the
    laws of those with several, and the drafts' flat indices."""
    inst = sorted({(int(c), int(li)) for li, c in zip(lw, n)})  # (number of drafts, law), by number of drafts
    index = {key: i for i, key in enumerate(inst)}
    ones = sum(c == 1 for c, _ in inst)
    ni = np.array([index[(int(cc), int(li))] for li, cc in zip(lw, n)], dtype=np.int64)
    return dict(ones=ones, ks=tuple(sorted({c for c, _ in inst[ones:]})), ilaw=pack.add([li for _, li in inst]),
                several=pack.add([li for _, li in inst[ones:]]) if ones < len(inst) else None,
                kf=pack.add([c for c, _ in inst]), ni=pack.add(np.repeat(ni, toks.shape[1])),
                at=pack.add((ni[:, None] * V + toks).ravel()))


def _kseq_stage(Pj, Qj, plan, idx, xp, solver: RhoStar):
    """The instances with several drafts handed to ``solver`` (their laws' rows, sorted with the solver's other
    requests): ``(handle, kf)``, ``kf`` every instance's number of drafts as float64 when they differ (else None:
    made again by :func:`_kseq_parts`)."""
    if plan["several"] is None:
        return None
    m = idx[plan["several"]]
    ks = plan["ks"]
    rows = (_take(Pj, m, xp, 0), _take(Qj, m, xp, 0))
    if len(ks) > 1:  # every instance's number of drafts, kept for _kseq_parts
        kf = xp.astype(idx[plan["kf"]], xp.float64)
        return solver.add(rows, ks, kf[plan["ones"]:]), kf
    return solver.add(rows, ks[0]), None


def _kseq_parts(Pj, Qj, plan, idx, xp, options, staged=None):
    """k-Seq's per-draft acceptance and residual at the drafts of each node (its laws ``lw``, ``n`` drafts), the
    :math:`\\rho^*` of the instances with several drafts from ``staged`` (``(solver, (handle, kf))`` of
    :func:`_kseq_stage`)."""
    kf = None
    rho = [_ones(plan["ones"], Pj, xp)] if plan["ones"] else []
    if staged is not None and staged[1] is not None:
        handle, kf = staged[1]
        rho.append(staged[0].get(handle)[0])
    if kf is None:
        kf = xp.astype(idx[plan["kf"]], xp.float64)
    rho1 = _concat(rho, xp)  # (instances,)
    rho = rho1[:, None]  # (instances, 1)
    il = idx[plan["ilaw"]]
    Pi, Qi = _take(Pj, il, xp, 0), _take(Qj, il, xp, 0)
    # _kseq_parts of otspec.multidraft._kseq, row by row: beta, E, p_acc, c = min(p_acc / beta, rho), the residual
    mins = xp.minimum(Pi, Qi / rho)
    beta = xp.sum(mins, axis=-1)
    E = xp.sum(Pi - mins, axis=-1)
    # (the host's guards, beta capped at 1 and 1 in place of a zero beta, only change values the wheres do not
    # take; no clip of the residual at 0: c <= rho, so q - p c >= q - rho p >= 0 where q >= rho p (rounding is
    # monotone) and 1 - c / rho >= 0 elsewhere)
    p_acc = -xp.expm1(kf * xp.where(beta < 0.5, xp.log1p(-beta), xp.log(E)))
    pos = beta > 0.0
    c = xp.minimum(xp.where(pos, p_acc / beta, kf), rho1)[:, None]
    rp = rho * Pi
    v = xp.where(Qi >= rp, Qi - Pi * c, Qi * (1.0 - c / rho))
    total = xp.sum(v, axis=-1)
    at, ni = idx[plan["at"]], idx[plan["ni"]]
    rp, qx, vx = (_flat_at(A, at, xp) for A in (rp, Qi, v))  # rho p at every draft (its instance's rho)
    t_n = _take(total, ni, xp, 0)  # every draft's instance's
    a = _where(qx >= rp, _const(1.0, Pi), qx / rp, xp)
    live = t_n > 0.0
    res = xp.where(live, vx / t_n, qx)
    return xp.stack([a, res], axis=0)


def _multiround_plan(pack, lw, n, toks, I, V):
    """The rounds' flat indices at each node's drafts: round ``i`` at draft ``i``, the last round at every draft."""
    rounds = np.minimum(np.arange(toks.shape[1]), n.max())[None, :]
    return dict(n_max=int(n.max()), t=pack.add(((rounds * I + lw[:, None]) * V + toks).ravel()),
                d=pack.add((lw[:, None] * V + toks).ravel()), last=pack.add(((n[:, None] * I + lw[:, None]) * V + toks).ravel()))


def _multiround_parts(Pj, Qj, plan, idx, xp, options, staged=None):
    """Multi-round rejection's per-round acceptance at each draft and the final residual at the drafts."""
    T = [Qj]
    for _ in range(plan["n_max"]):
        T.append(_residual(Pj, T[-1], xp))
    T = xp.stack(T, axis=0)  # (n_max + 1, laws, V): q_1 = q, q_2, ...
    t, d, last = _flat_at(T, idx[plan["t"]], xp), _flat_at(Pj, idx[plan["d"]], xp), _flat_at(T, idx[plan["last"]], xp)
    return xp.stack([_where(t >= d, _const(1.0, Pj), t / d, xp), last], axis=0)


def _typical_plan(pack, lw, n, toks, I, V):
    return dict(lw=pack.add(np.repeat(lw, toks.shape[1])), at=pack.add((lw[:, None] * V + toks).ravel()),
                x=pack.add(toks.ravel()))


def _typical_parts(Pj, Qj, plan, idx, xp, options, staged=None):
    """Typical acceptance at each node's one draft: accepted (1 or 0), and whether it is the replacement token."""
    thr, y = _typical_rule(Qj, xp, options)
    lw = idx[plan["lw"]]  # (nodes n_max,): each draft's law
    qx = _flat_at(Qj, idx[plan["at"]], xp)
    a = qx > _take(thr, lw, xp, 0)
    r = idx[plan["x"]] == _take(y, lw, xp, 0)
    return xp.astype(xp.stack([a, r], axis=0), xp.float64)  # both tests at once: 1.0 or 0.0


_PLANS = {"kseq": _kseq_plan, "multiround": _multiround_plan, "typical": _typical_plan}
_PARTS = {"kseq": _kseq_parts, "multiround": _multiround_parts, "typical": _typical_parts}


def node_rows(vals: np.ndarray, n_nodes: int) -> np.ndarray:
    """:func:`reach_parts`' ``flat`` values (host memory) laid out by node, ``(n_nodes, 2, n_max)`` (a view)."""
    return np.moveaxis(vals.reshape(2, n_nodes, -1), 0, 1)


def node_conditional(part: np.ndarray, toks) -> list[tuple[int, float]]:
    """A node's output law at its distinct drafts (increasing ids) from its :func:`reach_parts` row ``part``
    (``(2, n_max)``, host memory) and its ``n`` drafts ``toks``: the sum of ``conditional()`` of the host verifiers,
    in their order of operations."""
    toks = [int(t) for t in toks]
    out = dict.fromkeys(toks, 0.0)
    rem = 1.0
    for i, x in enumerate(toks):
        a = float(part[0, i])
        out[x] += rem * a
        rem *= 1.0 - a
        if rem == 0.0:
            break
    else:
        for i, x in enumerate(toks):
            if toks.index(x) == i:
                out[x] += rem * float(part[1, i])
    return sorted(out.items())
