r"""Published tree and multi-path verifiers, implemented as their sources specify and measured exactly.

Four schemes from the literature, each as a tree verifier on a realised
draft tree (node 0 the root/context, nodes ``1..n`` the draft tokens,
``parents[i] < i``, siblings in rank order = node order; ``p_nodes[i]`` and
``q_nodes[i]`` the draft's (``p``) and the target's (``q``) law of the next
token after the root path of node ``i``):

* :class:`TraversalVerify` -- Traversal Verification (Weng, Hu et al.,
  arXiv:2505.12398, NeurIPS 2025): leaves first, in post-order, with
  sequence-level acceptance weights; a rejected node is deleted and its
  parent's laws become residuals. Lossless on trees drawn without
  replacement; equal to one-step block verification on a chain.
* :class:`GreedyBlockVerify` -- greedy multi-path block verification (GBV,
  Thomas and Pal, arXiv:2602.16961) on ``k`` i.i.d. draft paths: pick the
  path that is largest in a lexicographic order of ``min(1, q/p)``, then run
  one-step block verification against the law of that maximum ("skewed"
  draft law).
* :class:`HierarchicalVerify` -- hierarchical speculative decoding (HSD,
  Zhou et al., arXiv:2601.05724) on one draft path, as its official code runs
  it (``_speculative_sampling(backward=True, clever=True)``).
* :class:`SpecHubVerify` with its own draft process
  (:func:`sample_spechub_tree`, :func:`enumerate_spechub_trees`) -- SpecHub
  (Sun, Zhou, Chen, Sun, arXiv:2411.05289, EMNLP 2024): two drafts per node,
  one of them the draft's most likely token (the hub).

Each verifier gives ``emission(tree, p_nodes, q_nodes)``, the exact
``(n+1, V)`` law of (accepted node, extra token); ``expected_accepted``; and
``sample`` (the algorithm itself, run with uniforms). What was found
exactly (docs/theory/trees.rst): Traversal Verification is lossless on
without-replacement trees and equals one-step block verification on a chain,
but is lossy on i.i.d. children; GBV as its reference code breaks ties is
lossy (with one consistent order it is lossless) and can accept fewer tokens
with more paths; HSD as its code runs is lossy, which is how it exceeds block
verification's optimum; SpecHub attains the optimum of its own two-draft law.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .._registry import VerifierSpec, register_verifier, validate_name
from .._validation import as_rng, validate_bool, validate_distribution, validate_positive_int
from .._verifier import LOSSLESS_TOL, sample_from, validate_tol
from ..block._weights import path_weights
from ..models import MAX_ENUMERATION, check_enumeration, next_law, validate_model, validate_model_pair, validate_sequence
from ._process import LawCache
from ._tree import DraftTree, TreeShape
from ._value import TreeCheck, check_enumerated
from ._verifiers import TreeVerifier, _NodeScan, make_tree_verifier, validate_tree_laws

__all__ = [
    "GreedyBlockVerify",
    "HierarchicalVerify",
    "MAX_SPECHUB_TREES",
    "SpecHubVerify",
    "TraversalVerify",
    "check_spechub_lossless",
    "enumerate_spechub_trees",
    "sample_spechub_tree",
    "spechub_optimum",
    "spechub_pair_law",
]

#: Most realised trees :func:`enumerate_spechub_trees` lists (a bound checked before enumerating).
MAX_SPECHUB_TREES = 1_000_000


# ---------------------------------------------------------------------------
# input validation
# ---------------------------------------------------------------------------


def _children(parents: np.ndarray) -> list[list[int]]:
    """Children of every node in increasing node id (rank order)."""
    children: list[list[int]] = [[] for _ in range(parents.shape[0])]
    for i in range(1, parents.shape[0]):
        children[int(parents[i])].append(i)
    return children


def _inputs(tree, p_nodes, q_nodes, validate: bool):
    """``(tokens, depth, children, P, Q)``, checked by the tree verifiers' one validator."""
    if validate_bool(validate, "validate"):
        P, Q = validate_tree_laws(tree, p_nodes, q_nodes)
    else:
        P, Q = np.asarray(p_nodes, dtype=np.float64), np.asarray(q_nodes, dtype=np.float64)
    return tree.tokens, tree.depth, _children(tree.parents), P, Q


def _ratio(num: float, den: float) -> float:
    """``min(1, num / den)`` with 1 where ``den == 0`` (draft-probability-zero events; block verification's
    convention), divided only where ``num < den``, so that a subnormal ``den`` cannot overflow the quotient."""
    return num / den if num < den else 1.0


