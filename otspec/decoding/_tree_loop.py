r"""Draft trees in the decoding loop: grow a tree with the draft, score it in one target call, verify it.

One iteration on a context :math:`x_{1:T}` (draft law ``p``, target law ``q``):

1. **Draft, one call per depth.** The first call feeds the context's tokens
   that the draft's KV cache lacks and gives ``p`` at the root; the call of
   depth ``d >= 1`` feeds, as a batch of rows continuing the cache, the
   tree's nodes of depth ``d`` that get children (the *frontier*), and gives
   ``p`` at each of them. After each call the draft process fills the next
   depth: i.i.d. draws, draws without replacement, the top-ranked tokens,
   EAGLE-2's expansion and reranking, or SpecHub's pairs -- the logic of
   :func:`otspec.tree.sample_tree` (:func:`otspec.tree.sample_spechub_tree`),
   run depth by depth on the laws the calls give, with the same draws from
   the same generator (so the same tree for the same seed; the tests check
   it). Nothing is drafted at the leaves.
2. **Target, one call.** :meth:`~otspec.decoding.HFCausalLM.tree_logits`
   scores the context's pending tokens and every node with a tree attention
   mask: ``q`` at every node.
3. **Verify.** The tree verifier's ``sample(tree, p_nodes, q_nodes, rng)``
   gives the accepted node ``a`` and one token ``y``; the iteration emits the
   root path of ``a``, then ``y``.
4. **Caches.** The draft keeps the row whose path shares the longest prefix
   with the emitted tokens, truncated to that prefix (one ``select``); the
   target's call leaves the context alone in its cache (the tree's columns
   are cropped), and the next call feeds the emitted tokens with the next
   tree (they are its pending tokens): no extra call, a few more columns in
   the next one.

**The last iterations.** With :math:`r_i` tokens left before
``max_new_tokens`` an iteration drafts the tree's first
:math:`D_i = \min(D, r_i - 1)` levels (:meth:`TreePlan.pruned`, run by
:class:`TreeSteps`), and at :math:`r_i = 1` it is plain decoding's step;
lossless since :math:`D_i` is fixed by the past (see
:func:`otspec.decoding.speculative_decode`).

Notation: ``p`` is the draft law and ``q`` the target law, as everywhere in otspec.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

import otspec
import otspec.tree

from .._registry import suggest, verifier_names
from .._verifier import sample_from
from ..tree._process import PROCESSES, _child_groups, _ranked, _support_error, draw_children
from ..tree._published import _chains, _children, spechub_optimum, spechub_pair_law
from ..tree._spec import MAX_DRAFT_TREE_NODES, check_tree_size, parse_tree_spec
from ..tree._verifiers import SpecTrTreeVerifier
from ._deps import require
from ._sampling import Sampling
from ._verifiers import lp_max_support

torch = require("torch", "otspec.decoding")

__all__ = ["DEFAULT_VERIFIERS", "SPECHUB_MAX_VOCAB", "TREE_PROCESSES", "TreePlan", "TreeStep", "TreeSteps",
           "check_with_tree", "check_without_tree", "tree_law_bytes", "tree_plan"]

#: The draft processes the decoder grows trees with: those of :data:`otspec.tree.PROCESSES` and SpecHub's
#: pairs (:func:`otspec.tree.sample_spechub_tree`).
TREE_PROCESSES = PROCESSES + ("spechub",)
#: Largest vocabulary for ``process="spechub"``: its pair law (:func:`otspec.tree.spechub_pair_law`) is a
#: ``(V, V)`` float64 table, 32 MiB at ``V = 2048``, built at every node with two children.
SPECHUB_MAX_VOCAB = 2048
#: The verifier each process gets when ``verifier`` is left out: the per-node rule lossless for it.
DEFAULT_VERIFIERS = {"iid": "specinfer", "wor": "sequoia", "topk": "target-only", "eagle2": "target-only",
                     "spechub": "spechub"}


def _np(t) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy), a copy from any other device."""
    return t.detach().to("cpu").numpy()


# ----------------------------------------------------------------------------- growing a tree depth by depth
class _ShapeGrower:
    """A :class:`~otspec.tree.TreeShape` filled depth by depth (``"iid"``, ``"wor"``, ``"topk"``, ``"spechub"``).

    The frontier of depth ``d`` is the shape's nodes of depth ``d`` that have
    children (its parents' groups in node order, as :func:`otspec.tree.sample_tree`
    visits them); the draws of each group are those of ``sample_tree``
    (``sample_spechub_tree``), in the same order.
    """

    def __init__(self, plan: TreePlan, gen: np.random.Generator):
        self.plan, self.gen = plan, gen
        self.d = 0
        self.tokens = np.full(plan.shape.n + 1, -1, dtype=np.int64)

    def take(self, P: np.ndarray, R: np.ndarray | None):
        """Fill the children of the current frontier from its laws ``P`` (ranks from ``R``); return the next
        frontier ``(tokens, parent rows)`` or None when the tree is complete."""
        plan, gen, tokens = self.plan, self.gen, self.tokens
        process = plan.process
        for j, (par, ch, ranks) in enumerate(plan.levels[self.d]):
            p = P[j]
            if process in ("iid", "wor"):
                tokens[ch] = draw_children(p, ranks, process, gen, path=plan.path_of(tokens, par))
            elif process == "topk":
                need = max(ranks) + 1
                if np.count_nonzero(R[j] > 0) < need:
                    raise _support_error("topk", need, plan.path_of(tokens, par), R[j])
                order = _ranked(R[j], need)
                tokens[ch] = order[ranks]
            else:  # spechub: one child from p, two from the hub's pair law
                if len(ch) == 1:
                    tokens[ch[0]] = sample_from(p, gen)
                else:
                    tokens[ch[0]], tokens[ch[1]] = divmod(int(sample_from(spechub_pair_law(p).ravel(), gen)),
                                                          p.shape[0])
        self.d += 1
        if self.d >= len(plan.levels):
            return None
        return tokens[plan.frontier[self.d]], plan.parent_rows[self.d]

    def tree(self) -> otspec.tree.DraftTree:
        return otspec.tree.DraftTree(self.plan.shape, self.plan.shape.parents, self.tokens)


