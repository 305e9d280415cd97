r"""The upper bound on every lossless tree verifier, at the subsampled positions of a profile's sampled-tree families.

At every subsampled position (:func:`otspec.profile._collect.is_subsampled`)
and for every sampled-tree family (processes ``"iid"`` and ``"wor"``),
:func:`position_bounds` computes the anytime bound of
:func:`otspec.tree.bound` on the family's shape after the position's context,

.. math::

    \mathbb E[\tau] \;\le\; \mathrm{OPT}_c \;\le\; \hat B = \sum_{d=1}^{D} \min(\hat b_1, \dots, \hat b_d),
    \qquad \hat b_d \ge \sum_{|y| = d} \min\big(Q(y), \pi(y)\big),

from the laws the walk already holds (the draft's and the target's law after the context, and at the internal
nodes of the trees it drew there) and the prefixes the bound expands beyond them: the context's children with the
largest :math:`\min(Q, \pi)`, up to ``budget - 1`` of them per family (fewer where fewer have
:math:`\min(Q, \pi) > 0`), scored for every family and every prompt of the batch in one tree-attention call per
model (``tree_logits``), on the states that hold the contexts, as the walk scores its own trees. The budget is
spent in that one call (the bound's ``batch`` equal to its ``budget``), so the value is the one
:func:`otspec.tree.bound` gives at the same context with ``budget = batch = n_expanded`` (``bound_budget``, or
fewer when the context has fewer such children): an upper bound at every budget, exact where nothing is left (``remainder`` 0) and
:math:`\pi` is exact (``"iid"``, and ``"wor"`` at every rank: enumerated, or by the exponential race to a
relative 1e-12; where a row fails the race's checks, an upper bound on :math:`\pi`, and the value stays an upper
bound).

Every prompt of a batch is expanded together, one pass per family: the contexts in one pass, then the frontiers in
one pass per depth. Handed the laws as tensors on the models' device (``p_root`` a tensor: the walk does so on an accelerator, as
:data:`BOUND_ON_DEVICE` sets) the laws stay where the walk holds them, the scored frontier too, and
:func:`otspec.tree.bound`'s torch route computes the bound there: the host reads a few small arrays per
position, for every family and the whole batch together (their reads shared: 1 for the contexts and 1 for the
frontiers, one more before each where a family drawn without replacement needs the race's power sums), never a law.
The contexts' expansion reads only the contexts' laws, so the walk begins it (:func:`begin_bounds`) before its
position's one read and takes the contexts' first read in it; after its tree-attention calls the bound stops before
its frontiers' first read (``defer``: a :class:`BoundsLater`), which rides the walk's next read with the calls'
bad-logits checks: no read of the bound's own, but one for each phase where the race runs (its values after its
power sums).
Otherwise the host's route (numba row kernels) reads the same laws as numpy rows.

Rows ``kind="treebound"``, ``name`` the family's label, ``k`` its draft nodes, ``j = 1..4``: the value
:math:`\hat B`, its remainder, whether :math:`\pi` was exact (1 or 0), and the prefixes expanded. The summary
sets them beside the families' ``E[tau | T]`` on the same positions (docs/theory/trees.rst, "An upper bound at
any vocabulary"; docs/theory/profile.rst).

Notation: ``p`` is the draft law and ``q`` the target law at a prefix.
"""

from __future__ import annotations

import numpy as np

from .._validation import validate_positive_int
from ..decoding._models import MAX_TREE_NODES
from ..decoding._sampling import bad_rows
from ..tree._bound import _MAX_FRONTIER_ENTRIES, _depth_runs, _expand_t, _expand_t_steps, _laws_block, _Reads, _Search, _Slots
from ._quantities import read_parts
from ._trees import padded_tree_logits
from ._trees_device import HostRows

__all__ = ["BOUND_KIND", "BOUND_FIELDS", "BOUND_ON_DEVICE", "bound_route_on_device", "DEFAULT_BOUND_BUDGET",
           "MAX_PROFILE_BOUND_BUDGET", "validate_bound_budget", "check_bound_vocabulary", "bound_law_bytes",
           "begin_bounds", "position_bounds", "BoundsLater", "record_bounds"]

