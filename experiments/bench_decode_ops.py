"""The decoders' device routes: aten ops and host reads per iteration outside the models' forwards, and the time.

On an accelerator the decoder's work outside the forward passes of a small pair is launches (about 5-10 us an eager
kernel) and synchronising host reads (20-50 us each), a fixed cost per iteration. Both are countable on the CPU:
every decoder of the table is run on its device route with CPU tensors (``engine="torch"``, with
``_Decoder.read_on_host`` and ``TreeStepT.read_on_host`` set False, the route an accelerator takes: on the CPU the
decoders otherwise read their few numbers on the host), and

* **aten ops**: every kernel torch dispatches (a :class:`~torch.utils._python_dispatch.TorchDispatchMode`), views
  left out (``OpOverload.is_view``: no launch), the models' forwards left out (``HFCausalLM.logits`` and
  ``tree_logits`` paused, and the laws' ``Sampling.probs``/``own_law``, as ``bench_profile_ops.py`` counts);
* **host reads**: ``aten._local_scalar_dense`` (a tensor turned into a Python number, also inside C++) plus the
  Python calls that copy a tensor to the host (``tolist``, ``item``, ``numpy``, ``cpu``, ``__bool__``,
  ``__int__``, ``__float__``, ``__index__``, a CPU ``to``), each counted once however it reaches the dispatcher
  (a ``tolist`` of one element is one read, not two);

both per iteration (the decode's target calls), over ``--prompts`` prompts x ``--tokens`` tokens. ``--time``
adds the CPU wall time per iteration outside the forwards (no mode installed, 1 torch thread), and ``--before
PATH`` runs the same in child processes alternating between a checkout at an earlier commit and this one (one
per repeat and checkout, each checkout first in every other repeat), the medians side by side.

Pairs: ``tiny`` (a random ``LlamaForCausalLM``, V = 64, 2 layers of hidden 16: the counts alone, fast) and
``small`` (the V = 128,256 pair of ``bench_decode_overhead.py``: 4 layers of hidden 64, its draft the first layer).

Run: ``python experiments/bench_decode_ops.py [--pair tiny|small] [--decoders NAMES] [--time] [--before PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_profile_ops import _issuer  # noqa: E402

#: The decoders of the table: name -> ``speculative_decode`` keywords (the chains' ``L``; the trees' texts).
DECODERS = {
    "token L=2": dict(verifier="token", L=2),
    "token L=4": dict(verifier="token", L=4),
    "block-onestep L=4": dict(verifier="block-onestep", L=4),
    "eagle2:4,4,16": dict(tree="eagle2:4,4,16"),
    "topk:branching(2,2)": dict(tree="topk:branching(2,2)"),
    "iid:branching(2,2):specinfer": dict(tree="iid:branching(2,2):specinfer"),
    "wor:branching(2,2):sequoia": dict(tree="wor:branching(2,2):sequoia"),
}


class Counts:
    """aten ops (views left out), host reads, and the seconds inside the forwards."""

    def __init__(self):
        self.aten = self.reads = self.paused = self.inside_read = 0
        self.ops: dict[str, int] = {}
        self.where: dict[str, int] | None = None  # ops and reads by the innermost function of otspec issuing them
        self.forward = 0.0


def _note(counts: Counts, kind: str) -> None:
    if counts.where is not None:
        at = kind + " " + _issuer(sys._getframe(2), line=True)
        counts.where[at] = counts.where.get(at, 0) + 1


@contextmanager
def paused_forwards(counts: Counts, count_ops: bool = True):
    """The models' forwards (and the laws' softmax) paused and timed into ``counts``; with ``count_ops`` the aten ops
    and host reads made outside them counted."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import otspec.decoding as D
    from otspec.decoding._sampling import Sampling

    saved = {}

    def pause(fn):
        def f(*a, **k):
            counts.paused += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                counts.paused -= 1
                if not counts.paused:
                    counts.forward += time.perf_counter() - t0
        return f

    for cls, names in ((D.HFCausalLM, ("logits", "tree_logits")), (Sampling, ("probs", "own_law"))):
        for n in names:
            saved[(cls, n)] = cls.__dict__[n]
            setattr(cls, n, pause(cls.__dict__[n]))
    host_calls = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__array__,
                  torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
                  torch.Tensor.cpu}
    scalar = torch.ops.aten._local_scalar_dense.default

    class Aten(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not counts.paused:
                if func is scalar:
                    if not counts.inside_read:
                        counts.reads += 1
                        _note(counts, "read")
                elif not func.is_view:
                    counts.aten += 1
                    _note(counts, "op")
                    name = str(func.overloadpacket)
                    counts.ops[name] = counts.ops.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    class Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            read = not counts.paused and (func in host_calls or (func is torch.Tensor.to and _to_cpu(args, kwargs)))
            if not read:
                return func(*args, **(kwargs or {}))
            if not counts.inside_read:
                counts.reads += 1
                _note(counts, "read")
            counts.inside_read += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                counts.inside_read -= 1

    try:
        if count_ops:
            with Aten(), Reads():
                yield counts
        else:
            yield counts
    finally:
        for (cls, n), fn in saved.items():
            setattr(cls, n, fn)


def _to_cpu(args, kwargs) -> bool:
    """Whether a ``Tensor.to`` call copies a tensor of another device to the host."""
    import torch

    t = args[0]
    dev = (kwargs or {}).get("device", args[1] if len(args) > 1 else None)
    if isinstance(dev, (str, torch.device)):
        try:
            return torch.device(dev).type == "cpu" and t.device.type != "cpu"
        except (RuntimeError, TypeError):
            return False
    return False


def pair(name: str):
    """``(target, draft, prompts)`` as ``HFCausalLM``: ``tiny`` or ``small``."""
    import torch
    import transformers

    import otspec.decoding as D

    if name == "small":
        from bench_decode_overhead import small_pair

        return small_pair("cpu", torch.float32)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    draft = D.layer_skip_draft(target, (0,))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (8,), generator=g).tolist() for _ in range(3)]
    return D.HFCausalLM(target, name="tiny-target"), D.HFCausalLM(draft, name="tiny-draft"), prompts


