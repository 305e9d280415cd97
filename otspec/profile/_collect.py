r"""Walk a context path, draw a draft tree at each profiled position, score it once, compute the exact quantities.

Per prompt, the draft and the target each keep one state (a KV cache for
:class:`otspec.decoding.HFCausalLM`) holding the path so far; at a profiled
position the ``k_max`` draft blocks are drawn with one batched draft call per
depth, the whole tree is scored by one target call on ``(k_max, L_max + 1)``
new tokens, and both states are cut back to the path (``select``).

With ``batch_size > 1``, :func:`profile_bucket` walks ``B`` prompts of one
path length in lockstep, left-padded to the longest prompt: one state of
``B`` rows, ``B k_max`` rows in the draft tree, every model call shared;
each prompt keeps its own generator and its own order of draws, so on
exact models its rows equal :func:`profile_prompt`'s.

With ``settings.trees``, each profiled position also drafts and scores the
draft-tree families after the same context (:func:`tree_rows`; their draws
come from a generator of their own, so the path and the ``(k, L)`` rows are
those of a run without trees).

Notation: ``p`` is the draft's law, ``q`` the target's.
"""

from __future__ import annotations

import numpy as np

from .._array import to_host
from .._registry import get_verifier
from .._timing import Stopwatch, timed_rounds
from ..decoding._models import supports_padding
from ..decoding._sampling import bad_rows, on_device, sample_rows
from ._overhead import BUDGET_ROW, SPENT_ROW, CalibrationBudget, overhead_rows, walk_tokens
from ._quantities import Builds, depth_quantities, expected_accepted, parts_after, prefill_batched, read_parts
from ._renewal_hook import renewal_drawn_trees
from ._settings import costly as is_costly
from ._tree_bound import begin_bounds, bound_law_bytes, bound_route_on_device, position_bounds, record_bounds
from ._trees import (
    LawBuffers,
    along_text_families,
    compact_tree,
    draft_trees,
    position_values,
    ranks_by_raw_law,
    record_position,
    score_sampled,
    score_trees,
    tree_cost_shapes,
    tree_law_bytes,
    tree_rng,
)

__all__ = ["analysis_device", "batch_builds", "check_device_memory", "device_law_bytes",
           "prompt_rng", "profile_prompt", "profile_bucket", "path_length", "position_rows", "is_subsampled",
           "cost_rows", "cost_shapes", "tree_drafts", "tree_rows", "TreesLater", "COLUMNS", "COST_REPEATS", "COST_WARMUP",
           "TIMING_KINDS"]

#: Columns of a profile table (one row per value): prompt index, path position, what, which scheme,
#: number of drafts, depth or draft length, index inside an emission table, the value.
COLUMNS = ("prompt", "pos", "kind", "name", "k", "j", "m", "value")
#: Kinds of rows holding wall-clock seconds (they differ between runs): the per-prompt timers and the cost calibration.
TIMING_KINDS = ("time", "cost")


def prompt_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of prompt ``index``: ``np.random.SeedSequence(seed).spawn(index + 1)[index]``, built directly."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(int(index),)))


def _np(t) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else t.detach().to("cpu").numpy()


class _Rows:
    def __init__(self, prompt: int):
        self.prompt = prompt
        self.cols: dict[str, list] = {c: [] for c in COLUMNS}

    def add(self, pos: int, kind: str, name: str, k: int, values, m: int = 0, j0: int = 1):
        c = self.cols
        for i, v in enumerate(np.atleast_1d(np.asarray(values, dtype=np.float64)).tolist()):
            if v != v:  # NaN: undefined at this position (see depth_quantities), not recorded
                continue
            c["prompt"].append(self.prompt)
            c["pos"].append(pos)
            c["kind"].append(kind)
            c["name"].append(name)
            c["k"].append(k)
            c["j"].append(i + j0)
            c["m"].append(m)
            c["value"].append(v)


class _Checks:
    r"""The bad-logits checks of one profiled position's model calls, left on the device and read once.

    Each kept law (:meth:`_Timer.call` with ``checks``) adds one flag, :math:`\exists` a row made from bad logits
    (:func:`otspec.decoding._sampling.bad_rows`: such a row is NaN throughout); :meth:`read` brings a tensor of the
    position's values to the host together with the flags added since the last read, in one transfer (one
    synchronisation on a GPU instead of one per call), and raises :meth:`fail`'s error for the first bad call
    before any value is returned. Reading the drafts carries the draft calls' flags, reading the path's target
    law the target call's: nothing computed from a bad law leaves the device unchecked.
    """

    def __init__(self, pos: int | None):
        self.pos = pos
        self.pending: list = []  # (lm, which, call number, flag)
        self.calls = 0

    def add(self, lm, which: str, probs) -> None:
        self.calls += 1
        self.pending.append((lm, which, self.calls, bad_rows(probs).any()))

    def fail(self, lm, which: str, sampling, call: int | None = None):
        name = getattr(lm, "name", type(lm).__name__)
        where = f" at path position {self.pos}" if self.pos is not None else ""
        nth = f" (call {call} of the position)" if call is not None else ""
        raise ValueError(f"the {which} model {name!r} gave non-finite logits (NaN or inf){where}{nth}: "
                         f"{sampling.invalid_law}")

    def parts(self, values, sampling, then=()) -> tuple[list, dict]:
        """:meth:`read` as parts of a larger read (:func:`otspec.profile._quantities.read_parts`): ``(parts, got)``,
        the pending flags first (their store raises :meth:`fail`'s error for the first bad call, before any value is
        stored), then the caller's parts ``then``, then ``values``, whose host copy the store puts in
        ``got["values"]``."""
        import torch

        got: dict = {}
        pend, self.pending = self.pending, []
        out = []
        if pend:
            flags = torch.stack([on_device(f, values.device) for *_, f in pend]).to(torch.float64)

            def check(host):
                for (lm, which, call, _), bad in zip(pend, host.tolist()):
                    if bad:
                        self.fail(lm, which, sampling, call)

            out.append((flags, check))
        out.extend(then)
        out.append((values, lambda host: got.__setitem__("values", np.array(host))))  # a copy, not a view
        return out, got

    def read(self, values, sampling) -> np.ndarray:
        """``values`` (a tensor) on the host as numpy, with the pending flags in the same transfer."""
        import torch

        if not self.pending:
            return _np(values)
        flat = values.reshape(-1)
        flags = torch.stack([on_device(f, flat.device) for *_, f in self.pending]).to(flat.dtype)
        host = torch.cat([flat, flags]).to("cpu").numpy()
        n = flat.shape[0]
        for (lm, which, call, _), bad in zip(self.pending, host[n:]):
            if bad:
                self.fail(lm, which, sampling, call)
        self.pending = []
        return host[:n].reshape(tuple(values.shape))


