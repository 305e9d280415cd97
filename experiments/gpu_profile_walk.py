"""Where a ``profile`` call spends its time outside the forward passes, on the device: host and device views.

The random-weight pair of ``experiments/gpu_check.py`` (default the Llama-3.2-1B shape, V = 128,256, on cuda),
``k_max = L_max = 4``, the chain quantities alone and with the four tree families of
``experiments/bench_profile.py --llama``. For each:

1. **cProfile** of the walk along the prompts (every profiled position; the cost calibration is left out of
   every call of this script, a per-run cost timed by ``gpu_check.py``), with its seconds inside the forward
   passes (the models' calls and their laws, the device synchronised at both ends) and outside them: the
   functions with the most own time and the most cumulative time, written to ``OUT/cprof_<label>.txt``. On a GPU the host waits where it reads a result, so a function's own time
   includes the device work queued before that read.
2. **torch.profiler** of the walk along one prompt: operators by their time on
   the device and by their time on the host, in ``OUT/torchprof_<label>.txt``.

    python experiments/gpu_profile_walk.py --out /tmp/prof          # the 1B shape on cuda
    python experiments/gpu_profile_walk.py --tiny --out /tmp/prof   # a tiny shape on the CPU, seconds
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_check import _guarded  # noqa: E402 -- one part's failure printed, the later parts still run


def _stats(prof: cProfile.Profile, n: int) -> str:
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(n)
    st.sort_stats("cumulative").print_stats(n)
    return s.getvalue()


def _walk_only(fn_enter, fn_exit):
    """Patch the walk along the prompts (``profile_prompt``/``profile_bucket`` where ``run_shard`` calls them) so
    that ``fn_enter``/``fn_exit`` run around each call; returns the restoring function."""
    from otspec.profile import _shard

    saved = {n: getattr(_shard, n) for n in ("profile_prompt", "profile_bucket")}

    def wrap(f):
        def g(*a, **k):
            fn_enter()
            try:
                return f(*a, **k)
            finally:
                fn_exit()
        return g

    for n, f in saved.items():
        setattr(_shard, n, wrap(f))
    return lambda: [setattr(_shard, n, f) for n, f in saved.items()]


def sync_for(device: str):
    """A function that waits for ``device``'s queued work: :func:`otspec._timing.synchronize` of that device
    (``torch.cuda.synchronize(device)`` on CUDA, the device's own index; nothing on the CPU)."""
    from otspec._timing import synchronize

    return lambda: synchronize(device)


def profiler_activities(device: str) -> list:
    """The torch.profiler activities: the host's, and the device's on CUDA."""
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])


def profiler_tables(ka, device: str, lines: int) -> list[str]:
    """torch.profiler's operator tables of ``ka`` (``key_averages()``): by device time on CUDA (its column's name
    differs between torch versions), then by host time; a sort key this torch lacks is skipped."""
    parts = []
    keys = ([("self_device_time_total", "self_cuda_time_total")] if device.startswith("cuda") else []) + [
        ("self_cpu_time_total",)]
    for alts in keys:
        for key in alts:
            try:
                parts.append(f"## sorted by {key}\n" + ka.table(sort_by=key, row_limit=lines))
                break
            except (KeyError, AttributeError, ValueError, RuntimeError):
                continue
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny shape on the CPU")
    ap.add_argument("--shape", default=None, help="a named shape of gpu_check.SHAPES (default llama-3.2-1b)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--lines", type=int, default=40, help="rows of each table")
    ap.add_argument("--out", default=".", help="folder for the tables")
    args = ap.parse_args(argv)
    for name in ("prompts", "positions", "lines"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be an integer >= 1, got {getattr(args, name)}")
    import bench_profile as B
    import gpu_check as G
    import transformers

    from otspec.decoding import HFCausalLM
    from otspec.profile import profile

    transformers.logging.set_verbosity_error()
    if args.shape is not None and args.shape not in G.SHAPES:
        ap.error(f"--shape must be one of {sorted(G.SHAPES)}, got {args.shape!r}")
    shape = G.SHAPES[args.shape or ("tiny" if args.tiny else "llama-3.2-1b")]
    device = args.device or ("cpu" if args.tiny else "cuda")
    why = G.check_device_arg(device)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        os.makedirs(args.out, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.out):
            pass
    except OSError as exc:
        print(f"error: --out {args.out!r} cannot be written ({exc.strerror or exc})", file=sys.stderr)
        return 2
    d_model, t_model = G.build_pair(shape, device)
    draft, target = HFCausalLM(d_model, name="draft"), HFCausalLM(t_model, name="target")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, shape.vocab, size=16).tolist() for _ in range(args.prompts)]
    sync = sync_for(device)
    from otspec.decoding._sampling import Sampling
    from otspec.profile import _shard

    calibrate, _shard.cost_rows = _shard.cost_rows, lambda *a, **k: None  # the walk alone: no cost calibration
    try:
        with tempfile.TemporaryDirectory() as tmp:  # warm-up: kernels, allocator, imports
            profile(prompts[:1], out=tmp, draft=draft, target=target, k_max=1, L_max=1, max_new_tokens=2,
                    progress=False)
        for label, trees in (("chains", None), ("trees", B.LLAMA_TREES)):
            kw = dict(draft=draft, target=target, k_max=4, L_max=4, trees=trees, progress=False)
            _guarded(f"{label}: cProfile", _walk_tables, label, kw, prompts, args, device, sync, Sampling)
            _guarded(f"{label}: torch.profiler", _torch_tables, label, kw, prompts, args, device, sync)
    finally:
        _shard.cost_rows = calibrate
    return 0


