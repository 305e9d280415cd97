r"""The best any lossless verifier can do on the trees of a draft process: two exact optima, each an LP.

A draft process (:func:`~otspec.tree.enumerate_trees`) gives a law
:math:`P(T)` over realised trees :math:`T` of a shape with largest depth
:math:`D`; :math:`Q` is the target's law after the context. Two optima of
the expected number of accepted draft tokens :math:`\mathbb E[\tau]`:

* the *coupling optimum* :math:`\mathrm{OPT}_c`: the best coupling of the
  tree with a target block :math:`Y \sim Q_D`, rewarded by the depth of the
  longest prefix of :math:`Y` that is a root path of :math:`T`. It bounds
  every lossless verifier (the argument of Sun et al., arXiv:2403.10444,
  Theorem 1, with a tree of drafts), and a verifier that emits the rest of
  :math:`Y` after the accepted path attains it;
* the *one-token optimum* :math:`\mathrm{OPT}_1`: the best lossless verifier
  that emits an accepted root path and one more token (the class of every
  tree verifier that decoders run), attained by :class:`OptimalTreeVerifier`.

:math:`\mathrm{OPT}_1 \le \mathrm{OPT}_c`, with equality at depth 1 and on
deterministic trees. Realised trees with the same *set* of root token paths
are merged first (both LPs see a tree only through that set): i.i.d.
siblings drawn in another order, or twice the same token, fall together.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .._validation import as_rng, validate_bool, validate_positive_int
from .._verifier import sample_from
from ..block._multidraft import solve_transport
from ..block._multidraft_verifiers import one_token_rule, solve_one_token_lp
from ..models import conditional_tables, joint_from_tables, size_exceeds, validate_model_pair, validate_sequence
from ._process import MAX_TREES, as_tree_shape, enumerate_trees, validate_process
from ._tree import DraftTree
from ._verifiers import TreeVerifier, validate_tree_laws

__all__ = [
    "MAX_TREE_LP_VARIABLES",
    "OptimalTreeVerifier",
    "TreeOptimum",
    "TreePlan",
    "optimum",
]

#: Largest LP (columns) built by :func:`optimum`; also bounds ``V**(D + 1)`` and the plan's dense size.
MAX_TREE_LP_VARIABLES = 1_000_000


class _AfterPrefix:
    """The model continued after a fixed context: ``next_dist(s) = model.next_dist(prefix + s)``."""

    def __init__(self, model, prefix: tuple[int, ...], V: int):
        self.model, self.prefix, self.vocab_size = model, prefix, V
        ml = getattr(model, "max_len", None)
        self.max_len = None if ml is None else ml - len(prefix)

    def next_dist(self, s):
        return self.model.next_dist(self.prefix + tuple(s))


@dataclass(frozen=True, eq=False)
class TreePlan:
    r"""An optimal plan of :func:`optimum`, over merged realised trees.

    Attributes
    ----------
    keys : tuple of tuple of tuple of int
        One entry per merged class of realised trees: its root token paths,
        sorted by ``(len, path)`` (the root excluded).
    weights : (n_keys,) ndarray of float64
        :math:`P(\text{class})`, the summed probabilities of its trees.
    columns : tuple of tuple of int
        The column labels: target blocks :math:`y \in V^D` (coupling), or
        emitted strings :math:`o` = accepted root path + one token, of lengths
        ``1 .. D + 1``, level by level in lexicographic order (one-token).
    mass : (n_keys, n_columns) ndarray of float64
        The joint law :math:`\pi(\text{class}, \text{column})`: row sums
        ``weights``; column sums :math:`Q_D` (coupling), or the law of the
        emitted string (one-token), to float rounding.
    reward : (n_keys, n_columns) ndarray of int64
        Accepted draft tokens of each pair (0 where the mass is 0 by construction).
    """

    keys: tuple
    weights: np.ndarray
    columns: tuple
    mass: np.ndarray
    reward: np.ndarray

    @property
    def value(self) -> float:
        r""":math:`\sum \pi \cdot \text{reward}`: the plan's expected accepted length."""
        return math.fsum((self.mass * self.reward).ravel().tolist())


