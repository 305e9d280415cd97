r"""Draft trees on the models' device: drafting, the laws, the verification and the residual draw in torch.

The device route of :func:`otspec.decoding.speculative_decode` with ``tree=`` (``engine="torch"``, the
default where it exists): static tree shapes (:class:`otspec.tree.TreeShape`) filled by the processes
``"iid"``, ``"wor"`` or ``"topk"``, and EAGLE-2's dynamic trees (:class:`otspec.tree.Eagle2Params`,
``"eagle2"``: :class:`Eagle2TreeT`, :class:`Eagle2StepT`), verified by SpecInfer's rule (``"specinfer"``),
Sequoia's (``"sequoia"``) or the target-only rule (``"target-only"``). One iteration on a context
``x_{1:T}``:

1. **Draft, one call per depth**, as the host route (:mod:`otspec.decoding._tree_loop`): the frontier's
   tokens are fed from a device tensor; the children are drawn there -- i.i.d. by :func:`draw_rows`,
   without replacement as the ``need`` largest of :math:`p(x) / E_x` (:math:`E_x` i.i.d. ``Exp(1)``: the
   exponential race, whose order is the sequential draws without replacement), the top-ranked by
   ``torch.topk`` (ties among equal probabilities as ``torch.topk`` breaks them; the host route takes the
   lower id); top-k children verified by the target-only rule rank by the draft's logits (the order of
   its own law), so no float64 draft law is formed at all.
2. **Target, one call** (:meth:`~otspec.decoding.HFCausalLM.tree_logits`) on the tree's ``n + 1`` token
   ids as a device tensor: no host read before it (every id lies in ``[0, V)`` whatever the draft laws, so
   the call is harmless where a flag below refuses the iteration); its logits stay on the device.
3. (Nothing read: the flags of bad draft laws or too small supports wait for step 5.)
4. **Verify on the device** (:func:`node_rules_t`, :func:`verify_tree_t`): the float64 target laws are
   formed at the nodes with children only (and at the accepted node when it is a leaf: its bonus token);
   every such node's per-child acceptance probabilities come at once, in the closed form of the package's
   verifiers (one pass over ``V`` per rejection and node, nothing written), one uniform per child decides
   each node's outcome, a walk of ``L`` gathers finds the accepted node, and one draw from its residual
   (formed for that node only) or, at a leaf, from its ``q`` gives the emitted token.
5. **One host read**: the accepted node, the emitted token and the tree's token ids (the path of the
   accepted node, the rows the draft's cache keeps), with the flags of bad draft laws, too small supports
   and bad target laws (a draft flag is raised first, as the host route refuses it before the target call).

So one host read per iteration, ``n + 3`` integers and the flags; the ``(n + 1, V)`` laws never leave the
device. On the CPU, where reading a tensor waits for nothing, the accepted node is also read before its residual
(``TreeStepT.read_on_host``): its rows are read in place and its residual's level chosen once (:func:`verify_tree_t`'s
``host``), the target's laws of EAGLE-2's slots without children are not formed (the target-only rule reads none of
them), and the rows are copied from the logits without a gathered copy; SpecInfer's and Sequoia's rules, the walk
and the accepted node's law run in Python floats on a few numbers per child read there (:func:`_verify_host`), and the
steps' blocks are handed on from one decode to the next (:class:`_BlockPool`). Where numba is installed (the ``fast``
extra) the passes over ``V`` after the laws are numba kernels that read the rows and write nothing: each rejection's
level mass at the rows it may move in one read (:func:`_level_sums`), the draws without replacement and the i.i.d.
draws from running sums never written (:func:`_wor_rows`, :func:`_iid_rows`; Sequoia's draft totals are their first
totals), the accepted node's residual or bonus token by one read for its total (:func:`_residual_draw`): each
row's running sums are added once, only their values at the ends of blocks of :data:`CDF_BLOCK` tokens kept
(:func:`_cum_from`), and a draw adds again at most one block from the checkpoint before it (:func:`_cum_find`). The
draws are those of the accelerator's route bit for bit where
their inputs are (each term rounded as ``addcmul`` rounds it, the running sums added in order as ``torch.cumsum``);
the level masses and the draft totals are sums of the same terms in another order than torch's ``sum``, so the
acceptances and the logged predictions agree with that route's to rounding (1e-12 relative in the tests) and a child
is decided otherwise only where its uniform falls within rounding of its acceptance probability. Without numba torch's
passes run, and every draw and prediction is that route's bit for bit (tests/test_tree_decoding_lazy.py,
tests/test_tree_decoding_passes.py, tests/test_tree_decoding_kernels.py).

An EAGLE-2 tree is chosen on the device (the top-k of cumulative scores per level, the reranking to
``n`` nodes: :class:`Eagle2TreeT`); the target scores it from its ``parents`` and tokens as device tensors
(its attention mask built there), the rules run on a layout of its expanded nodes (:class:`Eagle2LayoutT`),
and the one read also brings its parents and the draft's cache rows.
The exact prediction of the iteration (the law of the accepted node's depth given the realised tree, the
verifier's :meth:`~otspec.tree.TreeVerifier.emission` summed over tokens) comes from the same acceptance
probabilities on the device, is logged there as ``L + 2`` numbers and read once after the loop; the
optimum :math:`\alpha_K` at the root (a sort) is computed from kept root laws in batches outside the wall
time, or skipped (``log_laws=False``).

Exactness: the rules are those of :class:`otspec.tree.SpecInferVerifier`,
:class:`otspec.tree.SequoiaVerifier` and :class:`otspec.tree.TargetOnlyVerifier` (the tests hold the
per-node laws against their ``emission`` to 1e-12 and the samples against them by chi-square), in their
closed form :math:`(q - t p)_+ / S(t)` of the residual after each rejection (Miao et al., SpecInfer,
arXiv:2305.09781, §4, Algorithm 2; Chen et al., Sequoia, arXiv:2402.12374, §3.2; the target-only rule of SGLang's
``tree_speculative_sampling_target_only``). The draws follow vLLM's v1 rejection sampler
(``vllm/v1/sample/rejection_sampler.py``): uniforms against the ratio, the residual drawn unnormalised and
unsorted (:func:`draw_rows`).

Notation: ``p`` is the draft law and ``q`` the target law, as everywhere in otspec.
"""

from __future__ import annotations

import math
import threading

import numpy as np

import otspec
import otspec.tree

from .._jit import HAVE_NUMBA, compile_in
from ..tree._process import _support_error
from ..tree._verifiers import SequoiaVerifier, SpecInferVerifier, TargetOnlyVerifier
from ._deps import require
from ._sampling import _CONSTANTS, Sampling, _arange, _block, _laws_into, _ones, _scalar, bad_rows, draw_rows
from ._tree_loop import _common, _is_repeat

torch = require("torch", "otspec.decoding")

__all__ = ["DEVICE_TREE_PROCESSES", "DEVICE_TREE_VERIFIERS", "Eagle2LayoutT", "Eagle2StepT", "Eagle2TreeT",
           "RANK_BY_MAXIMA", "TreeLayoutT", "TreeStepT", "device_tree_step", "has_device_route", "node_rules_t", "ranked_rows_t",
           "residual_rows_t", "verify_tree_t"]

#: Draft processes the device route fills trees with (static shapes).
DEVICE_TREE_PROCESSES = ("iid", "wor", "topk", "eagle2")
#: Tree verifiers the device route runs (by their registered names).
DEVICE_TREE_VERIFIERS = ("specinfer", "sequoia", "target-only")
_RULES = {SpecInferVerifier: "specinfer", SequoiaVerifier: "sequoia", TargetOnlyVerifier: "target-only"}
_OWN = Sampling()  # the model's own law (temperature 1, untruncated): what EAGLE-2 ranks by



class _BlockPool:
    """The tree steps' blocks (:func:`~otspec.decoding._sampling._block`'s dicts) handed on from one decode to the next
    on the CPU, as CUDA's caching allocator hands on device memory: torch's CPU allocator gives a large block back to
    the system when it is freed, so every decode's blocks were fresh memory whose first writes page-fault (the ring of
    kept root logits: two rows of ``4 V`` bytes an iteration, 0.35 ms at ``V = 128,256``; each law block its first
    iteration). A step takes a dict when built and gives it back at :meth:`TreeStepT.finish`; a dict holding any
    tensor off the CPU is dropped (CUDA caches its memory already), and at most ``keep`` dicts are kept. What a block
    held before is never read: every block is written before it is read in an iteration."""

    def __init__(self, keep: int = 2):
        self.keep, self.free, self.lock = keep, [], threading.Lock()

    def take(self):
        """A dict of blocks and its lease (the token :meth:`give` checks: a dict is given back once, by its taker)."""
        lease = object()
        with self.lock:
            work = self.free.pop() if self.free else {}
        work["lease"] = lease
        return work, lease

    def give(self, work: dict, lease) -> None:
        if lease is None or work.get("lease") is not lease:
            return
        del work["lease"]
        if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in work.values()):
            return
        with self.lock:
            if len(self.free) < self.keep:
                self.free.append(work)


_POOL = _BlockPool()


#: Kept roots of ``"wor"`` brought to the host by one copy when their optimum is computed (:meth:`TreeStepT._flush`):
#: ``2 * 8`` float64 rows, 16 MB at ``V = 128,256``.
WOR_FLUSH_ROOTS = 8


def has_device_route(plan) -> bool:
    """Whether a :class:`~otspec.decoding._tree_loop.TreePlan` runs on the device: a process of
    :data:`DEVICE_TREE_PROCESSES` and a verifier of :data:`DEVICE_TREE_VERIFIERS` (the package's own class)."""
    return plan.process in DEVICE_TREE_PROCESSES and type(plan.verifier) in _RULES


def device_tree_step(plan, sampling, log_laws: bool, *, law_batch: int, clock):
    """The device route's iteration for ``plan``: :class:`Eagle2StepT` for EAGLE-2's trees, else
    :class:`TreeStepT`."""
    cls = Eagle2StepT if plan.process == "eagle2" else TreeStepT
    return cls(plan, sampling, log_laws, law_batch=law_batch, clock=clock)


class TreeLayoutT:
    """The static layout of a tree shape for the device route, tensors on one device.

    ``inner`` the nodes with children (the frontiers of depths ``0..D-1`` concatenated, the order of the draft
    calls' rows), ``row_of[v]`` the row of node ``v`` in ``inner`` (-1 for a leaf), ``kids[i, j]`` the
    ``j``-th child of ``inner[i]`` in node order (-1 past its last), ``depth``, ``parents`` of every node, and
    per depth ``d = 1..L`` the nodes of that depth (``levels``).
    """

    def __init__(self, parents, depth, inner, device):
        parents = np.asarray(parents, dtype=np.int64)
        n1 = parents.shape[0]
        kids: dict = {}
        for c in range(1, n1):
            kids.setdefault(int(parents[c]), []).append(c)
        self.inner_np = np.asarray(inner, dtype=np.int64)
        m = max((len(kids[int(v)]) for v in self.inner_np), default=0)
        mat = np.full((len(self.inner_np), m), -1, dtype=np.int64)
        for i, v in enumerate(self.inner_np.tolist()):
            mat[i, : len(kids[v])] = kids[v]
        row_of = np.full(n1, -1, dtype=np.int64)
        row_of[self.inner_np] = np.arange(len(self.inner_np))
        depth = np.asarray(depth, dtype=np.int64)
        self.n1, self.m, self.L = n1, m, int(depth.max())
        self.n_out = n1  # length of the scatter targets of node_rules_t (a dynamic layout adds a dump slot)
        self.parents_np, self.depth_np, self.kids_np = parents, depth, mat

        def t(a):
            return torch.tensor(np.array(a, dtype=np.int64), device=device)

        self.device = torch.device(device)
        # the rows of the nodes with children as a slice where they are consecutive (a shape in node order: its
        # first nodes), so the target's logits there are a view, not a copy
        i0 = int(self.inner_np[0]) if len(self.inner_np) else 0
        consecutive = np.array_equal(self.inner_np, np.arange(i0, i0 + len(self.inner_np)))
        self.inner_rows = slice(i0, i0 + len(self.inner_np)) if consecutive else None
        self.inner, self.row_of, self.kids = t(self.inner_np), t(row_of), t(mat)
        self.walk_rows = self.inner  # the node of each row (verify_tree_t's walk)
        self.kids0 = self.kids.clamp(min=0)
        self.valid = self.kids >= 0
        self.last = t(np.arange(m)[None, :] == (mat >= 0).sum(1)[:, None] - 1).bool()  # each node's last child
        self.depth = t(depth)
        self.levels = [(t(np.flatnonzero(depth == d)), t(parents[depth == d])) for d in range(1, self.L + 1)]
        # (L, n + 1): row d - 1 each node's ancestor of depth d (itself at its own depth), its root where it is
        # shallower (end_mass_t's factors of every depth in one gather)
        anc = np.empty((self.L, n1), dtype=np.int64)
        up = np.arange(n1)
        for d in range(self.L, 0, -1):
            anc[d - 1] = np.where(depth >= d, up, -1)
            up = np.where(depth >= d, np.where(parents[up] >= 0, parents[up], up), up)
        anc[anc < 0] = np.broadcast_to(up, anc.shape)[anc < 0]  # up: every node's root now
        self.ancestors = t(anc)
        # an earlier sibling j < i of the same node: the pairs whose equal tokens make child i a duplicate
        self.earlier = torch.ones((m, m), dtype=torch.bool, device=device).tril(-1)
        cells = np.flatnonzero(mat.ravel() >= 0)
        self.kid_cells, self.kid_nodes = t(cells), t(mat.ravel()[cells])  # (row, rank) cells of real children

    @classmethod
    def of_tree(cls, tree, device="cpu"):
        """The layout of a realised :class:`otspec.tree.DraftTree` (its nodes with children in node order)."""
        inner = sorted(set(int(v) for v in tree.parents[1:]))
        return cls(tree.parents, tree.depth, inner, device)


