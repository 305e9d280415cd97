"""Benchmark: the overhead of otspec.testing.check_sampler per trial (batched), and the sample-size rule.

Part 1 times, interleaved in every repeat (9 rounds after a warm-up, median of each), a check_sampler run
of N trials with a vectorised numpy step and the step alone on the same number of pre-drawn draft
batches; the harness's own overhead per trial is (check - step) / N: drawing the drafts, validating the
step's tokens, counting, the chi-square test. Target: >= 2e6 trials per second at V = 100 (the step
excluded). Rows that miss their target are marked MISS. Fixed seeds.

Part 2 prints the sample size N the rule hands out to detect a TV of 0.1 ... 0.001 at power 0.99 and
false-failure rate 1e-4, for uniform laws on C cells and an LLM-like law on V = 100 tokens (where rare
tokens are pooled), with N * tv^2 (constant when N grows as 1/tv^2) and the time at the measured rate.

Usage: python experiments/bench_testing.py [--quick] [--rst]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from otspec.testing import CHUNK, check_sampler, sample_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import llm_like, print_table, timeit_many  # noqa: E402

TARGET_RATE = 2e6


def speculative_step(p, q):
    """Leviathan et al. (arXiv:2211.17192) Algorithm 1 for one draft, vectorised numpy (p draft, q target)."""
    res = np.maximum(q - p, 0.0)
    cum = np.cumsum(res / res.sum())

    def step(drafts, rng):
        x = drafts[:, 0]
        accept = rng.random(x.shape[0]) * p[x] < q[x]
        y = np.minimum(np.searchsorted(cum, rng.random(x.shape[0]) * cum[-1], side="right"), len(q) - 1)
        return np.where(accept, x, y)

    return step


def part_overhead(quick, rst):
    rows = []
    rng = np.random.default_rng(0)
    Ns = [200_000, 1_000_000] if quick else [200_000, 1_000_000, 4_000_000]
    for V in (100, 1000):
        p, q = llm_like(V, rng)
        spec = speculative_step(p, q)
        steps = {"speculative sampling": spec, "identity (returns draft 0)": lambda d, rng: d[:, 0]}
        for name, step in steps.items():
            for N in Ns:
                gen = np.random.default_rng(1)
                drafts = [np.ascontiguousarray(gen.choice(V, size=(min(CHUNK, N - i), 1), p=p))
                          for i in range(0, N, CHUNK)]
                t_check, t_step = timeit_many(
                    [lambda: check_sampler(step, p, q, n_samples=N, batched=True, rng=2),
                     lambda: [step(d, gen) for d in drafts]],
                    repeat=5 if quick else 9, min_time=0.0)
                over = max(t_check - t_step, 1e-12)
                rate = N / over
                mark = "" if V != 100 else ("ok" if rate >= TARGET_RATE else "MISS")
                rows.append([V, name, N, t_check * 1e3, t_step * 1e3, over / N * 1e9, rate / 1e6,
                             rate / TARGET_RATE, mark])
    print_table(
        "check_sampler overhead per trial, batched (target >= 2e6 trials/s at V = 100, the step excluded)",
        ["V", "step", "N", "check ms", "step ms", "overhead ns/trial", "Mtrials/s", "ratio to target", "mark"],
        rows, rst)
    return min(r[6] for r in rows if r[0] == 100) * 1e6


def part_sample_size(rate, rst):
    tvs = [0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001]
    laws = {"C=2": 2, "C=5": 5, "C=10": 10, "C=100": 100, "LLM-like V=100": llm_like(100, np.random.default_rng(3))[1]}
    rows = []
    for tv in tvs:
        Ns = [sample_size(tv, law, power=0.99, alpha_fail=1e-4) for law in laws.values()]
        rows.append([tv, *Ns, Ns[-1] * tv * tv, Ns[-1] / rate])
    print_table(
        "sample size N at power 0.99, false-failure rate 1e-4 (uniform laws on C cells; LLM-like law with pooling)",
        ["tv", *laws, "N tv^2 (LLM-like)", "harness s (LLM-like)"], rows, rst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rst", action="store_true")
    a = ap.parse_args()
    rate = part_overhead(a.quick, a.rst)
    part_sample_size(rate, a.rst)


if __name__ == "__main__":
    main()