class _Timer:
    """Seconds spent in forward passes (model calls and the float64 laws), per model."""

    def __init__(self):
        self.draft = 0.0
        self.target = 0.0
        self.draft_steps = 0
        self.target_calls = 0

    def call(self, lm, state, ids, sampling, which: str, last: int, *, keep: bool = False, own: bool = False,
             checks: _Checks | None = None):
        """The float64 laws of the last ``last`` positions: numpy, or (``keep``) a tensor left on the model's device;
        with ``own``, also the model's own laws there (numpy, :meth:`otspec.decoding.Sampling.own_law`).

        Laws from bad logits raise :attr:`~otspec.decoding.Sampling.invalid_law`'s error: checked on the host
        copy (no read of its own), or, for a kept tensor, at once (one host read) unless ``checks`` defers the
        check to its one read of the position's values (:class:`_Checks`).

        Timed as one synchronised section (:class:`otspec._timing.Stopwatch`): work queued on the device before
        the call is not charged to it, the call's own kernels are."""
        import torch

        watch = Stopwatch(lm.device)
        with watch:
            t = on_device(ids, lm.device) if torch.is_tensor(ids) else torch.as_tensor(np.ascontiguousarray(ids),
                                                                                       dtype=torch.long).to(lm.device)
            logits = lm.logits(state, t)[:, -last:]
            probs = sampling.probs(logits, check=keep and checks is None)
            raw = _np(sampling.own_law(logits)) if own else None
            if not keep:
                probs = _np(probs)
        dt = watch.seconds
        for law in (probs, raw) if not keep else (raw,):  # on the host: checked where they are
            if law is not None and law.size and np.isnan(law[..., 0]).any():
                (checks or _Checks(None)).fail(lm, which, sampling)
        if keep and checks is not None:
            checks.add(lm, which, probs)
        if which == "draft":
            self.draft += dt
            self.draft_steps += 1
        else:
            self.target += dt
            self.target_calls += 1
        return (probs, raw) if own else probs


class _Shared:
    """The timers of the ``B`` prompts of a batched call: each is charged ``1 / B`` of its seconds and one call."""

    def __init__(self, timers: list[_Timer]):
        self.timers = timers

    def call(self, lm, state, ids, sampling, which: str, last: int, *, keep: bool = False, own: bool = False,
             checks: _Checks | None = None):
        one = _Timer()
        probs = one.call(lm, state, ids, sampling, which, last, keep=keep, own=own, checks=checks)
        B = len(self.timers)
        for tm in self.timers:
            tm.draft += one.draft / B
            tm.target += one.target / B
            tm.draft_steps += one.draft_steps
            tm.target_calls += one.target_calls
        return probs


#: Repetitions of every timed call of the cost calibration (:func:`cost_rows`; the summary keeps the median and
#: the spread), after one untimed warm-up round: every call shape the contenders need (all of them without the
#: walk's tokens per call); the others once.
COST_REPEATS = 3
#: Untimed rounds of every call shape before the timed ones.
COST_WARMUP = 1


def cost_shapes(settings) -> dict[str, list[tuple[int, int]]]:
    """The calls a decoder with these settings makes, as ``(rows, new tokens per row)`` per model.

    The target: one token (a step of plain decoding, the baseline) and ``k`` draft blocks scored as ``k``
    rows of ``L + 1`` tokens, for every ``k <= k_max`` and ``L <= L_max``. The draft: one batched step on
    ``k`` rows of one token, for every ``k <= k_max`` (the first depth drafts from one row).
    """
    grid = [(k, L + 1) for k in range(1, settings.k_max + 1) for L in range(1, settings.L_max + 1)]
    # the tree families' draft calls: one step on the nodes of a depth that get children
    plan = getattr(settings, "tree_plan", None)
    tree_rows = tree_cost_shapes(plan)["draft"] if plan is not None else []
    return {"target": [(1, 1)] + [g for g in grid if g != (1, 1)],
            "draft": [(k, 1) for k in range(1, settings.k_max + 1)] + [(r, 1) for r in tree_rows if r > settings.k_max]}


def _timed_calls(rows: _Rows, lm, ctx: list[int], name: str, calls: dict, *, warmup: int = COST_WARMUP,
                 repeats: int = COST_REPEATS, j0: int = 1) -> None:
    """Time ``calls`` (``key -> (k, m, call(state))``) after ``ctx[:-1]`` held in ``lm``'s state, in interleaved
    rounds (:func:`otspec._timing.timed_rounds`: synchronised, ``warmup`` untimed rounds first), the state cut back
    to the context after each call outside the clock; rows ``kind="cost"``, ``name``, ``k``, ``m``, ``j`` the
    repetition (from ``j0``)."""
    import torch

    held = len(ctx) - 1
    box = [lm.new_state()]
    if held:
        lm.logits(box[0], torch.as_tensor([ctx[:held]], dtype=torch.long).to(lm.device))

    def reset(_key):
        if held:
            lm.select(box[0], 0, held)
        else:
            box[0] = lm.new_state()

    got = timed_rounds({key: (lambda c=c: c(box[0])) for key, (_, _, c) in calls.items()}, device=lm.device,
                       warmup=warmup, repeats=repeats, reset=reset)
    for key, (k, m, _) in calls.items():
        rows.add(-1, "cost", name, k, got[key].samples, m=m, j0=j0)


def _shape_calls(draft, target, ctx: list[int], settings) -> dict:
    """The calibration's timed calls: ``name -> (model, {(rows, tokens per row) -> (k, m, call(state))})`` for
    ``"target"``, ``"draft"`` (:func:`cost_shapes`) and, with trees, ``"tree-target"`` (:func:`_tree_costs`)."""
    import torch

    shapes = cost_shapes(settings)
    out = {}
    for name, lm in (("target", target), ("draft", draft)):
        calls = {}
        for k, n in shapes[name]:
            ids = np.full((k, n), ctx[-1], dtype=np.int64)
            ids[:, 1:] = (np.arange(1, n) * 7919 + np.arange(k)[:, None]) % lm.vocab_size
            t = torch.as_tensor(ids).to(lm.device)
            calls[(k, n)] = (k, n, lambda state, lm=lm, t=t: lm.logits(state, t))
        out[name] = (lm, calls)
    plan = getattr(settings, "tree_plan", None)
    if plan is not None:
        out["tree-target"] = (target, _tree_costs(target, ctx, tree_cost_shapes(plan)["tree"]))
    return out


def _needed_shapes(keys, settings) -> set | None:
    """The call shapes ``(name, rows, tokens per row)`` behind the forward passes of the ``(family, k, L)`` of
    ``keys`` and of plain decoding (None: every shape); the tree families' shapes always."""
    if keys is None:
        return None
    need = {("target", 1, 1), ("draft", 1, 1)}
    for _, k, L in keys:
        need |= {("draft", k, 1), ("target", k, L + 1)}
    return need