#: Row kind of the bound.
BOUND_KIND = "treebound"
#: What the rows ``j = 1, 2, ...`` of a family's bound hold.
BOUND_FIELDS = ("value", "remainder", "pi_exact", "n_expanded")
#: Default prefixes the bound expands per family and position (the context included); 0 switches it off.
DEFAULT_BOUND_BUDGET = 64
#: Largest ``bound_budget``: its prefixes are scored in one call per model.
MAX_PROFILE_BOUND_BUDGET = 1024
#: Whether the walk on an accelerator hands the bound its laws where they are (the device route of
#: :func:`position_bounds`; off: the laws it uses copied to the host and bounded there by the numba kernels). On:
#: the device route reads the host a few times per position instead of copying every law there, for 2 (an i.i.d.
#: family) to 3 (without replacement) small tensors of host data per position (the contexts' target laws, each
#: frontier's per-row values, the race's coefficients), counted in tests/test_profile_device_copies.py.
BOUND_ON_DEVICE = True


def bound_route_on_device() -> bool:
    """Whether the walk on an accelerator runs the bound on the device route (:data:`BOUND_ON_DEVICE`)."""
    return BOUND_ON_DEVICE


def validate_bound_budget(budget, n_sampled: int) -> int:
    """``bound_budget`` checked: an integer in ``[0, MAX_PROFILE_BOUND_BUDGET]`` whose one call per model holds at
    most :data:`otspec.decoding.MAX_TREE_NODES` nodes (``n_sampled`` sampled families, ``budget - 1`` children of
    the context each, the root).

    Raises
    ------
    TypeError
        Not an integer.
    ValueError
        Negative, above :data:`MAX_PROFILE_BOUND_BUDGET`, or too many nodes for one call.
    """
    b = validate_positive_int(budget, "bound_budget", minimum=0)
    if b > MAX_PROFILE_BOUND_BUDGET:
        raise ValueError(f"`bound_budget` must be at most {MAX_PROFILE_BOUND_BUDGET} (MAX_PROFILE_BOUND_BUDGET: its "
                         f"prefixes are scored in one call per model), got {b}")
    nodes = n_sampled * max(b - 1, 0) + 1
    if b and nodes > MAX_TREE_NODES:
        raise ValueError(f"`bound_budget` = {b} with {n_sampled} sampled tree families scores up to {nodes} nodes in "
                         f"one call per model, above MAX_TREE_NODES = {MAX_TREE_NODES}: lower `bound_budget` or "
                         "profile fewer 'iid'/'wor' families")
    return b


def check_bound_vocabulary(budget: int, V: int) -> None:
    """Refuse a ``bound_budget`` whose frontier of laws passes the bound's limit at vocabulary ``V``.

    Raises
    ------
    ValueError
        ``budget * V`` above the bound's law entries per call.
    """
    if budget * V > _MAX_FRONTIER_ENTRIES:
        raise ValueError(f"`bound_budget` = {budget} at a vocabulary of {V} tokens holds {budget * V} law entries per "
                         f"family and position, above the bound's limit {_MAX_FRONTIER_ENTRIES}: use `bound_budget` <= "
                         f"{_MAX_FRONTIER_ENTRIES // V}")


def bound_law_bytes(plan, budget: int, V: int, batch: int) -> int:
    """Bytes of the laws the bound's call holds at once (float64, both models, ``batch`` prompts), 0 when off."""
    if plan is None or not budget or not plan.sampled:
        return 0
    return 2 * 8 * V * batch * (len(plan.sampled) * (budget - 1) + 1)


def _law_row(rows, key, device):
    """Row ``key`` of a mapping of laws (a dict of rows, an array, or :class:`otspec.profile._trees_device.HostRows`
    over a device tensor) as float64: a numpy array on the host route (``device`` None), else a tensor on
    ``device``, read from the tensor the rows are kept in (no host copy)."""
    if device is None:
        return np.asarray(rows[key], dtype=np.float64)
    import torch

    if isinstance(rows, HostRows):                  # the walk's device tensor itself, not its host copy
        row = rows.on_device(key)
    else:
        row = rows[key]
    if not torch.is_tensor(row):
        return torch.as_tensor(np.asarray(row, dtype=np.float64), device=device)
    return row if (row.device, row.dtype) == (device, torch.float64) else row.to(device=device, dtype=torch.float64)


