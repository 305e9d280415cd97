r"""Tree verifiers: per-node rules that accept a root path of a realised draft tree and emit one more token.

Given a realised tree :math:`T` (nodes ``0..n``, node 0 the root) and the
draft's and the target's laws at every node (``p_nodes``, ``q_nodes``, shape
``(n + 1, V)``, from :func:`otspec.tree.tree_laws`), a tree verifier walks
down from the root, accepts a root path ending at some node ``a`` and emits
one token ``y`` (a correction, or the bonus token at a leaf). Its exact
result on :math:`T` is the *emission* law

.. math::

    E[a, y] = P(\text{the accepted path ends at node } a,\ \text{the emitted token is } y \mid T),
    \qquad \mathbb E[\tau \mid T] = \sum_a d(a) \sum_y E[a, y]
    = \sum_{v \ne 0} P(\text{reach } v \mid T).

For a per-node rule, :math:`P(\text{reach } v)` is the product of the
per-node acceptance probabilities along the path: one pass over the tree,
exact at any vocabulary size. Each verifier is lossless (the emitted path
and token, continued by the target, follow the target) only for the draft
processes in its ``processes`` attribute; :func:`otspec.tree.check_lossless`
decides it by exact enumeration.

Notation: ``p`` is the draft law and ``q`` the target law at a node.
"""

from __future__ import annotations

import abc
import math

import numpy as np

from .._jit import compile_in
from .._registry import VerifierSpec, lookup_verifier, register_verifier, verifier_names
from .._validation import SIMPLEX_TOL, as_float_array, as_rng, validate_bool
from .._verifier import sample_from
from ..spectr._common import VerifierFactory, resolve_verifier
from ._process import PROCESSES
from ._tree import DraftTree, TreeShape

__all__ = [
    "SequoiaVerifier",
    "SpecInferVerifier",
    "SpecTrTreeVerifier",
    "TargetOnlyVerifier",
    "TreeVerifier",
    "make_tree_verifier",
    "validate_tree_laws",
]


