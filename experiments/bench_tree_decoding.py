"""Benchmark: the tree decoding loop's own time, outside the models' forward passes (SmolLM2 pair, CPU).

``speculative_decode(tree=..., process=...)`` on the real pair of ``otspec.decoding.smollm2_pair`` (target
SmolLM2-135M-Instruct, draft = its 24-of-30-layer copy), one torch thread. The draft and the target are
wrapped so that every forward call (``logits``: the draft's call per depth; ``tree_logits``: the target's
one call) and every KV-cache ``select`` is timed, wall clock (``time.perf_counter``) and CPU
(``time.process_time``). The loop's time outside forward passes is the run's ``wall_time`` (which already
excludes the exact-prediction bookkeeping) minus the forward calls; its CPU counterpart is the process's CPU
time over the run minus the forward calls' CPU and the bookkeeping's CPU. Target: at most 10 % of an
iteration. ``select`` (the draft's rows chosen per depth, the accepted row kept) is loop time, shown apart.

Configurations: a 16-node shape of depth 4 (4 children at the root, rank paths below), filled by
``process="topk"`` and verified by the target-only rule, and the same shape filled by ``process="iid"`` and
verified by SpecInfer's rule; ``--eagle2`` adds EAGLE-2's dynamic tree (depth 4, top_k 4, 16 nodes).
Sampling at temperature 1, the full vocabulary (V = 49,152). Prompts: the first ``--prompts`` chat prompts
in SmolLM2's chat template; ``--tokens`` new tokens each; fixed seeds.

Part 2 -- the target's cache after verification. The target's tree call cannot keep the accepted path
(it is known only after the call), so the loop scores with no ``keep`` (the cache holds the context) and
the next call feeds the emitted tokens as its pending tokens, with the next tree. The table times one
16-node tree call with 1 pending token (the root alone) against 4 (three emitted tokens re-fed): the price
of re-feeding; and a call with ``keep=`` a depth-3 node (its path gathered into the cache), the price of the
alternative that keeps a guessed path.

The machine is shared: the load average (``os.getloadavg``, 1/5/15 min) is printed before and after each
run, and the CPU-time ratio is reported beside the wall-clock one.

Usage: python experiments/bench_tree_decoding.py [--prompts 3] [--tokens 48] [--eagle2] [--rst]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

import otspec.decoding as D
import otspec.tree as T
from otspec.decoding._tree_loop import TreeStep

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import print_table, timeit_many  # noqa: E402
from _chat_prompts import CHAT_PROMPTS  # noqa: E402

#: a 16-node shape of depth 4: 4 root children, 6 at depth 2, 4 at depth 3, 2 at depth 4
SHAPE16 = T.TreeShape([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
                       (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1)])
EAGLE2 = T.Eagle2Params(depth=4, top_k=4, total_tokens=17)


class Timed:
    """A LanguageModel (with tree scoring) whose forward calls and ``select`` are timed, wall and CPU."""

    def __init__(self, lm):
        self.lm, self.name = lm, lm.name
        self.vocab_size, self.device = lm.vocab_size, lm.device
        self.reset()

    def reset(self):
        self.fwd = np.zeros(2)  # wall, cpu
        self.sel = np.zeros(2)
        self.calls = 0

    def _timed(self, acc, fn, *a, **kw):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*a, **kw)
        acc += (time.perf_counter() - w, time.process_time() - c)
        return out

    def new_state(self, pad=None):
        return self.lm.new_state() if pad is None else self.lm.new_state(pad=pad)

    def logits(self, state, ids):
        self.calls += 1
        return self._timed(self.fwd, self.lm.logits, state, ids)

    def tree_logits(self, state, parents, tokens, **kw):
        self.calls += 1
        return self._timed(self.fwd, self.lm.tree_logits, state, parents, tokens, **kw)

    def select(self, state, row, length):
        return self._timed(self.sel, self.lm.select, state, row, length)


class AnalysisClock:
    """Times TreeStep._analyse (the exact predictions, excluded from wall_time), wall and CPU."""

    def __init__(self):
        self.acc = np.zeros(2)
        self._orig = TreeStep._analyse
        clock = self

        def timed(step, *a, **kw):
            w, c = time.perf_counter(), time.process_time()
            out = clock._orig(step, *a, **kw)
            clock.acc += (time.perf_counter() - w, time.process_time() - c)
            return out

        TreeStep._analyse = timed

    def restore(self):
        TreeStep._analyse = self._orig


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def run_config(name, kw, prompts, target, draft, tokens):
    """Decode every prompt; the loop's time outside forward passes, wall and CPU."""
    clock = AnalysisClock()
    target.reset()
    draft.reset()
    wall = cpu = 0.0
    iters = emitted = 0
    before = _load()
    try:
        for i, ids in enumerate(prompts):
            c0 = time.process_time()
            res = D.speculative_decode(ids, draft=draft, target=target, max_new_tokens=tokens, rng=100 + i, **kw)
            cpu += time.process_time() - c0
            wall += res.wall_time
            iters += res.iterations
            emitted += int(res.tokens.shape[0])
    finally:
        clock.restore()
    after = _load()
    fwd = target.fwd + draft.fwd
    sel = target.sel + draft.sel
    cpu_loop = cpu - clock.acc[1]
    out_wall, out_cpu = wall - fwd[0], cpu_loop - fwd[1]
    return dict(name=name, iters=iters, tokens=emitted, per_call=emitted / iters, wall=wall, fwd=fwd[0],
                out_wall=out_wall, frac_wall=out_wall / wall, out_cpu=out_cpu, frac_cpu=out_cpu / cpu_loop,
                sel_wall=sel[0], analysis=clock.acc[0], draft_calls=draft.calls, before=before, after=after,
                iter_ms=wall / iters * 1e3, out_ms=out_wall / iters * 1e3)


