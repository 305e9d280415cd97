r"""The sampled tree families of a profile on the laws' device: drawn, scored and verified in torch.

The device route of the ``"iid"`` and ``"wor"`` families of :func:`otspec.profile._trees.draw_and_score` (taken
when the laws are torch tensors: ``on_device=True``). At one profiled position of ``B`` prompts:

1. **Draws, one batch per depth.** The children of every node of that depth of every sampled tree of every
   prompt are drawn at once from the laws the depth's draft call left on the device: i.i.d. children by the
   running sums of each row and one uniform per child (the ``"cdf"`` rule of the decoder's device route,
   :func:`otspec.decoding._tree_device._draws`), children without replacement by the exponential race -- the
   ``r + 1`` largest of :math:`p(x) / E_x`, :math:`E_x` i.i.d. ``Exp(1)``, in decreasing order, are ``r + 1``
   successive draws without replacement (Efraimidis and Spirakis, *Weighted random sampling with a reservoir*,
   Information Processing Letters 97(5), 2006; the Gumbel-top-k trick of Kool, van Hoof and Welling, *Stochastic
   Beams and Where to Find Them*, arXiv:1903.06059, §3), the child of rank ``r`` taking the ``r``-th. The drawn
   tokens stay in one ``(trees, n + 1)`` tensor; the next depth's draft call is fed from it.
2. **Scoring, one target call per family** (tree attention on the ``B`` trees of the family, tokens fed as a
   device tensor, by the caller's ``score``: :func:`otspec.profile._trees.padded_tree_logits`); the target's laws
   stay on the device.
3. **Verification, one batch per rule.** Every tree of every family verified by the same rule (SpecInfer's,
   Sequoia's or the target-only rule) is a tree of one forest, and the rule's closed form
   (:func:`otspec.decoding._tree_device.node_rules_t`) gives every node's acceptance probability given its
   parent is reached, for the whole forest at once; the reach probabilities (:math:`\prod_{c \preceq v} a_c`)
   follow by one gather per depth (:func:`otspec.decoding._tree_device.end_mass_t`).
4. **One host read per position**: the drawn tokens, the supports of the ``"wor"`` nodes and every reach
   probability (``B`` trees, ``n + 1`` values each, per verifier).

The laws reach the host only where a verifier without a device rule (Traversal Verification, SpecTr's) or the
bound on the lossless verifiers (:mod:`otspec.profile._tree_bound`) reads them, once per position
(:class:`HostRows`).

The random stream is one ``torch.Generator`` per prompt on the device (:func:`device_generator`, seeded from the
prompt's tree generator; a depth's draws are one kernel per prompt for the uniforms or exponentials, the rest
batched), so a prompt's trees are the same walked alone or with others, and differ from the host route's; the law of
the draws is the same (tested by chi-square), and the values of a given drawn tree agree with the host's verifiers to
1e-12 relative (tested by running this route with the host's stream, :func:`device_generator` returning None).

Notation: ``p`` is the draft's law and ``q`` the target's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ..decoding._models import _HFState, _SeqState
from ..decoding._sampling import bad_rows, on_device
from ..decoding._tree_device import _RULES, TreeLayoutT, _draws_from_sums, end_mass_t, node_rules_t
from ..tree import DraftTree, make_tree_verifier
from ._quantities_batched import _Pack

__all__ = ["HostRows", "SampledTrees", "device_generator", "device_rule", "eagle2_frontier_t", "feed_tokens",
           "select_rows"]

#: Forest layouts by (shapes, prompts, device): built once per run and plan.
_FORESTS: dict = {}
_MAX_FORESTS = 64


def device_generator(rngs, device) -> list:
    r"""The ``torch.Generator`` on ``device`` of each prompt's sampled trees at one position.

    .. math::

        \text{seed}_b \sim \mathcal U\{0, \dots, 2^{63} - 1\} \text{ drawn from prompt } b\text{'s tree generator},

    so a run is reproducible and a prompt's trees are the same whether it is walked alone or with others (its
    draws read its own generator only, in the order of its own nodes). (Where this returns None -- a test's
    stand-in -- :class:`SampledTrees` draws with the host route's stream instead: each node by its job on the host
    from its prompt's numpy generator, so the trees are the host route's.)

    Parameters
    ----------
    rngs : list of numpy.random.Generator
        One per prompt (:func:`otspec.profile._trees.tree_rng`); each advanced by one draw.
    device : str or torch.device

    Returns
    -------
    list of torch.Generator
        One per prompt.

    Examples
    --------
    >>> from otspec.profile._trees import tree_rng
    >>> from otspec.profile._trees_device import device_generator
    >>> a = device_generator([tree_rng(0, 0), tree_rng(0, 1)], "cpu")
    >>> b = device_generator([tree_rng(0, 1)], "cpu")
    >>> bool((a[1].get_state() == b[0].get_state()).all())
    True
    """
    return [torch.Generator(device=device).manual_seed(int(r.integers(2**63))) for r in rngs]


def device_rule(verifier: str) -> str | None:
    """The device rule of a registered tree verifier's name (``"specinfer"``, ``"sequoia"``, ``"target-only"``),
    None where it has none (its values are computed on the host)."""
    return _RULES.get(type(make_tree_verifier(verifier)))


def eagle2_frontier_t(base, logs):
    r"""EAGLE-2's next frontier of ``T`` trees at once, on their device: the ``k`` best of each level's ``k^2``
    proposals.

    .. math::

        s_{f k + r} = b_f + \log r_f(x_{f, r}), \qquad
        \text{frontier} = \text{the first } k \text{ of } (0, \dots, k^2 - 1)
        \text{ ordered by decreasing } s_j, \text{ ties by lower } j,

    :math:`b_f` the score of the frontier's node ``f`` (in the frontier's order) and :math:`\log r_f(x_{f, r})` the
    log-probability of its ``r``-th ranked child: proposal ``j = f k + r`` of the level, numbered as
    :func:`otspec.tree._process._eagle2_tree` numbers them (frontier order, then rank), with its tie rule.

    Parameters
    ----------
    base : torch.Tensor of float64, shape ``(T, k)``
        The frontier's scores (sums of log-probabilities along each node's path).
    logs : torch.Tensor of float64, shape ``(T, k * k)``
        ``logs[t, f k + r]``: the log-probability of frontier node ``f``'s ``r``-th ranked child (``-inf`` for a
        child of zero probability, which the host route refuses when it expands the node).

    Returns
    -------
    chosen : torch.Tensor of int64, shape ``(T, k)``
        The next frontier's proposals ``f k + r``, in its order (decreasing score).
    scores : torch.Tensor of float64, shape ``(T, k)``
        Their scores (each the very float the host adds: :math:`b_f + \log r_f`, one IEEE addition).

    References
    ----------
    Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees",
    arXiv:2406.16858, §4.1 (expansion by the top-k of the cumulative scores).

    Examples
    --------
    >>> import torch
    >>> from otspec.profile._trees_device import eagle2_frontier_t
    >>> base = torch.tensor([[-0.5, -1.0]], dtype=torch.float64)
    >>> logs = torch.log(torch.tensor([[0.5, 0.25, 1.0, 0.0]], dtype=torch.float64))
    >>> [c.tolist() for c in eagle2_frontier_t(base, logs)][0]
    [[2, 0]]
    """
    T, k = int(base.shape[0]), int(base.shape[1])
    rep = static_index(np.repeat(np.arange(T * k).reshape(T, k), k, axis=1), base)  # (T, k^2): t k + j // k
    cand = base.take(rep) + logs
    # The host orders proposal j by the key (-s_j, j), ascending: decreasing score, and among equal scores the lower
    # j first. A stable sort by decreasing s keeps equal scores in their input order, which is increasing j: the same
    # total order on every non-NaN score (-inf included: -inf == -inf, and the host's keys -(-inf) tie alike), so the
    # first k are the host's first k. (A NaN score comes only from a bad draft law, refused at the read before any
    # expansion reads the frontier; torch.topk promises no order among ties, hence the sort of the k^2 scores.)
    chosen = torch.sort(cand, dim=1, descending=True, stable=True).indices[:, :k]
    return chosen, cand.gather(1, chosen)


def select_rows(lm, state, index, length: int) -> None:
    """``lm.select(state, rows, length)`` with the rows a tensor ``index`` on the models' device, read on no host.

    The state's rows ``index`` (int64, one per kept row, each in ``[0, batch)``) are gathered where the state is: a
    :class:`otspec.decoding.HFCausalLM` state's cache by its ``batch_select_indices`` (what ``select`` calls with its
    rows), a :class:`otspec.decoding.CallableLM` state's tokens by ``index_select``, the padding of each row with
    it (each kept row a row of the same prompt as before, so a padded state stays padded); any other state is
    handed to ``lm.select`` with ``index`` read on the host. A state longer than ``length`` is first cut by
    ``lm.select`` keeping every row (no gather; on a padded state the model's select reads whether a row is still
    padded); one of ``length`` columns is not touched but for its rows.
    """
    if isinstance(state, _HFState) and state.cache is not None and hasattr(state.cache, "batch_select_indices"):
        if length != state.length:
            lm.select(state, list(range(state.batch)), length)
        if state.cache is not None:
            state.cache.batch_select_indices(index)
        if state.pad is not None:
            state.pad = state.pad.index_select(0, on_device(index, state.pad.device))
        state.batch = int(index.shape[0])
    elif isinstance(state, _SeqState) and state.ids is not None:
        if length != state.length:
            lm.select(state, list(range(int(state.ids.shape[0]))), length)
        if state.ids is not None:
            state.ids = state.ids.index_select(0, on_device(index, state.ids.device))
        if state.pad is not None:
            state.pad = state.pad.index_select(0, on_device(index, state.pad.device))
    else:  # a model whose state this module does not know: its own select, the rows read on the host
        lm.select(state, index.tolist(), length)


def static_index(a, like):
    """The host ints ``a`` as an int64 tensor on ``like``'s device, copied once per run (a plan's layout, the same
    at every position: :meth:`otspec.profile._quantities_batched._Pack.send` with ``static``); never written."""
    pack = _Pack()
    pack.add(a)
    return pack.send(torch, like, static=True)[0]


def feed_tokens(ids: list, device, *, of=None, dyn=None, held=None):
    """The tokens of one draft call as a ``(n, 1)`` int64 tensor on ``device``, gathered where they are (the host
    indices in one copy): ``ids`` host tokens, or with ``of`` (a tensor of tokens) flat indices into it; ``dyn``:
    ``[(positions, indices), ...]``, entries of ``ids`` replaced by indices into ``of`` that only the device knows
    (host positions and device indices, of one shape each);
    ``held``: ``(tokens, positions, flat)``, the rows at ``positions`` taken from the tensor ``tokens`` at ``flat``
    (the sampled trees' drawn tokens)."""
    like = of if of is not None else held[0] if held is not None else torch.empty(0, device=device)
    pack = _Pack()  # every index made (n, 1) or (., 1) on the host: the gathers give the call's column as it is
    k_ids = pack.add(np.asarray(ids, dtype=np.int64)[:, None])
    k_dyn = [(pack.add(pos), pack.add(np.zeros_like(pos))) for pos, _ in dyn] if dyn is not None else []
    k_at, k_flat = (pack.add(held[1]), pack.add(np.asarray(held[2], dtype=np.int64)[:, None])) if held is not None \
        else (None, None)
    sent = pack.send(torch, like, static=of is not None)
    idx = sent[k_ids]
    for (k, z), (_, got) in zip(k_dyn, dyn or ()):
        idx = idx.index_put((sent[k], sent[z]), on_device(got, idx.device))
    out = idx if of is None else of.take(idx)
    if held is not None and held[1]:
        out = out.index_copy(0, sent[k_at], on_device(held[0], out.device).take(sent[k_flat]))
    return on_device(out, device)


class HostRows(Mapping):
    """Rows of a device tensor read on the host on first use: ``rows[key]`` is ``host[at[key]]``, the whole tensor
    copied once (shared by every :class:`HostRows` of the same ``copy``)."""

    def __init__(self, copy: list, at: dict):
        self._copy, self._at = copy, at  # copy: [device tensor, host array or None]

    def __getitem__(self, key):
        if self._copy[1] is None:
            self._copy[1] = self._copy[0].detach().to("cpu").numpy()
        return self._copy[1][self._at[key]]

    def __iter__(self):
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def on_device(self, key):
        """Row ``key`` of the device tensor itself (no host copy)."""
        return self._copy[0][self._at[key]]


def _forest(shapes: list, inner: list, device) -> TreeLayoutT:
    """The layout of the trees ``shapes`` side by side as one forest (their nodes numbered on, every root of
    parent -1): its nodes with children are each tree's ``inner`` in turn."""
    key = (tuple(s.parents.tobytes() for s in shapes), str(device))
    lay = _FORESTS.get(key)
    if lay is None:
        off, par, dep, inn = 0, [], [], []
        for s, nodes in zip(shapes, inner):
            p = np.asarray(s.parents, dtype=np.int64) + off
            p[0] = -1
            par.append(p)
            dep.append(np.asarray(s.depth, dtype=np.int64))
            inn.append(np.asarray(nodes, dtype=np.int64) + off)
            off += s.n + 1
        lay = TreeLayoutT(np.concatenate(par), np.concatenate(dep), np.concatenate(inn), device)
        if len(_FORESTS) >= _MAX_FORESTS:
            _FORESTS.clear()
        _FORESTS[key] = lay
    return lay


def _joined(parts: list):
    """``torch.cat(parts)``, or the one part itself (read only, the same values: no copy, no op)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class SampledTrees:
    r"""The ``"iid"`` and ``"wor"`` trees of one position of ``B`` prompts, drawn, scored and verified on the laws'
    device (see the module docstring).

    .. math::

        x_c \sim p_{\mathrm{pa}(c)} \ \text{(i.i.d., or the rank-}r(c)\text{ draw without replacement)}, \qquad
        \Pr(\text{reach } v \mid T) = \prod_{c \preceq v,\, c \ne 0} a_c(T, p, q),

    :math:`a_c` the verifier's probability of accepting child ``c`` given its parent is reached, for every node of
    every held tree; :math:`E[\tau \mid T] = \sum_{v \ne 0} \Pr(\text{reach } v \mid T)`.
    Used by :func:`otspec.profile._trees.draw_and_score` (``on_device=True``): :meth:`draw_roots`, then per depth
    :meth:`feed` and :meth:`draw`, then :meth:`finish`.

    Parameters
    ----------
    jobs : list
        Per prompt, :func:`otspec.profile._trees._jobs`' ``(label, job)`` pairs (the same labels in the same order
        for every prompt); the sampled ones (:class:`otspec.profile._trees._ShapeJob` of process ``"iid"`` or
        ``"wor"``) are held here.
    device : torch.device
        Where the analysis runs (the target's device).
    gen : list of torch.Generator, or None
        One per prompt, on ``device`` (:func:`device_generator`); None: the host route's stream.
    """

    def __init__(self, jobs: list, device, gen):
        self.jobs, self.device, self.gen = jobs, torch.device(device), gen
        self.B = len(jobs)
        self.fams = [j for j, (_, job) in enumerate(jobs[0]) if getattr(job, "process", None) in ("iid", "wor")]
        self.row = {(b, j): r for r, (b, j) in enumerate((b, j) for b in range(self.B) for j in self.fams)}
        self.n1 = max([jobs[0][j][1].shape.n + 1 for j in self.fams], default=1)
        self.tok = None  # (trees, n1) int64 on `device`, made at the first draw (-1: not drawn, or padding)
        self.parts: list = []  # the sampled rows of the draft's laws, per depth, on `device`
        self.p_row: dict = {}  # (b, j, v) -> row of the concatenated parts
        self.n_rows = 0
        self.wor: list = []  # (b, j, v, need) of every "wor" node, in draw order
        self.have: list = []  # per depth: the positive entries of those nodes' laws
        self.unchecked: list = []  # (logits, any bad row) of the draft's laws formed unchecked

    def holds(self, b: int, j: int) -> bool:
        return (b, j) in self.row

    def draw(self, need: list, laws, unchecked=None) -> None:
        """The children of the held nodes of ``need`` (``(b, j, v)``, the rows of ``laws``: ``(len(need), V)``), all
        at once; their laws kept for the verification. ``unchecked``: the logits of ``laws`` when these were formed
        without their check (``Sampling.probs(..., check=False)``): a bad row is flagged in the position's one read,
        and the checked route's error raised then."""
        V = int(laws.shape[-1])
        if unchecked is not None:
            self.unchecked.append((unchecked, bad_rows(laws).any()))
        if self.tok is None:
            self.tok = torch.full((len(self.row), self.n1), -1, dtype=torch.long, device=self.device)
        held = [(i, b, j, v) for i, (b, j, v) in enumerate(need) if (b, j) in self.row]
        if not held:
            return
        iid, wor = [], []
        for i, b, j, v in held:
            job = self.jobs[b][j][1]
            kids = job.kids.get(v, [])
            ranks = [int(job.shape.ranks[c]) for c in kids]
            dst = [self.row[(b, j)] * self.n1 + c for c in kids]
            (iid if job.process == "iid" else wor).append((i, b, j, v, ranks, dst))
        rows = [i for i, *_ in held]
        P = laws if rows == list(range(int(laws.shape[0]))) else laws.index_select(0, static_index(rows, laws))
        P = on_device(P, self.device)
        for _, b, j, v in held:
            self.p_row[(b, j, v)] = self.n_rows
            self.n_rows += 1
        self.parts.append(P)
        if self.gen is None:
            return self._draw_on_host(held, P)
        vals, dst, pack = [], [], _Pack()  # the host indices of the draws, sent in one copy
        if iid:
            width = max(len(r) for *_, r, _ in iid)
            i_pos = _positions(held, iid)
            i_all = i_pos == list(range(len(held)))  # every held row: P itself, no gather
            i_rows = pack.add(i_pos)
            i_cells = pack.add([n * width + c for n, (*_, ranks, _) in enumerate(iid) for c in range(len(ranks))])
            dst += [d for *_, ds in iid for d in ds]
        if wor:
            most = min(max(max(r) + 1 for *_, r, _ in wor), V)
            w_pos = _positions(held, wor)
            w_all = w_pos == list(range(len(held)))
            w_rows = pack.add(w_pos)
            w_cells = pack.add([n * most + min(r, most - 1) for n, (*_, ranks, _) in enumerate(wor) for r in ranks])
            dst += [d for *_, ds in wor for d in ds]
        at_dst = pack.add(dst)
        sent = pack.send(torch, P, static=True)
        if iid:  # every prompt's uniforms from its own generator, in its rows' order; one search for them all
            Pi = P if i_all else P.index_select(0, sent[i_rows])
            u = _joined([torch.rand((e - a, width), dtype=torch.float64, device=Pi.device, generator=self.gen[b])
                         for b, a, e in _runs(iid)])
            vals.append(_draws_from_sums(torch.cumsum(Pi, dim=-1), width, None, u=u).take(sent[i_cells]))
        if wor:
            W = P if w_all else P.index_select(0, sent[w_rows])
            E = _joined([torch.empty((e - a, V), dtype=W.dtype, device=W.device).exponential_(generator=self.gen[b])
                         for b, a, e in _runs(wor)])
            top = torch.topk(W / E.clamp_(min=torch.finfo(W.dtype).tiny), most, dim=-1).indices
            vals.append(top.take(sent[w_cells]))
            self.wor += [(b, j, v, max(r) + 1) for _, b, j, v, r, _ in wor]
            self.have.append((W > 0).sum(-1))
        self.tok.put_(sent[at_dst], _joined(vals))  # the drawn tokens into their (tree, node) cells

    def _draw_on_host(self, held: list, P) -> None:
        """The host route's draws (each node by its job, from its prompt's numpy generator), into the device's
        tokens: the check route, whose trees are the host route's."""
        host = P.detach().to("cpu").numpy()
        dst, vals = [], []
        for n, (_, b, j, v) in enumerate(held):
            job = self.jobs[b][j][1]
            job.expand(v, host[n])
            kids = job.kids.get(v, [])
            dst += [self.row[(b, j)] * self.n1 + c for c in kids]
            vals += job.tokens[kids].tolist()
        self.tok.view(-1).index_copy_(0, torch.as_tensor(dst, dtype=torch.long, device=self.tok.device),
                                      torch.as_tensor(vals, dtype=torch.long, device=self.tok.device))

    def draw_roots(self, p_root) -> None:
        """The root's children of every held tree, from the draft's laws after the contexts (``(B, V)``: a tensor
        where it is, or a host array moved to the device once)."""
        need = [(b, j, 0) for b in range(self.B) for j in self.fams]
        if not need:
            return
        laws = on_device(p_root if torch.is_tensor(p_root) else torch.from_numpy(np.asarray(p_root, dtype=np.float64)),
                         self.device, torch.float64)
        self.draw(need, laws.index_select(0, static_index([b for b, _, _ in need], laws)))

    def feed(self, need: list, ids: list, device, *, of=None, dyn=None):
        """The tokens of ``need`` as a ``(len(need), 1)`` tensor on ``device`` (the draft's): ``ids`` (host tokens
        of the other trees' nodes; with ``of``, a tensor of tokens on the device, their flat indices in it, some of
        them, ``dyn``, known on the device only: :func:`feed_tokens`) with the held nodes' tokens gathered where they
        were drawn (the host ids and indices in one copy)."""
        held = [(i, self.row[(b, j)] * self.n1 + v) for i, (b, j, v) in enumerate(need) if (b, j) in self.row]
        return feed_tokens(ids, device, of=None if of is None else on_device(of, self.tok.device), dyn=dyn,
                           held=(self.tok, [i for i, _ in held], [f for _, f in held]))

    def finish(self, plan, score, target, ts, last, n_ctx: int, q_root, sampling, *, also=None) -> dict:
        r"""Score every held tree (one target call per family), verify them on the device (one batch per rule), read
        the tokens and the reach probabilities once (:meth:`finish_parts`, read at once).

        Parameters
        ----------
        plan : otspec.profile._trees.TreePlan
        score : callable
            ``score(target, ts, parents, tokens, last, n_ctx)``: the ``(B, m, V)`` logits of one tree-attention
            call on ``B`` trees (:func:`otspec.profile._trees.padded_tree_logits`).
        target, ts, last, n_ctx, q_root, sampling
            As :func:`otspec.profile._trees.draw_and_score`'s.
        also : torch.Tensor of float64, shape ``(n,)``, optional, keyword-only
            Other values of the position read in the same read (the deterministic families' gathered target
            probabilities); their host copy is left in :attr:`also_host`.

        Returns
        -------
        dict
            ``(b, j) -> (tree, inner, p, q, reach)``: the drawn :class:`otspec.tree.DraftTree`, its internal nodes,
            the draft's and the target's laws there (:class:`HostRows`, read on the host on first use) and
            ``reach``: ``name -> (n + 1,)`` reach probabilities of every name verified here.
        """
        values, done = self.finish_parts(plan, score, target, ts, last, n_ctx, q_root, sampling, also=also)
        return done(values.to("cpu").numpy())

    def finish_parts(self, plan, score, target, ts, last, n_ctx: int, q_root, sampling, *, also=None) -> tuple:
        """:meth:`finish` left unread: ``(values, done)``, the ``(n,)`` float64 device tensor of every value the
        host reads (the tokens, the ``"wor"`` supports, the bad-logits flags, the reach probabilities, then
        ``also``) and ``done(host copy)`` giving :meth:`finish`'s result (raising the checked route's error for a law
        from bad logits first); the caller reads ``values`` alone or with other values of the walk (one read)."""
        dev, B = self.device, self.B
        self._sampling = sampling
        P_all = torch.cat(self.parts) if len(self.parts) > 1 else self.parts[0]
        tok = self.tok
        q_root_t = None
        Q, inner, scored = {}, {}, {}
        for j in self.fams:
            shape = self.jobs[0][j][1].shape
            inner[j] = self.jobs[0][j][1].inner
            m = len(inner[j])
            if m == 1:  # stars: the root's law is all a verifier needs
                if q_root_t is None:  # a tensor where it is (the walk's law before its read), or a host array
                    q_root_t = (on_device(q_root, dev, torch.float64) if torch.is_tensor(q_root)
                                else torch.as_tensor(np.asarray(q_root, dtype=np.float64)).to(dev))
                Q[j] = q_root_t[:, None]
                continue
            pos = {int(v): i for i, v in enumerate(inner[j].tolist())}
            par = np.full(m, -1, dtype=np.int64)
            par[1:] = [pos[int(shape.parents[v])] for v in inner[j][1:].tolist()]
            rows = static_index([self.row[(b, j)] for b in range(B)], tok)
            toks = tok.index_select(0, rows).index_select(1, static_index(inner[j], tok))
            logits = score(target, ts, np.broadcast_to(par, (B, m)).copy(), toks.to(target.device), last, n_ctx)
            Q[j] = sampling.probs(logits, check=False).to(dev)  # a bad row is flagged in the one read below
            scored[j] = logits
        groups: dict = {}
        family = {f.label: f for f in plan.sampled}
        for j in self.fams:
            f = family[self.jobs[0][j][0]]
            for v_name, name in zip(f.verifiers, f.names()):
                rule = device_rule(v_name)
                if rule is not None:
                    groups.setdefault(rule, []).append((j, name))
        reached = []
        for rule, members in groups.items():
            trees = [(b, j) for j, _ in members for b in range(B)]
            shapes = [self.jobs[b][j][1].shape for b, j in trees]
            lay = _forest(shapes, [inner[j] for _, j in trees], dev)
            flat = np.concatenate([self.row[(b, j)] * self.n1 + np.arange(s.n + 1) for (b, j), s in zip(trees, shapes)])
            tokens = tok.take(static_index(flat, tok))
            p_rows = [self.p_row[(b, j, int(v))] for b, j in trees for v in inner[j].tolist()]
            P_in = P_all.index_select(0, static_index(p_rows, P_all))
            Q_in = _joined([Q[j].reshape(-1, Q[j].shape[-1]) for j, _ in members])  # each family's B trees in turn
            acc, *_ = node_rules_t(rule, lay, tokens, P_in, Q_in, reach_only=True)
            reached.append(end_mass_t(lay, acc, None))  # the reach probabilities: no alive, no level, no sampler
        have = [torch.cat(self.have).to(dev)] if self.have else []
        flags = [bad.to(dev) for _, bad in self.unchecked] + [bad_rows(Q[j]).any() for j in scored]
        bad = [torch.stack(flags)] if flags else []
        extra = [] if also is None else [also if also.device == dev else also.to(dev)]
        # one cat, which casts the int64 tokens and counts and the bool flags to float64 as it copies them (exact)
        values = torch.cat([tok.view(-1)] + have + bad + reached + extra)
        if values.dtype != torch.float64:  # no float part (no verifier with a device rule, nothing else)
            values = values.to(torch.float64)
        return values, lambda host: self._done(host, also, tok, P_all, Q, inner, scored, groups)

    def _done(self, host, also, tok, P_all, Q, inner, scored, groups) -> dict:
        """:meth:`finish`'s result from the host copy of :meth:`finish_parts`' values."""
        B, sampling = self.B, self._sampling
        self.also_host = host[host.shape[0] - int(also.shape[0]):] if also is not None else None
        at = tok.numel()
        for (logits, _), flag in zip(self.unchecked, host[at + len(self.wor) :].tolist()):
            if flag:  # a draft law from bad logits: the checked route's error (before any other)
                sampling.probs(logits)
        tokens = host[:at].astype(np.int64).reshape(tok.shape)
        if self.wor:
            counts = host[at : at + len(self.wor)]
            at += len(self.wor)
            for (b, j, v, need), have_v in zip(self.wor, counts.tolist()):
                if have_v < need:  # the host route's error, from the node's law (read for it alone)
                    self.jobs[b][j][1]._support(need, v, P_all[self.p_row[(b, j, v)]].to("cpu").numpy())
        at += len(self.unchecked)
        for j, flag in zip(list(scored), host[at : at + len(scored)].tolist()):
            if flag:  # a target law from bad logits: the checked route's error
                sampling.probs(scored[j])
        at += len(scored)
        reach: dict = {}
        for members in groups.values():
            for j, name in members:
                for b in range(B):
                    n1 = self.jobs[b][j][1].shape.n + 1
                    reach[(b, j, name)] = host[at : at + n1]
                    at += n1
        p_copy, out = [P_all, None], {}
        for j in self.fams:
            q_copy = [Q[j], None]
            for b in range(B):
                shape = self.jobs[b][j][1].shape
                tree = DraftTree(shape, shape.parents, tokens[self.row[(b, j)], : shape.n + 1])
                p = HostRows(p_copy, {int(v): self.p_row[(b, j, int(v))] for v in inner[j].tolist()})
                q = HostRows(q_copy, {i: (b, i) for i in range(len(inner[j]))})
                got = {name: r for (bb, jj, name), r in reach.items() if bb == b and jj == j}
                out[(b, j)] = (tree, inner[j], p, q, got)
        return out


def _runs(group: list) -> list:
    """``(b, start, end)`` of each prompt's rows in a group of nodes (in need order: each prompt's rows together)."""
    out: list = []
    for n, (_, b, *_) in enumerate(group):
        if out and out[-1][0] == b:
            out[-1][2] = n + 1
        else:
            out.append([b, n, n + 1])
    return out


def _positions(held: list, group: list):
    """The positions in ``held`` (the rows of the held laws) of a group's nodes."""
    where = {i: n for n, (i, *_) in enumerate(held)}
    return [where[i] for i, *_ in group]
