"""Benchmark: exact alpha_k (one sort) vs the reduced LP vs the tuple LP vs POT's ot.emd.

Everything is measured side by side in one run (this machine is shared and
noisy): the median of repeated timings, after a warm-up, with fixed seeds.
Ratios are printed relative to the reference in the same row.

Usage: python experiments/bench_alpha_k.py [--quick] [--rst]

Targets (issue 2): exact at n = 262,144, k = 8 within 3x numpy's argsort of
the same vector; the reduced LP solves n = 12, k = 4 in under 5 s.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import numpy as np

import otspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import llm_like, print_table, timeit, timeit_many  # noqa: E402


def pot_alpha(p, q, k):
    import ot

    n = len(p)
    tuples = np.array(list(itertools.product(range(n), repeat=k)))
    a = np.prod(p[tuples], axis=1)
    member = np.zeros((len(tuples), n))
    np.put_along_axis(member, tuples, 1.0, axis=1)
    M = 1.0 - member
    plan = ot.emd(a, q, M, numItermax=10_000_000)
    return float((plan * member).sum())


def part_sort(quick, rst):
    rng = np.random.default_rng(0)
    ns = [1_000, 16_384, 262_144] if quick else [1_000, 4_096, 16_384, 65_536, 262_144]
    rows = []
    for n in ns:
        p, q = llm_like(n, rng)
        t_sort, t_exact, t_many = timeit_many(
            [lambda: np.argsort(q / p), lambda: otspec.alpha_k(p, q, 8), lambda: otspec.alpha_k(p, q, list(range(1, 17)))]
        )
        rows.append((n, t_sort * 1e3, t_exact * 1e3, t_exact / t_sort, t_many * 1e3))
    head = ("n", "argsort(q/p) ms", "alpha_k(k=8) ms", "ratio to argsort", "alpha_k(k=1..16) ms")
    print_table("Exact alpha_k vs numpy argsort of the same vector (k = 8); target ratio <= 3", head, rows, rst)


def part_lp(quick, rst):
    rng = np.random.default_rng(1)
    cases = [(4, 2), (8, 2), (4, 3), (6, 3), (12, 4)] if quick else [(4, 2), (8, 2), (16, 2), (4, 3), (6, 3), (8, 3), (5, 4), (12, 4), (16, 4), (10, 6)]
    rows = []
    for n, k in cases:
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        exact = otspec.alpha_k(p, q, k)
        t_exact = timeit(lambda: otspec.alpha_k(p, q, k), repeat=5)
        rep = 3 if math.comb(n + k - 1, k) < 5000 else 1
        t_lp = timeit(lambda: otspec.otm_lp(p, q, k), repeat=rep, min_time=0)
        lp = otspec.otm_lp(p, q, k)
        n_tuple_vars = n ** (k + 1)
        if n_tuple_vars <= 20_000:
            t_tup = timeit(lambda: otspec.otm_lp_tuples(p, q, k), repeat=1, min_time=0)
            err_tup = abs(otspec.otm_lp_tuples(p, q, k).alpha - exact)
            t_pot = timeit(lambda: pot_alpha(p, q, k), repeat=1, min_time=0)
            err_pot = abs(pot_alpha(p, q, k) - exact)
            tup = f"{t_tup * 1e3:.1f} ({t_tup / t_exact:.0f}x)"
            pot = f"{t_pot * 1e3:.1f} ({t_pot / t_exact:.0f}x)"
            errs = f"{abs(lp.alpha - exact):.1e} / {err_tup:.1e} / {err_pot:.1e}"
        else:
            tup = pot = "too large"
            errs = f"{abs(lp.alpha - exact):.1e} / - / -"
        rows.append((n, k, f"{t_exact * 1e6:.0f} us", f"{t_lp * 1e3:.1f} ({t_lp / t_exact:.0f}x)", lp.n_variables, tup, pot, errs))
    head = ("n", "k", "exact", "reduced LP ms (ratio)", "LP vars", "tuple LP cvxpy ms (ratio)", "POT ot.emd ms (ratio)", "|err| LP / tuple / POT")
    print_table("alpha_k: exact vs LPs (ratios to the exact method in the same row)", head, rows, rst)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--rst", action="store_true", help="print reST tables for docs/")
    args = ap.parse_args()
    print(f"numpy {np.__version__}")
    part_sort(args.quick, args.rst)
    part_lp(args.quick, args.rst)


if __name__ == "__main__":
    main()