def validate_tree_laws(tree, p_nodes, q_nodes) -> tuple[np.ndarray, np.ndarray]:
    """Check ``tree`` and its ``(n + 1, V)`` laws: rows non-negative, finite, summing to 1 within SIMPLEX_TOL.

    Float64 arrays are used as they are (never written); other inputs are
    converted. Two passes over each array (a minimum and the row sums).
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"`tree` must be a DraftTree, got {type(tree).__name__}")
    out = []
    for name, a in (("p_nodes", p_nodes), ("q_nodes", q_nodes)):
        # other inputs read as every law is read (None, text, complex, booleans, objects refused naming `name`)
        arr = a if type(a) is np.ndarray and a.dtype == np.float64 else as_float_array(
            a, name, "an (n + 1, V) array of float", booleans=False)
        if arr.ndim != 2 or arr.shape[0] != tree.n + 1 or arr.shape[1] < 1:
            raise ValueError(
                f"`{name}` must have shape (n + 1, V) = ({tree.n + 1}, V) for a tree of n={tree.n} nodes, got {arr.shape}"
            )
        if not arr.min() >= 0:
            raise ValueError(f"`{name}` must be finite and non-negative, got minimum {float(np.nanmin(arr))!r} or NaN")
        s = arr.sum(axis=1)
        bad = np.flatnonzero(~(np.abs(s - 1.0) <= SIMPLEX_TOL))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"`{name}[{i}]` must sum to 1 within {SIMPLEX_TOL:g}, got {float(s[i])!r}")
        out.append(arr)
    if out[0].shape != out[1].shape:
        raise ValueError(f"`p_nodes` and `q_nodes` must have the same shape, got {out[0].shape} and {out[1].shape}")
    tree.check_vocab(out[0].shape[1])
    return out[0], out[1]


class _Layout:
    """The tree arranged for one vectorised pass: internal nodes sorted by number of children (most first).

    ``rows[j]`` is an internal node; ``kids[j, r]`` its rank-``r`` child (-1 past its last child);
    ``count[r]`` the number of rows with more than ``r`` children (rows ``:count[r]`` take part at rank ``r``);
    ``dup[c]`` whether child ``c`` repeats the token of an earlier sibling.
    """

    def __init__(self, tree: DraftTree):
        parents, tokens = tree.parents, tree.tokens
        n1 = tree.n + 1
        kids: dict = {}
        seen: dict = {}
        dup = np.zeros(n1, dtype=bool)
        for c in range(1, n1):
            par = int(parents[c])
            kids.setdefault(par, []).append(c)
            s = seen.setdefault(par, set())
            t = int(tokens[c])
            dup[c] = t in s
            s.add(t)
        order = sorted(kids, key=lambda v: (-len(kids[v]), v))
        m = max((len(kids[v]) for v in order), default=0)
        mat = np.full((len(order), m), -1, dtype=np.int64)
        for j, v in enumerate(order):
            mat[j, : len(kids[v])] = kids[v]
        self.rows = np.array(order, dtype=np.int64)
        self.kids = mat
        self.count = [int(np.count_nonzero(mat[:, r] >= 0)) for r in range(m)] + [0]
        self.dup = dup
        self.children = kids
        self.leaves = np.array(sorted(set(range(n1)) - set(kids)), dtype=np.int64)
        self.levels = [np.flatnonzero(tree.depth == d) for d in range(1, tree.max_depth + 1)]


def _reach(tree: DraftTree, layout: _Layout, acc: np.ndarray) -> np.ndarray:
    """``reach[v] = prod of acc along the root path of v`` (acc[v] = P(accept v | its parent reached))."""
    reach = np.ones(tree.n + 1)
    for idx in layout.levels:
        reach[idx] = reach[tree.parents[idx]] * acc[idx]
    return reach


class TreeVerifier(abc.ABC):
    r"""Abstract base class of the tree verifiers: one contract for every rule.

    * :meth:`emission` ``(tree, p_nodes, q_nodes)``: the exact ``(n + 1, V)``
      law of (accepted node, emitted token) given the realised tree;
    * :meth:`expected_accepted`: :math:`\mathbb E[\tau \mid T]`, the expected
      number of accepted draft tokens;
    * :meth:`sample` ``(..., rng=)``: one draw of (accepted node, token);
    * :attr:`processes`: the draft processes (:data:`otspec.tree.PROCESSES`)
      on which the emitted tokens, continued by the target, follow the
      target exactly; :meth:`lossless_for` refines it per shape.

    ``p_nodes[i]`` and ``q_nodes[i]`` are the draft's and the target's laws
    of the next token after the root path of node ``i``.

    Attributes
    ----------
    name : str
        The registered name.
    processes : tuple of str
        The draft processes it is lossless for.
    """

    name: str = ""
    processes: tuple = ()

    def lossless_for(self, process: str, shape=None) -> bool:
        """Whether the rule is lossless on trees of ``process`` (and of this shape, where it matters)."""
        return process in self.processes

    @abc.abstractmethod
    def emission(self, tree: DraftTree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        """Exact ``(n + 1, V)`` law of (accepted node, emitted token) given the realised tree."""

    @abc.abstractmethod
    def expected_accepted(self, tree: DraftTree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        """Exact expected number of accepted draft tokens given the realised tree."""

    @abc.abstractmethod
    def sample(self, tree: DraftTree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """One draw of (accepted node, emitted token)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, processes={self.processes})"


def _excess_kernel(q, p, t, idx, n):
    """:math:`S(t) = \\sum_x (q(x) - t p(x))_+` in one pass over the ``n`` tokens ``idx[:n]`` (increasing), those
    with ``q - t p > 0`` moved to the front of ``idx`` in the same order; returns ``(S, their number)``
    (compiled by numba when installed)."""
    s = 0.0
    m = 0
    for k in range(n):
        i = idx[k]
        d = q[i] - t * p[i] if p[i] > 0.0 else q[i]  # p = 0: q itself, also at t = inf (0 * inf is nan)
        if d > 0.0:
            s += d
            idx[m] = i
            m += 1
    return s, m


JIT = compile_in(globals(), ("_excess_kernel",))


