"""Benchmark: exact alpha_k (one sort) vs the reduced LP vs the tuple LP vs POT's ot.emd.

Everything is measured side by side in one run (this machine is shared and
noisy): the median of repeated timings, after a warm-up, with fixed seeds.
Ratios are printed relative to the reference in the same row.

Usage: python experiments/bench_alpha_k.py [--quick] [--rst] [--batched-only] [--against DIR] [--sorts] [--repeat N]

Targets: exact at n = 262,144, k = 8 within 3x numpy's argsort of
the same vector; the reduced LP solves n = 12, k = 4 in under 5 s.
Targets (batched): ``alpha_k`` of a (192, 49,152) batch within 1.5x
a batched argsort of the same array, and at least 3x faster than the per-row
loop, for numpy and torch (CPU; CUDA too when a GPU is present). Rows that
miss a target are marked ``MISS``. Host batches use every core by default
(``workers=None``: the rows are independent and numpy sorts without the GIL);
the ``workers=1`` row is the serial call. The ``device route`` row runs the
route of CUDA tensors on CPU tensors (host view off, the accelerator's
chunks); the last column counts each torch row's aten ops (views included)
and host reads per call (``experiments/bench_profile_ops.py``'s modes): on a
GPU each op is a launch and each read a synchronisation. ``--against DIR``
times another checkout's ``alpha_k`` (the code before a change) in the same
rounds and counts its ops and reads beside. ``--sorts`` times the ways to
order a batch's rows by ``q/p`` side by side (the argsort of the division,
the stable argsort, numpy's sort of the fused route's ``int64`` keys alone
and with the keys' computation and the exact re-sort of their runs).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

import otspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_profile_ops  # noqa: E402
from _bench import llm_like, load_against, print_table, timeit, timeit_many  # noqa: E402


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
    print_table("Exact alpha_k vs numpy argsort of the same vector (k = 8); target ratio <= 3", head, rows, rst,
                target=("ratio to argsort", 3.0))


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


def _real_batch(rows):
    """(rows, 49152) real next-token laws: the cached SmolLM2 pairs, tiled (synthetic LLM-like if unavailable)."""
    import importlib.util

    path = Path(__file__).resolve().parent / "real_pair_dists.py"
    try:
        spec = importlib.util.spec_from_file_location("real_pair_dists", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        pairs = mod.load_real_pairs(len(mod.PROMPTS) * mod.POSITIONS)
        src = "real SmolLM2 pairs (24, tiled)"
    except Exception as exc:  # noqa: BLE001 - the benchmark still runs on synthetic pairs
        rng = np.random.default_rng(5)
        pairs = [llm_like(49_152, rng) for _ in range(8)]
        src = f"LLM-like synthetic pairs (real pairs unavailable: {type(exc).__name__})"
    P = np.stack([pairs[i % len(pairs)][0] for i in range(rows)])
    Q = np.stack([pairs[i % len(pairs)][1] for i in range(rows)])
    return P, Q, src


@contextmanager
def _device_route(mod):
    """``mod``'s batched alpha_k on host tensors as on a device: no host view (the per-row numpy route), the
    accelerator's chunks where that checkout has them (before: its cache-sized chunks, as its CUDA route)."""
    A = mod.otm._alpha
    saved = {n: getattr(A, n) for n in ("_host_view", "_chunk_elements") if hasattr(A, n)}
    A._host_view = lambda P, Q, xp: None
    if "_chunk_elements" in saved:
        A._chunk_elements = lambda x: A._DEVICE_CHUNK_ELEMENTS
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(A, n, fn)


def _as_is(mod):
    """No patch: ``mod``'s own route for the array's device."""
    return nullcontext()


def _ops_reads(fn):
    """aten ops (views included) and host reads of one ``fn()``, counted by ``bench_profile_ops``'s modes."""
    c = bench_profile_ops.Counts()
    aten, calls = bench_profile_ops._modes(c)
    with aten, calls:
        fn()
    return c.aten, c.reads