class _Eagle2Grower:
    """EAGLE-2's dynamic tree grown level by level (``Eagle2Params``): the expansion and reranking of
    :func:`otspec.tree.sample_tree` with ``process="eagle2"``, one frontier (``top_k`` nodes) per draft call."""

    def __init__(self, plan: TreePlan, gen: np.random.Generator):
        self.params = plan.shape
        self.level = 0
        self.scores: list[float] = []
        self.parent: list[int] = []
        self.token: list[int] = []
        self.paths: list[tuple] = []
        self.frontier: list[int] = []

    def _expand(self, par: int, base: float, path: tuple, p: np.ndarray) -> None:
        k = self.params.top_k
        if np.count_nonzero(p > 0) < k:
            raise _support_error("eagle2", k, path, p)
        top = _ranked(p, k)
        with np.errstate(divide="ignore"):
            logp = np.log(p[top])
        for t, lp in zip(top.tolist(), logp.tolist()):
            self.scores.append(base + lp)
            self.parent.append(par)
            self.token.append(t)
            self.paths.append(path + (t,))

    def take(self, P: np.ndarray, R: np.ndarray):
        k, s = self.params.top_k, self.scores
        if self.level == 0:
            self._expand(-1, 0.0, (), R[0])
            nxt = list(range(k))  # level 1: the root's top-k, all expanded
        else:
            start = len(s)
            for j, f in enumerate(self.frontier):
                self._expand(f, s[f], self.paths[f], R[j])
            nxt = sorted(range(start, len(s)), key=lambda j: (-s[j], j))[:k]
        self.level += 1
        if self.level >= self.params.depth:
            return None
        rows = {f: j for j, f in enumerate(self.frontier)}
        parent_rows = np.array([rows.get(self.parent[f], 0) for f in nxt], dtype=np.int64)
        self.frontier = nxt
        return np.array([self.token[f] for f in nxt], dtype=np.int64), parent_rows

    def tree(self) -> otspec.tree.DraftTree:
        s = self.scores
        kept = sorted(sorted(range(len(s)), key=lambda j: (-s[j], j))[: self.params.n])
        node_of = {j: i + 1 for i, j in enumerate(kept)}
        parents = [-1] + [node_of[self.parent[j]] if self.parent[j] >= 0 else 0 for j in kept]
        return otspec.tree.DraftTree(None, parents, [-1] + [self.token[j] for j in kept])


