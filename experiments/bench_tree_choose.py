"""Benchmark: choosing tree shapes (Sequoia's dynamic programme, the exact best top-k shape, greedy growth),
and the tree optima LPs.

Usage: python experiments/bench_tree_choose.py [--quick] [--rst]

Targets: ``otspec.tree.sequoia`` for ``n <= 256`` draft tokens and ``depth <= 12`` in under 1 s (acceptance
vector of length 256, the worst case: every rank may be used); ``best_shape`` and ``optimum`` are timed for
reference (no stated target). Medians of repeated runs after a warm-up, fixed seeds; the machine is shared, so
compare rows of one run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from otspec.models import MarkovModel, random_markov_model
from otspec.tree import TreeShape, best_shape, greedy_shape, optimum, sequoia

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import print_table, timeit  # noqa: E402


def part_sequoia(quick, rst):
    rng = np.random.default_rng(0)
    rows = []
    grid = [(64, 6), (128, 12), (256, 12)] if quick else [(16, 4), (64, 6), (64, 12), (128, 8), (128, 12),
                                                          (256, 6), (256, 8), (256, 12)]
    vectors = []
    for K in (8, 256):
        # a measured-looking acceptance vector: decreasing, summing to about 0.9
        vectors.append(("flat", np.sort(rng.dirichlet(np.full(K, 0.3)))[::-1] * 0.9))
    # the worst case: rank 0 nearly always accepted, so the depth limit binds at every level
    vectors.append(("deep", np.concatenate([[0.95], np.full(255, 0.04 / 255)])))
    for kind, a in vectors:
        for n, depth in grid:
            t = timeit(lambda: sequoia(a, n, depth), repeat=3, min_time=0.0)
            value, shape = sequoia(a, n, depth)
            rows.append((kind, len(a), n, depth, t, value, shape.max_depth))
    print_table("sequoia(acceptance, n, depth): time per call (s)",
                ("acceptance", "K", "n", "depth", "time s", "E[tau]", "tree depth"), rows, rst,
                target=("time s", 1.0))


def _llm_like_markov(V, rng):
    """A first-order Markov pair with LLM-like rows: softmax of Gaussian logits, the draft's logits perturbed."""
    logits = rng.normal(0, 3.0, (V, V))
    noise = logits + rng.normal(0, 1.0, (V, V))

    def soft(x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    init_t, init_d = soft(logits[:1]), soft(noise[:1])
    return MarkovModel(soft(noise), initial=[init_d[0]]), MarkovModel(soft(logits), initial=[init_t[0]])


def part_best_shape(quick, rst):
    rng = np.random.default_rng(1)
    rows = []
    for V in (64, 1024) if not quick else (64,):
        draft, target = _llm_like_markov(V, rng)
        for n, m in ((64, 1), (64, 16), (256, 1)) if not quick else ((64, 1),):
            ctx = [(int(c),) for c in rng.integers(0, V, m)]
            tb = timeit(lambda: best_shape(draft, target, n, contexts=ctx, depth=8), repeat=3, min_time=0.0)
            tg = timeit(lambda: greedy_shape(draft, target, n, contexts=ctx, depth=8), repeat=3, min_time=0.0)
            vb = best_shape(draft, target, n, contexts=ctx, depth=8).value
            vg = greedy_shape(draft, target, n, contexts=ctx, depth=8).value
            rows.append((V, n, m, tb, tg, vb, vg))
    print_table("best_shape vs greedy_shape (top-k process, depth <= 8)",
                ("V", "n", "contexts", "best s", "greedy s", "best E[tau]", "greedy E[tau]"), rows, rst)


def part_optimum(quick, rst):
    rng = np.random.default_rng(2)
    draft, target = random_markov_model(3, rng=rng), random_markov_model(3, rng=rng)
    shapes = [TreeShape([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), TreeShape.chains(2, 3)]
    rows = []
    for shape in shapes[:1] if quick else shapes:
        for process in ("iid", "wor"):
            for one in (True, False):
                t = timeit(lambda: optimum(shape, draft, target, process=process, one_token=one), repeat=1,
                           min_time=0.0)
                res = optimum(shape, draft, target, process=process, one_token=one)
                rows.append((shape.n, shape.max_depth, process, "OPT_1" if one else "OPT_c", res.n_trees, res.n_keys,
                             res.n_variables, t, res.value))
    print_table("optimum(shape, ...) on V = 3 (depth-3 trees)",
                ("n", "depth", "process", "optimum", "trees", "classes", "LP columns", "time s", "E[tau]"), rows, rst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rst", action="store_true")
    args = ap.parse_args()
    part_sequoia(args.quick, args.rst)
    part_best_shape(args.quick, args.rst)
    part_optimum(args.quick, args.rst)


if __name__ == "__main__":
    main()