#: The rule of :func:`otspec.decoding._sampling.draw_rows` and of the without-replacement draws
#: (``otspec.decoding._tree_device._draws_wor``) when none is named (None: their own default, ``"race"`` on CUDA
#: and ``"cdf"`` elsewhere; ``--rule race``, the default here, counts what CUDA runs).
RULE = ["race"]


@contextmanager
def accelerator_route():
    """The decoders' device routes as an accelerator runs them: no host reads of the CPU's own, and the draws by
    CUDA's rule (:data:`RULE`)."""
    from otspec.decoding import _loop, _sampling, _tree_device

    saved = _loop._Decoder.read_on_host, _tree_device.TreeStepT.read_on_host
    kws = [_sampling.draw_rows.__kwdefaults__, _tree_device._draws_wor.__kwdefaults__]  # the two rules' defaults
    rules = [kw["rule"] for kw in kws]
    _loop._Decoder.read_on_host = _tree_device.TreeStepT.read_on_host = False
    for kw in kws:
        kw["rule"] = RULE[0]
    try:
        yield
    finally:
        _loop._Decoder.read_on_host, _tree_device.TreeStepT.read_on_host = saved
        for kw, rule in zip(kws, rules):
            kw["rule"] = rule


def count(target, draft, prompts, decoder: str, tokens: int, *, seed0: int = 0, count_ops: bool = True,
          by_function: bool = False) -> dict:
    """Per iteration of ``decoder`` over ``prompts`` (each ``tokens`` long): aten ops, host reads, the target
    calls (iterations), and the wall ms outside the forwards; ``ops``: the aten ops by name over the decodes."""
    import otspec.decoding as D

    c = Counts()
    c.where = {} if by_function else None
    with accelerator_route():
        # one decode not counted first: the constants a decoder keeps per process and device (otspec.decoding's
        # cached index ranges and scalars) are then made before the count, whichever decoder this process ran first
        D.speculative_decode(prompts[0], draft=draft, target=target, max_new_tokens=tokens, rng=seed0,
                             engine="torch", **DECODERS[decoder])
    with accelerator_route(), paused_forwards(c, count_ops):
        t0 = time.perf_counter()
        iters = 0
        for i, ids in enumerate(prompts):
            res = D.speculative_decode(ids, draft=draft, target=target, max_new_tokens=tokens, rng=seed0 + i,
                                       engine="torch", **DECODERS[decoder])
            iters += res.iterations
        wall = time.perf_counter() - t0
    return {"aten": c.aten / iters, "reads": c.reads / iters, "iterations": iters,
            "outside_ms": 1e3 * (wall - c.forward) / iters, "ops": c.ops,
            "where": c.where}