def _normalised(w: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    s = math.fsum(w)
    return w / s if s > 0 else fallback


def _law(law) -> np.ndarray:
    """A try's law of the extra token: an array, or built on demand from a callable (no argument)."""
    return law() if callable(law) else law


class _FirstSuccessRule(TreeVerifier):
    """A rule that tries nodes in an order fixed by the tree, stopping at the first success.

    Subclasses give ``_visits(tokens, children, P, Q)``, yielding
    ``(node, a, law)``: the node tried, its success probability given that
    every earlier try failed, and the law of the extra token when it
    succeeds (an array, or a callable with no argument that builds it, so
    that the passes that do not read it -- :meth:`reach`,
    :meth:`expected_accepted` -- never form it). The exact emission, the
    reach probabilities, the expected length and the sampler all read the
    same tries (the sampler draws the coins; the others sum).
    """

    def _visits(self, tokens, children, P, Q):  # pragma: no cover - abstract
        raise NotImplementedError

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact law of (accepted node, extra token): ``(n + 1, V)``, summing to 1.

        Parameters
        ----------
        tree : DraftTree
        p_nodes, q_nodes : (n + 1, V) array_like
            Draft and target laws of the next token at every node.
        validate : bool, keyword-only
            Check the inputs (skip in loops over already checked trees).

        Returns
        -------
        (n + 1, V) ndarray of float64

        Raises
        ------
        TypeError, ValueError
            A tree that is not a DraftTree, laws of the wrong shape or rows
            that are not distributions, tokens outside the vocabulary, or a
            tree of a form the rule does not take.
        """
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        out = np.zeros(P.shape)
        survive = 1.0
        for v, a, law in self._visits(tokens, children, P, Q):
            if survive <= 0.0:
                break
            m = survive * a
            if m > 0.0:
                out[v] += m * _law(law)
            survive *= 1.0 - a
        return out

    def reach(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact :math:`P(\text{reach } v \mid T)`, shape ``(n + 1,)``: the accepted node lies in the subtree of ``v``.

        .. math::

            P(\text{reach } v \mid T) = \sum_{u \succeq v} P(\text{the try of } u \text{ succeeds}
            \mid T) = \sum_{u \succeq v} \sum_y E[u, y],

        1 at the root, from one pass over the tries (no law of the extra
        token is formed): the mass of :meth:`emission` on the accepted
        paths through ``v``. Parameters, errors: as :meth:`emission`.

        Returns
        -------
        (n + 1,) ndarray of float64
        """
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        out = np.zeros(P.shape[0])
        survive = 1.0
        for v, a, _ in self._visits(tokens, children, P, Q):
            if survive <= 0.0:
                break
            out[v] += survive * a
            survive *= 1.0 - a
        parents = tree.parents
        for c in range(P.shape[0] - 1, 0, -1):
            out[parents[c]] += out[c]
        out[0] = 1.0
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r""":math:`\mathbb E[\tau \mid T]`, the expected number of accepted draft tokens (one pass).

        Parameters, errors: as :meth:`emission`.
        """
        tokens, depth, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        e, survive = 0.0, 1.0
        for v, a, _ in self._visits(tokens, children, P, Q):
            if survive <= 0.0:
                break
            e += survive * a * float(depth[v])
            survive *= 1.0 - a
        return float(e)

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """Run the rule once with uniforms from ``rng``: ``(accepted node, extra token)``.

        Parameters, errors: as :meth:`emission`; ``rng``: numpy Generator, int seed or None.
        """
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        gen = as_rng(rng)
        for v, a, law in self._visits(tokens, children, P, Q):
            if a >= 1.0 or gen.random() < a:
                return int(v), int(sample_from(_law(law), gen))
        raise RuntimeError("no node accepted (the last try always succeeds)")  # pragma: no cover


# ---------------------------------------------------------------------------
# Traversal Verification
# ---------------------------------------------------------------------------


#: Below ``_NOISE * (S + (t + t') l)`` a computed :math:`S(t')` is rounding (each term :math:`q - t' p` of the pass
#: errs by a few ulps of :math:`q + t' p`; over the tokens the pass reads, those off :math:`R`, of draft mass at most
#: :math:`\ell`, with :math:`q \le (q - t p)_+ + t p`, they sum to at most :math:`S + (t + t') \ell`): it counts as 0.
#: (``S + t + t'``, the bound with :math:`\ell` taken as 1, was far above it where :math:`\ell` is small and
#: :math:`t' = t + S / (w \ell)` large: ``1e-7`` of target mass after a rejection at :math:`\ell = 10^{-299}` was
#: dropped as noise, and the rule lost it.)
_NOISE = 64 * np.finfo(np.float64).eps


class _TraversalNode(_NodeScan):
    r"""The state of one node of Traversal Verification, with its residual laws in closed form.

    Let :math:`q, p` be the target's and the draft's laws at the node
    :math:`u`, :math:`R` the tokens of its rejected children and
    :math:`\ell = 1 - p(R)`. Between rejections,

    .. math::

        M_s = p\,\mathbb 1_{\notin R} / \ell, \qquad
        M_b = (q - t p)_+ / S, \quad S = S(t) = \sum_x (q(x) - t p(x))_+,

    for a level :math:`t \ge 0` (:math:`t = 0`, :math:`S = 1` before any
    rejection), and :math:`M_b = 0` on :math:`R`. By induction: the
    rejection of a child :math:`c` with token :math:`x` at weight
    :math:`w = w(u)` sets :math:`M_b \leftarrow r / \sum r` with
    :math:`r = (w M_b - M_s)_+`. Off :math:`R`, where :math:`q - t p > 0`,
    :math:`w M_b - M_s = \frac{w}{S}\big(q - t' p\big)` with
    :math:`t' = t + S / (w \ell)`; where :math:`q - t p \le 0` both
    :math:`r` and :math:`(q - t' p)_+` are 0 (:math:`t' \ge t`,
    :math:`p \ge 0`); on :math:`R` both :math:`M_b` and :math:`M_s` are 0.
    So :math:`r = \frac{w}{S} (q - t' p)_+` off :math:`R`,
    :math:`\sum r = w\, S(t') / S(t)` and :math:`M_b` is the level
    :math:`t'`. At :math:`x` itself the new residual is 0: the rejection
    of :math:`c` has positive probability only if its weight at its push,
    :math:`\min(1, w M_b(x) / M_s(x))`, was below 1 (a weight of 1 stays 1,
    :math:`S / (S + 1 - 1) = 1`, so :math:`c`'s subtree is then accepted
    for sure and nothing later is read), and :math:`u`'s state has not
    changed since; so :math:`w M_b(x) < M_s(x)`, :math:`r(x) = 0` and
    :math:`q(x) - t' p(x) \le 0`, which stays so at every later (higher)
    level. Then :math:`x` joins :math:`R`. The degenerate rejections keep
    the level: :math:`S(t') = 0` (:math:`r = 0`: :math:`M_b` kept,
    :math:`w \leftarrow 0`, or 1 when :math:`w = 1`), :math:`w = 0`
    (:math:`r = 0`) and :math:`\ell = 0` (:math:`M_s = 0`, :math:`r = w M_b`,
    :math:`w` kept). A computed :math:`S(t')` within rounding of 0
    (``_NOISE``) counts as 0: :math:`S(t') = 0` exactly is common (one token
    left, equal laws), and a positive rounding residue there would be
    renormalised into a law of noise. With :math:`S(t') = 0` and :math:`w < 1`
    every later weight at :math:`u` is 0; with :math:`w = 1`,
    :math:`M_b = M_s` off :math:`R`, so a later rejection there again has
    probability 0 or a token where both laws are 0.

    So a rejection costs one pass for :math:`S(t')`, over the tokens with
    :math:`q - t p > 0` only (a set that shrinks as :math:`t` grows), a
    child's weight is two gathers, and the law :math:`M_b` is formed only
    where the extra token is read (:meth:`residual`).
    """

    def __init__(self, q: np.ndarray, p: np.ndarray, buf: np.ndarray):
        super().__init__(q, p, buf, True)

    def weight(self, w: float, tok: int) -> float:
        """A child's weight :math:`\\min(1, w\\, M_b(x) / M_s(x))`, 0 where :math:`M_s(x) = 0`."""
        d = self._draft(tok, tok in self.removed)
        return min(1.0, w * self.residual_at(tok) / d) if d > 0.0 else 0.0

    def reject_child(self, tok: int, w: float) -> float:
        """Delete a child with token ``tok`` rejected at the node's weight ``w``; return the node's new weight."""
        dup = tok in self.removed
        wl = w * self.left
        if wl > 0.0:
            S, t_new = self.S, self.t + self.S / wl
            # (t + t') l = 2 t l + S / w, finite where t' is not (w l below 2**-1022)
            s = w * (self._level(t_new, _NOISE * (S + 2.0 * self.t * self.left + S / w)) / S)
        else:
            s = w if not self.left > 0.0 else 0.0  # no draft mass left: r = w M_b; else w = 0: r = 0
        self._remove(tok, dup)
        den = s + (1.0 - w)  # exact 1 - w (w in [0.5, 1]): a weight of 1 stays exactly 1
        return s / den if den > 0.0 else 1.0


def _traversal_visits(children, tokens, P, Q):
    """Post-order tries of Traversal Verification: ``(node, acceptance, law of the extra token)``.

    The order of tries is fixed (post-order, siblings in rank order, the root
    last) because the run stops at the first acceptance; the weights and laws
    of the nodes tried later depend only on the rejections before them. A
    node's state is a :class:`_TraversalNode` (made at its first child), so
    a rejection is one pass over the tokens its residual still holds; the law
    is ``Q[v]`` at a node without children, else the node's
    :meth:`~_TraversalNode.residual` method (formed when called).
    """
    n1 = P.shape[0]
    w = [1.0] * n1
    node: list = [None] * n1
    buf = np.empty(P.shape[1])
    nxt = [0] * n1
    stack = [0]
    while stack:
        v = stack[-1]
        if nxt[v] < len(children[v]):
            c = children[v][nxt[v]]
            nxt[v] += 1
            if node[v] is None:
                node[v] = _TraversalNode(Q[v], P[v], buf)
            w[c] = node[v].weight(w[v], int(tokens[c]))
            stack.append(c)
            continue
        stack.pop()
        yield v, (1.0 if v == 0 else w[v]), (Q[v] if node[v] is None else node[v].residual)
        if v == 0:
            return
        u = stack[-1]
        w[u] = node[u].reject_child(int(tokens[v]), w[u])


@dataclass(frozen=True)
class TraversalVerify(_FirstSuccessRule):
    r"""Traversal Verification (Weng, Hu et al., arXiv:2505.12398): leaf-to-root, sequence-level acceptance.

    Every node :math:`v` carries a sequence-level weight, initially

    .. math::

        w(\text{root}) = 1, \qquad
        w(c) = \min\Big(1, w(v)\,\frac{M_b(x_c \mid v)}{M_s(x_c \mid v)}\Big)
        \quad (c \text{ a child of } v),

    with :math:`M_b = q` (target) and :math:`M_s = p` (draft) at :math:`v`.
    The nodes are tried in post-order (the first leaf in depth-first order,
    siblings in rank order; a node once all its children are deleted; the
    root last, where acceptance is certain). A tried node :math:`c` is accepted
    with probability :math:`w(c)`: the root path of :math:`c` is emitted with
    one more token from :math:`M_b(\cdot \mid c)` (the target's law, or its
    residual if children of :math:`c` were rejected). If rejected, :math:`c` is
    deleted and its parent :math:`u` updated:

    .. math::

        S = \sum_x \big(w(u) M_b(x \mid u) - M_s(x \mid u)\big)_+, \quad
        M_b(\cdot \mid u) \leftarrow \frac{(w(u) M_b - M_s)_+}{S}, \quad
        w(u) \leftarrow \frac{S}{S + 1 - w(u)},

    and :math:`M_s(\cdot \mid u)` loses the token of :math:`c` (renormalised:
    the draw without replacement); the weights of the siblings not yet tried
    follow from the updated parent. On a chain the tries are the block
    :math:`X^L, X^{L-1}, \dots` with block verification's :math:`h_i`, so the
    rule is the one-step block verification of Sun et al. (arXiv:2403.10444,
    published version), exactly (Weng, Hu et al. state this equivalence).

    Attributes
    ----------
    name : str
        ``"traversal"``.
    processes : tuple of str
        ``("wor",)``: lossless on children drawn without replacement (and on
        chains). On i.i.d. children it is lossy (docs/theory/trees.rst).

    References
    ----------
    .. [1] Y. Weng, Q. Hu, X. Chen, L. Liu, D. Mei, H. Qiu, J. Tian, Z. Shi, "Traversal
       Verification for Speculative Tree Decoding", arXiv:2505.12398 (NeurIPS 2025),
       abstract and method (leaf-to-root traversal, sequence-level acceptance).
    .. [2] Z. Sun et al., "Block Verification Accelerates Speculative Decoding",
       arXiv:2403.10444 (the weights :math:`p_i` and :math:`h_i`).

    Examples
    --------
    A chain of two tokens (draft (2/3, 1/3), target (1/3, 2/3) at every node):

    >>> import numpy as np
    >>> from otspec.tree import DraftTree
    >>> from otspec.tree._published import TraversalVerify
    >>> tree = DraftTree.from_paths([(1,), (1, 0)])
    >>> p, q = np.tile([2/3, 1/3], (3, 1)), np.tile([1/3, 2/3], (3, 1))
    >>> e = TraversalVerify().emission(tree, p, q)
    >>> e.sum(axis=1).round(4)  # P(accepted path ends at node 0, 1, 2)
    array([0. , 0.5, 0.5])
    """

    name: ClassVar[str] = "traversal"
    processes: ClassVar[tuple[str, ...]] = ("wor",)

    def lossless_for(self, process: str, shape=None) -> bool:
        """``"wor"`` on shapes without rank gaps; ``"iid"`` on one chain (every node at most one child)."""
        if process == "iid":
            return isinstance(shape, TreeShape) and shape.n == shape.max_depth
        return process == "wor" and not (isinstance(shape, TreeShape) and shape.has_rank_gaps)

    def _visits(self, tokens, children, P, Q):
        return _traversal_visits(children, tokens, P, Q)


# ---------------------------------------------------------------------------
# one-step block verification along one path (GBV, HSD)
# ---------------------------------------------------------------------------


def _chain_rule(block, cs, cb, bonus, *, final: str = "block"):
    """One-step block verification's ``h_0..h_L`` and emitted laws along one path.

    ``final="block"``: :math:`h_L = p_L` (Sun et al.); ``final="joint"``:
    :math:`h_L = \\min(1, M_b(X^L)/M_s(X^L))` (HSD's code).
    """
    L = len(block)
    # the joint ratios and the capped chain, exact past the float range (a ratio over a draft probability below
    # about 1e-154 and a product of two such overflowed, with a RuntimeWarning); the float products where they stay
    # normal, bit for bit
    ratios, w = path_weights([cs[i][x] for i, x in enumerate(block)], [cb[i][x] for i, x in enumerate(block)])
    joint = ratios[L]
    h = [1.0]
    laws = []
    for i in range(L):
        r = np.maximum(w[i] * cb[i] - cs[i], 0.0)
        z = math.fsum(r)
        if i > 0:
            den = z + (1.0 - w[i])  # 1 - w exact (w in [0.5, 1]): a weight of 1 gives h = 1, not 1 + eps
            h.append(z / den if den > 0 else 1.0)
        laws.append(_normalised(r, cb[i]))
    h.append(w[L] if final == "block" else min(1.0, joint))
    laws.append(bonus)
    return h, laws


def _chain_visits(nodes, h, laws):
    """Block verification as tries from the longest prefix down: ``tau = max{i : eta_i <= h_i}``."""
    for t in range(len(h) - 1, -1, -1):
        yield nodes[t], h[t], laws[t]


def _chains(children, name: str = "tree"):
    """The root's children as ``k`` disjoint chains of one length ``L``: list of node lists."""
    k = len(children[0])
    if k == 0:
        raise ValueError(f"`{name}` must have at least one draft path, got a root without children")
    chains = []
    for c in children[0]:
        path = [c]
        while children[path[-1]]:
            if len(children[path[-1]]) > 1:
                raise ValueError(f"`{name}` must be k disjoint chains (each node at most one child); "
                                 f"node {path[-1]} has {len(children[path[-1]])} children")
            path.append(children[path[-1]][0])
        chains.append(path)
    L = {len(ch) for ch in chains}
    if len(L) != 1:
        raise ValueError(f"`{name}`'s draft paths must have one length L, got lengths {sorted(L)}")
    return chains


# ---------------------------------------------------------------------------
# GBV
# ---------------------------------------------------------------------------


def _skew(p: np.ndarray, F: np.ndarray, A: float, x: float, K: int) -> np.ndarray:
    r"""Law of the next token of the maximum of ``K`` i.i.d. paths given its prefix.

    .. math::

        \frac{(A + x F(y))^K - (A + x F(y^-))^K}{(A + x)^K - A^K},

    with the differences of powers factored (no cancellation).
    """
    a = A + x * F
    b = A + x * (F - p)
    num = np.zeros_like(p)
    den = 0.0
    for i in range(K):
        num += a**i * b ** (K - 1 - i)
        den += (A + x) ** i * A ** (K - 1 - i)
    out = p * num
    if not (den > 0 and x > 0):
        return p
    return _normalised(out / den, p)


def _gbv_path(chains, tokens, P, Q, tie_break):
    """The chain GBV selects (its node list) and the skewed draft laws along it."""
    K, L = len(chains), len(chains[0])
    V = P.shape[1]
    alive = list(range(K))
    u = 0
    orders = []
    for d in range(L):
        p, q = P[u], Q[u]
        ratio = np.where(p > 0, np.minimum(1.0, q / np.where(p > 0, p, 1.0)), 1.0)
        order = np.lexsort((np.arange(V), ratio))  # ascending min(1, q/p), ties by ascending token id
        rank = np.empty(V, dtype=np.int64)
        rank[order] = np.arange(V)
        orders.append(order)
        toks = [int(tokens[chains[j][d]]) for j in alive]
        if tie_break == "token":
            best = max(toks, key=lambda t: rank[t])
        else:  # the reference code: the first path (lowest index) among those of largest ratio
            top = max(ratio[t] for t in toks)
            best = next(t for t in toks if ratio[t] == top)
        alive = [j for j, t in zip(alive, toks) if t == best]
        u = chains[alive[0]][d]
    nodes = [0] + chains[alive[0]]
    A, x = 0.0, 1.0
    skews = []
    for d in range(L):
        p = P[nodes[d]]
        F = np.empty(V)
        F[orders[d]] = np.cumsum(p[orders[d]])
        skews.append(_skew(p, F, A, x, K))
        t = int(tokens[nodes[d + 1]])
        A += x * (F[t] - p[t])
        x *= p[t]
    return nodes, skews


@dataclass(frozen=True)
class GreedyBlockVerify(_FirstSuccessRule):
    r"""Greedy multi-path block verification (GBV; Thomas and Pal, arXiv:2602.16961) on ``k`` i.i.d. paths.

    At each prefix the vocabulary is ordered by :math:`r(x) = \min(1, q(x)/p(x))`
    (ascending, ties by ascending token id); paths are ordered
    lexicographically by these ranks. GBV walks from the root to the child of
    largest rank among the drafted paths and so selects the maximum
    :math:`X^*` of the ``k`` i.i.d. paths. The law of that maximum given its
    prefix :math:`x^d` (probability :math:`x = P(x^d)`, mass :math:`A` of the
    paths ranked below the prefix, :math:`F` the cumulative draft law in rank
    order) is the skewed draft law

    .. math::

        \tilde p(y \mid x^d) = \frac{(A + x F(y))^k - (A + x F(y^-))^k}{(A + x)^k - A^k},

    and GBV runs one-step block verification (Sun et al., arXiv:2403.10444)
    on :math:`X^*` with :math:`\tilde p` as the draft law. With ``k = 1`` it is
    block verification.

    Parameters
    ----------
    tie_break : {"token", "first-path"}
        Which drafted child is "largest" when ratios tie (every token with
        :math:`q \ge p` has :math:`r = 1`): ``"token"`` (default) the larger
        token id, the order the skewed law assumes -- lossless;
        ``"first-path"`` the path of lowest index, as the reference
        implementation (``TreeVerifier.gbv_verify``) does -- lossy
        (docs/theory/trees.rst).

    Attributes
    ----------
    name : str
        ``"gbv"``.
    processes : tuple of str
        ``("iid",)`` on ``k`` disjoint chains of one length
        (``TreeShape.chains(k, L)``).

    References
    ----------
    .. [1] R. Thomas, A. Pal, "Greedy Multi-Path Block Verification for Faster Decoding in
       Speculative Sampling", arXiv:2602.16961 (abstract); reference code
       ``verifier.py``, ``TreeVerifier.gbv_verify`` and ``compute_skew``.
    .. [2] Z. Sun et al., "Block Verification Accelerates Speculative Decoding", arXiv:2403.10444.

    Examples
    --------
    One token, two paths, draft (1/2, 1/2), target (3/5, 2/5): GBV accepts
    17/20, below the 9/10 of one path.

    >>> import numpy as np
    >>> from otspec.tree import DraftTree
    >>> from otspec.tree._published import GreedyBlockVerify
    >>> p, q = np.tile([0.5, 0.5], (3, 1)), np.tile([0.6, 0.4], (3, 1))
    >>> trees = [(DraftTree(None, [-1, 0, 0], [-1, a, b]), 0.25) for a in (0, 1) for b in (0, 1)]
    >>> round(sum(w * GreedyBlockVerify().expected_accepted(t, p, q) for t, w in trees) * 20, 10)
    17.0
    """

    tie_break: str = "token"
    name: ClassVar[str] = "gbv"
    processes: ClassVar[tuple[str, ...]] = ("iid",)

    def __post_init__(self):
        validate_name(self.tie_break, "tie_break", ("token", "first-path"))  # an array: never compared

    def lossless_for(self, process: str, shape=None) -> bool:
        """``"iid"`` on ``k`` disjoint chains of one length, with ``tie_break="token"``."""
        if process != "iid" or self.tie_break != "token":
            return False
        if not isinstance(shape, TreeShape):
            return True
        try:
            _chains(_children(shape.parents), "shape")
        except ValueError:
            return False
        return True

    def _visits(self, tokens, children, P, Q):
        nodes, skews = _gbv_path(_chains(children), tokens, P, Q, self.tie_break)
        block = [int(tokens[v]) for v in nodes[1:]]
        h, laws = _chain_rule(block, skews, [Q[v] for v in nodes[:-1]], Q[nodes[-1]])
        return _chain_visits(nodes, h, laws)

    def selected_path(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> tuple[int, ...]:
        """Node ids (root first) of the path GBV verifies.

        Parameters, errors: as :meth:`emission`.
        """
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        return tuple(int(v) for v in _gbv_path(_chains(children), tokens, P, Q, self.tie_break)[0])


# ---------------------------------------------------------------------------
# HSD
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HierarchicalVerify(_FirstSuccessRule):
    r"""Hierarchical speculative decoding (HSD; Zhou et al., arXiv:2601.05724) on one draft path, as coded.

    The official implementation (``transformers/generation/utils.py``,
    ``_speculative_sampling`` with ``backward=True, clever=True``, one round
    per step) computes, for the prefixes :math:`x^k` of the draft block
    (:math:`k = 0..L-1`), the joint ratios :math:`R_k = M_b(x^k)/M_s(x^k)`,
    the capped weights :math:`w_k = R_k / \max(1, R_1, \dots, R_k)` and

    .. math::

        h_k = \frac{\sum_y (w_k M_b(y \mid x^k) - M_s(y \mid x^k))_+}
                   {\sum_y (M_s(y \mid x^k) - w_k M_b(y \mid x^k))_+};

    it accepts the whole block with probability :math:`\min(1, R_L)`, and
    otherwise the prefix :math:`x^\tau`, :math:`\tau = \max\{k < L : \eta_k \le h_k\}`,
    with one token from :math:`(w_\tau M_b - M_s)_+` normalised. The
    :math:`w_k` are block verification's :math:`p_k` and the :math:`h_k`
    (:math:`k < L`) its :math:`h_k` (Sun et al., arXiv:2403.10444); the only
    difference is the last one: :math:`\min(1, R_L)` instead of
    :math:`p_L = \min(1, p_{L-1} M_b(x_L \mid x^{L-1}) / M_s(x_L \mid x^{L-1}))`.
    That makes HSD accept the whole block more often than block verification
    and makes it lossy (smallest case: ``V = 2``, ``L = 2``;
    docs/theory/trees.rst).

    Attributes
    ----------
    name : str
        ``"hsd"``.
    processes : tuple of str
        ``()``: lossless for no draft process.

    References
    ----------
    .. [1] Y. Zhou, F. Huang, H. Li, F. Wu, T. Wang, J. Zhang, J. Lin, Z.-Q. Cheng,
       "Overcoming Joint Intractability with Lossless Hierarchical Speculative Decoding",
       arXiv:2601.05724; code ZhouYuxuanYX/Hierarchical-Speculative-Decoding,
       ``transformers/generation/utils.py``, ``_speculative_sampling``.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.tree import DraftTree
    >>> from otspec.tree._published import HierarchicalVerify
    >>> tree = DraftTree.from_paths([(1,), (1, 0)])
    >>> p, q = np.tile([2/3, 1/3], (3, 1)), np.tile([1/3, 2/3], (3, 1))
    >>> HierarchicalVerify().emission(tree, p, q).sum(axis=1).round(4)  # whole block accepted w.p. 1
    array([0., 0., 1.])
    """

    name: ClassVar[str] = "hsd"
    processes: ClassVar[tuple[str, ...]] = ()

    def lossless_for(self, process: str, shape=None) -> bool:
        """Only on one chain of one token (where it is block verification), i.i.d. or without replacement."""
        return process in ("iid", "wor") and isinstance(shape, TreeShape) and shape.n == 1

    def _visits(self, tokens, children, P, Q):
        chains = _chains(children)
        if len(chains) != 1:
            raise ValueError(f"`tree` must be one draft path (a chain), got {len(chains)} paths")
        nodes = [0] + chains[0]
        block = [int(tokens[v]) for v in nodes[1:]]
        h, laws = _chain_rule(block, [P[v] for v in nodes[:-1]], [Q[v] for v in nodes[:-1]],
                              Q[nodes[-1]], final="joint")
        return _chain_visits(nodes, h, laws)


# ---------------------------------------------------------------------------
# SpecHub
# ---------------------------------------------------------------------------


def _hub(p: np.ndarray) -> tuple[int, np.ndarray]:
    """The hub ``a = argmax p`` (lowest id among ties) and the law of the other draft when the first is ``a``."""
    a = int(np.argmax(p))
    rest = p.copy()
    rest[a] = 0.0
    s = math.fsum(rest)
    if s > 0:
        return a, rest / s
    r = np.zeros_like(p)  # p is a point mass at a: the second draft is fixed (it has draft probability 0)
    r[1 if a == 0 else 0] = 1.0
    return a, r


def spechub_pair_law(p) -> np.ndarray:
    r"""SpecHub's law of the two drafts at one node: ``(V, V)``, entry ``[i, j]`` = P(first = i, second = j).

    .. math::

        P(i, a) = p(i) \ (i \ne a), \qquad
        P(a, j) = p(a) \frac{p(j)}{1 - p(a)} \ (j \ne a), \qquad a = \arg\max p

    (lowest token id among ties; when :math:`p(a) = 1` the second draft is
    the lowest token id other than :math:`a`). Needs ``V >= 2``.

    Parameters
    ----------
    p : (V,) array_like
        Draft law.

    Returns
    -------
    (V, V) ndarray of float64

    Raises
    ------
    ValueError
        ``p`` not a distribution, or ``V < 2``.

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, "SpecHub: Provable Acceleration to Multi-Draft
       Speculative Decoding", arXiv:2411.05289 (EMNLP 2024); code
       MasterGodzilla/Speculative_decoding_OT, ``EAGLE/eagle/model/cnets.py``, ``sample(mode='spechub')``.

    Examples
    --------
    >>> from otspec.tree._published import spechub_pair_law
    >>> spechub_pair_law([0.5, 0.3, 0.2]).round(2)
    array([[0. , 0.3, 0.2],
           [0.3, 0. , 0. ],
           [0.2, 0. , 0. ]])
    """
    p = np.array(validate_distribution(p, "p", normalizable=False))
    if p.shape[0] < 2:
        raise ValueError(f"`p` must have V >= 2 (two distinct drafts), got V = {p.shape[0]}")
    a, r = _hub(p)
    out = np.zeros((p.shape[0], p.shape[0]))
    out[:, a] = p
    out[a, a] = 0.0
    out[a, :] = p[a] * r
    return out


def spechub_optimum(p, q) -> float:
    r"""The most acceptance any lossless verifier gets from SpecHub's two drafts at one node.

    .. math::

        \alpha_{\rm hub}(p, q) = \max_{\pi \in \Pi(P_{\rm hub}, q)} P_\pi(Y \in \{X_1, X_2\})
        = \min\Big(1,\ q(a) + \sum_{i \ne a} \min\Big(q(i), \frac{p(i)}{1 - p(a)}\Big)\Big),

    where :math:`P_{\rm hub}` is :func:`spechub_pair_law`: the drafted set is
    :math:`\{i, a\}` with probability :math:`p(i)/(1 - p(a))`, so the min-cut
    :math:`\min_U q(U) + P(\{X_1, X_2\} \not\subseteq U)` only needs the sets
    :math:`U \ni a` (closed form derived here; the paper states its
    verifier's optimality for this law through an LP).

    Parameters
    ----------
    p, q : (V,) array_like
        Draft and target laws, ``V >= 2``.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        Not distributions, different lengths, or ``V < 2``.

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, arXiv:2411.05289 (the hub's sparse joint law and its LP).

    Examples
    --------
    >>> from otspec.tree._published import spechub_optimum
    >>> round(spechub_optimum([0.5, 0.3, 0.2], [0.2, 0.3, 0.5]), 10)
    0.9
    """
    P = np.array(validate_distribution(p, "p", normalizable=False))
    Q = np.array(validate_distribution(q, "q", normalizable=False))
    if P.shape != Q.shape:
        raise ValueError(f"`p` and `q` must have the same length, got {P.shape[0]} and {Q.shape[0]}")
    if P.shape[0] < 2:
        raise ValueError(f"`p` must have V >= 2 (two distinct drafts), got V = {P.shape[0]}")
    pair = spechub_pair_law(P)
    a, _ = _hub(P)
    m = pair.sum(axis=0) + pair.sum(axis=1)  # P(i in the drafted set), i != a
    m[a] = 1.0
    total = Q[a] + math.fsum(np.minimum(Q, m)[np.arange(P.shape[0]) != a])
    return float(min(1.0, total))


def _spechub_node(p: np.ndarray, t: np.ndarray, x1: int, x2: int):
    """SpecHub's verification at one node with drafts ``(x1, x2)``: ``(P(accept x1), P(accept x2), residual)``.

    The official ``EAGLE/eagle/model/utils.py`` (``evaluate_posterior``, mode
    ``'spechub'``) in four stages; ``Q_ia = p`` off ``a`` (pairs ``(i, a)``),
    ``Q_ai = p(a) r`` (pairs ``(a, i)``).
    """
    a, r = _hub(p)
    q_ia = p.copy()
    q_ia[a] = 0.0
    q_ai = p[a] * r
    s1 = _ratio(t[x1], p[x1]) if (x2 == a and x1 != a) else 0.0
    t1 = np.maximum(t - q_ia, 0.0)
    t1[a] = t[a]
    left_ia = np.maximum(q_ia - t, 0.0)
    left_ia[a] = 0.0
    s2 = _ratio(t1[x2], q_ai[x2]) if (x1 == a and x2 != a) else 0.0
    t2 = np.maximum(t1 - q_ai, 0.0)
    t2[a] = t[a]
    left_ai = np.maximum(q_ai - t1, 0.0)
    left_ai[a] = 0.0
    m_ai, m_ia = math.fsum(left_ai), math.fsum(left_ia)
    s3 = _ratio(t2[a], m_ai) if x1 == a else 0.0
    t2[a] = max(t2[a] - m_ai, 0.0)
    s4 = _ratio(t2[a], m_ia) if x2 == a else 0.0
    t2[a] = max(t2[a] - m_ia, 0.0)
    if x2 == a and x1 != a:  # pair (i, a): i at stage 1, a at stage 4
        acc1, acc2 = s1, (1.0 - s1) * s4
    elif x1 == a and x2 != a:  # pair (a, j): j at stage 2, a at stage 3
        acc1, acc2 = (1.0 - s2) * s3, s2
    else:  # not a hub pair (only in trees from elsewhere): nothing is accepted
        acc1 = acc2 = 0.0
    return acc1, acc2, _normalised(t2, t)


@dataclass(frozen=True)
class SpecHubVerify(TreeVerifier):
    r"""SpecHub's verifier (Sun, Zhou, Chen, Sun, arXiv:2411.05289) on trees of one or two children per node.

    At a node with two drafts :math:`(X_1, X_2)` from :func:`spechub_pair_law`
    (hub :math:`a = \arg\max p`), with target law :math:`t`: (1) a pair
    :math:`(i, a)` accepts :math:`i` w.p. :math:`\min(1, t(i)/p(i))`; then
    :math:`t \leftarrow (t - p)_+` off :math:`a`; (2) a pair :math:`(a, j)`
    accepts :math:`j` w.p. :math:`\min(1, t(j)/Q_{ai}(j))`,
    :math:`Q_{ai}(j) = p(a)p(j)/(1 - p(a))`; then :math:`t \leftarrow (t - Q_{ai})_+`
    off :math:`a`; (3) the rejected :math:`(a, j)` pairs, of total mass
    :math:`m_{ai} = \sum_j (Q_{ai}(j) - t_1(j))_+`, accept :math:`a` w.p.
    :math:`\min(1, t(a)/m_{ai})`, and :math:`t(a) \leftarrow (t(a) - m_{ai})_+`;
    (4) the rejected :math:`(i, a)` pairs, of mass :math:`m_{ia} = \sum_i (p(i) - t(i))_+`,
    accept :math:`a` w.p. :math:`\min(1, t(a)/m_{ia})`. Nothing accepted: one
    token from the leftover :math:`t` normalised. An accepted child continues
    at that child. A node with one child is verified by speculative sampling
    (:math:`\min(1, t/p)`, residual :math:`(t - p)_+`), a leaf emits the bonus
    token from :math:`q`. The official code also accepts :math:`a` outright
    when :math:`t(a) > 1 - 10^{-3}` (a numerical shortcut, lossy by up to
    :math:`10^{-3}`); this class does not.

    Attributes
    ----------
    name : str
        ``"spechub"``.
    processes : tuple of str
        ``("spechub",)``: trees from :func:`sample_spechub_tree`.

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, "SpecHub: Provable Acceleration to Multi-Draft
       Speculative Decoding", arXiv:2411.05289 (EMNLP 2024); code
       MasterGodzilla/Speculative_decoding_OT, ``EAGLE/eagle/model/utils.py``, ``evaluate_posterior``.

    Examples
    --------
    At one node SpecHub attains :func:`spechub_optimum`:

    >>> import numpy as np
    >>> from otspec.tree._published import SpecHubVerify, enumerate_spechub_trees, spechub_optimum
    >>> from otspec.tree import TreeShape
    >>> from otspec.models import MemorylessModel
    >>> p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    >>> trees = enumerate_spechub_trees(TreeShape([(0,), (1,)]), MemorylessModel(p))
    >>> P, Q = np.tile(p, (3, 1)), np.tile(q, (3, 1))
    >>> acc = sum(w * SpecHubVerify().expected_accepted(t, P, Q) for t, w in trees)
    >>> round(acc, 10), round(spechub_optimum(p, q), 10)
    (0.9, 0.9)
    """

    name: ClassVar[str] = "spechub"
    processes: ClassVar[tuple[str, ...]] = ("spechub",)

    @staticmethod
    def _node(v, tokens, children, P, Q):
        """Acceptance probability of each child of ``v`` and the law emitted when none is accepted."""
        ch = children[v]
        if len(ch) > 2:
            raise ValueError(f"`tree` must have at most two children per node (SpecHub), node {v} has {len(ch)}")
        if len(ch) == 1:
            x = int(tokens[ch[0]])
            return [_ratio(Q[v][x], P[v][x])], _normalised(np.maximum(Q[v] - P[v], 0.0), Q[v])
        a1, a2, res = _spechub_node(P[v], Q[v], int(tokens[ch[0]]), int(tokens[ch[1]]))
        return [a1, a2], res

    def _stops(self, tokens, children, P, Q):
        """Per node: ``(node, P(reach it and stop there), law of the extra token)``, top-down."""
        stops = []
        stack = [(0, 1.0)]
        while stack:
            v, reach = stack.pop()
            if not children[v]:
                stops.append((v, reach, Q[v]))
                continue
            acc, res = self._node(v, tokens, children, P, Q)
            stops.append((v, reach * (1.0 - sum(acc)), res))
            stack.extend((c, reach * s) for c, s in zip(children[v], acc))
        return stops

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact law of (accepted node, extra token): ``(n + 1, V)``.

        Parameters
        ----------
        tree : DraftTree
            At most two children per node.
        p_nodes, q_nodes : (n + 1, V) array_like
        validate : bool, keyword-only
            Check the inputs.

        Returns
        -------
        (n + 1, V) ndarray of float64

        Raises
        ------
        TypeError, ValueError
            Malformed inputs, or a node with more than two children.
        """
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        out = np.zeros(P.shape)
        for v, m, law in self._stops(tokens, children, P, Q):
            out[v] += m * law
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r""":math:`\mathbb E[\tau \mid T]`. Parameters, errors: as :meth:`emission`."""
        tokens, depth, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        return float(math.fsum(m * float(depth[v]) for v, m, _ in self._stops(tokens, children, P, Q)))

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """Run SpecHub once: ``(accepted node, extra token)``. Parameters, errors: as :meth:`emission`."""
        tokens, _, children, P, Q = _inputs(tree, p_nodes, q_nodes, validate)
        gen = as_rng(rng)
        v = 0
        while children[v]:
            acc, res = self._node(v, tokens, children, P, Q)
            u, nxt = gen.random(), None
            for c, s in zip(children[v], acc):
                if u < s:
                    nxt = c
                    break
                u -= s
            if nxt is None:
                return v, int(sample_from(res, gen))
            v = nxt
        return v, int(sample_from(Q[v], gen))


# ---------------------------------------------------------------------------
# SpecHub's draft process
# ---------------------------------------------------------------------------


def _shape_arrays(shape):
    if not all(hasattr(shape, a) for a in ("parents", "depth")):
        raise TypeError(f"`shape` must be a TreeShape (parents, depth), got {type(shape).__name__}")
    parents = np.asarray(shape.parents, dtype=np.int64)
    depth = np.asarray(shape.depth, dtype=np.int64)
    n1 = parents.shape[0]
    children: list[list[int]] = [[] for _ in range(n1)]
    for i in range(1, n1):
        children[int(parents[i])].append(i)
    bad = [v for v in range(n1) if len(children[v]) > 2]
    if bad:
        raise ValueError(f"`shape` must have at most two children per node (SpecHub), node {bad[0]} has "
                         f"{len(children[bad[0]])}")
    return parents, depth, children


def _prefix(prefix) -> tuple[int, ...]:
    try:
        out = tuple(prefix)
    except TypeError:
        raise TypeError(f"`prefix` must be a sequence of token ids, got {type(prefix).__name__}") from None
    if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in out):
        raise TypeError("`prefix` must contain integer token ids")
    return tuple(int(x) for x in out)


def _node_outcomes(p: np.ndarray, m: int):
    """Children tokens of a node with ``m`` children and their probabilities."""
    if m == 1:
        return [((x,), float(p[x])) for x in np.flatnonzero(p > 0)]
    pair = spechub_pair_law(p)
    i, j = np.nonzero(pair > 0)
    return [((int(x), int(y)), float(pair[x, y])) for x, y in zip(i, j)]


def _make_tree(shape, parents, depth, tokens) -> DraftTree:
    return DraftTree(shape=shape, parents=parents.copy(), tokens=np.asarray(tokens, dtype=np.int64),
                     depth=depth.copy())


def enumerate_spechub_trees(shape, draft, *, prefix=()) -> list[tuple[DraftTree, float]]:
    r"""Every realised tree of SpecHub's draft process on ``shape``, with its probability.

    .. math::

        P(T) = \prod_{v \text{ internal}} P_v(\text{children of } v),

    where a node with two children draws the pair from
    :func:`spechub_pair_law` of the draft's law at that node (rank 0 = first
    draft, rank 1 = second), and a node with one child draws it from that law.
    Only trees of positive probability are listed.

    Parameters
    ----------
    shape : TreeShape
        At most two children per node.
    draft : Model
        The draft model (``vocab_size``, ``next_dist(prefix)``).
    prefix : sequence of int, keyword-only
        The context.

    Returns
    -------
    list of (DraftTree, float)
        Probabilities sum to 1.

    Raises
    ------
    TypeError, ValueError
        A malformed shape or model; a node with more than two children;
        ``V < 2`` with a two-child node; more than :data:`MAX_SPECHUB_TREES`
        possible trees (checked before enumerating).

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, arXiv:2411.05289; code ``cnets.py``, ``sample(mode='spechub')``.

    Examples
    --------
    >>> from otspec.tree._published import enumerate_spechub_trees
    >>> from otspec.tree import TreeShape
    >>> from otspec.models import MemorylessModel
    >>> trees = enumerate_spechub_trees(TreeShape([(0,), (1,)]), MemorylessModel([0.5, 0.3, 0.2]))
    >>> [(t.tokens[1:].tolist(), round(w, 2)) for t, w in trees]
    [([0, 1], 0.3), ([0, 2], 0.2), ([1, 0], 0.3), ([2, 0], 0.2)]
    """
    parents, depth, children = _shape_arrays(shape)
    V = validate_model(draft, "draft")
    prefix = _prefix(prefix)
    internal = [v for v in range(parents.shape[0]) if children[v]]
    if any(len(children[v]) == 2 for v in internal) and V < 2:
        raise ValueError(f"`draft.vocab_size` must be >= 2 for a node with two children, got {V}")
    bound = 1
    for v in internal:
        bound *= V if len(children[v]) == 1 else 2 * (V - 1)
        if bound > MAX_SPECHUB_TREES:
            raise ValueError(f"`shape` has up to {bound}+ realised trees at V = {V}, more than "
                             f"MAX_SPECHUB_TREES = {MAX_SPECHUB_TREES}")
    n1 = parents.shape[0]
    partial = [(np.full(n1, -1, dtype=np.int64), 1.0)]
    for v in internal:  # parents before children: node order
        grown = []
        for toks, w in partial:
            path = []
            u = v
            while u > 0:
                path.append(int(toks[u]))
                u = int(parents[u])
            law = next_law(draft, prefix + tuple(reversed(path)), V, "draft")
            for kids, pr in _node_outcomes(law, len(children[v])):
                t = toks.copy()
                t[children[v]] = kids
                grown.append((t, w * pr))
        partial = grown
    return [(_make_tree(shape, parents, depth, t), w) for t, w in partial]


def sample_spechub_tree(shape, draft, *, prefix=(), rng=None) -> DraftTree:
    """Draw one realised tree of SpecHub's draft process on ``shape`` (see :func:`enumerate_spechub_trees`).

    Parameters
    ----------
    shape : TreeShape
        At most two children per node.
    draft : Model
    prefix : sequence of int, keyword-only
    rng : numpy Generator, int or None, keyword-only

    Returns
    -------
    DraftTree

    Raises
    ------
    TypeError, ValueError
        As :func:`enumerate_spechub_trees` (no size limit: one tree).

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, arXiv:2411.05289.

    Examples
    --------
    >>> from otspec.tree._published import sample_spechub_tree
    >>> from otspec.tree import TreeShape
    >>> from otspec.models import MemorylessModel
    >>> t = sample_spechub_tree(TreeShape([(0,), (1,)]), MemorylessModel([0.5, 0.3, 0.2]), rng=0)
    >>> 0 in t.tokens[1:].tolist()  # the hub is always drafted
    True
    """
    parents, depth, children = _shape_arrays(shape)
    V = validate_model(draft, "draft")
    prefix = _prefix(prefix)
    gen = as_rng(rng)
    n1 = parents.shape[0]
    toks = np.full(n1, -1, dtype=np.int64)
    paths = {0: ()}
    for v in range(n1):
        ch = children[v]
        if not ch:
            continue
        law = next_law(draft, prefix + paths[v], V, "draft")
        if len(ch) == 1:
            toks[ch[0]] = sample_from(law, gen)
        else:
            if V < 2:
                raise ValueError(f"`draft.vocab_size` must be >= 2 for a node with two children, got {V}")
            pair = spechub_pair_law(law)
            k = int(sample_from(pair.ravel(), gen))
            toks[ch[0]], toks[ch[1]] = divmod(k, V)
        for c in ch:
            paths[c] = paths[v] + (int(toks[c]),)
    return _make_tree(shape, parents, depth, toks)


def check_spechub_lossless(shape, draft, target, *, verifier="spechub", prefix=(),
                           max_sequences: int = MAX_ENUMERATION, tol: float = LOSSLESS_TOL) -> TreeCheck:
    r"""Check exactly whether a tree verifier is lossless on SpecHub's draft process.

    .. math::

        \max_{z \in \Omega^{D+1}} \big| R(z) - M_b(z \mid \text{prefix}) \big|,

    ``R`` the emitted path and token completed by the target to ``D + 1``
    tokens, summed over every realised tree of :func:`enumerate_spechub_trees`
    (:func:`otspec.tree.check_lossless` for this process).

    Parameters
    ----------
    shape : TreeShape
        At most two children per node.
    draft, target : Model
    verifier : str or TreeVerifier, keyword-only
        Default ``"spechub"`` (:class:`SpecHubVerify`).
    prefix : sequence of int, keyword-only
    max_sequences : int, keyword-only
        Refuse when ``V**(D + 1)`` exceeds it.
    tol : float, keyword-only
        ``passed`` is ``max_error <= tol``.

    Returns
    -------
    otspec.tree.TreeCheck
        ``process="spechub"``.

    Raises
    ------
    TypeError, ValueError
        As :func:`enumerate_spechub_trees` and :func:`otspec.tree.check_lossless`.

    References
    ----------
    .. [1] R. Sun, T. Zhou, X. Chen, L. Sun, arXiv:2411.05289.

    Examples
    --------
    >>> from otspec.models import random_markov_model
    >>> from otspec.tree import TreeShape
    >>> from otspec.tree._published import check_spechub_lossless
    >>> d, t = random_markov_model(3, rng=3), random_markov_model(3, rng=13)
    >>> check_spechub_lossless(TreeShape.branching(2, 1), d, t).passed
    True
    >>> check_spechub_lossless(TreeShape.branching(2, 1), d, t, verifier="specinfer").passed
    False
    """
    V = validate_model_pair(draft, target)
    ctx = validate_sequence(prefix, V, "prefix")
    v = make_tree_verifier(verifier)
    tol = validate_tol(tol)
    max_sequences = validate_positive_int(max_sequences, "max_sequences")
    if not isinstance(shape, TreeShape):
        raise TypeError(f"`shape` must be a TreeShape, got {type(shape).__name__}")
    D = int(shape.max_depth)
    check_enumeration(V, D + 1, max_sequences, what="completed sequences", length_name="max_depth + 1",
                      limit_name="max_sequences")
    trees = enumerate_spechub_trees(shape, draft, prefix=ctx)
    dl, tl = LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target")
    return check_enumerated(v, trees, dl, tl, V, D, tol=tol, process="spechub", shape=shape)


_REFS = {
    "traversal": "Weng, Hu et al., Traversal Verification, arXiv:2505.12398 (NeurIPS 2025)",
    "gbv": "Thomas and Pal, greedy multi-path block verification, arXiv:2602.16961",
    "hsd": "Zhou et al., hierarchical speculative decoding, arXiv:2601.05724 (official code, clever mode)",
    "spechub": "Sun, Zhou, Chen, Sun, SpecHub, arXiv:2411.05289 (EMNLP 2024)",
}
for _cls, _summary, _options in (
    (TraversalVerify, "leaf-to-root traversal with sequence-level weights (lossless without replacement)",
     frozenset()),
    (GreedyBlockVerify, "greedy multi-path block verification on k i.i.d. chains", frozenset({"tie_break"})),
    (HierarchicalVerify, "hierarchical speculative decoding on one chain, as coded (lossy)", frozenset()),
    (SpecHubVerify, "SpecHub's hub-pair verifier on its own two-draft trees", frozenset()),
):
    register_verifier(VerifierSpec(
        _cls.name, "tree", None, build_tree=_cls, processes=_cls.processes, draft_process="tree",
        lossless=bool(_cls.processes), options=_options, summary=_summary, reference=_REFS[_cls.name],
    ))
del _cls, _summary, _options
