r"""Draft trees: shapes of rank paths and realised trees of tokens.

A *shape* is a prefix-closed set of rank paths: ``(r_1, ..., r_d)`` is the
node reached from the root (the context) through the child of rank ``r_1``,
then its child of rank ``r_2``, ...; this is Medusa's ``medusa_choices``
format (Cai et al., arXiv:2401.10774, §2.1.2; FasterDecoding/Medusa,
``medusa/model/utils.py``, ``generate_medusa_buffers``). Sequoia's tree
files (Chen et al., arXiv:2402.12374; its growmaps) list the children of
every node instead (``grow_map["Successors"]``), which
:meth:`TreeShape.from_successors` reads. A *realised tree* puts a token on
every node.

Node order (Medusa's convention, stated once here and used everywhere in
:mod:`otspec.tree`): node 0 is the root (no token: ``tokens[0] = -1``,
``depth[0] = 0``, ``parents[0] = -1``); nodes ``1..n`` are the draft tokens
sorted by ``(depth, rank path)``, so ``parents[i] < i`` and the children of a
node are consecutive node ids in rank order. A parent array plus a token per
node is the whole tree; the attention mask, the positions and the leaf paths
(Medusa's ``retrieve_indices``) are derived from it on request, never stored.

Notation: ``p`` is the draft law and ``q`` the target law at a node, as
everywhere in otspec.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .._validation import validate_positive_int
from ..spectr._drafts import DraftSet

__all__ = [
    "MAX_TREE_NODES",
    "DraftTree",
    "Eagle2Params",
    "TreeShape",
]

#: Largest number of draft nodes ``n`` of a shape or a realised tree (every
#: per-tree routine holds a few ``(n + 1,)`` arrays, and an ``(n + 1, V)`` law
#: per verifier call; engines verify at most a few hundred nodes).
MAX_TREE_NODES = 100_000


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _as_int(x, name: str) -> int:
    """A Python int from an integral value (bool and floats refused)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"`{name}` must hold integers, got {type(x).__name__} {x!r}")
    return int(x)


#: Largest rank (or token id) a path may hold: the entries are stored as int64.
_MAX_RANK = int(np.iinfo(np.int64).max)


def _rank_path(path, i: int, name: str = "paths") -> tuple[int, ...]:
    if isinstance(path, (str, bytes)) or not isinstance(path, (Sequence, np.ndarray)):
        raise TypeError(f"`{name}[{i}]` must be a sequence of int ranks, got {type(path).__name__}")
    out = tuple(_as_int(r, f"{name}[{i}]") for r in path)
    for r in out:
        if r < 0:
            raise ValueError(f"`{name}[{i}]` must hold non-negative ranks, got {out}")
        if r > _MAX_RANK:
            raise ValueError(f"`{name}[{i}]` must hold ranks of at most 2**63 - 1 (int64), got {r}")
    return out


def _sequence_of_paths(paths, name: str) -> list:
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Iterable):
        raise TypeError(f"`{name}` must be a sequence of paths (sequences of int), got {type(paths).__name__}")
    if isinstance(paths, np.ndarray) and paths.ndim == 1 and paths.dtype.kind in "iu":
        raise TypeError(f"`{name}` must be a sequence of paths (sequences of int), got a 1-D integer array")
    if getattr(paths, "ndim", None) == 0:  # a 0-d array is Iterable by its type, but len() and iter() raise on it
        raise TypeError(f"`{name}` must be a sequence of paths (sequences of int), got a 0-d array")
    if hasattr(paths, "__len__") and len(paths) > MAX_TREE_NODES + 1:
        raise ValueError(f"`{name}` has {len(paths)} paths, above the stated limit MAX_TREE_NODES={MAX_TREE_NODES}")
    out = list(paths)
    if len(out) > MAX_TREE_NODES + 1:
        raise ValueError(f"`{name}` has {len(out)} paths, above the stated limit MAX_TREE_NODES={MAX_TREE_NODES}")
    return out