def _walk_tables(label, kw, prompts, args, device, sync, Sampling) -> None:
    """cProfile of the walk along ``prompts`` with its forward seconds (the models' calls and their laws, timed with
    the device synchronised at both ends), written to ``OUT/cprof_<label>.txt``."""
    import bench_profile as B

    from otspec.profile import profile

    prof = cProfile.Profile()
    walk = [0.0, 0.0]  # wall seconds of the walk, forward seconds inside it
    fwd = B._CallClock()
    mark = [0.0, 0.0]

    def enter():
        sync()
        mark[0], mark[1] = time.perf_counter(), fwd.wall
        prof.enable()

    def leave():
        sync()
        prof.disable()
        walk[0] += time.perf_counter() - mark[0]
        walk[1] += fwd.wall - mark[1]

    draft, target = kw["draft"], kw["target"]
    classes = {c for m in (draft, target) for c in type.mro(type(m)) if c is not object}
    saved = {}
    B._patch(classes, ("logits", "tree_logits"), fwd, saved)
    B._patch({Sampling}, ("probs",), fwd, saved)
    restore = _walk_only(enter, leave)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            profile(prompts, out=tmp, max_new_tokens=args.positions, **kw)
    finally:
        restore()
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)
    n = len(prompts) * args.positions
    text = _stats(prof, args.lines)
    head = (f"# {label}: walk {walk[0]:.2f} s over {len(prompts)} prompts x {args.positions} positions on {device}: "
            f"per position {1e3 * (walk[0] - walk[1]) / n:.1f} ms outside the forward passes, "
            f"{1e3 * walk[1] / n:.1f} ms in them (other / forward "
            f"{(walk[0] - walk[1]) / walk[1] if walk[1] > 0 else float('nan'):.3f}); "
            "cProfile on (it slows the host's side)\n")
    with open(os.path.join(args.out, f"cprof_{label}.txt"), "w") as f:
        f.write(head + text)
    print(head + "\n".join(text.splitlines()[: args.lines + 12]), flush=True)


def _torch_tables(label, kw, prompts, args, device, sync) -> None:
    """torch.profiler of the walk along the first prompt, written to ``OUT/torchprof_<label>.txt``."""
    import torch

    from otspec.profile import profile

    tp = torch.profiler.profile(activities=profiler_activities(device))
    restore = _walk_only(lambda: (sync(), tp.start()), lambda: (sync(), tp.stop()))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            profile(prompts[:1], out=tmp, max_new_tokens=args.positions, **kw)
    finally:
        restore()
    parts = profiler_tables(tp.key_averages(), device, args.lines)
    with open(os.path.join(args.out, f"torchprof_{label}.txt"), "w") as f:
        f.write("\n".join(parts))
    if not parts:
        raise RuntimeError("torch.profiler gave no table under any sort key this script knows")
    print("\n".join(parts[0].splitlines()[: args.lines // 2 + 6]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
