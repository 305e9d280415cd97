r"""Exact analysis of SpecTr by enumeration: the law of the decoded tokens, Theorem 2, block efficiency.

The recursion behind every function here: at a position with context
:math:`c`, ``m`` surviving tree nodes and branching factor :math:`k_{d+1}`,
the :math:`k = m\,k_{d+1}` draft tokens are i.i.d. :math:`p = \mathcal
M_s(\cdot \mid c)` and the verifier outputs :math:`Y`. Only the joint law
:math:`W(y, j) = P(Y = y,\ \#\{i : X_i = y\} = j)` matters for what follows
(:meth:`VerifierFactory.step_law`): with :math:`j = 0` the block ends on a
correction token; with :math:`j \ge 1` the ``j`` surviving nodes carry
fresh i.i.d. subtrees, so the process restarts at context :math:`(c, y)`
with ``j`` nodes (or, at the last position, emits the bonus token). The
future therefore depends only on (context, depth, number of surviving
nodes), whatever the verifier: order-dependent verifiers (k-Seq,
multi-round) are handled by enumerating ordered draft tuples in ``W``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import validate_positive_int
from .._verifier import LOSSLESS_TOL, LosslessCheck, validate_tol
from ..models import size_exceeds, size_text
from ._common import (
    MAX_STEP_ENUM,
    _known_order,
    capped_count,
    context_key,
    next_dist,
    resolve_verifier,
    validate_branching,
    validate_models,
    validate_prefix,
)

__all__ = [
    "SpecTrCheck",
    "check_lossless",
    "block_efficiency",
    "length_law",
    "decoded_law",
    "MAX_NODES",
    "MAX_SEQUENCES",
]

#: Default largest number of recursion nodes (context x depth x survivors) of
#: :func:`block_efficiency` (an a-priori bound, checked before any work).
MAX_NODES = 1_000_000
#: Default largest ``V ** (L + 1)`` for the full-law enumeration of
#: :func:`check_lossless` / :func:`decoded_law`.
MAX_SEQUENCES = 1_000_000


#: The polynomial step law of sequential verifiers (k-Seq, multi-round) costs
#: about ``V * k**2`` operations per recursion state; an exact call whose states
#: add up to more than this is refused (about 5 s of work on one core).
MAX_SEQUENTIAL_WORK = 30_000_000


#: Largest number of draft token ids an exact enumeration holds at one position
#: (multisets or tuples times ``k``; 400 MB of int64).
MAX_ENUM_CELLS = 50_000_000


def _step_sizes(n, ks, symmetric, cap):
    """Largest number of draft tokens at each position and its enumeration size, capped at ``cap + 1``.

    A-priori, with ``|supp p| <= n``.
    """
    out = []
    kmax = 1
    for k_i in ks:
        kmax *= k_i
        out.append((kmax, capped_count(n, kmax, symmetric, cap)))
    return out


def _count_text(size, cap) -> str:
    return f"more than {cap}" if size == math.inf else f"up to {size}"


def _check_sizes(draft, target, n, ks, factory, max_enum, max_nodes, limit_name="`max_enum`"):
    sizes = _step_sizes(n, ks, factory.symmetric, max_enum)
    worst = max(s for _, s in sizes)
    if worst > max_enum and not factory.sequential:
        d = [s for _, s in sizes].index(worst)
        kind = "multisets" if factory.symmetric else "ordered draft tuples"
        raise ValueError(
            f"exact enumeration would need {_count_text(worst, max_enum)} {kind} of k={sizes[d][0]} draft tokens over "
            f"V={n} at position {d + 1}, above {limit_name}={max_enum}; use block_efficiency_mc"
        )
    cells = max(s * k for k, s in sizes)  # the enumeration holds k token ids per multiset or tuple
    if cells > MAX_ENUM_CELLS and not factory.sequential:
        raise ValueError(
            f"exact enumeration would hold {cells} draft token ids (multisets x k, `k`={math.prod(ks)}), above "
            f"the stated limit MAX_ENUM_CELLS={MAX_ENUM_CELLS}; use block_efficiency_mc"
        )
    orders = [_known_order(draft), _known_order(target)]
    order = None if None in orders else max(orders)
    total = 0  # states (context, depth, survivors)
    work = 0  # n * k**2 per state of a sequential verifier's polynomial step law
    for d in range(len(ks)):
        depth = d if order is None else min(d, order)
        n_surv = 1 if d == 0 else sizes[d - 1][0]
        if size_exceeds(n, depth, max_nodes):
            total = max_nodes + 1
            break
        states = n**depth * n_surv
        total += states
        work += states * n * sizes[d][0] ** 2
        if total > max_nodes:
            break
    if total > max_nodes:
        raise ValueError(
            f"exact enumeration would visit more than {max_nodes} (context, depth, survivors) states, above "
            f"`max_nodes`={max_nodes}; use block_efficiency_mc"
        )
    if factory.sequential and work > MAX_SEQUENTIAL_WORK:
        raise ValueError(
            f"the exact step laws of {factory.name!r} for K={math.prod(ks)}, L={len(ks)} over V={n} cost about "
            f"{work} operations (states * V * k**2), above the stated limit "
            f"MAX_SEQUENTIAL_WORK={MAX_SEQUENTIAL_WORK}; use block_efficiency_mc"
        )


def _setup(draft, target, K, L, verifier, branching, prefix):
    n = validate_models(draft, target)
    ks = validate_branching(K, L, branching)
    ctx = validate_prefix(prefix, n)
    factory = resolve_verifier(verifier)
    return n, ks, ctx, factory


def _length_law(draft, target, n, ks, ctx0, factory, max_enum):
    L = len(ks)
    memo: dict = {}

    def rec(ctx, d, m):
        key = (context_key(draft, ctx), context_key(target, ctx), d, m)
        r = memo.get(key)
        if r is not None:
            return r
        p = next_dist(draft, ctx, n, "draft")
        q = next_dist(target, ctx, n, "target")
        W = factory.step_law(p, q, m * ks[d], max_enum=max_enum)
        r = np.zeros(L + 2 - d)  # r[j] = P(j more decoded tokens)
        r[1] += W[:, 0].sum()
        for y in range(n):
            for j in np.flatnonzero(W[y, 1:] > 0) + 1:
                w = W[y, j]
                if d + 1 == L:
                    r[2] += w
                else:
                    r[1:] += w * rec(ctx + (y,), d + 1, int(j))
        memo[key] = r
        return r

    law = rec(ctx0, 0, 1)
    return law[1:]


def length_law(
    draft,
    target,
    k,
    L,
    *,
    verifier="lp",
    branching=None,
    prefix=(),
    max_enum: int = MAX_STEP_ENUM,
    max_nodes: int = MAX_NODES,
) -> np.ndarray:
    r"""Exact law of the number of tokens one SpecTr iteration decodes.

    .. math::

        P(\tau = j), \qquad j = 1, \dots, L + 1,

    where :math:`\tau` counts the accepted draft tokens plus the correction
    or bonus token (one target call). Computed by the recursion over
    (context, depth, surviving nodes) described in :mod:`otspec.spectr`,
    memoised by context for :class:`~otspec.models.MarkovModel` and
    :class:`~otspec.models.MemorylessModel` (or a model's own
    ``context_key``).

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    verifier : str, callable or VerifierFactory, keyword-only
        Token-level verifier (see :func:`draft_selection`).
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching (:math:`\prod k_i = K`); None: i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    max_enum : int, keyword-only
        Largest number of draft tuples (multisets for symmetric verifiers)
        enumerated at one position, checked a priori with ``|supp p| <= V``.
    max_nodes : int, keyword-only
        Largest a-priori number of recursion states.

    Returns
    -------
    (L + 1,) ndarray of float64
        ``law[j - 1] = P(tau = j)``.

    Raises
    ------
    ValueError
        Invalid ``K``, ``L``, ``branching``, models; or an enumeration
        larger than ``max_enum`` / ``max_nodes`` (before any work).

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Algorithm 3 (DraftSelection), Algorithm 4 (prefix-tree drafts).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import length_law
    >>> length_law(MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75]), 1, 2).tolist()
    [0.25, 0.1875, 0.5625]
    """
    K = k  # SpecTr's letter for the number of draft sequences
    n, ks, ctx, factory = _setup(draft, target, K, L, verifier, branching, prefix)
    max_enum = validate_positive_int(max_enum, "max_enum")
    max_nodes = validate_positive_int(max_nodes, "max_nodes")
    _check_sizes(draft, target, n, ks, factory, max_enum, max_nodes)
    return _length_law(draft, target, n, ks, ctx, factory, max_enum)


def block_efficiency(
    draft,
    target,
    k,
    L,
    *,
    verifier="lp",
    branching=None,
    prefix=(),
    max_enum: int = MAX_STEP_ENUM,
    max_nodes: int = MAX_NODES,
) -> float:
    r"""Exact block efficiency of SpecTr: expected decoded tokens per target call, bonus included.

    .. math::

        \mathbb E[\tau] = \sum_{j=1}^{L+1} j\, P(\tau = j),

    for one iteration from the context ``prefix`` (SpecTr §8 defines block
    efficiency as decoded tokens per serial call of :math:`\mathcal M_b`;
    the papers average it over a generation). With ``K = 1`` this is
    ``1 +`` the expected accepted length of token-level speculative decoding,
    :math:`1 + \sum_{\ell=1}^{L} \sum_{x^\ell} \prod_{i \le \ell}
    \min(\mathcal M_s, \mathcal M_b)(x_i \mid x^{i-1})`.

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    verifier : str, callable or VerifierFactory, keyword-only
        Token-level verifier (see :func:`draft_selection`).
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching (:math:`\prod k_i = K`); None: i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    max_enum, max_nodes : int, keyword-only
        Enumeration limits, as in :func:`length_law`.

    Returns
    -------
    float
        :math:`\mathbb E[\tau] \in [1, L + 1]`.

    Raises
    ------
    ValueError
        As :func:`length_law`.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, §8 (block efficiency), Table 4.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import block_efficiency
    >>> draft, target = MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75])
    >>> round(block_efficiency(draft, target, 1, 2), 12)  # 1 + 0.75 + 0.75**2
    2.3125
    >>> round(block_efficiency(draft, target, 2, 2, verifier="lp"), 12)
    2.875
    """
    K = k  # SpecTr's letter for the number of draft sequences
    law = length_law(
        draft, target, K, L, verifier=verifier, branching=branching, prefix=prefix,
        max_enum=max_enum, max_nodes=max_nodes,
    )
    return float(math.fsum(law * np.arange(1, law.shape[0] + 1)))


def _decoded(draft, target, n, ks, ctx0, factory, max_enum) -> dict:
    L = len(ks)
    out: dict = {}

    def rec(ctx, rel, d, m, w0):
        p = next_dist(draft, ctx, n, "draft")
        q = next_dist(target, ctx, n, "target")
        W = factory.step_law(p, q, m * ks[d], max_enum=max_enum)
        for y in range(n):
            s = rel + (y,)
            w_rej = W[y, 0]
            if w_rej > 0:
                out[s] = out.get(s, 0.0) + float(w0 * w_rej)
            for j in np.flatnonzero(W[y, 1:] > 0) + 1:
                w = w0 * float(W[y, j])
                if d + 1 == L:
                    bonus = next_dist(target, ctx + (y,), n, "target")
                    for b in np.flatnonzero(bonus > 0):
                        sb = s + (int(b),)
                        out[sb] = out.get(sb, 0.0) + float(w * bonus[b])
                else:
                    rec(ctx + (y,), s, d + 1, int(j), w)

    rec(ctx0, (), 0, 1, 1.0)
    return out


def decoded_law(
    draft,
    target,
    k,
    L,
    *,
    verifier="lp",
    branching=None,
    prefix=(),
    max_enum: int = MAX_STEP_ENUM,
    max_sequences: int = MAX_SEQUENCES,
) -> dict:
    r"""Exact law of the tokens decoded by one SpecTr iteration.

    .. math::

        P(Y^\tau = o), \qquad o \in \Omega^1 \cup \dots \cup \Omega^{L+1}.

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    verifier : str, callable or VerifierFactory, keyword-only
        Token-level verifier.
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching; None: i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    max_enum : int, keyword-only
        Largest enumeration at one position (as in :func:`length_law`).
    max_sequences : int, keyword-only
        Refuse when ``V ** (L + 1)`` exceeds it.

    Returns
    -------
    dict of tuple of int to float
        The decoded sequences of positive probability and their probabilities.

    Raises
    ------
    ValueError
        As :func:`length_law`, or ``V ** (L + 1) > max_sequences``.

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative Decoding via Optimal
       Transport", arXiv:2310.15141, Algorithm 3 (DraftSelection), Theorem 2 (its output follows the
       target).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import decoded_law
    >>> law = decoded_law(MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75]), 1, 1)
    >>> {s: round(w, 12) for s, w in sorted(law.items())}
    {(0, 0): 0.0625, (0, 1): 0.1875, (1,): 0.25, (1, 0): 0.125, (1, 1): 0.375}
    """
    K = k  # SpecTr's letter for the number of draft sequences
    n, ks, ctx, factory = _setup(draft, target, K, L, verifier, branching, prefix)
    max_enum = validate_positive_int(max_enum, "max_enum")
    max_sequences = validate_positive_int(max_sequences, "max_sequences")
    if size_exceeds(n, len(ks) + 1, max_sequences):
        raise ValueError(
            f"the decoded law ranges over V**(L+1) = {n}**{len(ks) + 1} = {size_text(n, len(ks) + 1)} sequences, "
            f"above `max_sequences`={max_sequences}; use block_efficiency / block_efficiency_mc"
        )
    _check_sizes(draft, target, n, ks, factory, max_enum, max_sequences)
    return _decoded(draft, target, n, ks, ctx, factory, max_enum)


@dataclass(frozen=True, eq=False)
class SpecTrCheck(LosslessCheck):
    r"""Result of :func:`check_lossless` (exact enumeration).

    The core fields are those of :class:`otspec.LosslessCheck`: ``law`` is
    the law of the decoded tokens completed by the target to length ``L + 1``
    (shape ``(V,) * (L + 1)``), ``target_law`` the target's joint law,
    ``n_cases`` the number of decoded sequences of positive probability.

    Attributes
    ----------
    max_error : float
        :math:`\max_{o \in \Omega^{L+1}} |P((Y^\tau, Z^{\tau+1:L+1}) = o) -
        \mathcal M_b(o)|`, the decoded tokens completed by
        :math:`\mathcal M_b` to length ``L + 1`` against the target's joint
        law (SpecTr Theorem 2, in the form of the conference version's
        Theorem 3). Zero to rounding for every lossless token verifier.
    max_conditional_error : float
        :math:`\max_{j, o \in \Omega^j} |P(Y^\tau = o \mid \tau = j) -
        \mathcal M_b(o)|`: the arXiv version's literal statement of
        Theorem 2. It is *not* zero in general: the length of the output
        depends on its content (with one draft, a correction token is drawn
        from the residual :math:`(q - p)_+`, not from ``q``), and its proof
        treats :math:`Y_1` as independent of :math:`\tau`. Reported to
        document the discrepancy.
    expected_tokens : float
        :math:`\mathbb E[\tau]` (block efficiency), from the same enumeration.
    length_law : (L + 1,) ndarray of float64
        ``length_law[j - 1] = P(tau = j)``.
    """

    max_conditional_error: float
    expected_tokens: float
    length_law: np.ndarray

    @property
    def n_sequences(self) -> int:
        """Alias of ``n_cases`` (decoded sequences of positive probability)."""
        return self.n_cases


def _target_joint(target, ctx, length, n):
    """Joint law of the next ``length`` tokens of the target after ``ctx``, shape (n,)*length."""
    if length == 0:
        return np.ones(())
    q = next_dist(target, ctx, n, "target")
    out = np.empty((n,) * length)
    for y in range(n):
        out[y] = q[y] * _target_joint(target, ctx + (y,), length - 1, n) if q[y] > 0 else 0.0
    return out


def check_lossless(
    draft,
    target,
    k,
    L,
    *,
    verifier="lp",
    branching=None,
    prefix=(),
    max_enum: int = MAX_STEP_ENUM,
    max_sequences: int = MAX_SEQUENCES,
    tol: float = LOSSLESS_TOL,
) -> SpecTrCheck:
    r"""Check SpecTr's Theorem 2 exactly: the decoded tokens follow the target model.

    .. math::

        \sum_{j=1}^{L+1} P(Y^\tau = o^j,\ \tau = j)\,
        \mathcal M_b(o_{j+1:L+1} \mid x^t o^j) = \mathcal M_b(o^{L+1} \mid x^t)
        \qquad \forall\, o^{L+1} \in \Omega^{L+1},

    i.e. the decoded tokens completed by the target model to length
    ``L + 1`` have the target's law; the largest violation over
    :math:`\Omega^{L+1}` is returned, computed from :func:`decoded_law`.

    Parameters
    ----------
    draft, target : model
        Draft :math:`\mathcal M_s` and target :math:`\mathcal M_b` models.
    k, L : int
        Number and length of the draft sequences.
    verifier : str, callable or VerifierFactory, keyword-only
        Token-level verifier.
    branching : sequence of L int or None, keyword-only
        Prefix-tree branching; None: i.i.d. drafts.
    prefix : sequence of int, keyword-only
        The context.
    max_enum, max_sequences : int, keyword-only
        Enumeration limits, as in :func:`decoded_law`.
    tol : float, keyword-only
        ``passed`` is ``max_error <= tol`` (default 1e-9).

    Returns
    -------
    SpecTrCheck
        ``max_error`` (the theorem), ``max_conditional_error`` (the arXiv
        wording, false in general), ``expected_tokens``, ``length_law``.

    Raises
    ------
    ValueError
        As :func:`decoded_law`.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023: arXiv version Theorem 2, conference version
       Theorem 3.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import check_lossless
    >>> res = check_lossless(MemorylessModel([0.5, 0.5]), MemorylessModel([0.25, 0.75]), 2, 2)
    >>> bool(res.max_error < 1e-15), round(res.expected_tokens, 12)
    (True, 2.875)
    """
    K = k  # SpecTr's letter for the number of draft sequences
    n, ks, ctx, factory = _setup(draft, target, K, L, verifier, branching, prefix)
    tol = validate_tol(tol)
    L = len(ks)
    law = decoded_law(
        draft, target, K, L, verifier=factory, branching=ks, prefix=ctx,
        max_enum=max_enum, max_sequences=max_sequences,
    )
    completed = np.zeros((n,) * (L + 1))
    by_len = [np.zeros((n,) * j) for j in range(1, L + 2)]
    for s, w in law.items():
        by_len[len(s) - 1][s] += w
        completed[s] += w * _target_joint(target, ctx + s, L + 1 - len(s), n)
    ref = _target_joint(target, ctx, L + 1, n)
    max_error = float(np.max(np.abs(completed - ref)))
    lengths = np.array([math.fsum(b.ravel()) for b in by_len])
    cond_err = 0.0
    for j, b in enumerate(by_len, start=1):
        if lengths[j - 1] > 0:
            cond_err = max(cond_err, float(np.max(np.abs(b / lengths[j - 1] - ref.sum(axis=tuple(range(j, L + 1)))))))
    return SpecTrCheck(
        passed=bool(max_error <= tol),
        max_error=max_error,
        law=completed,
        target_law=ref,
        method="enumeration",
        n_cases=len(law),
        max_conditional_error=cond_err,
        expected_tokens=float(math.fsum(lengths * np.arange(1, L + 2))),
        length_law=lengths,
    )