def cost_rows(draft, target, prompt: list[int], settings, index: int, *, overhead: bool = True,
              walked: dict | None = None, predict=None) -> dict:
    r"""Seconds of every model call a decoder makes, measured on the models' device at ``prompt``'s context.

    .. math::

        t_{\text{target}}(k, L + 1), \qquad t_{\text{target}}(1, 1), \qquad t_{\text{draft}}(k, 1),

    the wall time of one model call (the forward pass: its logits; the laws, the verification and the draws
    are the decoder's work outside it, measured apart) on ``k`` rows of ``n`` new tokens after the prompt's
    cached context, for the shapes of :func:`cost_shapes`: one untimed warm-up round and one timed round of every
    shape, then up to :data:`COST_REPEATS` timings in all of the shapes the contenders need (every shape without
    ``walked``), in interleaved rounds, each call with the device synchronised before the clock starts and after
    it stops (:func:`otspec._timing.timed_rounds`), so that the queued work of one call (or of the cache cut after
    it) is never charged to the next. The run's first shard calls it once, after walking its prompts. With
    ``overhead``, also the decoder's own work outside the model calls, on a few real iterations of the
    configurations the recommendation needs (:func:`otspec.profile._overhead.overhead_rows`: a racing
    calibration on the walk's tokens per call, ``walked`` the first shard's rows, ranked by ``predict``:
    :func:`otspec.profile._summary.calibration_predictions`). The speed-up model of
    :func:`otspec.profile.summarize` predicts from these, so the prediction is for the device and the models the
    profile ran on. The token ids of the timed calls are fixed (a call's time does not depend on them).

    Everything after the first round of shapes runs only while it fits ``settings.calibration_s`` seconds (None:
    unbounded), each next piece of work estimated from the seconds measured before it; the rows record the
    budget (``name="calibration:budget"``) and the seconds taken (``"calibration:seconds"``).

    Returns
    -------
    dict of lists
        The columns :data:`COLUMNS`: rows ``kind="cost"``, ``name`` the model, ``k`` the rows, ``m`` the new
        tokens per row, ``j`` the repetition, ``value`` the seconds.
    """
    rows = _Rows(index)
    ctx = [int(t) for t in prompt]
    seconds = getattr(settings, "calibration_s", None)
    budget = CalibrationBudget(seconds)
    shapes = _shape_calls(draft, target, ctx, settings)
    for name, (lm, calls) in shapes.items():
        _timed_calls(rows, lm, ctx, name, calls, repeats=1)
    meds = {}

    def again(rep: int, keys) -> None:
        if rep >= COST_REPEATS:
            return
        need = _needed_shapes(keys, settings)
        for name, (lm, calls) in shapes.items():
            pick = {key: c for key, c in calls.items() if need is None or name == "tree-target"
                    or (name, *key) in need or (name == "draft" and key[0] > settings.k_max)}
            if not meds:  # each shape's first timing
                for n, k, m, v in zip(*(rows.cols[c] for c in ("name", "k", "m", "value"))):
                    meds.setdefault((n, k, m), v)
            est = sum(meds.get((name, k, m), 0.0) for k, m, _ in pick.values()) + meds.get(("target", 1, 1), 0.0)
            if pick and budget.fits(est):
                _timed_calls(rows, lm, ctx, name, pick, warmup=0, repeats=1, j0=rep + 1)

    if overhead:
        overhead_rows(rows, draft, target, ctx, settings, tokens=walk_tokens(walked) if walked else None,
                      budget=budget, on_round=again, predict=predict)
    else:
        for rep in range(1, COST_REPEATS):
            again(rep, None)
    if seconds is not None:
        rows.add(-1, "cost", BUDGET_ROW, 0, [seconds])
    rows.add(-1, "cost", SPENT_ROW, 0, [budget.spent()])
    return rows.cols


def _tree_costs(target, ctx: list[int], trees) -> dict:
    """The calls of the target scoring a draft tree of ``n`` nodes (``n + 1`` tokens, tree mask), for every ``n`` of
    ``trees``, timed as :func:`cost_rows` times its calls (rows ``name="tree-target"``, ``m = n + 1``):
    ``n -> (1, n + 1, call(state))``."""
    V = target.vocab_size
    calls = {}
    for n, parents in trees:
        tokens = np.concatenate([[-1], (np.arange(1, n + 1) * 7919 + 1) % V]).astype(np.int64)
        calls[n] = (1, n + 1, lambda state, parents=parents, tokens=tokens: target.tree_logits(
            state, parents, tokens, pending=[ctx[-1]], fallback="rows"))
    return calls


def analysis_device(lm):
    r"""The accelerator holding ``lm`` (its tree's laws stay there for the batched quantities), or None on the CPU.

    On a CPU the quantities run on numpy arrays (as fast as torch there, and bit-identical run to run); on
    an accelerator the target's scoring laws stay on it and the draft's laws (on the host for sampling)
    are copied there once per tree, so the batched quantities (:math:`\alpha_k`, the maximal coupling,
    token and block :math:`E[\tau \mid X]`) run where the models are and only their values come back.
    """
    import torch

    dev = torch.device(getattr(lm, "device", "cpu"))
    return None if dev.type == "cpu" else dev


def device_law_bytes(settings, V: int, lengths) -> dict:
    """Bytes of the laws a batch holds on the models' device at once, by part: ``"blocks"`` (the draft laws of the
    ``(k, L)`` blocks and the target's float64 scoring laws, ``B k_max (2 L_max + 1) V``), ``"first call"`` (the
    float32 logits of the first target call on prompts of up to ``max(lengths)`` tokens) and ``"trees"`` (the
    float32 logits and float64 laws of the largest tree scoring call, :func:`otspec.profile._trees.tree_law_bytes`
    at 12 bytes a value) and ``"held position"`` (with costly quantities, ``subsample > 0``: a subsampled position's
    blocks, kept on the device until its values travel in the next position's read, beside that position's own) and
    ``"held bound"`` (with the tree bound on, ``bounds_trees``, at subsampled positions: the laws of its frontiers,
    :func:`otspec.profile._tree_bound.bound_law_bytes`, kept until their first read rides the next position's)."""
    s = settings
    lengths = [int(n) for n in lengths] or [0]
    B = min(s.batch_size, s.shard_size, len(lengths))
    out = {"blocks": B * s.k_max * (2 * s.L_max + 1) * V * 8,
           "first call": B * s.k_max * (max(lengths) + s.L_max + 1) * V * 4,
           "trees": tree_law_bytes(s.tree_plan, V, B) * 12 // 8}
    out["held position"] = out["blocks"] if s.subsample > 0 else 0
    held = s.subsample > 0 and getattr(s, "bounds_trees", False)
    out["held bound"] = bound_law_bytes(s.tree_plan, s.bound_budget, V, B) if held else 0
    return out


def check_device_memory(settings, V: int, lengths, device, *, free: int | None = None) -> None:
    """Refuse settings whose laws on the models' accelerator (:func:`device_law_bytes`) pass its free memory.

    ``device``: a torch device (None or the CPU: nothing to check here, the host's limit is
    :func:`otspec.profile._settings.check_limits`'); ``free``: its free bytes (default
    ``torch.cuda.mem_get_info``), read before the run's first forward pass.

    Raises
    ------
    ValueError
        Naming every part's size, the total and the free memory, and what to lower.
    """
    if device is None or (free is None and getattr(device, "type", str(device)) != "cuda"):
        return
    if free is None:
        import torch

        free = int(torch.cuda.mem_get_info(device)[0])
    parts = device_law_bytes(settings, V, lengths)
    need = sum(parts.values())
    if need > free:
        sizes = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in parts.items() if v)
        raise ValueError(
            f"these settings hold {need / 2**30:.2f} GiB of laws at once on {device} at a vocabulary of {V} tokens "
            f"({sizes}), above its free memory {free / 2**30:.2f} GiB: lower `batch_size`, `k_max` or `L_max`, "
            "shorten the prompts, or use smaller `trees`")


def _to_device(P: np.ndarray, dev):
    import torch

    if dev is None:
        return P
    return on_device(P, dev) if torch.is_tensor(P) else torch.as_tensor(P).to(dev)  # a tensor: moved if elsewhere


