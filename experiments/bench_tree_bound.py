"""Benchmark: the anytime upper bound on every tree verifier (``otspec.tree.bound``) against the target forward.

The target forward is one ``tree_logits`` call of SmolLM2-135M-Instruct (the real pair's target) on a
64-node tree, ``branching(8, 7)``, on top of the context's KV cache: what a profile or a decoder pays to
score the tree. Against it, ``otspec.tree.bound`` on the same shape at ``V = 49,152`` with a budget of 256
expanded prefixes (64 per model call), for the i.i.d. and the without-replacement processes:

* "bound, laws given (a user's model)": the bound's own arithmetic, the draft and target laws of the expanded
  prefixes read from memory (a ``next_dist`` model over the laws that the decoding models gave, defined here, not
  by otspec: a user's model, whose every law is checked as a distribution, in the row kernels' pass);
* "laws from the tree calls": the route of the profile's bound rows and of ``bound`` on two decoding models: each
  frontier's laws the rows of one tree call's law array per model, where they are, its bad rows refused at the
  softmax (``_check_tree_laws``: the first entry of each row read; the profile checks the call's laws in
  ``Sampling.probs``), no check in the kernels: the recorded calls replayed without the models;
* "numpy route": the same, the host's fused kernels turned off (what runs without numba, the ``fast``
  extra); the kernels' first compilation (or load from numba's cache) is timed once before the rounds,
  outside every timed call, and printed;
* "laws as arrays": the bound's own arithmetic, each frontier's laws handed over as numpy rows where they are
  (lists of the recorded rows, no stacking copy, no check on reading: the route of decoding models whose logits
  are on the CPU, which hands over rows of the tree's law array);
* "bounded draws": "laws as arrays" with the draws of ranks >= 2 without replacement given the stated upper
  bound instead of their exact laws (the exponential race; the bound before the race), and the (looser) bound
  it gives;
* "laws as tensors": the same arithmetic on the same laws held as float64 tensors on ``--device`` (the
  torch route of the bound's frontier expansion, which the decoding models take when their logits are on
  an accelerator);
* "bound with its model calls": the same bound from the two decoding models (the real pair: target
  SmolLM2-135M, draft 24 of its 30 layers), each frontier of up to 64 prefixes scored in one tree-attention
  call per model.

* "one pass over them": every law the bound reads (the recorded draft and target rows) summed once, where it
  is, by a compiled loop: the memory traffic that any route must pay, with the bandwidth it reached (the floor
  of the bound's arithmetic on this machine);
* with ``--against DIR`` (another checkout of the project, e.g. the code before a change): that checkout's
  "laws given" and "laws as arrays" (the same rows handed over the same way; a checkout without the row kernels
  stacks each frontier into one block itself), timed in the same interleaved rounds, and the relative change of
  the bound between the two (checked <= 1e-12). The other checkout is imported as the package
  ``otspec_against`` beside this one.

The target: "bound, laws given" / forward <= 0.10. A second table gives CPU time (``time.process_time``, medians of
interleaved rounds) of the forward, "laws as arrays", the floor, "laws given" and, with ``--against``, the other
checkout's "laws as arrays" and "laws given": the shared machine's other jobs inflate CPU time less than wall time. Every contender is timed interleaved in each round
after a warm-up and the median kept (``experiments/_bench.py``); the 1-minute load average is printed
before and after, since the project's machine is shared.

With ``--device-route``: the bound's two routes side by side on the same recorded laws of the real pair, for
``branching(8,7)`` at ``--budget`` (64 prefixes per call) and for the profile's sampled families
(``iid``/``wor`` ``branching(4,3)`` and ``branching(8,7)``, the profile's default budget of 64 spent in one
frontier after the context, as :func:`otspec.profile._tree_bound.position_bounds` spends it): the host's numpy
route (numba row kernels) on numpy rows, and the torch route on the same laws as float64 tensors on ``--device``
(CPU tensors with ``--threads`` torch threads when no GPU is lent). CPU time (medians of interleaved rounds), the
forward beside them, the largest relative difference of the two bounds, and what a GPU pays per bound: the host
reads (each a synchronisation; counted by a ``TorchFunctionMode``) and the torch operations dispatched (a
``TorchDispatchMode``, views left out: each about one kernel launch). With ``--against DIR`` the other checkout's
torch route too, on the same tensors in the same process (its CPU time interleaved in the same rounds): its host
reads, torch ops and CPU time beside this one's, and whether its bound is this one's to the bit.

With ``--passes``: where the bound's time goes, CPU time of each host kernel of the bound (:data:`PASSES`, by
wrappers around the kernel module's globals) and the rest (Python and numpy around them), on the recorded laws of
``branching(8,7)`` handed over as arrays; with ``--against DIR`` the other checkout's kernels in the same process,
the two alternating in every round.

Usage: python experiments/bench_tree_bound.py [--device cuda] [--threads 1] [--repeat 3] [--rst] [--against DIR]
       python experiments/bench_tree_bound.py --device-route [--device cuda] [--threads 1] [--repeat 5] [--rst]
           [--against DIR]
       python experiments/bench_tree_bound.py --passes [--repeat 5] [--rst] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import load_against, print_table, timeit_many  # noqa: E402
from _chat_prompts import CHAT_PROMPTS  # noqa: E402

#: The stated target: the bound's arithmetic within 10 % of the target forward that scores the tree.
TARGET = 0.10


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def _cpu_rounds(fns, repeat: int) -> list:
    """Median CPU seconds (``time.process_time``: this process's time on every core, the shared machine's other
    jobs left out) of each function, interleaved in ``repeat`` rounds after one warm-up round, the order rotated
    by one each round."""
    import time

    got = [[] for _ in fns]
    for r in range(repeat + 1):
        order = list(range(len(fns)))
        order = order[r % len(fns):] + order[:r % len(fns)]
        for i in order:
            t0 = time.process_time()
            fns[i]()
            if r:
                got[i].append(time.process_time() - t0)
    return [float(np.median(g)) for g in got]


def _row_sum(x):
    """The sum of a row: one read of its bytes, the least a pass over the laws costs. Compiled with ``fastmath``
    (the sum may be reassociated into vector lanes: its value is thrown away, only the read is timed); a loop
    carrying one running sum, or eight in an array, is bound by the additions' latency, not by the memory, and
    measured about half this bandwidth (4.4-4.9 against 10 GB/s on the project's CPU)."""
    s = 0.0
    for v in range(x.shape[0]):
        s += x[v]
    return s


try:  # the floor is measured with the bound's own compiler (the ``fast`` extra); numpy's sum without it
    import numba

    _row_sum = numba.njit(cache=False, fastmath=True)(_row_sum)
except ImportError:  # pragma: no cover
    _row_sum = np.sum


class _TreeCalls:
    """``laws(paths) -> (P, Q)``: the recorded tree calls of a bound replayed without the models, each frontier's
    rows the rows of its call's law arrays (``_TreeAttentionLaws``: a list of views of each model's array), the
    bad-row check of the route (``_check_tree_laws``) on each, as the bound on decoding models runs it."""

    def __init__(self, B, calls: list, ctx):
        self.B, self.calls, self.ctx, self.at = B, calls, np.asarray(ctx, dtype=np.int64), 0

    def __call__(self, paths):
        paths_, (Pa, rows_p), (Qa, rows_q) = self.calls[self.at]
        self.at += 1
        check = self.B._check_tree_laws
        check(Pa, rows_p, True, "draft", self.ctx, paths_)
        check(Qa, rows_q, True, "target", self.ctx, paths_)
        return [Pa[r] for r in rows_p], [Qa[r] for r in rows_q]


def _record_calls(B, run) -> list:
    """The tree calls of ``run()`` as ``(paths, (draft array, rows), (target array, rows))`` (the arguments of the
    bound's ``_check_tree_laws``, recorded while it runs)."""
    calls, got = [], []
    orig, call = B._check_tree_laws, B._TreeAttentionLaws.__call__

    def checking(laws, rows, own, name, ctx, paths, at=None):
        got.append((laws, list(rows)))
        return orig(laws, rows, own, name, ctx, paths, at=at)

    def calling(self, paths):
        got.clear()
        out = call(self, paths)
        calls.append(([tuple(s) for s in paths], got[0], got[1]))
        return out

    B._check_tree_laws, B._TreeAttentionLaws.__call__ = checking, calling
    try:
        run()
    finally:
        B._check_tree_laws, B._TreeAttentionLaws.__call__ = orig, call
    return calls


class _Recorded:
    """A ``next_dist`` model over the laws a decoding model gave at the prefixes a bound expanded. It declares
    ``fresh_laws`` (the recorded arrays are never written again: :class:`otspec.models.Model`), so the bound reads
    each law where it is, checked in one read; with ``fresh=False`` it does not, and each law is copied as it is
    checked (the route of a model that may overwrite its arrays)."""

    def __init__(self, laws: dict, V: int, fresh: bool = True):
        self.laws, self.vocab_size = laws, V
        self.fresh_laws = fresh

    def next_dist(self, prefix):
        return self.laws[tuple(prefix)]


def _np(X):
    """Laws as a numpy array (a tensor's copied to the host)."""
    return X if isinstance(X, np.ndarray) else X.detach().cpu().numpy()


class _TensorLaws:
    """``laws(paths) -> (P, Q)`` as float64 tensors on ``device`` (numpy arrays with ``device=None``): the
    recorded laws of a frontier stacked there; with ``stack=False`` (numpy) the rows where they are, as lists."""

    def __init__(self, rec: dict, device, stack: bool = True):
        wrap = (lambda x: x) if device is None else (lambda x: torch.as_tensor(x, device=device))
        self.stack = (np.stack if stack else list) if device is None else torch.stack
        self.laws = {s: (wrap(p), wrap(q)) for s, (p, q) in rec.items()}
        self.calls = 0

    def __call__(self, paths):
        self.calls += 1
        rows = [self.laws[tuple(s)] for s in paths]
        return self.stack([r[0] for r in rows]), self.stack([r[1] for r in rows])


def _record_laws(B, run) -> dict:
    """``{path: (draft law, target law)}`` of every prefix that the tree-attention calls of ``run()`` scored (the
    bound's ``_TreeAttentionLaws`` of the module ``B`` wrapped while it runs)."""
    rec: dict = {}
    orig = B._TreeAttentionLaws.__call__

    def recording(self, paths):
        P, Q = orig(self, paths)
        for s, p, q in zip(paths, P, Q):
            rec[tuple(s)] = (_np(p), _np(q))
        return P, Q

    B._TreeAttentionLaws.__call__ = recording
    try:
        run()
    finally:
        B._TreeAttentionLaws.__call__ = orig
    return rec


def _load_against(root: str):
    """The ``otspec.tree._bound`` module of another checkout (``root``, imported by :func:`_bench.load_against`)
    and its ``TreeShape`` (which its functions check)."""
    mod = load_against(root, ["tree", "tree._bound"])
    return mod.tree._bound, mod.tree.TreeShape


def _real_pair(args):
    """``(device, target, draft, ctx, name)``: the real pair on ``--device`` (``--threads`` torch threads on a CPU),
    the first chat prompt in SmolLM2's chat template, and the device's name."""
    from otspec.decoding import smollm2_pair

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    tok, target, draft = smollm2_pair(device=device)
    ctx = tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[0]}], add_generation_prompt=True)
    ctx = list(ctx["input_ids"] if hasattr(ctx, "keys") else ctx)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} torch thread(s)"
    return device, target, draft, ctx, name