# ----------------------------------------------------------------------------- the plan: everything checked once
@dataclass(frozen=True, eq=False)
class TreePlan:
    """A validated tree configuration of :func:`otspec.decoding.speculative_decode` and its static layout.

    Attributes
    ----------
    shape : TreeShape or Eagle2Params
    process : str
        One of :data:`TREE_PROCESSES`.
    verifier : otspec.tree.TreeVerifier
    name : str
        The verifier's registered name.
    lossless : bool
        Whether the verifier is lossless for this process and shape.
    k : int
        Children of the root (``top_k`` for EAGLE-2).
    L : int
        Largest depth.
    levels : list
        For a shape: ``levels[d]`` the ``(parent, children, ranks)`` groups whose parent has depth ``d``.
    frontier, parent_rows : list of ndarray
        For a shape: ``frontier[d]`` the nodes of depth ``d`` with children, ``parent_rows[d]`` the row of
        each one's parent in the frontier of depth ``d - 1``.
    """

    shape: object
    process: str
    verifier: object
    name: str
    lossless: bool
    k: int
    L: int
    levels: list
    frontier: list
    parent_rows: list
    _pruned: dict = field(default_factory=dict, repr=False)  # the plans of :meth:`pruned`, by depth

    def pruned(self, depth: int) -> TreePlan:
        r"""The plan of the tree cut to its first ``depth`` levels (``self`` when ``depth >= L``), made once per depth.

        .. math::

            S_D = \{v \in S : d(v) \le D\},

        a shape's nodes of depth at most ``D`` (a prefix of its node order,
        the same nodes with the same numbers: the draft fills them with the
        same draws as the first ``D`` levels of the whole tree); EAGLE-2's
        ``Eagle2Params(num_steps, topk, num_draft_tokens)`` becomes
        ``Eagle2Params(D, topk, min(num_draft_tokens, topk + (D - 1) topk**2 + 1))``: the same
        expansion for ``D`` levels and the same node budget, capped at the
        nodes those levels propose (the kept nodes are the ``n`` best
        proposals of the ``D`` levels, so the budget a deeper level would
        have taken goes to the next best shallower proposals). The decoder
        drafts it in its last iterations (:class:`TreeSteps`).

        Parameters
        ----------
        depth : int
            ``1 <= depth``.

        Returns
        -------
        TreePlan
            Same process, verifier, name, ``k`` and losslessness; ``L = min(depth, L)``.

        Examples
        --------
        >>> from otspec.decoding import CallableLM, Sampling
        >>> from otspec.decoding._tree_loop import tree_plan
        >>> lm = CallableLM(lambda ids: ids[..., None].double().repeat(1, 1, 4), vocab_size=4)
        >>> plan = tree_plan("iid:branching(2,2)", process=None, verifier=None, options=None, allow_lossy=False,
        ...                  target=lm, V=4, sampling=Sampling())
        >>> cut = plan.pruned(1)
        >>> cut.L, cut.shape.n, cut.k, plan.pruned(1) is cut, plan.pruned(2) is plan
        (1, 2, 2, True, True)
        """
        if depth >= self.L:
            return self
        if depth < 1:
            raise ValueError(f"`depth` must be at least 1 (a tree of no level is plain decoding's step), got {depth}")
        got = self._pruned.get(depth)
        if got is None:
            s = self.shape
            if self.process == "eagle2":
                shape = otspec.tree.Eagle2Params(depth, s.topk, min(s.num_draft_tokens,
                                                                     s.topk + (depth - 1) * s.topk**2 + 1))
                levels = frontier = parent_rows = []
            else:
                shape = otspec.tree.TreeShape([p for p in s.paths if len(p) <= depth])
                levels, frontier, parent_rows = _levels(shape)
            got = self._pruned[depth] = TreePlan(
                shape=shape, process=self.process, verifier=self.verifier, name=self.name,
                lossless=bool(self.verifier.lossless_for(self.process, shape)), k=self.k, L=depth, levels=levels,
                frontier=frontier, parent_rows=parent_rows)
        return got

    def grower(self, gen: np.random.Generator):
        """A fresh grower of one realised tree."""
        return (_Eagle2Grower if self.process == "eagle2" else _ShapeGrower)(self, gen)

    def path_of(self, tokens: np.ndarray, v: int) -> tuple[int, ...]:
        """The token path of node ``v`` of the shape, from the tokens filled so far."""
        out = []
        parents = self.shape.parents
        while v > 0:
            out.append(int(tokens[v]))
            v = int(parents[v])
        return tuple(reversed(out))

    @property
    def ranks_by_raw_law(self) -> bool:
        """Whether the process ranks tokens (``"topk"``, ``"eagle2"``): by the draft's own law, temperature 1."""
        return self.process in otspec.tree.DETERMINISTIC_PROCESSES


def _from_text(tree: str, process, verifier):
    """``(shape, process, verifier)`` from a tree's text ``process:shape[:verifier]`` (the profile's language,
    :func:`otspec.tree.parse_tree_spec`); ``process`` and ``verifier`` given beside it must agree."""
    spec = parse_tree_spec(tree, "`tree`", processes=TREE_PROCESSES)
    if process is not None and process != spec.process:
        raise ValueError(f"`tree` {tree!r} names the process {spec.process!r} and `process` is {process!r}: give "
                         "one of them")
    if len(spec.verifiers) > 1:
        raise ValueError(f"`tree` {tree!r} names {len(spec.verifiers)} verifiers {spec.verifiers}: one decode runs "
                         "one verifier (the profile's text may name several, one row each)")
    if spec.verifiers:
        named = spec.verifiers[0]
        if verifier is not None and verifier != named:
            raise ValueError(f"`tree` {tree!r} names the verifier {named!r} and `verifier` is {verifier!r}: give "
                             "one of them")
        tree_rules = verifier_names(kind="tree")
        if named not in tree_rules:
            raise ValueError(f"`tree` {tree!r} names the verifier {named!r}, which is no tree verifier: one of "
                             f"{tree_rules}{suggest(named, tree_rules)}")
        verifier = named
    return spec.shape, spec.process, verifier


def _as_tree(tree):
    if isinstance(tree, (otspec.tree.TreeShape, otspec.tree.Eagle2Params)):
        return tree
    if isinstance(tree, otspec.tree.DraftTree):
        raise TypeError("`tree` must be a TreeShape, rank paths or an Eagle2Params (the shape the draft fills at "
                        "every step), got a realised DraftTree: pass TreeShape(...) of its rank paths")
    if isinstance(tree, bytes) or not isinstance(tree, (Sequence, np.ndarray)):
        raise TypeError(f"`tree` must be a TreeShape, a sequence of rank paths (Medusa's medusa_choices), an "
                        f"Eagle2Params or a text 'process:shape[:verifier]', got {type(tree).__name__}")
    try:
        return otspec.tree.TreeShape(tree)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"`tree` (rank paths): {exc}") from None