def node_rules_t(rule: str, lay: TreeLayoutT, tokens, P_inner, Q_inner, *, work=None, reach_only: bool = False):
    r"""Every node's verification at once, on the laws' device: tests, acceptances and residual levels.

    At the node ``v = inner[i]`` with children :math:`c_1, \dots, c_m` (node order) of tokens :math:`x_j`,
    laws :math:`p = p_v`, :math:`q = q_v`:

    * ``"specinfer"``: child ``j`` is accepted when :math:`u_j\,p(x_j) < q_j(x_j)` (probability
      :math:`a_j = \min(1, q_j(x_j) / p(x_j))`, 1 or 0 where :math:`p(x_j) = 0`), where
      :math:`q_j = (q - t_j p)_+ / S_j` with :math:`t_1 = 0`, :math:`S_j = \lVert (q - t_j p)_+ \rVert_1` and
      after a rejection :math:`t_{j+1} = t_j + S_j` (kept when :math:`S_{j+1} = 0`: such a rejection has
      probability 0) -- the closed form of :math:`q_{j+1} = (q_j - p)_+ / \lVert\cdot\rVert_1`;
    * ``"sequoia"``: the draft law of child ``j`` is :math:`p` off the earlier siblings, renormalised by
      what is left, :math:`\ell_j = 1 - p(x_{<j})` (0 for a repeated token), and
      :math:`t_{j+1} = t_j + S_j / \ell_j`;
    * ``"target-only"``: child ``j`` is reached with probability :math:`q(x_j)` (0 for a token repeating an
      earlier sibling's), one uniform per node against the running sums; the residual is :math:`q` off the
      children's tokens.

    Each rejection costs one pass over the vocabulary per node (:math:`S_{j+1}`), none is kept; the
    residual of a node is formed only where it is drawn (:func:`residual_rows_t`). The same closed form as
    :class:`otspec.tree.SpecInferVerifier` and :class:`otspec.tree.SequoiaVerifier`. Only the levels are
    sequential: one pass over ``V`` per sibling rank for every node at once (:func:`_levels_t`); every child's
    test, acceptance and running product is then computed at once on ``(I, m)`` blocks, the products and
    Sequoia's removed masses by a cumulative product and sum, left to right as a loop over siblings computes them
    (on the CPU, the same floats bit for bit; a GPU's scan may group them otherwise, to rounding).

    Parameters
    ----------
    rule : {"specinfer", "sequoia", "target-only"}
    lay : TreeLayoutT
        On the laws' device.
    tokens : torch.Tensor of int64, shape ``(n + 1,)``
    P_inner : torch.Tensor of float64, shape ``(I, V)``
        The draft law at each node of ``lay.inner`` (not read by ``"target-only"``).
    Q_inner : torch.Tensor of float64, shape ``(I, V)``
        The target law at each node of ``lay.inner`` (the rules read no other).
    work : dict, optional, keyword-only
        Blocks kept across calls (a decoder's, one per iteration): each rejection's pass over ``V`` writes there
        instead of into a fresh ``(I, V)`` block (the same values).
    reach_only : bool, keyword-only
        Compute ``acc`` (and ``x``) only, the same values bit for bit: ``alive``, ``level`` and ``sampler`` are
        None (what a caller that needs the reach probabilities alone, :func:`end_mass_t` with ``alive=None``,
        reads; the ops that form the rest are not issued).

    Returns
    -------
    acc : torch.Tensor of float64, shape ``(n + 1,)``
        :math:`P(\text{accept } c \mid \text{its parent reached})` (1 at the root).
    alive : torch.Tensor of float64, shape ``(n + 1,)``
        :math:`P(\text{every child of } v \text{ rejected} \mid v \text{ reached})` (1 at a leaf).
    x : torch.Tensor of int64, shape ``(I, m)``
        The children's tokens (padding repeats the first child's).
    level : tuple of torch.Tensor of float64, shape ``(I,)`` each
        ``(t, S, ell)`` before each node's last rejection: the residual after it is
        :math:`(q - (t + S / \ell) p)_+`, or :math:`(q - t p)_+` where that has no mass or :math:`\ell = 0`
        (:func:`residual_rows_t`: formed for the accepted node only, the last pass over ``V`` of every other
        node saved).
    sampler : tuple
        What :func:`verify_tree_t` tests its uniforms against.
    """
    I, m = lay.kids.shape
    dev, dt = Q_inner.device, Q_inner.dtype
    zero, one = _scalar(0.0, dt, dev), _scalar(1.0, dt, dev)
    x = tokens.take(_of_layout(lay, "kids_pad"))  # (I, m); padding: the first child's token (every inner node has one)
    # a token repeating an earlier real sibling's (SpecInfer's rule reads none: not formed for it)
    dup = None if rule == "specinfer" else (x[:, :, None] == x[:, None, :]).logical_and_(
        _of_layout(lay, "earlier_both")).any(-1)
    qx = torch.gather(Q_inner, 1, x)
    level = alive = None
    if rule == "target-only":
        acc_k = torch.where(lay.valid & ~dup, qx, zero)
        alive_in = 1.0 - acc_k.sum(-1)  # q off the children's tokens (rows of q sum to 1 up to rounding)
        sampler = ("cum", torch.cumsum(acc_k, 1))
    else:
        px_raw = torch.gather(P_inner, 1, x)
        wor = rule == "sequoia"
        rejects = _of_layout(lay, "rejects")  # the children whose rejection moves the level (not a node's last)
        if wor:
            px, left, safe, movable = _sequoia_siblings(lay, dup, rejects, px_raw, P_inner)
        else:  # SpecInfer: p itself, ell = 1; with reach_only every rank moves where S' > 0 (the levels before the
            # real children are the same: a real child's earlier siblings all move it)
            px, left, safe, movable = px_raw, None, None, None if reach_only else rejects
        minus_t, S = _levels_t(movable, safe, P_inner, Q_inner, work, m=m)
        # every child's test at once, in the loop's arithmetic (-t p rounds as t p, negated)
        tx = (qx + minus_t * px_raw).clamp(min=0.0) / S
        if reach_only:  # the padding's cells read by no real child's (they follow each row's last): left unmasked
            pxv = px
        else:  # 0 past a node's last child (as the walk's sampler reads them): the acceptance there is 0 with no
            # mask more (0 / 1 where drawn, 0 > 0 else)
            tx, pxv = torch.where(lay.valid, tx, zero), torch.where(lay.valid, px, one)
        drawn = px > 0
        a = torch.where(drawn, torch.clamp(tx / pxv, max=1.0), tx > 0)  # where p(x) = 0 the ratio is not taken
        kept = torch.cumprod(1.0 - a, 1)  # P(the first j + 1 siblings rejected), multiplied left to right
        acc_k = torch.cat([_ones((I, 1), dt, dev), kept[:, :-1]], 1) * a
        if not reach_only:
            alive_in = kept[:, -1] if m else torch.ones(I, dtype=dt, device=dev)
            end_ell = torch.ones(I, dtype=dt, device=dev) if left is None else \
                torch.where(lay.valid[:, 0], torch.where(lay.last, left, 0.0).sum(1), 1.0)  # ell at each node's last
            level = (0.0 - minus_t[:, -1], S[:, -1], end_ell)
        sampler = ("ratio", pxv, tx)
    ones = _ones((lay.n_out,), dt, dev)  # kept, never written: index_copy (not index_copy_) writes a copy
    acc = ones.index_copy(0, lay.kid_nodes, acc_k.take(lay.kid_cells))
    if not reach_only:
        alive = ones.index_copy(0, lay.inner, alive_in)
    if lay.n_out != lay.n1:
        acc = acc[: lay.n1]
        alive = None if alive is None else alive[: lay.n1]
    if reach_only:
        return acc, None, x, None, None
    return acc, alive, x, level, sampler


def _of_layout(lay, name: str):
    """A mask of the layout ``lay`` that every call of :func:`node_rules_t` on it reads, formed at its first and
    kept on it: ``"rejects"`` the children whose rejection moves the level (all but each node's last),
    ``"earlier_both"`` the (node, real child, earlier real sibling) cells a duplicate token is looked for in,
    ``"kids_pad"`` the children's nodes with each row's padding its first child (``(I, m)``: the tokens of
    :func:`node_rules_t` in one gather)."""
    got = lay.__dict__.get("_" + name)
    if got is None:
        if name == "rejects":
            got = lay.valid & ~lay.last
        elif name == "kids_pad":
            got = torch.where(lay.valid, lay.kids0, lay.kids0[:, :1])
        else:
            got = lay.earlier & lay.valid[:, None, :] & lay.valid[:, :, None]
        lay.__dict__["_" + name] = got
    return got


def _sequoia_siblings(lay, dup, rejects, px_raw, P_inner):
    r"""Sequoia's draft law at each child, :math:`p(x_j) / \ell_j` with :math:`\ell_j = 1 - p(\text{earlier
    siblings' tokens})` (0 for a repeated token or when nothing is left), for every child at once: ``(px, left,
    safe, movable)``, ``(I, m)`` each -- ``left`` :math:`\ell_j` (the row's total less the rejected tokens' mass,
    summed left to right as the loop over siblings sums it), ``safe`` :math:`\ell_j` where positive else 1, and
    ``movable`` the rejections that may move the level (``rejects`` where :math:`\ell_j > 0`)."""
    gone = torch.where(rejects & ~dup, px_raw, 0.0)  # a rejected token's mass leaves (a repeated one left already)
    removed = torch.cumsum(torch.cat([torch.zeros_like(gone[:, :1]), gone[:, :-1]], 1), 1)
    left = P_inner.sum(-1, keepdim=True) - removed
    positive = left > 0
    safe = torch.where(positive, left, 1.0)
    px = torch.where(dup | ~positive, 0.0, px_raw / safe)
    return px, left, safe, rejects & positive


def _zeros_col(I: int, dtype, device):
    """A kept ``(I, 1)`` block of zeros, read only (as :func:`_ones`)."""
    key = ("zeros", I, dtype, device)
    got = _CONSTANTS.get(key)
    if got is None:
        got = _CONSTANTS[key] = torch.zeros((I, 1), dtype=dtype, device=device)
    return got


def _levels_t(movable, safe, P_inner, Q_inner, work=None, *, m: int | None = None):
    r"""The levels :math:`(t_j, S_j)` before each child ``j``, ``(I, m)`` each, as ``(-t, S)``: :math:`t_1 = 0`,
    :math:`S_1 = 1`, and after rejecting child ``j`` at the rows ``movable[:, j]`` (None: every row, ``m`` ranks),
    :math:`t' = t_j + S_j / \ell_j` (``safe`` :math:`\ell_j`; None: 1) and :math:`S' = \lVert (q - t' p)_+ \rVert_1`,
    kept where :math:`S' > 0` (a level of no mass: that rejection had probability 0). One pass over ``V`` per sibling
    rank for every row at once (written into ``work["lvl"]``, else into the first pass's block), a few ops on
    ``(I, 1)`` columns around it; :math:`-t` is carried (exact: negation commutes with rounding), so the pass reads
    it without a negation."""
    I, m = Q_inner.shape[0], movable.shape[1] if movable is not None else m
    dev, dt = Q_inner.device, Q_inner.dtype
    minus_t, S = _zeros_col(I, dt, dev), _ones((I, 1), dt, dev)  # kept blocks: only read (torch.where, cat)
    ts, Ss = [minus_t], [S]
    if m > 1:
        lvl = None if work is None else _block(work, "lvl", tuple(Q_inner.shape), dev)
        moves = None if movable is None else movable[:, :, None].unbind(1)
        steps = None if safe is None else safe[:, :, None].unbind(1)
        for j in range(m - 1):
            # the first: 0 - 1 = -1 exactly (a kept constant, one op less)
            minus_new = _scalar(-1.0, dt, dev) if j == 0 and steps is None else \
                minus_t - (S if steps is None else S / steps[j])
            lvl = torch.addcmul(Q_inner, P_inner, minus_new, out=lvl)  # a fresh block the first time without work
            S_new = lvl.clamp_(min=0.0).sum(-1, keepdim=True)
            move = S_new > 0 if moves is None else moves[j] & (S_new > 0)
            minus_t, S = torch.where(move, minus_new, minus_t), torch.where(move, S_new, S)
            ts.append(minus_t)
            Ss.append(S)
    return torch.cat(ts, 1), torch.cat(Ss, 1)


def residual_rows_t(rule: str, x, level, P_inner, Q_inner, rows, *, q=None, inner=None, work=None):
    r"""The residual (unnormalised) at the nodes ``inner[rows]`` after all their children are rejected.

    :math:`(q - t' p)_+` with the level :math:`t' = t + S / \ell` after the last rejection, kept at
    :math:`t` where that has no mass or :math:`\ell = 0` (``level`` of :func:`node_rules_t`); :math:`q` off
    the children's tokens for ``"target-only"``; :math:`q` itself where that has no mass (a residual drawn with
    probability 0). The residual at :math:`t'` is formed, its mass decides the level of each row, and the
    residual at that level is written over it: the same values as forming both and choosing, in one block.

    Parameters
    ----------
    rule, x, level
        As :func:`node_rules_t` returns them.
    P_inner, Q_inner : torch.Tensor of float64, shape ``(I, V)``
    rows : torch.Tensor of int64, shape ``(R,)``
        Rows of ``inner``.
    q : torch.Tensor of float64, shape ``(R, V)``, optional, keyword-only
        The target laws at those rows, the same values as ``Q_inner[rows]`` (as :func:`verify_tree_t`'s ``q_at``
        gives them), read instead of a copy of ``Q_inner``'s rows; ``"target-only"`` writes the residual over
        it.
    inner : torch.Tensor of bool, shape ``(R, 1)``, optional, keyword-only
        False where the row stands for a node without children: the result there is ``q`` itself (the level
        0), bit for bit.
    work : dict, optional, keyword-only
        Blocks kept across calls (``"rq"``, ``"rp"``, ``"rw"``): the rows selected and the residual are written
        there instead of into fresh ``(R, V)`` blocks. The result is then a view of one of them (or ``q``),
        valid until the next call with the same ``work``.

    Returns
    -------
    torch.Tensor of float64, shape ``(R, V)``
    """
    shape, dev = (int(rows.shape[0]), int(Q_inner.shape[1])), Q_inner.device
    if q is None:
        q = torch.index_select(Q_inner, 0, rows, out=_block(work, "rq", shape, dev))
    if rule == "target-only":  # the children's tokens set to 0 in q's own rows, put back where nothing is left
        xr = x.index_select(0, rows)
        was = q.gather(1, xr)
        zero = torch.zeros_like(was) if inner is None else torch.where(inner, 0.0, was)
        W = q.scatter_(1, xr, zero)
        return W.scatter_(1, xr, torch.where(W.sum(-1, keepdim=True) > 0, zero, was))
    t, S, ell = (v.index_select(0, rows)[:, None] for v in level)
    p = torch.index_select(P_inner, 0, rows, out=_block(work, "rp", shape, dev))
    t_new = t + S / torch.where(ell > 0, ell, 1.0)
    new = torch.addcmul(q, p, -t_new, out=_block(work, "rw", shape, dev)).clamp_(min=0.0)
    t_used = torch.where((ell > 0) & (new.sum(-1, keepdim=True) > 0), t_new, t)  # no mass at t': t (probability 0)
    if inner is not None:
        t_used = torch.where(inner, t_used, 0.0)  # (q - 0 p)_+ = q
    W = torch.addcmul(q, p, -t_used, out=new).clamp_(min=0.0)
    return torch.where(W.sum(-1, keepdim=True) > 0, W, q, out=W)


def end_mass_t(lay: TreeLayoutT, acc, alive):
    r"""The law of the accepted node, :math:`P(a = v) = \prod_{c \preceq v} acc_c \cdot alive_v`, shape
    ``(n + 1,)``: the verifier's ``emission`` summed over tokens (``L`` gathers, no pass over ``V``); ``alive`` None:
    the reach probabilities :math:`\prod_{c \preceq v} acc_c` alone (the same floats as with ``alive`` all 1).

    The product runs from the root down, as a pass per depth multiplies it (``1 \cdot acc_{c_1}`` exact, then
    :math:`acc_{c_2}`, ...). On a :class:`TreeLayoutT` the factors of every depth are gathered at once (each node's
    ancestor of that depth, or its root where it is shallower: ``acc`` is 1 at the roots, as :func:`node_rules_t`
    gives it, and a product by 1 is exact), then multiplied column by column: ``L + 1`` ops instead of ``4 L``."""
    anc = getattr(lay, "ancestors", None)
    every = getattr(lay, "every_parent", None)
    if anc is not None and lay.L > 0:
        # the running product down the depths, in order (a sequential scan: the same floats as the column-by-column
        # products), its last row: 2 ops instead of L + 1
        reach = torch.cumprod(acc.take(anc), 0)[-1]
    elif every is not None:  # every level a pass over every node but the root (EAGLE-2's layout): its factors
        # gathered once, each pass's product written in place (a gather and a product a level, instead of four ops)
        reach = torch.ones_like(acc)
        a1 = acc[1:]
        for _ in range(lay.L):
            torch.mul(reach.index_select(0, every), a1, out=reach[1:])
    else:
        reach = torch.ones_like(acc)
        for nodes, par in lay.levels:
            reach = reach.index_copy(0, nodes, reach.index_select(0, par) * acc.index_select(0, nodes))
    return reach if alive is None else reach * alive