def _excess(q: np.ndarray, p: np.ndarray, t: float, buf: np.ndarray, idx: np.ndarray, n: int) -> tuple[float, int]:
    """:math:`S(t) = \\sum_x (q(x) - t p(x))_+`, the mass left by the residual at level ``t``, over the ``n``
    tokens ``idx[:n]`` (increasing, holding every token with ``q - t p > 0``); those tokens moved to the front of
    ``idx``, with their number. With numba the sum runs in token order, the terms off ``idx`` being the zeros it
    skips, so it is bit for bit the sum over the whole vocabulary."""
    if JIT:  # pragma: no cover - with numba
        S, m = _excess_kernel(q, p, t, idx, n)
        return float(S), int(m)
    if t == math.inf:  # a level past the float range (draft mass left below 2**-1022): the tokens of p = 0 stay
        d = np.where(p[idx[:n]] > 0.0, -math.inf, q[idx[:n]])
    elif n == q.shape[0]:  # the whole vocabulary: no gather
        d = np.subtract(q, np.multiply(p, t, out=buf), out=buf)
    else:
        d = q[idx[:n]] - t * p[idx[:n]]
    keep = np.flatnonzero(d > 0.0)
    m = keep.shape[0]
    idx[:m] = keep if n == q.shape[0] else idx[keep]
    np.maximum(d, 0.0, out=d)
    return float(d.sum()), int(m)


def _above(q: float, p: float, t: float) -> float:
    """:math:`(q - t p)_+` of one token, ``q`` where ``p = 0`` (also at ``t = inf``, where ``0 * inf`` is nan)."""
    return max(q - t * p, 0.0) if p > 0.0 else q


def _ratio(num: float, den: float) -> float:
    """``min(1, num / den)``; for ``den = 0``: 1 if ``num > 0`` else 0 (a token the draft never proposes)."""
    if den > 0.0:
        return min(1.0, num / den)
    return 1.0 if num > 0.0 else 0.0


class _NodeScan:
    r"""Recursive rejection at one node, with the residuals in closed form.

    Every residual of the scan is :math:`q_i = (q - t_i p)_+ / S(t_i)` for a
    level :math:`t_i` (:math:`t_1 = 0`, :math:`S(0) = 1`): if
    :math:`q_i = (q - t_i p)_+ / S_i`, then off the removed tokens
    :math:`(q_i - p / \ell)_+ = (q - (t_i + S_i / \ell) p)_+ / S_i`, with
    :math:`\ell = 1` with replacement and :math:`\ell = 1 - p(\text{removed})`
    without (where :math:`q - t_i p \le 0` both sides are 0; a removed token
    was rejected, so :math:`q_i` is already 0 there). So a rejection costs
    one pass over the vocabulary (:math:`S(t_{i+1})`) and nothing is
    written; an acceptance probability is two gathers. If
    :math:`S(t_{i+1}) = 0` then :math:`q_i = p_i` and its rejections have
    probability 0: the level is kept.
    """

    def __init__(self, q: np.ndarray, p: np.ndarray, buf: np.ndarray, without_replacement: bool):
        self.q, self.p, self.buf = q, p, buf
        self.wor = without_replacement
        self.t, self.S, self.left = 0.0, 1.0, 1.0
        self.removed: list = []
        # the tokens with q - t p > 0 are among idx[:n]: a set that only shrinks as t grows (p >= 0), so each
        # rejection's pass runs over the previous one's survivors (the first over the whole vocabulary)
        self.idx = None
        self.n = q.shape[0]

    def _draft(self, tok: int, dup: bool) -> float:
        """Draft probability of the next child: ``p`` (with replacement) or ``p`` off the removed siblings."""
        if not self.wor:
            return float(self.p[tok])
        if dup or not self.left > 0.0:
            return 0.0
        return float(self.p[tok]) / self.left

    def accept(self, tok: int, dup: bool) -> float:
        qc = _above(float(self.q[tok]), float(self.p[tok]), self.t) / self.S
        return _ratio(qc, self._draft(tok, dup))

    def reject(self, tok: int, dup: bool) -> None:
        ell = 1.0 if not self.wor else self.left
        if ell > 0.0:
            self._level(self.t + self.S / ell)
        self._remove(tok, dup)

    def _level(self, t_new: float, floor: float = 0.0) -> float:
        """Move to the level ``t_new`` (one pass over the tokens left) if :math:`S(t_{new}) >` ``floor``; return
        :math:`S(t_{new})`, or 0 where the level is kept."""
        if self.idx is None:
            self.idx = np.arange(self.n)
        S_new, m = _excess(self.q, self.p, t_new, self.buf, self.idx, self.n)
        if S_new > floor:
            self.t, self.S, self.n = t_new, S_new, m
            return S_new
        if m > 0:  # kept at a positive S(t_new): idx[:m] now holds t_new's tokens, so scan them all again
            self.idx, self.n = None, self.q.shape[0]
        return 0.0  # else m = 0 and idx[:n] untouched: the level and its tokens are kept

    def _remove(self, tok: int, dup: bool) -> None:
        """Without replacement: take a rejected child's token out of the draft law (its mass off ``left``)."""
        if self.wor and not dup:
            self.removed.append(tok)
            self.left -= float(self.p[tok])
            if self.left < 0.5:  # the difference lost its relative precision: sum what is left instead
                self.buf[:] = self.p
                self.buf[self.removed] = 0.0
                self.left = float(self.buf.sum())

    def residual_at(self, tok: int) -> float:
        """The current residual law at one token, :math:`(q(x) - t p(x))_+ / S`."""
        return _above(float(self.q[tok]), float(self.p[tok]), self.t) / self.S

    def residual(self) -> np.ndarray:
        """The current residual law :math:`(q - t p)_+ / S` (a new array)."""
        if self.t == math.inf:  # the level of a rejection past the float range: the tokens of p = 0 stay
            out = np.where(self.p > 0.0, 0.0, self.q)
        else:
            out = self.q - self.t * self.p
            np.maximum(out, 0.0, out=out)
        out /= self.S
        return out