@dataclass(frozen=True, eq=False)
class TreeOptimum:
    r"""Result of :func:`optimum`.

    Attributes
    ----------
    value : float
        The LP optimum :math:`\mathrm{OPT}_1` (``one_token=True``) or
        :math:`\mathrm{OPT}_c` (``nan`` on failure).
    one_token : bool
        Which optimum.
    status : str
        ``"optimal"``, a HiGHS model status name, or ``"check_failed"``.
    success : bool
    n_variables : int
        LP columns.
    n_constraints : int
        LP rows.
    max_violation : float
        Largest sign / row-bound / objective violation of the solver's raw solution.
    message : str
    plan : TreePlan or None
        The optimal plan, repaired to exact marginals (coupling) or the law of
        :attr:`verifier` (one-token); None on failure.
    plan_value : float
        ``plan.value``: within ``max_violation``-level rounding of ``value``.
    verifier : OptimalTreeVerifier or None
        The one-token optimum as a verifier (None for the coupling optimum or on failure).
    process : str
    n_trees : int
        Realised trees enumerated.
    n_keys : int
        Classes after merging trees with the same set of root token paths.
    """

    value: float
    one_token: bool
    status: str
    success: bool
    n_variables: int
    n_constraints: int
    max_violation: float
    message: str
    plan: TreePlan | None
    plan_value: float
    verifier: OptimalTreeVerifier | None
    process: str
    n_trees: int
    n_keys: int


def _key_of(tree: DraftTree) -> tuple:
    """The set of root token paths of a realised tree (root excluded), sorted by ``(len, path)``."""
    return tuple(sorted(set(tree.paths()[1:]), key=lambda p: (len(p), p)))


def _merge(trees) -> tuple[list, np.ndarray]:
    acc: dict = {}
    for tree, w in trees:
        key = _key_of(tree)
        acc.setdefault(key, []).append(w)
    keys = sorted(acc, key=lambda k: (len(k), k))
    return keys, np.array([math.fsum(acc[k]) for k in keys], dtype=np.float64)


def _level_index(path: tuple[int, ...], V: int) -> int:
    return int(np.ravel_multi_index(path, (V,) * len(path))) if path else 0


def _size_error(what: str, size: int, limit: int) -> ValueError:
    return ValueError(f"the {what} would have {size} variables, above the limit `max_variables`={limit}")