def _levels(shape):
    """Groups, frontiers and parent rows of a shape, by depth of the parent."""
    D = shape.max_depth
    levels: list = [[] for _ in range(D)]
    for g in _child_groups(shape):
        levels[int(shape.depth[g[0]])].append(g)
    frontier = [np.array([g[0] for g in lev], dtype=np.int64) for lev in levels]
    parent_rows = [np.zeros(1, dtype=np.int64)]
    for d in range(1, D):
        row = {int(v): j for j, v in enumerate(frontier[d - 1])}
        parent_rows.append(np.array([row[int(shape.parents[v])] for v in frontier[d]], dtype=np.int64))
    return levels, frontier, parent_rows


def _check_support(shape, process: str, V: int, sampling: Sampling) -> None:
    """Refuse, before any model call, a shape the draft's laws cannot fill (distinct children)."""
    if process == "eagle2":
        need, where = shape.topk, "children per node (EAGLE-2's `topk`)"
    elif process in ("wor", "topk"):
        need = max((max(r) + 1 for _, _, r in _child_groups(shape)), default=1)
        where = "children (largest rank + 1) at a node"
    else:
        return
    if need > V:
        raise ValueError(f"`tree` needs {need} distinct {where}, but the vocabulary has {V} tokens")
    if process == "wor":
        have = 1 if sampling.greedy else sampling.top_k
        if have is not None and need > have:
            why = "greedy decoding (temperature=0) leaves one" if sampling.greedy else f"top_k={have} leaves {have}"
            raise ValueError(f"process='wor' draws up to {need} distinct children at a node, but {why} token of "
                             "positive draft probability: use process='topk' or 'iid', or fewer children")


def _check_spechub(shape, V: int) -> None:
    kids = _children(shape.parents)
    bad = [v for v, c in enumerate(kids) if len(c) > 2]
    if bad:
        raise ValueError(f"process='spechub' draws one or two children per node, but `tree` gives node {bad[0]} "
                         f"{len(kids[bad[0]])} children")
    if any(len(c) == 2 for c in kids) and not 2 <= V <= SPECHUB_MAX_VOCAB:
        raise ValueError(f"process='spechub' builds a (V, V) pair law at every node with two children: V={V} is "
                         f"outside [2, SPECHUB_MAX_VOCAB={SPECHUB_MAX_VOCAB}]")


