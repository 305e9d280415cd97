"""Benchmark: the exact enumeration of the draws without replacement, rows enumerated per second.

``otspec.tree.bound`` (:class:`otspec.tree._bound._DrawLaws`) enumerates the ordered draws of a row whose
support is small (``perm(n, need) * V <= _MAX_WOR_ENUMERATION``) and sums their probabilities into the laws of the
used ranks; :func:`otspec.tree.enumerate_trees` (the tree value and optimum) enumerates them at every node. For
``V = 12, 20, 40`` and ``need = 3, 4`` draws, rows of the largest support the bound enumerates at ``V`` (Dirichlet
masses on ``n`` random tokens, the others 0): the wall time of ``_wor_draw_laws`` on ``--rows`` rows (every rank
``0 .. need - 1``), and, with ``--against DIR`` (another checkout, e.g. the code before the change, imported as
``otspec_against``), that checkout's on the same rows, timed interleaved in the same rounds (``_bench``, medians),
whether the two give the same laws to the bit, and the sums each forms over the mass not yet drawn (the code
before: one ``math.fsum`` a draw of a sequence, ``need * perm(n, need)`` a row; now one a drawn set,
``sum_{k < need} C(n, k)``, counted by the kernel). A second table: :func:`otspec.tree.enumerate_trees` on a
one-node ``wor`` shape. The 1-minute load average and the UTC date are printed.

    python experiments/bench_wor_enumeration.py --against /path/to/old/checkout --rst
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import time

import numpy as np
from _bench import load_against, print_table, timeit_many

from otspec.models import MemorylessModel
from otspec.tree import TreeShape, _process, enumerate_trees
from otspec.tree import _bound as B
from otspec.tree import _bound_kernels as K

CASES = [(12, 3), (12, 4), (20, 3), (20, 4), (40, 3), (40, 4)]


def _rows(V, need, m, rng):
    """``m`` rows of the largest support that the bound enumerates at ``V`` with ``need`` draws."""
    n = max(k for k in range(need, V + 1) if math.perm(k, need) * V <= B._MAX_WOR_ENUMERATION)
    P = np.zeros((m, V))
    for i in range(m):
        P[i, rng.choice(V, n, replace=False)] = rng.dirichlet(np.full(n, 0.5))
    return P, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="another checkout to time beside this one")
    ap.add_argument("--rows", type=int, default=2, help="rows per timed call")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rst", action="store_true")
    args = ap.parse_args()
    OB = OP = None
    if args.against:
        mod = load_against(args.against, ["tree", "tree._bound", "tree._process"])
        OB, OP = mod.tree._bound, mod.tree._process
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()[0]:.2f}, "
          f"numba kernel: {K.WOR_JIT}", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for V, need in CASES:
        P, n = _rows(V, need, args.rows, rng)
        ranks = list(range(need))
        fns = [lambda P=P, ranks=ranks: B._wor_draw_laws(P, ranks)]
        if OB is not None:
            fns.append(lambda P=P, ranks=ranks: OB._wor_draw_laws(P, ranks))
        t = timeit_many(fns, repeat=args.repeat, min_time=0.05)
        off, binom = _process._wor_tables(n, need)
        sup = np.flatnonzero(P[0] > 0)
        sums = K.wor_enumerate(np.ascontiguousarray(P[0, sup]), sup, need, off, binom, np.zeros(0, dtype=np.int64),
                               np.zeros((0, need), dtype=np.int64), np.zeros(0), np.zeros((0, 0)))
        row = [V, need, n, math.perm(n, need), sums, args.rows / t[0]]
        if OB is not None:
            same = np.array_equal(B._wor_draw_laws(P, ranks)[0].view(np.int64),
                                  OB._wor_draw_laws(P, ranks)[0].view(np.int64))
            row[4:4] = [need * math.perm(n, need)]
            row += [args.rows / t[1], t[1] / t[0], "yes" if same else "NO"]
        rows.append(tuple(row))
    head = ["V", "need", "support", "draws a row", "sums a row", "rows/s"]
    if OB is not None:
        head[4:4] = ["sums a row (before)"]
        head += ["rows/s (before)", "speed-up", "same bits"]
    print_table("_wor_draw_laws: rows enumerated per second (wall-clock medians of interleaved rounds)", head, rows, args.rst)

    trees = []
    for V, need in [(10, 3), (12, 3), (10, 4)]:
        shape = TreeShape.branching(need)
        law = np.random.default_rng(V + need).dirichlet(np.ones(V))
        draft = MemorylessModel(law)
        fns = [lambda shape=shape, draft=draft: enumerate_trees(shape, draft, process="wor")]
        if OP is not None:
            oshape = OP.TreeShape.branching(need)
            odraft = mod.models.MemorylessModel(law)
            fns.append(lambda oshape=oshape, odraft=odraft: OP.enumerate_trees(oshape, odraft, process="wor"))
        t = timeit_many(fns, repeat=args.repeat, min_time=0.05)
        row = [V, need, math.perm(V, need), t[0] * 1e3]
        if OP is not None:
            a = enumerate_trees(shape, draft, process="wor")
            b = OP.enumerate_trees(oshape, odraft, process="wor")
            same = len(a) == len(b) and all(x[1] == y[1] and np.array_equal(x[0].tokens, y[0].tokens)
                                            for x, y in zip(a, b))
            row += [t[1] * 1e3, t[1] / t[0], "yes" if same else "NO"]
        trees.append(tuple(row))
    head = ["V", "draws (branching(need))", "trees", "ms"]
    if OP is not None:
        head += ["ms (before)", "speed-up", "same trees and bits"]
    print_table("enumerate_trees, one wor node (wall-clock medians of interleaved rounds)", head, trees, args.rst)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.1f} s")