class _PerNodeScan(TreeVerifier):
    """Rules that scan a node's children in rank order: accept one, or update the residual and go on.

    The exact pass visits every node with children once, in a Python loop over
    the ``n`` children, with one pass over the vocabulary per rejection that
    has a later sibling (:class:`_NodeScan`); the sampler walks one path with
    the same per-node code.
    """

    without_replacement = False

    def _scan(self, tree, P, Q, *, residuals: bool):
        layout = _Layout(tree)
        acc = np.zeros(tree.n + 1)
        alive = np.ones(tree.n + 1)
        resid = {}
        buf = np.empty(Q.shape[1])
        for v, kids in layout.children.items():
            node = _NodeScan(Q[v], P[v], buf, self.without_replacement)
            w = 1.0
            last = len(kids) - 1
            for i, c in enumerate(kids):
                tok, dup = int(tree.tokens[c]), bool(layout.dup[c])
                a = node.accept(tok, dup)
                acc[c] = w * a
                w *= 1.0 - a
                if i < last or residuals:
                    node.reject(tok, dup)
            alive[v] = w
            if residuals:
                resid[v] = node.residual()
        return layout, acc, alive, resid

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r"""Exact :math:`\mathbb E[\tau \mid T] = \sum_{v \ne 0} P(\text{reach } v \mid T)`, one pass over the tree.

        Parameters
        ----------
        tree : DraftTree
        p_nodes, q_nodes : (n + 1, V) array_like of float
            Draft and target laws at every node.
        validate : bool, keyword-only
            Check the inputs (two passes over each law array); False for hot loops on checked laws.

        Returns
        -------
        float
        """
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        return float(self.reach(tree, p_nodes, q_nodes, validate=False)[1:].sum())

    def reach(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact :math:`P(\text{reach } v \mid T)` of every node, shape ``(n + 1,)`` (1 at the root).

        The product of the per-node acceptance probabilities along the root path, from the same pass as
        :meth:`expected_accepted` (no residual is formed); equal to the mass of :meth:`emission` on the
        accepted paths through ``v``.
        """
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        layout, acc, _, _ = self._scan(tree, p_nodes, q_nodes, residuals=False)
        return _reach(tree, layout, acc)

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact law :math:`E[a, y]` of (accepted node, emitted token), shape ``(n + 1, V)``.

        Row ``a`` is :math:`P(\text{reach } a)` times, at a leaf, the target
        law ``q_nodes[a]`` (the bonus token), else the probability that every
        child of ``a`` is rejected times the final residual law.

        Parameters
        ----------
        tree : DraftTree
        p_nodes, q_nodes : (n + 1, V) array_like of float
        validate : bool, keyword-only

        Returns
        -------
        (n + 1, V) ndarray of float64
            Non-negative, summing to 1.
        """
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        layout, acc, alive, resid = self._scan(tree, p_nodes, q_nodes, residuals=True)
        reach = _reach(tree, layout, acc)
        out = np.empty(q_nodes.shape)
        for v in range(tree.n + 1):
            if v in resid:
                np.multiply(resid[v], reach[v] * alive[v], out=out[v])
            else:
                np.multiply(q_nodes[v], reach[v], out=out[v])
        return out

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """One walk down the tree with uniform coins: (accepted node, emitted token).

        A child is accepted when ``u < a`` for ``u`` uniform on [0, 1) (strict:
        an acceptance probability 0 never accepts).

        Parameters
        ----------
        tree : DraftTree
        p_nodes, q_nodes : (n + 1, V) array_like of float
        rng : numpy.random.Generator, int or None, keyword-only
        validate : bool, keyword-only

        Returns
        -------
        (int, int)
            The last accepted node (0: none) and the emitted token.
        """
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        gen = as_rng(rng)
        layout = _Layout(tree)
        buf = np.empty(q_nodes.shape[1])
        v = 0
        while True:
            kids = layout.children.get(v)
            if not kids:
                return v, sample_from(q_nodes[v], gen)
            node = _NodeScan(q_nodes[v], p_nodes[v], buf, self.without_replacement)
            nxt = None
            for c in kids:
                tok, dup = int(tree.tokens[c]), bool(layout.dup[c])
                if gen.random() < node.accept(tok, dup):
                    nxt = c
                    break
                node.reject(tok, dup)
            if nxt is None:
                return v, sample_from(node.residual(), gen)
            v = nxt


class SpecInferVerifier(_PerNodeScan):

    r"""SpecInfer's multi-step speculative sampling on a tree (drafts drawn with replacement).

    .. math::

        q_1 = q,\quad
        P(\text{accept } c_i \mid \text{reach } v,\ c_{<i} \text{ rejected}) = \min\Big(1, \frac{q_i(c_i)}{p(c_i)}\Big),
        \quad q_{i+1} = \frac{(q_i - p)_+}{\lVert (q_i - p)_+ \rVert_1},

    at a node ``v`` with children :math:`c_1, \dots, c_m` in rank order and
    laws ``p = p_nodes[v]``, ``q = q_nodes[v]``; an accepted child is
    descended into, and if all are rejected the token is drawn from
    :math:`q_{m+1}`; a leaf emits the bonus token from ``q``. Lossless when
    the children are i.i.d. draws from ``p`` (``process="iid"``), any shape;
    not on ``"wor"`` or ``"topk"`` trees.

    References
    ----------
    .. [1] Miao et al., "SpecInfer: Accelerating Large Language Model Serving
       with Tree-based Speculative Inference and Verification",
       arXiv:2305.09781, §4 (multi-step speculative sampling, Algorithm 2).

    Examples
    --------
    One chain ``1, 0`` with ``p = (1/2, 1/2)`` and ``q = (1/4, 3/4)`` at every
    node: token 1 is accepted surely, then token 0 with probability 1/2.

    >>> import numpy as np
    >>> from otspec.tree import DraftTree, SpecInferVerifier
    >>> chain = DraftTree.from_paths([(1,), (1, 0)])
    >>> laws_p, laws_q = np.full((3, 2), 0.5), np.tile([0.25, 0.75], (3, 1))
    >>> SpecInferVerifier().expected_accepted(chain, laws_p, laws_q)
    1.5
    """

    name = "specinfer"
    processes = ("iid",)



class SequoiaVerifier(_PerNodeScan):
    r"""Sequoia's verification of children drawn without replacement (EAGLE's first sampling rule).

    .. math::

        p_1 = p,\quad p_{i+1} = \frac{p_i\, \mathbb 1[\cdot \ne c_i]}{1 - p_i(c_i)},\quad
        P(\text{accept } c_i \mid \dots) = \min\Big(1, \frac{q_i(c_i)}{p_i(c_i)}\Big),\quad
        q_{i+1} = \frac{(q_i - p_i)_+}{\lVert (q_i - p_i)_+ \rVert_1},

    the draft law of the ``i``-th child being ``p`` with the earlier siblings
    removed and renormalised; otherwise as :class:`SpecInferVerifier`.
    Lossless on ``"wor"`` trees whose siblings have ranks ``0..m-1`` (a rank
    missing from the shape is a discarded draw the rule cannot see).

    References
    ----------
    .. [1] Chen et al., "Sequoia: Scalable, Robust, and Hardware-aware
       Speculative Decoding", arXiv:2402.12374, §3.2 (sampling without
       replacement, Algorithm 2).
    .. [2] Li et al., EAGLE, arXiv:2401.15077; SafeAILab/EAGLE first release,
       ``eagle/model/utils.py`` ``evaluate_posterior`` (sampling branch, the
       draft law with earlier siblings masked and renormalised).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.tree import DraftTree, SequoiaVerifier
    >>> t = DraftTree.from_paths([(0,), (1,)])
    >>> P = np.array([[0.5, 0.5]] * 3); Q = np.array([[0.2, 0.8]] * 3)
    >>> round(SequoiaVerifier().expected_accepted(t, P, Q), 12)  # both tokens drafted: always one accepted
    1.0
    """

    name = "sequoia"
    processes = ("wor",)

    without_replacement = True

    def lossless_for(self, process: str, shape=None) -> bool:
        if process != "wor":
            return False
        return not (isinstance(shape, TreeShape) and shape.has_rank_gaps)


class TargetOnlyVerifier(TreeVerifier):
    r"""The target-only rule: draw the next token from the target, descend while it is a child.

    .. math::

        Y \sim q_v,\qquad \text{descend into the (first) child of } v \text{ carrying } Y
        \text{ if any, else emit } Y,

    so :math:`P(\text{reach } v) = \prod_{j \le d(v)} q(x_j \mid x_{<j}) = Q(x_{1:d(v)})`
    (duplicates among siblings reached through the first) and
    :math:`\mathbb E[\tau \mid T] = \sum_{v \ne 0} Q(x_{1:d(v)})` over the
    nodes whose path is first among equal paths. The draft law is never
    read, and the tree is drawn before (independently of) the target's
    draws, so the emitted tokens are target draws: lossless on every draft
    process (``"iid"``, ``"wor"``, ``"topk"``, ``"eagle2"``). It is
    recursive rejection with draft probability 1 for each candidate (accept
    ``c`` w.p. :math:`q_i(c)`, else zero it and renormalise) in law, which is
    EAGLE-2's sampling-mode rule.

    References
    ----------
    .. [1] SGLang, ``tree_speculative_sampling_target_only`` (sgl-kernel,
       called from ``python/sglang/srt/speculative/eagle_info.py``).
    .. [2] SafeAILab/EAGLE ``eagle/model/utils.py``, ``evaluate_posterior``
       (sampling branch: acceptance ``px / qx`` with ``qx = 1.0``, a rejected
       token zeroed and the target law renormalised).

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.tree import DraftTree, TargetOnlyVerifier
    >>> t = DraftTree.from_paths([(0,), (0, 1)])
    >>> P = np.full((3, 2), 0.5); Q = np.array([[0.25, 0.75]] * 3)
    >>> TargetOnlyVerifier().expected_accepted(t, P, Q)  # Q(0) + Q(0, 1)
    0.4375
    """

    name = "target-only"
    processes = PROCESSES

    def _acc(self, tree, layout, Q):
        ch = np.arange(1, tree.n + 1)
        acc = Q[tree.parents[ch], tree.tokens[ch]]
        return np.concatenate(([1.0], np.where(layout.dup[1:], 0.0, acc)))

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r""":math:`\sum_{v \ne 0} Q(x_{1:d(v)})` over first-of-equal nodes: ``n`` gathers, no pass over ``V``."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        layout = _Layout(tree)
        return float(_reach(tree, layout, self._acc(tree, layout, q_nodes))[1:].sum())

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        """Row ``a``: :math:`P(\\text{reach } a)\\, q_a` off the tokens of ``a``'s children."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        layout = _Layout(tree)
        reach = _reach(tree, layout, self._acc(tree, layout, q_nodes))
        out = reach[:, None] * q_nodes
        ch = np.arange(1, tree.n + 1)
        out[tree.parents[ch], tree.tokens[ch]] = 0.0
        return out

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """Draw ``Y`` from the target at each node; descend into the first child carrying ``Y``, else emit it."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        gen = as_rng(rng)
        layout = _Layout(tree)
        v = 0
        while True:
            y = sample_from(q_nodes[v], gen)
            nxt = next((c for c in layout.children.get(v, ()) if tree.tokens[c] == y), None)
            if nxt is None:
                return v, y
            v = nxt


class SpecTrTreeVerifier(TreeVerifier):
    r"""SpecTr's DraftSelection on a tree: a token-level verifier at each depth on the surviving children.

    .. math::

        Y_t \sim \pi_t(\cdot \mid X_1, \dots, X_{m}),\quad
        \pi_t \in \Pi\big(p^{\otimes m}, q\big),\quad
        S_{t+1} = \{\text{children in the pool carrying } Y_t\},

    where the pool :math:`X_1, \dots, X_m` gathers, in node order, the
    children of every surviving node (all surviving nodes carry the same
    path, so the pool is ``m`` i.i.d. draws from the common ``p`` on an
    ``"iid"`` tree); stop at the first :math:`Y_t` outside the pool
    (correction) or when the pool is empty (bonus from ``q``). Lossless on
    ``"iid"`` trees of any shape (SpecTr's prefix trees are
    :meth:`TreeShape.branching`); the accepted node reported is the first
    surviving node.

    Parameters
    ----------
    token_verifier : str, callable or VerifierFactory
        The token-level plan (:func:`otspec.spectr.resolve_verifier`:
        ``"lp"``, ``"optimal"``, ``"kseq"``, ``"multiround"``, ...).

    References
    ----------
    .. [1] Sun, Suresh, Ro, Beirami, Jain, Yu, "SpecTr: Fast Speculative
       Decoding via Optimal Transport", arXiv:2310.15141, §7, Algorithm 3
       (DraftSelection) and Appendix D (prefix trees).

    Examples
    --------
    Two root children, both token 0, at ``p = (1, 0)``: every plan accepts
    token 0 with probability ``q(0) = 0.3`` (then the first of the two nodes
    is reported, and the bonus token drawn from ``q``), else emits token 1.

    >>> from otspec.tree import DraftTree, SpecTrTreeVerifier, TreeShape
    >>> pair = DraftTree(TreeShape.chains(2, 1), [-1, 0, 0], [-1, 0, 0])
    >>> E = SpecTrTreeVerifier(token_verifier="optimal").emission(pair, [[1.0, 0.0]] * 3, [[0.3, 0.7]] * 3)
    >>> E.round(12).tolist()
    [[0.0, 0.7], [0.09, 0.21], [0.0, 0.0]]
    """

    name = "spectr-tree"
    processes = ("iid",)

    def __init__(self, token_verifier="lp"):
        try:
            self.factory: VerifierFactory = resolve_verifier(token_verifier)
        except (TypeError, ValueError) as exc:  # the message names this class's parameter, not resolve_verifier's
            raise type(exc)(str(exc).replace("`verifier`", "`token_verifier`", 1)) from None

    def __repr__(self) -> str:
        return f"SpecTrTreeVerifier(token_verifier={self.factory.name!r})"

    def _walk(self, tree, P, Q, visit):
        """Depth-first over groups of surviving nodes; ``visit(group, pool, law, reach)`` per group."""
        layout = _Layout(tree)
        stack = [([0], 1.0)]
        while stack:
            group, w = stack.pop()
            pool = [c for v in group for c in layout.children.get(v, ())]
            v0 = group[0]
            if not pool:
                visit(v0, (), Q[v0], w)
                continue
            toks = tuple(int(tree.tokens[c]) for c in pool)
            verifier = self.factory(P[v0], Q[v0], len(pool))
            law = np.asarray(verifier.conditional(toks), dtype=np.float64)
            visit(v0, toks, law, w)
            for y in sorted(set(toks)):
                if law[y] > 0:
                    stack.append(([c for c, t in zip(pool, toks) if t == y], w * float(law[y])))

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        """Exact law of (first surviving node at the stop, emitted token)."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        out = np.zeros(q_nodes.shape)

        def visit(v0, toks, law, w):
            row = w * law
            if toks:
                row[list(toks)] = 0.0
            out[v0] += row

        self._walk(tree, p_nodes, q_nodes, visit)
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r""":math:`\mathbb E[\tau \mid T]`: the sum over surviving groups of their probabilities."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        total = []

        def visit(v0, toks, law, w):
            if toks:
                total.append(w * float(law[sorted(set(toks))].sum()))

        self._walk(tree, p_nodes, q_nodes, visit)
        return float(np.sum(total)) if total else 0.0

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """DraftSelection with the token verifier's own sampler at each depth."""
        if validate_bool(validate, "validate"):
            p_nodes, q_nodes = validate_tree_laws(tree, p_nodes, q_nodes)
        gen = as_rng(rng)
        layout = _Layout(tree)
        group = [0]
        while True:
            pool = [c for v in group for c in layout.children.get(v, ())]
            v0 = group[0]
            if not pool:
                return v0, sample_from(q_nodes[v0], gen)
            toks = tuple(int(tree.tokens[c]) for c in pool)
            y = int(self.factory(p_nodes[v0], q_nodes[v0], len(pool)).sample(toks, rng=gen))
            nxt = [c for c, t in zip(pool, toks) if t == y]
            if not nxt:
                return v0, y
            group = nxt


def make_tree_verifier(verifier, **options) -> TreeVerifier:
    """A :class:`TreeVerifier` from a registered tree-verifier name (with its options) or an instance.

    Parameters
    ----------
    verifier : str or TreeVerifier
        A name of ``verifier_names(kind="tree")`` (``"specinfer"``,
        ``"sequoia"``, ``"target-only"``, ``"spectr-tree"``) or an instance
        (returned as is).
    **options
        The registered options of the name (``token_verifier`` for
        ``"spectr-tree"``).

    Returns
    -------
    TreeVerifier

    References
    ----------
    .. [1] Miao et al., SpecInfer, arXiv:2305.09781, §4; Chen et al.,
       Sequoia, arXiv:2402.12374, §3.2; Sun et al., SpecTr,
       arXiv:2310.15141, Algorithm 3.

    Examples
    --------
    >>> from otspec.tree import make_tree_verifier
    >>> make_tree_verifier("spectr-tree", token_verifier="kseq")
    SpecTrTreeVerifier(token_verifier='kseq')
    >>> make_tree_verifier("specinfer").processes
    ('iid',)

    Raises
    ------
    TypeError, ValueError
        Not a name or a TreeVerifier; an unknown name (the accepted ones
        listed); options the verifier does not take; options with an instance.
    """
    if isinstance(verifier, TreeVerifier):
        if options:
            raise ValueError(f"`options` {sorted(options)} apply to a verifier name, not to an instance")
        return verifier
    if not isinstance(verifier, str):
        raise TypeError(
            f"`verifier` must be a tree verifier name {verifier_names(kind='tree')} or a TreeVerifier, "
            f"got {type(verifier).__name__}"
        )
    spec = lookup_verifier(verifier, "verifier", kind="tree")
    extra = set(options) - set(spec.options)
    if extra:
        raise ValueError(f"`verifier`={verifier!r} takes the options {sorted(spec.options)}, got {sorted(extra)}")
    return spec.build_tree(**options)


_SPECINFER = "Miao et al., SpecInfer, arXiv:2305.09781, §4"
for _spec in (
    VerifierSpec("specinfer", "tree", None, build_tree=SpecInferVerifier, processes=SpecInferVerifier.processes,
                 draft_process="tree", summary="multi-step speculative sampling on a tree (i.i.d. children)",
                 reference=_SPECINFER),
    VerifierSpec("sequoia", "tree", None, build_tree=SequoiaVerifier, processes=SequoiaVerifier.processes,
                 draft_process="tree", summary="speculative sampling without replacement on a tree",
                 reference="Chen et al., Sequoia, arXiv:2402.12374, §3.2"),
    VerifierSpec("target-only", "tree", None, build_tree=TargetOnlyVerifier, processes=TargetOnlyVerifier.processes,
                 draft_process="tree", summary="draw from the target, descend while the token is a child",
                 reference="SGLang tree_speculative_sampling_target_only; EAGLE-2 evaluate_posterior"),
    VerifierSpec("spectr-tree", "tree", None, build_tree=SpecTrTreeVerifier, processes=SpecTrTreeVerifier.processes,
                 draft_process="tree", options=frozenset({"token_verifier"}),
                 summary="SpecTr's DraftSelection with a token-level verifier at each depth",
                 reference="Sun et al., SpecTr, arXiv:2310.15141, Algorithm 3, Appendix D"),
):
    register_verifier(_spec)
del _spec