def tree_plan(tree, *, process, verifier, options, allow_lossy, target, V: int, sampling: Sampling) -> TreePlan:
    r"""Check the tree arguments of :func:`otspec.decoding.speculative_decode` (before any model call).

    .. math::

        (\text{tree}, \text{process}, \text{verifier}) \mapsto \text{TreePlan},

    refusing a verifier that is not lossless for the process (and shape)
    unless ``allow_lossy``.

    Parameters
    ----------
    tree : TreeShape, sequence of rank paths, Eagle2Params or str
        A text is the profile's ``process:shape[:verifier]`` (:func:`otspec.tree.parse_tree_spec`):
        ``process`` and ``verifier`` come from it (given beside it, they must agree).
    process : str or None
        One of :data:`TREE_PROCESSES`; None only with an Eagle2Params (``"eagle2"``) or a text.
    verifier : str, TreeVerifier or None
        A tree verifier (``verifier_names(kind="tree")``); None: :data:`DEFAULT_VERIFIERS` of the process.
    options : dict or None
        Options of a verifier name.
    allow_lossy : bool
    target : LanguageModel
        Must have ``tree_logits``.
    V : int
    sampling : Sampling

    Returns
    -------
    TreePlan

    Raises
    ------
    TypeError, ValueError
        A malformed tree or process, an unknown verifier, a verifier not lossless for the process (the
        message names the processes it is lossless for) without ``allow_lossy``, a target without
        ``tree_logits``, a tree the draft's laws cannot fill (too few distinct tokens), no draft node or more
        than :data:`otspec.tree.MAX_DRAFT_TREE_NODES` (the profile's limit too).

    Examples
    --------
    >>> from otspec.decoding import CallableLM, Sampling
    >>> from otspec.decoding._tree_loop import tree_plan
    >>> lm = CallableLM(lambda ids: ids[..., None].double().repeat(1, 1, 4), vocab_size=4)
    >>> plan = tree_plan([(0,), (1,), (0, 0)], process="iid", verifier=None, options=None, allow_lossy=False,
    ...                  target=lm, V=4, sampling=Sampling())
    >>> plan.name, plan.k, plan.L, plan.lossless
    ('specinfer', 2, 2, True)
    """
    if isinstance(tree, str):
        tree, process, verifier = _from_text(tree, process, verifier)
    shape = _as_tree(tree)
    is_eagle = isinstance(shape, otspec.tree.Eagle2Params)
    if process is None:
        if not is_eagle:
            raise ValueError(f"`process` must name the draft process that fills `tree`, one of {TREE_PROCESSES} "
                             "(it decides which verifiers are lossless), got None")
        process = "eagle2"
    if not isinstance(process, str):
        raise TypeError(f"`process` must be one of {TREE_PROCESSES}, got {type(process).__name__}")
    if process not in TREE_PROCESSES:
        raise ValueError(f"`process` must be one of {TREE_PROCESSES}, got {process!r}{suggest(process, TREE_PROCESSES)}")
    if (process == "eagle2") != is_eagle:
        raise TypeError(f"process={process!r} needs `tree` to be "
                        + ("an Eagle2Params" if process == "eagle2" else "a TreeShape or rank paths")
                        + f", got {type(shape).__name__}")
    if not isinstance(allow_lossy, bool):
        raise TypeError(f"`allow_lossy` must be a bool, got {type(allow_lossy).__name__}")
    if options is not None and not isinstance(options, dict):
        raise TypeError(f"`verifier_options` must be a dict or None, got {type(options).__name__}")
    check_tree_size(shape.n, "`tree`", MAX_DRAFT_TREE_NODES)
    if not callable(getattr(target, "tree_logits", None)):
        raise TypeError(f"`target` must score draft trees (`tree_logits(state, parents, tokens, pending=...)`, as "
                        f"HFCausalLM and CallableLM do), got {type(target).__name__}")
    _check_support(shape, process, V, sampling)
    if process == "spechub":
        _check_spechub(shape, V)
    v = otspec.tree.make_tree_verifier(DEFAULT_VERIFIERS[process] if verifier is None else verifier,
                                       **(options or {}))
    lossless = bool(v.lossless_for(process, shape))
    if not lossless and not allow_lossy:
        ok = [p for p in TREE_PROCESSES if v.lossless_for(p, shape)]
        raise ValueError(
            f"`verifier`={v.name!r} is not lossless on process={process!r} trees of this shape: it is lossless for "
            f"the processes {v.processes}" + (f" (for this shape: {tuple(ok)})" if tuple(ok) != v.processes else "")
            + "; pass allow_lossy=True to run it anyway (DecodeResult.lossless is then False)")
    if isinstance(v, SpecTrTreeVerifier) and v.factory.name == "lp":
        widest = shape.top_k if is_eagle else max(len(c) for c in _children(shape.parents))
        bound = lp_max_support(widest)
        reach = V if sampling.top_k is None else min(V, sampling.top_k)
        if reach > bound and not sampling.greedy and (sampling.top_p is None or sampling.top_p >= 1.0):
            raise ValueError(f"`verifier`='spectr-tree' with token_verifier='lp' solves an LP on a support of up to "
                             f"{reach} tokens with {widest} drafts (at most {bound}): pass top_k <= {bound}, or "
                             "verifier_options={'token_verifier': 'optimal'}")
    if v.name == "gbv" and allow_lossy and not is_eagle:
        _chains(_children(shape.parents), "tree")  # GBV reads k disjoint chains: refuse other shapes now
    if is_eagle:
        levels = frontier = parent_rows = []
        k, L = shape.top_k, shape.depth
    else:
        levels, frontier, parent_rows = _levels(shape)
        k, L = len(shape.children(0)), shape.max_depth
    return TreePlan(shape=shape, process=process, verifier=v, name=v.name, lossless=lossless, k=k, L=L,
                    levels=levels, frontier=frontier, parent_rows=parent_rows)