def verify_tree_t(rule: str, lay: TreeLayoutT, tokens, P_inner, Q_inner, q_at, gen, *, draw=None, work=None,
                  host: bool = False, totals: list | None = None):
    r"""One tree verification on the laws' device: the accepted node, the emitted token, the exact law.

    Every node's outcome is decided at once with one uniform per child (``"specinfer"``, ``"sequoia"``: the
    first child ``j`` with :math:`u_j\,p_j(x_j) < T_j(x_j)`; ``"target-only"``: one uniform ``u`` per node,
    the first child ``j`` whose running sum of :math:`q_v(x_i)` exceeds ``u``); a walk of ``L`` gathers from
    the root follows the outcomes to the accepted node ``a`` (the uniforms of the nodes off the walk are never
    used, so the law is that of the rule's walk); one draw from ``a``'s residual (at a leaf, from
    :math:`q_a`: the bonus token) gives the emitted token (:func:`draw_rows`, unnormalised weights).
    Nothing is read on the host (but with ``host``).

    Parameters
    ----------
    rule : {"specinfer", "sequoia", "target-only"}
    lay : TreeLayoutT
    tokens : torch.Tensor of int64, shape ``(n + 1,)``
    P_inner : torch.Tensor of float64, shape ``(I, V)``
    Q_inner : torch.Tensor of float64, shape ``(I, V)``
    q_at : callable
        ``q_at(v)`` the target law at the node ``v`` (a tensor of shape ``(1,)``), shape ``(1, V)``: the bonus
        token's law when ``v`` is a leaf, the row of ``Q_inner`` (the same values, bit for bit) where ``v`` has
        children (called once, whatever ``v`` is: no host read decides it). The row is read for nothing else
        afterwards: the residual may be written over it.
    gen : torch.Generator
        On the laws' device.
    host : bool, keyword-only
        Read the accepted node on the host before its residual (:func:`_emit_host`; where a read waits for
        nothing, the CPU): its rows of ``P_inner`` and ``Q_inner`` read in place (``q_at`` called at a leaf only),
        the residual's level chosen once; the same token bit for bit, ``Q_inner`` left as it was.
    totals : list of float, optional, keyword-only
        With ``host``: the totals of ``P_inner``'s rows (Sequoia's rule reads them) as the draft's draws summed them
        (:func:`_draws_wor`'s ``totals``: added in order, where ``P_inner.sum(-1)`` sums in another order), read
        instead of a pass over ``V`` per row.
    draw : callable, optional
        ``(W, gen) -> ids`` (default :func:`draw_rows`, its running sums written into ``work``).
    work : dict, optional, keyword-only
        Blocks kept across calls (a decoder's, reused every iteration): every pass over ``V`` (the rejections'
        levels, the accepted node's residual, the running sums of its draw) writes there instead of into fresh
        blocks; the same values, hence the same draws from the same generator.

    Returns
    -------
    a : torch.Tensor of int64, shape ``(1,)``
        The accepted node (0: none).
    y : torch.Tensor of int64, shape ``(1,)``
        The emitted token.
    mass : torch.Tensor of float64, shape ``(n + 1,)``
        The exact law of the accepted node given the tree (:func:`end_mass_t`).

    Examples
    --------
    One chain ``1, 0`` with ``p = (1/2, 1/2)`` and ``q = (1/4, 3/4)`` at every node (SpecInfer's rule): token 1
    is accepted surely, then token 0 with probability 1/2.

    >>> import torch
    >>> import otspec.tree as T
    >>> from otspec.decoding._tree_device import TreeLayoutT, verify_tree_t
    >>> chain = T.DraftTree.from_paths([(1,), (1, 0)])
    >>> lay = TreeLayoutT.of_tree(chain)          # nodes with children: 0 and 1
    >>> P = torch.full((2, 2), 0.5, dtype=torch.float64)
    >>> Q = torch.tensor([[0.25, 0.75]] * 3, dtype=torch.float64)
    >>> a, y, mass = verify_tree_t("specinfer", lay, torch.tensor(chain.tokens), P, Q[:2],
    ...                            lambda v: Q.index_select(0, v), torch.Generator().manual_seed(0))
    >>> mass.tolist(), int(a[0]) in (1, 2)
    ([0.0, 0.5, 0.5], True)
    """
    if host:  # the rules' arithmetic on a few numbers per child in Python floats
        cur, r, x, level, mass = _verify_host(rule, lay, tokens, P_inner, Q_inner, gen, work, totals)
        cur = torch.tensor([cur], device=Q_inner.device)
        return cur, _emit_host(rule, r, cur, x, level, P_inner, Q_inner, q_at, gen, draw, work), mass
    acc, alive, x, level, sampler = node_rules_t(rule, lay, tokens, P_inner, Q_inner, work=work)
    I, m = lay.kids.shape
    dev, dt = Q_inner.device, Q_inner.dtype
    if sampler[0] == "cum":
        u = torch.rand((I, 1), dtype=dt, device=dev, generator=gen)
        hit = lay.valid & (u < sampler[1])
    else:
        u = torch.rand((I, m), dtype=dt, device=dev, generator=gen)
        hit = lay.valid & (u * sampler[1] < sampler[2])  # strict and division-free: u = 0 never takes q = 0
    first = torch.argmax(hit.to(torch.int8), 1, keepdim=True)
    # every node's next node on the walk: its accepted child, or itself (a leaf, or no child accepted): the walk
    # from the root is then one gather per depth (it stays put once it stops, as it did)
    own = lay.walk_rows  # (I,): the node of each row (a dump entry n + 1 for a row standing for no node)
    nxt = torch.where(hit.any(1), torch.gather(lay.kids, 1, first)[:, 0], own)
    step = _arange(0, lay.n1 + 1, 1, dev).index_copy(0, own, nxt)  # (n + 2,)
    cur = _scalar(0, torch.int64, dev)[None]
    for _ in range(lay.L):
        cur = step.index_select(0, cur)
    r = lay.row_of.index_select(0, cur)
    inner = r[:, None] >= 0
    r0 = r.clamp(min=0)
    q = q_at(cur)  # the accepted node's law: its row of Q_inner where it has children, the bonus token's at a leaf
    # its residual at a node with children (q off the children's tokens for "target-only", written over q), q at a
    # leaf; q where the residual has no mass (drawn with probability 0)
    W = residual_rows_t(rule, x, level, P_inner, Q_inner, r0, q=q, inner=inner, work=work)
    y = draw_rows(W, gen, out=_block(work, "cum", tuple(W.shape), dev)) if draw is None else draw(W, gen)
    return cur, y, end_mass_t(lay, acc, alive)


class _HostLayout:
    """A layout's index tensors as Python lists (read where a read waits for nothing), for :func:`_verify_host`:
    made once per static :class:`TreeLayoutT` (kept on it), once per iteration for an :class:`Eagle2LayoutT`."""

    def __init__(self, lay):
        self.kids0, self.valid, self.last = lay.kids0.tolist(), lay.valid.tolist(), lay.last.tolist()
        self.kids, self.row_of, self.inner = lay.kids.tolist(), lay.row_of.tolist(), lay.inner.tolist()
        self.I, self.m, self.n1, self.n_out, self.L = len(self.kids), int(lay.m), int(lay.n1), int(lay.n_out), int(lay.L)
        parents = lay.parents_np.tolist() if isinstance(lay, TreeLayoutT) else lay.parents.tolist()
        depth = lay.depth_np.tolist() if isinstance(lay, TreeLayoutT) else lay.depth.tolist()
        self.parents = parents
        self.by_depth = sorted(range(1, self.n1), key=lambda v: depth[v])  # every parent before its children

    @staticmethod
    def of(lay) -> "_HostLayout":
        if not isinstance(lay, TreeLayoutT):
            return _HostLayout(lay)
        got = getattr(lay, "_host", None)
        if got is None:
            got = lay._host = _HostLayout(lay)
        return got


def _clamp_min0(v: float) -> float:
    """``torch.clamp(v, min=0.0)`` of one float: NaN stays NaN."""
    return 0.0 if v < 0.0 else v


def _verify_host(rule: str, lay, tokens, P_inner, Q_inner, gen, work, totals=None):
    r""":func:`node_rules_t` (``"specinfer"``, ``"sequoia"``; ``"target-only"`` by :func:`_verify_host_target_only`)
    and the walk of :func:`verify_tree_t` with the few numbers per child read on the host and the rules' arithmetic
    done in Python floats (IEEE float64, each operation
    rounded once, as torch's elementwise kernels on the CPU round it; the guards against division by 0 the same
    ``where``\ s), the passes over ``V`` as there (the draft law's totals, each rejection's level at the rows it may
    move, ``torch.rand`` for the uniforms with the same shape and generator), with some ten torch operators where the
    device route runs a hundred on tensors of a few entries. With torch's passes (no numba) the same acceptances,
    levels, uniforms, accepted node and exact law, bit for bit; with the numba passes (:func:`_level_sums_host`) and
    the totals the draws summed (``totals``) the levels' masses and the totals are sums of the same terms in another
    order, so the acceptances and the exact law agree to rounding (within 1e-12 relative in the tests) and the
    uniforms decide the same children but where one falls within rounding of an acceptance probability.

    Returns ``cur`` (an int, the accepted node), its row of ``inner`` (-1 at a leaf), ``x`` (``(I, m)`` int64,
    the children's tokens), ``level`` (``(t, S, ell)``, lists of ``I`` Python floats, read by :func:`_emit_host`;
    None for ``"target-only"``, :func:`_verify_host_target_only`) and the law of the accepted node
    (:func:`end_mass_t`).
    """
    h = _HostLayout.of(lay)
    I, m = h.I, h.m
    dev, dt = Q_inner.device, Q_inner.dtype
    x = tokens.index_select(0, lay.kids0.flatten()).reshape(I, m)
    x = torch.where(lay.valid, x, x[:, :1])
    xs = x.tolist()
    valid, last = h.valid, h.last
    dup = [[valid[i][j] and any(valid[i][k] and xs[i][k] == xs[i][j] for k in range(j)) for j in range(m)]
           for i in range(I)]
    if rule == "target-only":
        return _verify_host_target_only(h, lay, x, dup, Q_inner, gen)
    qx, px_raw = torch.gather(Q_inner, 1, x).tolist(), torch.gather(P_inner, 1, x).tolist()
    wor = rule == "sequoia"
    total = (P_inner.sum(-1).tolist() if totals is None else totals) if wor else None
    t, S, removed = [0.0] * I, [1.0] * I, [0.0] * I
    end_ell, w = [1.0] * I, [1.0] * I
    acc_k = [[0.0] * m for _ in range(I)]
    px_all = [[1.0] * m for _ in range(I)]
    tx_all = [[0.0] * m for _ in range(I)]
    for j in range(m):
        ells = [1.0] * I
        for i in range(I):
            on = valid[i][j]
            tx = _clamp_min0(qx[i][j] - t[i] * px_raw[i][j]) / S[i]
            if wor:  # p off the earlier siblings: 0 for a repeated token or when nothing is left
                left = total[i] - removed[i]
                px = 0.0 if (dup[i][j] or not left > 0) else px_raw[i][j] / (left if left > 0 else 1.0)
                ells[i] = left
            else:
                px = px_raw[i][j]
            if px > 0:
                a = tx / px
                a = 1.0 if a > 1.0 else a
            else:
                a = 1.0 if tx > 0 else 0.0
            a = a if on else 0.0
            acc_k[i][j] = w[i] * a
            w[i] = w[i] * (1.0 - a)
            if on:
                px_all[i][j], tx_all[i][j] = px, tx
            if last[i][j]:
                end_ell[i] = ells[i]
        if j < m - 1:  # the level after rejecting child j: one pass over V per row it may move (as _levels_t)
            t_new = [t[i] + S[i] / (ells[i] if ells[i] > 0 else 1.0) for i in range(I)]
            # the rows whose level may move: not where a child so far is accepted surely (w = 0: the later children's
            # acceptances and the node's residual are then never used, and multiply by 0 in the law of the end)
            moves = [i for i in range(I) if valid[i][j] and not last[i][j] and ells[i] > 0 and w[i] != 0.0]
            S_new = _level_sums_host(Q_inner, P_inner, moves, t_new, work)
            for i in range(I):
                on = valid[i][j] and not last[i][j]
                if on and ells[i] > 0 and S_new[i] > 0:  # a level of no mass is kept (probability 0)
                    t[i], S[i] = t_new[i], S_new[i]
                if wor and on and not dup[i][j]:  # the rejected token's mass out of what is left
                    removed[i] = removed[i] + px_raw[i][j]
    # the uniforms, as verify_tree_t draws them; the walk from the root to the accepted node
    u = torch.rand((I, m), dtype=dt, device=dev, generator=gen).tolist()
    nxt = [-1] * (I + 1)
    for i in range(I):
        for j in range(m):
            if valid[i][j] and u[i][j] * px_all[i][j] < tx_all[i][j]:
                nxt[i] = h.kids[i][j]
                break
    cur, mass = _end_host(h, nxt, acc_k, w, dt, dev)
    return cur, h.row_of[cur], x, (t, S, end_ell), mass


def _kernel_rows(*rows) -> bool:
    """Whether the numba passes (:func:`_level_sums`, :func:`_residual_draw`, :func:`_wor_rows`, :func:`_iid_rows`)
    may read these tensors in place: compiled, and every tensor a contiguous float64 CPU tensor without gradient."""
    return _PASSES_COMPILED and all(
        r.device.type == "cpu" and r.dtype == torch.float64 and r.is_contiguous() and not r.requires_grad
        for r in rows)


def _level_sums_host(Q_inner, P_inner, rows: list, t_new: list, work):
    r"""The levels' masses :math:`S = \lVert (q - t' p)_+ \rVert_1` after a rejection for :func:`_verify_host`, a list
    of ``I`` Python floats of which the entries ``rows`` (the rows whose level may move) are read: by
    :func:`_level_sums` (one read of those rows, nothing written; its sum order is not torch's, see there) where it
    may run, else by torch's ``addcmul``, ``clamp_`` and ``sum`` at every row, the values of :func:`_levels_t` bit for
    bit."""
    I = int(Q_inner.shape[0])
    if _kernel_rows(Q_inner, P_inner):
        out = np.zeros(len(rows))
        if rows:
            _level_sums(Q_inner.numpy(), P_inner.numpy(), np.array(rows, dtype=np.int64),
                        np.array([-t_new[i] for i in rows]), out)
        S = [0.0] * I
        for k, i in enumerate(rows):
            S[i] = float(out[k])
        return S
    lvl = _block(work, "lvl", tuple(Q_inner.shape), Q_inner.device)
    T = torch.tensor(t_new, dtype=Q_inner.dtype, device=Q_inner.device)
    return torch.addcmul(Q_inner, P_inner, -T[:, None], out=lvl).clamp_(min=0.0).sum(-1).tolist()


def _walk_host(h, nxt) -> int:
    """The accepted node of :func:`verify_tree_t`'s walk from the root, ``nxt[i]`` the accepted child of row ``i``
    (-1: none; row ``I`` stands for a leaf)."""
    cur = 0
    for _ in range(h.L):
        r = h.row_of[cur]
        c = nxt[r if r >= 0 else h.I]
        cur = c if c >= 0 else cur
    return cur


