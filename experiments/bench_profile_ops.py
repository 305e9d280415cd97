"""The profile walk's host-side floor: torch ops, host reads and milliseconds per position outside the forward passes.

On a GPU with small per-position tensors the walk's cost outside its forward passes is mostly host-side: Python,
torch's per-op dispatch (about 5-20 us an op in eager mode, whatever the tensor's size), kernel launches and host
synchronisations. That floor is measured here on the CPU: the walk on the device route
(:func:`otspec.profile._collect.analysis_device` patched to the CPU, the laws kept as torch tensors) of a tiny
random-weight Llama pair at a tiny vocabulary (default V = 64), where an op costs its dispatch and little else.
Per position, for the default verifiers and families at ``k_max = L_max = 4``, ``batch_size`` 1 and 4, cheap
positions and subsampled ones, with and without the tree families of ``experiments/bench_profile.py --llama``:

* **aten ops** (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`: every kernel call torch dispatches),
* **torch calls** (a :class:`~torch.overrides.TorchFunctionMode`: every Python-level torch function or method),
* **host reads** (``tolist``, ``item``, ``numpy``, ``np.asarray`` of a tensor...: a synchronisation each on a GPU),
* **ms outside the forwards** by phase (a second walk with no mode on): ``draft calls`` (the model calls' own work
  outside the forward: ids, the bad-logits flags), ``draws`` (the drafts and the path's token), ``reads`` (the
  position's values brought to the host), ``quantities`` (the (k, L) chain quantities), ``trees`` (the tree families'
  drafting, scoring and values), ``tree bound`` (the bound at the subsampled positions), ``renewal`` (the renewal
  tables along the text) and ``bookkeeping`` (the rest: the cache cuts, the rows).

The forward passes (the models' ``logits``/``tree_logits`` and :meth:`otspec.decoding.Sampling.probs`) are left out of
every count. Beside the counts, a **rough GPU estimate, stated as such**: aten ops x 10 us per op (eager-mode dispatch
and launch; the real cost per op is 5-20 us) against the forwards of the Llama-3.2-1B-shaped pair on an H100 measured
in docs/perf/gpu_check.rst (13-20 ms a target call, 4-5 ms a draft call: about 4 x 4.5 + 16 = 34 ms per chain
position). It is no measurement of a GPU.

    python experiments/bench_profile_ops.py                  # the table, V = 64, 4 positions
    python experiments/bench_profile_ops.py --V 128256 --positions 2 --no-trees   # the same walk at V = 128,256
    python experiments/bench_profile_ops.py --against /work/old  # an older checkout's table in turn (3 runs)
    python experiments/bench_profile_ops.py --by-function 12 --batches 1  # which functions issue the ops and reads
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import contextmanager

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The tree families of ``experiments/bench_profile.py --llama``.
TREES = ["topk:branching(4,2)", "eagle2:4,4,16", "topk:branching(8,4,2)", "iid:branching(4,2):specinfer"]
#: Rough GPU cost of one eager-mode op (dispatch and launch), seconds: a stated estimate, not a measurement.
US_PER_OP = 10e-6
#: Forward seconds per chain position of the 1B-shaped pair on an H100 (docs/perf/gpu_check.rst): 4 draft calls of
#: about 4.5 ms and one target call of about 16 ms.
H100_FORWARD_S = 4 * 4.5e-3 + 16e-3
#: The phases, in the table's order.
PHASES = ("draft calls", "draws", "reads", "quantities", "trees", "tree bound", "renewal", "bookkeeping")


class Counts:
    """aten ops, torch calls and host reads of the walk outside its forward passes (``paused`` > 0 inside them);
    with ``by_function``, also by the innermost function of ``otspec`` that issued them (``where``: aten ops,
    ``read_from``: host reads)."""

    def __init__(self, by_function: bool = False):
        self.aten = 0
        self.calls = 0
        self.reads = 0
        self.paused = 0
        self.ops: dict[str, int] = {}
        self.by_function = by_function
        self.where: dict[str, int] = {}
        self.read_from: dict[str, int] = {}


def _issuer(frame, line: bool = False) -> str:
    """``module.py:function`` (``module.py:line:function`` with ``line``) of the innermost frame of ``otspec`` above
    ``frame`` ("?" if none)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if "otspec" + os.sep in name and os.sep + "torch" + os.sep not in name:
            at = f":{frame.f_lineno}" if line else ""
            return f"{name.rsplit('otspec' + os.sep, 1)[1]}{at}:{frame.f_code.co_qualname}"
        frame = frame.f_back
    return "?"


