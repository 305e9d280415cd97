r"""Draft-tree families in a profile: what they are, how each is drawn and scored at a position, what is recorded.

A *tree family* is a rule that builds a draft tree at every profiled
context: a static shape of rank paths filled by a draft process
(:func:`otspec.tree.sample_tree`: ``"topk"`` -- Medusa's and EAGLE's
deterministic trees --, ``"iid"`` -- SpecInfer's --, ``"wor"`` -- Sequoia's,
without replacement) or EAGLE-2's dynamic tree (``"eagle2"``,
:class:`otspec.tree.Eagle2Params`). At every profiled position of a profile
run (the same contexts as the ``(k, L)`` families, so the comparison is
paired) each tree is drafted with one batched draft call per depth (the
rows of a call are the nodes of that depth that get children, of every
tree and every prompt of the batch) and scored with one target call with
a tree attention mask (``tree_logits``). What is recorded, exactly:

* ``kind="tree"``: per family (and verifier, for the sampled processes)
  :math:`\mathbb E[\tau \mid T]`, the expected number of accepted draft
  tokens given the drawn tree -- for the deterministic processes
  :math:`\sum_{v \ne \mathrm{root}} Q(x_{1:d(v)})`, the target's path
  probabilities (every lossless verifier emits a target sample and accepts
  its longest prefix in the tree), for the sampled ones the verifier's
  ``expected_accepted`` on the laws at the nodes;
* ``kind="treeq"`` and ``"treep"``: the target's path probability
  :math:`Q(x_{1:d})` and the draft's own probability of the last token
  :math:`p(x_d \mid x_{<d})` (temperature 1, untruncated: the law EAGLE-2
  ranks by) of every rank path of the top-k *universe* (the union of the
  ``"topk"`` shapes and ``tree_universe``), so that the value of any static
  top-k shape inside it is a sum of recorded numbers (and EAGLE-2's tree
  for parameters inside it can be rebuilt from the draft's probabilities) (the choice of a shape
  over contexts is then exact: the best static shape with ``n`` nodes is
  the ``n`` rank paths with the largest mean :math:`Q`);
* ``kind="e"`` (with ``context="sample"``): for the static ``"topk"``
  families, the exact emission table along the text
  (:func:`topk_emission_along`, recorded by the renewal hook), keyed like
  their ``kind="tree"`` rows, for the renewal estimate and the Palm average;
* ``kind="treenode"``: for the sampled families, every node's probability
  of being reached (accepted) given the drawn tree; for a per-node rule
  (SpecInfer's, Sequoia's) on a shape without rank gaps this is also the
  node's value in every sub-shape without rank gaps, and the root's
  children give Sequoia's acceptance vector.

Only the laws at the nodes that have children are computed: a node's
acceptance depends on the laws at its ancestors, never on its own next-token
law (that one only draws the bonus token), so the target call scores the
tree of internal nodes.

Notation: ``p`` is the draft's law and ``q`` the target's; :math:`Q` and
:math:`P` their probabilities of a root path.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from .._array import namespace, to_host
from .._registry import suggest, verifier_names
from ..decoding._sampling import bad_rows, sample_rows
from ..decoding._sampling import on_device as _moved
from ..decoding._tree_device import ranked_rows_t
from ..tree import DraftTree, Eagle2Params, TargetOnlyVerifier, TreeShape, make_tree_verifier
from ..tree._process import _eagle2_tree, _ranked, draw_children
from ..tree._spec import SHAPE_FORMS, check_process, check_tree_size, parse_shape_text, parse_tree_spec, shape_of
from ..tree._verifiers import _NodeScan
from . import _trees_device
from ._quantities import read_parts, text_probs, tokens_like
from ._quantities_batched import _Pack

__all__ = ["TREE_PROCESSES", "DEFAULT_TREE_VERIFIERS", "TREE_KINDS", "MAX_TREE_FAMILIES",
           "MAX_UNIVERSE_NODES", "MAX_TREE_DEPTH", "TreeFamily", "TreePlan", "resolve_trees", "tree_rng",
           "draw_and_score", "record_position", "tree_values_per_position", "tree_cost_shapes", "tree_law_bytes",
           "check_tree_support", "check_tree_context", "context_limit", "static_order", "draft_rows",
           "eagle2_from_universe", "iid_levels_where", "text_ranks", "text_ranks_where", "text_ranks_of",
           "topk_emission_along", "along_text_names", "along_text_families",
           "tree_emission_along", "iid_emission_along", "static_along_names",
           "along_text_route", "tree_values_per_text_position",
           "LawBuffers", "compact_tree", "kept_tree_bytes", "ranks_by_raw_law", "draft_trees", "score_trees",
           "DraftedTrees", "ScoredTrees"]

#: The draft processes a tree family may use.
TREE_PROCESSES = ("topk", "eagle2", "iid", "wor")
#: The verifiers of a sampled family when its spec names none: SpecInfer's rule on i.i.d. children; Sequoia's
#: rule and Traversal Verification on children drawn without replacement.
DEFAULT_TREE_VERIFIERS = {"iid": ("specinfer",), "wor": ("sequoia", "traversal")}
#: Row kinds of the tree families (beside the ``(k, L)`` families' kinds).
TREE_KINDS = ("tree", "treeq", "treep", "treenode")
#: Largest number of tree families of one run.
MAX_TREE_FAMILIES = 64
#: Largest top-k universe, in rank paths (two rows per path and profiled position).
MAX_UNIVERSE_NODES = 4096
#: Largest depth of a tree: one draft call per depth and profiled position.
MAX_TREE_DEPTH = 64
#: Labels longer than this are replaced by ``process:paths-<sha256 prefix>`` (explicit shapes).
_MAX_LABEL = 48


def _where(i) -> str:
    return "`trees`" if i is None else f"`trees[{i}]`"


# --------------------------------------------------------------------------- families
@dataclass(frozen=True, eq=False)
class TreeFamily:
    r"""One tree family of a profile: a draft process, its shape (or EAGLE-2's parameters) and its verifiers.

    .. math::

        T_c \sim D(\text{shape}, p(\cdot \mid c, \cdot)) \quad\text{at every profiled context } c,
        \qquad \text{recorded: } \mathbb E[\tau \mid T_c] \text{ per verifier}.

    Attributes
    ----------
    process : {"topk", "eagle2", "iid", "wor"}
    shape : TreeShape or Eagle2Params
    verifiers : tuple of str
        Tree verifiers (registered, lossless for the process and shape); ``()`` for the deterministic
        processes, whose value does not depend on the verifier.
    spec : str
        The canonical text of the family (what the manifest records): ``process:shape[:verifiers]``.
    label : str
        The family's name in the rows (the spec without its verifiers, shortened for long explicit shapes).
    """

    process: str
    shape: object
    verifiers: tuple
    spec: str
    label: str

    @property
    def n(self) -> int:
        """Draft nodes of the tree."""
        return int(self.shape.n)

    @property
    def depth(self) -> int:
        """Largest depth of the tree."""
        return int(self.shape.max_depth) if isinstance(self.shape, TreeShape) else int(self.shape.depth)

    @property
    def deterministic(self) -> bool:
        return self.process in ("topk", "eagle2")

    def names(self) -> tuple[str, ...]:
        """The names of its ``kind="tree"`` rows: the label, or ``label/verifier`` per verifier."""
        return (self.label,) if self.deterministic else tuple(f"{self.label}/{v}" for v in self.verifiers)


def _label(process: str, canon: str) -> str:
    text = f"{process}:{canon}"
    if len(text) <= _MAX_LABEL:
        return text
    return f"{process}:paths-{hashlib.sha256(canon.encode()).hexdigest()[:10]}"


def _check_verifiers(names, process: str, shape, where: str) -> tuple[str, ...]:
    known = verifier_names(kind="tree")
    out = []
    for v in names:
        if v not in known:
            raise ValueError(f"{where}: unknown tree verifier {v!r}{suggest(v, known)}; known: {known}")
        ver = make_tree_verifier(v)
        if not ver.lossless_for(process, shape):
            gaps = " (this shape skips a sibling rank)" if process in ver.processes else ""
            which = (f"it is lossless for the processes {ver.processes}" if ver.processes else
                     "it is lossless for no draft process (lossy as its authors coded it)")
            raise ValueError(f"{where}: verifier {v!r} is not lossless on {process!r} trees of this shape{gaps}: "
                             f"{which}")
        if v in out:
            raise ValueError(f"{where}: verifier {v!r} is named twice")
        out.append(v)
    return tuple(out)


def _family(process: str, shape, verifiers, where: str, canon: str | None = None) -> TreeFamily:
    check_process(process, TREE_PROCESSES, where)
    if process == "eagle2":
        if not isinstance(shape, Eagle2Params):
            raise TypeError(f"{where}: an 'eagle2' family takes Eagle2Params (or the text "
                            f"'eagle2:num_steps,topk,num_draft_tokens'), got {type(shape).__name__}")
        canon = f"{shape.num_steps},{shape.topk},{shape.num_draft_tokens}"
    elif canon is None:
        if isinstance(shape, str):
            shape, canon = parse_shape_text(shape, where)
        else:
            if not isinstance(shape, TreeShape):
                shape = shape_of(shape, where)
            canon = json.dumps(shape.to_medusa_choices(), separators=(",", ":"))
    check_tree_size(shape.n, where, what="an EAGLE-2 tree" if process == "eagle2" else "a tree")
    depth = shape.max_depth if isinstance(shape, TreeShape) else shape.num_steps
    if depth > MAX_TREE_DEPTH:
        raise ValueError(f"{where}: a tree of depth {depth} is above the limit MAX_TREE_DEPTH = {MAX_TREE_DEPTH} "
                         "(one draft call per depth)")
    label = _label(process, canon)
    if process in ("topk", "eagle2"):
        # every lossless verifier accepts the longest prefix of a target sample: one value, whichever is named
        _check_verifiers(verifiers, process, shape, where)
        return TreeFamily(process, shape, (), f"{process}:{canon}", label)
    if not verifiers:  # the defaults that are lossless on this shape
        verifiers = tuple(v for v in DEFAULT_TREE_VERIFIERS[process] if make_tree_verifier(v).lossless_for(process,
                                                                                                        shape))
        if not verifiers:
            raise ValueError(f"{where}: none of the default verifiers {DEFAULT_TREE_VERIFIERS[process]} is lossless on "
                             f"{process!r} trees of this shape (it skips a sibling rank): name one")
    verifiers = _check_verifiers(verifiers, process, shape, where)
    return TreeFamily(process, shape, verifiers, f"{process}:{canon}:{','.join(verifiers)}", label)


def parse_family(item, i=None) -> TreeFamily:
    """A :class:`TreeFamily` from its text ``process:shape[:verifiers]`` (the language of
    :func:`otspec.tree.parse_tree_spec`, shared with :func:`otspec.decoding.speculative_decode`), a tuple
    ``(process, shape[, verifiers])`` or a TreeFamily (``i``: its index, for messages).

    A deterministic family (``topk``, ``eagle2``) takes no verifier, or lossless ones only (``target-only``, as
    the decoder takes it): every lossless verifier accepts the longest prefix of a target sample in the tree,
    so the value is the same whichever is named, and the family is recorded once, under its shape.
    """
    where = _where(i)
    if isinstance(item, TreeFamily):
        return _family(item.process, item.shape, item.verifiers, where)
    if isinstance(item, str):
        spec = parse_tree_spec(item, where, processes=TREE_PROCESSES)
        return _family(spec.process, spec.shape, spec.verifiers, where, spec.canon)
    if isinstance(item, tuple) and 2 <= len(item) <= 3 and isinstance(item[0], str):
        vs = item[2] if len(item) == 3 else ()
        if isinstance(vs, str):
            vs = (vs,)
        return _family(item[0], item[1], tuple(vs), where)
    raise TypeError(f"{where} must be a text 'process:shape[:verifiers]', a tuple (process, shape[, verifiers]) or "
                    f"a TreeFamily, got {type(item).__name__}")


# --------------------------------------------------------------------------- a run's plan
@dataclass(frozen=True, eq=False)
class TreePlan:
    """The tree families of a run, resolved: the families in order and the top-k universe.

    Attributes
    ----------
    families : tuple of TreeFamily
    universe : TreeShape or None
        The rank paths whose target path probabilities (and draft token probabilities) are recorded: the union of the
        ``"topk"`` families' shapes and ``tree_universe`` (None when neither is given).
    universe_spec : str or None
        The canonical text of ``tree_universe`` as given (None when not given).
    """

    families: tuple
    universe: TreeShape | None
    universe_spec: str | None
    index: dict = field(default_factory=dict, repr=False)

    @property
    def specs(self) -> tuple[str, ...]:
        return tuple(f.spec for f in self.families)

    def names(self) -> tuple[str, ...]:
        """Every ``kind="tree"`` row name, in order."""
        return tuple(n for f in self.families for n in f.names())

    def family_of(self, name: str) -> TreeFamily:
        for f in self.families:
            if name in f.names():
                return f
        raise KeyError(name)

    @property
    def sampled(self) -> tuple:
        return tuple(f for f in self.families if not f.deterministic)

    @property
    def eagle2(self) -> tuple:
        return tuple(f for f in self.families if f.process == "eagle2")

    @property
    def topk(self) -> tuple:
        return tuple(f for f in self.families if f.process == "topk")

    @property
    def depth(self) -> int:
        """Largest depth of any tree of the plan (the universe included)."""
        ds = [f.depth for f in self.families] + ([self.universe.max_depth] if self.universe is not None else [])
        return max(ds, default=0)


def resolve_trees(trees, universe=None) -> TreePlan:
    r"""The :class:`TreePlan` of ``ProfileSettings(trees=..., tree_universe=...)``, validated (no model call).

    Raises
    ------
    TypeError, ValueError
        A family that is not ``process:shape[:verifiers]`` (the entry is named), an unknown process or
        verifier (with the closest name), a shape that is not prefix-closed (the first path whose parent is
        missing), a verifier not lossless for the process and shape, a family named twice, a tree or a
        tree without draft nodes, a tree or a universe above its limit
        (:data:`otspec.tree.MAX_DRAFT_TREE_NODES`, shared with the decoder; :data:`MAX_UNIVERSE_NODES`,
        :data:`MAX_TREE_DEPTH`, :data:`MAX_TREE_FAMILIES`).
    """
    if trees is None:
        trees = ()
    if isinstance(trees, (str, TreeFamily)) or (isinstance(trees, tuple) and len(trees) in (2, 3)
                                                and isinstance(trees[0], str) and trees[0] in TREE_PROCESSES):
        trees = (trees,)
    try:
        items = list(trees)
    except TypeError:
        raise TypeError(f"`trees` must be a sequence of tree families, got {type(trees).__name__}") from None
    if len(items) > MAX_TREE_FAMILIES:
        raise ValueError(f"`trees` names {len(items)} families, above the limit MAX_TREE_FAMILIES = "
                         f"{MAX_TREE_FAMILIES}")
    fams = []
    seen: dict = {}
    for i, item in enumerate(items):
        f = parse_family(item, i)
        what = f.shape.paths if isinstance(f.shape, TreeShape) else (f.shape.depth, f.shape.top_k, f.shape.total_tokens)
        for name, v in zip(f.names(), f.verifiers or (None,)):
            for key in (name, (f.process, what, v)):
                if key in seen:
                    raise ValueError(f"`trees[{i}]` repeats the family {name!r} of `trees[{seen[key]}]` (same process, "
                                     "shape and verifier)")
                seen[key] = i
        fams.append(f)
    uspec = None
    paths: set = set()
    if universe is not None:
        if isinstance(universe, str):
            ushape, uspec = parse_shape_text(universe, "`tree_universe`", MAX_UNIVERSE_NODES, name="MAX_UNIVERSE_NODES")
        elif isinstance(universe, TreeShape):
            ushape = universe
            check_tree_size(ushape.n, "`tree_universe`", MAX_UNIVERSE_NODES, what="a universe",
                            name="MAX_UNIVERSE_NODES")
            uspec = json.dumps(ushape.to_medusa_choices(), separators=(",", ":"))
        else:
            raise TypeError(f"`tree_universe` must be a shape text ({SHAPE_FORMS}) or a TreeShape, got "
                            f"{type(universe).__name__}")
        paths.update(ushape.paths[1:])
    for f in fams:
        if f.process == "topk":
            paths.update(f.shape.paths[1:])
    shape = None
    if paths:
        if len(paths) > MAX_UNIVERSE_NODES:
            raise ValueError(f"the top-k universe (`tree_universe` and the 'topk' shapes) has {len(paths)} rank "
                             f"paths, above the limit MAX_UNIVERSE_NODES = {MAX_UNIVERSE_NODES}")
        shape = TreeShape(sorted(paths))
        if shape.max_depth > MAX_TREE_DEPTH:
            raise ValueError(f"`tree_universe` has depth {shape.max_depth}, above the limit MAX_TREE_DEPTH = "
                             f"{MAX_TREE_DEPTH}")
    index = {p: i for i, p in enumerate(shape.paths)} if shape is not None else {}
    return TreePlan(tuple(fams), shape, uspec, index)


def _max_rank(shape: TreeShape) -> int:
    return int(shape.ranks[1:].max()) + 1 if shape.n else 0


def check_tree_support(plan: TreePlan, reach: int, how: str) -> None:
    """Refuse trees that need more distinct children at a node than the sampling leaves tokens (``reach``).

    Raises
    ------
    ValueError
        A ``"topk"`` or ``"wor"`` shape with a rank at or above ``reach``, or ``"eagle2"`` with ``top_k`` above it.
    """
    need = []
    if plan.universe is not None:
        need.append(("the top-k universe (`tree_universe` and the 'topk' shapes)", _max_rank(plan.universe)))
    for f in plan.families:
        if f.process == "wor":
            need.append((f.label, _max_rank(f.shape)))
        elif f.process == "eagle2":
            need.append((f.label, f.shape.top_k))
    for what, m in need:
        if m > reach:
            raise ValueError(f"`trees`: {what} needs {m} distinct children at a node, but {how} leaves at most "
                             f"{reach} tokens with mass: use smaller ranks or a wider sampling")


def context_limit(lm) -> int | None:
    """The most positions ``lm`` takes (``max_positions``, or a transformers config's
    ``max_position_embeddings`` / ``n_positions``), or None when it states none."""
    lim = getattr(lm, "max_positions", None)
    if lim is None:
        cfg = getattr(getattr(lm, "model", None), "config", None)
        lim = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    return int(lim) if isinstance(lim, (int, np.integer)) and lim > 0 else None


def check_tree_context(plan: TreePlan, draft, target, longest: int, max_new_tokens: int) -> None:
    """Refuse trees whose deepest node lies past a model's context: prompt + path + depth positions.

    Raises
    ------
    ValueError
        Naming the model, its limit and the deepest tree.
    """
    if plan is None or plan.depth == 0:
        return
    need = longest + max_new_tokens - 1 + plan.depth
    for role, lm in (("draft", draft), ("target", target)):
        lim = context_limit(lm)
        if lim is not None and need > lim:
            raise ValueError(f"`trees`: a tree of depth {plan.depth} after prompts of up to {longest} tokens and "
                             f"`max_new_tokens` = {max_new_tokens} reaches position {need}, past the {role} model's "
                             f"context of {lim} positions: use shallower trees, shorter paths or prompts")


def tree_values_per_position(plan: TreePlan) -> int:
    """Rows one profiled position adds for the trees (a bound, for the shard's memory limit)."""
    if plan is None:
        return 0
    out = 2 * plan.universe.n if plan.universe is not None else 0
    for f in plan.families:
        out += len(f.names()) * (1 + (0 if f.deterministic else f.n))
    return out


def kept_tree_bytes(plan: TreePlan | None) -> int:
    """Bytes one text position keeps for the walk along the text: the compact trees (:func:`compact_tree`) of
    the families of :func:`along_text_families`, with room for the arrays' headers."""
    return sum(8 * (f.n + 1) + 256 for f in along_text_families(plan))


def tree_values_per_text_position(plan: TreePlan) -> int:
    """Emission rows one text position adds for the trees along the text (a bound: every row name, ``depth + 1``
    values each), for the shard's memory limit."""
    if plan is None:
        return 0
    return sum(len(f.names()) * (f.depth + 1) for f in plan.families)


def _internal(parents: np.ndarray) -> np.ndarray:
    """Node ids with at least one child (the root always), in node order."""
    has = np.zeros(parents.shape[0], dtype=bool)
    has[0] = True
    has[parents[1:]] = True
    return np.flatnonzero(has)


def draft_rows(shape) -> list[int]:
    """Rows of each draft call of a tree (one call per depth ``0..D-1``): the nodes of that depth with children.

    For EAGLE-2's parameters: ``1`` then ``top_k`` per later depth (its frontier).
    """
    if isinstance(shape, Eagle2Params):
        return [1] + [shape.top_k] * (shape.depth - 1)
    inner = _internal(shape.parents)
    d = shape.depth[inner]
    return [int(np.count_nonzero(d == j)) for j in range(shape.max_depth)]


def tree_law_bytes(plan: TreePlan, V: int, batch: int) -> int:
    """Bytes of the laws the trees of one position hold at once (float64): a batch's target laws at the internal
    nodes of the largest scored tree (twice: tensor and array), one sampled tree's full node laws and emission, and
    on the laws' device the sampled trees' draft and target laws at the internal nodes of every such family of the
    batch, with their copies into the verification's forests and its one pass's temporary (five each:
    :class:`otspec.profile._trees_device.SampledTrees`)."""
    if plan is None or not plan.families and plan.universe is None:
        return 0
    scored = [len(_internal(plan.universe.parents))] if plan.universe is not None else []
    scored += [len(_internal(f.shape.parents)) for f in plan.families if isinstance(f.shape, TreeShape)]
    scored += [f.shape.n + 1 for f in plan.eagle2]
    full = max((f.n + 1 for f in plan.sampled), default=0)
    held = sum(len(_internal(f.shape.parents)) for f in plan.sampled)
    return 8 * V * (2 * batch * max(scored, default=1) + 3 * full + 5 * batch * held)


# --------------------------------------------------------------------------- drawing at a position
def tree_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of prompt ``index``'s sampled trees: a child of its path's generator's seed sequence, so the
    ``(k, L)`` draws and the path are the same with or without trees."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(index), 1)))


class RankedLaw:
    """The ``K`` most likely tokens of a node's law, ranked on the laws' device, and their probabilities.

    What the deterministic trees read of a law (top-k children, EAGLE-2's proposals and scores, the universe's
    draft probabilities): ``ids`` in decreasing probability, ties by lower id (the order of
    :func:`otspec.tree._process._ranked`), ``vals`` the law at them; ``law[token]`` for a ranked token, as for a
    dense law. ``own`` (optional): another law (the draft's own) at the same ``ids``. ``logs`` (optional): the
    logarithms of ``vals`` as the laws' device computed them (EAGLE-2's scores add these, so that the host's scores
    are the device's, whose frontier fed the draft).
    """

    __slots__ = ("ids", "vals", "logs", "_at")

    def __init__(self, ids: np.ndarray, vals: np.ndarray, logs: np.ndarray | None = None):
        self.ids, self.vals, self.logs = ids, vals, logs
        self._at = None

    def __getitem__(self, token) -> float:
        if self._at is None:
            self._at = dict(zip(self.ids.tolist(), self.vals.tolist()))
        return self._at[int(token)]

    def positive(self) -> int:
        """Tokens of positive probability among the ranked ones (all of the law's when fewer than ``K``)."""
        return int(np.count_nonzero(self.vals > 0))

    def top(self, k: int) -> np.ndarray:
        if k > self.ids.shape[0]:  # pragma: no cover - the caller ranks as many as any job needs
            raise RuntimeError(f"{k} ranks asked of a law ranked to {self.ids.shape[0]}")
        return self.ids[:k]


def ranked_rows(laws, K: int):
    r"""The ``K`` most likely tokens of every row, ties by lower id, and their probabilities, in the laws' namespace.

    .. math::

        \text{ids}_{i, r} = \text{the } r\text{-th token of row } i \text{ in decreasing } p_i,
        \text{ ties by lower id}, \qquad \text{vals}_{i, r} = p_i(\text{ids}_{i, r}), \qquad r < K.

    A torch tensor is ranked on its device with no host read (:func:`otspec.decoding._tree_device.ranked_rows_t`:
    top-``K`` passes over the rows, no ``nonzero``, whose size a GPU would read); a numpy array row by row
    (:func:`otspec.tree._process._ranked`).

    Parameters
    ----------
    laws : (n, V) torch tensor or numpy array
    K : int
        ``1 <= K <= V``.

    Returns
    -------
    tuple of (n, K) arrays
        ``ids`` (int64) and ``vals`` (the laws' dtype), in the laws' namespace and on their device.

    Examples
    --------
    >>> import numpy as np, torch
    >>> from otspec.profile._trees import ranked_rows
    >>> p = np.array([[0.1, 0.4, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25]])
    >>> ranked_rows(torch.from_numpy(p), 3)[0].tolist(), ranked_rows(p, 3)[0].tolist()
    ([[1, 3, 0], [0, 1, 2]], [[1, 3, 0], [0, 1, 2]])
    """
    if isinstance(laws, np.ndarray):
        ids = np.stack([_ranked(row, K) for row in laws]) if laws.shape[0] else np.zeros((0, K), dtype=np.int64)
        return ids.astype(np.int64), np.take_along_axis(laws, ids, axis=1)
    import torch

    if laws.shape[0] == 0:
        return torch.zeros((0, K), dtype=torch.long, device=laws.device), laws[:, :K]
    return ranked_rows_t(laws, K)  # no nonzero: nothing whose size the host must read


class _ShapeJob:
    """A tree of a static shape (``"topk"``, ``"iid"``, ``"wor"``) for one prompt, grown depth by depth."""

    def __init__(self, shape: TreeShape, process: str, rng, label: str):
        self.shape, self.process, self.rng, self.label = shape, process, rng, label
        n1 = shape.n + 1
        self.tokens = np.full(n1, -1, dtype=np.int64)
        self.kids: dict = {}
        for c in range(1, n1):
            self.kids.setdefault(int(shape.parents[c]), []).append(c)
        self.inner = _internal(shape.parents)  # the nodes with children, root first
        self.by_depth: dict = {}
        for v in self.inner.tolist():
            self.by_depth.setdefault(int(shape.depth[v]), []).append(v)
        self.p: dict = {}
        self.raw: dict = {}  # the draft's own laws (temperature 1, untruncated), when the run ranks by them

    def need(self, level: int) -> list:
        return self.by_depth.get(level, [])

    def token(self, v) -> int:
        return int(self.tokens[v])

    def ranks(self, v) -> int:
        """How many ranked tokens node ``v``'s children read (0: it draws them, or has none)."""
        kids = self.kids.get(v)
        return max(int(self.shape.ranks[c]) for c in kids) + 1 if kids and self.process == "topk" else 0

    def _support(self, need: int, v, p, top=None) -> None:
        """Refuse node ``v`` when its law has fewer than ``need`` tokens of positive probability; ``top``: its
        ``need`` most likely tokens, when ranked already (then the check reads the last of them, not the whole law)."""
        if top is not None and not isinstance(p, RankedLaw) and p[top[-1]] > 0:
            return
        have = p.positive() if isinstance(p, RankedLaw) else int(np.count_nonzero(p > 0))
        if have < need:
            raise ValueError(f"tree family {self.label!r} needs {need} distinct children at node {v} (rank path "
                             f"{self.shape.paths[v]}), but the draft's law there has only "
                             f"{have} tokens of positive probability")

    def expand(self, v: int, p: np.ndarray, raw: np.ndarray | None = None) -> None:
        self.p[v] = p
        if raw is not None:
            self.raw[v] = raw
        kids = self.kids.get(v)
        if not kids:
            return
        ranks = [int(self.shape.ranks[c]) for c in kids]
        if self.process == "topk":
            order = p.top(max(ranks) + 1) if isinstance(p, RankedLaw) else _ranked(p, max(ranks) + 1)
            self._support(max(ranks) + 1, v, p, order)
            self.tokens[kids] = order[ranks]
        elif self.process == "iid":
            self.tokens[kids] = sample_rows(np.broadcast_to(p, (len(kids), p.shape[0])), self.rng)
        else:  # without replacement: the r-th of successive draws, the missing ranks drawn and discarded
            self._support(max(ranks) + 1, v, p)
            self.tokens[kids] = draw_children(np.asarray(p, dtype=np.float64), ranks, "wor", self.rng)

    def tree(self) -> DraftTree:
        """The drawn tree (a top-k tree is :func:`otspec.tree.sample_tree`'s on the same laws: tested, not rebuilt
        here at every position)."""
        return DraftTree(self.shape, self.shape.parents, self.tokens)


class _Eagle2Job:
    """EAGLE-2's dynamic tree for one prompt, expanded level by level as ``otspec.tree`` builds it."""

    def __init__(self, params: Eagle2Params, label: str):
        self.params, self.label = params, label
        self.scores: list = []
        self.parent: list = []
        self.toks: list = []
        self.paths: list = []
        self.laws: dict = {}
        self.frontier: list = []
        self.level = 0

    def need(self, level: int) -> list:
        return list(self.frontier) if 1 <= level < self.params.depth else []

    def token(self, pid) -> int:
        return int(self.toks[pid])

    def ranks(self, v) -> int:
        """How many ranked tokens the node ``v`` (a frontier proposal) reads: ``top_k``."""
        return self.params.top_k

    def _propose(self, par: int, base: float, path: tuple, p) -> None:
        k = self.params.top_k
        ranked = isinstance(p, RankedLaw)  # ranked on the laws' device
        top = p.top(k) if ranked else _ranked(p, k)
        at = p.vals[:k] if ranked else p[top]
        if not (top.shape[0] == k and at[-1] > 0):  # the k-th most likely token has mass: enough tokens
            have = p.positive() if ranked else int(np.count_nonzero(p > 0))
            raise ValueError(f"tree family {self.label!r} needs top_k = {k} tokens of positive draft probability at "
                             f"the node {path}, got {have}")
        self.laws[path] = p
        if ranked and p.logs is not None:  # the device's logarithms: its frontier was chosen by these scores
            logp = p.logs[:k].tolist()
        else:
            with np.errstate(divide="ignore"):
                logp = np.log(at).tolist()
        for t, lp in zip(top.tolist(), logp):
            self.scores.append(base + lp)
            self.parent.append(par)
            self.toks.append(int(t))
            self.paths.append(path + (int(t),))

    def expand(self, v, p: np.ndarray, raw: np.ndarray | None = None) -> None:
        p = p if raw is None else raw  # EAGLE-2 ranks and scores by the draft's own law
        if v == 0 and not self.scores:  # the root
            self._propose(-1, 0.0, (), p)
            self.frontier = list(range(self.params.top_k))
            self._pending: dict = {}
            return
        self._pending[v] = p
        if len(self._pending) == len(self.frontier):  # the whole level: expand in frontier order
            start = len(self.scores)
            for f in self.frontier:
                self._propose(f, self.scores[f], self.paths[f], self._pending[f])
            self._pending = {}
            level = range(start, len(self.scores))
            self.frontier = sorted(level, key=lambda j: (-self.scores[j], j))[: self.params.top_k]

    def tree(self) -> DraftTree:
        """The tree of the ``n`` best proposals made (EAGLE-2's reranking, as :func:`otspec.tree._process._eagle2_tree`
        selects), from the expansion's own record, on either route (the laws ranked on their device or on the
        host): the expansion is that function's, level by level, so the tree is (tested against
        :func:`otspec.tree.value`) without ranking every law a second time."""
        sc = self.scores
        kept = sorted(sorted(range(len(sc)), key=lambda j: (-sc[j], j))[: self.params.n])
        node_of = {j: i + 1 for i, j in enumerate(kept)}
        parents = [-1] + [node_of[self.parent[j]] if self.parent[j] >= 0 else 0 for j in kept]
        return DraftTree(None, parents, [-1] + [self.toks[j] for j in kept])


@dataclass
class _Scored:
    """A drawn tree of one prompt with the draft's laws at its internal nodes and the target's at the same."""

    tree: DraftTree
    inner: np.ndarray          # internal node ids (root first)
    p: dict                    # node -> draft law (internal nodes)
    q: np.ndarray | None = None  # (len(inner), V) target laws at the internal nodes
    raw: dict | None = None      # node -> the draft's own law (temperature 1, untruncated), when ranked by it
    reach: dict | None = None    # verifier name -> (n + 1,) reach probabilities computed on the laws' device


def _jobs(plan: TreePlan, rng, V: int) -> list:
    jobs = []
    if plan.universe is not None:
        jobs.append(("universe", _ShapeJob(plan.universe, "topk", None, "topk universe")))
    for f in plan.families:
        if f.process == "eagle2":
            jobs.append((f.label, _Eagle2Job(f.shape, f.label)))
        elif f.process in ("iid", "wor"):
            jobs.append((f.label, _ShapeJob(f.shape, f.process, rng, f.label)))
    return jobs


def _np(t) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else t.detach().to("cpu").numpy()


def ranks_by_raw_law(plan: TreePlan | None, sampling) -> bool:
    """Whether a run needs the draft's own law (temperature 1, untruncated) beside the processed one: EAGLE-2
    families, or a top-k universe (its recorded draft probabilities rebuild EAGLE-2's trees), with a sampling
    that changes the law (:attr:`otspec.decoding.Sampling.changes_law`)."""
    if plan is None or not (plan.eagle2 or plan.universe is not None):
        return False
    return bool(sampling.changes_law)


def _root_expansions(jobs: list, held, p_root, own, *, defer: bool = False):
    r"""Expand the roots of every tree not ``held`` (a :class:`otspec.profile._trees_device.SampledTrees`, or None)
    from the draft's laws after the ``B`` contexts, ``(B, V)`` tensors where the models computed them.

    As :func:`_draft_on_device` at the deeper nodes, but every tree of a prompt shares its root's law: each prompt's
    law is ranked once (:func:`ranked_rows`, to the most ranks any of its trees reads; EAGLE-2's by the draft's own
    law ``own`` when given, the other trees' by the processed law, with the own law at their ranked tokens), no index
    is sent to the device, and the ``(B, K)`` ranks and values reach the host in one read. The trees' expansions are
    the host route's (:func:`otspec.tree._process._ranked`'s order; tested).

    With ``defer`` (every tree not held ranks its root's children), nothing is read here: a :class:`_RootRead` is
    returned, whose tokens feed the first depth's draft call from the device and whose ranks and values are read
    with every depth's (:func:`_expand_read`), then expanded before the first depth's nodes; otherwise None."""
    import torch

    B, V = (int(n) for n in p_root.shape)
    mine = [(b, j, job) for b in range(B) for j, (_, job) in enumerate(jobs[b]) if held is None or not held.holds(b, j)]
    if not mine:
        return
    if own is not None:
        own = _moved(own if torch.is_tensor(own) else torch.from_numpy(np.asarray(own)), p_root.device)
    by_own = [own is not None and isinstance(job, _Eagle2Job) for _, _, job in mine]
    K = [job.ranks(0) for _, _, job in mine]
    k_law = min(max([k for k, o in zip(K, by_own) if not o], default=0), V)  # a job asking more: refused there
    k_own = min(max([k for k, o in zip(K, by_own) if o], default=0), V)
    parts = []
    if k_law:
        ids_d, vals_d = ranked_rows(p_root, k_law)
        parts += [ids_d, vals_d] + ([own.gather(1, ids_d)] if own is not None else [])
    if k_own:
        ids_o_d, vals_o_d = ranked_rows(own, k_own)
        parts += [ids_o_d, vals_o_d]
    # EAGLE-2's root scores: the logarithms of its ranking's values, taken where they are (the device's frontier
    # adds to these, and so do its expansions on the host)
    eagle = any(isinstance(job, _Eagle2Job) for _, _, job in mine)
    k_e = (k_own if own is not None else k_law) if eagle else 0
    elogs = torch.log(vals_o_d if own is not None else vals_d) if eagle else None
    parts += [elogs] if eagle else []
    pieces = [(t if t.dtype == torch.float64 else t.double()).reshape(-1) for t in parts]

    def apply(host) -> None:
        at = 0

        def take(k, dtype):
            nonlocal at
            out = host[at:at + B * k].reshape(B, k).astype(dtype)
            at += B * k
            return out

        if k_law:
            ids, vals = take(k_law, np.int64), take(k_law, np.float64)
            at_own = take(k_law, np.float64) if own is not None else None
        if k_own:
            ids_o, vals_o = take(k_own, np.int64), take(k_own, np.float64)
        logs = take(k_e, np.float64) if k_e else None
        dense = None
        for (b, _, job), k, o in zip(mine, K, by_own):
            if o:
                law = RankedLaw(ids_o[b], vals_o[b], logs[b])
                job.expand(0, law, law)
            elif k:
                lg = logs[b] if isinstance(job, _Eagle2Job) else None
                job.expand(0, RankedLaw(ids[b], vals[b], lg), RankedLaw(ids[b], at_own[b]) if own is not None else None)
            else:  # a tree that draws its root's children (not held on the device): the whole law, on the host
                dense = to_host(p_root) if dense is None else dense
                job.expand(0, dense[b], to_host(own)[b] if own is not None else None)

    if defer and pieces and all(K):
        for _, _, job in mine:
            if isinstance(job, _Eagle2Job):  # the root's frontier: its top_k proposals, whatever their tokens
                job.frontier = list(range(job.params.top_k))
        # a node of the first depth: its token is the rank r of its prompt's ranking (law or own) at the root
        ids = [t for t in ((ids_d if k_law else None), (ids_o_d if k_own else None)) if t is not None]
        where = {(b, j): (B * k_law if o and k_law else 0, k_own if o else k_law) for b, j, _ in mine
                 for o in [own is not None and isinstance(jobs[b][j][1], _Eagle2Job)]}
        return _RootRead(pieces, apply, ids[0] if len(ids) == 1 else torch.cat([t.reshape(-1) for t in ids]), where,
                         elogs)
    apply(torch.cat(pieces).cpu().numpy() if pieces else None)
    return None


class _RootRead:
    """The roots' ranks and values left unread on the device (:func:`_root_expansions` with ``defer``): ``pieces``
    the 1-D float64 tensors to read in turn (the law's ranking's ``(B, k_law)`` ids, values and own-law values, then
    the own law's ranking's ``(B, k_own)`` ids and values), ``apply(host)`` the roots' expansions from their host
    copy, ``ids`` the rankings' ids (one ranking's ``(B, k)``, or both flattened, the law's first), ``where[(b, j)]``
    the offset in ``ids`` (flattened) of the ranking of tree ``j`` of prompt ``b``, and its row length; ``elogs``
    the ``(B, k)`` logarithms of the values of EAGLE-2's ranking (None without EAGLE-2): its first frontier's
    scores."""

    def __init__(self, pieces: list, apply, ids, where: dict, elogs=None):
        self.pieces, self.apply, self.ids, self.where, self.elogs = pieces, apply, ids, where, elogs
        self.size = sum(int(t.shape[0]) for t in pieces)

    def index(self, b: int, j: int, job, v) -> int:
        """The flat index of the token of first-depth node ``v`` of tree ``j`` of prompt ``b``."""
        start, k = self.where[(b, j)]
        r = int(job.shape.ranks[v]) if isinstance(job, _ShapeJob) else int(v)  # EAGLE-2: proposal v is rank v
        return start + b * k + r


def draw_and_score(draft, ds, target, ts, last, n_ctx: int, p_root: np.ndarray, q_root: np.ndarray,
                   plan: TreePlan, sampling, rngs, r_root: np.ndarray | None = None, *,
                   on_device: bool = False) -> list[dict]:
    r"""Draw every tree of ``plan`` after the contexts of a batch and score it: one draft call per depth, one target
    call per tree.

    .. math::

        p_v = p(\cdot \mid c_b, x_{1:d(v)}),\quad q_v = q(\cdot \mid c_b, x_{1:d(v)})
        \quad\text{at every internal node } v \text{ of every tree of every prompt } b.

    Parameters
    ----------
    draft, target : LanguageModel
    ds, ts : states
        Holding the ``B`` contexts (``n_ctx`` columns each, left-padded rows allowed); left holding them.
    last : (B,) int array
        The contexts' last tokens (the roots).
    p_root, q_root : (B, V) arrays
        The draft's and the target's laws after each context (already computed by the ``(k, L)`` part); ``p_root``
        (and ``r_root``) may be a tensor on the models' device, where the roots are then expanded with
        ``on_device`` (ranked there, as the deeper nodes; only ``(B, K)`` ranks and values reach the host).
    plan : TreePlan
    sampling : Sampling
        Applied to every law, as for the ``(k, L)`` families.
    rngs : list of numpy.random.Generator
        One per prompt (:func:`tree_rng`), for the sampled trees.
    r_root : (B, V) array, optional
        The draft's own law after each context (softmax of its logits, temperature 1, untruncated), by which
        EAGLE-2 ranks and scores its candidates, as EAGLE's and SGLang's drafters do (and
        :func:`otspec.decoding.speculative_decode`); needed when :func:`ranks_by_raw_law`.
    on_device : bool, keyword-only
        Keep the laws of the nodes where the models computed them (a torch tensor, on their device): the
        deterministic trees drafted there with no host read until the last depth (:func:`_draft_on_device`: one
        batched :func:`ranked_rows` per depth, EAGLE-2's frontier chosen and the draft's rows selected on the
        device), every depth's ``(n, K)`` ranks and values (and the roots') read once before the target calls, their
        target probabilities gathered by one gather per tree family; the sampled trees drawn,
        scored and verified there (:class:`otspec.profile._trees_device.SampledTrees`: one batch of draws per
        depth, one forest per verifier rule, one host read of their tokens and reach probabilities), from a
        ``torch.Generator`` per prompt seeded by its generator of ``rngs``. The deterministic trees and their values
        equal the host route's; the sampled trees follow the same law, and the values of a given sampled tree equal
        the host's verifiers' (``False``: every law moved to the host, ranked, drawn and verified there, each deterministic tree
        checked against :mod:`otspec.tree`'s own construction).

    Returns
    -------
    list of dict
        Per prompt: ``label -> _Scored``.
    """
    drafted = draft_trees(draft, ds, n_ctx, p_root, plan, sampling, rngs, r_root, on_device=on_device,
                          device=getattr(target, "device", "cpu"))
    return score_trees(drafted, target, ts, last, n_ctx, q_root, plan, sampling)


class DraftedTrees:
    """The trees of one position drafted by :func:`draft_trees`, not yet expanded on the host nor scored: on the
    device route, ``pieces`` (1-D float64 tensors on the laws' device: every depth's ranks and values, and the
    roots') are what the host must read to expand them (:meth:`expand`), in one read of its own or as parts of a
    larger read (:meth:`parts`)."""

    def __init__(self, jobs: list, held, root, depths: list, B: int, V: int, on_device: bool):
        self.jobs, self.held, self.root, self.depths = jobs, held, root, depths
        self.B, self.V, self.on_device = B, V, on_device
        self.host = None
        self._expanded = False

    @property
    def pieces(self) -> list:
        return (self.root.pieces if self.root is not None else []) + [t for d in self.depths for t in d.piece]

    def parts(self) -> list:
        """The pieces as one part of :func:`otspec.profile._quantities.read_parts` (an ``(array, store)`` pair; none
        without pieces): their host copy kept for :meth:`expand`."""
        import torch

        pieces = self.pieces
        if not pieces:
            return []
        return [(torch.cat(pieces) if len(pieces) > 1 else pieces[0], lambda vals: setattr(self, "host", vals))]

    def expand(self, sampling) -> None:
        """Expand the trees on the host from the pieces' host copy (read here when :meth:`parts` was not read with
        another read), once: a depth's bad draft law raises the checked route's error (:func:`_expand_read`)."""
        if not self._expanded:
            self._expanded = True
            _expand_read(self.depths, self.jobs, self.root, sampling, self.host)


def draft_trees(draft, ds, n_ctx: int, p_root, plan: TreePlan, sampling, rngs, r_root=None, *,
                on_device: bool = False, device=None) -> DraftedTrees:
    """The drafting half of :func:`draw_and_score` (same parameters; ``device`` the target's, where the sampled
    trees are drawn and scored on the device route, default the draft's): every tree of ``plan`` drafted after the
    contexts the draft's state holds, the state left holding them; on the device route nothing is read (the trees
    are expanded on the host from :attr:`DraftedTrees.pieces` by :meth:`DraftedTrees.expand`, which
    :func:`score_trees` calls), so the caller may read the pieces with its own values (one read fewer)."""
    import torch

    B, V = (int(n) for n in p_root.shape)
    raw = ranks_by_raw_law(plan, sampling)
    if raw and r_root is None:
        raise ValueError("`r_root` (the draft's own law at the roots) is needed: EAGLE-2 ranks by it")
    jobs = [_jobs(plan, rngs[b], V) for b in range(B)]
    held = None  # the sampled trees, drawn, scored and verified on the laws' device
    if on_device and plan.sampled:
        dev = torch.device(getattr(draft, "device", "cpu") if device is None else device)
        held = _trees_device.SampledTrees(jobs, dev, _trees_device.device_generator(rngs, dev))
    root = None  # the roots' ranks, when read with the first depth's
    if on_device and torch.is_tensor(p_root):  # the roots expanded where their laws are, as the deeper nodes
        root = _root_expansions(jobs, held, p_root, r_root if raw else None, defer=True)
    else:
        p_root, r_root = to_host(p_root), (to_host(r_root) if r_root is not None else None)
        for b in range(B):
            for j, (_, job) in enumerate(jobs[b]):
                if held is None or not held.holds(b, j):
                    job.expand(0, p_root[b], r_root[b] if raw else None)
    if held is not None:
        held.draw_roots(p_root)
    depths: list = []
    if on_device:  # every depth drafted where the laws are, read once at the end (roots included)
        per = _draft_on_device(draft, ds, n_ctx, jobs, held, root, sampling, raw, B, depths)
    else:
        per = _draft_on_host(draft, ds, n_ctx, jobs, sampling, raw, B)
    if per:
        draft.select(ds, [b * per for b in range(B)], n_ctx)
    return DraftedTrees(jobs, held, root, depths, B, V, on_device)


class ScoredTrees:
    """The trees of one position scored and verified on the device by :func:`score_trees` (``defer=True``), their
    values not yet read: :attr:`parts` (``(array, store)`` pairs of :func:`otspec.profile._quantities.read_parts`)
    to read, alone or with other values of the walk (one host read), after which :attr:`out` holds the result of
    :func:`score_trees` (the stores raise the checked route's error for a law from bad logits)."""

    def __init__(self, out: list, parts: list):
        self.out, self.parts = out, parts


def score_sampled(drafted: DraftedTrees, target, ts, last, n_ctx: int, q_root, plan: TreePlan, sampling):
    """The sampled trees (``"iid"``, ``"wor"``) of ``drafted`` scored and verified on the device route before the
    host has read anything of the position: they were drawn on the device (:class:`otspec.profile._trees_device.
    SampledTrees`), so their tree-attention call takes its tokens from the device and nothing of
    :meth:`DraftedTrees.expand` is needed. ``q_root``: the contexts' target laws, a tensor where they are (read only
    by the stars' verification). A :class:`ScoredTrees` of those families only (its parts: one ``(values, store)``,
    none without sampled trees), for the caller to read with the position's other values and to hand to
    :func:`score_trees` (``sampled``), which scores the rest after the read; the same values as
    :func:`score_trees` alone (the same calls on the same tokens and laws, the deterministic trees' gathered
    probabilities read in a part of their own instead of at the end of this one)."""
    held, B = drafted.held, drafted.B
    out = [dict() for _ in range(B)]
    parts = []
    if held is not None:
        values, done = held.finish_parts(plan, padded_tree_logits, target, ts, last, n_ctx, q_root, sampling)
        jobs = drafted.jobs

        parts.append((values, lambda host: _store_sampled(done(host), jobs, out)))
    return ScoredTrees(out, parts)


def _store_sampled(done: dict, jobs: list, out: list) -> None:
    """The sampled trees' values (``done``: ``{(b, j): (tree, inner, p, q, reach)}``, the held trees' values read)
    stored in ``out`` as each prompt's :class:`_Scored` under its family's label."""
    for (b, j), (tree, inner, p, q, reach) in done.items():
        out[b][jobs[b][j][0]] = _Scored(tree, inner, p, q, reach=reach)


def score_trees(drafted: DraftedTrees, target, ts, last, n_ctx: int, q_root: np.ndarray, plan: TreePlan,
                sampling, *, defer: bool = False, sampled: ScoredTrees | None = None):
    """The scoring half of :func:`draw_and_score`: the trees ``drafted`` expanded on the host
    (:meth:`DraftedTrees.expand`), scored by the target after the contexts its state holds and verified; the same
    parameters and result. With ``defer``, a :class:`ScoredTrees` whose values are read by the caller (on the device
    route the target calls are made here; the values' one read is the caller's). ``sampled``: the sampled trees
    scored already (:func:`score_sampled`, its values read or to be read by the caller): only the other trees are
    scored here, into the same result, and only their values are in the parts."""
    drafted.expand(sampling)
    jobs, held, B, on_device = drafted.jobs, drafted.held, drafted.B, drafted.on_device
    out = [dict() for _ in range(B)] if sampled is None else sampled.out
    gathered = []  # the deterministic families' gathered target probabilities: read together after their calls
    for j in range(len(jobs[0])):
        if held is not None and held.holds(0, j):
            continue
        scored = []
        for b in range(B):
            job = jobs[b][j][1]
            tree = job.tree()
            inner = _internal(tree.parents)
            p = job.p if isinstance(job, _ShapeJob) else _eagle2_inner_laws(job, tree, inner)
            scored.append(_Scored(tree, inner, p, raw=(job.raw or None) if isinstance(job, _ShapeJob) else None))
        deterministic = on_device and (jobs[0][j][0] == "universe" or isinstance(jobs[0][j][1], _Eagle2Job))
        got = _score(target, ts, last, n_ctx, scored, q_root, sampling, gather=deterministic)
        if got is not None:
            gathered.append(got)
        for b in range(B):
            out[b][jobs[b][j][0]] = scored[b]
    parts = []
    if held is not None and sampled is None:  # the gathered probabilities read with the sampled trees' values
        values, done = held.finish_parts(plan, padded_tree_logits, target, ts, last, n_ctx, q_root, sampling,
                                         also=_children_values(gathered))

        def store(host) -> None:
            _store_sampled(done(host), jobs, out)
            _read_children(gathered, sampling, held.also_host)

        parts.append((values, store))
    elif gathered:
        parts.append((_children_values(gathered), lambda host: _read_children(gathered, sampling, host)))
    later = ScoredTrees(out, parts)
    if defer:
        return later
    read_parts(parts)
    return out


def _draft_on_host(draft, ds, n_ctx: int, jobs: list, sampling, raw: bool, B: int) -> int:
    """The host route's drafting of every tree below the roots (expanded): one draft call per depth, each law moved
    to the host and expanded there. Returns the rows of the last call per prompt (0: no call)."""
    import torch

    level, row_of = 1, None
    while True:
        need = [(b, j, v) for b in range(B) for j, (_, job) in enumerate(jobs[b]) for v in job.need(level)]
        if not need:
            break
        if level == 1:
            src = [b for b, _, _ in need]
        else:
            src = [row_of[(b, j, _parent_of(jobs[b][j][1], v))] for b, j, v in need]
        draft.select(ds, src, n_ctx + level - 1)
        ids = torch.as_tensor([[jobs[b][j][1].token(v)] for b, j, v in need], dtype=torch.long).to(draft.device)
        logits = draft.logits(ds, ids)[:, -1:]
        laws = _np(sampling.probs(logits))[:, 0]
        own = _np(sampling.own_law(logits))[:, 0] if raw else [None] * len(need)
        row_of = {key: i for i, key in enumerate(need)}
        for (b, j, v), p, r in zip(need, laws, own):
            jobs[b][j][1].expand(v, p, r)
        level += 1
    return len(row_of) // B if row_of else 0


def _slots(job, level: int) -> list:
    """The nodes of ``job`` fed to the draft call of depth ``level`` on the device route: a static shape's nodes of
    that depth with children; EAGLE-2's frontier slots ``0..top_k - 1`` (slot ``f`` is the frontier's ``f``-th
    proposal, which only the device knows below the first depth)."""
    if isinstance(job, _Eagle2Job):
        return list(range(job.params.top_k)) if 1 <= level < job.params.depth else []
    return job.need(level)


class _Depth:
    """One draft call of the device route: ``need`` its rows ``(b, j, node or EAGLE-2 slot)``, ``pos`` the row of
    each, ``ranked`` the rows ranked (the deterministic trees'), ``rank`` the ranked row of each, ``K`` the ranks
    read, ``ids`` the ``(len(ranked), K)`` ranked ids on the device, ``front`` EAGLE-2's next frontiers
    (``(trees, flat, src, scores)`` per group of equal ``top_k``: the flat indices in ``ids`` of their tokens and
    the rows of their parents, ``(T, k)`` each, on the device), ``piece`` what the position's read takes of it,
    ``logits`` the call's logits (for the checked route's error)."""

    __slots__ = ("need", "pos", "ranked", "rank", "K", "ids", "front", "piece", "logits", "own", "logs")

    def __init__(self, need: list):
        self.need, self.pos = need, {key: i for i, key in enumerate(need)}
        self.ranked, self.rank, self.K, self.ids, self.front = [], {}, 0, None, []


def _draft_on_device(draft, ds, n_ctx: int, jobs: list, held, root, sampling, raw: bool, B: int,
                     depths: list) -> int:
    r"""The device route's drafting of every tree below the roots: one draft call per depth, no host read until the
    last, then one read of every depth's ranks and values (with the roots', when ``root`` defers them) and the trees
    expanded on the host from it, depth by depth as the host route expands them.

    At each depth the laws are formed unchecked (a bad row flagged in the read, the checked route's error raised
    then, before the depth's expansions), the deterministic trees' rows ranked by one batched :func:`ranked_rows`
    (EAGLE-2's by the draft's own law when ``raw``), the static top-k trees' next tokens taken from their parents'
    rankings, EAGLE-2's next frontier chosen on the device (:func:`otspec.profile._trees_device.eagle2_frontier_t`:
    the host's tie rule, on the scores the host then adds from the same logarithms), the frontier's tokens taken
    from its parents' rankings and the draft's cache rows selected by a device index
    (:func:`otspec.profile._trees_device.select_rows`); the sampled trees drawn by ``held``. Returns the rows of the
    last call per prompt (0: no call)."""
    import torch

    level, prev = 1, None
    while True:
        need = [(b, j, v) for b in range(B) for j, (_, job) in enumerate(jobs[b]) for v in _slots(job, level)]
        if not need:
            break
        d = _Depth(need)
        mine = [held is None or not held.holds(b, j) for b, j, _ in need]
        dyn = None
        if level == 1:
            draft.select(ds, [b for b, _, _ in need], n_ctx)
            if root is not None:  # the roots' rankings, on the device
                at, of = [root.index(b, j, jobs[b][j][1], v) if m else 0 for (b, j, v), m in zip(need, mine)], root.ids
            else:  # the roots expanded on the host: their tokens
                at, of = [jobs[b][j][1].token(v) if m else 0 for (b, j, v), m in zip(need, mine)], None
        else:
            src, at = [], []
            for (b, j, v), m in zip(need, mine):
                job = jobs[b][j][1]
                if isinstance(job, _Eagle2Job):  # the frontier's parents and tokens: on the device (dyn)
                    src.append(0)
                    at.append(0)
                    continue
                par = (b, j, int(job.shape.parents[v]))
                src.append(prev.pos[par])
                at.append(prev.rank[par] * prev.K + int(job.shape.ranks[v]) if m else 0)
            of = prev.ids
            if prev.front:
                dyn = _frontier_rows(prev, d)
                pack = _Pack()
                k_src, k_at = pack.add(src), [pack.add(pos) for pos, _, _ in dyn]
                sent = pack.send(torch, of, static=True)
                index = sent[k_src]
                for k, (_, _, rows) in zip(k_at, dyn):
                    index = index.index_put((sent[k],), rows)
                _trees_device.select_rows(draft, ds, index, n_ctx + level - 1)
                dyn = [(pos, flat) for pos, flat, _ in dyn]
            else:
                draft.select(ds, src, n_ctx + level - 1)
        if held is None:
            ids = _trees_device.feed_tokens(at, draft.device, of=of, dyn=dyn)
        else:
            ids = held.feed(need, at, draft.device, of=of, dyn=dyn)
        logits = draft.logits(ds, ids)[:, -1]
        laws = sampling.probs(logits, check=False)  # a bad row: flagged in the read
        d.ranked = [i for i, m in enumerate(mine) if m]
        if d.ranked:
            _rank_depth(d, jobs, laws, sampling.own_law(logits) if raw else None, level, root, prev)
            d.logits = logits
            depths.append(d)
        if held is not None:  # a depth of sampled trees alone: its laws checked in their own read
            held.draw(need, laws, None if d.ranked else logits)
        prev, level = d, level + 1
    return len(prev.need) // B if prev is not None else 0


def _rank_depth(d: _Depth, jobs: list, laws, own, level: int, root, prev) -> None:
    """Rank the rows of depth ``d`` (one :func:`ranked_rows` of every row, the sampled trees' too: no index to
    send, and a bad row of any of them NaN in its values; EAGLE-2's rows by ``own`` when given), keep what the read
    takes of them, and choose EAGLE-2's next frontiers on the device."""
    import torch

    d.rank = {d.need[i]: i for i in d.ranked}
    jobs_of = [jobs[b][j][1] for b, j, _ in d.need]
    eagle = [isinstance(job, _Eagle2Job) for job in jobs_of]
    K = max(jobs_of[i].ranks(d.need[i][2]) for i in d.ranked)
    src = laws
    d.own = own is not None and not all(eagle)
    if own is not None:
        if all(eagle):
            src = own
        elif any(eagle):
            pack = _Pack()
            at_eagle = pack.add(eagle)
            src = torch.where(pack.send(torch, laws, static=True)[at_eagle][:, None] > 0, own, laws)
    ids, vals = ranked_rows(src, min(K, int(src.shape[-1])))  # a job asking more: refused at its expansion
    d.K, d.ids = int(ids.shape[1]), ids
    parts = [ids, vals] + ([own.gather(1, ids)] if d.own else [])
    d.logs = any(eagle)
    logs = torch.log(vals) if d.logs else None
    if logs is not None:
        parts.append(logs)
    # the ranks exact in float64 (V < 2**53); a law from bad logits is NaN in its values (and in its first entry,
    # read apart when the own law ranks some rows)
    d.piece = [torch.cat(parts, 1).reshape(-1)] + ([laws[:, 0]] if own is not None else [])
    d.front = _frontiers(d, jobs, logs, level, root, prev) if logs is not None else []


def _frontiers(d: _Depth, jobs: list, logs, level: int, root, prev) -> list:
    """EAGLE-2's next frontier of every EAGLE-2 tree of depth ``d`` with a next depth, one batch per ``top_k``:
    ``(trees, flat, src, scores)`` (:class:`_Depth`). The flat index of each proposal's token in ``d.ids`` and the
    row of its parent in the call come from two tables of the ``k^2`` proposals, the same at every position."""
    import torch

    groups: dict = {}
    for b, j, v in d.need:
        job = jobs[b][j][1]
        if v == 0 and isinstance(job, _Eagle2Job) and level + 1 < job.params.depth:
            groups.setdefault(job.params.top_k, []).append((b, j))
    out = []
    for k, trees in groups.items():
        T, K = len(trees), d.K
        pack = _Pack()
        r0 = np.array([d.rank[(b, j, 0)] for b, j in trees])
        f, r = np.divmod(np.arange(k * k), k)  # proposal f k + r: the r-th child of the frontier's f-th node
        flat = (r0[:, None] + f) * K + r  # its flat index in the depth's (n, K) ranking
        k_logs = k_flat = pack.add(flat)
        k_src = pack.add(np.array([d.pos[(b, j, 0)] for b, j in trees])[:, None] + f)
        k_b = pack.add([b for b, _ in trees])
        sent = pack.send(torch, logs, static=True)
        lg = logs.take(sent[k_logs])
        if level == 1:
            if root is not None:  # the root's scores: the logarithms of its ranking, on the device
                base = root.elogs
                if T != base.shape[0] or [b for b, _ in trees] != list(range(T)):
                    base = base.index_select(0, sent[k_b])
                base = base if base.shape[1] == k else base[:, :k]
            else:  # the roots expanded on the host: their scores
                base = torch.as_tensor([jobs[b][j][1].scores[:k] for b, j in trees], dtype=torch.float64,
                                       device=logs.device)
        else:  # the scores of the frontier chosen at the depth before
            was, _, _, base = next(g for g in prev.front if g[3].shape[1] == k)
            if was != trees:  # some trees ended there
                base = base.index_select(0, torch.as_tensor([was.index(t) for t in trees], device=base.device))
        chosen, scores = _trees_device.eagle2_frontier_t(base, lg)
        out.append((trees, sent[k_flat].gather(1, chosen), sent[k_src].gather(1, chosen), scores))
    return out


def _frontier_rows(prev: _Depth, d: _Depth) -> list:
    """The EAGLE-2 rows of depth ``d``, fed from the frontiers chosen at ``prev``, per group of equal ``top_k``:
    ``(positions in d.need, flat indices of their tokens in prev.ids, their parents' rows in prev's call)``, each
    ``(T, k)``, the last two on the device."""
    return [(np.array([[d.pos[(b, j, i)] for i in range(int(sc.shape[1]))] for b, j in trees]), f, s_)
            for trees, f, s_, sc in prev.front]


def _expand_read(depths: list, jobs: list, root, sampling, host=None) -> None:
    """Read every depth's ranks and values (and the roots', ``root``) in one read (or take their host copy ``host``,
    read with other values) and expand the trees from it, depth by depth as the host route does: a depth's bad draft
    law refused first (the checked route's error), then the roots (before the first depth), then the depth's nodes
    (EAGLE-2's slot ``f`` the ``f``-th proposal of its frontier, which these expansions compute on the host as the
    device chose it)."""
    import torch

    pieces = (root.pieces if root is not None else []) + [t for d in depths for t in d.piece]
    if not pieces:
        return
    host = torch.cat(pieces).cpu().numpy() if host is None else host
    at = root.size if root is not None else 0
    for d in depths:
        n, K = len(d.need), d.K
        w = K * (2 + d.own + d.logs)
        blk = host[at:at + n * w].reshape(n, w)
        at += n * w
        bad = np.isnan(blk[:, K:2 * K]).any()
        if len(d.piece) > 1:  # the laws' first entries (the own law ranked some rows)
            bad = bad or np.isnan(host[at:at + n]).any()
            at += n
        if bad:  # a law from bad logits: the checked route's error
            sampling.probs(d.logits)
        if root is not None:  # the roots, before the first depth's nodes
            root.apply(host[:root.size])
            root = None
        ids, vals = blk[:, :K].astype(np.int64), blk[:, K:2 * K]
        for r in d.ranked:
            b, j, v = d.need[r]
            job = jobs[b][j][1]
            if isinstance(job, _Eagle2Job):
                law = RankedLaw(ids[r], vals[r], blk[r, w - K:] if d.logs else None)
                job.expand(job.frontier[v], law, law)
            else:
                job.expand(v, RankedLaw(ids[r], vals[r]), RankedLaw(ids[r], blk[r, 2 * K:3 * K]) if d.own else None)
    if root is not None:  # no depth (stars)
        root.apply(host[:root.size])


def _parent_of(job, v):
    if isinstance(job, _ShapeJob):
        return int(job.shape.parents[v])
    return 0 if job.parent[v] < 0 else job.parent[v]


def _eagle2_inner_laws(job: _Eagle2Job, tree: DraftTree, inner: np.ndarray) -> dict:
    paths = tree.paths()
    return {int(v): job.laws[paths[v]] for v in inner.tolist()}


def padded_tree_logits(lm, state, parents: np.ndarray, tokens: np.ndarray, last, n_ctx: int):
    """One tree-attention call of ``lm`` on ``B`` trees padded to ``m`` nodes (``parents``, ``tokens``: ``(B, m)``,
    padding ``-1``), after the batch's contexts (``n_ctx`` positions, the last token of each in ``last`` pending):
    the state is cut back to the contexts first, and the padding's logits are zeroed (finite, never read).

    Returns
    -------
    torch.Tensor
        ``(B, m, V)`` logits.
    """
    import torch

    m = parents.shape[1]
    lm.select(state, list(range(parents.shape[0])), n_ctx - 1)
    logits = lm.tree_logits(state, parents, tokens, pending=np.asarray(last, dtype=np.int64)[:, None],
                            fallback="rows")
    pad = (parents == -1) & (np.arange(m) > 0)[None]
    if pad.any():  # decided on the host: no read of the device
        logits = logits.masked_fill(torch.from_numpy(pad).to(logits.device)[:, :, None], 0.0)
    return logits


def _score(target, ts, last, n_ctx: int, scored: list, q_root: np.ndarray, sampling, *, gather: bool = False) -> None:
    """One target call scoring the internal nodes of ``B`` trees (padded to the largest); the state keeps the contexts.

    Each tree's ``q`` is its ``(len(inner), V)`` target laws on the host, or (``gather``: deterministic trees, whose
    values read only the target's probability of each node's token at its parent) one mapping ``token -> q`` per
    internal node, gathered where the laws are: then the gather is returned unread (:func:`_gathered_children`),
    for :func:`_read_children` to read with the other families' in one read."""

    B = len(scored)
    m = max(len(s.inner) for s in scored)
    if m == 1:  # stars: the root's law is all a verifier needs
        for b, s in enumerate(scored):
            s.q = q_root[b][None].copy()
        return
    parents = np.full((B, m), -1, dtype=np.int64)
    tokens = np.full((B, m), -1, dtype=np.int64)
    for b, s in enumerate(scored):
        pos = {int(v): i for i, v in enumerate(s.inner.tolist())}
        for i, v in enumerate(s.inner.tolist()[1:], start=1):
            parents[b, i] = pos[int(s.tree.parents[v])]
            tokens[b, i] = int(s.tree.tokens[v])
    logits = padded_tree_logits(target, ts, parents, tokens, last, n_ctx)
    if gather:
        return _gathered_children(scored, logits, sampling)
    q = _np(sampling.probs(logits))
    for b, s in enumerate(scored):
        s.q = q[b, : len(s.inner)]


def _gathered_children(scored: list, logits, sampling) -> tuple:
    """The target probabilities ``q[b, i, token]`` of the children tokens of every internal node ``i`` of every tree
    ``b``, gathered on the laws' device by one gather and left there, unread: ``(values, bad, logits, store)``, the
    flag ``bad`` whether a law came from bad logits (checked in the read), ``store(host values)`` setting each
    tree's ``s.q[i] = {token: q}`` (:func:`_read_children`)."""
    import torch

    q = sampling.probs(logits, check=False)  # a bad row is flagged in the read
    where, spans = [], []
    for b, s in enumerate(scored):
        pos = {int(v): i for i, v in enumerate(s.inner.tolist())}
        kids = [(pos[int(s.tree.parents[c])], int(s.tree.tokens[c])) for c in range(1, s.tree.n + 1)
                if int(s.tree.parents[c]) in pos]
        spans.append((pos, kids))
        where += [(b, i, t) for i, t in kids]
    _, I, V = q.shape  # the entries' flat indices, (b I + i) V + token: one take (torch.take reads q's logical order)
    flat = torch.as_tensor([(b * I + i) * V + t for b, i, t in where], dtype=torch.long, device=q.device)

    def store(vals) -> None:
        vals, at = vals.tolist(), 0
        for s, (pos, kids) in zip(scored, spans):
            s.q = [dict() for _ in pos]
            for i, t in kids:
                s.q[i][t] = vals[at]
                at += 1

    return torch.take(q, flat), bad_rows(q).any(), logits, store


def _children_values(gathered: list):
    """The gathers of :func:`_gathered_children` (every deterministic family of a position) and their bad-logits
    flags as one float64 device tensor (flags first; cat promotes them), None when there are none."""
    import torch

    if not gathered:
        return None
    return torch.cat([torch.stack([bad for _, bad, _, _ in gathered])] + [vals for vals, *_ in gathered])


def _read_children(gathered: list, sampling, host=None) -> None:
    """Read :func:`_children_values` in one host read (or take its host copy ``host``, read with other values),
    raise the checked route's error for a law from bad logits, store the values."""
    if not gathered:
        return
    host = _children_values(gathered).cpu().numpy() if host is None else host
    for (_, _, logits, _), flag in zip(gathered, host[: len(gathered)].tolist()):
        if flag:
            sampling.probs(logits)  # the checked route's error
    at = len(gathered)
    for vals, _, _, store in gathered:
        n = int(vals.shape[0])
        store(host[at:at + n])
        at += n


# --------------------------------------------------------------------------- exact values and rows
def _path_probs(tree: DraftTree, inner: np.ndarray, laws) -> np.ndarray:
    """Path probability of every node: the product of ``laws(parent)[token]`` down the tree (1 at the root)."""
    out = np.ones(tree.n + 1)
    for c in range(1, tree.n + 1):
        par = int(tree.parents[c])
        out[c] = out[par] * float(laws(par)[int(tree.tokens[c])])
    return out


class LawBuffers:
    """``(n + 1, V)`` draft and target laws for the sampled trees' verifiers, kept from one tree to the next.

    The internal nodes' rows are the tree's own laws, every other row uniform (a leaf's laws only draw its bonus
    token: no verifier's acceptance reads them, and an emission law's leaf rows then sum to the reach). One pair
    of arrays, as large as the largest tree seen, serves every family and position of a walk: a new tree writes
    its internal rows and resets to uniform the rows the previous tree wrote that are leaves now, instead of
    allocating and filling two ``(n + 1, V)`` arrays per tree. The verifiers read the arrays and never write them.
    """

    def __init__(self):
        self.P = self.Q = None
        self.dirty = np.zeros(0, dtype=bool)

    def laws(self, s: _Scored, V: int) -> tuple[np.ndarray, np.ndarray]:
        """Views ``(P, Q)`` of ``n + 1`` rows for the drawn tree ``s``, valid until the next call."""
        n1 = s.tree.n + 1
        if self.P is None or self.P.shape[0] < n1 or self.P.shape[1] != V:
            rows = max(n1, 0 if self.P is None or self.P.shape[1] != V else self.P.shape[0])
            self.P = np.full((rows, V), 1.0 / V)
            self.Q = np.full((rows, V), 1.0 / V)
            self.dirty = np.zeros(rows, dtype=bool)
        inner = s.inner
        stale = self.dirty.copy()
        stale[inner] = False
        idx = np.flatnonzero(stale)
        if idx.size:
            self.P[idx] = 1.0 / V
            self.Q[idx] = 1.0 / V
        for i, v in enumerate(inner.tolist()):
            self.P[v] = s.p[v]
            self.Q[v] = s.q[i]
        self.dirty[:] = False
        self.dirty[inner] = True
        return self.P[:n1], self.Q[:n1]


def reach_of(tree: DraftTree, emission: np.ndarray) -> np.ndarray:
    r"""Probability of reaching (accepting) every node, from a verifier's emission law: the mass of the accepted
    paths ending in the node's subtree, :math:`P(\text{reach } v) = \sum_{a \succeq v} \sum_y E[a, y]`."""
    reach = emission.sum(axis=1)
    for c in range(tree.n, 0, -1):
        reach[tree.parents[c]] += reach[c]
    return reach


def position_values(plan: TreePlan, scored: dict, V: int, buffers: LawBuffers | None = None) -> dict:
    r"""The exact values of one prompt's trees at one position.

    ``buffers`` (a :class:`LawBuffers` kept by the caller from one position to the next) holds the sampled
    trees' node laws; a fresh one by default. A sampled tree verified on the laws' device (its ``reach``) gives
    its reach probabilities as they are, and :math:`E[\tau \mid T]` as their sum; its laws are read only for
    the verifiers without a device rule.

    Returns
    -------
    dict
        ``"tree"``: ``name -> E[tau | T]``; ``"treeq"``: the universe's ``(U,)`` target path probabilities,
        ``"treep"``: the draft's probability of each node's token at its parent (node order of
        ``plan.universe``, root excluded); ``"treenode"``: ``name -> (n,)``
        reach probabilities of the sampled trees' nodes (shape node order, root excluded).
    """
    out: dict = {"tree": {}, "treenode": {}}
    buffers = LawBuffers() if buffers is None else buffers
    if plan.universe is not None:
        s = scored["universe"]
        pos = {int(v): i for i, v in enumerate(s.inner.tolist())}
        Qp = _path_probs(s.tree, s.inner, lambda v: s.q[pos[v]])
        T = s.tree
        own = s.raw or s.p  # EAGLE-2's trees are rebuilt from these: the draft's own law, by which it ranks
        steps = np.array([float(own[int(T.parents[c])][int(T.tokens[c])]) for c in range(1, T.n + 1)])
        out["treeq"], out["treep"] = Qp[1:], steps
        for f in plan.topk:
            idx = [plan.index[p] for p in f.shape.paths[1:]]
            out["tree"][f.label] = math.fsum(Qp[idx].tolist())
    for f in plan.families:
        if f.process == "topk":
            continue
        s = scored[f.label]
        if f.process == "eagle2":
            pos = {int(v): i for i, v in enumerate(s.inner.tolist())}
            Qp = _path_probs(s.tree, s.inner, lambda v, s=s, pos=pos: s.q[pos[v]])
            out["tree"][f.label] = math.fsum(Qp[1:].tolist())
            continue
        laws = None
        for v_name, name in zip(f.verifiers, f.names()):
            if s.reach is not None and name in s.reach:  # verified on the laws' device
                reach = s.reach[name]
                out["tree"][name] = float(reach[1:].sum())
                out["treenode"][name] = reach[1:]
                continue
            if laws is None:  # the host's verifiers: the node laws as (n + 1, V) arrays, once per tree
                laws = buffers.laws(s, V)
            P, Q = laws
            ver = make_tree_verifier(v_name)
            if hasattr(ver, "reach"):  # per-node rules: one pass, no (n + 1, V) emission law
                reach = ver.reach(s.tree, P, Q, validate=False)
                tau = float(reach[1:].sum())
            else:
                tau = ver.expected_accepted(s.tree, P, Q, validate=False)
                reach = reach_of(s.tree, ver.emission(s.tree, P, Q, validate=False))
                if not abs(math.fsum(reach[1:].tolist()) - tau) <= 1e-9 * max(1.0, tau):  # pragma: no cover
                    raise RuntimeError(f"{name}: the reach probabilities sum to {reach[1:].sum()!r}, not to "
                                       f"E[tau | T] = {tau!r}")
            out["tree"][name] = float(tau)
            out["treenode"][name] = reach[1:]
    return out


def record_position(rows, pos: int, plan: TreePlan, values: dict) -> None:
    """Append one position's tree rows to ``rows`` (a profile's row builder): ``kind="tree"`` with ``k`` the
    tree's draft nodes and ``j`` its depth; ``"treeq"``/``"treep"`` (name ``"topk"``, ``j`` the universe node);
    ``"treenode"`` (``j`` the shape node)."""
    for f in plan.families:
        for name in f.names():
            rows.add(pos, "tree", name, f.n, [values["tree"][name]], j0=f.depth)
            if name in values["treenode"]:
                rows.add(pos, "treenode", name, f.n, values["treenode"][name])
    if "treeq" in values:
        rows.add(pos, "treeq", "topk", 0, values["treeq"])
        rows.add(pos, "treep", "topk", 0, values["treep"])


# --------------------------------------------------------------------------- costs
def _grid(top: int) -> list[int]:
    out, x = [], 1
    while x <= top:
        out.append(x)
        x *= 2
    return sorted(set(out + [top])) if top >= 1 else []


def tree_cost_shapes(plan: TreePlan) -> dict:
    r"""The calls a tree decoder with these families makes, for the cost calibration.

    Returns
    -------
    dict
        ``"tree"``: ``[(n, parents)]``, one target call scoring a tree of ``n`` draft nodes (``n + 1`` tokens, tree
        mask) per size: every family's own size (its shape; EAGLE-2's first ``n`` proposals in creation order)
        and, with a top-k universe, a grid of sizes up to its size (its first ``n`` rank paths) for the static
        shapes chosen from it; ``"draft"``: the row counts of the draft calls per depth.
    """
    trees: dict = {}
    rows: set = set()
    for f in plan.families:
        if isinstance(f.shape, TreeShape):
            trees.setdefault(f.n, f.shape.parents)
        else:
            k = f.shape.top_k
            par = [-1] + [0] * k
            level = list(range(1, k + 1))
            while len(par) - 1 < f.n:
                nxt = []
                for v in level:
                    for _ in range(k):
                        par.append(v)
                        nxt.append(len(par) - 1)
                level = nxt
            trees.setdefault(f.n, np.array(par[: f.n + 1], dtype=np.int64))
        rows.update(draft_rows(f.shape))
    if plan.universe is not None:
        U = plan.universe
        for n in _grid(U.n):
            trees.setdefault(n, U.parents[: n + 1])
            rows.update(draft_rows(TreeShape(U.paths[1: n + 1])))
    return {"tree": sorted(trees.items()), "draft": sorted(r for r in rows if r > 0)}


# --------------------------------------------------------------------------- emission along the text
def text_ranks(p_text, y_text) -> np.ndarray:
    """Rank of each text token under the draft's law at the text's own context (decreasing ``p``, ties by lower
    id, as the ``"topk"`` process orders children); ``-1`` where ``p(y_t) = 0`` (never a drafted child).

    Counted in the laws' namespace, on their device (numpy or a torch tensor): only the ``(T,)`` ranks reach the
    host."""
    return text_ranks_of(to_host(text_ranks_where(p_text, y_text)))


def text_ranks_where(p_text, y_text):
    """:func:`text_ranks` left unread: the ``(2, T)`` float64 text tokens' probabilities and counted ranks in the
    laws' namespace, on their device (:func:`text_ranks_of` makes the ranks of their host copy)."""
    if not hasattr(p_text, "shape"):
        p_text = np.asarray(p_text, dtype=np.float64)
    xp, y = namespace(p_text), tokens_like(p_text, y_text)
    py = xp.take_along_axis(p_text, y, axis=-1)
    ids = xp.reshape(xp.arange(p_text.shape[1], dtype=xp.int64, device=_device_of(p_text)), (1, -1))
    rank = xp.sum(xp.astype(p_text > py, xp.int64), axis=1) + xp.sum(xp.astype((p_text == py) & (ids < y), xp.int64),
                                                                     axis=1)
    return xp.stack([py[:, 0], xp.astype(rank, py.dtype)])  # the ranks exact in float64 (V < 2**53)


def text_ranks_of(both: np.ndarray) -> np.ndarray:
    """:func:`text_ranks` from the host copy of :func:`text_ranks_where`'s values."""
    return np.where(both[0] > 0, both[1], -1).astype(np.int64)


def _device_of(x):
    import array_api_compat

    return array_api_compat.device(x)


def topk_emission_along(shape: TreeShape, p_text, q_text, y_text, *, ranks=None) -> np.ndarray:
    r"""Emission table of a static top-k tree along a text: exact, with no verifier and no drawn tree.

    .. math::

        e(s, s + j) = Q(y_s \dots y_{s+j-1} \mid y_{<s})\,
        \mathbb 1[r(s, j-1) \in T]\, \mathbb 1[r(s, j) \notin T],

    with :math:`r(s, m)` the rank path of :math:`y_s \dots y_{s+m-1}` under the
    draft's laws at the text's own contexts (:func:`text_ranks`). Every
    lossless verifier on a deterministic tree emits a target sample and
    accepts its longest prefix in the tree (the top-k trees of Cai et al.,
    arXiv:2401.10774, §2.1.2; verified as in SGLang's
    ``tree_speculative_sampling_target_only``), so an iteration begun at ``s``
    emits exactly the text's next ``j`` tokens with this probability; past a
    leaf the last token is the bonus from ``q``. Entries reaching past the
    text's end are 0.

    Parameters
    ----------
    shape : TreeShape
        The static shape (rank paths), of depth ``D``.
    p_text, q_text : (T, V) arrays of float
        Draft and target laws at the text's contexts :math:`y_{<t}`.
    y_text : (T,) array of int
        The text.
    ranks : (T,) array of int, optional, keyword-only
        :func:`text_ranks` of ``p_text``, when read already (with other values: one host read fewer).

    Returns
    -------
    (T, D + 1) ndarray of float64
        ``e[s, j - 1]``; each row sums to at most 1.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.tree import TreeShape
    >>> p, q = np.array([[0.6, 0.4]] * 3), np.array([[0.5, 0.5]] * 3)
    >>> topk_emission_along(TreeShape.chains(1, 1), p, q, np.array([0, 1, 0])).tolist()
    [[0.0, 0.25], [0.5, 0.0], [0.0, 0.0]]
    """
    y = np.asarray(y_text, dtype=np.int64)
    T, D = y.shape[0], int(shape.max_depth)
    qy = text_probs(q_text, y)
    rank = (text_ranks(p_text, y) if ranks is None else np.asarray(ranks)).tolist()
    members = set(shape.paths)
    E = np.zeros((T, D + 1))
    for s in range(T):
        path, mass = (), 1.0
        for j in range(1, min(D + 1, T - s) + 1):
            t = s + j - 1
            mass *= float(qy[t])
            child = path + (rank[t],)
            if rank[t] < 0 or child not in members:
                E[s, j - 1] = mass
                break
            path = child
    return E


def _iid_levels(q: np.ndarray, p: np.ndarray, m: int, buf: np.ndarray) -> list:
    """``(t_i, S_i, alive_i)`` for ``i = 0..m``: the residual :math:`(q - t_i p)_+ / S_i` before the ``i``-th child
    of recursive rejection over i.i.d. draws (:class:`otspec.tree._verifiers._NodeScan`'s levels), and the
    probability that the first ``i`` children are rejected."""
    node = _NodeScan(q, p, buf, False)
    out, alive = [], 1.0
    for _ in range(m + 1):
        out.append((node.t, node.S, alive))
        if alive > 0.0:
            S = node.S
            S_new = node._level(node.t + S)  # 0 where the level is kept: q_i = p, every draw is accepted
            alive = alive * S_new / S if S_new > 0.0 else 0.0  # 1 - sum_y min(p, q_i) = S(t_i + S_i) / S_i
    return out


def iid_levels_along(p_text, q_text, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The levels of recursive rejection over i.i.d. draws at every text position: ``(t, S, alive)``, each
    ``(T, m + 1)`` float64 in host memory.

    .. math::

        t_0 = 0,\ S_0 = 1,\ a_0 = 1, \qquad t_{i+1} = t_i + S_i,\quad
        S_{i+1} = \sum_x \big(q_t(x) - t_{i+1}\, p_t(x)\big)_+,\quad a_{i+1} = a_i\, S_{i+1} / S_i,

    the level kept (and :math:`a_{i+1} = 0`) where :math:`S_{i+1} = 0` (:func:`_iid_levels` at one position).
    Numpy laws position by position (:class:`otspec.tree._verifiers._NodeScan`'s passes over the shrinking set of
    tokens above the level); other arrays (torch tensors, on any device) in one batched pass over the ``(T, V)``
    laws per level, where they are: only the ``(T, m + 1)`` levels reach the host.
    """
    if isinstance(p_text, np.ndarray) or not hasattr(p_text, "shape"):
        P, Q = np.asarray(p_text, dtype=np.float64), np.asarray(q_text, dtype=np.float64)
        T = P.shape[0]
        out = np.zeros((3, T, m + 1))
        buf = np.empty(P.shape[1])
        for r in range(T):
            out[:, r] = np.array(_iid_levels(Q[r], P[r], m, buf)).T
        return out[0], out[1], out[2]
    both = to_host(iid_levels_where(p_text, q_text, m))
    return both[0], both[1], both[2]


def iid_levels_where(p_text, q_text, m: int):
    """:func:`iid_levels_along` of laws off the host left unread: the ``(3, T, m + 1)`` levels ``(t, S, alive)`` in
    the laws' namespace, on their device."""
    xp = namespace(p_text, q_text)
    P, Q = p_text, q_text
    T = int(P.shape[0])
    dev = _device_of(P)
    t = xp.zeros((T,), dtype=xp.float64, device=dev)
    S = xp.ones((T,), dtype=xp.float64, device=dev)
    alive = xp.ones((T,), dtype=xp.float64, device=dev)
    ts, Ss, alives = [t], [S], [alive]
    for _ in range(m):
        t_new = t + S
        S_new = xp.sum(xp.clip(Q - xp.reshape(t_new, (-1, 1)) * P, 0.0, None), axis=-1)
        moved = (alive > 0.0) & (S_new > 0.0)  # else the level is kept: every later draw accepted, or none alive
        alive = xp.where(moved, alive * S_new / S, 0.0)
        t, S = xp.where(moved, t_new, t), xp.where(moved, S_new, S)
        ts.append(t)
        Ss.append(S)
        alives.append(alive)
    return xp.stack([xp.stack(ts, axis=1), xp.stack(Ss, axis=1), xp.stack(alives, axis=1)], axis=0)


def iid_emission_along(shape: TreeShape, p_text, q_text, y_text, *, levels=None, py=None) -> np.ndarray:
    r"""Emission table of an i.i.d.-children tree with SpecInfer's rule along a text: exact, with no drawn tree.

    .. math::

        P(\text{child } i \text{ accepted with token } y \mid \text{node reached})
        = \min\big(\textstyle\prod_{j<i} R_j\, p(y),\ (q(y) - t_i\, p(y))_+\big),

    with :math:`t_0 = 0`, :math:`S_0 = 1`, :math:`t_{i+1} = t_i + S_i`, :math:`S_i = \sum_x (q(x) - t_i p(x))_+`
    and :math:`\prod_{j<i} R_j = S_i`: recursive rejection over i.i.d. draws (Miao et al., SpecInfer,
    arXiv:2305.09781, §4; Chen et al., Sequoia, arXiv:2402.12374, §3.1) leaves a residual that does not depend
    on which tokens were rejected, and each child is a fresh draw from the node's law, so the law of (accepted
    child, token) at a node reads only the node's own laws; on the text's path they are the text's. An
    iteration begun at ``s`` emits exactly the text's next ``j`` tokens with probability the sum over the shape's
    nodes ``a`` of depth ``j - 1`` of reaching ``a`` along the text and then stopping with :math:`y_{s+j-1}` (all
    ``m_a`` children rejected and the residual :math:`(q - t_{m_a} p)_+` drawn, or past a leaf the target's
    bonus).

    Parameters
    ----------
    shape : TreeShape
        The static shape (children in draw order), of depth ``D``.
    p_text, q_text : (T, V) arrays of float
        Draft and target laws at the text's contexts :math:`y_{<t}`.
    y_text : (T,) array of int
        The text.
    levels : (3, T, m + 1) array, optional, keyword-only
        :func:`iid_levels_along` of the laws (``m`` at least the shape's widest node), when read already;
    py : (T,) array, optional, keyword-only
        The text tokens' draft probabilities, when read already (with other values: host reads fewer).

    Returns
    -------
    (T, D + 1) ndarray of float64
        ``e[s, j - 1]``; each row sums to at most 1; entries past the text's end are 0.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.tree import TreeShape
    >>> p, q = np.array([[0.6, 0.4]] * 3), np.array([[0.5, 0.5]] * 3)
    >>> iid_emission_along(TreeShape.chains(1, 1), p, q, np.array([0, 1, 0])).round(4).tolist()
    [[0.0, 0.25], [0.1, 0.2], [0.0, 0.0]]
    """
    y = np.asarray(y_text, dtype=np.int64)
    T, D = y.shape[0], int(shape.max_depth)
    kids: dict = {}
    for c in range(1, shape.n + 1):
        kids.setdefault(int(shape.parents[c]), []).append(c)
    widest = max(len(ch) for ch in kids.values()) if kids else 0
    # the levels of a text position do not depend on the node: computed once per position, in the laws' namespace
    lt, lS, la = iid_levels_along(p_text, q_text, widest) if levels is None else levels
    lt, lS, la = (np.asarray(a)[:, :widest + 1].tolist() for a in (lt, lS, la))
    PY = (text_probs(p_text, y) if py is None else np.asarray(py)).tolist()
    QY = text_probs(q_text, y).tolist()
    E = np.zeros((T, D + 1))
    for s in range(T):
        live = {0: 1.0}
        for d in range(min(D + 1, T - s)):
            t_ = s + d
            qy, py = QY[t_], PY[t_]
            levels = list(zip(lt[t_], lS[t_], la[t_]))
            nxt: dict = {}
            total = 0.0
            for a, w in live.items():
                ch = kids.get(a, [])
                for i, c in enumerate(ch):
                    t, S, alive = levels[i]
                    acc = min(alive * py, alive * max(qy - t * py, 0.0) / S)
                    if acc > 0.0:
                        nxt[c] = w * acc
                t, S, alive = levels[len(ch)]
                total += w * alive * max(qy - t * py, 0.0) / S
            E[s, d] = total
            live = nxt
            if not live:
                break
    return E


def _along_route(process: str, verifier) -> str | None:
    """How a row (``process``, ``verifier`` or None) gets its emission table along the text: ``"topk"`` or ``"iid"``
    (closed forms from the text's laws: :func:`topk_emission_along`, :func:`iid_emission_along`), ``"drawn"`` (the
    walk of :func:`tree_emission_along` through the tree drawn at each position), or None."""
    if process == "topk":
        return "topk"
    if process == "eagle2":
        return "drawn"
    if process == "iid" and verifier == "specinfer":
        return "iid"
    if verifier is not None and isinstance(make_tree_verifier(verifier), TargetOnlyVerifier):
        return "drawn"
    return None


def _routes(f: TreeFamily) -> list:
    return [(name, _along_route(f.process, v)) for v, name in zip(f.verifiers or (None,), f.names())]


def along_text_names(f: TreeFamily) -> tuple:
    r"""The row names of a family whose emission along the text is the walk of :func:`tree_emission_along`
    through the tree drawn at each position.

    EAGLE-2's tree (deterministic given the context: every lossless verifier emits a target sample and accepts
    its longest prefix in the tree) and the target-only rule on sampled trees (the same walk on the drawn tree:
    exact given the tree, so unbiased over the draws, and its weights :math:`e / Q` stay in :math:`\{0, 1\}`).
    The per-node rules on trees drawn without replacement (Sequoia's) have no closed form averaged over the
    draws, and one drawn tree per position is no estimator for them: given the tree, :math:`e / Q` is about
    :math:`1 / p` for a rare drafted token that the text happens to take, so its variance grows with the
    vocabulary. SpecInfer's rule on i.i.d. children and the static top-k families need no drawn tree
    (:func:`static_along_names`).
    """
    return tuple(name for name, route in _routes(f) if route == "drawn")


def static_along_names(f: TreeFamily) -> tuple:
    """The row names of a family whose emission table along the text is exact from the text's laws alone, with
    its route: ``((name, "topk" | "iid"), ...)`` (:func:`topk_emission_along`, :func:`iid_emission_along`)."""
    return tuple((name, route) for name, route in _routes(f) if route in ("topk", "iid"))


def along_text_route(process: str, verifier, *, stride: int, context: str) -> tuple[str | None, str]:
    """How a tree family's row (``process``, ``verifier`` or None) gets its emission table along the text, in
    words for a report: ``(route, "")``, or ``(None, reason)`` when it has none."""
    if context != "sample":
        return None, "the estimator needs a text sampled from the target (context 'sample')"
    route = _along_route(process, verifier)
    if route == "topk":
        return "exact: the draft's ranks along the text", ""
    if route == "iid":
        return "exact: closed form (the residual after i.i.d. rejections does not depend on the tokens)", ""
    if route is None:
        return None, (f"{verifier!r} on children drawn {'i.i.d.' if process == 'iid' else 'without replacement'} "
                      "has no closed form along the text, and one drawn tree per position gives weights of size "
                      "1/p")
    if stride != 1:
        return None, "it reads the tree drawn at every text position, and `stride` > 1 leaves positions undrawn"
    if process == "eagle2":
        return "exact: EAGLE-2's tree drawn at every position is deterministic", ""
    return "unbiased: exact given the tree drawn at every position (weights 0 or 1), averaged over the draws", ""


def along_text_families(plan: TreePlan | None) -> tuple:
    """The families of ``plan`` with at least one name in :func:`along_text_names`."""
    if plan is None:
        return ()
    return tuple(f for f in plan.families if along_text_names(f))


def compact_tree(tree: DraftTree) -> np.ndarray:
    """``(2, n + 1)`` int32 array of a drawn tree's parents and tokens: what the walk along the text reads, kept
    per position (a few bytes per node, not the tree's shape and paths)."""
    return np.stack([np.asarray(tree.parents), np.asarray(tree.tokens)]).astype(np.int32)


def tree_emission_along(tree, q_text, y_text, *, depth: int | None = None) -> np.ndarray:
    r"""Emission row of one drawn tree along a text, for a rule that emits a target sample and accepts its longest
    prefix in the tree.

    .. math::

        e(j) = Q(y_0 \dots y_{j-1})\, \mathbb 1[y_{0:j-1} \in T]\, \mathbb 1[y_{0:j} \notin T],
        \qquad j = 1, \dots, D + 1,

    the probability that an iteration begun at the tree's root accepts the text's next ``j - 1`` tokens and
    emits :math:`y_{j-1}` as its last token (past a leaf, the target's bonus); a path is in :math:`T` through
    the first of equal siblings. Every lossless verifier on a deterministic tree (EAGLE-2's, Li et al.,
    arXiv:2406.16858, §4) acts so, and the target-only rule (SGLang's
    ``tree_speculative_sampling_target_only``) on any tree: for a tree drawn at random the row is exact given
    the tree and, averaged over the draws, the process's emission row.

    Parameters
    ----------
    tree : DraftTree or (2, n + 1) array of int
        The tree drawn after the context :math:`y_{<0}`, or its :func:`compact_tree` (parents, tokens).
    q_text : (m, V) array of float
        The target's laws at the contexts :math:`y_{<d}`, ``d = 0..m - 1`` (the text's own).
    y_text : (m,) array of int
        The text's next tokens :math:`y_0 \dots y_{m-1}`; ``m`` may stop short of ``D + 1`` at the text's end
        (the entries past it are 0).
    depth : int, optional
        ``D``: the row has ``D + 1`` entries (the family's depth); the tree's depth by default.

    Returns
    -------
    (D + 1,) ndarray of float64
        ``e[j - 1]``; sums to at most 1.
    """
    Q = np.asarray(q_text, dtype=np.float64)
    y = np.asarray(y_text, dtype=np.int64)
    parents, tokens = compact_tree(tree) if isinstance(tree, DraftTree) else tree
    child: dict = {}  # (parent, token) -> the first child carrying it
    level = np.zeros(parents.shape[0], dtype=np.int64)
    for c in range(1, parents.shape[0]):
        child.setdefault((int(parents[c]), int(tokens[c])), c)
        level[c] = level[parents[c]] + 1
    D = int(level.max()) if depth is None else int(depth)
    E = np.zeros(D + 1)
    node, mass = 0, 1.0
    for d in range(min(D + 1, y.shape[0])):
        mass *= float(Q[d, y[d]])
        node = child.get((node, int(y[d])))
        if node is None:  # the text leaves the tree (or passes a leaf): y_d is the last token emitted
            E[d] = mass
            break
    return E


# --------------------------------------------------------------------------- choosing
def static_order(mean_q: np.ndarray, parents: np.ndarray) -> np.ndarray:
    r"""Universe nodes (ids ``1..U``) by decreasing mean target path probability, ties by the node order.

    .. math::

        \bar Q(s_{(1)}) \ge \bar Q(s_{(2)}) \ge \dots,

    so that the first ``n`` form the best static shape with ``n`` nodes: the mean of :math:`Q` never increases
    down a path and the node order puts a parent before its children, so every prefix of the order is
    prefix-closed (Cai et al., Medusa, arXiv:2401.10774, §2.1.2 choose the tree from per-rank accuracies; the
    exact choice over a set of contexts is this sort). Each weight is first capped by its parent's (a no-op on
    recorded path probabilities, which never increase down a path), so the order stays prefix-closed whatever
    the input.

    Parameters
    ----------
    mean_q : (U,) array
        Mean target path probability of the nodes ``1..U``.
    parents : (U + 1,) array
        The universe's parent array (node order).
    """
    w = np.concatenate([[np.inf], np.asarray(mean_q, dtype=np.float64)])
    for c in range(1, w.shape[0]):
        w[c] = min(w[c], w[parents[c]])
    return np.argsort(-w[1:], kind="stable") + 1


def eagle2_from_universe(params: Eagle2Params, universe: TreeShape, index: dict, steps: np.ndarray,
                         Qp: np.ndarray) -> float | None:
    r"""EAGLE-2's value at one position from the recorded universe: :math:`\sum_v Q(v)` over its tree.

    The dynamic tree of ``params`` is built (:func:`otspec.tree.sample_tree`'s ``"eagle2"`` rule) on the rank
    paths, with the draft's law at a node replaced by the recorded probabilities of its ranked children (the
    ranking and the path scores, sums of their logarithms in the same order, are all EAGLE-2 reads: the same
    tree as from the draft's full laws, ties included); None when a proposal lies outside the universe.

    Parameters
    ----------
    params : Eagle2Params
    universe : TreeShape
    index : dict
        Rank path -> node id of ``universe``.
    steps, Qp : (U + 1,) arrays
        The draft's probability of each node's token at its parent (``"treep"``) and the target's path
        probability (``"treeq"``) of the universe's nodes, root first (any value there).
    """
    k = params.top_k

    def law(path):
        base = index.get(path)
        kids = [index.get(path + (r,)) for r in range(k)]
        if base is None or any(c is None for c in kids):
            raise LookupError(path)
        return np.array([steps[c] for c in kids])

    try:
        tree = _eagle2_tree(params, law)
    except LookupError:
        return None
    return math.fsum(float(Qp[index[p]]) for p in tree.paths()[1:])