@dataclass(frozen=True, eq=False)
class TreeShape:
    r"""A draft-tree shape: a prefix-closed set of rank paths, with its node order.

    .. math::

        S \subset \mathbb N^{*},\qquad (r_1, \dots, r_d) \in S,\ d \ge 1
        \implies (r_1, \dots, r_{d-1}) \in S,

    the empty path being the root. Path ``(r_1, ..., r_d)`` is the node at
    depth ``d`` reached through the rank-``r_1`` child of the root, then the
    rank-``r_2`` child of that node, and so on. What "rank ``r``" means is the
    draft process's business (:func:`otspec.tree.sample_tree`): the ``r``-th
    draw (i.i.d. or without replacement) or the ``r``-th most likely token.
    Ranks may skip (``(1,)`` without ``(0,)``): the best static shape may
    leave out a sibling rank.

    Parameters
    ----------
    paths : sequence of sequences of int
        The rank paths, in any order, with or without the root ``()``
        (Medusa's ``medusa_choices`` leaves it out). At most
        :data:`MAX_TREE_NODES` of them.

    Attributes
    ----------
    paths : tuple of tuples of int
        Node order: ``()`` first (the root), then sorted by ``(len, path)``.
    parents : (n + 1,) ndarray of int64, read-only
        ``parents[0] = -1``; ``parents[i] < i``.
    ranks : (n + 1,) ndarray of int64, read-only
        ``ranks[0] = -1``; the rank of node ``i`` among its parent's children
        (its last path entry).
    depth : (n + 1,) ndarray of int64, read-only
        Path lengths, non-decreasing.

    Raises
    ------
    TypeError
        A path that is not a sequence of integers (bools and floats refused).
    ValueError
        A negative rank, a duplicate path, a path whose parent path is
        missing (the first such path in the order given is named), or more
        than :data:`MAX_TREE_NODES` paths.

    References
    ----------
    .. [1] Cai et al., "Medusa: Simple LLM Inference Acceleration Framework
       with Multiple Decoding Heads", arXiv:2401.10774, §2.1.2 (tree
       attention; ``medusa_choices`` in ``medusa/model/utils.py``).
    .. [2] Chen et al., "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3 (trees as growmaps:
       ``from_successors``).

    Examples
    --------
    >>> from otspec.tree import TreeShape
    >>> s = TreeShape([(0,), (1,), (0, 0)])
    >>> s.paths, s.parents.tolist(), s.ranks.tolist(), s.n
    (((), (0,), (1,), (0, 0)), [-1, 0, 0, 1], [-1, 0, 1, 0], 3)
    >>> s.children(0), s.leaves, s.to_medusa_choices()
    ((1, 2), (2, 3), [[0], [1], [0, 0]])
    >>> TreeShape.chains(2, 2).paths
    ((), (0,), (1,), (0, 0), (1, 0))
    >>> TreeShape.branching(2, 2).n
    6
    """

    paths: tuple
    parents: np.ndarray = field(init=False, repr=False)
    ranks: np.ndarray = field(init=False, repr=False)
    depth: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        raw = _sequence_of_paths(self.paths, "paths")
        given = [_rank_path(p, i) for i, p in enumerate(raw)]
        seen: set = set()
        for p in given:
            if p in seen:
                raise ValueError(f"`paths` must not repeat a path, got {p} twice")
            seen.add(p)
        seen.add(())
        for p in given:
            if p and p[:-1] not in seen:
                raise ValueError(
                    f"`paths` must be prefix-closed: the parent path {p[:-1]} of {p} is missing"
                )
        if len(seen) - 1 > MAX_TREE_NODES:
            raise ValueError(
                f"`paths` has {len(seen) - 1} draft nodes, above the stated limit MAX_TREE_NODES={MAX_TREE_NODES}"
            )
        ordered = tuple(sorted(seen, key=lambda p: (len(p), p)))
        index = {p: i for i, p in enumerate(ordered)}
        parents = np.array([-1] + [index[p[:-1]] for p in ordered[1:]], dtype=np.int64)
        ranks = np.array([-1] + [p[-1] for p in ordered[1:]], dtype=np.int64)
        depth = np.array([len(p) for p in ordered], dtype=np.int64)
        object.__setattr__(self, "paths", ordered)
        object.__setattr__(self, "parents", _readonly(parents))
        object.__setattr__(self, "ranks", _readonly(ranks))
        object.__setattr__(self, "depth", _readonly(depth))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_paths(cls, paths) -> TreeShape:
        """The shape of a set of rank paths (same as ``TreeShape(paths)``)."""
        return cls(paths)

    @classmethod
    def from_medusa_choices(cls, choices) -> TreeShape:
        """The shape of Medusa's ``medusa_choices`` (a list of rank lists, root excluded)."""
        return cls(choices)

    @classmethod
    def from_successors(cls, successors) -> TreeShape:
        r"""The shape of a children list: ``successors[i]`` lists node ``i``'s children in rank order, node 0 the root.

        This is how Sequoia's growmaps store a tree (``grow_map["Successors"]``);
        the node numbering may be any, the result is in this package's node
        order (:meth:`to_successors` gives it back in that order). A
        children list has no rank gaps: the rank of a child is its position
        in its parent's list.

        Raises
        ------
        TypeError, ValueError
            Entries that are not lists of integer node ids, an id out of
            range, a node listed twice (two parents, or a cycle through the
            root), or a node not reachable from the root.
        """
        succ = _sequence_of_paths(successors, "successors")
        m = len(succ)
        if m == 0:
            raise ValueError("`successors` must list the root's children at least (node 0), got an empty list")
        paths: dict = {0: ()}
        stack = [0]
        while stack:
            v = stack.pop()
            kids = _rank_path(succ[v], v, "successors")
            for r, c in enumerate(kids):
                if c >= m:
                    raise ValueError(f"`successors[{v}]` lists node {c}, outside [0, {m})")
                if c in paths:
                    raise ValueError(f"`successors` lists node {c} twice (a node has one parent and the root none)")
                paths[c] = paths[v] + (r,)
                stack.append(c)
        if len(paths) != m:
            missing = sorted(set(range(m)) - set(paths))
            raise ValueError(f"`successors` leaves nodes {missing[:5]} unreachable from the root (node 0)")
        return cls([p for p in paths.values() if p])

    def to_successors(self) -> list[list[int]]:
        """The children of every node in node order (Sequoia's ``Successors`` layout), root first."""
        return [list(self.children(i)) for i in range(self.n + 1)]

    @classmethod
    def chains(cls, k, L) -> TreeShape:
        r"""``k`` chains of length ``L`` below the root: ``k`` independent draft blocks.

        Paths ``(i,), (i, 0), (i, 0, 0), ...`` for ``i < k``, ``n = k L`` nodes.

        Raises
        ------
        TypeError, ValueError
            ``k`` or ``L`` not a positive integer, or ``k L`` above :data:`MAX_TREE_NODES`.
        """
        k = validate_positive_int(k, "k")
        L = validate_positive_int(L, "L")
        if k * L > MAX_TREE_NODES:
            raise ValueError(f"`k` * `L` = {k * L} nodes exceeds the stated limit MAX_TREE_NODES={MAX_TREE_NODES}")
        return cls([(i,) + (0,) * d for i in range(k) for d in range(L)])

    @classmethod
    def branching(cls, *b) -> TreeShape:
        r"""SpecTr's prefix tree: every node at depth ``d - 1`` has ``b_d`` children.

        ``TreeShape.branching(b1, b2, ...)`` (or one sequence) has
        :math:`\sum_d \prod_{j \le d} b_j` nodes; ``branching(k, 1, ..., 1)``
        is ``chains(k, L)`` (Sun et al., arXiv:2310.15141, Appendix D).

        Raises
        ------
        TypeError, ValueError
            A factor that is not a positive integer, no factor, or more than
            :data:`MAX_TREE_NODES` nodes.
        """
        if len(b) == 1 and isinstance(b[0], (Sequence, np.ndarray)) and not isinstance(b[0], (str, bytes)):
            b = tuple(b[0])
        if not b:
            raise ValueError("`b` must give at least one branching factor, got none")
        bs = [validate_positive_int(x, f"b[{i}]") for i, x in enumerate(b)]
        total, level = 0, 1
        for x in bs:
            level *= x
            total += level
            if total > MAX_TREE_NODES:
                raise ValueError(
                    f"branching {tuple(bs)} has more than MAX_TREE_NODES={MAX_TREE_NODES} nodes"
                )
        paths: list = [()]
        frontier: list = [()]
        for x in bs:
            frontier = [f + (r,) for f in frontier for r in range(x)]
            paths.extend(frontier)
        return cls(paths)

    # ------------------------------------------------------------------ derived
    @property
    def n(self) -> int:
        """Number of draft nodes (the root excluded)."""
        return len(self.paths) - 1

    @property
    def max_depth(self) -> int:
        """Largest depth (0 for the root alone)."""
        return int(self.depth[-1])

    def children(self, i: int) -> tuple[int, ...]:
        """Node ids of the children of node ``i``, in rank order."""
        return tuple(int(c) for c in np.flatnonzero(self.parents == i))

    @property
    def leaves(self) -> tuple[int, ...]:
        """Node ids without children (the root when ``n = 0``), in node order."""
        has_child = np.zeros(len(self.paths), dtype=bool)
        has_child[self.parents[1:]] = True
        return tuple(int(i) for i in np.flatnonzero(~has_child))

    @property
    def has_rank_gaps(self) -> bool:
        """Whether some node's children ranks are not exactly ``0, 1, ..., m - 1``."""
        expected = np.zeros(len(self.paths), dtype=np.int64)
        for i in range(1, len(self.paths)):
            if self.ranks[i] != expected[self.parents[i]]:
                return True
            expected[self.parents[i]] += 1
        return False

    def to_medusa_choices(self) -> list[list[int]]:
        """Medusa's ``medusa_choices``: the rank paths as lists, root excluded, in node order."""
        return [list(p) for p in self.paths[1:]]

    def __eq__(self, other) -> bool:
        return isinstance(other, TreeShape) and self.paths == other.paths

    def __hash__(self) -> int:
        return hash(self.paths)

    def __repr__(self) -> str:
        return f"TreeShape(n={self.n}, max_depth={self.max_depth}, paths={self.to_medusa_choices()})"