def _modes(counts: Counts):
    """The two torch modes counting into ``counts``: (dispatch mode, function mode)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.numpy,
             torch.Tensor.__array__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}

    class Aten(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not counts.paused:
                counts.aten += 1
                name = str(func.overloadpacket)
                counts.ops[name] = counts.ops.get(name, 0) + 1
                if counts.by_function:
                    at = _issuer(sys._getframe(1))
                    counts.where[at] = counts.where.get(at, 0) + 1
            return func(*args, **(kwargs or {}))

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if not counts.paused:
                counts.calls += 1
                counts.reads += func in reads
                if counts.by_function and func in reads:
                    at = _issuer(sys._getframe(1))
                    counts.read_from[at] = counts.read_from.get(at, 0) + 1
            return func(*args, **(kwargs or {}))

    return Aten(), Calls()


@contextmanager
def counting(counts: Counts):
    """Count the torch ops, calls and host reads made inside the block into ``counts``, the forward passes left out
    (the models' ``logits``/``tree_logits`` and ``Sampling.probs``/``own_law`` patched while it runs)."""
    import otspec.decoding as D
    from otspec.decoding._sampling import Sampling

    saved = {}

    def pause(fn):
        def f(*a, **k):
            counts.paused += 1
            try:
                return fn(*a, **k)
            finally:
                counts.paused -= 1
        return f

    for cls, names in ((D.HFCausalLM, ("logits", "tree_logits")), (Sampling, ("probs", "own_law"))):
        for n in names:
            saved[(cls, n)] = cls.__dict__[n]
            setattr(cls, n, pause(cls.__dict__[n]))
    aten, calls = _modes(counts)
    try:
        with aten, calls:
            yield counts
    finally:
        for (cls, n), fn in saved.items():
            setattr(cls, n, fn)


class Phases:
    """Wall seconds by phase (exclusive: a phase's time excludes the phases called inside it), the forward passes
    apart as ``"forward"``."""

    def __init__(self):
        self.seconds = {p: 0.0 for p in PHASES + ("forward",)}
        self.stack = ["bookkeeping"]
        self.mark = 0.0

    def wrap(self, phase, fn):
        def f(*a, **k):
            now = time.perf_counter()
            self.seconds[self.stack[-1]] += now - self.mark
            self.stack.append(phase)
            self.mark = now
            try:
                return fn(*a, **k)
            finally:
                now = time.perf_counter()
                self.seconds[self.stack.pop()] += now - self.mark
                self.mark = now
        return f


@contextmanager
def phased(phases: Phases):
    """Time the walk's phases into ``phases`` (functions of :mod:`otspec.profile._collect` and the models patched)."""
    import otspec.decoding as D
    import otspec.profile._collect as C
    from otspec.decoding._sampling import Sampling

    plan = [(D.HFCausalLM, "logits", "forward"), (D.HFCausalLM, "tree_logits", "forward"),
            (Sampling, "probs", "forward"), (Sampling, "own_law", "forward"), (C._Timer, "call", "draft calls"),
            (C._Checks, "read", "reads"), (C, "_sample", "draws"), (C, "_step_uniforms", "draws"),
            (C, "batch_builds", "quantities"), (C, "position_rows", "quantities"), (C, "tree_drafts", "trees"),
            (C, "tree_rows", "trees"), (C, "position_bounds", "tree bound")]
    saved = []
    for obj, name, phase in plan:
        if not hasattr(obj, name):  # an older checkout's (with --against)
            continue
        fn = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)
        saved.append((obj, name, fn))
        setattr(obj, name, phases.wrap(phase, fn))
    phases.mark = time.perf_counter()
    try:
        yield phases
    finally:
        phases.seconds[phases.stack[-1]] += time.perf_counter() - phases.mark
        for obj, name, fn in saved:
            setattr(obj, name, fn)