# ----------------------------------------------------------------------------- one iteration
def _is_repeat(rows: np.ndarray, b: int) -> bool:
    """Whether ``rows`` is each of ``b`` state rows repeated equally, in order (what ``logits`` broadcasts)."""
    B = rows.shape[0]
    return b == 1 or (B % b == 0 and np.array_equal(rows, np.arange(B) // (B // b)))


def _common(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _alpha_opt(plan: TreePlan, tree, p0: np.ndarray, q0: np.ndarray) -> float:
    """The best first-depth acceptance of the draft process at the root (see :class:`DecodeResult`)."""
    kids = [int(tree.tokens[c]) for c in tree.children(0)]
    if plan.process == "iid":
        return float(otspec.alpha_k(p0, q0, len(kids), validate=False))
    if plan.process == "wor":
        return float(otspec.alpha_k(p0, q0, len(kids), replacement=False))
    if plan.process == "spechub":
        return float(spechub_optimum(p0, q0)) if len(kids) == 2 else float(np.minimum(p0, q0).sum())
    return float(q0[sorted(set(kids))].sum())  # a deterministic tree: the target-only rule's q(children)


class TreeStep:
    """One decoding iteration with a draft tree, run by the decoder of :func:`otspec.decoding.speculative_decode`.

    Called as ``step(dec, ctx)`` with the decoder (its draft and target tracks ``dec.d``, ``dec.t``, generator
    ``dec.gen``, log ``dec.log`` and ``dec._record``); returns the emitted tokens.
    """

    def __init__(self, plan: TreePlan, sampling: Sampling):
        self.plan = plan
        self.sampling = sampling
        # the law of the draft's ranks: its own softmax (temperature 1, untruncated), the processed law when equal
        self.raw_ranks = plan.ranks_by_raw_law and sampling.changes_law

    def _laws(self, logits):
        """Processed draft laws ``P`` and ranking laws ``R`` of ``(B, V)`` logits, on the host."""
        P = self.sampling.probs(logits)
        if not self.plan.ranks_by_raw_law:
            return _np(P), None
        R = self.sampling.own_law(logits) if self.raw_ranks else P
        return _np(P), _np(R)

    def __call__(self, dec, ctx: list[int]) -> list[int]:
        plan, d, t = self.plan, dec.d, dec.t
        grower = plan.grower(dec.gen)
        # -- draft: the root, then one call per depth on the frontier's rows
        pending = d.sync(ctx)
        P, R = self._laws(d.logits_t(np.array([pending], dtype=np.int64), last=1)[:, -1])
        d.seq = list(ctx)
        rows: list[tuple] = [()]
        laws = {(): P[0]}
        length = len(ctx)
        nxt = grower.take(P, R)
        while nxt is not None:
            toks, prow = nxt
            if not _is_repeat(prow, len(rows)):
                d.lm.select(d.state, prow.tolist(), length)
            P, R = self._laws(d.logits_t(toks[:, None], last=1)[:, -1])
            rows = [rows[r] + (int(x),) for r, x in zip(prow.tolist(), toks.tolist())]
            laws.update(zip(rows, P))
            length += 1
            nxt = grower.take(P, R)
        tree = grower.tree()
        # -- target: one call scores every node
        pending_t = t.sync(ctx)
        logits = t.lm.tree_logits(t.state, tree.parents, tree.tokens, pending=pending_t, fallback="rows")
        t.calls += 1
        t.batch = 1
        t.seq = list(ctx)
        Q = _np(self.sampling.probs(logits))
        paths = tree.paths()
        Pn = np.empty_like(Q)
        for i, s in enumerate(paths):
            law = laws.get(s)
            Pn[i] = Q[i] if law is None else law  # leaves: never read by a tree verifier (checked by the tests)
        # -- verify, emit, keep the caches of the emitted path
        a, y = plan.verifier.sample(tree, Pn, Q, rng=dec.gen, validate=False)
        out = list(paths[a]) + [int(y)]
        full = tuple(out)
        best = max(range(len(rows)), key=lambda r: _common(rows[r], full))
        d.sync(ctx + out, row=best, row_seq=ctx + list(rows[best]))
        a0 = time.perf_counter()
        self._analyse(dec, tree, Pn, Q, int(tree.depth[a]), len(out))
        dec.analysis_time += time.perf_counter() - a0
        return out

    def finish(self, dec) -> None:
        """Nothing to do after the loop: every iteration logged its predictions (the device route's differ)."""

    def _analyse(self, dec, tree, P, Q, tau: int, emitted: int) -> None:
        """The exact predictions given the realised tree (excluded from the wall time)."""
        plan, L = self.plan, self.plan.L
        mass = plan.verifier.emission(tree, P, Q, validate=False).sum(axis=1)
        by_depth = np.bincount(tree.depth, weights=mass, minlength=L + 1)[: L + 1]
        pred_reached = np.cumsum(by_depth[::-1])[::-1][1:]  # P(tau >= j | tree), j = 1..L
        pred_acc = float(by_depth @ np.arange(L + 1))
        reached = np.zeros(L)
        reached[:tau] = 1.0
        dec.log["alpha1"].append(float(pred_reached[0]))
        dec.log["alpha_opt1"].append(_alpha_opt(plan, tree, P[0], Q[0]))
        dec._record(tau, emitted, 1, pred_acc, pred_acc + 1.0, 1.0, reached, pred_reached)


#: The per-iteration records that a step's :meth:`finish` writes after the loop (the device route's predictions).
_FINISHED = ("pred_reached", "pred_acc", "pred_emit", "alpha1", "alpha_opt1")


class TreeSteps:
    r"""The decoder's tree iterations: the step of each depth an iteration drafts, made once per depth.

    Called as ``steps(dec, ctx, depth)`` with the iteration's depth
    :math:`D_i = \min(D, r_i - 1)` (:math:`r_i` the tokens left before
    ``max_new_tokens``; the decoder's plain step at :math:`r_i = 1`), it
    drafts :meth:`TreePlan.pruned` of that depth with the step that ``make``
    builds for it (:class:`TreeStep`, or the device route's). The depths of a
    decode never increase, so each step runs one contiguous span of
    iterations; :meth:`finish` calls each step's ``finish`` on a log of its
    own span and writes what it fills back in place (its rows padded to
    ``L`` with zeros), and each step keeps its own optimum at the root
    (the decoder's ``alpha_opt`` swapped in around its calls).

    Parameters
    ----------
    plan : TreePlan
        The decode's whole tree.
    make : callable
        ``make(plan) -> step``, a step called as ``step(dec, ctx)`` with a ``finish(dec)``.
    """

    def __init__(self, plan: TreePlan, make):
        self.plan = plan
        self._make = make
        self.steps: dict = {}  # depth -> (step, its optimum at the root: the decoder's alpha_opt while it runs)
        self.spans: list = []  # [depth, first iteration, end] of the steps in the order run

    def step(self, depth: int):
        """The step of ``depth`` (made at its first call)."""
        got = self.steps.get(depth)
        if got is None:
            got = self.steps[depth] = (self._make(self.plan.pruned(depth)), [])
        return got[0]

    def _own(self, dec, depth: int, call):
        """``call()`` with the decoder's optimum at the root that of the step of ``depth``."""
        mine = self.steps[depth]
        kept, dec.alpha_opt = dec.alpha_opt, mine[1]
        try:
            return call()
        finally:
            self.steps[depth] = (mine[0], dec.alpha_opt)
            dec.alpha_opt = kept

    def __call__(self, dec, ctx: list[int], depth: int) -> list[int]:
        lg = dec.log
        i = len(lg["accepted"])
        step = self.step(depth)
        if not self.spans or self.spans[-1][0] != depth:
            self.spans.append([depth, i, i])
        out = self._own(dec, depth, lambda: step(dec, ctx))
        self.spans[-1][2] = i + 1
        for key in ("alpha1", "alpha_opt1"):  # the device route's are written by its finish: keep the rows aligned
            lg[key].extend([np.nan] * (i + 1 - len(lg[key])))
        return out

    def finish(self, dec) -> None:
        """Each step's ``finish`` on its own span of the log (see the class)."""
        whole = dec.log
        try:
            for depth, lo, hi in self.spans:
                own = {key: rows[lo:hi] for key, rows in whole.items()}
                dec.log = own
                self._own(dec, depth, lambda d=depth: self.steps[d][0].finish(dec))
                for key in _FINISHED:
                    rows = own[key] if key != "pred_reached" else [dec._pad_zeros(r) for r in own[key]]
                    whole[key][lo:hi] = rows
        finally:
            dec.log = whole


def _layout_sizes(plan: TreePlan) -> tuple[int, int, int, int]:
    """``(n + 1, I, f, m)`` of a plan: its nodes with the root, the rows of its laws at the nodes with children (a
    shape's frontiers; EAGLE-2's expanded slots ``1 + (D - 1) K``), the widest draft call and the most children of a
    node."""
    s = plan.shape
    if plan.process == "eagle2":
        K, D = int(s.top_k), int(s.depth)
        return int(s.n) + 1, 1 + (D - 1) * K, K if D > 1 else 1, K
    sizes = [len(f) for f in plan.frontier]
    m = max((len(ch) for lev in plan.levels for _, ch, _ in lev), default=1)
    return int(s.n) + 1, sum(sizes), max(sizes, default=1), m


def tree_law_bytes(plan: TreePlan, V: int, sampling: Sampling, *, device: bool, prompt: int = 1,
                   log_laws: bool = False, law_batch: int = 64, by_rows: bool = False) -> dict[str, int]:
    r"""Bytes one tree iteration of :func:`otspec.decoding.speculative_decode` holds at once, by part.

    Counted from the code of the two routes, in rows of ``V`` entries, with :math:`N = n + 1` the tree's nodes
    (the root included), :math:`I` the nodes with children (a shape's frontiers; EAGLE-2's expanded slots
    :math:`1 + (D - 1) K`) and :math:`f` the widest draft call:

    * ``"laws"`` (float64, ``8 V`` bytes a row). The host route (:class:`TreeStep`): the draft's laws of every
      depth, kept until the verification (:math:`I` rows), the target's laws at every node, the verifier's draft
      laws ``Pn`` and the exact emission of the analysis (:math:`3 N`). The device route
      (:mod:`otspec.decoding._tree_device`): the blocks a step keeps across iterations -- the draft's laws at the
      nodes with children (:math:`I`, none for top-k children verified by the target-only rule; EAGLE-2: its
      ranking laws, and the processed ones where the sampling changes them), the target's there (:math:`I`), the
      rejections' level pass (:math:`I`, SpecInfer's and Sequoia's rules with two children or more), the draws'
      running sums (:math:`f`) and the accepted node's rows (3) -- summed over the full tree's step and the steps
      of every shorter depth of the last iterations (:meth:`TreePlan.pruned`: each step keeps its own blocks to
      the end of the decode).
    * ``"root laws"`` (device route, ``log_laws`` with ``"iid"`` or ``"wor"``): the kept root logits, two blocks of
      ``law_batch`` rows at 4 bytes an entry; at each flush their float64 laws formed again and stacked for the
      batched optimum (four blocks of ``law_batch`` rows) and its sort's working arrays (eight of its chunk of
      :math:`\min(\text{law\_batch}, \max(1, 2^{19} / V))` rows, :func:`otspec.alpha_k`).
    * ``"logits"`` (float32, ``4 V`` bytes a row; a model of two-byte dtype holds half): the target's tree call
      computes every column it is fed -- at the first iteration the ``prompt`` tokens and the ``n`` draft nodes
      (``prompt = 1`` for a model whose output layer is limited to the tree's columns by ``logits_to_keep``);
      scored by rows (``by_rows``: a model that takes no 4-D mask, :meth:`otspec.decoding.HFCausalLM.tree_logits`'s
      ``fallback="rows"``) every root-to-leaf path of the host route as its own row of ``prompt + D`` columns, every
      node's path of the device route as its own row of ``prompt + n`` columns, and the :math:`N` rows gathered
      from them -- and the draft's logits of every depth (the device route keeps them to its one host read,
      :math:`I`, and gathers the target's at the nodes with children, :math:`I`; the host route one call's,
      :math:`f`).
    * ``"temporaries"`` (float64): the float64 copy of the logits that :meth:`Sampling.probs` divides by the
      temperature while it forms the target's laws (:math:`N` on the host route, :math:`I` on the device route),
      twice more under ``top_k`` / ``top_p`` (the masked copy; the sorted values and their running sums), and on
      the host route the tree verifier's working rows while it samples and forms the emission (:math:`N`) and,
      for ``"spechub"``, the pair law of a node with two children and its running sums (two ``(V, V)`` tables,
      :func:`otspec.tree.spechub_pair_law`).

    Parameters
    ----------
    plan : TreePlan
    V : int
        The vocabulary.
    sampling : Sampling
    device : bool, keyword-only
        The device route (:func:`otspec.decoding._tree_device.device_tree_step`), else the host route.
    prompt : int, keyword-only
        Tokens of the prompt (the first target call's pending columns).
    log_laws, law_batch : keyword-only
        As :func:`otspec.decoding.speculative_decode` passes them.
    by_rows : bool, keyword-only
        The target scores the tree by rows (it cannot take a 4-D attention mask).

    Returns
    -------
    dict of str to int
        Bytes of ``"laws"``, ``"root laws"``, ``"logits"``, ``"temporaries"``: ``"laws"`` and ``"root laws"`` are
        what :data:`otspec.decoding.MAX_LAW_BYTES` bounds, the sum what a CUDA device must have free.

    Examples
    --------
    SpecInfer's 144-node tree (16 children of the root, 8 of each) at Llama 3's vocabulary, on the device:

    >>> from otspec.decoding import CallableLM, Sampling
    >>> from otspec.decoding._tree_loop import tree_law_bytes, tree_plan
    >>> lm = CallableLM(lambda ids: ids[..., None].double().repeat(1, 1, 4), vocab_size=4)
    >>> plan = tree_plan("iid:branching(16,8)", process=None, verifier=None, options=None, allow_lossy=False,
    ...                  target=lm, V=4, sampling=Sampling())
    >>> {k: round(v / 2**20) for k, v in tree_law_bytes(plan, 128_256, Sampling(), device=True).items()}  # MiB
    {'laws': 75, 'root laws': 0, 'logits': 88, 'temporaries': 17}
    """
    V = int(V)
    extra = 2 if sampling.truncated else 0
    N, I, f, m = _layout_sizes(plan)
    prompt = int(prompt)
    if not by_rows:
        scored = prompt + N - 1
    elif device or plan.process == "eagle2":  # every node's path (EAGLE-2 on the host: at most n leaves)
        scored = N * (prompt + (N - 1 if device else plan.L)) + N
    else:
        scored = len(plan.shape.leaves) * (prompt + plan.L) + N
    out = {"laws": 0, "root laws": 0, "logits": 4 * V * scored, "temporaries": 0}
    if not device:
        out["laws"] = 8 * V * (I + 3 * N)
        out["logits"] += 4 * V * f
        out["temporaries"] = 8 * V * N * (2 + extra) + (2 * 8 * V * V if plan.process == "spechub" else 0)
        return out
    rule = plan.name
    depths = [plan.L] + list(range(1, plan.L))  # the full tree's step, then those of every shorter depth
    for d in depths:
        sub = plan.pruned(d)
        _, Id, fd, md = _layout_sizes(sub)
        if plan.process == "eagle2":
            needs_p = rule != "target-only"
            p_rows = Id * (1 + (needs_p and sampling.changes_law))
            draws = 0
        else:
            needs_p = plan.process != "topk" or rule != "target-only"
            p_rows = Id if needs_p else 0
            draws = fd if plan.process in ("iid", "wor") else 0
        lvl = Id if rule in ("specinfer", "sequoia") and md > 1 else 0
        out["laws"] += 8 * V * (p_rows + Id + lvl + draws + 3)
    out["logits"] += 4 * V * 2 * I
    out["temporaries"] = 8 * V * I * (1 + extra)
    if log_laws and plan.process in ("iid", "wor"):
        out["root laws"] = 2 * int(law_batch) * V * (4 + 2 * 8) + 8 * V * 8 * min(int(law_batch), max(1, 2**19 // V))
    return out


def check_without_tree(process, allow_lossy) -> None:
    """Without ``tree``: refuse ``process`` and ``allow_lossy`` (they describe draft trees)."""
    if process is not None:
        raise ValueError(f"`process` describes how a draft tree is filled: pass `tree` too, got process={process!r} "
                         "without a tree")
    if allow_lossy is not False:
        raise ValueError("`allow_lossy` applies to draft trees (`tree`): chain schemes run a lossy verifier such as "
                         f"'mentored' by name, got allow_lossy={allow_lossy!r} without a tree")


def check_with_tree(k, L) -> None:
    """With ``tree``: refuse ``k`` and ``L`` (the shape gives the root's children and the depth)."""
    for name, x in (("k", k), ("L", L)):
        if x is not None:
            raise ValueError(f"`{name}` describes draft chains; with `tree` the shape gives the root's children "
                             f"and the depth: leave `{name}` unset, got {name}={x!r}")