def optimum(shape, draft, target, *, process, one_token: bool = True, prefix=(),
            max_variables: int = MAX_TREE_LP_VARIABLES, max_trees: int = MAX_TREES,
            raise_on_failure: bool = False) -> TreeOptimum:
    r"""The exact optimum of a draft-tree process over lossless verifiers, as a HiGHS LP.

    .. math::

        \mathrm{OPT}_c = \max_{\pi \in \Pi(P, Q_D)} \mathbb E_\pi\big[c(T, Y)\big],
        \qquad c(T, Y) = \max\{\ell : Y_{1:\ell} \text{ is a root path of } T\};

    .. math::

        \mathrm{OPT}_1 = \max_{x \ge 0} \sum_{T, o} Q(o)\, x(T, o)\,(|o| - 1)
        \quad\text{s.t.}\quad
        \sum_o Q(o)\, x(T, o) = P(T)\ \ \forall T, \qquad
        \sum_{m=1}^{D+1} \sum_T x(T, z_{1:m}) = 1\ \ \forall z \in V^{D+1}: Q(z) > 0,

    where :math:`o` ranges over the strings "accepted root path of
    :math:`T` (possibly empty) + one token" and
    :math:`x(T, o) = P(T, \text{output } o) / Q(o)`. The second row says the
    output completed by the target to :math:`D + 1` tokens has the target's
    law: :math:`P(\text{completed} = z) = Q(z) \sum_m \sum_T x(T, z_{1:m})`.

    Parameters
    ----------
    shape : TreeShape or Eagle2Params
        The shape (``Eagle2Params`` for ``process="eagle2"``), at least one node.
    draft, target : Model
        Draft (``p``) and target (``q``) models on the same vocabulary.
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
        The draft process that fills the shape (:func:`~otspec.tree.sample_tree`).
    one_token : bool, keyword-only
        :math:`\mathrm{OPT}_1` and its verifier (default), or :math:`\mathrm{OPT}_c`.
    prefix : sequence of int, keyword-only
        The context.
    max_variables : int, keyword-only
        Refuse (ValueError, before the LP is built) an LP with more columns,
        or a target enumeration :math:`V^{D+1}` above it.
    max_trees : int, keyword-only
        Passed to :func:`~otspec.tree.enumerate_trees` (its a-priori bound on realised trees).
    raise_on_failure : bool, keyword-only
        Raise :class:`otspec.SolverError` instead of returning a failed result.

    Returns
    -------
    TreeOptimum
        ``value``, ``plan`` (and ``verifier`` for the one-token optimum), LP status and size.

    Raises
    ------
    ValueError
        An unknown process, a shape without nodes, models on different
        vocabularies, a prefix outside the vocabulary, the LP above
        ``max_variables`` (the message gives its size and the limit), or the
        trees above ``max_trees``.
    TypeError
        A shape of the wrong type; non-integer ``max_variables``; ``one_token``
        or ``raise_on_failure`` not a bool.
    SolverError
        Only with ``raise_on_failure=True``.

    See Also
    --------
    otspec.block.multidraft_ot : :math:`\mathrm{OPT}_c` of ``k`` i.i.d. chains.
    otspec.block.one_token_optimum : :math:`\mathrm{OPT}_1` of ``k`` i.i.d. chains.

    Notes
    -----
    Both LPs see a realised tree only through the set :math:`K(T)` of its
    root token paths (the reward, the allowed outputs and nothing else), so
    trees with the same set are merged into one class of probability
    :math:`\sum P(T)` (a class-level solution split in proportion to
    :math:`P(T)` is a tree-level one with the same value). On
    ``TreeShape.chains(k, L)`` with ``process="iid"`` the classes are the sets
    of distinct draft blocks, and the LPs are those of
    :func:`otspec.block.multidraft_ot` and :func:`otspec.block.one_token_optimum`.

    :math:`\mathrm{OPT}_c` is solved as a partial transport between classes
    and target blocks (rows at most :math:`P`, columns at most :math:`Q_D`;
    rewards are non-negative, so the optimum is the same) and the plan
    repaired to exact marginals. :math:`\mathrm{OPT}_1` is solved with
    :math:`f = Q\,x` and one auxiliary column per string,
    :math:`h(w) = \sum_T x(T, w)` (the same LP, fewer non-zeros); the
    verifier keeps the solution's acceptance law per class and emits the one
    token from :math:`r(z \mid u) \propto (Q(z \mid u)\,\bar a(u) - \bar a(uz))_+`
    (:math:`\bar a(v)` = mass of accepted paths through :math:`v`), after a
    top-down repair that makes the inequalities
    :math:`\bar a(uz) \le Q(z \mid u)\,\bar a(u)` exact: lossless to float
    rounding, and within the LP tolerance of :math:`\mathrm{OPT}_1`. Both LPs
    go through the package's HiGHS helper, which re-checks signs, row bounds
    and the objective within 1e-9 before anything is returned.

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Optimal Block-Level Draft Verification for Accelerating Speculative
       Decoding", arXiv:2403.10444 v1, eq. (3) and Theorem 1 (the coupling bound, one chain); the published
       version's one-step block verification (the one-token optimum on one chain).
    .. [2] Miao et al., "SpecInfer", arXiv:2305.09781, §3 (token trees, i.i.d. children); Chen et al.,
       "Sequoia", arXiv:2402.12374, §3.2 (children drawn without replacement).

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import TreeShape, optimum
    >>> draft, target = MemorylessModel([3/4, 1/4]), MemorylessModel([1/2, 1/2])
    >>> res = optimum(TreeShape.chains(2, 2), draft, target, process="iid", one_token=False)
    >>> res.status, round(128 * res.value, 7)           # the multi-draft block optimum, 231/128
    ('optimal', 231.0)
    >>> res1 = optimum(TreeShape.chains(2, 2), draft, target, process="iid")
    >>> round(128 * res1.value, 6), res1.n_keys, res1.n_trees
    (227.0, 10, 16)
    """
    shape = as_tree_shape(shape, process)
    process = validate_process(process, shape)
    V = validate_model_pair(draft, target)
    ctx = validate_sequence(prefix, V, "prefix")
    for flag, name in ((one_token, "one_token"), (raise_on_failure, "raise_on_failure")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"`{name}` must be a bool, got {type(flag).__name__}")
    max_variables = validate_positive_int(max_variables, "max_variables")
    if shape.n < 1:
        raise ValueError("`shape` must have at least one draft node, got the root alone")
    D = int(shape.max_depth)
    if size_exceeds(V, D + 1, max_variables):
        raise _size_error(f"target enumeration V**(D+1) = {V}**{D + 1}", V ** (D + 1), max_variables)
    trees = enumerate_trees(shape, draft, process=process, prefix=ctx, max_trees=max_trees)
    keys, w = _merge(trees)
    nk = len(keys)
    cb = conditional_tables(_AfterPrefix(target, ctx, V), D + 1, name="target", max_entries=max_variables)
    if one_token:
        return _one_token(keys, w, cb, V, D, process, len(trees), max_variables, raise_on_failure,
                          draft, ctx)
    QD = joint_from_tables(cb[:D]).ravel()
    nv = nk * QD.shape[0]
    if nv > max_variables:
        raise _size_error(f"coupling LP ({nk} tree classes x V**D = {QD.shape[0]} target blocks)", nv, max_variables)
    # reward[k, y] = number of levels l with y_{1:l} a root path of class k (prefix-closed: the longest one)
    reward = np.zeros((nk, QD.shape[0]), dtype=np.int64)
    ys = np.arange(QD.shape[0])
    for ell in range(1, D + 1):
        member = np.zeros((nk, V**ell), dtype=bool)
        for k, key in enumerate(keys):
            member[k, [_level_index(p, V) for p in key if len(p) == ell]] = True
        reward += member[:, ys // V ** (D - ell)]
    sol, plan = solve_transport(reward.astype(np.float64), w, QD)
    columns = tuple(itertools.product(range(V), repeat=D))
    if not sol.success:
        if raise_on_failure:
            sol.raise_for_status("tree coupling LP")
        return TreeOptimum(math.nan, False, sol.status, False, nv, nk + QD.shape[0], sol.max_violation,
                           sol.message, None, math.nan, None, process, len(trees), nk)
    tp = TreePlan(tuple(keys), w, columns, plan, reward)
    return TreeOptimum(sol.objective, False, "optimal", True, nv, nk + QD.shape[0], sol.max_violation, sol.message,
                       tp, tp.value, None, process, len(trees), nk)


def _one_token(keys, w, cb, V, D, process, n_trees, max_variables, raise_on_failure, draft, ctx) -> TreeOptimum:
    nk = len(keys)
    n_w = sum(V ** (t + 1) for t in range(D + 1))
    nf = sum(len(key) + 1 for key in keys) * V
    nv = nf + n_w
    if nv > max_variables or nk * n_w > max_variables:
        raise _size_error(
            f"one-token LP ({nk} tree classes, {nf} (class, output) columns + {n_w} outputs; plan {nk} x {n_w})",
            max(nv, nk * n_w), max_variables,
        )
    allowed = [[(0, 0)] + [(len(p), _level_index(p, V)) for p in key] for key in keys]
    lp = solve_one_token_lp(allowed, w, cb, V, D, keys)
    sol = lp.sol
    n_rows = nk + n_w + V ** (D + 1)
    if not sol.success:
        if raise_on_failure:
            sol.raise_for_status("tree one-token LP")
        return TreeOptimum(math.nan, True, sol.status, False, nv, n_rows, sol.max_violation, sol.message,
                           None, math.nan, None, process, n_trees, nk)
    e, r, offs = one_token_rule(lp)
    verifier = OptimalTreeVerifier(keys, e, r, offs, V, D, process, cb, draft, ctx, float(sol.objective))
    # the plan: the verifier's joint law of (class, emitted string), strings level by level
    mass = np.concatenate([(e[:, offs[t]:offs[t + 1]][:, :, None] * r[t][None]).reshape(nk, -1)
                           for t in range(D + 1)], axis=1)
    reward = np.concatenate([np.full(V ** (t + 1), t, dtype=np.int64) for t in range(D + 1)])
    reward = np.where(mass > 0, reward[None, :], 0)
    columns = tuple(c for t in range(D + 1) for c in itertools.product(range(V), repeat=t + 1))
    tp = TreePlan(tuple(keys), w, columns, mass, reward)
    return TreeOptimum(sol.objective, True, "optimal", True, nv, n_rows, sol.max_violation, sol.message,
                       tp, tp.value, verifier, process, n_trees, nk)


class OptimalTreeVerifier(TreeVerifier):
    r"""The one-token optimum of a draft-tree process as a tree verifier (built by :func:`optimum`).

    .. math::

        P(\text{accept the node with root path } u \mid T) = e(K(T), u) / P(K(T)),
        \qquad P(z \mid u) = r(z \mid u) \propto \big(Q(z \mid u)\,\bar a(u) - \bar a(u z)\big)_+,

    :math:`K(T)` the set of root token paths of the realised tree,
    :math:`e` the repaired acceptance law of the solved LP and
    :math:`\bar a(v) = \sum_K \sum_{u \supseteq v} e(K, u)`. Lossless on the
    trees of the process, draft, target and context it was built for (to
    float rounding), with :math:`\mathbb E[\tau]` within the LP tolerance of
    :math:`\mathrm{OPT}_1`. When siblings carry the same token, the accepted
    node is the first of them. An exact reference built from the whole draft
    and target laws (exponential in the depth), not a decoder: with
    ``validate=True`` (default) the node laws passed in are checked against
    the ones it was built for.

    Attributes
    ----------
    name : str
    processes : tuple of str
        The one process it was built for.
    value : float
        :math:`\mathrm{OPT}_1` (the LP optimum).

    References
    ----------
    .. [1] Sun, Ro, Beirami, Suresh, "Block Verification Accelerates Speculative Decoding" (published version of
       arXiv:2403.10444): one correction token after the accepted prefix (the one-chain case).
    """

    name = "tree-one-token-optimum"

    def __init__(self, keys, e, r, offs, V, D, process, cb, draft, ctx, value):
        self.processes = (process,)
        self.V, self.D, self.value = V, D, value
        self._index = {key: i for i, key in enumerate(keys)}
        tot = e.sum(axis=1, keepdims=True)
        self._e = e / np.where(tot > 0, tot, 1.0)
        self._r, self._offs, self._cb = r, offs, cb
        self._draft = _AfterPrefix(draft, ctx, V)
        self._dlaws: dict = {}

    def _check_laws(self, tree, P, Q) -> None:
        if P.shape[1] != self.V:
            raise ValueError(f"`p_nodes` must have V={self.V} columns (the vocabulary it was built for), got {P.shape[1]}")
        if tree.max_depth > self.D:
            raise ValueError(f"`tree` has depth {tree.max_depth}, above the depth {self.D} this verifier was built for")
        for i, path in enumerate(tree.paths()):
            law = self._dlaws.get(path)
            if law is None:
                law = self._dlaws[path] = np.asarray(self._draft.next_dist(path), dtype=np.float64)
            if not (np.allclose(Q[i], self._cb[len(path)][path], rtol=0, atol=1e-12)
                    and np.allclose(P[i], law, rtol=0, atol=1e-12)):
                raise ValueError(
                    f"`p_nodes`/`q_nodes` row {i} (token path {path}) differ from the draft/target laws this "
                    f"verifier was built for"
                )

    def _accepted(self, tree, p_nodes, q_nodes, validate: bool) -> tuple[int, dict]:
        """The tree's class and ``{accepted token path: its first node}``."""
        if validate_bool(validate, "validate"):
            P, Q = validate_tree_laws(tree, p_nodes, q_nodes)
            self._check_laws(tree, P, Q)
        paths = tree.paths()
        k = self._index.get(_key_of(tree))
        if k is None:
            raise ValueError(
                f"`tree` (token paths {paths[1:]}) has probability 0 under the {self.processes[0]!r} process this "
                "verifier was built for"
            )
        node_of: dict = {}
        for i, path in enumerate(paths):
            node_of.setdefault(path, i)
        return k, node_of

    def emission(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> np.ndarray:
        r"""Exact law of (accepted node, emitted token), shape ``(n + 1, V)``.

        ``emission[a, y]`` = P(the accepted path ends at node ``a``, then token ``y``); rows sum to the
        acceptance law, the total to 1.
        """
        k, node_of = self._accepted(tree, p_nodes, q_nodes, validate)
        out = np.zeros((tree.n + 1, self.V))
        for path, i in node_of.items():
            t = len(path)
            u = _level_index(path, self.V)
            out[i] += self._e[k, self._offs[t] + u] * self._r[t][u]
        return out

    def expected_accepted(self, tree, p_nodes, q_nodes, *, validate: bool = True) -> float:
        r""":math:`\mathbb E[\tau \mid T]`: the expected depth of the accepted node."""
        k, node_of = self._accepted(tree, p_nodes, q_nodes, validate)
        return math.fsum(len(path) * self._e[k, self._offs[len(path)] + _level_index(path, self.V)]
                         for path in node_of)

    def sample(self, tree, p_nodes, q_nodes, *, rng=None, validate: bool = True) -> tuple[int, int]:
        """One ``(accepted node, emitted token)`` drawn from :meth:`emission`."""
        gen = as_rng(rng)
        em = self.emission(tree, p_nodes, q_nodes, validate=validate)
        j = sample_from(em.ravel(), gen)
        return int(j // self.V), int(j % self.V)

    def __repr__(self) -> str:
        return f"OptimalTreeVerifier(process={self.processes[0]!r}, V={self.V}, D={self.D}, value={self.value:.6g})"