def _int_array(x, name: str) -> np.ndarray:
    if isinstance(x, (str, bytes)):
        raise TypeError(f"`{name}` must be a 1-D array of integers, got a string")
    try:
        arr = np.array(x, copy=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"`{name}` must be a 1-D array of integers, got {type(x).__name__}") from exc
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        vals = np.asarray(x, dtype=object).reshape(-1) if arr.dtype.kind in "fO" else ()
        if len(vals) and all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in vals):
            raise ValueError(f"`{name}` must hold integers in the int64 range, got {max(map(int, vals), key=abs)}")
        raise TypeError(f"`{name}` must hold integers, got dtype {arr.dtype}")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > _MAX_RANK:
        raise ValueError(f"`{name}` must hold integers in the int64 range, got {int(arr.max())}")
    return arr.astype(np.int64)


@dataclass(frozen=True, eq=False)
class DraftTree:
    r"""A realised draft tree: a parent array and a token on every node.

    .. math::

        T = (\mathrm{parents}, \mathrm{tokens}),\qquad
        x_{1:d(i)}(i) = (\mathrm{tokens}[a_1], \dots, \mathrm{tokens}[a_{d(i)}] = \mathrm{tokens}[i]),

    the root path of node ``i`` through its ancestors :math:`a_1, \dots`.
    Node 0 is the root (the context, ``tokens[0] = -1``); ``parents[i] < i``
    for ``i >= 1``; the children of a node are taken in increasing node id
    (their rank order, which verifiers that scan siblings depend on).
    Siblings may carry the same token (i.i.d. draws).

    Parameters
    ----------
    shape : TreeShape or None
        The shape the tree realises (then ``parents`` must equal
        ``shape.parents``); None for trees not built from a shape (EAGLE-2's
        dynamic trees, :func:`DraftTree.from_paths`).
    parents : (n + 1,) array_like of int
    tokens : (n + 1,) array_like of int
        ``tokens[0] = -1``; draft tokens ``>= 0`` (checked against a
        vocabulary where one is known).
    depth : (n + 1,) array_like of int or None
        Derived from ``parents`` when None; checked when given.

    Raises
    ------
    TypeError
        Non-integer arrays, or ``shape`` not a TreeShape.
    ValueError
        Arrays of different lengths, ``parents[0] != -1``, a parent not
        before its child, ``tokens[0] != -1``, a negative token, a wrong
        ``depth``, a ``parents`` different from ``shape.parents``, or more
        than :data:`MAX_TREE_NODES` nodes.

    References
    ----------
    .. [1] Miao et al., "SpecInfer: Accelerating Large Language Model Serving
       with Tree-based Speculative Inference and Verification",
       arXiv:2305.09781, §3 (token trees) and §4 (tree attention).
    .. [2] Cai et al., Medusa, arXiv:2401.10774, §2.1.2 (``generate_medusa_buffers``:
       attention mask, position ids and ``retrieve_indices``).

    Examples
    --------
    >>> from otspec.tree import DraftTree
    >>> t = DraftTree.from_paths([(5,), (7,), (5, 2)])
    >>> t.parents.tolist(), t.tokens.tolist(), t.depth.tolist()
    ([-1, 0, 0, 1], [-1, 5, 7, 2], [0, 1, 1, 2])
    >>> t.path(3), t.leaf_paths()
    ((5, 2), [[0, 2], [0, 1, 3]])
    >>> t.attention_mask().astype(int).tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    """

    shape: TreeShape | None
    parents: np.ndarray
    tokens: np.ndarray
    depth: np.ndarray | None = None

    def __post_init__(self):
        if self.shape is not None and not isinstance(self.shape, TreeShape):
            raise TypeError(f"`shape` must be a TreeShape or None, got {type(self.shape).__name__}")
        parents = _int_array(self.parents, "parents")
        tokens = _int_array(self.tokens, "tokens")
        n1 = parents.shape[0]
        if n1 < 1:
            raise ValueError("`parents` must have at least the root entry, got length 0")
        if n1 - 1 > MAX_TREE_NODES:
            raise ValueError(f"a tree of {n1 - 1} nodes exceeds the stated limit MAX_TREE_NODES={MAX_TREE_NODES}")
        if tokens.shape[0] != n1:
            raise ValueError(f"`tokens` must have the length of `parents` ({n1}), got {tokens.shape[0]}")
        if parents[0] != -1:
            raise ValueError(f"`parents[0]` must be -1 (the root), got {int(parents[0])}")
        ids = np.arange(n1)
        bad = np.flatnonzero((parents[1:] < 0) | (parents[1:] >= ids[1:])) + 1
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"`parents` must satisfy 0 <= parents[i] < i for i >= 1 (node order: parents first), "
                f"got parents[{i}] = {int(parents[i])}"
            )
        if tokens[0] != -1:
            raise ValueError(f"`tokens[0]` must be -1 (the root carries no token), got {int(tokens[0])}")
        if n1 > 1 and tokens[1:].min() < 0:
            i = int(np.argmin(tokens[1:])) + 1
            raise ValueError(f"`tokens` must be non-negative token ids for i >= 1, got tokens[{i}] = {int(tokens[i])}")
        depth = np.zeros(n1, dtype=np.int64)
        for i in range(1, n1):
            depth[i] = depth[parents[i]] + 1
        if self.depth is not None:
            given = _int_array(self.depth, "depth")
            if given.shape != depth.shape or not np.array_equal(given, depth):
                raise ValueError("`depth` must be the path lengths implied by `parents` (or None to derive them)")
        if self.shape is not None and not np.array_equal(self.shape.parents, parents):
            raise ValueError(f"`parents` must equal `shape.parents` for a tree realising {self.shape!r}")
        object.__setattr__(self, "parents", _readonly(parents))
        object.__setattr__(self, "tokens", _readonly(tokens))
        object.__setattr__(self, "depth", _readonly(depth))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_paths(cls, paths) -> DraftTree:
        r"""The tree whose nodes have the given token paths (root excluded).

        Nodes are ordered breadth first: depth by depth, the children of a
        node together and in the order given (their rank order). Token paths must be
        distinct and prefix-closed; a tree with two siblings carrying the
        same token is built from ``parents`` and ``tokens`` instead.

        Raises
        ------
        TypeError, ValueError
            As for :class:`TreeShape` (non-integer or negative tokens, a
            repeated path, a missing parent path).
        """
        raw = _sequence_of_paths(paths, "paths")
        given = [_rank_path(p, i) for i, p in enumerate(raw)]
        given = [p for p in given if p]
        seen = {()}
        for p in given:
            if p in seen:
                raise ValueError(f"`paths` must not repeat a path, got {p} twice")
            seen.add(p)
        for p in given:
            if p[:-1] not in seen:
                raise ValueError(f"`paths` must be prefix-closed: the parent path {p[:-1]} of {p} is missing")
        # breadth first: depth by depth, the children of each node together, in the order given
        kids: dict = {}
        for p in given:
            kids.setdefault(p[:-1], []).append(p)
        ordered = [()]
        for p in ordered:  # grows while it is walked
            ordered.extend(kids.get(p, ()))
        index = {p: i for i, p in enumerate(ordered)}
        parents = [-1] + [index[p[:-1]] for p in ordered[1:]]
        tokens = [-1] + [p[-1] for p in ordered[1:]]
        return cls(None, parents, tokens)

    @classmethod
    def from_blocks(cls, blocks, branching=None) -> DraftTree:
        r"""The draft tree of ``K`` draft blocks: ``K`` chains (i.i.d. blocks), or SpecTr's prefix tree.

        .. math::

            T = \big(\texttt{TreeShape.branching}(k_1, \dots, k_L),\ x\big),\qquad
            x(\text{node } j \text{ at depth } d) = X^{\,j k_{d+1} \cdots k_L}_d,

        the leaves of the prefix tree with branching :math:`(k_1, \dots, k_L)`,
        :math:`\prod_i k_i = K`, being the blocks :math:`X^0, \dots, X^{K-1}`
        in tree order. With ``branching=None`` (``(K, 1, ..., 1)``) the tree
        is ``TreeShape.chains(K, L)``: block ``i`` is chain ``i``, even when two
        blocks share a prefix (siblings may then carry the same token).

        This is how the package's block-level draft representations are
        trees: the ``k`` i.i.d. draft blocks of :mod:`otspec.block`'s
        multi-draft verifiers (``MultiDraftSample.drafts``, the blocks passed
        to ``verify``) and SpecTr's draft sets (:class:`otspec.spectr.DraftSet`,
        whose ``node_tokens`` are this tree's ``tokens[1:]``).

        Parameters
        ----------
        blocks : DraftSet, (K, L) array_like of int, or sequence of K blocks of L ints
            A draft set (its own branching is used) or the blocks, leaves in tree order.
        branching : sequence of L int or None
            The prefix tree's branching factors; None for ``K`` chains. Must be
            None when ``blocks`` is a DraftSet.

        Returns
        -------
        DraftTree
            With ``shape = TreeShape.branching(*branching)`` and :math:`n = \sum_d \prod_{i \le d} k_i` nodes.

        Raises
        ------
        TypeError, ValueError
            As :class:`otspec.spectr.DraftSet`: not a non-empty 2-D array of
            non-negative integer tokens, a branching that does not multiply
            to ``K``, leaves of one node that disagree on its tokens, or more
            draft tokens than its stated limit; a ``branching`` given with a
            DraftSet.

        References
        ----------
        .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport",
           arXiv:2310.15141, §7 (i.i.d. draft sequences) and Appendix D (prefix trees).
        .. [2] Sun, Ro, Beirami, Suresh, arXiv:2403.10444 v1, Theorem 1 (draft blocks).

        Examples
        --------
        >>> from otspec.tree import DraftTree, TreeShape
        >>> t = DraftTree.from_blocks([[0, 1], [0, 2], [1, 0], [1, 1]], branching=(2, 2))
        >>> t.shape.paths == TreeShape.branching(2, 2).paths, t.tokens.tolist()
        (True, [-1, 0, 1, 1, 2, 0, 1])
        >>> DraftTree.from_blocks([(2, 0), (2, 1)]).paths()[1:]  # two i.i.d. blocks: two chains
        [(2,), (2,), (2, 0), (2, 1)]
        """
        if isinstance(blocks, DraftSet):
            if branching is not None:
                raise ValueError(f"`branching` must be None for a DraftSet (it has its own), got {branching!r}")
            ds = blocks
        else:
            ds = DraftSet(blocks, branching)
        shape = TreeShape.branching(*ds.branching)
        return cls(shape, shape.parents, np.concatenate(([-1], ds.node_tokens())))

    # ------------------------------------------------------------------ derived
    @property
    def n(self) -> int:
        """Number of draft nodes (the root excluded)."""
        return int(self.parents.shape[0]) - 1

    @property
    def max_depth(self) -> int:
        """Largest depth."""
        return int(self.depth.max())

    def children(self, i: int) -> tuple[int, ...]:
        """Node ids of the children of node ``i``, in rank order (increasing id)."""
        return tuple(int(c) for c in np.flatnonzero(self.parents == i))

    @property
    def leaves(self) -> tuple[int, ...]:
        """Node ids without children, in node order."""
        has_child = np.zeros(self.n + 1, dtype=bool)
        has_child[self.parents[1:]] = True
        return tuple(int(i) for i in np.flatnonzero(~has_child))

    def path(self, i: int) -> tuple[int, ...]:
        """The tokens on the root path of node ``i`` (``()`` for the root)."""
        i = _as_int(i, "i")
        if not 0 <= i <= self.n:
            raise ValueError(f"`i` must be a node id in [0, {self.n}], got {i}")
        out = []
        while i > 0:
            out.append(int(self.tokens[i]))
            i = int(self.parents[i])
        return tuple(reversed(out))

    def paths(self) -> list[tuple[int, ...]]:
        """The root paths of all nodes, in node order (``()`` first)."""
        out: list = [()]
        for i in range(1, self.n + 1):
            out.append(out[int(self.parents[i])] + (int(self.tokens[i]),))
        return out

    def attention_mask(self) -> np.ndarray:
        """``(n + 1, n + 1)`` bool: node ``i`` attends to ``j`` iff ``j`` is an ancestor of ``i`` or ``i`` itself.

        Column 0 (the root, i.e. the last context token) is always True;
        this is Medusa's ``medusa_attn_mask`` and EAGLE's ``tree_mask``.
        """
        n1 = self.n + 1
        mask = np.eye(n1, dtype=bool)
        for i in range(1, n1):
            mask[i] |= mask[self.parents[i]]
        return mask

    def positions(self) -> np.ndarray:
        """Position offsets of the nodes: their depths (add the context length for position ids)."""
        return np.array(self.depth, copy=True)

    def leaf_paths(self) -> list[list[int]]:
        """Medusa's ``retrieve_indices``: for each leaf (in node order), the node ids from the root to it."""
        out = []
        for leaf in self.leaves:
            ids = []
            i = leaf
            while i >= 0:
                ids.append(i)
                i = int(self.parents[i])
            out.append(list(reversed(ids)))
        return out

    def next_token_sibling(self) -> tuple[np.ndarray, np.ndarray]:
        """SGLang's ``retrive_next_token`` / ``retrive_next_sibling``: first child and next sibling of each node, -1 if none."""
        n1 = self.n + 1
        first = np.full(n1, -1, dtype=np.int64)
        nxt = np.full(n1, -1, dtype=np.int64)
        last = np.full(n1, -1, dtype=np.int64)
        for i in range(1, n1):
            par = int(self.parents[i])
            if first[par] < 0:
                first[par] = i
            else:
                nxt[last[par]] = i
            last[par] = i
        return first, nxt

    def check_vocab(self, V: int, name: str = "tree") -> None:
        """Raise ValueError if a draft token is outside ``[0, V)``."""
        if self.n and int(self.tokens[1:].max()) >= V:
            i = int(np.argmax(self.tokens)) if self.n else 0
            raise ValueError(
                f"`{name}` has token {int(self.tokens[i])} at node {i}, outside the vocabulary [0, {V})"
            )

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, DraftTree)
            and np.array_equal(self.parents, other.parents)
            and np.array_equal(self.tokens, other.tokens)
        )

    def __hash__(self) -> int:
        return hash((self.parents.tobytes(), self.tokens.tobytes()))

    def __repr__(self) -> str:
        return f"DraftTree(n={self.n}, max_depth={self.max_depth}, paths={self.paths()[1:]})"