def part_cache(target, context, rst):
    """One 16-node tree call with 1 pending token vs 4 (three emitted tokens re-fed), and with keep= a depth-3 node."""
    lm = target.lm
    rng = np.random.default_rng(0)
    parents = SHAPE16.parents
    tokens = np.concatenate([[-1], rng.integers(0, lm.vocab_size, SHAPE16.n)])
    keep = int(np.flatnonzero(SHAPE16.depth == 3)[0])
    state = lm.new_state()
    base = len(context) - 4
    lm.logits(state, torch.tensor([context[:base]]))

    def call(t0, k=None):
        def fn():
            lm.tree_logits(state, parents, tokens, pending=context[base : base + t0], keep=k)
            lm.select(state, 0, base)

        return fn

    before = _load()
    times = timeit_many([call(1), call(4), call(1, keep)], repeat=7, min_time=0.2)
    after = _load()
    rows = [("1 pending token (root)", times[0] * 1e3, 1.0), ("4 pending tokens (3 re-fed)", times[1] * 1e3,
                                                                times[1] / times[0]),
            ("1 pending, keep= a depth-3 node", times[2] * 1e3, times[2] / times[0])]
    print_table(f"The target's 16-node tree call (context {base} tokens in the cache; load average before {before}, "
                f"after {after})", ("call", "ms", "ratio to the root alone"), rows, rst)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--eagle2", action="store_true")
    ap.add_argument("--rst", action="store_true")
    args = ap.parse_args(argv)
    tok, target, draft = D.smollm2_pair(threads=1)
    import transformers

    print(f"torch {torch.__version__} ({torch.get_num_threads()} thread), transformers {transformers.__version__}, "
          f"attention {target.model.config._attn_implementation}; CPU ({os.cpu_count()} cores, shared)")
    prompts = []
    for text in CHAT_PROMPTS[: args.prompts]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    t, d = Timed(target), Timed(draft)
    configs = [("16-node shape, topk, target-only", dict(tree=SHAPE16, process="topk", verifier="target-only")),
               ("16-node shape, iid, specinfer", dict(tree=SHAPE16, process="iid", verifier="specinfer"))]
    if args.eagle2:
        configs.append(("EAGLE-2 (4, 4, 17), target-only", dict(tree=EAGLE2)))
    for _, kw in configs:  # warm-up (numba compiles the verifiers' kernels at their first call)
        D.speculative_decode(prompts[0], draft=d, target=t, max_new_tokens=4, rng=0, **kw)
    out = [run_config(name, kw, prompts, t, d, args.tokens) for name, kw in configs]
    before = _load()
    base = [D.autoregressive_decode(target, ids, max_new_tokens=args.tokens, rng=100 + i) for i, ids in enumerate(prompts)]
    base_ms = sum(b.wall_time for b in base) / sum(b.tokens.shape[0] for b in base) * 1e3
    head = ("configuration", "iterations", "tokens / call", "ms / iteration", "forward ms / it", "outside ms / it",
            "outside (wall)", "outside (CPU)", "of which select ms / it", "ms / token", "load before", "load after")
    rows = [(r["name"], r["iters"], r["per_call"], r["iter_ms"], r["iter_ms"] - r["out_ms"], r["out_ms"],
             r["frac_wall"], r["frac_cpu"], r["sel_wall"] / r["iters"] * 1e3, r["iter_ms"] / r["per_call"], r["before"],
             r["after"]) for r in out]
    print_table(f"The loop's time outside forward passes ({args.prompts} prompts x {args.tokens} tokens, "
                "SmolLM2-135M pair, 1 torch thread)", head, rows, args.rst, target=("outside (wall)", 0.10))
    print(f"\nAutoregressive decoding of the target, same prompts and tokens: {base_ms:.0f} ms / token "
          f"(load average before {before}, after {_load()}).")
    print("\nCPU-time target too: " + ", ".join(f"{r['name']}: {r['frac_cpu']:.3f}" for r in out))
    part_cache(t, prompts[0], args.rst)


if __name__ == "__main__":
    main()