def part_batched(quick, rst, against=None, repeat=3):
    rows_n = 48 if quick else 192
    P, Q, src = _real_batch(rows_n)
    other = load_against(against, ("otm._alpha",)) if against else None
    print(f"\nbatch: {P.shape}, {src}" + (f"; before: {against}" if other else ""))
    table = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    backends = [(f"numpy ({cores} threads)", lambda a: a, lambda: None, None, _as_is),
                ("numpy (workers=1)", lambda a: a, lambda: None, 1, _as_is)]
    try:
        import torch

        backends.append((f"torch cpu ({cores} threads)", lambda a: torch.from_numpy(a), lambda: None, None, _as_is))
        # the route of CUDA tensors, run on the CPU: its op and read counts are the device's
        backends.append(("torch cpu, device route", lambda a: torch.from_numpy(a), lambda: None, None, _device_route))
        if torch.cuda.is_available():
            backends.append(("torch cuda", lambda a: torch.from_numpy(a).cuda(), torch.cuda.synchronize, None, _as_is))
    except ImportError:
        pass
    ref = np.array([otspec.alpha_k(P[i], Q[i], 8) for i in range(rows_n)])
    for name, conv, sync, workers, route in backends:
        Pb, Qb = conv(P), conv(Q)
        is_torch = not name.startswith("numpy")

        def sort():
            out = torch.argsort(Qb / Pb, dim=-1) if is_torch else np.argsort(Qb / Pb, axis=-1)
            sync()
            return out

        def call(mod):
            def f():
                with route(mod):
                    out = mod.alpha_k(Pb, Qb, 8, workers=workers)
                sync()
                return out
            return f

        def loop():
            return [otspec.alpha_k(P[i], Q[i], 8) for i in range(rows_n)]

        fns = [sort, call(otspec), loop] + ([call(other)] if other else [])
        times = timeit_many(fns, repeat=repeat, min_time=0)
        t_sort, t_b, t_loop = times[:3]
        r_sort, r_loop = t_b / t_sort, t_loop / t_b
        vals = call(otspec)()
        vals = vals.cpu().numpy() if hasattr(vals, "cpu") else vals
        err = float(np.max(np.abs(vals - ref)))
        counts = "-"
        if is_torch:
            ops, reads = _ops_reads(call(otspec))
            counts = f"{ops} / {reads}"
            if other:
                ops0, reads0 = _ops_reads(call(other))
                counts = f"{ops0} / {reads0} -> {counts}"
        row = [name, f"{t_sort * 1e3:.0f}", f"{t_b * 1e3:.0f}", f"{r_sort:.2f}" + ("" if r_sort <= 1.5 else " MISS")]
        if other:
            row += [f"{times[3] * 1e3:.0f}", f"{t_b / times[3]:.2f}"]
        row += [f"{t_loop * 1e3:.0f}", f"{r_loop:.2f}" + ("" if r_loop >= 3 else " MISS"), f"{err:.1e}", counts]
        table.append(tuple(row))
    head = ["backend", "batched argsort(q/p) ms", "batched alpha_k ms", "ratio to argsort (<= 1.5)"]
    if other:
        head += ["before ms", "after / before"]
    head += ["per-row numpy loop ms", "loop / batched (>= 3)", "max abs diff to loop",
             "aten ops / host reads per call" + (" (before -> after)" if other else "")]
    print_table(f"Batched alpha_k (k = 8) on a {P.shape} batch against a batched argsort and the per-row loop",
                tuple(head), table, rst)


def part_sorts(quick, rst, repeat=3):
    """Ways to order each row of the batch by q/p, timed in the same rounds (one thread each)."""
    from otspec.otm import _alpha_kernel as K

    P, Q, src = _real_batch(48 if quick else 192)
    V = P.shape[1]
    bits = K.index_bits(V)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(P > 0, Q / np.where(P > 0, P, 1.0), np.inf)
    keys = (ratio.view(np.int64) & ~np.int64((1 << bits) - 1)) | np.arange(V)
    ties = np.mean([np.unique(r).size for r in ratio]) / V

    def fused_order():  # the fused route's order: keys, their sort, the runs re-sorted (all k skipped but one)
        for i in range(P.shape[0]):
            otspec.otm._alpha._exact_fused(P[i], Q[i], [8])

    fns = [lambda: np.argsort(Q / P, axis=-1), lambda: np.argsort(ratio, axis=-1, kind="stable"),
           lambda: np.sort(keys, axis=-1), fused_order]
    names = ["argsort(q/p) (the reference)", "argsort(ratio, stable)", "sort of the int64 keys",
             "fused alpha_k per row (keys, sort, re-sort, cut)"]
    times = timeit_many(fns, repeat=repeat, min_time=0)
    rows = [(n, f"{t * 1e3:.0f}", f"{t / times[0]:.2f}") for n, t in zip(names, times)]
    print(f"\nbatch: {P.shape}, {src}; distinct ratios per row: {ties:.4f} of V; q = 0: {np.mean(Q == 0):.4f}, "
          f"p = 0: {np.mean(P == 0):.4f}")
    print_table("Ordering each row by q/p (one thread)", ("route", "ms", "ratio to argsort(q/p)"), rows, rst)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes")
    ap.add_argument("--rst", action="store_true", help="print reST tables for docs/")
    ap.add_argument("--batched-only", action="store_true", help="only the batched table")
    ap.add_argument("--against", metavar="DIR", help="another checkout (the code before a change): its batched "
                    "alpha_k timed in the same rounds, its ops and host reads beside")
    ap.add_argument("--sorts", action="store_true", help="also time the ways to order the rows by q/p")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds of the batched table (median kept)")
    args = ap.parse_args()
    print(f"numpy {np.__version__}; load average {os.getloadavg()[0]:.1f}")
    part_batched(args.quick, args.rst, args.against, args.repeat)
    if args.sorts:
        part_sorts(args.quick, args.rst, args.repeat)
    if args.batched_only:
        return
    part_sort(args.quick, args.rst)
    part_lp(args.quick, args.rst)


if __name__ == "__main__":
    main()