#: Eagle2Params' parameters by SGLang's names, with the other names they are also accepted by (EAGLE's
#: ``topK_genrate`` arguments; its ``depth`` there counts one level less, see :meth:`Eagle2Params.from_eagle`).
_EAGLE2_ALIASES = {"num_steps": "depth", "topk": "top_k", "num_draft_tokens": "total_tokens"}


@dataclass(frozen=True, init=False)
class Eagle2Params:
    r"""The parameters of an EAGLE-2 dynamic draft tree (deterministic given the context).

    .. math::

        s(v) = \sum_{j \le d(v)} \log p(x_j \mid x_{<j}),

    the draft's cumulative log-probability of a node's path. Level 1 holds
    the root's ``topk`` most likely tokens; at each later level the
    ``topk`` nodes of the previous level with the largest :math:`s` (the
    frontier; all of level 1 for level 2) each propose their ``topk`` most
    likely children; of all the proposed nodes, the ``num_draft_tokens - 1``
    with the largest :math:`s` are kept (ties: the earlier proposal first,
    which keeps the kept set prefix-closed since :math:`s` never increases
    along a path). See :func:`otspec.tree.sample_tree` with
    ``process="eagle2"``.

    The parameters are SGLang's (``--speculative-num-steps``,
    ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``); the
    names ``depth``, ``top_k`` and ``total_tokens`` are accepted as keywords
    too and are attributes (aliases of the same three numbers), and every
    message names a parameter as the call named it.

    Parameters
    ----------
    num_steps : int
        Number of levels of the tree (its largest depth): SGLang's
        ``speculative_num_steps`` (alias ``depth``). EAGLE's
        ``topK_genrate`` with its own ``depth`` argument builds
        ``depth + 1`` levels (use :meth:`from_eagle`).
    topk : int
        Children proposed per expanded node, and frontier size: SGLang's
        ``speculative_eagle_topk``, EAGLE's ``top_k`` (alias ``top_k``).
    num_draft_tokens : int
        Tree size counting the root: SGLang's
        ``speculative_num_draft_tokens``, EAGLE's ``total_tokens`` (alias
        ``total_tokens``): ``n = num_draft_tokens - 1`` draft nodes, at most
        ``topk + (num_steps - 1) topk**2`` (the number of proposals).

    Raises
    ------
    TypeError, ValueError
        Non-integers, values below 1 (``num_draft_tokens`` below 2), more
        draft nodes than proposals, or more than :data:`MAX_TREE_NODES`
        nodes; a parameter missing, or given under both of its names.

    References
    ----------
    .. [1] Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language
       Models with Dynamic Draft Trees", arXiv:2406.16858, §4 (expansion
       and reranking); SafeAILab/EAGLE ``eagle/model/cnets.py``,
       ``Model.topK_genrate``.
    .. [2] SGLang ``python/sglang/srt/speculative/eagle_utils.py``,
       ``organize_draft_results``, and ``select_top_k_tokens``.

    Examples
    --------
    >>> from otspec.tree import Eagle2Params
    >>> e = Eagle2Params(num_steps=3, topk=2, num_draft_tokens=6)
    >>> e.n, e == Eagle2Params(3, 2, 6) == Eagle2Params(depth=3, top_k=2, total_tokens=6)
    (5, True)
    >>> e
    Eagle2Params(num_steps=3, topk=2, num_draft_tokens=6)
    >>> Eagle2Params.from_eagle(depth=5, top_k=10, total_tokens=60).num_steps
    6
    """

    num_steps: int
    topk: int
    num_draft_tokens: int

    def __init__(self, num_steps=None, topk=None, num_draft_tokens=None, *, depth=None, top_k=None,
                 total_tokens=None):
        given = {"num_steps": num_steps, "topk": topk, "num_draft_tokens": num_draft_tokens, "depth": depth,
                 "top_k": top_k, "total_tokens": total_tokens}
        names = {}
        values = {}
        for sg, other in _EAGLE2_ALIASES.items():
            a, b = given[sg], given[other]
            if a is not None and b is not None:
                raise TypeError(f"Eagle2Params takes `{sg}` or its alias `{other}`, not both (got {sg}={a!r}, "
                                f"{other}={b!r})")
            if a is None and b is None:
                raise TypeError(f"Eagle2Params needs `{sg}` (or its alias `{other}`)")
            names[sg] = other if a is None else sg
            values[sg] = b if a is None else a
        steps_n, topk_n, tokens_n = names["num_steps"], names["topk"], names["num_draft_tokens"]
        steps = validate_positive_int(values["num_steps"], steps_n)
        k = validate_positive_int(values["topk"], topk_n)
        total = validate_positive_int(values["num_draft_tokens"], tokens_n, minimum=2)
        proposals = k + (steps - 1) * k * k
        if total - 1 > proposals:
            raise ValueError(
                f"`{tokens_n}` - 1 = {total - 1} draft nodes exceeds the {proposals} nodes proposed "
                f"({topk_n} + ({steps_n} - 1) * {topk_n}**2 with {steps_n}={steps}, {topk_n}={k})"
            )
        if total - 1 > MAX_TREE_NODES or math.log(k) * 2 + math.log(steps) > math.log(10 * MAX_TREE_NODES):
            raise ValueError(
                f"EAGLE-2 trees with {steps_n}={steps}, {topk_n}={k}, {tokens_n}={total} exceed the stated "
                f"limit MAX_TREE_NODES={MAX_TREE_NODES} (nodes or proposals)"
            )
        object.__setattr__(self, "num_steps", steps)
        object.__setattr__(self, "topk", k)
        object.__setattr__(self, "num_draft_tokens", total)

    @property
    def depth(self) -> int:
        """``num_steps``: the number of levels."""
        return self.num_steps

    @property
    def top_k(self) -> int:
        """``topk``: children per expanded node, and frontier size."""
        return self.topk

    @property
    def total_tokens(self) -> int:
        """``num_draft_tokens``: the tree's size counting the root."""
        return self.num_draft_tokens

    @classmethod
    def from_eagle(cls, *, depth, top_k, total_tokens) -> Eagle2Params:
        """From EAGLE's ``topK_genrate`` arguments: its ``depth`` loop builds ``depth + 1`` levels."""
        return cls(num_steps=validate_positive_int(depth, "depth") + 1, top_k=top_k, total_tokens=total_tokens)

    @classmethod
    def from_sglang(cls, *, num_steps, topk, num_draft_tokens) -> Eagle2Params:
        """From SGLang's ``speculative_num_steps``, ``speculative_eagle_topk``, ``speculative_num_draft_tokens``
        (the constructor's own names)."""
        return cls(num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)

    @property
    def n(self) -> int:
        """Number of draft nodes, ``num_draft_tokens - 1``."""
        return self.total_tokens - 1

    @property
    def max_depth(self) -> int:
        """Largest possible depth of the tree (``num_steps``)."""
        return self.num_steps