def _end_host(h, nxt, acc_k, alive_in, dt, dev):
    """The accepted node (:func:`_walk_host`) and the law of the accepted node (:func:`end_mass_t`) from the rows'
    children's acceptances ``acc_k`` (``I`` lists of ``m``) and the rows' alive masses ``alive_in``."""
    acc, alive = [1.0] * h.n_out, [1.0] * h.n_out
    for i in range(h.I):
        for j in range(h.m):
            if h.valid[i][j]:
                acc[h.kids[i][j]] = acc_k[i][j]
        alive[h.inner[i]] = alive_in[i]
    return _walk_host(h, nxt), _mass_host(h, acc, alive, dt, dev)


def _mass_host(h, acc, alive, dt, dev):
    """:func:`end_mass_t` in Python floats from ``acc`` and ``alive`` (lists over ``n_out`` nodes): the products
    along each path from the root in the same order, times the alive mass; a tensor ``(n + 1,)``."""
    reach = [1.0] * h.n1
    for v in h.by_depth:
        reach[v] = reach[max(h.parents[v], 0)] * acc[v]  # a tree from bad laws stays indexable
    return torch.tensor([reach[v] * alive[v] for v in range(h.n1)], dtype=dt, device=dev)


def _verify_host_target_only(h, lay, x, dup, Q_inner, gen):
    r""":func:`_verify_host` for the target-only rule: child ``j`` of a node reached with probability :math:`q(x_j)`
    (0 for a token repeating an earlier sibling's), one uniform per node against the running sums. The children's
    :math:`q(x_j)` gathered once; their running sums and the rows' alive masses :math:`1 - \sum_j q(x_j)` by the
    very torch operators :func:`node_rules_t` runs on the same ``(I, m)`` values (the same bits), the uniforms by
    the same ``torch.rand`` call, the walk and the exact law in Python floats as :func:`_verify_host`'s."""
    I, m = h.I, h.m
    dev, dt = Q_inner.device, Q_inner.dtype
    valid = h.valid
    qx = torch.gather(Q_inner, 1, x)
    keep = torch.tensor([[valid[i][j] and not dup[i][j] for j in range(m)] for i in range(I)], device=dev)
    acc_k = torch.where(keep, qx, 0.0)
    alive_in = (1.0 - acc_k.sum(-1)).tolist()
    cum = torch.cumsum(acc_k, 1).tolist()
    acc_l = acc_k.tolist()
    u = torch.rand((I, 1), dtype=dt, device=dev, generator=gen)[:, 0].tolist()
    nxt = [-1] * (I + 1)
    for i in range(I):
        for j in range(m):
            if valid[i][j] and u[i] < cum[i][j]:
                nxt[i] = h.kids[i][j]
                break
    cur, mass = _end_host(h, nxt, acc_l, alive_in, dt, dev)
    return cur, h.row_of[cur], x, None, mass


def _emit_host(rule: str, r: int, cur, x, level, P_inner, Q_inner, q_at, gen, draw, work):
    r"""The emitted token of :func:`verify_tree_t` with the accepted node's row ``r`` of ``inner`` known on the host
    (-1 at a leaf): the same weights bit for bit as :func:`residual_rows_t`, with fewer passes over ``V``.

    * a leaf: ``q_at(cur)`` itself (:func:`residual_rows_t` at the level 0 gives ``q`` bit for bit);
    * ``"specinfer"``, ``"sequoia"``: :math:`(q - t' p)_+` read from views of ``Q_inner``'s and ``P_inner``'s rows
      (no copy, no ``q_at`` law formed: its values are those of ``Q_inner``'s row); formed again at :math:`t` only
      where :math:`\ell = 0` or it has no mass (the second pass of :func:`residual_rows_t`, at :math:`t'`, gives the
      values of the first), ``q`` itself where that has no mass either;
    * ``"target-only"``: the children's tokens set to 0 in ``Q_inner``'s own row, put back where nothing is left,
      and written back after the draw (``Q_inner`` ends bit for bit as it was).

    Off CUDA (``draw`` None: the ``"cdf"`` rule of :func:`draw_rows`) the running sums of the draw are formed first and
    their last entry decides whether a row has mass (non-negative entries: the sum is positive exactly when some entry
    is), in place of a sum over ``V``; the draw then reads the same sums.
    """
    dev, V = Q_inner.device, int(Q_inner.shape[1])
    if draw is None and _kernel_rows(Q_inner) and (P_inner is None or _kernel_rows(P_inner)):
        return _emit_kernels(rule, r, cur, x, level, P_inner, Q_inner, q_at, gen)
    # the "cdf" draw of draw_rows (its default off CUDA) from running sums formed once: a row has mass exactly where
    # its running sums end above 0 (non-negative entries), so they decide the branch in place of a sum over V
    cum = _block(work, "cum", (1, V), dev) if draw is None and dev.type != "cuda" else None

    def mass(W) -> bool:
        if cum is None:
            return bool(W.sum(-1) > 0)
        return bool(torch.cumsum(W, dim=-1, out=cum)[0, -1] > 0)

    summed = False  # whether cum holds the running sums of W
    if r < 0:
        W = q_at(cur)
    elif rule == "target-only":
        q = Q_inner[r : r + 1]
        xr = x[r : r + 1]
        was = q.gather(1, xr)
        W = q.scatter_(1, xr, 0.0)
        summed = mass(W)
        if not summed:
            W.scatter_(1, xr, was)
    else:
        q, p = Q_inner[r : r + 1], P_inner[r : r + 1]
        if isinstance(level[0], list):  # Python floats (_verify_host): the same arithmetic, rounded the same
            t, S, ell = (v[r] for v in level)
            t_new = t + S / (ell if ell > 0 else 1.0)
            minus_new, minus_t = torch.tensor([[-t_new], [-t]], dtype=q.dtype, device=dev).split(1)
            positive = ell > 0
        else:
            t, S, ell = (v[r : r + 1, None] for v in level)
            t_new = t + S / torch.where(ell > 0, ell, 1.0)
            minus_new, minus_t, positive = -t_new, -t, bool(ell > 0)
        W = torch.addcmul(q, p, minus_new, out=_block(work, "rw", tuple(q.shape), dev)).clamp_(min=0.0)
        summed = positive and mass(W)
        if not summed:  # no mass at t': t (probability 0), else q
            W = torch.addcmul(q, p, minus_t, out=W).clamp_(min=0.0)
            summed = mass(W)
            if not summed:
                W = q
    if cum is not None:
        y = _draws_from_sums(cum if summed else torch.cumsum(W, dim=-1, out=cum), 1, gen)[:, 0]
    else:
        y = draw_rows(W, gen, out=_block(work, "cum", tuple(W.shape), dev)) if draw is None else draw(W, gen)
    if rule == "target-only" and r >= 0:
        q.scatter_(1, xr, was)
    return y


def _emit_kernels(rule: str, r: int, cur, x, level, P_inner, Q_inner, q_at, gen):
    r""":func:`_emit_host` by the numba passes on the CPU, the same token bit for bit (each weight rounded as
    ``addcmul`` and ``clamp_`` round it, the running sums added in order as ``torch.cumsum``), no row written: the
    weights :math:`w = (q + m\,p)_+` of each candidate in :func:`_emit_host`'s order -- the residual at :math:`t'`
    (where :math:`\ell > 0`), at :math:`t`, then ``q`` itself (``m = 0``, ``p = q``); for ``"target-only"``
    ``Q_inner``'s row with the children's tokens set to 0 (put back after), then ``q``; at a leaf ``q_at(cur)`` --
    each drawn by one read of the row (:func:`_residual_draw`) until one has positive total (the last one whatever its
    total), with the uniform of ``draw_rows``'s ``"cdf"`` rule (the same ``torch.rand`` call, times the total rounded
    once)."""
    restore = None
    if r < 0:
        q = q_at(cur)[0]
        if not _kernel_rows(q):
            q = q.contiguous().to(torch.float64)
        q = q.numpy()
        cands = [(q, q, 0.0)]
    elif rule == "target-only":
        row = Q_inner[r]
        xr = x[r]
        was = row.gather(0, xr)
        row.scatter_(0, xr, 0.0)
        q = row.numpy()
        cands = [(q, q, 0.0), None]  # None: q itself, its children's tokens put back first
        restore = (row, xr, was)
    else:
        q, p = Q_inner[r].numpy(), P_inner[r].numpy()
        t, S, ell = (v[r] for v in level)
        cands = [(q, p, -t), (q, q, 0.0)]
        if ell > 0:
            cands.insert(0, (q, p, -(t + S / ell)))
    u = float(torch.rand((1, 1), dtype=torch.float64, device=Q_inner.device, generator=gen)[0, 0])
    for k, c in enumerate(cands):
        if c is None:
            restore[0].scatter_(0, restore[1], restore[2])
            restore = None
            c = (q, q, 0.0)
        if k == len(cands) - 1:
            y = _residual_draw(*c, u)[0]
            break
        y, tot = _residual_draw(*c, u)
        if tot > 0:
            break
    if restore is not None:
        restore[0].scatter_(0, restore[1], restore[2])
    return torch.tensor([y], device=Q_inner.device)


# ----------------------------------------------------------------------------- one iteration
class _Grow:
    """The static draft plan of a shape: per depth, which frontier row each child is drawn from and its rank."""

    def __init__(self, plan, device):
        shape = plan.shape
        self.D = len(plan.levels)
        self.src, self.rank, self.dst, self.need, self.most = [], [], [], [], []
        self.cell, self.width = [], []
        for lev in plan.levels:
            src, rank, dst, need, cell = [], [], [], [], []
            width = max(len(ch) for _, ch, _ in lev)
            for j, (_, ch, ranks) in enumerate(lev):
                src += [j] * len(ch)
                rank += list(ranks)
                dst += list(ch)
                need.append(max(ranks) + 1)
                cell += [j * width + i for i in range(len(ch))]  # i.i.d. children: the i-th draw of row j
            t = lambda a: torch.tensor(np.array(a, dtype=np.int64), device=device)  # noqa: E731
            self.src.append(t(src))
            self.rank.append(t(rank))
            self.dst.append(t(dst))
            self.need.append(t(need))
            self.most.append(max(need))
            self.cell.append(t(cell))
            self.width.append(width)
        self.frontier = [torch.tensor(np.array(f, dtype=np.int64), device=device) for f in plan.frontier]
        inner = np.concatenate(plan.frontier)
        self.lay = TreeLayoutT(shape.parents, shape.depth, inner, device)


def _draws(P, k: int, gen, *, work=None, host: bool = False):
    r"""``k`` independent draws from each row of ``P`` (``(B, V)``, non-negative), shape ``(B, k)``: the
    ``"cdf"`` rule of :func:`draw_rows` with ``k`` uniforms per row against one running sum (the first ``i``
    with :math:`c_i > u\,c_V`; a uniform rounded up to the total falls back to the first ``i`` with
    :math:`c_i = c_V`). No host read; the running sums go into ``work["cum"]`` when given (:func:`_block`).
    ``host`` (the CPU) with the numba passes: the same draws bit for bit by :func:`_iid_rows`, the rows only read."""
    if host and _kernel_rows(P):
        u = torch.rand((int(P.shape[0]), k), dtype=torch.float64, device=P.device, generator=gen)
        picks = np.zeros((int(P.shape[0]), k), dtype=np.int64)
        if k:
            _iid_rows(P.numpy(), u.numpy(), picks)
        return torch.from_numpy(picks)
    c = torch.cumsum(P, dim=-1, out=None if work is None else _block(work, "cum", tuple(P.shape), P.device))
    return _draws_from_sums(c, k, gen)


def _draws_from_sums(c, k: int, gen, *, u=None):
    r""":func:`_draws` from the running sums ``c`` of the rows (``(B, V)``), shape ``(B, k)``; ``u``: the ``(B, k)``
    uniforms already drawn (several generators' rows joined: their draws in one batch), else ``k`` a row from ``gen``.

    A uniform rounded up to the total ``c_V`` is lowered to the largest float below it first: the first ``i`` with
    :math:`c_i >` that is the first with :math:`c_i \ge c_V` (a search with the very comparisons of one for the total
    itself), so one search serves both cases (six ops and the uniforms)."""
    V = c.shape[-1]
    tot = c[:, -1:]
    if u is None:
        u = torch.rand((c.shape[0], k), dtype=torch.float64, device=c.device, generator=gen)
    u = torch.minimum(u * tot, torch.nextafter(tot, _scalar(-math.inf, tot.dtype, tot.device)))
    return torch.searchsorted(c, u, right=True).clamp_(max=V - 1)  # a NaN row: V, an id still


def _draws_wor(P, most: int, need, gen, *, rule: str | None = None, work=None, in_place: bool = False,
               host: bool = False, totals: list | None = None):
    r"""``most`` draws without replacement from each row of ``P`` (``(B, V)``, non-negative), in draw order, shape
    ``(B, most)``, and the flags of rows with fewer than ``need`` (``(B,)``) tokens of positive mass. No host read.

    .. math::

        P(x_1, \dots, x_m) = \prod_{r=1}^{m} \frac{p(x_r)}{1 - \sum_{s < r} p(x_s)},

    by one of the two exact rules of :func:`otspec.decoding._sampling.draw_rows`:

    * ``"race"`` (default on CUDA): the ``most`` largest of :math:`p(x) / E_x`, :math:`E_x` i.i.d. ``Exp(1)``, in
      decreasing order (the exponential race: its order is that of the sequential draws); one random number per
      entry, cheap on a GPU;
    * ``"cdf"`` (default elsewhere): ``most`` draws in turn, each from fresh running sums of the row with the
      tokens drawn before set to 0 (a uniform against the total, the first entry past it); on a CPU one
      exponential per entry costs 15 times a running sum. A row's total before draw ``r`` is 0 exactly when it
      has fewer than ``r`` tokens of positive mass: the flags come from those totals.

    ``work`` (a dict of blocks kept across calls, :func:`_block`) receives the running sums or the exponentials
    instead of fresh blocks; ``in_place`` lets the ``"cdf"`` rule set the drawn tokens to 0 in ``P`` itself (a
    block the caller owns) instead of a copy, and write their values back in reverse order of the draws before
    returning (``P`` ends bit for bit as it was). ``host`` (where a read waits for nothing: the CPU, whose
    ``torch.cumsum`` adds in order) lets the ``"cdf"`` rule read each draw's tokens and continue the running sums from
    there (:func:`_cumsum_after`) instead of summing the whole row again, or, where the numba passes run, draw from
    running sums never written (:func:`_wor_rows`, ``P`` only read) and append each row's total to ``totals`` (a
    list, when given: the row's sum added in order, the first draw's total). The same draws either way.
    """
    if rule is None:
        rule = "race" if P.device.type == "cuda" else "cdf"
    blk = None if work is None else _block(work, "cum", tuple(P.shape), P.device)
    if rule == "race":
        E = (torch.empty(P.shape, dtype=torch.float64, device=P.device) if blk is None else blk).exponential_(
            generator=gen)
        E.clamp_(min=torch.finfo(torch.float64).tiny)
        top = torch.topk(torch.div(P, E, out=E), most, dim=-1).indices
        return top, (P > 0).sum(-1) < need
    if host and P.device.type == "cpu" and P.is_contiguous() and P.dtype == torch.float64:
        if _kernel_rows(P):
            return _draws_wor_kernel(P, most, need, gen, totals)
        return _draws_wor_host(P, most, need, gen, blk, in_place)
    B, V = P.shape
    W = P if in_place else P.clone()
    top = torch.empty((B, most), dtype=torch.long, device=P.device)
    tots = torch.empty((B, most), dtype=P.dtype, device=P.device)
    was = torch.empty((B, most), dtype=P.dtype, device=P.device) if in_place else None
    for r in range(most):
        c = torch.cumsum(W, dim=-1, out=blk)
        tot = c[:, -1:].contiguous()
        u = torch.rand((B, 1), dtype=torch.float64, device=P.device, generator=gen) * tot
        i = torch.searchsorted(c, u, right=True)
        last = torch.searchsorted(c, tot, right=False)  # a uniform rounded up to the total: the first entry reaching it
        pick = torch.where(i < V, i, last).clamp_(max=V - 1)
        top[:, r : r + 1], tots[:, r : r + 1] = pick, tot
        if r + 1 < most:
            if in_place:
                was[:, r : r + 1] = W.gather(1, pick)
            W.scatter_(1, pick, 0.0)
    if in_place:  # the drawn tokens' values back, the first draw's last (a degenerate row may draw a token twice)
        for r in range(most - 2, -1, -1):
            W.scatter_(1, top[:, r : r + 1], was[:, r : r + 1])
    short = ((tots == 0) & (torch.arange(most, device=P.device) < need[:, None])).any(-1)
    return top, short