def _held(p_root, q_root, scored: dict, plan, device=None) -> dict:
    """The laws the walk holds for one prompt: after the context, and at the internal nodes of its sampled trees;
    numpy rows on the host route, tensors on ``device`` on the device route (where the walk keeps them)."""
    held = {(): (_law_row([p_root], 0, device), _law_row([q_root], 0, device))}
    for f in plan.sampled:
        s = scored.get(f.label)
        if s is None or s.q is None:
            continue
        paths = s.tree.paths()
        for i, v in enumerate(s.inner.tolist()):
            if v and paths[v] not in held:
                held[paths[v]] = (_law_row(s.p, v, device), _law_row(s.q, i, device))
    return held


def _held_t(p_root, q_root, scored: list, plan, bs: list, device, roots: dict | None = None) -> dict:
    """:func:`_held` of the prompts ``bs`` on the device route, every law taken by one gather per tensor that holds
    some (the contexts' laws, the walk's draft laws of a position, each family's target laws): ``b -> {path: (p,
    q)}``, rows of those gathers (the same values as :func:`_held`'s row views, in a few torch ops whatever the
    trees' sizes). ``roots`` (``b -> (p, q)``): the contexts' laws taken already (:func:`_roots_t`)."""
    import torch

    take = _Rows(device)
    held = {b: {(): (take(p_root, b), take(q_root, b))} for b in bs} if roots is None else {b: {} for b in bs}
    for b in bs:
        for f in plan.sampled:
            s = scored[b].get(f.label)
            if s is None or s.q is None:
                continue
            paths = s.tree.paths()
            for i, v in enumerate(s.inner.tolist()):
                if v and paths[v] not in held[b]:
                    held[b][paths[v]] = (take(s.p, v), take(s.q, i))
    got = take.run(torch)
    out = {b: {path: (got[pa], got[qa]) for path, (pa, qa) in h.items()} for b, h in held.items()}
    if roots is not None:
        for b in bs:
            out[b] = {(): roots[b], **out[b]}
    return out


def _roots_t(p_root, q_root, bs: list, device) -> dict:
    """The contexts' laws of the prompts ``bs`` on the device route (``b -> (p, q)``), as :func:`_held_t` takes
    them (one gather per tensor)."""
    import torch

    take = _Rows(device)
    t = {b: (take(p_root, b), take(q_root, b)) for b in bs}
    got = take.run(torch)
    return {b: (got[pa], got[qa]) for b, (pa, qa) in t.items()}


class _Rows:
    """Rows of device tensors asked one by one (``rows(X, key)``: a ticket) and taken together (:meth:`run`): one
    ``index_select`` per tensor that holds some (a :class:`otspec.profile._trees_device.HostRows`' device tensor,
    or a tensor itself; its leading dimensions flattened), converted to float64 on ``device`` once, then split into
    rows; rows of anything else (host rows) as :func:`_law_row` gives them."""

    def __init__(self, device):
        self.device = device
        self.groups: dict = {}      # id(tensor) -> (tensor, [flat row], [ticket])
        self.other: list = []       # (ticket, rows, key)
        self.n = 0

    def __call__(self, rows, key) -> int:
        import torch

        base = rows._copy[0] if isinstance(rows, HostRows) else rows
        t, self.n = self.n, self.n + 1
        if isinstance(rows, HostRows):
            key = rows._at[key]
        if not torch.is_tensor(base) or base.ndim < 2:
            self.other.append((t, rows, key))
            return t
        lead = base.shape[:-1]
        flat = int(np.ravel_multi_index(tuple(np.atleast_1d(key).tolist()), lead)) if len(lead) > 1 else int(key)
        g = self.groups.setdefault(id(base), (base, [], []))
        g[1].append(flat)
        g[2].append(t)
        return t

    def run(self, torch) -> list:
        out: list = [None] * self.n
        for base, flat, tickets in self.groups.values():
            X = base.detach().reshape(-1, base.shape[-1])
            if flat != list(range(X.shape[0])):      # else every row in order (the contexts of a batch)
                X = X.index_select(0, torch.as_tensor(flat, dtype=torch.long, device=X.device))
            if (X.device, X.dtype) != (self.device, torch.float64):
                X = X.to(device=self.device, dtype=torch.float64)
            for t, row in zip(tickets, X.unbind(0)):
                out[t] = row
        for t, rows, key in self.other:
            out[t] = _law_row(rows, key, self.device) if not isinstance(rows, HostRows) else \
                _law_row([rows._copy[0][key]], 0, self.device)
        return out