def _forward(target, ctx, device):
    """The forward the bound is set against: one tree-attention call of the target on the 64-node tree
    ``branching(8, 7)`` (random tokens) after the context, the cache cropped back after each call."""
    V = target.vocab_size
    parents = np.array([-1] + [0] * 8 + [1 + i // 7 for i in range(56)], dtype=np.int64)
    tokens = np.concatenate([[-1], np.random.default_rng(0).integers(0, V, size=64)]).astype(np.int64)
    state = target.new_state()
    target.logits(state, torch.tensor([ctx[:-1]], device=device))

    def forward():
        target.tree_logits(state, parents, tokens, pending=ctx[-1:])
        target.select(state, 0, len(ctx) - 1)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return forward


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rst", action="store_true")
    ap.add_argument("--against", default=None, help="another checkout (e.g. the code before a change): its "
                    "'laws given' and 'laws as arrays' timed interleaved in the same rounds")
    ap.add_argument("--device-route", action="store_true", help="the numpy route against the torch route on the "
                    "same laws (CPU time, host reads and torch operations per bound)")
    ap.add_argument("--passes", action="store_true", help="where the bound's time goes: CPU time of each kernel "
                    "(and, with --against, the other checkout's) on the recorded laws, rounds interleaved")
    args = ap.parse_args(argv)
    if args.device_route:
        return device_route(args)
    if args.passes:
        return passes(args)
    import time

    import otspec.tree._bound as B
    import otspec.tree._bound_kernels as K
    from otspec.models import MemorylessModel
    from otspec.tree import TreeShape, bound

    OB = OShape = None
    if args.against:
        OB, OShape = _load_against(args.against)
    device, target, draft, ctx, name = _real_pair(args)
    V = target.vocab_size
    shape = TreeShape.branching(8, 7)
    print(f"device: {name}; torch {torch.__version__}; target {target.name}; draft {draft.name}; V = {V}; "
          f"context {len(ctx)} tokens; shape branching(8,7) ({shape.n} nodes); budget {args.budget}, "
          f"{args.batch} prefixes per call")

    forward = _forward(target, ctx, device)

    # the kernels' compilation (or load from numba's on-disk cache), outside every timed call
    t0 = time.perf_counter()
    small_p, small_q = MemorylessModel(np.full(600, 1 / 600)), MemorylessModel(np.full(600, 1 / 600))
    for process in ("iid", "wor"):
        bound(TreeShape.branching(3, 2), small_p, small_q, process=process, budget=4)
        if OB is not None:
            OB.bound(OShape.branching(3, 2), small_p, small_q, process=process, budget=4)
    print(f"numba kernels: {'compiled' if K.JIT else 'off (numba not installed)'}; first call (compile or load "
          f"from cache, not timed below) {time.perf_counter() - t0:.2f} s")

    rows, cpu_rows = [], []
    for process in ("iid", "wor"):
        # one run through the decoding models records the laws the bound reads
        rec, read = {}, set()
        orig = B._TreeAttentionLaws.__call__

        def recording(self, paths, rec=rec, orig=orig, read=read):
            P, Q = orig(self, paths)
            for s, p, q in zip(paths, P, Q):
                rec[tuple(s)] = (_np(p), _np(q))
                read.add(tuple(s))
            return P, Q

        B._TreeAttentionLaws.__call__ = recording
        race = B._WOR_RACE
        try:
            # the prefixes the bound with bounded draws expands too (recorded first: the run below overwrites the
            # laws of the prefixes both expand with its own)
            B._WOR_RACE = False
            bound(shape, draft, target, process=process, prefix=ctx, budget=args.budget, batch=args.batch)
            B._WOR_RACE = race
            read.clear()
            res = bound(shape, draft, target, process=process, prefix=ctx, budget=args.budget, batch=args.batch)
        finally:
            B._TreeAttentionLaws.__call__ = orig
            B._WOR_RACE = race
        tree_calls = _record_calls(B, lambda process=process: bound(
            shape, draft, target, process=process, prefix=ctx, budget=args.budget, batch=args.batch))
        md = _Recorded({s: pq[0] for s, pq in rec.items()}, V)
        mt = _Recorded({s: pq[1] for s, pq in rec.items()}, V)
        again = bound(shape, md, mt, process=process, budget=args.budget, batch=args.batch)
        assert abs(again.value - res.value) <= 1e-12, (again.value, res.value)

        def given(process=process, md=md, mt=mt):
            bound(shape, md, mt, process=process, budget=args.budget, batch=args.batch)

        def given_numpy(process=process, md=md, mt=mt):
            jit, K.JIT = K.JIT, False
            try:
                bound(shape, md, mt, process=process, budget=args.budget, batch=args.batch)
            finally:
                K.JIT = jit

        tensor_laws = _TensorLaws(rec, device)
        array_laws = _TensorLaws(rec, None, stack=False)

        def before_given(process=process, md=md, mt=mt):
            OB.bound(OShape.branching(8, 7), md, mt, process=process, budget=args.budget, batch=args.batch)

        def before_arrays(process=process, laws=array_laws):
            # the other checkout's arithmetic on the same rows handed over the same way (a checkout without the row
            # kernels stacks them into one block itself)
            laws.calls = 0
            OB._sampled(OB._Slots(OShape.branching(8, 7)), process, laws, args.budget, args.batch)

        if OB is not None:
            old = OB._sampled(OB._Slots(OShape.branching(8, 7)), process, array_laws, args.budget, args.batch)
            new = B._sampled(B._Slots(shape), process, array_laws, args.budget, args.batch)
            drift = abs(new.value - old.value) / old.value
            assert drift <= 1e-12, (new.value, old.value)

        def given_arrays(process=process, laws=array_laws):
            # the bound's own arithmetic: each frontier's laws one stacked numpy block, no check on reading
            laws.calls = 0
            B._sampled(B._Slots(shape), process, laws, args.budget, args.batch)

        def given_calls(process=process, calls=tree_calls):
            # the route of the profile and of decoding models: the tree calls' rows, bad rows refused at the softmax
            laws = _TreeCalls(B, calls, ctx)
            out = B._sampled(B._Slots(shape), process, laws, args.budget, args.batch)
            assert laws.at == len(calls)
            return out

        def given_bounded(process=process, laws=array_laws):
            # the same, ranks >= 2 without replacement by the stated upper bound (the bound before the race)
            laws.calls = 0
            race, B._WOR_RACE = B._WOR_RACE, False
            try:
                return B._sampled(B._Slots(shape), process, laws, args.budget, args.batch)
            finally:
                B._WOR_RACE = race

        def given_tensors(process=process, laws=tensor_laws):
            # the torch route: the same laws as float64 tensors on the device, one stacked block per frontier
            laws.calls = 0
            B._sampled(B._Slots(shape), process, laws, args.budget, args.batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        law_rows = [x for path in sorted(read) for x in rec[path]]  # the laws the bound reads, each once

        def read_once(rows=law_rows):
            # one pass over the bytes of every law the bound reads (each row once, where it is): the floor
            for x in rows:
                _row_sum(x)

        def with_calls(process=process):
            bound(shape, draft, target, process=process, prefix=ctx, budget=args.budget, batch=args.batch)

        assert given_calls().value == res.value
        loose = given_bounded()
        before = _load()
        fns = [forward, given, given_numpy, given_arrays, given_bounded, given_tensors, with_calls, read_once]
        if OB is not None:
            fns += [before_given, before_arrays]
        fns.append(given_calls)
        got = timeit_many(fns, repeat=args.repeat, min_time=0.0)
        t_fwd, t_given, t_np, t_arr, t_bnd, t_tens, t_calls, t_read = got[:8]
        t_tree = got[-1]
        after = _load()
        # CPU time of the bound's arithmetic (laws as arrays), the forward and the floor (and the other checkout's),
        # interleaved: the load of the shared machine inflates CPU time less than wall time
        cfns = [forward, given_arrays, read_once] + ([before_arrays] if OB is not None else [])
        ng = len(cfns)                                      # then "laws given" (and the other checkout's)
        cfns += [given] + ([before_given] if OB is not None else [])
        cfns.append(given_calls)
        cpu = _cpu_rounds(cfns, max(args.repeat, 5))
        cpu_after = _load()
        cpu_rows.append((process, cpu[0] * 1e3, cpu[1] * 1e3, cpu[1] / cpu[0], cpu[2] * 1e3, cpu[2] / cpu[0])
                        + (() if OB is None else (cpu[3] * 1e3, cpu[3] / cpu[0], cpu[3] / cpu[1]))
                        + (cpu[ng] * 1e3, cpu[ng] / cpu[0])
                        + (() if OB is None else (cpu[ng + 1] * 1e3, cpu[ng + 1] / cpu[0], cpu[ng + 1] / cpu[ng]))
                        + (cpu[-1] * 1e3, cpu[-1] / cpu[0])
                        + (f"{after} / {cpu_after}",))
        mb = sum(x.nbytes for x in law_rows) / 1e6
        floor = (f"{mb:.0f}", t_read * 1e3, mb / 1e3 / t_read, t_read / t_fwd)
        against = () if OB is None else (got[8] * 1e3, got[8] / t_fwd, got[9] * 1e3, got[9] / t_fwd,
                                         got[9] / t_arr, f"{drift:.1e}")
        rows.append((process, t_fwd * 1e3, t_given * 1e3, t_given / t_fwd, t_np * 1e3, t_np / t_fwd,
                     t_arr * 1e3, t_arr / t_fwd, t_bnd * 1e3, t_bnd / t_arr, loose.value,
                     t_tens * 1e3, t_tens / t_fwd,
                     t_calls * 1e3, t_calls / t_fwd, res.n_calls, res.n_expanded, res.value, res.remainder,
                     res.pi_exact, *floor, *against, t_tree * 1e3, t_tree / t_fwd, f"{before} / {after}"))
    head = ("process", "forward ms", "bound, laws given (a user's model) ms", "given / forward", "numpy route ms",
            "numpy / forward", "laws as arrays ms", "arrays / forward", "bounded draws ms", "bounded / arrays",
            "bound, bounded draws", "laws as tensors ms",
            "tensors / forward", "bound with its calls ms", "with calls / forward", "calls per model", "expanded",
            "bound", "remainder", "pi exact", "laws read MB", "one pass over them ms", "GB/s",
            "one pass / forward")
    if OB is not None:
        head += ("before: laws given ms", "before: given / forward", "before: laws as arrays ms",
                 "before: arrays / forward", "before / after (arrays)", "bound: relative change")
    head += ("laws from the tree calls ms", "tree calls / forward", "load average before / after",)
    print_table(f"otspec.tree.bound on branching(8,7) at V = {V}, budget {args.budget} ({name})", head, rows,
                args.rst, target=("given / forward", TARGET))
    chead = ("process", "forward CPU ms", "bound, laws as arrays CPU ms", "arrays / forward", "one pass CPU ms",
             "one pass / forward")
    if OB is not None:
        chead += ("before: laws as arrays CPU ms", "before / forward", "before / after")
    chead += ("bound, laws given (a user's model) CPU ms", "given / forward (CPU)")
    if OB is not None:
        chead += ("before: laws given CPU ms", "before: given / forward (CPU)", "before / after (given)")
    chead += ("laws from the tree calls CPU ms", "tree calls / forward (CPU)", "load average before / after",)
    print_table(f"CPU time (process_time), medians of {max(args.repeat, 5)} interleaved rounds ({name})", chead,
                cpu_rows, args.rst, target=("arrays / forward", TARGET))


class _Counts(torch.overrides.TorchFunctionMode):
    """Host reads of tensors (``tolist``, ``item``, ``numpy``, ``bool``, ...: each a synchronisation on a GPU) and
    the values they read."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.numpy, torch.Tensor.__array__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}

    def __init__(self):
        super().__init__()
        self.reads = self.values = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads += 1
            self.values += args[0].numel()
        return func(*args, **(kwargs or {}))


#: aten operations that make views or wrap host data (no kernel on a device), left out of the count.
_VIEWS = {"view", "_unsafe_view", "unsqueeze", "squeeze", "slice", "select", "expand", "alias", "lift_fresh", "detach",
          "t", "transpose", "permute", "as_strided", "reshape", "split", "unbind"}


def _count_ops(fn) -> int:
    """The torch operations that ``fn()`` dispatches, views left out: about one kernel launch each on a GPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in _VIEWS:
                Ops.n += 1
            return func(*args, **(kwargs or {}))

    with Ops():
        fn()
    return Ops.n


def device_route(args) -> None:
    """``--device-route``: the numpy route against the torch route on the same recorded laws (see the module's
    docstring)."""
    import datetime

    import otspec.tree._bound as B
    from otspec.tree import TreeShape, bound

    other = _load_against(args.against) if args.against else None
    device, target, draft, ctx, name = _real_pair(args)
    V = target.vocab_size
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}; device: {name}; torch {torch.__version__}; V = {V}; context {len(ctx)} tokens"
          + (f"; before: {args.against}" if other else ""))
    forward = _forward(target, ctx, device)
    cases = [(f"{p}:branching(8,7)", (8, 7), p, args.budget, args.batch) for p in ("iid", "wor")]
    cases += [(f"profile {p}:branching({sh[0]},{sh[1]})", sh, p, 64, 64) for sh in ((4, 3), (8, 7))
              for p in ("iid", "wor")]
    for process in ("iid", "wor"):                                # the kernels compiled outside the timings
        bound(TreeShape.branching(3, 2), draft, target, process=process, prefix=ctx, budget=4)
    rows = []
    for label, dims, process, budget, batch in cases:
        rec = _record_laws(B, lambda dims=dims, process=process, budget=budget, batch=batch: bound(
            TreeShape.branching(*dims), draft, target, process=process, prefix=ctx, budget=budget, batch=batch))
        host_laws = _TensorLaws(rec, None, stack=False)
        dev_laws = _TensorLaws(rec, device)

        def run(laws, dims=dims, process=process, budget=budget, batch=batch, M=B, Shape=TreeShape):
            laws.calls = 0
            out = M._sampled(M._Slots(Shape.branching(*dims)), process, laws, budget, batch)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out

        a, b = run(host_laws), run(dev_laws)
        rel = max(abs(a.value - b.value) / a.value, abs(a.remainder - b.remainder) / a.value)
        same = (a.n_expanded, a.complete, a.pi_exact) == (b.n_expanded, b.complete, b.pi_exact)
        with _Counts() as c:
            run(dev_laws)
        ops = _count_ops(lambda: run(dev_laws))
        fns = [forward, lambda: run(host_laws), lambda: run(dev_laws)]
        extra = ()
        if other is not None:
            OB, OShape = other
            o = run(dev_laws, M=OB, Shape=OShape)
            bits = (o.value, o.remainder, o.n_expanded, o.pi_exact, o.per_depth.tolist(),
                    o.lower_per_depth.tolist()) == (b.value, b.remainder, b.n_expanded, b.pi_exact,
                                                    b.per_depth.tolist(), b.lower_per_depth.tolist())
            with _Counts() as oc:
                run(dev_laws, M=OB, Shape=OShape)
            ops_o = _count_ops(lambda: run(dev_laws, M=OB, Shape=OShape))
            fns.append(lambda: run(dev_laws, M=OB, Shape=OShape))
        before = _load()
        cpu = _cpu_rounds(fns, args.repeat)
        after = _load()
        if other is not None:
            extra = (oc.reads, ops_o, cpu[3] * 1e3, "yes" if bits else "NO")
        rows.append((label, budget, b.n_expanded, cpu[0] * 1e3, cpu[1] * 1e3, cpu[1] / cpu[0], cpu[2] * 1e3,
                     cpu[2] / cpu[0], cpu[2] / cpu[1], f"{rel:.1e}", "yes" if same else "NO", c.reads, c.values, ops,
                     *extra, f"{before} / {after}"))
    head = ("bound", "budget", "expanded", "forward CPU ms", "numpy route CPU ms", "numpy / forward",
            "torch route CPU ms", "torch / forward", "torch / numpy", "relative difference",
            "same expanded, complete, pi exact", "host reads", "values read", "torch ops (no views)")
    if other is not None:
        head += ("before: host reads", "before: torch ops (no views)", "before: torch route CPU ms",
                 "the same bound as before, to the bit")
    head += ("load average before / after",)
    print_table(f"the bound's numpy route against its torch route on the same laws, V = {V} ({name}, {stamp}), "
                f"CPU time medians of {args.repeat} interleaved rounds", head, rows, args.rst)


#: The host kernels whose CPU time ``--passes`` reports (those a checkout has, called from Python; Python and numpy
#: around them is "the rest"). ``wor_row_decide`` runs the last depth's ``wor_row_last`` (with the draft's head and
#: second draw's sums), ``wor_row_recheck`` and the race's power sums of a row in one call, and ``wor_rows_decide``
#: (``iid_rows``) that for every row of a frontier that are rows of one array: their passes show under them.
PASSES = ("iid_rows", "iid_row", "wor_rows_decide", "wor_row_decide", "wor_row_last", "wor_row_stats",
          "wor_row_recheck", "race_moments_row", "race_rows", "race_rows_weighted", "wor_row_at", "wor_rows_at",
          "wor_row")


class _PassClock:
    """CPU time and calls of the kernels :data:`PASSES` of one ``_bound_kernels`` module, by wrappers around its
    module globals (installed after the kernels are compiled: compiled kernels that call each other keep the
    compiled callee)."""

    def __init__(self, K):
        self.K, self.acc, self.calls, self.orig = K, {}, {}, {}

    def __enter__(self):
        import time

        for n in PASSES:
            if hasattr(self.K, n):
                f = self.orig[n] = getattr(self.K, n)

                def g(*a, n=n, f=f):
                    t = time.process_time()
                    try:
                        return f(*a)
                    finally:
                        self.acc[n] = self.acc.get(n, 0.0) + time.process_time() - t
                        self.calls[n] = self.calls.get(n, 0) + 1

                setattr(self.K, n, g)
        return self

    def __exit__(self, *exc):
        for n, f in self.orig.items():
            setattr(self.K, n, f)


def passes(args) -> None:
    """``--passes``: the CPU time of each host kernel of the bound (laws as arrays, the real pair's recorded laws of
    ``branching(8,7)`` at ``--budget``), this checkout and, with ``--against``, the other one, alternating in
    ``max(--repeat, 5)`` rounds; medians per kernel, the rest (Python, numpy) and the whole call."""
    import datetime
    import statistics
    import time

    import otspec.tree._bound as B
    import otspec.tree._bound_kernels as K
    from otspec.tree import TreeShape, bound

    mods = [("after", B, K, TreeShape)]
    if args.against:
        OB, OShape = _load_against(args.against)
        mods.append(("before", OB, sys.modules["otspec_against.tree._bound_kernels"], OShape))
    device, target, draft, ctx, name = _real_pair(args)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}; {name}; V = {target.vocab_size}; branching(8,7), budget {args.budget}, {args.batch} per call")
    rows, nrep = [], max(args.repeat, 5)
    for process in ("iid", "wor"):
        rec = _record_laws(B, lambda process=process: bound(TreeShape.branching(8, 7), draft, target, process=process,
                                                              prefix=ctx, budget=args.budget, batch=args.batch))
        laws = _TensorLaws(rec, None, stack=False)
        runs = {label: (lambda MB=MB, Sh=Sh: MB._sampled(MB._Slots(Sh.branching(8, 7)), process, laws, args.budget,
                                                          args.batch)) for label, MB, _, Sh in mods}
        values = {label: run().value for label, run in runs.items()}       # compiled before the clocks
        got: dict = {label: [] for label in runs}
        before = _load()
        for _ in range(nrep):
            for label, _MB, MK, _Sh in mods:
                with _PassClock(MK) as clock:
                    t = time.process_time()
                    runs[label]()
                    total = time.process_time() - t
                got[label].append((total, dict(clock.acc), dict(clock.calls)))
        after = _load()
        for label, _MB, _MK, _Sh in mods:
            med = {n: statistics.median(g[1].get(n, 0.0) for g in got[label]) * 1e3 for n in PASSES}
            tot = statistics.median(g[0] for g in got[label]) * 1e3
            rest = statistics.median(g[0] - sum(g[1].values()) for g in got[label]) * 1e3
            calls = got[label][0][2]
            rows.append((process, label, *(f"{med[n]:.1f} ({calls[n]})" if n in calls else "--" for n in PASSES),
                         f"{rest:.1f}", f"{tot:.1f}", f"{values[label]:.15g}", f"{before} / {after}"))
    head = ("process", "code", *(f"{n} ms (calls)" for n in PASSES), "rest ms", "total ms", "bound",
            "load average before / after")
    print_table(f"CPU ms per pass of one bound, medians of {nrep} alternating rounds ({name}, {stamp})", head, rows,
                args.rst)


if __name__ == "__main__":  # pragma: no cover
    main()
