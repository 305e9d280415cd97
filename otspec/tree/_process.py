r"""Draft processes: how the draft model fills a tree shape with tokens.

A draft process turns a shape (or EAGLE-2's parameters) and the draft model
:math:`M_s` into a realised :class:`~otspec.tree.DraftTree`. The children of
a node with root path :math:`x_{1:d}` come from :math:`p = M_s(\cdot \mid
\text{prefix}, x_{1:d})`:

* ``"iid"`` (SpecInfer, Miao et al., arXiv:2305.09781, §3; SpecTr's prefix
  trees, Sun et al., arXiv:2310.15141, Appendix D): the rank-``r`` child is
  the ``r``-th of independent draws from ``p``;
* ``"wor"`` (Sequoia, Chen et al., arXiv:2402.12374, §3.2; Gumbel top-k):
  draws without replacement, the ``r``-th draw from ``p`` with the earlier
  draws removed and renormalised; ranks missing from the shape are drawn
  and discarded;
* ``"topk"`` (Medusa, Cai et al., arXiv:2401.10774; EAGLE, Li et al.,
  arXiv:2401.15077): the rank-``r`` child is the ``r``-th most likely token
  of ``p`` (ties: lower token id first); deterministic;
* ``"eagle2"`` (EAGLE-2, Li et al., arXiv:2406.16858, §4): the dynamic tree
  of :class:`~otspec.tree.Eagle2Params`; deterministic.

Notation: ``p`` is the draft law, ``q`` the target law at a node.
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from .._registry import suggest
from .._validation import as_rng, validate_positive_int
from .._verifier import sample_from_cdf
from ..models import next_law, validate_model, validate_model_pair, validate_sequence
from . import _bound_kernels as _K
from ._tree import DraftTree, Eagle2Params, TreeShape

__all__ = [
    "as_tree_shape",    "draw_children",
    "DETERMINISTIC_PROCESSES",
    "MAX_TREES",
    "PROCESSES",
    "LawCache",
    "enumerate_trees",
    "sample_tree",
    "tree_laws",
    "validate_process",
]

#: The draft processes, by name.
PROCESSES = ("iid", "wor", "topk", "eagle2")
#: The processes whose tree is a function of the context (no randomness).
DETERMINISTIC_PROCESSES = ("topk", "eagle2")
#: Default largest number of realised trees :func:`enumerate_trees` lists
#: (bounded before any model call by ``V**n`` for ``"iid"`` and by the
#: number of ordered draws without replacement for ``"wor"``).
MAX_TREES = 200_000


def as_tree_shape(shape, process):
    """``shape`` as the tree type ``process`` draws: a :class:`TreeShape` as it is, a sequence of rank paths
    (Medusa's ``medusa_choices``: ``[(0,), (1,), (0, 0)]``) through :meth:`TreeShape.from_paths` (which names
    the first path whose parent is missing); anything else is left for :func:`validate_process` to refuse."""
    if not isinstance(process, str):  # refused by validate_process (an array is never compared: no numpy error)
        return shape
    if process != "eagle2" and isinstance(shape, (list, tuple)) and not isinstance(shape, Eagle2Params):
        try:
            return TreeShape.from_paths(shape)
        except (TypeError, ValueError) as exc:  # the caller's parameter is `shape`
            raise type(exc)(str(exc).replace("`paths", "`shape", 1)) from None
    return shape


def validate_process(process, shape) -> str:
    """Check ``process`` is a known name and fits ``shape`` (TreeShape, or Eagle2Params for ``"eagle2"``)."""
    if not isinstance(process, str):
        raise TypeError(f"`process` must be one of {PROCESSES}, got {type(process).__name__}")
    if process not in PROCESSES:
        raise ValueError(f"`process` must be one of {PROCESSES}, got {process!r}{suggest(process, PROCESSES)}")
    if process == "eagle2":
        if not isinstance(shape, Eagle2Params):
            raise TypeError(f"`shape` must be an Eagle2Params for process='eagle2', got {type(shape).__name__}")
    elif not isinstance(shape, TreeShape):
        raise TypeError(
            f"`shape` must be a TreeShape for process={process!r}, got {type(shape).__name__}"
            + (" (an Eagle2Params needs process='eagle2')" if isinstance(shape, Eagle2Params) else "")
        )
    return process


class LawCache:
    """Validated next-token laws of a model after ``prefix + path``, memoised by path (one call per distinct path).

    The laws are written row by row into blocks of ``(rows, V)`` float64, the first of :data:`FIRST_BYTES` (at
    most :data:`FIRST_ROWS` rows), each
    next twice the last up to :data:`ARENA_BYTES` (read-only views of their rows are returned; beyond the first
    block at most about half of the blocks' memory is unused): the bound's row kernels read the laws grouped by
    block (:func:`otspec.tree._bound._row_blocks`), and the blocks are mapped in huge pages where the system allows
    (numpy asks for them from 4 MiB), where one fresh array per law paid a page fault per 4 KiB of it.
    """

    #: The first block, in bytes (rounded up to whole rows of ``8 V`` bytes): numpy asks for huge pages from 4 MiB.
    FIRST_BYTES = 1 << 22
    #: At most this many rows in the first block (a small vocabulary's cache stays small: a 4 MiB block costs
    #: about 0.5 ms to map and touch).
    FIRST_ROWS = 16
    #: The largest block, in bytes (at least the first).
    ARENA_BYTES = 1 << 25

    def __init__(self, model, V: int, prefix: tuple[int, ...], name: str):
        self.model, self.V, self.prefix, self.name = model, V, prefix, name
        self._laws: dict = {}
        self._block = np.empty((0, V))
        self._used = 0

    def _row(self) -> np.ndarray:
        """A fresh row of the current block (a new block, twice the last in rows within the cap, when full)."""
        if self._used == self._block.shape[0]:
            row = 8 * max(self.V, 1)
            first = min(self.FIRST_ROWS, -(-self.FIRST_BYTES // row))
            cap = max(first, self.ARENA_BYTES // row)
            self._block = np.empty((min(cap, max(first, 2 * self._block.shape[0])), self.V))
            self._used = 0
        self._used += 1
        return self._block[self._used - 1]

    def __call__(self, path: tuple[int, ...]) -> np.ndarray:
        law = self._laws.get(path)
        if law is None:
            law = next_law(self.model, self.prefix + path, self.V, self.name, out=self._row())
            self._laws[path] = law
        return law


def _ranked(p: np.ndarray, k: int | None = None) -> np.ndarray:
    """Token ids by decreasing ``p``, ties by lower id; with ``k``, the first ``k`` of them only.

    The first ``k`` come from a partition (``O(V)``) and a stable sort of the candidates at or above the
    ``k``-th largest value, taken in id order so that ties still go to the lower id: the same ids as the
    full stable sort (4.6 ms at V = 49,152), in about 0.6 ms for ``k = 8``.
    """
    V = p.shape[0]
    if k is None or k >= V:
        return np.argsort(-p, kind="stable")[:k]
    kth = np.partition(p, V - k)[V - k]
    cand = np.flatnonzero(p >= kth)
    return cand[np.argsort(-p[cand], kind="stable")[:k]]


def _support_error(process: str, need: int, path, p: np.ndarray) -> ValueError:
    return ValueError(
        f"process={process!r} needs {need} distinct children at the node with token path {tuple(path)}, but the "
        f"draft's law there has only {int(np.count_nonzero(p > 0))} tokens of positive probability"
    )


def _child_groups(shape: TreeShape):
    """``[(parent, children ids, their ranks)]`` for every node with children, in node order."""
    groups: dict = {}
    for i in range(1, shape.n + 1):
        groups.setdefault(int(shape.parents[i]), []).append(i)
    return [(par, ch, [int(shape.ranks[c]) for c in ch]) for par, ch in sorted(groups.items())]


def _topk_tree(shape: TreeShape, laws) -> DraftTree:
    tokens = np.full(shape.n + 1, -1, dtype=np.int64)
    paths: list = [()] * (shape.n + 1)
    for par, ch, ranks in _child_groups(shape):
        p = laws(paths[par])
        need = max(ranks) + 1
        if np.count_nonzero(p > 0) < need:
            raise _support_error("topk", need, paths[par], p)
        order = _ranked(p, need)
        for c, r in zip(ch, ranks):
            tokens[c] = order[r]
            paths[c] = paths[par] + (int(order[r]),)
    return DraftTree(shape, shape.parents, tokens)


def _eagle2_tree(params: Eagle2Params, laws) -> DraftTree:
    """EAGLE-2's expansion and reranking (SafeAILab/EAGLE ``Model.topK_genrate``; SGLang ``select_top_k_tokens``)."""
    k = params.top_k
    # every proposal: (score, parent proposal index or -1, token, path); proposals are numbered in
    # creation order (level by level, frontier position, child rank), EAGLE's `scores_list` order
    scores: list = []
    parent: list = []
    token: list = []
    paths: list = []

    def expand(par: int, base: float, path: tuple) -> None:
        p = laws(path)
        if np.count_nonzero(p > 0) < k:
            raise _support_error("eagle2", k, path, p)
        with np.errstate(divide="ignore"):
            logp = np.log(p)
        for t in _ranked(p, k):
            scores.append(base + float(logp[t]))
            parent.append(par)
            token.append(int(t))
            paths.append(path + (int(t),))

    expand(-1, 0.0, ())
    frontier = list(range(k))  # level 1: the root's top-k, all expanded
    for _ in range(params.depth - 1):
        start = len(scores)
        for f in frontier:
            expand(f, scores[f], paths[f])
        level = range(start, len(scores))
        # next frontier: the top-k of this level's k*k proposals by score, ties by earlier proposal
        frontier = sorted(level, key=lambda j: (-scores[j], j))[:k]
    kept = sorted(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[: params.n])
    node_of = {j: i + 1 for i, j in enumerate(kept)}
    parents = [-1]
    for j in kept:
        if parent[j] >= 0 and parent[j] not in node_of:  # pragma: no cover - scores never increase along a path
            raise RuntimeError("EAGLE-2 selection is not prefix-closed")
        parents.append(node_of[parent[j]] if parent[j] >= 0 else 0)
    return DraftTree(None, parents, [-1] + [token[j] for j in kept])


def _setup(shape, draft, process, prefix):
    shape = as_tree_shape(shape, process)
    process = validate_process(process, shape)
    V = validate_model(draft, "draft")
    ctx = validate_sequence(prefix, V, "prefix")
    return process, V, ctx, shape


def sample_tree(shape, draft, *, process, prefix=(), rng=None) -> DraftTree:
    r"""Draw a realised draft tree from a draft process.

    .. math::

        T \sim D(\text{shape}, M_s(\cdot \mid \text{prefix}, \cdot)),

    one draft law per node with children: the ``"iid"`` children of a node
    are independent draws from ``p``, the ``"wor"`` children successive draws
    without replacement (rank ``r`` = the ``r``-th draw), the ``"topk"``
    children the most likely tokens in rank order, ``"eagle2"`` EAGLE-2's
    dynamic tree (the last two are deterministic: ``rng`` is unused).

    Parameters
    ----------
    shape : TreeShape or Eagle2Params
        The shape (``Eagle2Params`` for ``process="eagle2"``).
    draft : Model
        The draft model :math:`M_s` (``vocab_size``, ``next_dist(prefix)``).
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
    prefix : sequence of int, keyword-only
        The context the tree continues.
    rng : numpy.random.Generator, int or None, keyword-only

    Returns
    -------
    DraftTree
        With ``shape`` set (None for ``"eagle2"``).

    Raises
    ------
    TypeError, ValueError
        An unknown process, a shape of the wrong type, a model that is not a
        model, a prefix outside the vocabulary, or a node needing more
        distinct children than the draft's support (``"wor"``, ``"topk"``,
        ``"eagle2"``; the message names the process and the node).

    References
    ----------
    .. [1] Miao et al., SpecInfer, arXiv:2305.09781, §3.
    .. [2] Chen et al., Sequoia, arXiv:2402.12374, §3.2 (sampling without replacement).
    .. [3] Cai et al., Medusa, arXiv:2401.10774, §2.1.2; Li et al., EAGLE-2, arXiv:2406.16858, §4.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import TreeShape, sample_tree
    >>> draft = MemorylessModel([0.5, 0.3, 0.2])
    >>> sample_tree(TreeShape([(0,), (1,), (0, 0)]), draft, process="topk").tokens.tolist()
    [-1, 0, 1, 0]
    >>> t = sample_tree(TreeShape([(0,), (1,)]), draft, process="wor", rng=0)
    >>> bool(t.tokens[1] != t.tokens[2])
    True
    """
    process, V, ctx, shape = _setup(shape, draft, process, prefix)
    laws = LawCache(draft, V, ctx, "draft")
    if process == "topk":
        return _topk_tree(shape, laws)
    if process == "eagle2":
        return _eagle2_tree(shape, laws)
    gen = as_rng(rng)
    tokens = np.full(shape.n + 1, -1, dtype=np.int64)
    paths: list = [()] * (shape.n + 1)
    for par, ch, ranks in _child_groups(shape):
        drawn = draw_children(laws(paths[par]), ranks, process, gen, path=paths[par])
        for c_, t in zip(ch, drawn):
            tokens[c_] = t
            paths[c_] = paths[par] + (int(t),)
    return DraftTree(shape, shape.parents, tokens)


def draw_children(p: np.ndarray, ranks, process: str, gen: np.random.Generator, *, path=()) -> list[int]:
    """The tokens of one node's children of ranks ``ranks`` (in rank order) drawn from its draft law ``p``.

    ``"iid"``: one independent draw per child; ``"wor"``: the first ``max(ranks) + 1`` draws without
    replacement (each from ``p`` with the earlier draws removed), the child of rank ``r`` taking the ``r``-th
    (:func:`_draws_without_replacement`). Both from one cumulative sum of ``p``. The one draw of
    :func:`sample_tree`, of the tree decoder (:mod:`otspec.decoding`), which hands it the laws of a whole depth
    at once, and of the profile's sampled trees. ``path`` (the node's root path) names the node in the error.

    Raises
    ------
    ValueError
        ``"wor"`` with fewer tokens of positive probability than ``max(ranks) + 1``.
    """
    if process == "iid":
        c = p.cumsum()
        if not c[-1] > 0:
            raise ValueError("cannot sample from a vector with zero total mass")
        return [sample_from_cdf(c, p, gen) for _ in ranks]
    need = max(ranks) + 1
    if np.count_nonzero(p > 0) < need:
        raise _support_error("wor", need, path, p)
    seq = _draws_without_replacement(p, need, gen)
    return [seq[r] for r in ranks]


def _draws_without_replacement(p: np.ndarray, need: int, gen: np.random.Generator) -> list[int]:
    r"""The first ``need`` successive draws without replacement from ``p`` (at least ``need`` positive entries).

    Draw ``j`` is the inverse-CDF draw (:func:`~otspec._verifier.sample_from`, one uniform) from ``w_j``, ``p``
    with the earlier draws set to 0: ``i = min{i : c_j[i] > u c_j[V-1]}``, ``c_j`` the cumulative sum of
    ``w_j``. The very same tokens as that procedure with ``w_j`` copied and summed again per draw (one pass over
    the vocabulary per draw), from ONE cumulative sum ``C`` of ``p``: in float64 ``c_j[i]`` is within

    .. math::

        \delta = 5 V \epsilon\, C[V-1] \qquad (\epsilon = 2^{-53},\ V \epsilon \le 10^{-2})

    of :math:`e_j(i) = C[i] - \sum_{t \text{ drawn},\, t \le i} p[t]` (the error bounds of recursive summation,
    Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §4.2, on the three sums), so the
    candidate ``i`` found by searching ``C`` piecewise (between the drawn tokens the subtracted mass is a
    constant) is the procedure's token whenever ``u c_j[V-1]`` lies more than a guard band (:math:`2 \delta`
    and the rounding of the product) inside ``(e_j(i-1), e_j(i))``; otherwise (a band of about
    :math:`10^{-10}` around each of the ``V`` cuts: under :math:`10^{-4}` of the draws at ``V = 49,152``
    while most of the mass is left; none in 6,300 draws from Dirichlet laws) the draw is made by the
    procedure itself, with the same uniform. A draw costs ``O(need log V)`` instead of ``O(V)``.
    """
    V = p.shape[0]
    c = p.cumsum()
    seq = [sample_from_cdf(c, p, gen)]
    if need == 1:
        return seq
    eps = float(np.finfo(c.dtype).eps) / 2
    guard = 32.0 * V * eps * float(c[-1])  # 2 delta plus the product's rounding, with room to spare
    cuts: list = []  # the drawn tokens in increasing order, with the mass drawn up to each
    for _ in range(1, need):
        r = gen.random()
        cuts.insert(bisect.bisect(cuts, (seq[-1],)), (seq[-1], 0.0))
        acc = 0.0
        for j, (t, _) in enumerate(cuts):
            acc += float(p[t])
            cuts[j] = (t, acc)
        u = r * (float(c[-1]) - acc)
        i = _candidate(c, cuts, u)
        if i is None or not _inside(c, cuts, i, u, guard):
            w = np.array(p, copy=True)
            w[seq] = 0.0
            cw = w.cumsum()
            i = min(int(cw.searchsorted(r * cw[-1], side="right")), V - 1)
            while w[i] <= 0 and i > 0:
                i -= 1
        seq.append(int(i))
    return seq


def _drawn_below(cuts: list, i: int) -> float:
    """The mass drawn at tokens ``<= i`` (``cuts``: ``(token, mass drawn up to it)``, increasing tokens)."""
    k = bisect.bisect(cuts, (i, math.inf))
    return cuts[k - 1][1] if k else 0.0


def _candidate(c: np.ndarray, cuts: list, u: float):
    """The first ``i`` with ``C[i] - (mass drawn at tokens <= i) > u``, searched between the drawn tokens."""
    V = c.shape[0]
    start, below = 0, 0.0
    for t, m in cuts + [(V, math.nan)]:
        if t > start:
            i = max(int(c.searchsorted(u + below, side="right")), start)
            if i < t:
                return i
        start, below = t, m
    return None


def _inside(c: np.ndarray, cuts: list, i: int, u: float, guard: float) -> bool:
    """Whether ``u`` lies more than ``guard`` inside ``(e(i - 1), e(i))`` (``e(-1) = 0``)."""
    hi = float(c[i]) - _drawn_below(cuts, i)
    lo = float(c[i - 1]) - _drawn_below(cuts, i - 1) if i > 0 else -math.inf
    return lo + guard < u < hi - guard


#: Ordered draws :func:`_wor_sequences` forms at once; above it they come in blocks, one per first drawn token.
_WOR_BLOCK = 1 << 20


def _wor_left_masses(vals: list, need: int) -> np.ndarray:
    r"""The mass not yet drawn after each set :math:`S` of fewer than ``need`` drawn positions of ``vals``,
    :math:`\operatorname{fsum}(\{v_j : j \notin S\})`, one correctly rounded sum a set (not one per ordered draw):
    entry ``_wor_set_offsets(n, need)[|S|] + rank(S)``, ``rank`` the combinatorial number system's
    :math:`\sum_i \binom{c_i}{i + 1}` of the sorted positions :math:`c_0 < c_1 < \dots`."""
    n = len(vals)
    off = _wor_set_offsets(n, need)
    out = np.empty(off[-1])
    for k in range(len(off) - 1):
        for c in itertools.combinations(range(n), k):
            rest, s = [], 0
            for j in c:
                rest += vals[s:j]
                s = j + 1
            rest += vals[s:]
            out[off[k] + sum(math.comb(j, i + 1) for i, j in enumerate(c))] = math.fsum(rest)
    return out


def _wor_set_offsets(n: int, need: int) -> list:
    """Where the sets of each size ``0 .. need - 1`` (of ``n`` positions) start in :func:`_wor_left_masses`, and the
    total."""
    off = [0]
    for k in range(min(need, n + 1)):
        off.append(off[-1] + math.comb(n, k))
    return off


def _wor_expand(pos: np.ndarray, w: np.ndarray, vals: np.ndarray, left: np.ndarray, need: int):
    """Extend the ordered draws ``pos`` (positions, ``(m, d)``, probabilities ``w``) to ``need`` draws, each prefix's
    continuations by increasing position (``itertools.permutations``' order); each factor as the sequential product
    ``w *= v / left`` forms it (the same IEEE operations, elementwise)."""
    n = vals.shape[0]
    off, binom = _wor_tables(n, need)
    for d in range(pos.shape[1], need):
        srt = np.sort(pos, axis=1)
        rk = np.full(pos.shape[0], off[d], dtype=np.int64)
        for i in range(d):
            rk += binom[srt[:, i], i + 1]
        free = np.ones((pos.shape[0], n), dtype=bool)
        free[np.arange(pos.shape[0])[:, None], pos] = False
        row, col = np.nonzero(free)                       # row-major: prefixes in order, positions increasing
        w = w[row] * (vals[col] / left[rk][row])
        pos = np.concatenate([pos[row], col[:, None]], axis=1)
    return pos, w


def _wor_tables(n: int, need: int):
    """The kernel's index tables (:func:`otspec.tree._bound_kernels.wor_enumerate`): the sets' offsets by size and
    ``binom[c, i]`` = :math:`\binom{c}{i}`."""
    off = np.array(_wor_set_offsets(n, need), dtype=np.int64)
    binom = np.array([[math.comb(c, i) for i in range(need + 1)] for c in range(n)], dtype=np.int64)
    return off, binom.reshape(n, need + 1)


def _wor_blocks(p: np.ndarray, need: int, block: int | None = None, *, jit: bool | None = None):
    r"""Every ordered draw of ``need`` distinct tokens without replacement from the law ``p``, as arrays ``(seqs, w)``:
    ``seqs`` ``(N, need)`` int64 token ids in ``itertools.permutations``' order of the support, ``w`` ``(N,)`` their
    probabilities :math:`\prod_j p_{x_j} / (1 - p(\{x_0, \dots, x_{j-1}\}))`, each denominator the correctly rounded
    sum of the mass not yet drawn (once a drawn set), the product in draw order. In one block, or, above ``block``
    draws, in blocks of one first token each (in order). By the compiled kernel
    (:func:`otspec.tree._bound_kernels.wor_enumerate`) when ``jit`` (default: numba installed) and in one block, else
    by numpy (:func:`_wor_left_masses`, :func:`_wor_expand`); the same bits either way."""
    support = np.flatnonzero(p > 0)
    vals = np.ascontiguousarray(np.asarray(p, dtype=np.float64)[support])
    n = support.shape[0]
    if need > n:
        return
    one = block is None or need == 0 or math.perm(n, need) <= block
    if one and need > 0 and (_K.WOR_JIT if jit is None else jit):
        N = math.perm(n, need)
        seqs, w = np.empty((N, need), dtype=np.int64), np.empty(N)
        _K.wor_enumerate(vals, support.astype(np.int64), need, *_wor_tables(n, need), np.zeros(0, dtype=np.int64),
                         seqs, w, np.zeros((0, 0)))
        yield seqs, w
        return
    left = _wor_left_masses(vals.tolist(), need)
    if one:
        pos, w = _wor_expand(np.zeros((1, 0), dtype=np.int64), np.ones(1), vals, left, need)
        yield support[pos], w
        return
    for a in range(n):
        pos, w = _wor_expand(np.array([[a]], dtype=np.int64), 1.0 * (vals[a:a + 1] / left[:1]), vals, left, need)
        yield support[pos], w


def _wor_enumeration(p: np.ndarray, need: int, *, jit: bool | None = None):
    """``(seqs, w)``: every ordered draw of ``need`` distinct tokens without replacement, with its probability, as
    two arrays (:func:`_wor_blocks`; bit for bit :func:`_wor_sequences`)."""
    for seqs, w in _wor_blocks(p, need, jit=jit):
        return seqs, w
    return np.zeros((0, need), dtype=np.int64), np.zeros(0)


def _wor_rank_laws(p: np.ndarray, ranks, V: int, *, jit: bool | None = None) -> np.ndarray:
    """``e`` ``(len(ranks), V)``: ``e[k, y]`` = :math:`P(\text{draw } r_k = y)` for draws without replacement from the
    law ``p``, summed over the ordered draws (:func:`_wor_blocks`) in their order, ``e[k, seq[r_k]] += w`` each; zero
    when the support has fewer than ``max(ranks) + 1`` tokens."""
    ranks = [int(r) for r in ranks]
    need = max(ranks) + 1
    e = np.zeros((len(ranks), V))
    support = np.flatnonzero(p > 0)
    n = support.shape[0]
    if need > n:
        return e
    if _K.WOR_JIT if jit is None else jit:
        vals = np.ascontiguousarray(np.asarray(p, dtype=np.float64)[support])
        _K.wor_enumerate(vals, support.astype(np.int64), need, *_wor_tables(n, need), np.array(ranks, dtype=np.int64),
                         np.zeros((0, need), dtype=np.int64), np.zeros(0), e)
        return e
    seqs, w = _wor_enumeration(p, need, jit=False)
    for k, r in enumerate(ranks):
        np.add.at(e[k], seqs[:, r], w)                  # in the draws' order, as `e[k, seq[r]] += w` each
    return e


def _wor_sequences(p: np.ndarray, need: int):
    """Every ordered draw of ``need`` distinct tokens without replacement, with its probability (``(tuple, float)``,
    in ``itertools.permutations``' order of the support; :func:`_wor_blocks`)."""
    for seqs, w in _wor_blocks(p, need, _WOR_BLOCK):
        for seq, x in zip(seqs.tolist(), w.tolist()):
            yield tuple(seq), x


def _count_bound(shape: TreeShape, process: str, V: int) -> float:
    """Upper bound on the number of realised trees (log scale safe)."""
    log_total = 0.0
    for _par, ch, ranks in _child_groups(shape):
        if process == "iid":
            log_total += len(ch) * math.log(V)
        else:
            need = max(ranks) + 1
            log_total += sum(math.log(V - j) for j in range(min(need, V)))
    return log_total


def enumerate_trees(shape, draft, *, process, prefix=(), max_trees: int = MAX_TREES) -> list[tuple[DraftTree, float]]:
    r"""Every realised tree of a draft process with its probability.

    .. math::

        \{(T, P_D(T)) : P_D(T) > 0\},\qquad \sum_T P_D(T) = 1,

    listed once each (distinct token assignments; sibling order is kept,
    since rank order matters to the verifiers that scan siblings). For
    ``"iid"``, :math:`P(T) = \prod_{v \ne 0} p_{\mathrm{par}(v)}(x_v)`; for
    ``"wor"``, the product over nodes of the probabilities of their ordered
    draws without replacement (discarded draws at missing ranks summed out);
    deterministic processes give one tree with probability 1.

    Parameters
    ----------
    shape : TreeShape or Eagle2Params
    draft : Model
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
    prefix : sequence of int, keyword-only
    max_trees : int, keyword-only
        Refuse (before any model call) when the a priori bound on the number
        of trees (``V**n`` for ``"iid"``; the product over nodes of the
        numbers of ordered draws without replacement for ``"wor"``) exceeds it.

    Returns
    -------
    list of (DraftTree, float)
        Trees of positive probability, in lexicographic order of their
        draws; the probabilities sum to 1 (to rounding).

    Raises
    ------
    TypeError, ValueError
        As :func:`sample_tree`; the bound above ``max_trees``.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import TreeShape, enumerate_trees
    >>> trees = enumerate_trees(TreeShape([(0,), (1,)]), MemorylessModel([0.5, 0.5]), process="iid")
    >>> [(t.tokens.tolist(), w) for t, w in trees]
    [([-1, 0, 0], 0.25), ([-1, 0, 1], 0.25), ([-1, 1, 0], 0.25), ([-1, 1, 1], 0.25)]
    """
    process, V, ctx, shape = _setup(shape, draft, process, prefix)
    max_trees = validate_positive_int(max_trees, "max_trees")
    laws = LawCache(draft, V, ctx, "draft")
    if process == "topk":
        return [(_topk_tree(shape, laws), 1.0)]
    if process == "eagle2":
        return [(_eagle2_tree(shape, laws), 1.0)]
    bound = _count_bound(shape, process, V)
    if bound > math.log(max_trees) + 1e-9:
        raise ValueError(
            f"enumerating the {process!r} trees of a {shape.n}-node shape at V={V} may list about "
            f"e**{bound:.4g} trees, above the stated limit `max_trees`={max_trees}"
        )
    groups = _child_groups(shape)
    out: list = []
    tokens = np.full(shape.n + 1, -1, dtype=np.int64)
    paths: list = [()] * (shape.n + 1)

    def options(par, ch, ranks):
        p = laws(paths[par])
        if process == "iid":
            support = np.flatnonzero(p > 0).tolist()
            for combo in itertools.product(support, repeat=len(ch)):
                yield combo, math.prod(float(p[t]) for t in combo)
        else:
            need = max(ranks) + 1
            if np.count_nonzero(p > 0) < need:
                raise _support_error("wor", need, paths[par], p)
            merged: dict = {}
            for seq, w in _wor_sequences(p, need):
                key = tuple(seq[r] for r in ranks)
                merged[key] = merged.get(key, 0.0) + w
            yield from merged.items()

    def walk(g: int, w: float) -> None:
        if g == len(groups):
            out.append((DraftTree(shape, shape.parents, tokens.copy()), w))
            return
        par, ch, ranks = groups[g]
        for combo, wc in options(par, ch, ranks):
            if wc <= 0:
                continue
            for c, t in zip(ch, combo):
                tokens[c] = t
                paths[c] = paths[par] + (int(t),)
            walk(g + 1, w * wc)

    walk(0, 1.0)
    return out


def tree_laws(tree: DraftTree, draft, target, *, prefix=()) -> tuple[np.ndarray, np.ndarray]:
    r"""The draft's and the target's next-token laws at every node of a realised tree.

    .. math::

        \mathrm{p\_nodes}[i] = M_s(\cdot \mid \text{prefix}, x_{1:d(i)}(i)),\qquad
        \mathrm{q\_nodes}[i] = M_b(\cdot \mid \text{prefix}, x_{1:d(i)}(i)),

    row 0 at the context; what one draft call per depth and one
    tree-attention target call return.

    Parameters
    ----------
    tree : DraftTree
    draft, target : Model
        Same vocabulary.
    prefix : sequence of int, keyword-only

    Returns
    -------
    p_nodes, q_nodes : (n + 1, V) ndarray of float64

    Raises
    ------
    TypeError, ValueError
        ``tree`` not a DraftTree, models on different vocabularies, a token
        or prefix outside the vocabulary, a model law that is not a law.

    Examples
    --------
    >>> from otspec.models import MemorylessModel
    >>> from otspec.tree import DraftTree, tree_laws
    >>> P, Q = tree_laws(DraftTree.from_paths([(1,)]), MemorylessModel([0.5, 0.5]), MemorylessModel([0.2, 0.8]))
    >>> P.shape, Q[1].tolist()
    ((2, 2), [0.2, 0.8])
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"`tree` must be a DraftTree, got {type(tree).__name__}")
    V = validate_model_pair(draft, target)
    ctx = validate_sequence(prefix, V, "prefix")
    tree.check_vocab(V)
    return _laws_of(tree, LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target"))


def _laws_of(tree: DraftTree, dlaws: LawCache, tlaws: LawCache) -> tuple[np.ndarray, np.ndarray]:
    paths = tree.paths()
    P = np.stack([dlaws(s) for s in paths])
    Q = np.stack([tlaws(s) for s in paths])
    return P, Q