def _expand_group(searches: list, held: list) -> None:
    r"""Expand the frontiers of ``searches`` (:class:`otspec.tree._bound._Search`, one family's shape, one per prompt)
    in one call per depth, from the laws ``held[i]`` holds for search ``i`` (host rows or tensors on the models'
    device: the bound's host or device route), each search taking its own rows' candidates; then each advances
    to its next frontier. A call's ``pi_exact`` holds for every search in it: where the race refuses a row (or is
    switched off) every prompt of that call reports :math:`\pi` as bounded, never the other way round."""
    _expand_groups([(searches, held)])


def _expand_groups(groups: list) -> None:
    """:func:`_expand_group` of each ``(searches, held)`` of ``groups`` (the families of a position), their calls
    run together: on the device route their reads shared (:func:`otspec.tree._bound._run_reads`: each round of
    reads one copy for every family and depth, so 2 per position's phase with a family drawn without replacement,
    else 1, not 1-2 per family and depth); the same values as one family at a time."""
    _Group(groups).finish()


class _Group:
    """:func:`_expand_groups` started: on the device route (every call :func:`otspec.tree._bound._expand_t`) the
    expansions run to their first read, which :attr:`reads` (:class:`otspec.tree._bound._Reads`) holds unread,
    so that the caller can read it with tensors of its own (:func:`begin_bounds`); :meth:`finish` reads the rest,
    hands each search its candidates and advances it. Elsewhere the calls run in :meth:`finish`."""

    def __init__(self, groups: list):
        self.groups = groups
        self.calls = []          # (searches, whose, run, args)
        for searches, held in groups:
            rows = [(i, u) for i, s in enumerate(searches) for u in s.frontier]
            rows.sort(key=lambda r: len(r[1].path))                 # stable: each search's order within a depth
            left = {s.left for s in searches}
            if len(left) != 1:
                raise AssertionError("the searches of one call must have one budget left")
            keep = left.pop()
            frontier = [u for _, u in rows]
            run, Pl, Ql = _laws_block([held[i][u.path][0] for i, u in rows], [held[i][u.path][1] for i, u in rows])
            slots, process = searches[0].slots, searches[0].process
            whose = {id(u): i for i, u in rows}
            for a, b in _depth_runs(frontier):
                self.calls.append((searches, whose, run, (slots, process, frontier[a:b], Pl[a:b], Ql[a:b], keep)))
        on_device = self.calls and all(run is _expand_t for _, _, run, _ in self.calls)
        self.reads = _Reads([_expand_t_steps(*args) for _, _, _, args in self.calls]) if on_device else None

    def finish(self) -> None:
        if self.reads is not None:
            got = self.reads.finish()
        else:
            got = [run(*args) for _, _, run, args in self.calls]
        for (searches, whose, _run, _args), (cand, ex, _drop) in zip(self.calls, got):
            owner = np.array([whose[id(u)] for u in cand["owner"]]) if cand is not None else np.zeros(0, np.int64)
            for i, s in enumerate(searches):
                s.absorb(_candidates_of(cand, owner == i), ex)
        for searches, _held in self.groups:
            for s in searches:
                s.advance()


def _candidates_of(cand, mask: np.ndarray):
    """The candidates of one search in a block that several searches share (None when it has none)."""
    if cand is None or not mask.any():
        return None
    idx = np.flatnonzero(mask)
    return dict(pr=cand["pr"][idx], owner=[cand["owner"][k] for k in idx.tolist()], x=cand["x"][idx],
                Q=cand["Q"][idx], pi=cand["pi"][idx], p=cand["p"][idx],
                caps={d: c[idx] for d, c in cand["caps"].items()},
                dr=None if cand["dr"] is None else cand["dr"][:, idx])