def _draft_buffers(p1, k, L: int, V: int):
    """The ``(*k, L)`` drafts and ``(*k, L, V)`` draft laws of a position (``k`` an int or a shape), where ``p1``
    (the first depth's law) is."""
    k = (k,) if isinstance(k, int) else tuple(k)
    if isinstance(p1, np.ndarray):
        return np.empty(k + (L,), dtype=np.int64), np.empty(k + (L, V))
    import torch

    return (torch.empty(k + (L,), dtype=torch.long, device=p1.device),
            torch.empty(k + (L, V), dtype=torch.float64, device=p1.device))


def _fed(ids: np.ndarray, dev):
    """The ``(B, t)`` host token ids a position feeds its models: the array itself for host laws, else one
    int64 tensor on ``dev`` (one host-to-device copy for the draft's call and the target's)."""
    if dev is None:
        return ids
    import torch

    return torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)).to(dev, non_blocking=True)


def _scored(pend, X, k: int):
    """The target's ``(B k, t + L)`` input of a position: each prompt's pending ids ``pend`` (``(B, t)``) before
    its ``k`` drafts ``X`` (``(B k, L)``), in ``X``'s namespace (numpy, or a tensor where both are)."""
    if isinstance(X, np.ndarray):
        return np.concatenate([np.repeat(np.asarray(pend, dtype=np.int64), k, axis=0), X], axis=1)
    import torch

    return torch.cat([torch.repeat_interleave(pend, k, dim=0), X], dim=1)


def _drafts_on_host(X, checks: _Checks, sampling, *, later: bool):
    """The drafts ``X`` (a tensor where the laws are) in host memory, and the parts that fill them later: read at
    once with the draft calls' pending bad-logits flags (:meth:`_Checks.read`; no parts), or, with ``later``, an
    empty host array and the part (:func:`otspec.profile._quantities.read_parts`) that fills it in the position's
    one read of its values, after the flags (:meth:`_Checks.parts`): a bad draft law still raises its error before
    any value of the position is stored or any row written. The target's call in between is harmless: the device's
    draws give ids in ``[0, V)`` even from a bad law (:func:`otspec.decoding._sampling.sample_rows`). The walk reads
    them later at every position: a subsampled one's costly quantities, whose batched forms lay the drafts' tree out
    on the host, are computed after that read and read with the next position's values (or at the walk's end)."""
    if not later:
        return checks.read(X, sampling), ()
    host = np.empty(tuple(X.shape), dtype=np.int64)

    def fill(vals):
        host[...] = vals

    return host, ((X, fill),)


def _rows_of(p1, k: int, V: int):
    """``p1`` (one row) seen as ``k`` rows, without a copy."""
    return np.broadcast_to(p1, (k, V)) if isinstance(p1, np.ndarray) else p1.expand(k, V)


def _sample(P: np.ndarray, rng: np.random.Generator, uniforms=None) -> np.ndarray:
    return sample_rows(P, rng, uniforms=uniforms)


def _step_uniforms(p1, rngs: list, k: int, L: int):
    """The ``(B, L, k)`` uniforms of the ``L`` draft steps of ``B`` prompts on the device of the tensor ``p1``, in
    one host-to-device copy: ``rngs[b]``'s next ``L k`` doubles, in the order the steps would draw them one copy at a
    time (a generator's ``random(L k)`` is its ``random(k)`` drawn ``L`` times); None for host laws (drawn per step).
    """
    if isinstance(p1, np.ndarray):
        return None
    import torch

    return torch.from_numpy(np.stack([g.random((L, k)) for g in rngs])).to(p1.device, non_blocking=True)