def _draws_wor_kernel(P, most: int, need, gen, totals: list | None):
    """The ``"cdf"`` rule of :func:`_draws_wor` by :func:`_wor_rows` (``P`` a contiguous float64 CPU block, only read):
    the uniforms of every draw by one ``torch.rand`` call of ``most`` rows of ``B`` (the CPU generator fills them in
    order: the values of ``most`` calls of ``B``, row ``r`` those of draw ``r``), the same draws and flags bit for bit
    as the draw-by-draw rule; each row's total (its first draw's) appended to ``totals``."""
    B = int(P.shape[0])
    u = torch.rand((most, B), dtype=torch.float64, device=P.device, generator=gen)
    picks, tots = np.zeros((B, most), dtype=np.int64), np.zeros((B, most))
    if most:
        _wor_rows(P.numpy(), u.numpy(), picks, tots)
    if totals is not None:
        totals.extend(tots[:, 0].tolist() if most else P.sum(-1).tolist())
    needs = need.tolist()
    short = torch.tensor([bool((tots[b, : min(most, needs[b])] == 0).any()) for b in range(B)])
    return torch.from_numpy(picks), short


def _draws_wor_host(P, most: int, need, gen, blk, in_place: bool):
    """The ``"cdf"`` rule of :func:`_draws_wor` on the CPU with each draw read on the host: the running sums of a later
    draw continued from the token drawn before (:func:`_cumsum_after`), the totals, uniforms and picks read as Python
    numbers (the uniform times the total rounded once, as torch's product), one ``torch.searchsorted`` per draw (a
    second only for a uniform rounded up to the total), the flags from the totals: the same draws and flags, bit for
    bit, with a third of the torch operators."""
    B, V = P.shape
    W = P if in_place else P.clone()
    needs = need.tolist()
    picks: list = []  # per draw, the token of every row
    tots: list = []
    was: list = []  # in_place: the drawn tokens' values, put back after the last draw
    c = None
    for r in range(most):
        if r == 0:
            c = torch.cumsum(W, dim=-1, out=blk)
        else:
            if in_place:
                was.append(W[torch.arange(B), torch.tensor(picks[-1])].tolist())
            _cumsum_after(W, c, picks[-1])
        tot = c[:, -1].tolist()
        u = torch.rand((B, 1), dtype=torch.float64, device=P.device, generator=gen)[:, 0].tolist()
        at = torch.tensor([[ub * tb] for ub, tb in zip(u, tot)], dtype=torch.float64)
        i = torch.searchsorted(c, at, right=True)[:, 0].tolist()
        if any(ib >= V for ib in i):  # a uniform rounded up to the total: the first entry reaching it
            last = torch.searchsorted(c, c[:, -1:].contiguous(), right=False)[:, 0].tolist()
            i = [ib if ib < V else lb for ib, lb in zip(i, last)]
        picks.append([min(ib, V - 1) for ib in i])
        tots.append(tot)
    if in_place:  # the drawn tokens' values back, the first draw's last (a degenerate row may draw a token twice)
        for r in range(len(was) - 1, -1, -1):
            for b in range(B):
                W[b, picks[r][b]] = was[r][b]
    top = torch.tensor(picks, dtype=torch.long).T.contiguous() if most else torch.empty((B, 0), dtype=torch.long)
    short = torch.tensor([any(tots[r][b] == 0 for r in range(min(most, needs[b]))) for b in range(B)])
    return top, short


def _cumsum_after(W, c, picks) -> None:
    r"""The running sums ``c`` of ``W`` (``(B, V)``, float64, on the CPU) after ``W[b, picks[b]]`` is set to 0 in every
    row ``b``, written over ``c`` (the running sums of ``W`` before), bit for bit as ``torch.cumsum`` of the new ``W``;
    ``W[b, picks[b]]`` is 0 afterwards.

    The CPU's ``torch.cumsum`` adds in order, :math:`c_i = c_{i-1} + w_i` from :math:`0`: the sums before the pick
    :math:`j` do not change, :math:`c'_j = c_{j-1} + 0 = c_{j-1}` and from there on the same additions continue from
    :math:`c_{j-1}`, which is what ``torch.cumsum`` of :math:`(c_{j-1}, w_{j+1}, \dots)` adds (its first sum
    :math:`0 + c_{j-1} = c_{j-1}`): one sequential pass over ``V - j`` entries instead of ``V``, about half a pass
    for a token drawn where the mass is spread.
    """
    for b, j in enumerate(picks):
        row, crow = W[b], c[b]
        if j > 0:
            row[j] = crow[j - 1]
        else:
            row[j] = 0.0
        torch.cumsum(row[j:], dim=0, out=crow[j:])
        row[j] = 0.0


