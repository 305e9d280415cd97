"""Benchmark: k-Seq's rho* exact (one sort) vs the paper's bisection, and exact acceptances.

Everything is measured side by side in one run (the machine is shared and
noisy): the contenders of a row are timed interleaved, 9 rounds after a
warm-up, and the median of each is reported; fixed seeds.
Ratios are printed relative to the exact method in the same row.

Usage: python experiments/bench_kseq.py [--quick] [--rst]

Pairs are LLM-like: target = softmax of Gaussian logits (sigma = 3), draft =
softmax of the same logits plus Gaussian noise (sigma = 1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import otspec
from otspec.multidraft._kseq import _f

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import llm_like, print_table, timeit_many  # noqa: E402


def part_rho(quick, rst):
    rng = np.random.default_rng(0)
    ns = [1_000, 16_384, 262_144] if quick else [1_000, 4_096, 16_384, 65_536, 262_144]
    rows = []
    for n in ns:
        p, q = llm_like(n, rng)
        for k in (4, 8):
            exact = otspec.kseq_rho_star(p, q, k)
            bis = [otspec.kseq_rho_star(p, q, k, tol=tol) for tol in (1e-6, 1e-12)]
            t_sort, t_exact, t_b6, t_b12 = timeit_many(
                [
                    lambda: np.argsort(q / p),
                    lambda: otspec.kseq_rho_star(p, q, k),
                    lambda: otspec.kseq_rho_star(p, q, k, tol=1e-6),
                    lambda: otspec.kseq_rho_star(p, q, k, tol=1e-12),
                ]
            )
            row = [n, k, t_sort * 1e3, t_exact * 1e3]
            for b, t_bis in zip(bis, (t_b6, t_b12)):
                row += [t_bis * 1e3, t_bis / t_exact, abs(b - exact)]
            row.append(abs(_f(p, q, k, exact)))
            rows.append(tuple(row))
    head = (
        "n", "k", "argsort ms", "exact ms",
        "bisect 1e-6 ms", "ratio", "abs err",
        "bisect 1e-12 ms", "ratio", "abs err", "f at rho*",
    )
    print_table("rho*: exact (one sort) vs SpecTr's bisection over [1, k] (ratio = bisection / exact)", head, rows, rst)


def part_acceptance(quick, rst):
    rng = np.random.default_rng(1)
    ns = [1_000, 16_384, 262_144] if quick else [1_000, 4_096, 16_384, 65_536, 262_144]
    rows = []
    k = 8
    for n in ns:
        p, q = llm_like(n, rng)
        v = otspec.kseq(p, q, k)
        m = otspec.multiround(p, q, k)
        t_alpha, t_build, t_acc, t_mr = timeit_many(
            [
                lambda: otspec.alpha_k(p, q, k),
                lambda: otspec.kseq(p, q, k),
                lambda: v.acceptance(),
                lambda: otspec.multiround(p, q, k).acceptance(),
            ]
        )
        rows.append(
            (
                n, t_alpha * 1e3, t_build * 1e3, t_acc * 1e3, t_mr * 1e3,
                float(otspec.alpha_k(p, q, k)), v.acceptance(), m.acceptance(),
            )
        )
    head = (
        "n", "alpha_k ms", "kseq() ms", "KSeq.acceptance ms", "multiround()+acc ms",
        "alpha_k", "k-Seq acc", "multi-round acc",
    )
    print_table(f"Exact acceptances at k = {k} (kseq() includes the exact rho* and the residual)", head, rows, rst)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="three sizes instead of five")
    ap.add_argument("--rst", action="store_true", help="print reStructuredText tables")
    args = ap.parse_args(argv)
    print(f"numpy {np.__version__}")
    part_rho(args.quick, args.rst)
    part_acceptance(args.quick, args.rst)


if __name__ == "__main__":
    main()
