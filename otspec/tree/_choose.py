r"""Choosing a draft tree's shape: the exact best static shape, a greedy baseline, and Sequoia's dynamic programme.

Two problems, both over *shapes* (prefix-closed sets of rank paths,
:class:`~otspec.tree.TreeShape`):

* Deterministic trees (the ``"topk"`` process of Medusa and EAGLE: the rank-``r``
  child of a node is the draft's ``r``-th most likely next token). The tree is
  fixed by the context, so every lossless verifier emits a target sample and
  :math:`\mathbb E[\tau] = \sum_{v \ne \mathrm{root}} Q(x_{1:d(v)})`, the
  target's probability of each node's root path. :func:`best_shape` finds the
  exact best shape with ``n`` nodes for one context or, on average, over a set
  of contexts; :func:`greedy_shape` is the usual greedy growth, which never
  skips a sibling rank and can miss it.
* Sequoia's tree (Chen et al., arXiv:2402.12374, §3.1): under its *positional
  acceptance* assumption the rank-``r`` child of an accepted node is accepted
  with a probability ``a[r]`` that depends on the rank only, and
  :func:`sequoia` solves its dynamic programme for the best shape.

Counting: ``n`` is the number of draft tokens (nodes other than the root) and
``depth`` the largest draft depth, as :class:`~otspec.tree.TreeShape` counts
them; values are :math:`\mathbb E[\tau]`, accepted draft tokens, unless
``include_bonus=True`` (``+ 1``: the token every verification call emits).
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._validation import SIMPLEX_TOL, as_float_array, number_text, validate_positive_int
from ..models import next_law, validate_model_pair, validate_sequence
from ._process import MAX_TREES, LawCache, _laws_of, _ranked, enumerate_trees, validate_process
from ._tree import MAX_TREE_NODES, TreeShape
from ._value import value as tree_value
from ._verifiers import make_tree_verifier

__all__ = [
    "MAX_CHOOSE_WORK",
    "MAX_SEQUOIA_WORK",
    "ShapeChoice",
    "SequoiaGap",
    "SequoiaTree",
    "acceptance_vector",
    "best_shape",
    "greedy_shape",
    "sequoia",
    "sequoia_gap",
]

#: Largest ``n * len(contexts)`` (model calls per model) of :func:`best_shape` / :func:`greedy_shape`.
MAX_CHOOSE_WORK = 500_000
#: Largest ``min(depth, n) * min(K, n) * (n + 1)**2`` of :func:`sequoia` (its time; about 2 s at the limit).
MAX_SEQUOIA_WORK = 2 * 10**9


# ---------------------------------------------------------------------------
# deterministic (top-k) trees: the exact best static shape
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ShapeChoice:
    r"""A shape chosen for the ``"topk"`` process (:func:`best_shape`, :func:`greedy_shape`).

    Attributes
    ----------
    shape : TreeShape
        The chosen shape (rank paths of the draft).
    value : float
        Its mean expected accepted length over the contexts,
        :math:`\frac1m \sum_c \sum_{v} Q_c(x_c(v))` (draft tokens; no bonus).
    node_values : (n + 1,) ndarray of float64
        Mean target path probability of each node in the shape's node order
        (entry 0, the root, is 1).
    context_values : (m,) ndarray of float64
        The shape's expected accepted length in each context.
    method : str
        ``"exact"`` or ``"greedy"``.
    """

    shape: TreeShape
    value: float
    node_values: np.ndarray
    context_values: np.ndarray
    method: str


def _validate_contexts(contexts, V: int) -> tuple[tuple[int, ...], ...]:
    """A non-empty sequence of token sequences, each checked against the vocabulary."""
    if isinstance(contexts, (str, bytes)) or not isinstance(contexts, (Sequence, np.ndarray)):
        raise TypeError(f"`contexts` must be a sequence of token sequences, got {type(contexts).__name__}")
    if len(contexts) == 0:
        raise ValueError("`contexts` must hold at least one context (a token sequence, `()` for the empty one)")
    if isinstance(contexts[0], numbers.Integral):
        raise TypeError(
            f"`contexts` must be a sequence of token sequences (e.g. `[{tuple(contexts)!r}]`), got a sequence of ints"
        )
    return tuple(validate_sequence(c, V, "contexts") for c in contexts)


def _validate_depth(depth, n: int) -> int:
    if depth is None:
        return n
    return min(validate_positive_int(depth, "depth"), n)


def _check_choose_args(draft, target, n, contexts, depth):
    V = validate_model_pair(draft, target)
    n = validate_positive_int(n, "n")
    ctx = _validate_contexts(contexts, V)
    depth = _validate_depth(depth, n)
    if n * len(ctx) > MAX_CHOOSE_WORK:
        raise ValueError(
            f"`n` * len(`contexts`) = {n} * {len(ctx)} = {n * len(ctx)} is above the limit "
            f"MAX_CHOOSE_WORK={MAX_CHOOSE_WORK} (model calls per model)"
        )
    n_paths = sum(V**d for d in range(1, depth + 1)) if depth * math.log(V) < 64 else math.inf
    if n > n_paths:
        raise ValueError(f"`n`={n} is above the {n_paths} rank paths of depth <= `depth`={depth} on V={V} tokens")
    return V, n, ctx, depth


class _Node:
    """A rank path with its realised token path and target path probability in every context."""

    __slots__ = ("path", "tokens", "qpath", "order", "weights", "next", "support", "_child")

    def __init__(self, path, tokens, qpath):
        self.path = path          # rank path
        self.tokens = tokens      # per context: the realised token path (tuple)
        self.qpath = qpath        # (m,) target path probability per context
        self.order = None         # child ranks, best first (at most n of them)
        self.weights = None       # (V,) mean target path probability of the child of each rank
        self.next = 0             # next position in `order` not yet offered
        self.support = 0          # ranks below it are children in every context


def _expand(node: _Node, draft, target, ctx, V: int, keep: int) -> None:
    """The children of ``node``: per context the draft's ranking (ties: lower token id) and the target's path law."""
    m = len(ctx)
    child_q = np.empty((m, V))
    child_tok = np.empty((m, V), dtype=np.int64)
    support = V
    for c, (prefix, toks) in enumerate(zip(ctx, node.tokens)):
        p = next_law(draft, prefix + toks, V, "draft")
        q = next_law(target, prefix + toks, V, "target")
        rank_tokens = _ranked(p)  # rank r -> the draft's r-th most likely token (ties: lower id)
        child_tok[c] = rank_tokens
        child_q[c] = node.qpath[c] * q[rank_tokens]
        support = min(support, int(np.count_nonzero(p > 0)))
    # the top-k process only has children of positive draft probability: ranks < support in every context
    node.weights = child_q.mean(axis=0)
    order = np.argsort(-node.weights[:support], kind="stable")  # ties: lower rank first
    node.order = order[:keep]
    node.support = support
    node._child = (child_tok, child_q)  # type: ignore[attr-defined]


class _Grower:
    """Rank paths of the top-k process with their mean target path probability, expanded on demand."""

    def __init__(self, draft, target, ctx, V, keep):
        self.draft, self.target, self.ctx, self.V, self.keep = draft, target, ctx, V, keep
        m = len(ctx)
        self.root = _Node((), tuple(() for _ in range(m)), np.ones(m))
        self.nodes = {(): self.root}

    def children_of(self, node: _Node) -> None:
        if node.order is None:
            _expand(node, self.draft, self.target, self.ctx, self.V, self.keep)

    def child(self, node: _Node, r: int) -> _Node:
        path = node.path + (int(r),)
        got = self.nodes.get(path)
        if got is None:
            child_tok, child_q = node._child  # type: ignore[attr-defined]
            tokens = tuple(t + (int(child_tok[c, r]),) for c, t in enumerate(node.tokens))
            got = self.nodes[path] = _Node(path, tokens, child_q[:, r].copy())
        return got


def _too_few(n: int, found: int, depth: int) -> ValueError:
    return ValueError(
        f"`n`={n} is above the {found} rank paths of depth <= `depth`={depth} that the top-k process realises in "
        "every context (a node has children only at tokens of positive draft probability)"
    )


def _choice(grower: _Grower, chosen: list, method: str) -> ShapeChoice:
    shape = TreeShape.from_paths([nd.path for nd in chosen])
    by_path = {nd.path: nd for nd in chosen}
    node_q = np.array([np.ones(len(grower.ctx))] + [by_path[p].qpath for p in shape.paths[1:]])
    node_values = node_q.mean(axis=1)
    context_values = node_q[1:].sum(axis=0)
    return ShapeChoice(shape, math.fsum(node_values[1:].tolist()), node_values, context_values, method)


def best_shape(draft, target, n, *, contexts=((),), depth=None) -> ShapeChoice:
    r"""The exact best static shape with ``n`` draft tokens for the top-k draft process, for one or many contexts.

    .. math::

        S^\star = \operatorname*{arg\,max}_{S \text{ prefix-closed},\ |S| = n,\ \max_{s \in S} |s| \le D}
            \frac1m \sum_{c=1}^{m} \sum_{s \in S} Q_c\big(x_c(s)\big),

    where a rank path :math:`s = (r_1, \dots, r_d)` is realised in context
    :math:`c` as the token path :math:`x_c(s)` whose :math:`j`-th token is
    the draft's :math:`r_j`-th most likely token after
    :math:`c, x_{1:j-1}` (ties: lower token id first), and :math:`Q_c` is the
    target's path probability after :math:`c`. :math:`\sum_{s} Q_c(x_c(s))`
    is the exact :math:`\mathbb E[\tau]` of the deterministic tree in context
    :math:`c` (every lossless verifier emits a target sample and accepts its
    longest prefix in the tree; the target-only rule attains it). With one
    context this is the best tree for that context. As the top-k process
    builds trees, a node has a rank-:math:`r` child only when the draft gives
    at least :math:`r + 1` tokens positive probability there (in every
    context, for a static shape).

    Parameters
    ----------
    draft, target : Model
        Draft (``p``; it ranks the children) and target (``q``) models.
    n : int
        Draft tokens (nodes other than the root).
    contexts : sequence of sequence of int, keyword-only
        The contexts :math:`c` (default: the empty context only).
    depth : int or None, keyword-only
        Largest draft depth :math:`D` (None: ``n``, i.e. no limit).

    Returns
    -------
    ShapeChoice
        ``shape`` (the :math:`n` rank paths), ``value``, per-node and per-context values.

    Raises
    ------
    ValueError
        ``n`` or ``depth`` below 1, ``n`` above the number of rank paths of
        depth at most ``depth``, tokens outside the vocabulary, an empty
        ``contexts``, ``n * len(contexts)`` above :data:`MAX_CHOOSE_WORK`,
        fewer than ``n`` rank paths realised in every context (draft laws
        with small supports), or models that are not valid.
    TypeError
        Non-integer ``n`` or ``depth``; ``contexts`` not a sequence of token sequences.

    See Also
    --------
    greedy_shape : growth that never skips a sibling rank (a baseline; not optimal).

    Notes
    -----
    *One context.* Write :math:`w(s) = Q(x(s))`. A child's path extends its
    parent's, so :math:`w(s r) = w(s)\, q(x_{d+1} \mid x(s)) \le w(s)`:
    weights never increase down a path. Order all rank paths by
    :math:`(-w(s), |s|, s)`; a parent comes strictly before each of its
    children (weight at least as large, shorter). The first :math:`n` paths
    in this order are therefore prefix-closed, so they form a shape; their
    total weight is the sum of the :math:`n` largest weights, an upper bound
    on the value of every set of :math:`n` rank paths, prefix-closed or not.
    Hence they are optimal (restricting to :math:`|s| \le D` keeps both
    steps). Rank paths map one-to-one to token paths (the ranking is a
    permutation of the vocabulary), so this is also the set of the :math:`n`
    token paths with the largest :math:`Q`. The best shape can skip a
    sibling rank (keep rank 2 without rank 1) when the draft ranks a
    token the target dislikes.

    *Many contexts.* The mean value of a shape is
    :math:`\sum_{s \in S} \bar w(s)` with :math:`\bar w(s) = \frac1m \sum_c
    Q_c(x_c(s))`: additive over rank paths, and :math:`\bar w` also never
    increases down a path (termwise), so the same argument applies to
    :math:`\bar w`: the best static shape is the :math:`n` rank paths with the
    largest mean target path probability.

    *Search.* Best-first: a heap holds, for every expanded node, its best
    child not yet taken (children sorted by :math:`\bar w`); popping a path
    offers its next sibling and its own best child. Every unpopped path has
    an ancestor's child in the heap that precedes it in the order, so the pops
    come in exactly the order above: :math:`n` pops, :math:`n` expansions of
    :math:`2m` model calls each.

    References
    ----------
    .. [1] Cai, Li, Geng, Peng, Lee, Chen, Dao, "Medusa: Simple LLM Inference Acceleration Framework with
       Multiple Decoding Heads", arXiv:2401.10774, §2.1.2 (tree attention over the top-k candidates of each head;
       the static tree chosen from per-rank accuracies).
    .. [2] Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
       arXiv:2406.16858, §4 (top-k expansion of the draft tree).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import best_shape
    >>> draft = MemorylessModel([0.5, 0.3, 0.2])
    >>> target = MemorylessModel([0.45, 0.05, 0.5])   # the draft's rank 1 is the target's worst token
    >>> choice = best_shape(draft, target, 2, depth=1)
    >>> choice.shape.paths, round(choice.value, 12)
    (((), (0,), (2,)), 0.95)
    """
    V, n, ctx, depth = _check_choose_args(draft, target, n, contexts, depth)
    grower = _Grower(draft, target, ctx, V, keep=min(V, n))
    root = grower.root
    grower.children_of(root)
    heap = []

    def offer(parent: _Node) -> None:
        if parent.next < len(parent.order):
            r = int(parent.order[parent.next])
            parent.next += 1
            w = float(parent.weights[r])
            heapq.heappush(heap, (-w, len(parent.path) + 1, parent.path + (r,), parent))

    offer(root)
    chosen: list[_Node] = []
    while len(chosen) < n:
        if not heap:
            raise _too_few(n, len(chosen), depth)
        _, _, path, parent = heapq.heappop(heap)
        node = grower.child(parent, path[-1])
        chosen.append(node)
        offer(parent)
        if len(path) < depth:
            grower.children_of(node)
            offer(node)
    return _choice(grower, chosen, "exact")


def greedy_shape(draft, target, n, *, contexts=((),), depth=None) -> ShapeChoice:
    r"""Greedy growth of a top-k shape that never skips a sibling rank (a baseline, not optimal).

    .. math::

        S_{j+1} = S_j \cup \{\operatorname*{arg\,min}_{s \in F(S_j)} (-\bar w(s), |s|, s)\},
        \qquad F(S) = \{ s\,r : s \in S \cup \{()\},\ r = \#\text{children of } s \text{ in } S,
        \ r < k(s),\ |s| < D \},

    with :math:`\bar w(s)` the mean target path probability of the rank path
    :math:`s` over the contexts (as in :func:`best_shape`) and :math:`k(s)` the
    least number of tokens of positive draft probability after :math:`s` over
    the contexts (the top-k process has no rank-:math:`r` child beyond it):
    each step adds the most valuable *next-rank* child of any node, as trees
    grown rank by rank do; ties go to the shallower path, then to the
    lexicographically smaller one. Its shapes have no sibling gaps, so its
    value is below :func:`best_shape`'s whenever every best shape skips a rank
    (when a gapless shape ties with the best, greedy may find it); it can also
    miss the best gapless shape (it values each child alone, not the
    siblings and descendants that taking it opens).

    Parameters
    ----------
    draft, target : Model
    n : int
        Draft tokens.
    contexts : sequence of sequence of int, keyword-only
    depth : int or None, keyword-only
        As :func:`best_shape`.

    Returns
    -------
    ShapeChoice
        With ``method="greedy"``.

    Raises
    ------
    ValueError, TypeError
        As :func:`best_shape`.

    References
    ----------
    .. [1] Chen, May, Svirschevski, Huang, Ryabinin, Jia, Chen, "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3.1 (trees grown from the best rank paths).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import greedy_shape
    >>> draft = MemorylessModel([0.5, 0.3, 0.2])
    >>> target = MemorylessModel([0.45, 0.05, 0.5])
    >>> choice = greedy_shape(draft, target, 2, depth=1)
    >>> choice.shape.paths, round(choice.value, 12)
    (((), (0,), (1,)), 0.5)
    """
    V, n, ctx, depth = _check_choose_args(draft, target, n, contexts, depth)
    grower = _Grower(draft, target, ctx, V, keep=V)
    n_children = {(): 0}
    frontier = [grower.root]
    grower.children_of(grower.root)
    chosen: list[_Node] = []
    while len(chosen) < n:
        best = None
        for node in frontier:
            r = n_children[node.path]
            if r < node.support and len(node.path) < depth:
                key = (-float(node.weights[r]), len(node.path) + 1, node.path + (r,))
                if best is None or key < best[0]:
                    best = (key, node, r)
        if best is None:
            raise _too_few(n, len(chosen), depth)
        _, parent, r = best
        node = grower.child(parent, r)
        n_children[parent.path] += 1
        n_children[node.path] = 0
        grower.children_of(node)
        frontier.append(node)
        chosen.append(node)
    return _choice(grower, chosen, "greedy")


# ---------------------------------------------------------------------------
# Sequoia's dynamic programme (positional acceptance)
# ---------------------------------------------------------------------------


class SequoiaTree(NamedTuple):
    """The result of :func:`sequoia`: ``value, shape = sequoia(...)``.

    Attributes
    ----------
    value : float
        The predicted expected accepted length of ``shape`` under positional
        acceptance (draft tokens, or ``+ 1`` with ``include_bonus=True``).
    shape : TreeShape
        A best shape (children of every node at contiguous ranks ``0, 1, ...``).
    """

    value: float
    shape: TreeShape


def _validate_acceptance(acceptance) -> np.ndarray:
    if isinstance(acceptance, (str, bytes)):
        raise TypeError("`acceptance` must be a 1-D array of probabilities, got a string")
    a = as_float_array(acceptance, "acceptance", "a 1-D array of probabilities", booleans=False)
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"`acceptance` must be a non-empty 1-D array, got shape {a.shape}")
    bad = ~(np.isfinite(a) & (a >= 0) & (a <= 1))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"`acceptance` entries must lie in [0, 1], got acceptance[{i}]={number_text(a[i])}")
    total = math.fsum(a.tolist())
    if total > 1.0 + SIMPLEX_TOL:
        raise ValueError(f"`acceptance` must sum to at most 1 (a[r] is the probability that the rank-r child is the "
                         f"accepted one, and at most one child is), got sum {total:.12g}")
    a.setflags(write=False)
    return a


def _maxplus_step(H: np.ndarray, w: np.ndarray, b: int) -> np.ndarray:
    """``out[j] = max_{y >= 1} H[j - y] + w[y]`` (``H`` is ``-inf`` below ``b - 1``, so ``out`` is below ``b``)."""
    N = H.shape[0]  # n + 1
    out = np.full(N, -np.inf)
    if b <= N - 1:
        padded = np.concatenate([np.full(N, -np.inf), H])
        # shifted[j, y] = H[j - y] (-inf for y > j), a strided view: no index arrays
        shifted = np.lib.stride_tricks.sliding_window_view(padded, N)[1:, ::-1]
        out[b:] = (shifted[b:, 1:N - b + 1] + w[1:N - b + 1]).max(axis=1)
    return out


def _scaled(a_r: float, S: np.ndarray) -> np.ndarray:
    """``a_r * S`` with ``-inf`` (no such subtree) kept ``-inf`` even when ``a_r = 0``."""
    return np.where(np.isfinite(S), a_r * np.where(np.isfinite(S), S, 0.0), -np.inf)


def _best_split(H: np.ndarray, w: np.ndarray, j: int) -> int:
    """The ``y`` of :func:`_maxplus_step` at ``j`` (first maximiser)."""
    y = np.arange(1, j + 1)
    return int(y[np.argmax(H[j - y] + w[y])])


def sequoia(acceptance, n, depth, *, include_bonus: bool = False) -> SequoiaTree:
    r"""Sequoia's dynamic programme: the best shape under positional acceptance.

    .. math::

        c(m, d) = 1 + \max_{\substack{b \ge 0,\ m_0 + \dots + m_{b-1} = m - 1 \\ m_r \ge 1}}
            \sum_{r=0}^{b-1} a[r]\, c(m_r, d - 1), \qquad c(1, d) = 1\ (d \ge 1),

    the best value of a subtree with :math:`m` nodes (its top node included)
    and at most :math:`d` levels, when the rank-:math:`r` child of a reached
    node is accepted with probability :math:`a[r]` whatever the node and the
    rest of the tree (Sequoia's positional acceptance assumption), so that
    node :math:`v` is reached with probability
    :math:`\prod_{\text{ranks } r \text{ on its path}} a[r]`. The tree with
    ``n`` draft tokens and draft depth at most ``depth`` predicts
    :math:`\mathbb E[\tau] = c(n + 1, \mathrm{depth} + 1) - 1`.

    Parameters
    ----------
    acceptance : (K,) array_like of float
        :math:`a[r]`, the probability that the rank-:math:`r` child is the
        accepted one (Sequoia measures it on trees of depth 1 with ``K``
        children; :func:`acceptance_vector`). At most one child is
        accepted, so the vector lies in the simplex: :math:`a[r] \in [0, 1]`
        and :math:`\sum_r a[r] \le 1` (up to :data:`otspec._validation.SIMPLEX_TOL`
        for rounding). Nodes have at most ``K`` children.
    n : int
        Draft tokens (Sequoia's budget counts the root too: it is ``n + 1``).
    depth : int
        Largest draft depth (Sequoia's code counts the root's level too: ``depth + 1``).
    include_bonus : bool, keyword-only
        Return Sequoia's own count, :math:`c(n+1, \mathrm{depth}+1) = \mathbb E[\tau] + 1`
        (every call also emits one target token: the root's term
        :math:`f(\mathrm{root}) = 1`), instead of accepted draft tokens
        :math:`\mathbb E[\tau]` (the default, as everywhere in otspec).

    Returns
    -------
    SequoiaTree
        ``(value, shape)``.

    Raises
    ------
    ValueError
        ``acceptance`` empty, not 1-D, with entries outside [0, 1] or
        summing above 1;
        ``n`` or ``depth`` below 1; the work above :data:`MAX_SEQUOIA_WORK`;
        no shape with ``n`` nodes of at most ``K`` children and depth ``depth``.
    TypeError
        Non-integer ``n`` or ``depth``; ``include_bonus`` not a bool.

    Notes
    -----
    Implemented from the recurrence of Chen et al. (§3.1, the depth-limited
    :math:`c(n, d)`) and the reference code's ``tree_search.py``
    (Infini-AI-Lab/Sequoia): ``T[m][l][b]`` is the best value with ``m``
    nodes (root included), ``l`` levels and ``b`` children of the root at
    ranks ``1..b``, each child subtree non-empty, and the root contributes
    1. Here the split of the :math:`m - 1` nodes among the children is a
    max-plus convolution per rank (children at contiguous ranks
    :math:`0, \dots, b-1`, as in the code), vectorised over the budget: time
    :math:`O(\mathrm{depth} \cdot \min(K, n) \cdot n^2)`, under 1 s for
    ``n = 256, depth = 12, K = 256`` (``experiments/bench_tree_choose.py``); the
    levels stop early once the depth limit no longer binds (a level equal to
    the previous one repeats forever).
    When ``a`` is non-increasing, allowing rank gaps changes nothing.

    The value is a prediction: it is the exact expected accepted length when
    the acceptance of the rank-:math:`r` child is :math:`a[r]` at every node
    (for example a draft and target that do not depend on the prefix, with
    a per-node rule such as SpecInfer's or the without-replacement one); on
    other pairs it can be off either way (see
    :func:`otspec.tree.sequoia_gap`, which measures it).

    References
    ----------
    .. [1] Chen, May, Svirschevski, Huang, Ryabinin, Jia, Chen, "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3.1 (positional acceptance assumption, the dynamic programme
       :math:`c(n)` and its depth-limited :math:`c(n, d)`); code: github.com/Infini-AI-Lab/Sequoia,
       ``tree_search.py``.

    Examples
    --------
    >>> from otspec.tree import sequoia
    >>> value, shape = sequoia([0.6, 0.2], 3, 2)
    >>> round(value, 12), shape.paths
    (1.16, ((), (0,), (1,), (0, 0)))
    >>> round(sequoia([0.6, 0.2], 3, 2, include_bonus=True).value, 12)
    2.16
    """
    a = _validate_acceptance(acceptance)
    n = validate_positive_int(n, "n")
    depth = validate_positive_int(depth, "depth")
    if not isinstance(include_bonus, (bool, np.bool_)):
        raise TypeError(f"`include_bonus` must be a bool, got {type(include_bonus).__name__}")
    K = a.shape[0]
    D = min(depth, n)
    work = D * min(K, n) * (n + 1) ** 2
    if work > MAX_SEQUOIA_WORK:
        raise ValueError(
            f"`n`={n}, `depth`={depth}, len(`acceptance`)={K}: min(depth, n) * min(K, n) * (n + 1)**2 = {work} "
            f"is above the limit MAX_SEQUOIA_WORK={MAX_SEQUOIA_WORK}"
        )
    capacity = sum(K**d for d in range(1, D + 1)) if D * math.log(max(K, 2)) < 64 else math.inf
    if n > capacity:
        raise ValueError(
            f"no shape has `n`={n} nodes with at most K={K} children each (len(`acceptance`)) and "
            f"`depth`={depth}: at most {capacity}"
        )
    B = min(K, n)
    N = n + 1
    # G[e][j]: best forest of j nodes under a node, child subtrees of at most e levels (G[0]: only j = 0);
    # H[e, b]: the same with exactly b children, at ranks 0..b-1
    G = np.full((D + 1, N), -np.inf)
    G[0, 0] = 0.0
    H = np.full((D + 1, B + 1, N), -np.inf)
    H[:, 0, 0] = 0.0
    W = np.empty((D + 1, N))
    for e in range(1, D + 1):
        S = np.full(N, -np.inf)
        S[1:] = 1.0 + G[e - 1, :-1]  # S[y]: a subtree of y nodes and at most e levels
        W[e] = S
        for b in range(1, B + 1):
            H[e, b] = _maxplus_step(H[e, b - 1], _scaled(a[b - 1], S), b)
        G[e] = H[e].max(axis=0)
        if np.array_equal(G[e], G[e - 1]):
            # the depth limit no longer binds: every later level repeats this one exactly (same S, same G)
            G[e + 1:], H[e + 1:], W[e + 1:] = G[e], H[e], W[e]
            break
    if not np.isfinite(G[D, n]):  # pragma: no cover - excluded by the capacity check
        raise ValueError(f"no shape with `n`={n} nodes and `depth`={depth}")
    paths: list[tuple[int, ...]] = []

    def build(prefix: tuple[int, ...], j: int, e: int) -> None:
        b = int(np.argmax(H[e, :, j]))
        for r in range(b - 1, -1, -1):
            y = _best_split(H[e, r], _scaled(a[r], W[e]), j)
            paths.append(prefix + (r,))
            build(prefix + (r,), y - 1, e - 1)
            j -= y

    build((), n, D)
    value = float(G[D, n]) + (1.0 if include_bonus else 0.0)
    return SequoiaTree(value, TreeShape.from_paths(paths))


# ---------------------------------------------------------------------------
# Sequoia's acceptance vector, and the gap between its prediction and the exact value
# ---------------------------------------------------------------------------


def acceptance_vector(draft, target, width, *, process="wor", verifier="sequoia", contexts=((),),
                      max_trees: int = MAX_TREES) -> np.ndarray:
    r"""Sequoia's acceptance vector, exactly: the probability that the rank-``r`` child is the accepted one.

    .. math::

        a[r] = \frac1m \sum_{c=1}^{m} \sum_T P_c(T)\, \sum_y E_T[r + 1, y],
        \qquad r = 0, \dots, \mathrm{width} - 1,

    on the depth-1 tree with ``width`` children (a star) after each context
    :math:`c`, :math:`E_T` the verifier's exact emission on the realised star
    :math:`T` (node ``r + 1`` is the rank-``r`` child). Sequoia estimates the
    same quantity from samples (Chen et al., arXiv:2402.12374, §3.1).

    Parameters
    ----------
    draft, target : Model
    width : int
        Children of the star (the length of the vector).
    process : {"iid", "wor", "topk"}, keyword-only
        The draft process (default ``"wor"``, Sequoia's).
    verifier : str or TreeVerifier, keyword-only
        A tree verifier lossless for the process (default ``"sequoia"``).
    contexts : sequence of sequence of int, keyword-only
        The contexts averaged over (default: the empty context).
    max_trees : int, keyword-only
        Enumeration limit per context (:func:`otspec.tree.enumerate_trees`).

    Returns
    -------
    (width,) ndarray of float64
        Sums to at most 1 (the rest: no child accepted).

    Raises
    ------
    ValueError, TypeError
        Bad models, process, verifier (or one not lossless for the process),
        ``width`` below 1 or above ``MAX_TREE_NODES``, contexts as in :func:`best_shape`, or the
        enumeration above ``max_trees``.

    References
    ----------
    .. [1] Chen, May, Svirschevski, Huang, Ryabinin, Jia, Chen, "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3.1 (the acceptance vector).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import acceptance_vector
    >>> a = acceptance_vector(MemorylessModel([0.5, 0.3, 0.2]), MemorylessModel([0.2, 0.3, 0.5]), 2)
    >>> a.round(12).tolist()         # sum(min(p, q)); then the second draw accepts only token 2
    [0.7, 0.12]
    """
    V = validate_model_pair(draft, target)
    width = validate_positive_int(width, "width")
    if width > MAX_TREE_NODES:  # checked before the star's list of width nodes is built
        raise ValueError(f"`width` must be at most MAX_TREE_NODES = {MAX_TREE_NODES:,}, got {width}")
    star = TreeShape([(r,) for r in range(width)])
    process = validate_process(process, star)
    ctx = _validate_contexts(contexts, V)
    v = make_tree_verifier(verifier)
    if not v.lossless_for(process, star):
        raise ValueError(f"`verifier`={v.name!r} is lossless only for the draft processes {v.processes}, "
                         f"got process={process!r}")
    out = np.zeros(width)
    for c in ctx:
        dl, tl = LawCache(draft, V, c, "draft"), LawCache(target, V, c, "target")
        for T, w in enumerate_trees(star, draft, process=process, prefix=c, max_trees=max_trees):
            P, Q = _laws_of(T, dl, tl)
            out += w * v.emission(T, P, Q, validate=False)[1:].sum(axis=1)
    return out / len(ctx)


@dataclass(frozen=True, eq=False)
class SequoiaGap:
    r"""Result of :func:`sequoia_gap`.

    Attributes
    ----------
    predicted : float
        Sequoia's predicted :math:`\mathbb E[\tau]` of its chosen shape (positional acceptance).
    exact : float
        The chosen shape's exact :math:`\mathbb E[\tau]` (:func:`otspec.tree.value`).
    shape : TreeShape
        Sequoia's chosen shape.
    acceptance : (width,) ndarray of float64
        The acceptance vector it was chosen from (:func:`acceptance_vector`).
    """

    predicted: float
    exact: float
    shape: TreeShape
    acceptance: np.ndarray

    @property
    def gap(self) -> float:
        """``predicted - exact``: positive when Sequoia over-estimates its tree."""
        return self.predicted - self.exact


def sequoia_gap(draft, target, n, depth, *, process="wor", verifier="sequoia", width=None, contexts=None,
                prefix=(), max_trees: int = MAX_TREES) -> SequoiaGap:
    r"""Sequoia's predicted value of its own tree against the tree's exact value.

    .. math::

        \mathrm{gap} = \underbrace{c(n+1, \mathrm{depth}+1) - 1}_{\text{predicted, from } a}
            - \underbrace{\sum_T P(T)\, \mathbb E[\tau \mid T]}_{\text{exact}},

    with :math:`a` = :func:`acceptance_vector` (measured exactly on stars
    after ``contexts``), the shape and prediction from :func:`sequoia`, and
    the exact value from :func:`otspec.tree.value` after ``prefix``. The gap
    is zero when the acceptance of a rank does not depend on the node (a
    draft and target that ignore the prefix); on other pairs it can have
    either sign.

    Parameters
    ----------
    draft, target : Model
    n, depth : int
        Draft tokens and largest depth of the tree (as :func:`sequoia`).
    process : {"iid", "wor", "topk"}, keyword-only
    verifier : str or TreeVerifier, keyword-only
        Lossless for the process (default: ``"wor"`` with ``"sequoia"``).
    width : int or None, keyword-only
        Length of the acceptance vector, the most children a node may have
        (default ``n`` for ``"iid"``, ``min(n, V)`` for processes with distinct children).
    contexts : sequence of sequence of int or None, keyword-only
        Where the acceptance vector is measured (default: ``[prefix]``).
    prefix : sequence of int, keyword-only
        The context of the tree whose exact value is computed.
    max_trees : int, keyword-only
        Enumeration limit (:func:`otspec.tree.enumerate_trees`).

    Returns
    -------
    SequoiaGap
        ``predicted``, ``exact``, ``gap``, ``shape``, ``acceptance``.

    Raises
    ------
    ValueError, TypeError
        As :func:`acceptance_vector`, :func:`sequoia` and :func:`otspec.tree.value`.

    References
    ----------
    .. [1] Chen, May, Svirschevski, Huang, Ryabinin, Jia, Chen, "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3.1 (acceptance vector, positional acceptance) and §3.2
       (sampling without replacement).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import sequoia_gap
    >>> g = sequoia_gap(MemorylessModel([0.5, 0.3, 0.2]), MemorylessModel([0.2, 0.3, 0.5]), 3, 2)
    >>> abs(g.gap) < 1e-12                    # a pair that ignores the prefix: the prediction is exact
    True
    """
    V = validate_model_pair(draft, target)
    n = validate_positive_int(n, "n")
    depth = validate_positive_int(depth, "depth")
    ctx = validate_sequence(prefix, V, "prefix")
    if width is None:  # distinct children (wor, topk) are at most V
        width = n if process == "iid" else min(n, V)
    width = validate_positive_int(width, "width")
    contexts = [ctx] if contexts is None else contexts
    a = acceptance_vector(draft, target, width, process=process, verifier=verifier, contexts=contexts,
                          max_trees=max_trees)
    predicted, shape = sequoia(a, n, depth)
    exact = tree_value(shape, draft, target, process=process, verifier=verifier, prefix=ctx, max_trees=max_trees)
    a.setflags(write=False)
    return SequoiaGap(float(predicted), float(exact), shape, a)
