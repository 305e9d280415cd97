"""The tree bound against the target forward that scores the tree, on a device: one table, from a random-weight pair.

The target (docs/perf/trees.rst): ``otspec.tree.bound(shape, draft, target, process=..., budget=256)`` on the
64-node tree ``TreeShape.branching(8, 7)`` at ``V = 49,152`` costs at most 0.10 of the target forward that scores
that tree. The SmolLM2 weights do not travel to a lent device, so this script builds a random-weight pair of
SmolLM2-135M-Instruct's shape there (no download: ``transformers.LlamaForCausalLM(config)``; hidden size 576,
30 layers, 9 heads, 3 key-value heads, intermediate size 1536, ``V = 49,152``, tied embeddings as SmolLM2 has;
the draft the target with the layers of :data:`otspec.decoding.real.DEFAULT_KEEP` kept, 24 of 30, built by
:func:`otspec.decoding.layer_skip_draft` as :func:`otspec.decoding.smollm2_pair` builds the real one), wrapped in
:class:`otspec.decoding.HFCausalLM`, in ``--dtype`` (bfloat16 by default, float32 as an option).

Random weights give near-uniform laws (entropy near ``log V``), unlike a trained model. ``--sharpen T`` (one or
more values, one table each) divides the logits of both models by ``T`` (``T < 1``: peaked laws): the final
norm's weight is divided by ``T``, which scales the logits exactly as dividing the output head's weights would,
without touching the tied input embedding. The mean entropy of the target's laws at the tree's nodes is printed
with each table: the real SmolLM2-135M-Instruct's at the prefixes that the without-replacement bound expands
after a chat prompt is 2.3-2.5 nats; this pair's is 10.7 at ``T = 1`` (``log V = 10.8``), 2.3 at ``T = 0.12``
(the default's second table), 1.1 at ``T = 0.1`` (the CPU, float32; in bfloat16 ``1 / T`` is rounded to 8 bits:
0.12 acts as 0.1203).

For each ``T`` and each sampled process (``"iid"``, ``"wor"``: children without replacement), timed side by
side in interleaved rounds, the device synchronised before and after every timed call
(:func:`otspec._timing.timed_rounds`: one warm-up round, median and half the range):

* **forward**: the target's tree-attention call that scores the 64-node tree after a cached context of
  ``--context`` random tokens, the cache cut back after each call (``experiments/bench_tree_bound.py``'s
  ``_forward``: the call the bound makes for each frontier after the first);
* **bound, the models**: ``bound(branching(8, 7), draft, target, process=..., prefix=ctx, budget=256)`` on the
  two decoding models on the device (each frontier of up to 64 prefixes scored in one tree-attention call per
  model, the laws left there as float64 tensors: the torch route), its model calls included;
* **laws as tensors**: the bound's arithmetic alone on the laws the models gave (recorded once), as float64
  tensors on the device (``bench_tree_bound``'s ``_record_laws``/``_TensorLaws``: the torch route);
* **laws as arrays**: the same on the same laws as numpy arrays on the host (the numba row kernels when numba is
  installed, else numpy: the header says which).

Columns: ms (median), its spread, the share of the forward, the verdict against 0.10 (``MISS`` where above;
the models' row holds its own model calls, so it gets none), host reads and aten operations per bound (views left
out: ``bench_tree_bound``'s ``_Counts``/``_count_ops``), the bound's value and its relative difference from the
models' run (the routes agree to a relative 1e-12 by the bound's documentation; the line under each table prints
the largest difference and says whether it is within that).

The numba kernels are compiled (or loaded from numba's cache) on tiny calls before any timing, and the first
round of every table is an untimed warm-up. ``--budget-s`` stops starting new tables once spent (the tables
already printed stand). The device's name, torch's version, the date and the load average are printed with the
tables; each table's rows are printed (and flushed) as soon as its rounds end, and a table that fails prints its
traceback while the later tables still run (the exit status is then 1, as when the routes differ).

    python experiments/gpu_tree_bound.py                  # the SmolLM2-135M shape on cuda, bfloat16, T = 1 and 0.12
    python experiments/gpu_tree_bound.py --tiny           # a tiny shape on the CPU, well under a minute
    python experiments/gpu_tree_bound.py --device cpu --dtype float32 --sharpen 1 --threads 2
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import Shape, _guarded, check_device_arg, device_card, llama_config  # noqa: E402

#: The stated target: the bound within 10 % of the target forward that scores the tree.
TARGET = 0.10

#: The routes' stated agreement (the bound's docstring: the numpy, numba and torch routes agree to 1e-12).
AGREE = 1e-12

#: Named shapes: SmolLM2-135M-Instruct's (its draft keeps :data:`otspec.decoding.real.DEFAULT_KEEP`, 24 of 30
#: layers) and a tiny one for the CPU (its draft keeps the first layer).
SHAPES = {
    "smollm2-135m": Shape(576, 30, 9, 3, 1536, 49_152, 24, "bfloat16"),
    "tiny": Shape(64, 4, 4, 2, 128, 2048, 1, "float32"),
}

#: What each size runs: the tree, the budget and batch of the bound, the context and the timing rounds.
PLANS = {
    "full": dict(branching=(8, 7), budget=256, batch=64, context=32, repeat=7),
    "tiny": dict(branching=(8, 7), budget=32, batch=16, context=8, repeat=3),
}

HEAD = ("what", "ms", "spread", "/ forward", "verdict", "host reads", "aten ops", "bound", "rel. diff")
WIDTHS = (52, 9, 8, 9, 9, 10, 9, 19, 9)


def _row(cells) -> None:
    print(" | ".join(str(c).rjust(w) for c, w in zip(cells, WIDTHS)), flush=True)


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def build_pair(shape: Shape, device, dtype: str, seed: int = 0):
    """The random-weight ``(draft, target)`` transformers models of ``shape`` on ``device`` in ``dtype``: tied
    embeddings; the draft :func:`otspec.decoding.layer_skip_draft` of the target (an independent copy keeping
    :data:`otspec.decoding.real.DEFAULT_KEEP` for SmolLM2's 30 layers and 24 draft layers, else the first
    ``draft_layers``)."""
    import torch
    from transformers import LlamaForCausalLM

    from otspec.decoding import layer_skip_draft
    from otspec.decoding.real import DEFAULT_KEEP

    cfg = llama_config(shape, tie=True)
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(cfg).to(getattr(torch, dtype)).eval()
    if target.lm_head.weight.data_ptr() != target.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("the target's output head is not tied to its embedding")
    keep = DEFAULT_KEEP if (shape.layers, shape.draft_layers) == (30, 24) else tuple(range(shape.draft_layers))
    return layer_skip_draft(target, keep), target, keep


def sharpen(models, norms, T: float) -> None:
    """Divide the logits of each model by ``T``: its final norm's weight set to the original ``norms`` / ``T``
    (the logits are linear in it: ``W (g * x) / T = W ((g / T) * x)``; the tied embedding is left as it is)."""
    import torch

    with torch.no_grad():
        for m, g in zip(models, norms):
            m.model.norm.weight.copy_(g / T)


def _entropy(laws: dict) -> float:
    """Mean entropy (nats) of the target's recorded laws (``{path: (draft law, target law)}``)."""
    ent = []
    for _p, q in laws.values():
        q = q[q > 0]
        ent.append(float(-(q * np.log(q)).sum()))
    return float(np.mean(ent))


