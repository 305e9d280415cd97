"""Benchmark: the check of a law on reading (``validate_distribution`` of a float64 row) against another checkout.

512 rows of ``V = 49,152`` (the laws a tree bound with a budget of 256 reads: softmax laws of Gaussian logits,
a draft and a target 0.3 apart in logit), each checked as every ``next_dist`` model's law is, and
``otspec.tree.bound`` on ``branching(8, 7)`` (i.i.d., budget 256) over a ``next_dist`` model of those laws ("laws
given"); CPU time (``time.process_time``) medians of interleaved rounds, this checkout and ``--against DIR``
(imported as ``otspec_against``) alternating, the 1-minute load average and the minor page faults per call.

Usage: python experiments/bench_law_check.py --against DIR [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tree_bound import _load_against  # noqa: E402

V = 49152


class _Laws:
    """A ``next_dist`` model whose laws are made on first use and then read from memory."""

    def __init__(self, shift: bool):
        self.vocab_size, self.shift, self.laws = V, shift, {}

    def next_dist(self, prefix):
        prefix = tuple(prefix)
        if prefix not in self.laws:
            seed = [7, *prefix]
            z = 3.0 * np.random.default_rng(seed).standard_normal(V)
            if self.shift:
                z = z + 0.3 * np.random.default_rng([8, *prefix]).standard_normal(V)
            x = np.exp(z - z.max())
            self.laws[prefix] = x / x.sum()
        return self.laws[prefix]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    from otspec._validation import validate_distribution
    from otspec.tree import TreeShape, bound

    OB, OShape = _load_against(args.against)
    import otspec_against._validation as OV

    d, t = _Laws(False), _Laws(True)
    shape = TreeShape.branching(8, 7)
    new = bound(shape, d, t, process="iid", budget=256, batch=64)
    old = OB.bound(OShape.branching(3, 2), d, t, process="iid", budget=4)
    old = OB.bound(OShape.branching(8, 7), d, t, process="iid", budget=256, batch=64)
    assert float(new.value) == float(old.value), (new.value, old.value)
    rows = list(d.laws.values()) + list(t.laws.values())
    held = [None] * len(rows)

    def check(f):
        def run():
            for i, r in enumerate(rows):
                held[i] = f(r, "p")
        return run

    fns = {"check, this": check(validate_distribution), "check, before": check(OV.validate_distribution),
           "laws given, this": lambda: bound(shape, d, t, process="iid", budget=256, batch=64),
           "laws given, before": lambda: OB.bound(OShape.branching(8, 7), d, t, process="iid", budget=256, batch=64)}
    got = {k: [] for k in fns}
    flt = {k: [] for k in fns}
    load0 = os.getloadavg()[0]
    for r in range(args.repeat + 1):
        for k, f in fns.items():
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0 = time.process_time()
            f()
            if r:
                got[k].append(time.process_time() - c0)
                flt[k].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(f"{len(rows)} rows of V = {V}; load {load0:.2f} -> {os.getloadavg()[0]:.2f}; bound {float(new.value)!r} "
          f"(before: {float(old.value)!r})")
    for k in fns:
        print(f"{k:20s} CPU ms {1e3 * float(np.median(got[k])):8.1f}   minor faults {int(np.median(flt[k]))}")


if __name__ == "__main__":
    main()