def table(pair_name: str, decoders, tokens: int, prompts_n: int, top: int, by_function: int = 0) -> dict:
    target, draft, prompts = pair(pair_name)
    prompts = prompts[:prompts_n]
    out = {}
    for name in decoders:
        r = count(target, draft, prompts, name, tokens, by_function=bool(by_function))
        out[name] = r
        print(f"{name:32s} aten ops/iteration {r['aten']:8.1f}   host reads/iteration {r['reads']:5.2f}   "
              f"({r['iterations']} iterations)", flush=True)
        if top:
            print("    " + ", ".join(f"{k} {v / r['iterations']:.1f}" for k, v in
                                     sorted(r["ops"].items(), key=lambda kv: -kv[1])[:top]))
        if by_function:
            for k, v in sorted(r["where"].items(), key=lambda kv: -kv[1])[:by_function]:
                print(f"    {v / r['iterations']:6.2f}  {k}")
    return out


def timed(pair_name: str, decoders, tokens: int, prompts_n: int, repeats: int) -> dict:
    """The wall ms per iteration outside the forwards, no counting mode, medians of ``repeats`` (after a warm-up),
    with the counts of one counted run."""
    target, draft, prompts = pair(pair_name)
    prompts = prompts[:prompts_n]
    got = {}
    for name in decoders:
        count(target, draft, prompts[:1], name, 4, count_ops=False)  # warm-up
        ms = [count(target, draft, prompts, name, tokens, seed0=100 * r, count_ops=False)["outside_ms"]
              for r in range(repeats)]
        c = count(target, draft, prompts, name, tokens)
        got[name] = [c["aten"], c["reads"], statistics.median(ms)]
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--decoders", default="|".join(DECODERS), help="names of DECODERS separated by '|'")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=0, help="print the N commonest aten ops of each decoder")
    ap.add_argument("--rule", default="race", choices=("race", "cdf", "none"),
                    help="draw_rows' rule where none is named ('race': CUDA's; 'none': the device's own default)")
    ap.add_argument("--by-function", type=int, default=0, metavar="N",
                    help="print the N lines of otspec issuing the most aten ops and host reads per iteration")
    ap.add_argument("--time", action="store_true", help="the wall ms per iteration outside the forwards too")
    ap.add_argument("--before", default=None, help="a checkout of the package at an earlier commit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    RULE[0] = None if a.rule == "none" else a.rule
    names = [n for n in a.decoders.split("|") if n]
    unknown = [n for n in names if n not in DECODERS]
    if unknown:
        ap.error(f"--decoders: unknown {unknown}, expected names of {list(DECODERS)}")
    if a.child:
        print(json.dumps(timed(a.pair, names, a.tokens, a.prompts, 1)))
        return 0
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), pair {a.pair}, {a.prompts} prompts x {a.tokens} tokens; load "
          f"average {os.getloadavg()[0]:.2f}", flush=True)
    if not a.before and not a.time:
        table(a.pair, names, a.tokens, a.prompts, a.top, a.by_function)
        return 0
    roots = {"after": str(Path(__file__).resolve().parent.parent)}
    if a.before:
        roots = {"before": str(Path(a.before).resolve()), **roots}
    runs: dict = {v: [] for v in roots}
    load0 = os.getloadavg()[0]
    for rep in range(a.repeats):
        order = list(roots.items())
        for v, root in order if rep % 2 == 0 else order[::-1]:  # each checkout first in every other repeat
            cmd = [sys.executable, __file__, "--child", "--pair", a.pair, "--decoders", "|".join(names),
                   "--tokens", str(a.tokens), "--prompts", str(a.prompts), "--threads", str(a.threads),
                   "--rule", a.rule]
            out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the {v} checkout's child failed:\n{out.stderr[-3000:]}")
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()[0]
    print(f"medians of {a.repeats} repeats in alternating processes; load average {load0:.2f} -> {load1:.2f}")
    print(f"{'decoder':32s} " + "  ".join(f"{v + ' ops':>10s} {v + ' reads':>12s} {v + ' ms/it':>12s}"
                                          for v in roots))
    for name in names:
        cells = []
        for v in roots:
            med = [statistics.median(r[name][i] for r in runs[v]) for i in range(3)]
            cells.append(f"{med[0]:10.1f} {med[1]:12.2f} {med[2]:12.3f}")
        print(f"{name:32s} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