def run_table(B, bench, shape_tree, draft, target, ctx, device, process: str, plan: dict, T: float,
              repeat: int) -> dict:
    """One table: the forward, the bound on the models, on the laws as tensors on ``device`` and as arrays on the
    host, timed in interleaved rounds; rows printed as measured. Returns ``{"process", "T", "rel", "drift",
    "share"}``: the largest relative difference of the routes from the models' run, the models' rerun's, and each
    route's share of the forward."""
    from otspec._timing import synchronize, timed_rounds
    from otspec.tree import bound

    budget, batch = plan["budget"], plan["batch"]

    def with_models():
        return bound(shape_tree, draft, target, process=process, prefix=ctx, budget=budget, batch=batch)

    got = {}

    def recorded():
        got["models"] = with_models()

    rec = bench._record_laws(B, recorded)          # one run of the models records the laws the bound read
    res = got["models"]
    tensor_laws = bench._TensorLaws(rec, device)
    array_laws = bench._TensorLaws(rec, None, stack=False)

    def on(laws):
        laws.calls = 0
        return B._sampled(B._Slots(shape_tree), process, laws, budget, batch)

    routes = {"tensors": lambda: on(tensor_laws), "arrays": lambda: on(array_laws)}
    values = {k: fn() for k, fn in routes.items()}
    synchronize(device)
    rel = {k: max(abs(v.value - res.value), abs(v.remainder - res.remainder)) / res.value for k, v in values.items()}
    forward = bench._forward(target, ctx, device)
    calls = {"forward": forward, "models": with_models, **routes}
    counts = {}
    for k, fn in calls.items():
        with bench._Counts() as c:
            fn()
        counts[k] = (c.reads, bench._count_ops(fn))
    t0 = time.perf_counter()
    before = _load()
    tm = timed_rounds(calls, device=device, warmup=1, repeats=repeat)
    after = _load()
    again = with_models()                          # the models rerun: the same laws, or the device's rounding
    drift = max(abs(again.value - res.value), abs(again.remainder - res.remainder)) / res.value
    fwd = tm["forward"].median
    ent = _entropy(rec)
    print(f"\n# {process}: branching{plan['branching']} ({shape_tree.n} nodes), budget {budget}, {batch} prefixes "
          f"per call; T = {T:g} (mean entropy of the target's laws at the {len(rec)} expanded prefixes {ent:.2f} "
          f"nats; log V = {math.log(target.vocab_size):.2f}); {res.n_calls} calls per model, {res.n_expanded} "
          f"expanded, complete {res.complete}, pi exact {res.pi_exact}", flush=True)
    _row(HEAD)
    labels = {"forward": "forward: the target's call on the 64-node tree",
              "models": f"bound, the models on {device} ({res.n_calls} calls each)",
              "tensors": f"bound, laws as float64 tensors on {device}",
              "arrays": "bound, laws as numpy arrays on the host"}
    vals = {"forward": None, "models": res, **values}
    for k in calls:
        share = tm[k].median / fwd
        verdict = ("" if k == "forward" else "(calls)" if k == "models" else
                   "ok" if share <= TARGET else "MISS")
        v = vals[k]
        _row((labels[k], f"{1e3 * tm[k].median:.3f}", f"+-{1e3 * tm[k].spread:.3f}", f"{share:.3f}", verdict,
              counts[k][0], counts[k][1], "" if v is None else f"{v.value:.15g}",
              "" if k in ("forward",) else "0" if k == "models" else f"{rel[k]:.1e}"))
    worst = max(rel.values())
    print(f"# routes' largest relative difference from the models' run {worst:.1e}: "
          f"{'agree' if worst <= AGREE else 'DIFFER'} (stated {AGREE:.0e}); the models rerun: {drift:.1e}; "
          f"timed {time.perf_counter() - t0:.1f} s; load average {before} / {after}", flush=True)
    return {"process": process, "T": T, "rel": worst, "drift": drift, "share": {k: tm[k].median / fwd for k in calls}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="default smollm2-135m (tiny with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape and plan, on the CPU unless --device")
    ap.add_argument("--device", default=None, help="torch device (default cuda, or cpu with --tiny)")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="the pair's dtype (default the shape's: bfloat16 for SmolLM2's, float32 for tiny)")
    ap.add_argument("--sharpen", type=float, nargs="+", default=None, metavar="T",
                    help="divide the logits by T (T < 1: peaked laws); one table per T (default 1 0.12, the second near the real pair's "
                    "entropy; 1 0.08 with --tiny)")
    ap.add_argument("--process", nargs="+", default=["iid", "wor"], choices=("iid", "wor"))
    ap.add_argument("--repeat", type=int, default=None, help="timed rounds (default 7; 3 with --tiny)")
    ap.add_argument("--budget-s", type=float, default=100.0, help="start no new table after this many seconds")
    ap.add_argument("--threads", type=int, default=1, help="torch threads on a CPU device")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not (np.isfinite(args.budget_s) and args.budget_s >= 0):
        ap.error(f"--budget-s must be a finite number of seconds >= 0, got {args.budget_s}")
    if args.sharpen is not None and not all(np.isfinite(t) and t > 0 for t in args.sharpen):
        ap.error(f"--sharpen must be finite numbers > 0, got {args.sharpen}")
    if args.repeat is not None and args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.threads < 1:
        ap.error(f"--threads must be at least 1, got {args.threads}")
    t_start = time.perf_counter()
    import bench_tree_bound as bench
    import torch
    import transformers

    import otspec.tree._bound as B
    import otspec.tree._bound_kernels as K
    from otspec.decoding import HFCausalLM
    from otspec.models import MemorylessModel
    from otspec.tree import TreeShape, bound

    transformers.logging.set_verbosity_error()
    name = args.shape or ("tiny" if args.tiny else "smollm2-135m")
    shape = SHAPES[name]
    plan = PLANS["tiny" if args.tiny else "full"]
    dtype = args.dtype or shape.dtype
    temps = args.sharpen or ([1.0, 0.08] if args.tiny else [1.0, 0.12])
    repeat = args.repeat or plan["repeat"]
    device = args.device or ("cpu" if args.tiny else "cuda")
    why = check_device_arg(device)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    device = torch.device(device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    card = device_card(str(device)) + (f", {args.threads} torch thread(s)" if device.type == "cpu" else "")
    print(f"# gpu_tree_bound: {name} {shape} in {dtype} on {device} ({card}); "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {_load()}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, numpy {np.__version__}; host kernels "
          f"{'numba' if K.JIT else 'numpy (numba not installed)'}; sharpen T = {' '.join(f'{t:g}' for t in temps)}",
          flush=True)

    # the kernels compiled (or loaded from numba's cache) on tiny calls, outside every timing
    t0 = time.perf_counter()
    small = MemorylessModel(np.full(600, 1 / 600))
    for process in args.process:
        bound(TreeShape.branching(3, 2), small, small, process=process, budget=4)
    print(f"# host kernels' first calls (compile or load from cache) {time.perf_counter() - t0:.1f} s", flush=True)

    t0 = time.perf_counter()
    d_model, t_model, keep = build_pair(shape, device, dtype, args.seed)
    draft, target = HFCausalLM(d_model, name="draft"), HFCausalLM(t_model, name="target")
    norms = [m.model.norm.weight.detach().clone() for m in (d_model, t_model)]
    ctx = np.random.default_rng(args.seed).integers(3, shape.vocab, size=plan["context"]).tolist()
    skipped = [i for i in range(shape.layers) if i not in keep]
    print(f"# pair built in {time.perf_counter() - t0:.1f} s: target {sum(p.numel() for p in t_model.parameters())}"
          f" parameters (embedding tied), draft {len(keep)} of {shape.layers} layers"
          + (f" ({skipped[0]}-{skipped[-1]} skipped)" if skipped and skipped == list(range(skipped[0], skipped[-1] + 1))
             else "") + f"; context {len(ctx)} random tokens", flush=True)
    tree = TreeShape.branching(*plan["branching"])
    results, skipped_parts, failed = [], [], 0
    for T in temps:
        sharpen((d_model, t_model), norms, T)
        for process in args.process:
            if time.perf_counter() - t_start >= args.budget_s:
                skipped_parts.append(f"{process} T={T:g}")
                continue
            # a table's failure is printed with its traceback and the later tables still run
            ok = _guarded(f"{process} T={T:g}", lambda p, t: results.append(
                run_table(B, bench, tree, draft, target, ctx, device, p, plan, t, repeat)), process, T)
            failed += not ok
    if skipped_parts:
        print(f"# budget spent ({args.budget_s:g} s): skipped {', '.join(skipped_parts)}", flush=True)
    if results:
        worst = max(r["rel"] for r in results)
        print(f"# all tables: routes' largest relative difference {worst:.1e}: "
              f"{'agree' if worst <= AGREE else 'DIFFER'} (stated {AGREE:.0e})", flush=True)
    print(f"# total {time.perf_counter() - t_start:.1f} s; load average {_load()}", flush=True)
    return 0 if not failed and all(r["rel"] <= AGREE for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
