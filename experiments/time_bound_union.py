"""Time ``otspec.tree.bound`` with ``method="union"`` beside ``method="paths"`` at V = 49,152 (a 64-node tree,
budget 256), on LLM-like laws (softmax of Gumbel logits at temperature 1.5, one law per prefix, memoised).

Usage: ``python experiments/time_bound_union.py [--budget 256] [--V 49152]``. Prints each method's seconds (best
of two runs, the same laws), their ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


class _Laws:
    """A model through the Model protocol: a fixed random law per prefix (seeded by the prefix), memoised."""

    def __init__(self, V: int, seed: int):
        self.vocab_size, self.seed, self.cache = V, seed, {}

    def next_dist(self, prefix):
        key = tuple(int(t) for t in prefix)
        if key not in self.cache:
            g = np.random.default_rng([self.seed, len(key), *key[-3:]])
            z = g.gumbel(size=self.vocab_size) * 1.5
            e = np.exp(z - z.max())
            self.cache[key] = e / e.sum()
        return self.cache[key]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--V", type=int, default=49_152)
    args = ap.parse_args(argv)
    from otspec.tree import TreeShape, bound

    shape = TreeShape.branching(8, 7)
    for process in ("iid", "wor"):
        draft, target = _Laws(args.V, 1), _Laws(args.V, 2)
        got = {}
        for method in ("paths", "union", "paths", "union"):
            t0 = time.perf_counter()
            r = bound(shape, draft, target, process=process, prefix=(1,), budget=args.budget, method=method)
            dt = time.perf_counter() - t0
            got[method] = (min(dt, got.get(method, (np.inf,))[0]), r.value)
        print(f"{process}: paths {got['paths'][0]:.2f} s (B = {got['paths'][1]:.4f}), union {got['union'][0]:.2f} s "
              f"(B* = {got['union'][1]:.4f}), ratio {got['union'][0] / got['paths'][0]:.2f}; "
              f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