def pair(V: int):
    """The tiny random-weight Llama pair of the tests (2 layers, hidden size 16) at vocabulary ``V``: (draft, target)."""
    if ROOT not in sys.path:
        sys.path.append(ROOT)  # after PYTHONPATH: an older checkout's otspec is the one measured with --against
    from tests.toy_lm import tiny_llama

    return tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)


def settings(V: int, positions: int, subsample: int, trees, batch_size: int):
    """The walk's settings: the default verifiers and families, ``k_max = L_max = 4``, every position profiled."""
    from otspec.profile import ProfileSettings

    return ProfileSettings(k_max=4, L_max=4, max_new_tokens=positions, subsample=subsample, trees=trees or (),
                           batch_size=batch_size).for_vocabulary(V)


def walk(draft, target, s, batch_size: int, *, renewal=True):
    """One walk on the device route (on CPU tensors for models on the CPU, else on the models' device):
    ``batch_size`` prompts, together when more than one (the renewal tables along the text included with
    ``renewal``); its rows."""
    import torch

    import otspec.profile._collect as C
    from otspec.profile._renewal_hook import emission_rows

    prompts = [[3 + b, 7, 1 + 2 * b] for b in range(batch_size)]
    saved = C.analysis_device
    if saved(target) is None:
        C.analysis_device = lambda lm: torch.device("cpu")
    hook = None
    if renewal:
        hook = _renewal_phase(emission_rows)
    try:
        if batch_size == 1:
            return [C.profile_prompt(draft, target, prompts[0], None, s, 0, renewal=hook)]
        return C.profile_bucket(draft, target, prompts, [None] * batch_size, s, list(range(batch_size)), renewal=hook)
    finally:
        C.analysis_device = saved


_ACTIVE: list = []  # the Phases timing the walk now, if any (the renewal hook is passed in, not patched)


def _renewal_phase(fn):
    def f(*a, **k):
        return _ACTIVE[-1].wrap("renewal", fn)(*a, **k) if _ACTIVE else fn(*a, **k)
    return f


def measure(draft, target, V: int, positions: int, subsample: int, trees, batch_size: int, repeat: int = 3,
            by_function: bool = False) -> dict:
    """Per position (``batch_size x positions`` of them): aten ops, torch calls, host reads (one counted walk), and
    ms outside the forwards by phase and forward ms (the fastest of ``repeat`` uncounted walks, after a warm-up)."""
    import torch

    torch.set_num_threads(1)
    s = settings(V, positions, subsample, trees, batch_size)
    n = positions * batch_size
    walk(draft, target, s, batch_size)  # warm-up
    c = Counts(by_function)
    with counting(c):
        walk(draft, target, s, batch_size)
    best = None
    for _ in range(repeat):
        ph = Phases()
        _ACTIVE.append(ph)
        try:
            with phased(ph):
                walk(draft, target, s, batch_size)
        finally:
            _ACTIVE.pop()
        other = sum(v for k, v in ph.seconds.items() if k != "forward")
        if best is None or other < best[0]:
            best = (other, ph.seconds)
    return {"aten": c.aten / n, "calls": c.calls / n, "reads": c.reads / n, "other_ms": 1e3 * best[0] / n,
            "forward_ms": 1e3 * best[1]["forward"] / n, "phases": {k: 1e3 * v / n for k, v in best[1].items()},
            "ops": {k: v / n for k, v in sorted(c.ops.items(), key=lambda kv: -kv[1])},
            "where": {k: v / n for k, v in sorted(c.where.items(), key=lambda kv: -kv[1])},
            "read_from": {k: v / n for k, v in sorted(c.read_from.items(), key=lambda kv: -kv[1])}}


