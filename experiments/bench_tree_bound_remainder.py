"""Benchmark: the bound's remainder summed as nonnegative terms, against another checkout (the code before).

``otspec.tree._bound._sampled`` of this checkout and of ``--against`` (imported as ``otspec_against`` by
``experiments/_bench.py``'s ``load_against``) on the same laws, interleaved in every round after a warm-up, median
CPU time (``time.process_time``) of one call: ``V = 49,152``, 16 LLM-like draft/target rows (``llm_like``) picked
by the prefix, batch 64, one torch thread; the host route (numpy rows, the numba row kernels), the numpy route
(kernels off) and the torch route (float64 CPU tensors). Also the largest relative difference of ``per_depth``
between the two checkouts. The 1-minute load average is printed before and after (the machine is shared).

Usage: python experiments/bench_tree_bound_remainder.py --against DIR [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import llm_like, load_against  # noqa: E402

V, ROWS = 49152, 16
#: (process, branching dims, budget, route)
CASES = [("iid", (8, 7), 256, "host"), ("iid", (4, 3, 2), 256, "host"), ("wor", (4, 3, 2), 256, "host"),
         ("iid", (2, 2, 2, 2), 1024, "host"), ("iid", (4, 3, 2), 256, "torch"), ("wor", (4, 3, 2), 256, "torch"),
         ("iid", (4, 3, 2), 256, "numpy")]


class _Laws:
    """``paths -> (P, Q)``: rows of a fixed bank picked by the prefix, numpy blocks or CPU tensors."""

    def __init__(self, P, Q, tensor: bool):
        self.P, self.Q, self.tensor, self.calls = P, Q, tensor, 0

    def __call__(self, paths):
        self.calls += 1
        k = [hash(tuple(s)) % ROWS for s in paths]
        P, Q = self.P[k], self.Q[k]
        return (torch.from_numpy(P), torch.from_numpy(Q)) if self.tensor else (P, Q)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, help="another checkout (e.g. the code before a change)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import otspec.tree._bound as new
    from otspec.tree import TreeShape

    old = load_against(args.against, ["tree._bound"]).tree._bound
    jit = {mod.__name__: mod._K.JIT for mod in (old, new)}
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    pairs = [llm_like(V, rng) for _ in range(ROWS)]
    P, Q = np.stack([p for p, _ in pairs]), np.stack([q for _, q in pairs])
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("case | old s | new s | new/old | largest relative difference of per_depth")
    for process, dims, budget, route in CASES:
        shape = TreeShape.branching(*dims)
        for mod in (old, new):
            mod._K.JIT = jit[mod.__name__] and route != "numpy"      # the numpy route: the row kernels off
        res, t = {}, {"old": [], "new": []}
        for _ in range(args.repeat + 1):                   # the first round is the warm-up (numba's load)
            for mod, name in ((old, "old"), (new, "new")):
                t0 = time.process_time()
                res[name] = mod._sampled(mod._Slots(shape), process, _Laws(P, Q, route == "torch"), budget, 64)
                t[name].append(time.process_time() - t0)
        a, b = res["old"].per_depth, res["new"].per_depth
        rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-300)))
        mo, mn = statistics.median(t["old"][1:]), statistics.median(t["new"][1:])
        print(f"{process} branching{dims}, budget {budget}, {route} | {mo:.3f} | {mn:.3f} | {mn / mo:.2f} | {rel:.1e}")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