def _score_paths(lm, state, last, n_ctx: int, want: list, sampling, device=None, flags: list | None = None) -> list:
    """One tree-attention call of ``lm`` on the ``B`` contexts its state holds: prompt ``b``'s paths ``want[b]``
    (and their ancestors) as one tree after its context; ``[{path: law}]`` per prompt (host rows, or with
    ``device`` rows of the call's laws kept on it), the state left holding the contexts. The laws are checked at
    once (a host read), or, with ``flags`` (the device route), formed unchecked and ``(flag, logits)`` appended,
    the flag whether a row came from bad logits (:func:`otspec.decoding._sampling.bad_rows`), for the caller to
    read with its values (:class:`BoundsLater`) and raise the checked error from."""

    B = len(want)
    trees = []
    for paths in want:
        nodes = sorted({path[:k] for path in paths for k in range(1, len(path) + 1)}, key=lambda s: (len(s), s))
        trees.append(nodes)
    m = 1 + max(len(nodes) for nodes in trees)
    parents = np.full((B, m), -1, dtype=np.int64)
    tokens = np.full((B, m), -1, dtype=np.int64)
    index = []
    for b, nodes in enumerate(trees):
        at = {(): 0}
        for i, s in enumerate(nodes, start=1):
            at[s] = i
            parents[b, i] = at[s[:-1]]
            tokens[b, i] = s[-1]
        index.append(at)
    logits = padded_tree_logits(lm, state, parents, tokens, last, n_ctx)
    laws = sampling.probs(logits, check=flags is None)
    if flags is not None:
        flags.append((bad_rows(laws).any(), logits))
    if device is None:
        laws = laws if isinstance(laws, np.ndarray) else laws.detach().to("cpu").numpy()
        return [{path: laws[b, index[b][path]] for path in want[b]} for b in range(B)]
    import torch

    # kept where they are (the bound runs there): every path's law in one gather, not one indexing op per path
    flat = [b * m + index[b][path] for b in range(B) for path in want[b]]
    rows = laws.detach().reshape(B * m, -1).index_select(0, torch.as_tensor(flat, dtype=torch.long,
                                                                            device=laws.device))
    if (rows.device, rows.dtype) != (device, torch.float64):
        rows = rows.to(device=device, dtype=torch.float64)
    rows = iter(rows.unbind(0))
    return [{path: next(rows) for path in want[b]} for b in range(B)]


class _Begun:
    """The bound of a position begun on the device route (:func:`begin_bounds`): the prompts ``bs``, the contexts'
    laws ``roots`` (``b -> (p, q)`` tensors), the searches of each family (``groups``, one per prompt) and their
    contexts' expansion started (``expand``, a :class:`_Group`), whose first read :attr:`parts` holds."""

    def __init__(self, bs, roots, groups, expand):
        self.bs, self.roots, self.groups, self.expand = bs, roots, groups, expand

    @property
    def parts(self) -> list:
        """``[(tensor, store)]``: the contexts' first read, unread (none when it is taken already), for
        :func:`otspec.profile._quantities.read_parts` to read with other parts; reading it is optional (else
        :func:`position_bounds` reads it)."""
        reads = self.expand.reads
        flat = None if reads is None else reads.ask()
        return [] if flat is None else [(flat, reads.give)]


def begin_bounds(p_root, q_root, plan, which, budget: int):
    """The contexts' expansion of :func:`position_bounds` begun on the device route (``p_root`` a tensor), before the
    walk's tree values are read: it reads only the contexts' laws, so its first read (the rows' values, or the
    race's power sums) can be read with the walk's (:attr:`_Begun.parts`); hand the result to
    :func:`position_bounds` (``begun``). None where there is nothing to bound or the bound runs on the host.
    The same bound as without it (the same tensors read, at another time)."""
    fams = plan.sampled
    device = _route_device(p_root)
    if not fams or not any(which) or device is None:
        return None
    bs = [b for b in range(len(which)) if which[b]]
    roots = _roots_t(p_root, _law_row([q_root], 0, device), bs, device)
    groups = [[_Search(_Slots(f.shape), f.process, budget, budget) for _ in bs] for f in fams]
    return _Begun(bs, roots, groups, _Group([(group, [{(): roots[b]} for b in bs]) for group in groups]))