def ops_per_position(draft, target, V: int, positions: int = 2, batch_size: int = 1) -> dict:
    """``{(trees or not, subsampled or not): aten ops per position}`` of the walk outside its forward passes
    (chains and the tree families of :data:`TREES`, cheap and subsampled positions), on the models' device."""
    out = {}
    for trees in (None, TREES):
        for sub in (0, 1):
            c = Counts()
            with counting(c):
                walk(draft, target, settings(V, positions, sub, trees, batch_size), batch_size)
            out[(trees is not None, bool(sub))] = c.aten / (positions * batch_size)
    return out


def configurations(no_trees: bool = False, batches=(1, 4)):
    """(label, subsample, trees, batch size) of the table's rows."""
    out = []
    for trees in ((None,) if no_trees else (None, TREES)):
        for sub in (0, 1):
            for b in batches:
                out.append((f"{'trees' if trees else 'chains'} {'subsampled' if sub else 'cheap'} B={b}", sub,
                            trees, b))
    return out


def table(V: int, positions: int, no_trees: bool, batches, top: int = 0, by_function: int = 0) -> list[dict]:
    """Print the table (and the ``top`` commonest aten ops of each row, and with ``by_function`` the functions of
    ``otspec`` issuing the most aten ops and every host read's); the rows' measurements."""
    draft, target = pair(V)
    print(f"profile walk on the device route, torch CPU tensors, tiny Llama pair (2 layers, hidden 16), V = {V}, "
          f"k_max = L_max = 4, default verifiers and families, {positions} positions x B prompts; "
          f"os.getloadavg {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print("config | aten ops | torch calls | host reads | other ms | forward ms | "
          + " | ".join(PHASES) + " | rough GPU estimate: ops x 10 us (ms, share of 34 ms of 1B forwards)")
    got = []
    for label, sub, trees, b in configurations(no_trees, batches):
        r = measure(draft, target, V, positions, sub, trees, b, by_function=bool(by_function))
        est = r["aten"] * US_PER_OP
        print(" | ".join([label, f"{r['aten']:.0f}", f"{r['calls']:.0f}", f"{r['reads']:.1f}", f"{r['other_ms']:.1f}",
                          f"{r['forward_ms']:.1f}"] + [f"{r['phases'][p]:.1f}" for p in PHASES]
                         + [f"{1e3 * est:.0f} ({est / H100_FORWARD_S:.2f}, rough estimate)"]), flush=True)
        if top:
            print("    " + ", ".join(f"{k} {v:.0f}" for k, v in list(r["ops"].items())[:top]))
        if by_function:
            print("    aten ops by function: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                        list(r["where"].items())[:by_function]))
            print("    host reads by function: " + ", ".join(f"{k} {v:.1f}" for k, v in r["read_from"].items()))
        got.append(dict(r, label=label))
    return got


def against(args) -> None:
    """This checkout's table and ``--against``'s, in alternating fresh processes, ``--runs`` times each."""
    argv = ["--V", str(args.V), "--positions", str(args.positions)] + (["--no-trees"] if args.no_trees else []) + [
        "--batches", *map(str, args.batches)]
    me = os.path.abspath(__file__)
    for run in range(args.runs):
        for root in (args.against, ROOT):
            print(f"# run {run + 1}: {root}", flush=True)
            env = dict(os.environ, PYTHONPATH=root)
            subprocess.run([sys.executable, me, *argv], env=env, check=True, cwd=root)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--V", type=int, default=64)
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--no-trees", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--top", type=int, default=0, help="print the commonest aten ops of each row")
    ap.add_argument("--by-function", type=int, default=0, metavar="N",
                    help="print the N functions of otspec issuing the most aten ops per position, and every host "
                         "read's function (innermost otspec frame)")
    ap.add_argument("--against", help="an older checkout's root, measured in turn with this one")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    if args.against:
        against(args)
        return 0
    table(args.V, args.positions, args.no_trees, args.batches, args.top, args.by_function)
    return 0


if __name__ == "__main__":
    sys.exit(main())
