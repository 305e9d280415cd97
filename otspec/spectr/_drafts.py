r"""Draft sets of SpecTr: ``K`` i.i.d. draft sequences, or the leaves of a prefix tree.

Notation: the draft model is :math:`\mathcal M_s` (``p`` at one position),
the target model :math:`\mathcal M_b` (``q``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validation import as_rng
from ._common import next_dist, read_branching, validate_branching, validate_prefix, vocab_size

__all__ = ["DraftSet", "iid_drafts", "prefix_tree_drafts"]


@dataclass(frozen=True, eq=False)
class DraftSet:
    r"""``K`` draft sequences of length ``L``, the leaves of a prefix tree with branching ``(k_1, ..., k_L)``.

    The leaves are stored in tree order: the node at depth ``d`` (``1 <= d <=
    L``) that contains leaf ``j`` is ``j // (k_{d+1} \cdots k_L)``, and all its
    leaves share their first ``d`` tokens. ``K`` i.i.d. sequences are the
    tree with branching ``(K, 1, ..., 1)``: every sequence is its own node at
    every depth, even when two sequences happen to share a prefix.

    This is the draft tree of :class:`otspec.tree.DraftTree` with shape
    ``TreeShape.branching(*branching)`` (``TreeShape.chains(K, L)`` for i.i.d.
    sequences), kept here as a ``(K, L)`` leaf array because DraftSelection
    and the exact recursions index it by depth with a stride;
    ``otspec.tree.DraftTree.from_blocks(draft_set)`` converts it (the tree's
    node tokens are :meth:`node_tokens`).

    Parameters
    ----------
    tokens : (K, L) array_like of int
        The draft sequences (row ``j`` is leaf ``j``).
    branching : sequence of L int or None
        Branching factors with :math:`\prod_i k_i = K`; None means i.i.d.
        sequences, ``(K, 1, ..., 1)``.

    Attributes
    ----------
    tokens : (K, L) ndarray of int64, read-only
    branching : tuple of int
    K : int
    L : int

    Raises
    ------
    ValueError
        If ``tokens`` is not a non-empty 2-D array of non-negative integers,
        the branching does not multiply to ``K``, or leaves that share a tree
        node disagree on that node's tokens.

    Examples
    --------
    >>> from otspec.spectr import DraftSet
    >>> ds = DraftSet([[0, 1], [0, 2], [1, 0], [1, 1]], branching=(2, 2))
    >>> ds.K, ds.L, ds.nodes(0), ds.nodes(1)
    (4, 2, 2, 4)
    >>> ds.node_tokens().tolist()  # depth 1: nodes 0, 1; depth 2: the four leaves
    [0, 1, 1, 2, 0, 1]
    """

    tokens: np.ndarray
    branching: tuple[int, ...] | None = None

    def __post_init__(self):
        try:
            arr = np.array(self.tokens, copy=True)
        except Exception as exc:  # pragma: no cover - defensive
            raise TypeError(f"`tokens` must be a (K, L) array of token ids, got {type(self.tokens).__name__}") from exc
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise ValueError(f"`tokens` must be a non-empty (K, L) array of token ids, got shape {arr.shape}")
        if arr.dtype.kind not in "iu":
            raise TypeError(f"`tokens` must hold integer token ids, got dtype {arr.dtype}")
        if np.any(arr < 0):
            raise ValueError(f"`tokens` must be non-negative token ids, got minimum {arr.min()}")
        arr = arr.astype(np.int64)
        K, L = arr.shape
        ks = validate_branching(K, L, self.branching)
        # leaves in one node at depth d+1 (stride = k_{d+2} ... k_L leaves) share tokens[:, :d+1]
        for d in range(L):
            stride = math.prod(ks[d + 1:])
            if stride > 1:
                block = arr.reshape(K // stride, stride, L)[:, :, : d + 1]
                if np.any(block != block[:, :1, :]):
                    raise ValueError(
                        f"`tokens` are not the leaves of a prefix tree with branching {ks}: leaves of "
                        f"one depth-{d + 1} node disagree on their first {d + 1} tokens"
                    )
        arr.setflags(write=False)
        object.__setattr__(self, "tokens", arr)
        object.__setattr__(self, "branching", ks)

    @property
    def k(self) -> int:
        """Number of draft sequences (leaves); SpecTr writes it ``K``."""
        return int(self.tokens.shape[0])

    @property
    def K(self) -> int:
        """Alias of :attr:`k` (SpecTr's letter)."""
        return self.k

    @property
    def L(self) -> int:
        """Length of every draft sequence (depth of the tree)."""
        return int(self.tokens.shape[1])

    def stride(self, d: int) -> int:
        """Leaves per node at depth ``d + 1`` (the node of token ``tokens[:, d]``)."""
        return math.prod(self.branching[d + 1:])

    def nodes(self, d: int) -> int:
        """Number of tree nodes at depth ``d + 1`` (the draft tokens at position ``d``)."""
        return self.K // self.stride(d)

    def node_tokens(self) -> np.ndarray:
        r"""The token of every tree node, depth by depth, in tree order: ``(n,)`` int64, :math:`n = \sum_d` ``nodes(d)``.

        Node ``j`` at depth ``d + 1`` carries ``tokens[j * stride(d), d]``
        (its first leaf's token at position ``d``). Nodes of one depth are in
        tree order, i.e. by their rank paths (the mixed-radix digits of ``j``
        in ``branching``), so this is the node order of :mod:`otspec.tree`:
        the ``tokens[1:]`` of ``otspec.tree.DraftTree.from_blocks(self)``, whose
        parents are those of ``TreeShape.branching(*self.branching)``.
        """
        return np.concatenate([self.tokens[:: self.stride(d), d] for d in range(self.L)])

    def __repr__(self) -> str:
        return f"DraftSet(k={self.k}, L={self.L}, branching={self.branching})"


def _sample_many(law: np.ndarray, size: int, gen: np.random.Generator) -> np.ndarray:
    """``size`` i.i.d. inverse-CDF draws from a distribution (never a zero-probability token)."""
    c = np.cumsum(law)
    u = gen.random(size) * c[-1]
    idx = np.minimum(np.searchsorted(c, u, side="right"), law.shape[0] - 1)
    for j in range(size):  # skip zero-mass cells reached through rounding at the top edge
        while law[idx[j]] <= 0 and idx[j] > 0:
            idx[j] -= 1
    return idx


def prefix_tree_drafts(draft, branching, *, prefix=(), rng=None) -> DraftSet:
    r"""Sample a prefix tree of drafts from the draft model (SpecTr Appendix D, Algorithm 4).

    .. math::

        S_0 = \{x^t\}, \qquad
        S_{i+1} = \{(s, X_j) : s \in S_i,\ j \le k_{i+1}\},\quad
        X_1, \dots, X_{k_{i+1}} \overset{\text{i.i.d.}}{\sim} \mathcal M_s(\cdot \mid s),

    returning the :math:`K = \prod_i k_i` leaves of depth ``L``. SpecTr's (arXiv:2310.15141)
    Algorithm 4 says "sample from :math:`\mathcal M_b`" in step 5; the draft
    model :math:`\mathcal M_s` is meant (the text above it says so) and is
    what this function uses.

    Parameters
    ----------
    draft : model
        The draft model (``next_dist(prefix) -> (V,) array``).
    branching : sequence of L int
        Expansion factors ``(k_1, ..., k_L)``, each ``>= 1``.
    prefix : sequence of int, keyword-only
        The context :math:`x^t` (default: empty).
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness.

    Returns
    -------
    DraftSet
        ``K`` leaves in tree order.

    Raises
    ------
    ValueError, TypeError
        Invalid branching (empty, non-positive entries), model or prefix.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Appendix D, Algorithm 4.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import prefix_tree_drafts
    >>> ds = prefix_tree_drafts(MemorylessModel([0.5, 0.5]), (2, 2), rng=0)
    >>> ds.K, ds.L, ds.branching
    (4, 2, (2, 2))
    """
    if isinstance(branching, (str, bytes)) or not hasattr(branching, "__len__"):
        raise TypeError(f"`branching` must be a sequence of positive integers, got {type(branching).__name__}")
    ks = read_branching(branching)  # its length and product bounded before any entry past them is read
    n = vocab_size(draft, "draft")
    ctx = validate_prefix(prefix, n)
    gen = as_rng(rng)
    seqs: list[tuple[int, ...]] = [()]
    for k in ks:
        new = []
        for s in seqs:
            p = next_dist(draft, ctx + s, n, "draft")
            new.extend(s + (int(x),) for x in _sample_many(p, k, gen))
        seqs = new
    return DraftSet(np.array(seqs, dtype=np.int64), ks)


def iid_drafts(draft, k, L, *, prefix=(), rng=None) -> DraftSet:
    r"""Sample ``K`` i.i.d. draft sequences of length ``L`` from the draft model (SpecTr eq. 7).

    .. math::

        z_1^L, \dots, z_K^L \overset{\text{i.i.d.}}{\sim}
        \mathcal M_s(\underbrace{\cdot, \dots, \cdot}_{L} \mid x^t).

    Parameters
    ----------
    draft : model
        The draft model (``next_dist(prefix) -> (V,) array``).
    k : int
        Number of draft sequences, ``>= 1``.
    L : int
        Length of each, ``>= 1``.
    prefix : sequence of int, keyword-only
        The context :math:`x^t`.
    rng : numpy.random.Generator, int or None, keyword-only
        Source of randomness.

    Returns
    -------
    DraftSet
        With branching ``(K, 1, ..., 1)``.

    Raises
    ------
    ValueError, TypeError
        ``K < 1``, ``L < 1``, an invalid model or prefix.

    References
    ----------
    .. [1] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, §7, eq. (7).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.spectr import iid_drafts
    >>> iid_drafts(MemorylessModel([0.25, 0.75]), 3, 4, rng=1)
    DraftSet(k=3, L=4, branching=(3, 1, 1, 1))
    """
    K = k  # SpecTr's letter for the number of draft sequences
    ks = validate_branching(K, L, None)
    return prefix_tree_drafts(draft, ks, prefix=prefix, rng=rng)