def is_subsampled(pos, prompt, settings) -> bool:
    """Whether the costly quantities run at this position: every ``subsample``-th profiled position of a prompt,
    offset by the prompt's index so that the subsample spreads evenly over prompts (and over a shard)."""
    every = settings["subsample"] if isinstance(settings, dict) else settings.subsample
    stride = settings["stride"] if isinstance(settings, dict) else settings.stride
    return every > 0 and (pos // stride + prompt) % every == 0


def position_rows(rows: _Rows, pos: int, X, P, Q, settings, costly: bool, builds: Builds | None = None) -> None:
    """Every exact quantity of one profiled position, appended to ``rows`` (``builds``: the tree's
    :class:`otspec.profile._quantities.Builds`, its batched quantities perhaps already computed with other prompts'
    by :func:`batch_builds`)."""
    L = settings.L_max
    builds = Builds(X, P, Q, settings.verifier_options) if builds is None else builds
    for name in settings.verifiers:
        if is_costly("acc", name) and not costly:
            continue
        spec = get_verifier(name)
        ks = settings.ks(name)
        for (kind, k), vals in depth_quantities(name, ks, builds, L, lossless=spec.lossless).items():
            rows.add(pos, kind, name, k, vals)
    for name in settings.families:
        if is_costly("tau", name) and not costly:
            continue
        for k in settings.ks(name):
            for kind, vals in expected_accepted(name, k, builds, L).items():
                rows.add(pos, kind, name, k, vals)


def batch_builds(X, P, Q, settings, subsampled=None, X_dev=None, also=(), *, defer: bool = False):
    """The :class:`otspec.profile._quantities.Builds` of the ``B`` prompts of one position of a batched walk, their
    cheap batched quantities computed for all prompts at once (:func:`otspec.profile._quantities.prefill_batched`),
    and, for the prompts whose position is subsampled (``subsampled``, one bool each), the costly quantities that
    have batched forms, when the laws are on an accelerator (arrays other than numpy), one prompt too (every value
    then comes to the host in one read); None otherwise (each prompt's own, as before). ``X_dev``: the drafts
    where the laws are, when the walk drew them there (not sent again); ``also``: the caller's parts read in the same
    read (:func:`otspec.profile._quantities.read_parts`). With ``defer`` nothing is read: ``(builds, parts)``, the
    parts (``also`` first) for the caller to read with a later read of its own (``(None, [])`` on the host)."""
    if isinstance(P, np.ndarray):
        return (None, []) if defer else None
    out = [Builds(X[b], P[b], Q[b], settings.verifier_options, None if X_dev is None else X_dev[b])
           for b in range(len(X))]
    parts = prefill_batched(out, [n for n in settings.verifiers if not is_costly("acc", n)],
                            [f for f in settings.families if not is_costly("tau", f)], settings.ks, settings.L_max,
                            subsampled=subsampled, costly=([n for n in settings.verifiers if is_costly("acc", n)],
                                                           [f for f in settings.families if is_costly("tau", f)]),
                            also=also, top_k=settings.sampling.top_k, read=not defer)
    return (out, parts) if defer else out


def tree_drafts(draft, ds, target, n_ctx: int, p_root, settings, rngs, r_root=None):
    """The tree families of one profiled position of ``B`` prompts drafted on the device route and left unread
    (:func:`otspec.profile._trees.draft_trees`): the walk reads their ranks and values with the position's other
    values (:meth:`otspec.profile._trees.DraftedTrees.parts`) and hands them to :func:`tree_rows`, one read fewer
    than a read of their own before the target's tree calls. The draft's state is left holding the contexts."""
    return draft_trees(draft, ds, n_ctx, p_root, settings.tree_plan, settings.sampling, rngs, r_root, on_device=True,
                       device=target.device)


def tree_rows(rows: list, pos: int, draft, ds, target, ts, last, n_ctx: int, p_root, q_root, settings, rngs,
              drawn=None, buffers=None, r_root=None, drafted=None, *, defer: bool = False, scored=None,
              begun=None):
    """The tree families' rows of one profiled position of ``B`` prompts (``rows[b]`` each): every tree drawn and
    scored after the contexts the states hold (:func:`otspec.profile._trees.draw_and_score`), its exact values
    recorded, and at the subsampled positions the bound on every lossless verifier of the sampled families
    (:func:`otspec.profile._tree_bound.position_bounds`); the states are left holding the contexts. With ``drawn``
    (a list of ``B`` dicts), the trees of the
    families whose emission along the text reads the drawn tree are kept: ``drawn[b][pos] = {label: (2, n + 1)
    parents and tokens}`` (:func:`otspec.profile._trees.compact_tree`);
    ``buffers`` (:class:`otspec.profile._trees.LawBuffers`) holds the sampled trees' node laws from one position
    to the next. On an accelerator (:func:`analysis_device`) the deterministic trees are ranked and read where the
    laws are (``draw_and_score(..., on_device=True)``); ``drafted``: the trees drafted already by
    :func:`tree_drafts` (then scored here).

    With ``defer`` (the device route), at a position with no bound to run (none of its prompts subsampled, or no
    ``bounds_trees``) the trees are scored and verified but their values not read: a :class:`TreesLater` is
    returned, whose parts the walk reads with the next position's values (or at the walk's end) before it writes
    the rows (:meth:`TreesLater.finish`): one host read fewer per position, the rows the same and in the same order
    (the next position's rows come after). At a position with the bound on its device route, the bound's model
    calls are made here (they need the states at the contexts, and the sampled trees' values, read with the
    position's: :func:`otspec.profile._trees.score_sampled`) and its frontiers' first read, the other trees' values
    and every row of the position's trees are left in the returned :class:`TreesLater` in the same way. Otherwise the
    values are read here and the rows written; None is returned. ``scored``: the trees scored already by
    :func:`tree_scores` (their values unread; the sampled trees' read with the position's when it was given
    ``sampled``)."""
    plan = getattr(settings, "tree_plan", None)
    # p_root (and r_root) as they are: a tensor on the models' device is expanded there (np.asarray of it would
    # fail on a GPU)
    read = scored is None
    if drafted is None and read:
        drafted = draft_trees(draft, ds, n_ctx, p_root, plan, settings.sampling, rngs, r_root,
                              on_device=analysis_device(target) is not None, device=getattr(target, "device", "cpu"))
    if read:
        scored = tree_scores(drafted, target, ts, last, n_ctx, q_root, settings)
    V = int(np.shape(p_root)[-1])
    which = [is_subsampled(pos, r.prompt, settings) for r in rows]
    bound = getattr(settings, "bounds_trees", False) and any(which)
    on_device = analysis_device(target) is not None and bound_route_on_device()
    # the bound's contexts expanded before the trees' values are read (they read only the contexts' laws): their
    # first read taken with the trees' (one host read fewer per subsampled position)
    if begun is None:
        begun = _begin_bounds(settings, target, p_root, q_root, which)

    # on the device route the bound's frontiers' first read rides the walk's next read (its rows written then)
    defer_bound = defer and bound and on_device

    def record(bounds=None) -> None:
        got = scored.out
        for r, one in zip(rows, got):
            record_position(r, pos, plan, position_values(plan, one, V, buffers))
        if bound:  # the bound on every lossless verifier, at the subsampled positions
            if bounds is None:  # computed here: the laws on the host unless the bound runs on the device route
                p_b = p_root if on_device else to_host(p_root)
                bounds = position_bounds(draft, ds, target, ts, last, n_ctx, p_b, np.asarray(q_root), plan,
                                         settings.sampling, got, which, settings.bound_budget, begun=begun)
            record_bounds(rows, pos, plan, bounds)
        if drawn is not None:
            labels = [f.label for f in along_text_families(plan)]
            for keep, one in zip(drawn, got):
                keep[pos] = {label: compact_tree(one[label].tree) for label in labels}

    if defer_bound:
        # the bound needs the sampled trees' values now: read with the position's (scored given: score_sampled's
        # part, in the walk's read), else here; its model calls made now (the states hold the contexts), its
        # frontiers' first read and the other trees' values left for the walk's next read, the rows written then
        rest = scored.parts
        if read:
            read_parts(scored.parts + (begun.parts if begun is not None else []))
            rest = []
        bounds = position_bounds(draft, ds, target, ts, last, n_ctx, p_root, np.asarray(q_root), plan,
                                 settings.sampling, scored.out, which, settings.bound_budget, begun=begun, defer=True)
        return TreesLater(rest + bounds.parts + _host_law_parts(plan, scored.out),
                          lambda: record(bounds.finish()))
    later = TreesLater(scored.parts + (begun.parts if begun is not None else []), record)
    if defer and not bound and read:  # (with no parts too: the rows in order after a position's written later)
        return later
    later.finish()  # (scored given: its values unread, the sampled trees' read with the position's)
    return None


def _host_law_parts(plan, scored: list) -> list:
    """The host copies of the sampled trees' node laws that the host's verifiers will read when the rows are written
    (:func:`otspec.profile._trees.position_values`: a name not verified on the device, ``s.reach``), as parts of the
    walk's next read (:func:`otspec.profile._quantities.read_parts`), each law tensor once: the copies
    :class:`otspec.profile._trees_device.HostRows` would read on first use, one read each, taken with that read
    instead (the same float64 values)."""
    out, seen = [], set()
    for f in getattr(plan, "sampled", ()):
        for one in scored:
            s = one.get(f.label)
            if s is None or (s.reach is not None and all(name in s.reach for name in f.names())):
                continue
            for rows in (s.p, s.q):
                copy = getattr(rows, "_copy", None)
                if copy is None or copy[1] is not None or id(copy) in seen:
                    continue
                seen.add(id(copy))
                out.append((copy[0].detach(), lambda host, copy=copy: copy.__setitem__(1, np.array(host))))
    return out


def _begin_bounds(settings, target, p_root, q_root, which):
    """The bound's contexts' expansion begun (:func:`otspec.profile._tree_bound.begin_bounds`) at a position with
    the bound to run on the device route (``which``: the prompts subsampled there), else None; its first read
    (:attr:`parts`) is taken with the caller's next read of the walk's values, or by the bound itself."""
    if not (getattr(settings, "bounds_trees", False) and any(which)):
        return None
    if analysis_device(target) is None or not bound_route_on_device():
        return None
    import torch

    q_root = q_root if torch.is_tensor(q_root) else np.asarray(q_root)  # a tensor where it is: no read
    return begin_bounds(p_root, q_root, getattr(settings, "tree_plan", None), which,
                        settings.bound_budget)


def tree_scores(drafted, target, ts, last, n_ctx: int, q_root, settings, sampled=None):
    """The trees ``drafted`` scored by the target after the contexts its state holds and verified, their values left
    unread (:func:`otspec.profile._trees.score_trees` with ``defer``: a :class:`~otspec.profile._trees.ScoredTrees`,
    whose parts the caller reads)."""
    return score_trees(drafted, target, ts, last, n_ctx, np.asarray(q_root), getattr(settings, "tree_plan", None),
                       settings.sampling, defer=True, sampled=sampled)


def _scores_early(settings, trees, sub) -> bool:
    """Whether a position's sampled trees are scored before its one read of values, their values read in it, and
    its other trees scored right after it: at a position with the bound to run (it needs the sampled trees' values
    before its own model calls, made at the position), in a walk with tree families (``trees``: their generators,
    or None); at the other positions every tree is scored after the read and read with the next position's values
    (:class:`TreesLater`)."""
    return trees is not None and bool(getattr(settings, "bounds_trees", False)) and any(sub)


class TreesLater:
    """One position's tree values left on the device by :func:`tree_rows` (``defer``): :attr:`parts` to read
    (:func:`otspec.profile._quantities.read_parts`; their stores raise the checked route's error for a tree law from
    bad logits), then :meth:`finish` writes the position's tree rows."""

    def __init__(self, parts: list, record):
        self.parts, self.record = parts, record

    def finish(self, *, read: bool = True) -> None:
        """Write the rows (the parts read first here, unless ``read=False``: read already with other values)."""
        if read:
            read_parts(self.parts)
        self.record()


def _flush(later) -> None:
    """The trees of a position left unread (a :class:`TreesLater`, or None): read alone and written (the walk's
    end)."""
    if later is not None:
        later.finish()


def _before(later) -> dict:
    """The renewal hook's keyword for the walk's values left unread at its end (``later``, a :class:`TreesLater` or
    None): ``{"before": later}``, read with the text's values in the hook's one read
    (:func:`otspec.profile._renewal_hook.emission_rows`), or ``{}`` (a hook that takes no ``before`` is called as
    before)."""
    return {} if later is None else {"before": later}


def _joined(first, then):
    """Two positions' (or a position's and its trees') values left unread (:class:`TreesLater` or None) as one: both
    parts read together, ``first``'s rows written first."""
    if first is None or then is None:
        return then if first is None else first

    def record() -> None:
        first.record()
        then.record()

    return TreesLater(first.parts + then.parts, record)


def _read_law(later, timer, target, ts, ids, sampling, pos: int):
    """The target's call at a position not profiled (``(B, V)`` laws of its last token, host memory), its law and its
    bad-logits flag read with ``later``'s values (:func:`~otspec.profile._quantities.parts_after`: one read,
    ``later``'s rows written first)."""
    checks = _Checks(pos)
    law = timer.call(target, ts, ids, sampling, "target", 1, keep=True, checks=checks)[:, 0]
    also, got = checks.parts(law, sampling)
    read_parts(parts_after(later, also))
    return got["values"]


def _position_later(rows: list, pos: int, X, P, Q, settings, sub: list, builds: list):
    """The writing of a position's rows (:func:`position_rows` of each prompt ``b``: ``rows[b]``, ``X[b]``, ...)
    whose batched values (``builds``, :func:`batch_builds` with ``defer``) are read later, with the next position's:
    a :class:`TreesLater`'s ``record``."""

    def record() -> None:
        for b in range(len(rows)):
            position_rows(rows[b], pos, X[b], P[b], Q[b], settings, costly=sub[b], builds=builds[b])

    return record


def _read_position(later, checks, sampling, law, fill, trees, early: bool, sub: list, X, P, Q, X_dev, rows: list,
                   pos: int, settings, target, ts, last, n_ctx: int, p_root):
    """One position's read on the device route, for ``B`` prompts (``X``, ``P``, ``Q``, ``X_dev``, ``rows``, ``sub``:
    one entry each; ``law``: the paths' target laws whose flags the checks read): the drafts (``fill``), the trees'
    ranks, the paths' laws and the flags travel with the last position's unread values (``later``, its rows written
    first). Where a prompt is subsampled, the costly quantities are laid out from the drafts after that read and left
    unread, their rows written with the next position's read (a :class:`TreesLater` returned as ``later``); with
    ``early`` (:func:`_scores_early`) the sampled trees are scored and the bound's contexts' expansion begun before
    the read, from the device's laws and tokens (:func:`otspec.profile._trees.score_sampled`,
    :func:`_begin_bounds`), their first values read in it, and the other trees scored after it (their values
    unread: :func:`tree_rows` leaves them for the next read). Elsewhere the position's values are read with
    ``later``'s in one read.

    Returns ``(q_t, builds, later, scored, begun)``: the paths' target laws (host), the
    :func:`batch_builds`, the values left unread (or None), the trees scored early and the bound begun (or None)."""
    scored = begun = sampled = None
    then = [*fill, *(trees.parts() if trees else ())]
    if any(sub) and early:
        # before the read, from the device's laws and tokens alone: the sampled trees scored and verified (drawn on
        # the device, their tree call fed there) and the bound's contexts' expansion begun (it reads only the
        # contexts' laws); their first values travel in this read, all the bound needs before its own model calls
        q_dev = law.reshape(len(sub), -1)
        sampled = score_sampled(trees, target, ts, last, n_ctx, q_dev, settings.tree_plan, sampling)
        begun = _begin_bounds(settings, target, p_root, q_dev, sub)
        then += [*sampled.parts, *(begun.parts if begun is not None else ())]
    also, got = checks.parts(law, sampling, then)
    if any(sub):
        read_parts(parts_after(later, also))  # the last position's rows written first
        q_t = got["values"]
        if early:  # the other trees scored from their tokens, now on the host; their values read later
            scored = tree_scores(trees, target, ts, last, n_ctx, q_t.reshape(len(sub), -1), settings, sampled)
        # the draft trees' nodes laid out from the drafts now, their values read with the next position's
        builds, parts = batch_builds(X, P, Q, settings, sub, X_dev, defer=True)
        later = TreesLater(parts, _position_later(rows, pos, X, P, Q, settings, sub, builds))
    else:  # after the last position's values (an earlier position's error first)
        builds = batch_builds(X, P, Q, settings, sub, X_dev, parts_after(later, also))
        later = None  # the last position's rows written when their values were stored, before this one's
        q_t = got["values"]
    return q_t, builds, later, scored, begun


def _keeps_trees(settings, renewal) -> bool:
    """Whether the walk keeps the drawn trees for the renewal hook's emission along the text."""
    return renewal is not None and bool(renewal_drawn_trees(settings))


def profile_prompt(draft, target, prompt: list[int], reference, settings, index: int, *, bar=None,
                   renewal=None) -> dict:
    r"""Profile one prompt: the rows of every profiled position along its context path.

    .. math::

        c_t = (\text{prompt}, y_1, \dots, y_{t}), \quad
        y_{t+1} \sim q(\cdot \mid c_t) \ \text{(or the reference text)}, \quad t = 0, \dots, T - 1,

    with the quantities of :func:`position_rows` at every ``stride``-th ``t``.

    Returns
    -------
    dict of lists
        The columns :data:`COLUMNS`, plus rows ``kind="time"`` (seconds in
        draft steps and target calls, and their counts).
    """
    sampling = settings.sampling
    k_max, L = settings.k_max, settings.L_max
    rng = prompt_rng(settings.seed, index)
    trng = tree_rng(settings.seed, index) if getattr(settings, "tree_plan", None) is not None else None
    rows = _Rows(index)
    timer = _Timer()
    dev = analysis_device(target)
    ds, ts = draft.new_state(), target.new_state()
    ctx = list(prompt)
    held_d = held_t = 0
    T = path_length(reference, settings)
    q_path, y_path = [], []
    drawn = [{}] if _keeps_trees(settings, renewal) else None
    buffers = LawBuffers()
    own = ranks_by_raw_law(getattr(settings, "tree_plan", None), sampling)
    later = None  # the trees of the last profiled position, left unread (read with this position's values)
    for t in range(T):
        if t % settings.stride == 0:
            on = dev is not None  # the draft's laws and tokens stay on its device, read once (X) per position
            checks = _Checks(t)  # the calls' bad-logits flags, read with the drafts and with the path's law
            fed = _fed(np.asarray([ctx[held_d:]], dtype=np.int64), dev)  # the path's new tokens, for both models
            got = timer.call(draft, ds, fed, sampling, "draft", 1, own=own, keep=on, checks=checks)
            p1, r1 = (got[0][:, 0], got[1][:, 0]) if own else (got[:, 0], None)  # (1, V): processed, own law
            V = p1.shape[-1]
            X, P = _draft_buffers(p1, k_max, L, V)
            P[:, 0] = p1
            U = _step_uniforms(p1, [rng], k_max, L)
            X[:, 0] = _sample(_rows_of(p1, k_max, V), rng, None if U is None else U[0, 0])
            for j in range(1, L):
                P[:, j] = timer.call(draft, ds, X[:, j - 1 : j], sampling, "draft", 1, keep=on, checks=checks)[:, 0]
                X[:, j] = _sample(P[:, j], rng, None if U is None else U[0, j])
            sub = is_subsampled(t, index, settings)
            early = on and trng is not None and _scores_early(settings, trng, [sub])  # the trees scored before the read
            Xd, (X, fill) = X, (_drafts_on_host(X, checks, sampling, later=True) if on else (X, ()))
            draft.select(ds, 0, len(ctx))
            scored = _scored(fed[:, held_t - held_d:], Xd, k_max)
            held_d = len(ctx)
            Q = timer.call(target, ts, scored, sampling, "target", L + 1, keep=dev is not None, checks=checks)
            target.select(ts, 0, len(ctx))
            held_t = len(ctx)
            Pd = _to_device(P, dev)
            # the trees drafted before the read: their ranks and values come with the position's values
            trees = tree_drafts(draft, ds, target, len(ctx), p1, settings, [trng], r1) if on and trng is not None else None
            if on:
                q_t, bl, later, tscored, begun = _read_position(
                    later, checks, sampling, Q[0, 0], fill, trees, early, [sub], X[None], Pd[None], Q[None],
                    Xd[None], [rows], t, settings, target, ts, [ctx[-1]], len(ctx), p1)
            else:
                tscored = begun = None
                q_t = checks.read(Q[0, 0], sampling).copy()  # not a view: the path's laws must not hold every Q
                bl = batch_builds(X[None], Pd[None], Q[None], settings, [sub], Xd[None])
            if later is None:  # else written when its values are read (the position's rows before its trees')
                position_rows(rows, t, X, Pd, Q, settings, costly=sub, builds=bl[0] if bl else None)
            if trng is not None:
                later = _joined(later, tree_rows([rows], t, draft, ds, target, ts, [ctx[-1]], len(ctx), p1, q_t[None],
                                                 settings, [trng], drawn, buffers, r1, drafted=trees, defer=on,
                                                 scored=tscored, begun=begun))
            if bar is not None:
                bar.update(1)
        elif later is not None:  # a profiled position's values unread: read with this call's law, its rows first
            q_t = _read_law(later, timer, target, ts, [ctx[held_t:]], sampling, t)[0]
            later = None
            held_t = len(ctx)
        else:
            q_t = timer.call(target, ts, [ctx[held_t:]], sampling, "target", 1, checks=_Checks(t))[0, 0]
            held_t = len(ctx)
        y = int(_sample(q_t[None], rng)[0]) if reference is None else int(reference[t])
        if renewal is not None:
            q_path.append(q_t)
            y_path.append(y)
        ctx.append(y)
    if renewal is not None and T > 0:  # the walk's last values read with the text's (one read per walk)
        renewal(rows, draft, prompt, np.array(y_path, dtype=np.int64), np.array(q_path), settings, timer,
                trees=drawn[0] if drawn else None, device=dev, **_before(later))
    else:
        _flush(later)
    rows.add(-1, "time", "draft", k_max, [timer.draft, timer.draft_steps])
    rows.add(-1, "time", "target", k_max, [timer.target, timer.target_calls])
    return rows.cols


def path_length(reference, settings) -> int:
    """Number of path positions of a prompt: ``max_new_tokens``, or fewer when its reference text is shorter."""
    return settings.max_new_tokens if reference is None else min(settings.max_new_tokens, len(reference))


def profile_bucket(draft, target, prompts: list[list[int]], references: list, settings, indices: list[int], *,
                   bar=None, renewal=None) -> list[dict]:
    r"""Profile ``B`` prompts of one path length in lockstep, one model call per step for all of them.

    .. math::

        c^{(b)}_t = (\text{prompt}_b, y^{(b)}_1, \dots, y^{(b)}_t), \qquad b = 1, \dots, B,

    the path of :func:`profile_prompt` for each prompt, with every draft step
    a call on ``(B k_max, 1)`` new tokens (prompt ``b``'s drafts are rows
    ``b k_max, ..., (b + 1) k_max - 1``) and every target scoring one call on
    ``(B k_max, pending + L_max)`` new tokens. The prompts share their path
    length (:func:`path_length`); prompts of unequal token lengths are
    left-padded to the longest, :math:`a_b = \max_c n_c - n_b` columns, in
    states made by ``new_state(pad=a)`` (attention masks, and positions
    counted from each prompt's first token: see
    :class:`otspec.decoding.HFCausalLM`), so the rows stay aligned on the
    path. Prompt ``b`` draws from ``prompt_rng(seed, indices[b])`` in the
    order of :func:`profile_prompt`, so the rows are the same as the unbatched walk's
    whenever the models' logits do not depend on the batch (exactly so for
    :class:`otspec.decoding.CallableLM` functions computed row by row; to
    float32 rounding for batched transformer kernels, which can, rarely,
    change a sampled token). Seconds of a shared call are split evenly
    between the prompts; each counts the call once.

    Parameters
    ----------
    draft, target : LanguageModel
        With the batched state API (a state of ``b`` rows extended by a
        multiple of ``b`` rows; ``select`` of a sequence of rows), and
        ``new_state(pad=...)`` when the prompts' lengths differ.
    prompts : list of list of int
        ``B`` prompts (any lengths).
    references : list
        Their reference texts (``None`` each when the path is sampled).
    settings : ProfileSettings
    indices : list of int
        The prompts' indices in the run (their generators and their rows' ``prompt``).
    bar, renewal
        As :func:`profile_prompt`.

    Returns
    -------
    list of dict of lists
        For each prompt, in order, the columns of :func:`profile_prompt`.

    Raises
    ------
    ValueError
        Prompts of different path lengths, or of different lengths with a
        model whose ``new_state`` takes no ``pad`` (programming errors of the caller).

    Examples
    --------
    >>> from otspec.profile import ProfileSettings, toy_pair
    >>> from otspec.profile._collect import profile_bucket, profile_prompt
    >>> draft, target = toy_pair(4, seed=0)
    >>> s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=3, verifiers=["token"], families=["token"])
    >>> both = profile_bucket(draft, target, [[0, 1, 3], [2, 3]], [None, None], s, [0, 1])
    >>> one = profile_prompt(draft, target, [2, 3], None, s, 1)
    >>> both[1]["value"][:-4] == one["value"][:-4]      # all but the seconds of the two time rows
    True
    """
    B = len(prompts)
    sampling = settings.sampling
    k, L = settings.k_max, settings.L_max
    Ts = {path_length(r, settings) for r in references}
    if len(Ts) != 1:
        raise ValueError(f"`prompts` of one batch must share their path length, got path lengths {sorted(Ts)}")
    n0 = max(len(p) for p in prompts)
    pad = [n0 - len(p) for p in prompts]
    if any(pad):
        for name, lm in (("draft", draft), ("target", target)):
            if not supports_padding(lm):
                raise ValueError(f"`prompts` of lengths {[len(p) for p in prompts]} need left padding, which "
                                 f"`{name}` ({type(lm).__name__}) does not support (its new_state takes no `pad`)")
    T = Ts.pop()
    rngs = [prompt_rng(settings.seed, i) for i in indices]
    trngs = [tree_rng(settings.seed, i) for i in indices] if getattr(settings, "tree_plan", None) is not None else None
    rows = [_Rows(i) for i in indices]
    timers = [_Timer() for _ in range(B)]
    shared = _Shared(timers)
    dev = analysis_device(target)
    ds, ts = (draft.new_state(pad=pad), target.new_state(pad=pad)) if any(pad) else (draft.new_state(),
                                                                                      target.new_state())
    ctx = np.zeros((B, n0), dtype=np.int64)  # (B, n), left-padded with 0, grows by one column per step
    for b, p in enumerate(prompts):
        ctx[b, pad[b]:] = p
    held_d = held_t = 0
    q_path, y_path = [], []
    drawn = [{} for _ in range(B)] if _keeps_trees(settings, renewal) else None
    buffers = LawBuffers()
    own = ranks_by_raw_law(getattr(settings, "tree_plan", None), sampling)
    kept = np.arange(B) * (k if L > 1 else 1)  # row of each prompt's first draft in the draft state
    later = None  # the trees of the last profiled position, left unread (read with this position's values)
    for t in range(T):
        n = ctx.shape[1]
        if t % settings.stride == 0:
            on = dev is not None  # the draft's laws and tokens stay on its device, read once (X) per position
            checks = _Checks(t)  # the calls' bad-logits flags, read with the drafts and with the path's laws
            fed = _fed(ctx[:, held_d:], dev)  # the paths' new tokens, for both models
            got = shared.call(draft, ds, fed, sampling, "draft", 1, own=own, keep=on, checks=checks)
            p1, r1 = (got[0][:, 0], got[1][:, 0]) if own else (got[:, 0], None)  # (B, V): processed, own law
            V = p1.shape[-1]
            X, P = _draft_buffers(p1, (B, k), L, V)
            P[:, :, 0] = p1[:, None]
            U = _step_uniforms(p1, rngs, k, L)
            for b in range(B):
                X[b, :, 0] = _sample(_rows_of(p1[b], k, V), rngs[b], None if U is None else U[b, 0])
            for j in range(1, L):
                P[:, :, j] = shared.call(draft, ds, X[:, :, j - 1].reshape(B * k, 1), sampling, "draft",
                                         1, keep=on, checks=checks)[:, 0].reshape(B, k, V)
                for b in range(B):
                    X[b, :, j] = _sample(P[b, :, j], rngs[b], None if U is None else U[b, j])
            sub = [is_subsampled(t, i, settings) for i in indices]
            early = on and trngs is not None and _scores_early(settings, trngs, sub)  # the trees scored before the read
            Xd, (X, fill) = X, (_drafts_on_host(X, checks, sampling, later=True) if on else (X, ()))
            draft.select(ds, kept, n)
            scored = _scored(fed[:, held_t - held_d:], Xd.reshape(B * k, L), k)
            held_d = n
            Q = shared.call(target, ts, scored, sampling, "target", L + 1, keep=dev is not None,
                            checks=checks).reshape(B, k, L + 1, V)
            target.select(ts, np.arange(B) * k, n)
            held_t = n
            Pa = _to_device(P, dev)
            # the trees drafted before the read: their ranks and values come with the position's values
            trees = tree_drafts(draft, ds, target, n, p1, settings, trngs, r1) if on and trngs is not None else None
            if on:
                q_t, bl, later, tscored, begun = _read_position(
                    later, checks, sampling, Q[:, 0, 0], fill, trees, early, sub, X, Pa, Q, Xd, rows, t, settings,
                    target, ts, ctx[:, -1], n, p1)
            else:
                tscored = begun = None
                q_t = checks.read(Q[:, 0, 0], sampling).copy()
                bl = batch_builds(X, Pa, Q, settings, sub, Xd) or [None] * B
            if later is None:  # else written when its values are read (the positions' rows before their trees')
                for b in range(B):
                    position_rows(rows[b], t, X[b], Pa[b], Q[b], settings, costly=sub[b], builds=bl[b])
            if trngs is not None:
                later = _joined(later, tree_rows(rows, t, draft, ds, target, ts, ctx[:, -1], n, p1, q_t, settings,
                                                 trngs, drawn, buffers, r1, drafted=trees, defer=on, scored=tscored,
                                                 begun=begun))
            if bar is not None:
                bar.update(B)
        elif later is not None:  # a profiled position's values unread: read with this call's laws, its rows first
            q_t = _read_law(later, shared, target, ts, ctx[:, held_t:], sampling, t)
            later = None
            held_t = n
        else:
            q_t = shared.call(target, ts, ctx[:, held_t:], sampling, "target", 1, checks=_Checks(t))[:, 0]
            held_t = n
        if references[0] is None:
            y = np.array([int(_sample(q_t[b][None], rngs[b])[0]) for b in range(B)], dtype=np.int64)
        else:
            y = np.array([int(r[t]) for r in references], dtype=np.int64)
        if renewal is not None:
            q_path.append(q_t)
            y_path.append(y)
        ctx = np.concatenate([ctx, y[:, None]], axis=1)
    if renewal is None or T == 0:
        _flush(later)
    out = []
    for b in range(B):
        if renewal is not None and T > 0:  # the walk's last values read with the first prompt's text values
            renewal(rows[b], draft, prompts[b], np.array([y[b] for y in y_path], dtype=np.int64),
                    np.array([q[b] for q in q_path]), settings, timers[b], trees=drawn[b] if drawn else None,
                    device=dev, **_before(later if b == 0 else None))
        rows[b].add(-1, "time", "draft", k, [timers[b].draft, timers[b].draft_steps])
        rows[b].add(-1, "time", "target", k, [timers[b].target, timers[b].target_calls])
        out.append(rows[b].cols)
    return out