class TreeStepT:
    """One decoding iteration with a draft tree on the models' device (see the module docstring).

    Called as ``step(dec, ctx)`` by the decoder (its tracks ``dec.d``, ``dec.t``, device generators
    ``dec.device_gens``); returns the emitted tokens. :meth:`finish` fills the decoder's log after the loop.
    ``law_batch`` and ``clock`` are the decoder's batch of kept laws and its one clock (``log_laws``).
    """

    #: ``log_laws``: copy the root laws into blocks of ``law_batch`` rows (True) or compute their optimum after each
    #: iteration from its own blocks (False); None: copy everywhere but for ``"iid"`` on the CPU
    #: (:meth:`_keep_root_laws`).
    copy_root_laws: bool | None = None
    #: Read the accepted node on the host before its residual (:func:`verify_tree_t`'s ``host``): its rows read in
    #: place, its branch taken once, the same draws (bit for bit without numba; with its passes the level masses are
    #: summed in another order, see the module docstring). None: where reading waits for nothing (the CPU); on an
    #: accelerator the one host read of an iteration stays the only one.
    read_on_host: bool | None = None

    def __init__(self, plan, sampling, log_laws: bool, *, law_batch: int, clock):
        self.plan, self.sampling = plan, sampling
        self.rule = _RULES[type(plan.verifier)]
        self.log_laws = log_laws and plan.process in ("iid", "wor")
        self.needs_p = plan.process not in ("topk", "eagle2") or self.rule != "target-only"
        self.grow = None  # on the draft's device, built at the first call
        self.lay_t = None  # on the target's device
        self.dev_log: list = []
        self.law_batch, self.clock = law_batch, clock  # the decoder's batch of kept laws and its one clock
        self.kept: list = []  # log_laws: the root laws (p, q) kept until the next flush (:meth:`_keep_root_laws`)
        self.kept_logits = False  # whether self.kept holds the root logits (copied), not laws
        self.p_totals: list = []  # the draft laws' totals of an iteration's rows, as its draws summed them (or none)
        self.alpha_wor: list = []
        self.parents = getattr(plan.shape, "parents", None)  # a static shape's (an EAGLE-2 tree's: per iteration)
        # float64 law blocks overwritten every iteration; on the CPU handed on from one decode to the next (_BlockPool)
        self._blocks, self._blocks_lease = _POOL.take()

    def _fill(self, tokens, j: int, P, logits, lse):
        """The children of the frontier of depth ``j`` from its laws ``P`` (``"topk"``: its logits and their
        log-sum-exp); the flags of supports too small for the children (None for ``"iid"``)."""
        g, process = self.grow, self.plan.process
        if process == "iid":
            vals = _draws(P, g.width[j], self.gd, work=self._blocks, host=self._reads_host(P.device))
            vals = vals.flatten().index_select(0, g.cell[j])
            return tokens.index_copy_(0, g.dst[j], vals), None
        if process == "wor":  # P: rows of the step's own block, restored bit for bit after the draws
            top, short = _draws_wor(P, g.most[j], g.need[j], self.gd, work=self._blocks, in_place=True,
                                    host=self._reads_host(P.device), totals=self.p_totals)
        else:  # the draft's own law (temperature 1, untruncated) ranks as its logits do: no float64 law is formed
            vals, top = torch.topk(logits, g.most[j], dim=-1)
            kth = vals.gather(1, (g.need[j] - 1)[:, None])[:, 0].to(torch.float64)
            lse = torch.logsumexp(logits.float(), -1) if lse is None else lse
            short = ~(torch.exp(kth - lse.to(torch.float64)) > 0)  # the need-th token's own probability
        vals = top.flatten().index_select(0, g.src[j] * g.most[j] + g.rank[j])
        return tokens.index_copy_(0, g.dst[j], vals), short

    def __call__(self, dec, ctx: list[int]) -> list[int]:
        plan, d, t = self.plan, dec.d, dec.t
        ddev, tdev = torch.device(d.lm.device), torch.device(t.lm.device)
        self.gd, gt = dec.device_gens
        if self.grow is None:
            self.grow = _Grow(plan, ddev)
            self.lay_t = self.grow.lay if tdev == ddev else TreeLayoutT(
                plan.shape.parents, plan.shape.depth, self.grow.lay.inner_np, tdev)
        g = self.grow
        # -- draft: the root, then one call per depth on the frontier's rows; tokens and laws stay on the device
        pending = d.sync(ctx)
        logits = d.logits_ids(torch.tensor([pending], dtype=torch.long).to(ddev, non_blocking=True), last=1)[:, -1]
        tokens = torch.full((plan.shape.n + 1,), -1, dtype=torch.long, device=ddev)
        flags, shorts, raws = [], [], []
        length, batch, row = len(ctx), 1, 0
        Pb = None
        self.p_totals = []
        if self.needs_p:  # the draft's laws at the nodes with children, in a block kept across iterations
            Pb = _block(self._blocks, "P", (g.lay.inner_np.shape[0], int(logits.shape[-1])), ddev)
        for j in range(g.D):
            raws.append(logits)
            P = lse = None
            if self.needs_p:
                P = _laws_into(self.sampling, logits, Pb[row : row + int(logits.shape[0])])
                row += int(logits.shape[0])
                flags.append(bad_rows(P))
            else:  # top-k children verified by the target-only rule: the draft's laws are never read
                lse = torch.logsumexp(logits.float(), -1)
                flags.append(~torch.isfinite(lse))
            tokens, short = self._fill(tokens, j, P, logits, lse)
            if short is not None:
                shorts.append(short)
            if j + 1 < g.D:
                prow = plan.parent_rows[j + 1]
                if not _is_repeat(prow, batch):
                    d.lm.select(d.state, prow.tolist(), length)
                feed = tokens.index_select(0, g.frontier[j + 1])[:, None]
                logits = d.logits_ids(feed, last=1)[:, -1]
                length, batch = length + 1, int(feed.shape[0])
        d.seq = list(ctx)
        # the flags of bad draft laws and too small supports, read with the outcome (every token id is in [0, V)
        # whatever the laws: the target's call on them is harmless, its result dropped where a flag is set)
        dflags = torch.cat(flags + shorts)  # bools, promoted to int64 by the read's one cat (no cast op)
        n1 = plan.shape.n + 1
        tokens_t = tokens.to(tdev, non_blocking=True)
        # -- target: one call scores every node from the tree's tokens on the device; its laws stay there
        pending_t = t.sync(ctx)
        logits = t.lm.tree_logits(t.state, self.parents, tokens_t, pending=pending_t, fallback="rows")
        t.calls += 1
        t.batch = 1
        t.seq = list(ctx)
        host = self._reads_host(tdev)
        Q, q_at, leaf = self._target_laws(logits, self.lay_t.inner, self.lay_t.inner_rows, host=host)
        P_inner = Pb.to(tdev, non_blocking=True) if Pb is not None else None
        totals = self.p_totals if len(self.p_totals) == g.lay.inner_np.shape[0] else None
        a, y, mass = verify_tree_t(self.rule, self.lay_t, tokens_t, P_inner, Q, q_at, gt, work=self._blocks,
                                   host=host, totals=totals)
        # -- the one host read of the iteration: the accepted node, the emitted token, the tree's tokens, the
        # flags of bad draft laws or small supports, then of bad target laws
        nd = int(dflags.shape[0])
        res = torch.cat([a, y, tokens_t, dflags.to(tdev, non_blocking=True), bad_rows(Q),
                         _leaf_flag(leaf, tdev)]).tolist()
        tok = res[2 : 2 + n1]
        if any(res[2 + n1 : 2 + n1 + nd]):
            self._refuse(dec, ctx, res[2 + n1 : 2 + n1 + nd], tok, Pb, raws)
        if any(res[2 + n1 + nd :]):
            self._refuse_target(dec, ctx, res[2 + n1 + nd :], tok, res[0])
        a, y = int(res[0]), int(res[1])
        paths = self._paths(tok)
        out = list(paths[a]) + [y]
        # -- caches: the draft keeps the row sharing the longest prefix with the emitted tokens
        rows = [paths[int(v)] for v in plan.frontier[-1]] if g.D > 1 else [()]
        full = tuple(out)
        best = max(range(len(rows)), key=lambda r: _common(rows[r], full))
        d.sync(ctx + out, row=best, row_seq=ctx + list(rows[best]))
        by_depth = torch.zeros(plan.L + 1, dtype=torch.float64, device=tdev).index_add_(0, self.lay_t.depth, mass)
        # the root optimum of a deterministic tree, logged for "topk" (iid and wor log theirs from the kept root laws)
        alpha = self._root_alpha(self.lay_t, tokens_t, Q) if plan.process == "topk" else by_depth[0]
        self.dev_log.append(torch.cat([by_depth, alpha[None]]))
        if self.log_laws:
            self._keep_root_laws(dec, P_inner[0], Q[0], raws[0][0], logits[0])  # the root is inner[0]
        tau = int(plan.shape.depth[a])
        reached = np.zeros(plan.L)
        reached[:tau] = 1.0
        dec._record(tau, len(out), 1, math.nan, math.nan, 1.0, reached, np.full(plan.L, math.nan))
        return out

    def _target_flags(self, Q, logits, rows, formed=None):
        """The flags of bad target laws at ``Q``'s rows (:func:`bad_rows`), bool (the read's cat promotes them: no
        cast op); where ``formed`` (host booleans)
        says a row's law was not formed, from its logits: the plain law (the only one left unformed, see
        :meth:`_target_laws`) is NaN exactly where the row's largest logit is not finite (a NaN, a ``+inf``, or every
        entry ``-inf``)."""
        if formed is None or all(formed):
            return bad_rows(Q)
        idx = rows.tolist()
        return torch.cat([bad_rows(Q[i : i + 1]) if f else ~torch.isfinite(logits[idx[i]].amax())[None]
                          for i, f in enumerate(formed)])

    def _target_laws(self, logits, rows, row_slice=None, *, host: bool = False, formed=None):
        """The float64 target laws the rules read, on the target's device: ``Q`` at the nodes ``rows`` (those with
        children; ``row_slice`` the same rows as a slice where they are consecutive: the logits there are read in
        place), written into a block kept across iterations, and ``q_at`` for the accepted node's (its
        bonus token's when a leaf; a one-row block), with the list that receives the flag of a bad law there (read
        when the law is formed: the verification writes the residual over it). The logits of rows chosen on the
        device are gathered into a block kept across iterations too; with ``host`` (the rows read where reading
        waits for nothing: the CPU) each row is copied straight into ``Q``'s block, or read in place by ``q_at``,
        with no gathered copy (the same values). ``formed`` (host booleans, the plain law only): the rows whose law
        is formed; the others keep whatever the block held (no rule may read them; :meth:`_target_flags` flags them
        from their logits)."""
        V = int(logits.shape[-1])
        dev, blocks = logits.device, self._blocks
        Qb = _block(blocks, "Q", (int(rows.shape[0]), V), dev)
        if row_slice is not None:
            Q = _laws_into(self.sampling, logits[row_slice], Qb)
        elif host and _plain(self.sampling) and formed is not None and not all(formed):  # the rows read only
            for i, v in enumerate(rows.tolist()):
                if formed[i]:
                    torch.softmax(Qb[i].copy_(logits[v]), dim=-1, out=Qb[i])
            Q = Qb
        elif host and _plain(self.sampling):  # the float64 logits written row by row, then the softmax in place
            for i, v in enumerate(rows.tolist()):
                Qb[i].copy_(logits[v])
            Q = torch.softmax(Qb, dim=-1, out=Qb)
        else:
            at = torch.index_select(logits, 0, rows, out=_block(blocks, "sel", (int(rows.shape[0]), V), dev,
                                                                 logits.dtype))
            Q = _laws_into(self.sampling, at, Qb)
        leaf: list = []

        def q_at(v):
            qb = _block(blocks, "q", (1, V), dev)
            if host:
                at = logits.narrow(0, int(v[0]), 1)
            else:
                at = torch.index_select(logits, 0, v, out=_block(blocks, "sel", (1, V), dev, logits.dtype))
            law = _laws_into(self.sampling, at, qb)
            leaf.append(bad_rows(law))
            return law

        return Q, q_at, leaf

    def _reads_host(self, device) -> bool:
        """Whether the verification reads the accepted node on the host (:attr:`read_on_host`)."""
        return torch.device(device).type == "cpu" if self.read_on_host is None else bool(self.read_on_host)

    def _keep_root_laws(self, dec, p, q, lp, lq) -> None:
        """Keep the root's draft and target laws ``p``, ``q`` (their logits ``lp``, ``lq``) for their optimum
        (:meth:`_flush`, timed as analysis, outside the wall time). For ``"iid"`` on the CPU the optimum (a sort) is
        computed at once from the iteration's own law blocks (no copy: a copy of two rows of ``8 V`` bytes is a pass
        the flush would cost anyway); elsewhere, and for ``"wor"`` (whose optimum is long host work: between
        iterations it evicted the models' weights from the caches and slowed the next forwards), the root's
        *logits* are copied into the next rows of two blocks of ``law_batch`` rows in the models' dtype, kept across
        iterations (no fresh block), and their laws formed again when the blocks are flushed (full, or after the
        loop): the same values bit for bit (a row's law depends on that row's logits only), from half the bytes of
        float64 laws or less (every row of a block is fresh memory the first time it is written: its page faults
        are most of a copy's cost), as the decoder keeps a chain's first laws."""
        copy = self.copy_root_laws
        if copy is None:  # "wor": its optimum is host work of about 0.2 s a root at V = 128,256, kept after the loop
            copy = p.device.type != "cpu" or self.plan.process == "wor"
        if not copy:
            self.kept.append((p, q))
            self._flush(dec)
            return
        ring, V, dev = self.law_batch, int(p.shape[-1]), q.device
        i = len(self.kept)
        Pr, Qr = (_block(self._blocks, name, (ring, V), dev, x.dtype) for name, x in (("rootP", lp), ("rootQ", lq)))
        self.kept.append((Pr[i].copy_(lp, non_blocking=True), Qr[i].copy_(lq)))
        self.kept_logits = True
        if len(self.kept) == ring:
            self._flush(dec)

    def _root_laws(self, dec) -> None:
        """The kept root logits (:meth:`_keep_root_laws`) made laws again, in place of them in ``self.kept``, timed as
        analysis: row by row, each as the iteration formed it (:func:`_laws_into` on its own logits)."""
        if not (self.kept and self.kept_logits):
            return
        dev = self.kept[0][1].device
        a0 = self.clock(dev)
        n, V = len(self.kept), int(self.kept[0][1].shape[-1])
        P, Q = (torch.empty((n, V), dtype=torch.float64, device=dev) for _ in range(2))
        for i, (lp, lq) in enumerate(self.kept):
            _laws_into(self.sampling, lp[None], P[i : i + 1])
            _laws_into(self.sampling, lq[None], Q[i : i + 1])
        self.kept, self.kept_logits = list(zip(P, Q)), False
        dec.analysis_time += self.clock(dev) - a0

    def _paths(self, tok: list[int], parents=None) -> list[tuple]:
        """The token path of every node, from the tree's tokens (the shape's ancestors, or ``parents``; no tree
        object built)."""
        parents = self.parents if parents is None else parents
        paths: list = [()] * len(tok)
        for v in range(1, len(tok)):
            paths[v] = paths[int(parents[v])] + (tok[v],)
        return paths

    @staticmethod
    def _root_alpha(lay, tokens, Q):
        """The target mass of the root's distinct children: the optimum of a deterministic tree at the root."""
        x = tokens.index_select(0, lay.kids0[0])
        first = ~((x[:, None] == x[None, :]) & lay.earlier).any(-1) & lay.valid[0]
        return torch.where(first, Q[0].index_select(0, x), _scalar(0.0, Q.dtype, Q.device)).sum()

    def _flush(self, dec) -> None:
        r"""The optimum at the root of the kept root laws, timed as analysis (excluded from ``wall_time``): for
        ``"iid"`` :math:`\alpha_K` by the decoder's batch (one sort on the device), for ``"wor"`` its analogue
        without replacement on the host, one root at a time; the laws are then dropped."""
        self._root_laws(dec)
        if self.plan.process == "iid":
            dec.first_laws, self.kept = self.kept, []
            dec._flush_first_laws()
            return
        if self.kept:
            a0 = self.clock(self.kept[0][0].device)
            # the kept roots' laws brought to the host WOR_FLUSH_ROOTS roots a copy (one synchronisation each, not
            # two per root; a copy of at most 2 WOR_FLUSH_ROOTS rows), the optimum of each root on the host
            for c in range(0, len(self.kept), WOR_FLUSH_ROOTS):
                laws = torch.stack([x for pq in self.kept[c : c + WOR_FLUSH_ROOTS] for x in pq]).to("cpu").numpy()
                for i in range(laws.shape[0] // 2):
                    p, q = laws[2 * i], laws[2 * i + 1]
                    self.alpha_wor.append(float(otspec.alpha_k(p, q, self.plan.k, replacement=False)))
            dec.analysis_time += self.clock(self.kept[0][0].device) - a0
            self.kept = []

    def finish(self, dec) -> None:
        """The per-iteration predictions from the logged device values (one transfer), after the loop; the step's
        blocks handed back to the pool (:class:`_BlockPool`): the step is not called again."""
        try:
            self._finish(dec)
        finally:
            _POOL.give(self._blocks, self._blocks_lease)
            self._blocks, self._blocks_lease = {}, None

    def _finish(self, dec) -> None:
        if not self.dev_log:
            return
        L, lg = self.plan.L, dec.log
        A = torch.stack(self.dev_log).to("cpu").numpy()  # (N, L + 2): the law of the accepted depth, root alpha
        by_depth = A[:, : L + 1]
        pred_reached = np.cumsum(by_depth[:, ::-1], axis=1)[:, ::-1][:, 1:]
        pred_acc = by_depth @ np.arange(L + 1)
        lg["pred_reached"] = list(pred_reached)
        lg["pred_acc"] = list(pred_acc)
        lg["pred_emit"] = list(pred_acc + 1.0)
        lg["alpha1"] = list(pred_reached[:, 0])
        if self.plan.process in ("topk", "eagle2"):
            lg["alpha_opt1"] = list(A[:, L + 1])
        elif self.log_laws:
            self._flush(dec)
            got = self.alpha_wor if self.plan.process == "wor" else torch.cat(dec.alpha_opt).to("cpu").tolist()
            lg["alpha_opt1"] = list(got)
        else:
            lg["alpha_opt1"] = [math.nan] * A.shape[0]

    def _refuse(self, dec, ctx, flags, tok, P, raws) -> None:
        """ValueError for a draft law from non-finite logits, or a node whose law has too few tokens."""
        nb = sum(int(r.shape[0]) for r in raws)
        bad, short = flags[:nb], flags[nb:]
        paths = self._paths(tok)
        inner = np.concatenate(self.plan.frontier)
        if any(bad):
            v = int(inner[bad.index(1)])
            _bad_logits("draft", dec.d.lm, len(ctx) + len(paths[v]))
        i = short.index(1)
        v = int(inner[i])
        need = int(torch.cat(self.grow.need)[i])
        law = (P[i] if P is not None else self.sampling.own_law(torch.cat(raws)[i])).to("cpu").numpy()
        raise _support_error(self.plan.process, need, paths[v], law)

    def _refuse_target(self, dec, ctx, flags, tok, a: int) -> None:
        paths = self._paths(tok)
        i = flags.index(1)
        v = int(self.lay_t.inner_np[i]) if i < len(self.lay_t.inner_np) else a
        _bad_logits("target", dec.t.lm, len(ctx) + len(paths[v]))


# ----------------------------------------------------------------------------- EAGLE-2's dynamic trees
#: Largest ``k`` that :func:`ranked_rows_t` ranks by ``k`` passes of a row maximum (beyond it: two top-k passes).
RANK_BY_MAXIMA = 6


def ranked_rows_t(R, k: int, *, in_place: bool = False):
    r"""The ``k`` most likely tokens of every row of ``R``, ties by lower id, and their values, with no host read.

    .. math::

        \text{ids}_{b, r} = \text{the } r\text{-th token of row } b \text{ in decreasing } R_b,
        \text{ ties by lower id}, \qquad \text{vals}_{b, r} = R_b(\text{ids}_{b, r}), \qquad r < k,

    the order of :func:`otspec.tree._process._ranked` (so the same children as the host route). Two exact routes:

    * ``k <= RANK_BY_MAXIMA``: ``k`` passes of ``torch.max`` over a copy of the rows, each pick set to
      :math:`-\infty` before the next pass (``torch.max`` returns the first maximal index: ties by lower id);
      on this project's CPU a pass costs a fifth of a top-k at ``V = 128,256``;
    * larger ``k``: a top-``k`` gives the ``k``-th largest value ``t_b``; a second top-``k``, of an integer key
      (:math:`2V - x` above :math:`t_b`, :math:`V - x` equal to it, 0 below) chooses the tokens above it and the
      lowest-id tokens equal to it, above ones first, each group by increasing id (no ``nonzero``, whose size a GPU
      would read); a stable sort by decreasing value orders them (ten ops).

    Parameters
    ----------
    R : torch.Tensor of float, shape ``(B, V)``
        Non-negative rows (laws); a row of NaN (bad logits) gives ids in ``[0, V)`` and NaN values.
    k : int
        ``1 <= k <= V``.
    in_place : bool, keyword-only
        Let the passes of a row maximum mark their picks in ``R`` itself instead of a copy, and write the picks'
        values back before returning (``R`` ends bit for bit as it was; a pass over ``R`` saved): for a block the
        caller owns, never for a tensor another reader may see meanwhile.

    Returns
    -------
    ids : torch.Tensor of int64, shape ``(B, k)``
    vals : torch.Tensor, shape ``(B, k)``, the dtype of ``R``
        A row with fewer than ``k`` positive entries ends with zeros (``vals[:, k - 1] = 0``); a NaN row gives NaN.

    Examples
    --------
    >>> import torch
    >>> from otspec.decoding._tree_device import ranked_rows_t
    >>> p = torch.tensor([[0.1, 0.4, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    >>> ranked_rows_t(p, 3)[0].tolist()
    [[1, 3, 0], [0, 1, 2]]
    """
    if k <= RANK_BY_MAXIMA:
        return _ranked_by_maxima(R, k, in_place)
    V, dev = R.shape[1], R.device
    kth = torch.topk(R, k, dim=-1).values[:, k - 1 :]  # the k-th largest value of each row
    # one key ranks the k chosen first: the tokens above the k-th value (V + 1 .. 2 V, lower ids higher), then the
    # tokens equal to it (1 .. V, lower ids higher), 0 elsewhere -- distinct where positive, at least k positive;
    # the top-k of the key gives them in that order (the k-th value's ties: the lowest ids)
    kt = torch.int32 if 2 * V < 2**31 else torch.int64  # half the bytes a pass over V moves
    key = torch.where(R > kth, _arange(2 * V, V, -1, dev, kt),
                      torch.where(R == kth, _arange(V, 0, -1, dev, kt), _scalar(0, kt, dev)))
    ids = torch.topk(key, k, dim=-1).indices
    # by decreasing value, stably: equal values above the k-th keep the lower id first, the ties follow in id order
    vals, order = torch.sort(R.gather(1, ids), dim=-1, descending=True, stable=True)
    return ids.gather(1, order), vals


def _ranked_by_maxima(R, k: int, in_place: bool):
    """:func:`ranked_rows_t` by ``k`` passes of ``torch.max`` (first maximal index) over a copy of ``R`` (made by the
    first pick's out-of-place mark; over ``R``, restored after, when ``in_place``); the picks joined once at the end."""
    if k == 1:
        vals, ids = torch.max(R, dim=-1, keepdim=True)
        return ids, vals
    W = R
    picks = []
    for r in range(k):
        picks.append(torch.max(W, dim=-1, keepdim=True))
        if r + 1 < k:  # the first mark of a copy writes the copy (no clone before it)
            W = W.scatter_(1, picks[-1][1], -math.inf) if in_place or r else R.scatter(1, picks[-1][1], -math.inf)
    vals, ids = torch.cat([v for v, _ in picks], 1), torch.cat([i for _, i in picks], 1)
    if in_place:
        W.scatter_(1, ids[:, : k - 1], vals[:, : k - 1])
    return ids, vals


def ranked_rows_host(R, k: int):
    """:func:`ranked_rows_t` of a float64 CPU block read in place, one pass per row (:func:`_top_k_rows`, compiled by
    numba): the same ids and values bit for bit. Rows with a NaN, a block of another kind, or no numba: the torch
    route itself. For the host route of a decoder (the CPU), where ``ranked_rows_t``'s ``k`` passes of a row
    maximum and their marks cost about twice one pass."""
    if (_TOP_K_COMPILED and R.device.type == "cpu" and R.dtype == torch.float64 and R.ndim == 2 and R.is_contiguous()
            and not R.requires_grad):
        B = int(R.shape[0])
        ids, vals = np.empty((B, k), dtype=np.int64), np.empty((B, k), dtype=np.float64)
        if _top_k_rows(R.numpy(), k, ids, vals):
            return torch.from_numpy(ids), torch.from_numpy(vals)
    return ranked_rows_t(R, k)


#: Columns a block of :func:`_top_k_rows` tests at once against the row's current ``k``-th value.
TOP_K_BLOCK = 512


def _top_k_insert(row, i0, i1, k, n, ids, vals, b):
    """Insert ``row[i0:i1]`` into the sorted ``(vals[b], ids[b])`` (``n`` entries so far, at most ``k``): an entry
    moves in only when strictly larger than the ``k``-th, and past the entries strictly smaller, so equal values
    keep the lower id first. Returns the new ``n``."""
    for i in range(i0, i1):
        v = row[i]
        if n < k or v > vals[b, k - 1]:
            j = n if n < k else k - 1
            while j > 0 and v > vals[b, j - 1]:
                vals[b, j] = vals[b, j - 1]
                ids[b, j] = ids[b, j - 1]
                j -= 1
            vals[b, j] = v
            ids[b, j] = i
            if n < k:
                n += 1
    return n


def _top_k_rows(R, k, ids, vals):
    r"""The ``k`` largest entries of every row of ``R`` (``(B, V)``, ``k <= V``) in decreasing order, ties by lower
    id, written into ``ids`` and ``vals`` (``(B, k)``); False (and nothing to use) when a row holds a NaN.

    One pass per row: a block of :data:`TOP_K_BLOCK` columns is scanned for an entry above the current ``k``-th
    value (or a NaN), a vectorised count, and only such a block is inserted entry by entry
    (:func:`_top_k_insert`). Every entry left out of a block is at most the ``k``-th value held when it was
    tested, which only grows, and comes after the entries held (a larger id): ranked after them in the order
    "value descending, id ascending", so the result is that order's first ``k`` entries.
    """
    B, V = R.shape
    for b in range(B):
        row = R[b]
        for i in range(k):
            if row[i] != row[i]:
                return False
        n = _top_k_insert(row, 0, k, k, 0, ids, vals, b)
        for i0 in range(k, V, TOP_K_BLOCK):
            i1 = min(i0 + TOP_K_BLOCK, V)
            thr = vals[b, k - 1]
            c = 0
            for i in range(i0, i1):
                v = row[i]
                c += (v > thr) | (v != v)
            if c:
                for i in range(i0, i1):
                    if row[i] != row[i]:
                        return False
                n = _top_k_insert(row, i0, i1, k, n, ids, vals, b)
    return True


_TOP_K_COMPILED = compile_in(globals(), ("_top_k_insert", "_top_k_rows"))


# ----------------------------------------------------------------------------- the CPU route's passes over V (numba)
if HAVE_NUMBA:  # pragma: no branch - the ``fast`` extra
    from numba.core import types as _nb_types
    from numba.extending import intrinsic as _nb_intrinsic

    @_nb_intrinsic
    def _fma(typingctx, a, b, c):
        """``a * b + c`` rounded once (LLVM's ``fma``): the product and sum of torch's ``addcmul`` on the CPU, whose
        vectorised kernel fuses them."""
        sig = _nb_types.float64(_nb_types.float64, _nb_types.float64, _nb_types.float64)

        def codegen(context, builder, signature, args):
            return builder.fma(*args)

        return sig, codegen
else:  # pragma: no cover - the kernels below are not called without numba
    def _fma(a, b, c):
        return a * b + c


def _level_sums(Q, P, rows, minus_t, out):
    r""":math:`S_k = \sum_x (Q_{r_k}(x) - t_k P_{r_k}(x))_+` for the rows ``rows[k]`` of ``Q`` and ``P`` (``(I, V)``
    float64), ``minus_t[k]`` :math:`= -t_k`, written into ``out[k]``: one read of the two rows, nothing written (torch's
    ``addcmul``, ``clamp_`` and ``sum`` write and read a third row twice). Each term is rounded as ``addcmul`` rounds it
    (one fused multiply-add, then the clamp: a NaN stays NaN); the terms are summed in four interleaved running sums
    (entries ``4 s + 0..3``), then ``(s_0 + s_1) + (s_2 + s_3)``: another order than torch's ``sum``, so the sum may
    differ from it by the rounding of a sum of ``V`` non-negative terms (relative ``V`` ulps at most, far less in
    practice); it is 0 exactly when every term is, as torch's."""
    V = Q.shape[1]
    n4 = V - V % 4
    for k in range(rows.shape[0]):
        r, m = rows[k], minus_t[k]
        a0 = a1 = a2 = a3 = 0.0
        for v in range(0, n4, 4):
            w0 = _fma(P[r, v], m, Q[r, v])
            w1 = _fma(P[r, v + 1], m, Q[r, v + 1])
            w2 = _fma(P[r, v + 2], m, Q[r, v + 2])
            w3 = _fma(P[r, v + 3], m, Q[r, v + 3])
            a0 += w0 if not w0 < 0.0 else 0.0
            a1 += w1 if not w1 < 0.0 else 0.0
            a2 += w2 if not w2 < 0.0 else 0.0
            a3 += w3 if not w3 < 0.0 else 0.0
        for v in range(n4, V):
            w = _fma(P[r, v], m, Q[r, v])
            a0 += w if not w < 0.0 else 0.0
        out[k] = (a0 + a1) + (a2 + a3)


#: Entries per block of the running sums' checkpoints (:func:`_cum_from`, :func:`_cum_find`).
CDF_BLOCK = 512


def _add_term(c, q, p, m, v, picks, b, r):
    r"""``c`` plus the term ``v`` of :math:`(q + m\,p)_+` (one fused multiply-add, then the clamp: ``addcmul`` and
    ``clamp_``'s rounding; a NaN stays NaN), or ``c`` itself where ``v`` is one of ``picks[b, :r]``."""
    for s in range(r):
        if picks[b, s] == v:
            return c
    w = _fma(p[v], m, q[v])
    return c + (w if not w < 0.0 else 0.0)


def _cum_from(q, p, m, start, c, picks, b, r, cp):
    r"""The running sums of :math:`w = (q + m\,p)_+` (``q``, ``p`` rows of ``V`` float64; each term as ``addcmul`` and
    ``clamp_`` round it, one fused multiply-add: ``p = q`` with ``m = 0`` gives ``q`` itself) from the token ``start``
    on, continuing ``c`` (the running sum before ``start``), the tokens ``picks[b, :r]`` left out (as 0: ``c + 0 = c``),
    added in order as the CPU's ``torch.cumsum`` adds them; nothing written but the running sum at the end of every
    block of :data:`CDF_BLOCK` tokens from ``start``'s on, into ``cp`` (the checkpoints :func:`_cum_find` starts from;
    those before stand). Returns the last running sum, the total: bit for bit ``torch.cumsum(w)[-1]``."""
    V = q.shape[0]
    k = start // CDF_BLOCK
    i = start
    while k < cp.shape[0]:
        end = min(V, (k + 1) * CDF_BLOCK)
        for v in range(i, end):
            c = _add_term(c, q, p, m, v, picks, b, r)
        cp[k] = c
        i = end
        k += 1
    return c


def _cum_find(q, p, m, at, tot, cp, picks, b, r):
    r"""The token of ``draw_rows``' ``"cdf"`` rule on the running sums :math:`c` of :func:`_cum_from` (the same ``q``,
    ``p``, ``m`` and left-out tokens, its checkpoints ``cp`` and total ``tot``): the first ``i`` with :math:`c_i >`
    ``at`` (the uniform times the total), else (a uniform rounded up to the total) the first with :math:`c_i \ge`
    ``tot``, at most ``V - 1`` -- ``torch.searchsorted`` on ``torch.cumsum`` bit for bit. The first block whose
    checkpoint passes is found among the checkpoints (the sums do not decrease), the sums inside it added again from
    the checkpoint before it: at most :data:`CDF_BLOCK` additions. Returns ``(i, c_{i-1})`` (the running sum before
    ``i``; -1 where none passes: a NaN)."""
    V = q.shape[0]
    nb = cp.shape[0]
    strict = True
    k = 0
    while k < nb and not cp[k] > at:
        k += 1
    if k == nb:
        strict = False
        k = 0
        while k < nb and not cp[k] >= tot:
            k += 1
        if k == nb:
            return V - 1, -1.0
    c = cp[k - 1] if k > 0 else 0.0
    end = min(V, (k + 1) * CDF_BLOCK)
    for v in range(k * CDF_BLOCK, end):
        before = c
        c = _add_term(c, q, p, m, v, picks, b, r)
        if (c > at) if strict else (c >= tot):
            return v, before
    return V - 1, -1.0  # unreachable: the block's checkpoint passes


def _blocks(V):
    """The number of :data:`CDF_BLOCK` blocks of ``V`` tokens (at least one)."""
    return max(1, (V + CDF_BLOCK - 1) // CDF_BLOCK)


def _residual_draw(q, p, m, u):
    """One draw of ``draw_rows``' ``"cdf"`` rule from :math:`w = (q + m\\,p)_+` with the uniform ``u``: ``(token,
    total)``, bit for bit ``torch.searchsorted`` on ``torch.cumsum(w)`` and its last entry (:func:`_cum_from`,
    :func:`_cum_find`): one read of the row, then at most :data:`CDF_BLOCK` additions."""
    cp = np.empty(_blocks(q.shape[0]))
    none = np.zeros((1, 0), dtype=np.int64)
    tot = _cum_from(q, p, m, 0, 0.0, none, 0, 0, cp)
    return _cum_find(q, p, m, u * tot, tot, cp, none, 0, 0)[0], tot


def _wor_rows(P, u, picks, tots):
    r"""``most`` draws without replacement from every row of ``P`` (``(B, V)`` float64, non-negative), the ``"cdf"``
    rule of :func:`_draws_wor` with no running sum written: the draw ``r`` of row ``b`` is the first token ``i`` whose
    running sum :math:`c_i` of the row with the tokens drawn before set to 0 exceeds ``u[r, b]`` times its total (else,
    a uniform rounded up to the total, the first ``i`` with :math:`c_i \ge` the total; at most ``V - 1``), written into
    ``picks[b, r]``, the total into ``tots[b, r]``. The running sums are those of ``torch.cumsum`` on the CPU (added in
    order from 0) bit for bit, so the draws and totals are those of the draw-by-draw rule.

    The sums before a drawn token ``j`` do not change when it is set to 0: the next draw's sums are added again from
    ``j`` on only, from the sum before it (:func:`_cum_from`), and each draw is found from the checkpoints of its sums
    (:func:`_cum_find`): per row one read, then ``V - j`` entries per later draw."""
    B, V = P.shape
    most = picks.shape[1]
    cp = np.empty(_blocks(V))
    for b in range(B):
        row = P[b]
        start, c0 = 0, 0.0
        for r in range(most):
            tot = _cum_from(row, row, 0.0, start, c0, picks, b, r, cp)
            j, before = _cum_find(row, row, 0.0, u[r, b] * tot, tot, cp, picks, b, r)
            picks[b, r], tots[b, r] = j, tot
            if before >= 0.0:
                start, c0 = j, before
            else:  # a NaN: the sums again from 0
                start, c0 = 0, 0.0


def _iid_rows(P, u, picks):
    r"""``k`` independent draws from every row of ``P`` (``(B, V)`` float64, non-negative; ``u`` ``(B, k)`` uniforms),
    :func:`_draws`' rule with no running sum written: draw ``s`` of row ``b`` is the first ``i`` whose running sum
    :math:`c_i` exceeds ``u[b, s]`` times the total (else the first ``i`` with :math:`c_i \ge` the total; at most
    ``V - 1``), written into ``picks[b, s]``. The running sums are ``torch.cumsum``'s on the CPU (added in order from
    0) bit for bit: one read of the row for the total and the checkpoints (:func:`_cum_from`), then at most
    :data:`CDF_BLOCK` additions per draw (:func:`_cum_find`)."""
    B, V = P.shape
    cp = np.empty(_blocks(V))
    for b in range(B):
        row = P[b]
        tot = _cum_from(row, row, 0.0, 0, 0.0, picks, b, 0, cp)
        for s in range(u.shape[1]):
            picks[b, s] = _cum_find(row, row, 0.0, u[b, s] * tot, tot, cp, picks, b, 0)[0]


def _addcmul_fuses() -> bool:
    """Whether torch's ``addcmul`` rounds ``q + p m`` once on this CPU (a fused multiply-add, as the numba passes'
    terms: :func:`_add_term`): :math:`(1 + 2^{-30})(1 - 2^{-30}) - 1 = -2^{-60}` once rounded, 0 when the product is
    rounded first, on a row long enough for the vectorised kernel and its tail. Where it does not, the passes would
    not round as torch does: they are left off (torch's passes run, bit for bit)."""
    q = torch.full((2, 67), -1.0, dtype=torch.float64)
    p = torch.full((2, 67), 1.0 + 2.0**-30, dtype=torch.float64)
    m = torch.full((2, 1), 1.0 - 2.0**-30, dtype=torch.float64)  # a level per row, as the rules pass it
    return bool((torch.addcmul(q, p, m) == -(2.0**-60)).all())


_PASSES_COMPILED = compile_in(globals(), ("_level_sums", "_add_term", "_cum_from", "_cum_find", "_blocks",
                                          "_residual_draw", "_wor_rows", "_iid_rows")) and _addcmul_fuses()


class Eagle2LayoutT:
    r"""The layout of one realised EAGLE-2 tree for :func:`node_rules_t` and :func:`verify_tree_t`, built on the
    device from the expansion's record (no host read).

    Its rows are the expanded nodes (*slots*), static in number, ``E = 1 + (D - 1) K``: the root, then each
    level's frontier; ``kids[s, r]`` the node of the ``r``-th proposed child of slot ``s`` when kept, else -1 (a
    prefix of each row: the children of a node keep the order of their probabilities). A slot not kept (no kept
    child either) or kept without children is a row with no child; its scatters go to a dump entry ``n + 1``
    (``n_out = n + 2``), and ``row_of`` maps a node to its slot only when it has children (a kept leaf draws its
    bonus token from its own ``q``). The levels of :func:`end_mass_t` are ``D`` passes over every node.
    """

    def __init__(self, parents, depth, slot_node, kids, L: int):
        dev = parents.device
        n1 = int(parents.shape[0])
        E, m = kids.shape
        self.n1, self.n_out, self.m, self.L = n1, n1 + 1, int(m), int(L)
        self.parents, self.depth, self.kids, self.slot_node = parents, depth, kids, slot_node
        self.valid = kids >= 0
        self.kids0 = torch.where(self.valid, kids, 1)  # node 1 (the root's first child) always exists
        nxt = torch.cat([self.valid[:, 1:], torch.zeros((E, 1), dtype=torch.bool, device=dev)], dim=1)
        self.last = self.valid & ~nxt
        self.inner = torch.where(slot_node >= 0, slot_node, n1)
        self.inner0 = torch.where(slot_node >= 0, slot_node, 0)  # a row of the target's logits for every slot
        rows = torch.where(self.valid[:, 0], self.inner, n1)
        self.walk_rows = rows  # the node of each row with children, n + 1 (a dump) for the others
        self.row_of = torch.full((n1 + 1,), -1, dtype=torch.long, device=dev).index_copy(
            0, rows, torch.arange(E, device=dev))[:n1]
        self.earlier = torch.ones((m, m), dtype=torch.bool, device=dev).tril(-1)
        self.kid_cells = torch.arange(E * m, device=dev)
        self.kid_nodes = torch.where(self.valid, kids, n1).flatten()
        nodes = torch.arange(1, n1, device=dev)
        self.every_parent = parents[1:].clamp(min=0)  # a tree from bad laws stays indexable
        self.levels = [(nodes, self.every_parent)] * self.L

    def to(self, device):
        """The same layout on ``device``."""
        if torch.device(device) == self.parents.device:
            return self
        return Eagle2LayoutT(*(v.to(device, non_blocking=True) for v in (self.parents, self.depth, self.slot_node,
                                                                           self.kids)), self.L)


class Eagle2TreeT:
    r"""EAGLE-2's expansion and reranking on the draft's device, one level per draft call, batched per depth.

    With ``K = top_k`` and ``D`` levels, proposal ``j`` gets the score
    :math:`s_j = s_{\text{parent}(j)} + \log r(x_j)`, :math:`r` the draft's own law at the parent (its softmax,
    temperature 1, untruncated, as EAGLE's and SGLang's drafters rank):

    * level 1: the root's ``K`` most likely tokens (proposals ``0..K-1``), every one expanded next;
    * level ``l >= 2``: each of the ``K`` expanded nodes (the frontier, in its order) proposes its ``K`` most
      likely children (proposals ``K + (l - 2) K^2 + f K + r``), and the next frontier is the ``K`` of these
      ``K^2`` with the largest scores, ties by the earlier proposal (one stable sort of ``K^2`` numbers);
    * the tree keeps the ``n`` proposals of largest score, ties by the earlier proposal (one stable sort of the
      ``K + (D - 1) K^2`` scores), in proposal order: prefix-closed, since a score never increases along a path.

    Exactly :func:`otspec.tree.sample_tree` with ``process="eagle2"`` (``otspec.tree``'s ``_eagle2_tree``) and the
    host route's grower, given the same laws (the tests hold the trees equal). The ``K`` most likely tokens come
    from :func:`ranked_rows_t` (ties by lower id, as the host route's sort); the frontier's rows are fed to the
    draft as their whole paths from the context (``(K, l)`` ids), so no cache row is selected by a value that
    only the device knows.

    References
    ----------
    Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
    arXiv:2406.16858, §4.1 (expansion by the top-k of cumulative scores) and §4.2 (reranking to the total token
    budget); SafeAILab/EAGLE ``eagle/model/cnets.py``, ``Model.topK_genrate``.
    """

    def __init__(self, params, device):
        K, D = int(params.top_k), int(params.depth)
        self.K, self.D, self.n = K, D, int(params.n)
        self.NP = K + (D - 1) * K * K
        self.E = 1 + (D - 1) * K
        self.start = [0] + [K + (lv - 1) * K * K for lv in range(1, D)]
        child = np.empty((self.E, K), dtype=np.int64)
        child[0] = np.arange(K)
        depth = np.ones(self.NP, dtype=np.int64)
        for lv in range(1, D):
            s0 = self.start[lv]
            child[1 + (lv - 1) * K : 1 + lv * K] = s0 + np.arange(K * K).reshape(K, K)
            depth[s0 : s0 + K * K] = lv + 1
        self.device = torch.device(device)
        self.child = torch.tensor(child, device=self.device)
        self.depth_prop = torch.tensor(depth, device=self.device)
        self.first = torch.arange(K, device=self.device)
        self.new()

    def new(self) -> None:
        """Forget the last tree (one per iteration)."""
        dev = self.device
        self.score = torch.empty(self.NP, dtype=torch.float64, device=dev)
        self.parent = torch.empty(self.NP, dtype=torch.long, device=dev)
        self.token = torch.empty(self.NP, dtype=torch.long, device=dev)
        self.path = torch.zeros((self.NP, self.D), dtype=torch.long, device=dev)
        self.slots: list = []

    def expand(self, lv: int, R, frontier, *, in_place: bool = False, host: bool = False):
        r"""The proposals of level ``lv + 1`` from the ranking laws ``R`` of level ``lv``'s expanded nodes (the root
        ``(1, V)`` for ``lv = 0``, else the frontier's ``(K, V)`` in its order); returns the next frontier (``(K,)``
        proposal ids, None after the last level) and the flags of laws with fewer than ``K`` positive tokens.
        ``in_place``: ``R`` is a block the caller owns (:func:`ranked_rows_t` marks it, then restores it);
        ``host``: ``R`` is ranked by :func:`ranked_rows_host` (the CPU; the same ids and values)."""
        K = self.K
        ids, vals = ranked_rows_host(R, K) if host else ranked_rows_t(R, K, in_place=in_place)
        short = ~(vals[:, K - 1] > 0)
        lp = torch.log(vals)
        if lv == 0:
            self.score[:K] = lp[0]
            self.parent[:K] = -1
            self.token[:K] = ids[0]
            self.path[:K, 0] = ids[0]
            nxt = self.first
        else:
            s0 = self.start[lv]
            blk = slice(s0, s0 + K * K)
            self.score[blk] = (self.score.index_select(0, frontier)[:, None] + lp).flatten()
            self.parent[blk] = frontier.repeat_interleave(K)
            self.token[blk] = ids.flatten()
            self.path[blk] = self.path.index_select(0, frontier).repeat_interleave(K, dim=0)
            self.path[blk, lv] = ids.flatten()
            nxt = torch.sort(self.score[blk], descending=True, stable=True).indices[:K] + s0
        if lv + 1 >= self.D:
            return None, short
        self.slots.append(nxt)
        return nxt, short

    def tree(self):
        """The kept tree: ``parents``, ``tokens`` (``-1`` at the root) and ``depth``, ``(n + 1,)`` int64 each, and
        its :class:`Eagle2LayoutT`, all on the draft's device."""
        dev, n = self.device, self.n
        kept = torch.sort(torch.sort(self.score, descending=True, stable=True).indices[:n]).values
        node_of = torch.full((self.NP,), -1, dtype=torch.long, device=dev).index_copy_(
            0, kept, torch.arange(1, n + 1, device=dev))
        par = self.parent.index_select(0, kept)
        root = torch.full((1,), -1, dtype=torch.long, device=dev)
        parents = torch.cat([root, torch.where(par >= 0, node_of.index_select(0, par.clamp(min=0)), 0)])
        tokens = torch.cat([root, self.token.index_select(0, kept)])
        depth = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), self.depth_prop.index_select(0, kept)])
        slot_node = torch.cat([torch.zeros(1, dtype=torch.long, device=dev)]
                              + [node_of.index_select(0, f) for f in self.slots])
        kids = node_of[self.child]
        return parents, tokens, depth, Eagle2LayoutT(parents, depth, slot_node, kids, self.D)

    def slot_paths(self):
        """The token path of every slot (the root's empty), ``(E, D - 1)`` with a slot of depth ``d`` in its first
        ``d`` columns."""
        rows = [torch.zeros((1, self.D - 1), dtype=torch.long, device=self.device)]
        return torch.cat(rows + [self.path.index_select(0, f)[:, : self.D - 1] for f in self.slots])