def position_bounds(draft, ds, target, ts, last, n_ctx: int, p_root, q_root, plan, sampling, scored: list,
                    which, budget: int, begun=None, *, defer: bool = False):
    r"""The bound of every sampled-tree family at one position of ``B`` prompts, from the laws the walk holds and
    one tree-attention call per model for the prefixes it expands beyond them.

    .. math::

        \hat B(f, c_b) \ge \mathrm{OPT}_c(f, c_b) \ge \mathbb E[\tau \mid c_b]
        \quad\text{for every lossless verifier of the family } f \text{ at the context } c_b.

    Parameters
    ----------
    draft, target : LanguageModel
        With ``tree_logits`` (both), as the walk's target.
    ds, ts : states
        Holding the ``B`` contexts (``n_ctx`` columns each); left holding them.
    last : (B,) int array
        The contexts' last tokens (the roots).
    p_root, q_root : (B, V) arrays
        The draft's and the target's (processed) laws after each context. A tensor ``p_root`` (the walk's laws on
        the models' device, :func:`otspec.profile._collect.analysis_device`) puts the bound on the device route:
        the held laws and the scored frontier stay tensors there (``q_root`` is copied there), the bound runs on
        them (:func:`otspec.tree.bound`'s torch route) and only its per-row values reach the host.
    plan : TreePlan
    sampling : Sampling
        Applied to every law, as for the walk's trees.
    scored : list of dict
        Per prompt, :func:`otspec.profile._trees.draw_and_score`'s ``label -> _Scored``: their internal nodes'
        laws are reused.
    which : sequence of bool
        The prompts whose bound is computed (their subsampled positions).
    budget : int
        Most prefixes expanded per family (the context included), 1 to :data:`MAX_PROFILE_BOUND_BUDGET`: the
        context and up to ``budget - 1`` of its children, the largest :math:`\min(Q, \pi)` first.
    begun : _Begun, optional
        :func:`begin_bounds` of the same ``p_root``, ``q_root``, ``plan``, ``which`` and ``budget`` (the device
        route: the contexts' expansion begun, its first read possibly read with the walk's); None: begun here.
    defer : bool
        Stop before the frontiers' first read: a :class:`BoundsLater` is returned, whose :attr:`~BoundsLater.parts`
        the caller reads with a later read of its own (the walk: with the next position's values) and whose
        :meth:`~BoundsLater.finish` then gives the list below. The models' calls are all made here (the states
        are free to move on); on the device route the frontiers' laws are gathered into blocks of their own, so
        nothing the walk writes later changes them. The same values as without ``defer``.

    Returns
    -------
    list
        Per prompt, ``label -> TreeBound`` (:class:`otspec.tree.TreeBound`) of every sampled family, or None
        where ``which`` is False (a :class:`BoundsLater` of it with ``defer``).
    """
    B = len(which)
    out: list = [None] * B
    fams = plan.sampled
    if not fams or not any(which):
        return BoundsLater(None, lambda: out) if defer else out
    device = _route_device(p_root)
    bs = [b for b in range(B) if which[b]]
    # the contexts of every prompt in one expansion per family, every family's together (their reads shared); each
    # frontier after them spends the budget
    if device is not None:                          # the contexts' target laws: one copy for the batch
        if begun is None:
            begun = begin_bounds(p_root, q_root, plan, which, budget)
        if begun.bs != bs or len(begun.groups) != len(fams):
            raise ValueError("`begun` must be begin_bounds of the same plan and prompts")
        groups = begun.groups
        begun.expand.finish()                       # its first read taken with the walk's, or here
        held = _held_t(p_root, None, scored, plan, bs, device, roots=begun.roots)
    else:
        held = {b: _held(p_root[b], q_root[b], scored[b], plan) for b in bs}
        groups = [[_Search(_Slots(f.shape), f.process, budget, budget) for _ in bs] for f in fams]
        _expand_groups([(group, [held[b] for b in bs]) for group in groups])
    want: dict = {b: dict() for b in bs}  # ordered sets of the paths to score
    searches: dict = {}
    for f, group in zip(fams, groups):
        for b, s in zip(bs, group):
            searches[(b, f.label)] = s
            if s.frontier:
                s.budget = len(s.expanded)  # one expansion more, and the budget is spent
                want[b].update(dict.fromkeys(u.path for u in s.frontier if u.path not in held[b]))
    # deferred on the device route: the scoring calls' laws checked in the frontiers' first read
    flags = [] if defer and device is not None else None
    if any(want.values()):
        paths = [list(want.get(b, ())) for b in range(B)]
        got_d = _score_paths(draft, ds, last, n_ctx, paths, sampling, device, flags)
        got_t = _score_paths(target, ts, last, n_ctx, paths, sampling, device, flags)
        for b in bs:
            for path in paths[b]:
                held[b][path] = (got_d[b][path], got_t[b][path])
    # every prompt's frontier in one expansion per family (and depth), every family's together
    todo = []
    for f in fams:
        group = [(b, searches[(b, f.label)]) for b in bs if searches[(b, f.label)].frontier]
        if group:
            todo.append(([s for _, s in group], [held[b] for b, _ in group]))
    frontiers = _Group(todo)                        # on the device route: run to its first read, left unread

    def done() -> list:
        frontiers.finish()
        for b in bs:
            out[b] = {f.label: searches[(b, f.label)].result() for f in fams}
        return out

    return BoundsLater(frontiers, done, flags, sampling) if defer else done()


