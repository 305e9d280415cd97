r"""check_tree_sampler: certify or refute the losslessness of any draft-tree verifier.

The harness draws a realised draft tree :math:`T` from a draft process (its
exact law, by enumeration of the realised trees), computes the draft's and
the target's laws at every node, hands them to the user's tree sampler,
completes the emitted tokens (the accepted root path plus the correction or
bonus token) with the target model up to ``max_depth + 1`` tokens, and tests
the law of the completed sequence against the target model's joint law:

.. math::

    T \sim D(\text{shape}, M_s),\quad (a, y) = \mathrm{step}(T, p_{\rm nodes}, q_{\rm nodes}),\quad
    Z = \big(x_{1:d(a)}(a),\ y,\ W\big),\ W \sim M_b(\cdot \mid x_{1:d(a)}(a), y),
    \qquad H_0:\ Z \sim M_b \text{ on } \Omega^{D+1},

losslessness in the form of SpecTr's Theorem 3 (Sun et al., NeurIPS 2023) and
of SpecInfer's Theorem 4.2 (Miao et al., arXiv:2305.09781): the emitted
tokens, continued by the target, follow the target.

It also converts between :class:`~otspec.tree.DraftTree` and SGLang's
first-child / next-sibling arrays, and wraps a function with the signature
of SGLang's tree verification kernel into a tree step.

Notation: ``p`` is the draft law and ``q`` the target law at a node.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, fields

import numpy as np

from .._validation import as_array, as_rng, validate_bool, validate_positive_int, validate_probability
from ..models import (
    MAX_ENUMERATION,
    conditional_tables,
    joint_from_tables,
    size_exceeds,
    size_text,
    validate_model_pair,
    validate_sequence,
)
from ..tree import DraftTree, TreeVerifier, enumerate_trees
from ..tree._process import LawCache, as_tree_shape, validate_process
from ._block import _Tables
from ._sampler import (
    CHUNK,
    SamplerCheck,
    StepError,
    Violation,
    _call,
    _coin_rngs,
    _describe,
    _finish,
    _phases,
    _plan,
    _to_numpy,
)

__all__ = [
    "MAX_HARNESS_TREES",
    "TreeSamplerCheck",
    "check_tree_sampler",
    "from_sglang_kernel",
    "sglang_tree_arrays",
    "tree_from_sglang",
]

#: Default largest number of realised trees :func:`check_tree_sampler` enumerates (each is held
#: with its ``(n + 1, V)`` laws; the enumeration's a priori bound is checked before any model call).
MAX_HARNESS_TREES = 50_000
@dataclass(frozen=True, eq=False, repr=False)  # the repr of SamplerCheck (no arrays)
class TreeSamplerCheck(SamplerCheck):
    r"""Result of :func:`check_tree_sampler`: a :class:`SamplerCheck` over completed sequences, and the tree facts.

    Every field of :class:`~otspec.testing.SamplerCheck` (``passed``,
    ``pvalue``, ``n_samples``, ``outside_support``, ``tv_estimate``,
    ``detectable_tv``, ``violation``, ``message``, ...) with the cells the
    :math:`V^{D+1}` completed sequences in C order, and:

    Attributes
    ----------
    worst_cells : tuple of CellResidual
        The completed sequences with the largest standardised residuals
        :math:`(O - E) / \sqrt{E}` in the frequency phase (``cell`` is the
        sequence; an emitted sequence outside the target's support has ``inf``).
    n_trees : int
        Realised trees of positive probability the draft process can give.
    max_depth : int
        The shape's largest depth ``D`` (sequences have ``D + 1`` tokens).
    process : str
        The draft process.
    mean_accepted : float
        Mean number of accepted draft tokens (depth of the returned node)
        over the frequency phase: comparable with :func:`otspec.tree.value`.
    accepted_se : float
        Its standard error.
    """

    n_trees: int = 0
    max_depth: int = 0
    process: str = ""
    mean_accepted: float = math.nan
    accepted_se: float = math.nan


class _Prefixed:
    """A model continued after a fixed context: ``next_dist(s) = model.next_dist(prefix + s)``."""

    def __init__(self, model, prefix: tuple[int, ...]):
        self.model, self.prefix = model, prefix
        self.vocab_size = model.vocab_size
        ml = getattr(model, "max_len", None)
        if ml is not None:
            self.max_len = ml - len(prefix)

    def next_dist(self, s):
        return self.model.next_dist(self.prefix + tuple(s))


def _validate_step(step):
    if isinstance(step, TreeVerifier):
        v = step

        def run(tree, p_nodes, q_nodes, rng):
            return v.sample(tree, p_nodes, q_nodes, rng=rng, validate=False)

        return run
    if not callable(step):
        raise TypeError(
            "`step` must be a callable step(tree, p_nodes, q_nodes, rng) -> (node, token) or a "
            f"otspec.tree.TreeVerifier, got {type(step).__name__}"
        )
    return step


def _node_token(out, n: int, V: int, shown, phase: str) -> tuple[int, int]:
    """``(node, token)`` from a tree step: two integers, node in [0, n], token in [0, V)."""
    vals = out
    if hasattr(out, "shape") and not isinstance(out, (tuple, list)):
        vals = _to_numpy(out).reshape(-1).tolist() if np.ndim(_to_numpy(out)) == 1 else None
    ok = isinstance(vals, (tuple, list)) and len(vals) == 2
    if ok:
        items = []
        for x in vals:
            if hasattr(x, "shape") and tuple(x.shape) == ():
                x = _to_numpy(x)[()]
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
                ok = False
                break
            items.append(int(x))
    if not ok:
        raise StepError(
            f"`step` must return (node, token), two ints, got {_describe(out)} ({type(out).__name__}) for the "
            f"tree {shown} ({phase} phase)",
            drafts=shown, phase=phase,
        )
    node, token = items
    if not 0 <= node <= n:
        raise StepError(
            f"`step` returned node {node}, not a node id of the tree [0, {n}], for the tree {shown} ({phase} phase)",
            drafts=shown, phase=phase,
        )
    if not 0 <= token < V:
        raise StepError(
            f"`step` returned token {token}, outside the vocabulary [0, {V}), for the tree {shown} ({phase} phase)",
            drafts=shown, phase=phase,
        )
    return node, token


def check_tree_sampler(step, shape, draft, target, *, process, prefix=(), n_samples=None, tv=0.02,
                       boundary_coins=False, alpha_fail=1e-4, max_samples=None,
                       max_trees=MAX_HARNESS_TREES, rng=None) -> TreeSamplerCheck:
    r"""Test whether a tree verifier ``step`` keeps the target model's law of ``max_depth + 1`` tokens.

    .. math::

        T \sim D(\text{shape}, M_s),\quad (a, y) = \mathrm{step}(T, p_{\rm nodes}, q_{\rm nodes}, \mathrm{rng}),
        \quad Z = \big(x_{1:d(a)}(a),\, y,\, W \sim M_b(\cdot \mid x_{1:d(a)}(a), y)\big) \in \Omega^{D+1},
        \qquad H_0:\ Z \sim M_b,

    tested by Pearson's :math:`\chi^2` over the :math:`V^{D+1}` completed
    sequences (sparse ones pooled) at false-failure rate ``alpha_fail``; an
    emitted path and token of target probability zero fails outright. The
    realised trees are drawn from the exact law of the draft process
    (:func:`otspec.tree.enumerate_trees`); ``p_nodes[i]`` and ``q_nodes[i]``
    are the draft's and the target's laws of the token after the root path of
    node ``i`` (:func:`otspec.tree.tree_laws`).

    Parameters
    ----------
    step : callable or otspec.tree.TreeVerifier
        ``step(tree, p_nodes, q_nodes, rng) -> (node, token)``: ``tree`` is a
        :class:`~otspec.tree.DraftTree` (node 0 the root; siblings in
        increasing node id, their rank order); ``p_nodes`` and ``q_nodes`` are
        read-only ``(n + 1, V)`` float64 arrays; ``rng`` is a
        :class:`numpy.random.Generator` that ``step`` must take every random
        number from (acceptance coins at every node, residual and bonus
        draws); it returns the last accepted node (0: none accepted) and the
        emitted token (correction or bonus), two ints. A
        :class:`~otspec.tree.TreeVerifier` is called through its ``sample``.
        An SGLang-style kernel is wrapped by :func:`from_sglang_kernel`.
    shape : otspec.tree.TreeShape or otspec.tree.Eagle2Params
        The tree shape (``Eagle2Params`` for ``process="eagle2"``).
    draft, target : otspec.models.Model
        Draft :math:`M_s` and target :math:`M_b` models on one vocabulary.
    process : {"iid", "wor", "topk", "eagle2"}, keyword-only
        The draft process (:data:`otspec.tree.PROCESSES`).
    prefix : sequence of int, keyword-only
        The context the tree continues.
    n_samples, tv, alpha_fail, max_samples, rng : keyword-only
        As in :func:`~otspec.testing.check_sampler`: ``n_samples=None``
        chooses the count that detects a completed-sequence law at total
        variation ``tv`` with probability 0.99 (:func:`sample_size`).
    boundary_coins : bool, keyword-only
        Run a second phase of ``n_samples`` trials whose ``rng`` is a
        :class:`~otspec.testing.BoundaryCoins` generator: every uniform the
        step draws, at every node's acceptance test and in every residual or
        bonus draw, is 0.0 or the largest value below 1 half of the time. Only
        outputs outside the target's support count there (a non-strict test
        ``u <= ratio`` accepts a child of target probability 0 on a coin of 0).
    max_trees : int, keyword-only
        Refuse (before any model call) a draft process with more realised
        trees than this (:data:`MAX_HARNESS_TREES`).

    Returns
    -------
    TreeSamplerCheck
        ``passed``, ``pvalue``, ``n_samples``, ``outside_support``,
        ``tv_estimate``, ``detectable_tv``, ``worst_cells``,
        ``mean_accepted``, the first ``violation`` (its ``drafts`` are the
        tree's token paths, its ``output`` the emitted path and token) and a
        one-line ``message``.

    Raises
    ------
    TypeError, ValueError
        ``step`` not callable; bad models, shape, process or prefix;
        ``V**(D+1)`` above :data:`otspec.models.MAX_ENUMERATION`; more
        realised trees than ``max_trees``; ``tv``, ``alpha_fail``,
        ``n_samples`` or ``max_samples`` as in :func:`check_sampler`.
    StepError
        ``step`` raised (the message names the tree), returned something that
        is not ``(node, token)`` with a node of the tree and a token in
        ``[0, V)``, or wrote to ``p_nodes`` / ``q_nodes``.

    See Also
    --------
    otspec.tree.check_lossless : exact enumeration for a verifier's exact emission law.
    check_block_sampler : the same test for one draft block.

    Notes
    -----
    The guarantee is for the law on the tested cells (pooled rare sequences
    tested as one) and for the trees the process gives. Every trial that
    realises the same tree receives the same ``DraftTree`` object and the
    same read-only law arrays. ``step`` is called once per trial; the
    harness adds a few tens of microseconds per trial to the step's own
    time, and the sample-size rule asks 7,501 trials at ``tv=0.05`` for
    :math:`V^{D+1} = 27` sequences (1,876 at ``tv=0.1``).

    References
    ----------
    .. [1] Miao et al., "SpecInfer: Accelerating Large Language Model Serving
       with Tree-based Speculative Inference and Verification",
       arXiv:2305.09781, §4 (Theorem 4.2: multi-step speculative sampling
       preserves the target's law on a token tree).
    .. [2] Sun et al., "SpecTr: Fast Speculative Decoding via Optimal
       Transport", NeurIPS 2023, Theorem 3 (the decoded tokens completed by
       the target follow the target's joint law).

    Examples
    --------
    >>> from otspec.models import random_table_model
    >>> from otspec.testing import check_tree_sampler
    >>> from otspec.tree import SpecInferVerifier, TreeShape
    >>> draft, target = random_table_model(3, 3, rng=1), random_table_model(3, 3, rng=2)
    >>> shape = TreeShape([(0,), (1,), (0, 0)])
    >>> res = check_tree_sampler(SpecInferVerifier(), shape, draft, target, process="iid", tv=0.1, rng=0)
    >>> res.passed, res.n_samples, res.n_trees
    (True, 1876, 27)
    """
    step = _validate_step(step)
    shape = as_tree_shape(shape, process)
    V = validate_model_pair(draft, target)
    process = validate_process(process, shape)
    ctx = validate_sequence(prefix, V, "prefix")
    boundary_coins = validate_bool(boundary_coins, "boundary_coins")
    validate_probability(tv, "tv", low_open=True)
    validate_probability(alpha_fail, "alpha_fail", low_open=True, high_open=True)
    max_trees = validate_positive_int(max_trees, "max_trees")
    D = int(shape.max_depth)
    if size_exceeds(V, D + 1, MAX_ENUMERATION):  # no big integer V**(D+1)
        raise ValueError(
            f"check_tree_sampler tests the law of V**(max_depth+1) = {V}**{D + 1} = {size_text(V, D + 1)} completed "
            f"sequences, above the stated limit otspec.models.MAX_ENUMERATION={MAX_ENUMERATION}; use a shallower "
            "shape or a smaller vocabulary"
        )
    tables = conditional_tables(_Prefixed(target, ctx), D + 1, name="target")
    law = joint_from_tables(tables).reshape(-1)
    law.setflags(write=False)
    N, tv, alpha_fail = _plan(law, n_samples, tv, alpha_fail, "completed sequences'", max_samples, False)
    trees = enumerate_trees(shape, draft, process=process, prefix=ctx, max_trees=max_trees)
    dl, tl = LawCache(draft, V, ctx, "draft"), LawCache(target, V, ctx, "target")
    laws, paths, shown = [], [], []
    for T, _ in trees:
        paths.append(T.paths())
        P, Q = np.stack([dl(s) for s in paths[-1]]), np.stack([tl(s) for s in paths[-1]])
        P.setflags(write=False)
        Q.setflags(write=False)
        laws.append((T, P, Q))
        shown.append(tuple(paths[-1][1:]))
    cum = np.cumsum([w for _, w in trees])
    gen = as_rng(rng)
    Tb = _Tables(tables)
    rngs = _coin_rngs(gen, boundary_coins)
    zero = law <= 0
    violation = None
    depth_sum = [0.0, 0.0]

    def call_step(tpq, r):
        return step(tpq[0], tpq[1], tpq[2], r)

    def run(n, harness_rng, step_rng, phase):
        nonlocal violation
        counts = np.zeros(law.shape[0], dtype=np.int64)
        done = 0
        while done < n:
            B = min(CHUNK, n - done)
            which = np.minimum(np.searchsorted(cum, harness_rng.random(B) * cum[-1], side="right"), len(cum) - 1)
            seqs = np.full((B, D + 1), -1, dtype=np.int64)
            lengths = np.empty(B, dtype=np.int64)
            for i, j in enumerate(which.tolist()):
                out = _call(call_step, laws[j], step_rng, phase, shown[j])
                node, token = _node_token(out, laws[j][0].n, V, shown[j], phase)
                s = paths[j][node] + (token,)
                seqs[i, : len(s)] = s
                lengths[i] = len(s)
            if phase == "frequency":
                acc = lengths - 1
                depth_sum[0] += float(acc.sum())
                depth_sum[1] += float((acc * acc).sum())
            cells = Tb.complete(seqs, lengths, harness_rng)  # with the target model
            if violation is None and zero[cells].any():
                i = int(np.argmax(zero[cells]))
                violation = Violation(phase, shown[int(which[i])], tuple(int(t) for t in seqs[i, : lengths[i]]))
            counts += np.bincount(cells, minlength=law.shape[0])
            done += B
        return counts

    counts, outside_b = _phases(run, N, rngs, zero)
    base = _finish(counts, law, n_samples=N, alpha_fail=alpha_fail, outside_b=outside_b,
                   n_boundary=N if boundary_coins else 0, violation=violation, what="completed sequences'",
                   shape=(V,) * (D + 1))
    mean = depth_sum[0] / N
    var = max(depth_sum[1] / N - mean * mean, 0.0)
    core = {f.name: getattr(base, f.name) for f in fields(base)}
    return TreeSamplerCheck(**core, n_trees=len(trees), max_depth=D, process=process,
                            mean_accepted=mean, accepted_se=math.sqrt(var / N))


# ---------------------------------------------------------------------------
# SGLang's first-child / next-sibling arrays and its tree verification kernel
# ---------------------------------------------------------------------------


def sglang_tree_arrays(tree) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""SGLang's arrays for one request: ``candidates``, ``retrive_index``, ``retrive_next_token``, ``retrive_next_sibling``.

    .. math::

        \mathrm{next\_token}[v] = \min \mathrm{children}(v),\qquad
        \mathrm{next\_sibling}[c] = \min\{c' > c : \mathrm{par}(c') = \mathrm{par}(c)\}

    (-1 where none), the first-child / next-sibling encoding SGLang's EAGLE
    verification walks; node ``i`` of the tree is SGLang's local index ``i``
    (index 0 the root, the last verified token), ``retrive_index = arange``.

    Parameters
    ----------
    tree : otspec.tree.DraftTree

    Returns
    -------
    candidates, retrive_index, retrive_next_token, retrive_next_sibling : (n + 1,) ndarray of int64
        ``candidates[0]`` is 0 (SGLang puts the last verified token there; the
        kernel never reads it), ``candidates[i] = tree.tokens[i]``.

    Raises
    ------
    TypeError
        ``tree`` not a DraftTree.

    References
    ----------
    .. [1] SGLang, ``python/sglang/srt/speculative/eagle_info.py``,
       ``EagleVerifyInput`` (``retrive_index``, ``retrive_next_token``,
       ``retrive_next_sibling``) and ``build_tree_kernel_efficient``.

    Examples
    --------
    >>> from otspec.testing import sglang_tree_arrays
    >>> from otspec.tree import DraftTree
    >>> t = DraftTree.from_paths([(5,), (7,), (5, 2)])
    >>> [a.tolist() for a in sglang_tree_arrays(t)]
    [[0, 5, 7, 2], [0, 1, 2, 3], [1, 3, -1, -1], [-1, 2, -1, -1]]
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"`tree` must be a DraftTree, got {type(tree).__name__}")
    first, nxt = tree.next_token_sibling()
    cand = np.array(tree.tokens, dtype=np.int64)
    cand[0] = 0
    return cand, np.arange(tree.n + 1, dtype=np.int64), first, nxt


def _index_array(x, name: str) -> np.ndarray:
    # lists through as_array: [0, True, 2] (read as [0, 1, 2]) is refused like a boolean array
    arr = _to_numpy(x) if not isinstance(x, (list, tuple)) else as_array(x, name, "a 1-D array of integers")
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D (one request), got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"`{name}` must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def tree_from_sglang(candidates, retrive_next_token, retrive_next_sibling) -> tuple[DraftTree, np.ndarray]:
    r"""The :class:`~otspec.tree.DraftTree` of SGLang's first-child / next-sibling arrays (one request).

    .. math::

        \mathrm{children}(v) = (c_1, c_2, \dots),\quad c_1 = \mathrm{next\_token}[v],\
        c_{j+1} = \mathrm{next\_sibling}[c_j] \text{ until } -1,

    walked breadth first from SGLang's index 0 (the root); the nodes are
    renumbered in that order (parents first, siblings in list order, which
    is their rank order).

    Parameters
    ----------
    candidates : (m,) array_like of int
        SGLang's ``candidates`` row (entry 0, the last verified token, is ignored).
    retrive_next_token, retrive_next_sibling : (m,) array_like of int
        First child and next sibling of each SGLang index, -1 if none.

    Returns
    -------
    tree : DraftTree
    order : (n + 1,) ndarray of int64
        ``order[i]`` is the SGLang index of node ``i`` (``order[0] = 0``);
        permute rows of SGLang's per-node laws with it (``target_probs[order]``).

    Raises
    ------
    TypeError, ValueError
        Arrays that are not 1-D integer arrays of one length, an index out of
        range, a node reached twice (a cycle or a shared child), a node not
        reachable from index 0, or a negative candidate token.

    Examples
    --------
    >>> import numpy as np
    >>> from otspec.testing import sglang_tree_arrays, tree_from_sglang
    >>> from otspec.tree import DraftTree
    >>> t = DraftTree.from_paths([(5,), (7,), (5, 2)])
    >>> back, order = tree_from_sglang(*[a for i, a in enumerate(sglang_tree_arrays(t)) if i != 1])
    >>> back == t, order.tolist()
    (True, [0, 1, 2, 3])
    >>> back, order = tree_from_sglang([0, 2, 5, 7], [2, -1, 1, -1], [-1, -1, 3, -1])
    >>> back.paths()[1:], order.tolist()
    ([(5,), (7,), (5, 2)], [0, 2, 3, 1])
    """
    cand = _index_array(candidates, "candidates")
    nt = _index_array(retrive_next_token, "retrive_next_token")
    ns = _index_array(retrive_next_sibling, "retrive_next_sibling")
    m = cand.shape[0]
    if m < 1 or nt.shape[0] != m or ns.shape[0] != m:
        raise ValueError(
            "`candidates`, `retrive_next_token` and `retrive_next_sibling` must have one length >= 1, got "
            f"{cand.shape[0]}, {nt.shape[0]}, {ns.shape[0]}"
        )
    for name, a in (("retrive_next_token", nt), ("retrive_next_sibling", ns)):
        bad = np.flatnonzero((a < -1) | (a >= m) | (a == 0))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"`{name}[{i}]` = {int(a[i])} is not an index in [1, {m}) nor -1")
    seen = np.zeros(m, dtype=bool)
    seen[0] = True
    order, parents = [0], [-1]
    k = 0
    while k < len(order):  # breadth first, parents before children
        c = int(nt[order[k]])
        while c != -1:
            if seen[c]:
                raise ValueError(f"SGLang index {c} is reached twice: the arrays do not describe a tree")
            seen[c] = True
            order.append(c)
            parents.append(k)
            c = int(ns[c])
        k += 1
    if not seen.all():
        i = int(np.argmin(seen))
        raise ValueError(f"SGLang index {i} is not reachable from index 0 through `retrive_next_token` / "
                         "`retrive_next_sibling`")
    idx = np.array(order, dtype=np.int64)
    tokens = cand[idx]
    tokens[0] = -1
    if m > 1 and tokens[1:].min() < 0:
        i = int(idx[1 + int(np.argmin(tokens[1:]))])
        raise ValueError(f"`candidates[{i}]` must be a token id >= 0, got {int(cand[i])}")
    return DraftTree(None, parents, tokens), idx


def _positive_float(x, name: str) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real) or not math.isfinite(float(x)) or x <= 0:
        raise ValueError(f"`{name}` must be a finite float > 0, got {x!r}")
    return float(x)


def from_sglang_kernel(fn, *, threshold_single=1.0, threshold_acc=1.0, deterministic=True, dtype="float32",
                       device="cpu"):
    r"""A tree step for :func:`check_tree_sampler` from a function with the signature of SGLang's tree kernel.

    .. math::

        \mathrm{fn}(\text{predicts}, \text{accept\_index}, \text{accept\_token\_num},
        \text{candidates}, \text{retrive\_index}, \text{retrive\_next\_token},
        \text{retrive\_next\_sibling}, \text{uniform\_samples},
        \text{uniform\_samples\_for\_final\_sampling}, \text{target\_probs},
        \text{draft\_probs}, \text{threshold\_single}, \text{threshold\_acc},
        \text{deterministic})

    (SGLang's ``tree_speculative_sampling_target_only``, called by keyword as
    ``EagleVerifyInput.verify`` calls it), for one request: the tree through
    :func:`sglang_tree_arrays`, ``target_probs`` the ``(1, n + 1, V)`` node
    laws ``q_nodes``, ``draft_probs`` zeros (SGLang's target-only path), the
    coins ``uniform_samples`` ``(1, n + 1)`` and the final coin ``(1,)`` drawn
    from the harness's ``rng`` in ``dtype`` (so boundary coins reach every
    node's test), ``accept_index`` of shape ``(1, max_depth + 1)``. The step
    reads back the accepted node ``accept_index[0, accept_token_num[0]]`` and
    the emitted token ``predicts`` there, after checking that the accepted
    indices form a root path whose tokens ``predicts`` repeats.

    Parameters
    ----------
    fn : callable
        The kernel or a re-implementation (torch tensors in, written in place).
    threshold_single, threshold_acc : float, keyword-only
        Passed through (SGLang's ``speculative_accept_threshold_single`` /
        ``_acc``; 1.0, the default, is SGLang's lossless setting).
    deterministic : bool, keyword-only
        Passed through.
    dtype : {"float32", "float64"}, keyword-only
        Float type of the probabilities and coins (SGLang: float32).
    device : str, keyword-only
        Torch device of the tensors (``"cuda"`` for the real kernel).

    Returns
    -------
    callable
        ``step(tree, p_nodes, q_nodes, rng) -> (node, token)``.

    Raises
    ------
    TypeError, ValueError
        ``fn`` not callable, thresholds not positive finite floats, an unknown
        ``dtype``. The returned step raises ValueError when the kernel's
        outputs are inconsistent (an accepted index that is not a child of the
        previous one, ``predicts`` not repeating the accepted tokens); the
        harness reports it as a StepError naming the tree.

    References
    ----------
    .. [1] SGLang, ``sgl-kernel/csrc/speculative/speculative_sampling.cuh``
       and ``python/sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``,
       ``TreeSpeculativeSamplingTargetOnly``; the caller
       ``python/sglang/srt/speculative/eagle_info.py``, ``EagleVerifyInput.verify``.

    Examples
    --------
    A stand-in with the kernel's signature that accepts nothing and emits the
    target's most likely token at the root (not lossless):

    >>> import numpy as np
    >>> import pytest
    >>> torch = pytest.importorskip("torch")
    >>> from otspec.testing import from_sglang_kernel
    >>> from otspec.tree import DraftTree
    >>> def greedy_root(predicts, accept_index, accept_token_num, candidates, retrive_index,
    ...                 retrive_next_token, retrive_next_sibling, uniform_samples,
    ...                 uniform_samples_for_final_sampling, target_probs, draft_probs,
    ...                 threshold_single, threshold_acc, deterministic):
    ...     accept_token_num[0] = 0
    ...     accept_index[0, 0] = 0
    ...     predicts[0] = int(torch.argmax(target_probs[0, 0]))
    >>> step = from_sglang_kernel(greedy_root)
    >>> t = DraftTree.from_paths([(0,)])
    >>> step(t, np.full((2, 2), 0.5), np.array([[0.3, 0.7], [0.5, 0.5]]), np.random.default_rng(0))
    (0, 1)
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be a callable with the signature of SGLang's kernel, got {type(fn).__name__}")
    ts = _positive_float(threshold_single, "threshold_single")
    ta = _positive_float(threshold_acc, "threshold_acc")
    deterministic = validate_bool(deterministic, "deterministic")
    if dtype not in ("float32", "float64"):
        raise ValueError(f"`dtype` must be 'float32' or 'float64', got {dtype!r}")
    np_dtype = np.float32 if dtype == "float32" else np.float64

    structure: dict = {}  # SGLang's index arrays per realised tree (copied for every call)

    def step(tree, p_nodes, q_nodes, rng):
        import torch

        n1, steps, V = tree.n + 1, int(tree.max_depth), q_nodes.shape[1]
        ints = structure.get(tree)
        if ints is None:
            if len(structure) >= 4096:
                structure.clear()
            ints = structure[tree] = np.stack(sglang_tree_arrays(tree))[:, None, :]
        idx = torch.from_numpy(ints.copy()).to(device)
        outs = torch.from_numpy(np.full(n1 + steps + 3, -1, dtype=np.int32)).to(device)
        predicts, accept_index = outs[: n1 + 1], outs[n1 + 1: n1 + steps + 2].view(1, steps + 1)
        accept_token_num = outs[n1 + steps + 2:]
        accept_token_num.zero_()
        coins = torch.from_numpy(rng.random((1, n1 + 1), dtype=np_dtype)).to(device)
        fn(
            predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
            candidates=idx[0], retrive_index=idx[1], retrive_next_token=idx[2], retrive_next_sibling=idx[3],
            uniform_samples=coins[:, :n1], uniform_samples_for_final_sampling=coins[0, n1:],
            target_probs=torch.from_numpy(np.array(q_nodes, dtype=np_dtype, copy=True)[None]).to(device),
            draft_probs=torch.zeros((1, n1, V), dtype=coins.dtype, device=device),
            threshold_single=ts, threshold_acc=ta, deterministic=deterministic,
        )
        num = int(accept_token_num[0])
        acc = accept_index[0].cpu().numpy()
        pred = predicts.cpu().numpy()
        if not 0 <= num <= steps:
            raise ValueError(f"the kernel returned accept_token_num {num}, outside [0, {steps}]")
        path = [int(a) for a in acc[: num + 1]]
        if path[0] != 0:
            raise ValueError(f"the kernel's accept_index[0, 0] must be the root's index 0, got {path[0]}")
        for j in range(1, num + 1):
            c = path[j]
            if not 0 < c < n1 or int(tree.parents[c]) != path[j - 1]:
                raise ValueError(f"the kernel's accepted indices {path} are not a root path of the tree")
            if int(pred[path[j - 1]]) != int(tree.tokens[c]):
                raise ValueError(f"the kernel's predicts[{path[j - 1]}] = {int(pred[path[j - 1]])} is not the "
                                 f"accepted token {int(tree.tokens[c])}")
        return path[-1], int(pred[path[-1]])

    return step