class Eagle2StepT(TreeStepT):
    """One decoding iteration with EAGLE-2's dynamic tree on the models' device (see :class:`Eagle2TreeT`).

    As :class:`TreeStepT`, with the tree grown by :class:`Eagle2TreeT` (one draft call per level on the
    frontier's paths, laws and scores on the device) and verified on its :class:`Eagle2LayoutT`. The target's
    tree call takes the tree's ``parents`` and ``tokens`` as device tensors (its attention mask is built on the
    device, :meth:`~otspec.decoding.HFCausalLM.tree_logits`), so one host read per iteration, after the
    verification: the outcome, the tree, the last frontier's paths and the flags of the draft's and the target's
    laws (a draft flag raised first, as the host route refuses it before the target's call).
    """

    def __init__(self, plan, sampling, log_laws: bool, *, law_batch: int, clock):
        super().__init__(plan, sampling, log_laws, law_batch=law_batch, clock=clock)
        self.build = None

    def __call__(self, dec, ctx: list[int]) -> list[int]:
        plan, d, t, sampling = self.plan, dec.d, dec.t, self.sampling
        ddev, tdev = torch.device(d.lm.device), torch.device(t.lm.device)
        self.gd, gt = dec.device_gens
        if self.build is None:
            self.build = Eagle2TreeT(plan.shape, ddev)
        b = self.build
        b.new()
        host_d = self._reads_host(ddev)
        # -- draft: the root, then one call per level on the frontier's paths; laws and scores stay on the device
        pending = d.sync(ctx)
        logits = d.logits_ids(torch.tensor([pending], dtype=torch.long).to(ddev, non_blocking=True), last=1)[:, -1]
        length = len(ctx)
        V = int(logits.shape[-1])
        # the draft's laws of the iteration's expanded rows, written into blocks kept across iterations; the
        # processed law is its own law (the same values) unless the sampling changes it
        Rb = _block(self._blocks, "R", (b.E, V), ddev)
        own_p = self.needs_p and not sampling.changes_law
        Pb = None
        if self.needs_p and not own_p:
            Pb = _block(self._blocks, "P", (b.E, V), ddev)
        flags, shorts, frontier, row = [], [], None, 0
        for lv in range(b.D):
            nb = int(logits.shape[0])
            R = _laws_into(_OWN, logits, Rb[row : row + nb])  # EAGLE-2 ranks and scores by the draft's own law
            bad = bad_rows(R)
            if Pb is not None:
                bad = bad | bad_rows(_laws_into(sampling, logits, Pb[row : row + nb]))
            row += nb
            flags.append(bad)
            # R: a view of the step's own block; on the CPU ranked in one pass per row
            frontier, short = b.expand(lv, R, frontier, in_place=True, host=host_d)
            shorts.append(short)
            if frontier is not None:
                if lv >= 1:  # back to the context: the next frontier's paths are fed whole
                    d.lm.select(d.state, 0, length)
                logits = d.logits_ids(b.path.index_select(0, frontier)[:, : lv + 1], last=1)[:, -1]
        d.seq = list(ctx)
        parents, tokens, _, lay = b.tree()
        n1 = b.n + 1
        # the flags of bad draft laws and too small supports, read with the outcome (every token id is in [0, V)
        # and the tree well formed whatever the laws: the target's call on it is harmless, its result dropped)
        dflags = torch.cat(flags + shorts)  # bools, promoted to int64 by the read's one cat (no cast op)
        last = b.path.index_select(0, b.slots[-1])[:, : b.D - 1].flatten() if b.slots else dflags[:0]
        # -- target: one call scores every node from the tree on the device (its mask built there); laws stay there
        tokens_t, parents_t = tokens.to(tdev, non_blocking=True), parents.to(tdev, non_blocking=True)
        lay_t = lay.to(tdev)
        pending_t = t.sync(ctx)
        logits = t.lm.tree_logits(t.state, parents_t, tokens_t, pending=pending_t, fallback="rows")
        t.calls += 1
        t.batch = 1
        t.seq = list(ctx)
        host = self._reads_host(tdev)
        # the target-only rule reads q at the slots with children only: on the host, the other slots' laws are not
        # formed (their rows keep stale values, read by no rule), their flags taken from their logits
        lazy = host and self.rule == "target-only" and _plain(self.sampling)
        formed = lay_t.valid[:, 0].tolist() if lazy else None
        Q, q_at, leaf = self._target_laws(logits, lay_t.inner0, host=host, formed=formed)
        P_inner = (Rb if own_p else Pb).to(tdev, non_blocking=True) if self.needs_p else None
        a, y, mass = verify_tree_t(self.rule, lay_t, tokens_t, P_inner, Q, q_at, gt, work=self._blocks, host=host)
        # -- the one host read of the iteration: the accepted node, the emitted token, the tree (parents, tokens),
        # the last frontier's paths (the draft's cache rows), the flags of the draft's laws, then of the target's
        nd = 2 * b.E
        res = torch.cat([a, y, parents_t, tokens_t, last.to(tdev, non_blocking=True), dflags.to(tdev, non_blocking=True),
                         self._target_flags(Q, logits, lay_t.inner0, formed), _leaf_flag(leaf, tdev)]).tolist()
        par, tok = res[2 : 2 + n1], res[2 + n1 : 2 + 2 * n1]
        o = 2 + 2 * n1 + int(last.shape[0])
        if any(res[o : o + nd]):
            self._refuse_eagle(dec, ctx, res[o : o + nd], Rb)
        paths = self._paths(tok, par)
        if any(res[o + nd :]):
            i = res[o + nd :].index(1)
            v = int(lay_t.inner0[i]) if i < b.E else res[0]
            _bad_logits("target", t.lm, len(ctx) + len(paths[v]))
        rows = [tuple(res[2 + 2 * n1 + i * (b.D - 1) : 2 + 2 * n1 + (i + 1) * (b.D - 1)]) for i in range(b.K)] \
            if b.slots else [()]
        a, y = int(res[0]), int(res[1])
        out = list(paths[a]) + [y]
        # -- caches: the draft keeps the row sharing the longest prefix with the emitted tokens
        full = tuple(out)
        best = max(range(len(rows)), key=lambda r: _common(rows[r], full))
        d.sync(ctx + out, row=best, row_seq=ctx + list(rows[best]))
        by_depth = torch.zeros(plan.L + 1, dtype=torch.float64, device=tdev).index_add_(0, lay_t.depth, mass)
        self.dev_log.append(torch.cat([by_depth, self._root_alpha(lay_t, tokens_t, Q)[None]]))
        tau = len(paths[a])
        reached = np.zeros(plan.L)
        reached[:tau] = 1.0
        dec._record(tau, len(out), 1, math.nan, math.nan, 1.0, reached, np.full(plan.L, math.nan))
        return out

    def _refuse_eagle(self, dec, ctx, flags, R) -> None:
        """ValueError for a draft law from non-finite logits, or an expanded node with fewer than ``top_k`` tokens
        of positive probability (the host route's messages)."""
        b = self.build
        bad, short = flags[: b.E], flags[b.E :]
        sp = b.slot_paths().tolist()
        depth = [0] + [lv for lv in range(1, b.D) for _ in range(b.K)]
        if any(bad):
            s = bad.index(1)
            _bad_logits("draft", dec.d.lm, len(ctx) + depth[s])
        s = short.index(1)
        path = tuple(sp[s][: depth[s]])
        raise _support_error("eagle2", b.K, path, R[s].to("cpu").numpy())


def _plain(sampling) -> bool:
    """Whether ``sampling`` keeps the model's own law (temperature 1, untruncated): its law is the softmax of the
    float64 logits (:func:`~otspec.decoding._sampling._laws_into`)."""
    return not sampling.greedy and not sampling.truncated and sampling.temperature == 1.0


def _leaf_flag(leaf: list, device):
    """The flag of a bad law at the accepted leaf, as a ``(1,)`` bool tensor (False where ``q_at`` was not called:
    the accepted node has children, its law is a row of ``Q``, flagged there; a kept constant, no op), for the
    read's cat (which promotes it to int64)."""
    return leaf[0] if leaf else _scalar(False, torch.bool, device)[None]


def _bad_logits(role: str, lm, pos: int) -> None:
    dtype = getattr(getattr(lm, "model", None), "dtype", None)
    raise ValueError(
        f"the {role} model {getattr(lm, 'name', type(lm).__name__)!r} gave non-finite logits (NaN or inf) at "
        f"position {pos} (its next-token law after {pos} tokens, in the draft tree)"
        + (f"; its dtype is {dtype}: float16 overflows, try bfloat16 or float32" if dtype is not None else ""))