class BoundsLater:
    """:func:`position_bounds` stopped before its frontiers' first read (``defer``): :attr:`parts` that read (none on
    the host route, or when nothing is left to expand), for :func:`otspec.profile._quantities.read_parts` to read
    with other parts, or left for :meth:`finish` to read; :meth:`finish` reads whatever is left (the race's second
    round where a family drawn without replacement needs it) and returns the bounds. ``flags``: the scoring calls'
    unchecked laws (:func:`_score_paths`), read first: a law from bad logits raises the checked error (``sampling``'s)
    before any value is used."""

    def __init__(self, group, done, flags=None, sampling=None):
        self.group, self.done, self.flags, self.sampling = group, done, flags or [], sampling

    @property
    def parts(self) -> list:
        """``[(tensor, store)]``: the scoring calls' bad-logits flags and the frontiers' first read, unread (none
        when taken already or on the host route)."""
        import torch

        out = []
        if self.flags:
            flags, self.flags = self.flags, []

            def check(host) -> None:
                for (_, logits), bad in zip(flags, np.asarray(host).tolist()):
                    if bad:
                        self.sampling.probs(logits)     # the checked route's error

            out.append((torch.stack([f for f, _ in flags]), check))
        reads = None if self.group is None else self.group.reads
        flat = None if reads is None else reads.ask()
        return out if flat is None else [*out, (flat, reads.give)]

    def finish(self) -> list:
        """The bounds (:func:`position_bounds`' list), their reads left taken here (the scoring calls' flags first,
        where no read of the caller's took them)."""
        if self.flags:
            read_parts(self.parts)
        return self.done()


def _route_device(p_root):
    """The device of the bound's route: ``p_root``'s when it is a tensor (the walk's device route), else None."""
    import sys

    torch = sys.modules.get("torch")
    return p_root.device if torch is not None and torch.is_tensor(p_root) else None


def record_bounds(rows, pos: int, plan, bounds: list) -> None:
    """Append one position's bound rows to each prompt's row builder (``rows[b]``; prompts whose ``bounds[b]`` is
    None get none): ``kind="treebound"``, ``name`` the family's label, ``k`` its draft nodes, ``j`` 1..4 as
    :data:`BOUND_FIELDS`."""
    for r, got in zip(rows, bounds):
        if got is None:
            continue
        for f in plan.sampled:
            tb = got[f.label]
            r.add(pos, BOUND_KIND, f.label, f.n, [tb.value, tb.remainder, float(tb.pi_exact), float(tb.n_expanded)])
