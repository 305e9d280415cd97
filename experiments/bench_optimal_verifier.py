"""Benchmark: construction time of the exactly optimal k-draft verifier.

Side by side in one run (this machine is shared and noisy): the direct
construction of :func:`otspec.optimal_verifier` (two greedy passes on the
min-cut split + Carathéodory decomposition into priority orders), column
generation (``method="colgen"``, master LP in HiGHS, warm-started, with an
iteration budget) and the reduced OTM LP (:func:`otspec.otm_lp`) where it
fits. Median of repeated timings after a warm-up, fixed seeds. Pairs are
LLM-like: target = softmax of Gaussian logits (sigma = 3), draft = softmax of
the same logits plus Gaussian noise (sigma = 1).

Every row also reports the verifier's gap to alpha_k (exact closed form) and
its number of priority orders, and a per-token sampling time.

Usage: python experiments/bench_optimal_verifier.py [--quick] [--rst]
       python experiments/bench_optimal_verifier.py --real [--pairs 4] [--timeout 45] [--rst]

``--real`` times the construction on real next-token laws instead
(SmolLM2-135M-Instruct target, layer-skipped draft, temperature 1; see
``experiments/real_pair_dists.py``, cached in ``~/.cache/otspec``): the full
vocabulary (n = 49152) and each model's own top-K head (K = 64, 256, 1024,
4096, ties kept, renormalised, on the union of the two heads, so K <= n <= 2K),
k = 2, 4, 8, beside alpha_k and the reduced LP where it has at most 100,000
sets. Full-vocabulary cases run in a child process with a wall-clock limit
(``--timeout``) and a 4 GiB address-space limit, so a pathological case is
reported as such instead of stalling or exhausting the shared machine.

Target: n = 1,000, k = 8 under 1 s on this 2-core CPU; stretch
under 100 ms.

``--huge [--against DIR]``: the priority-key layout's gap to alpha_k at k = 2, 8, 64, 65, 10^4, 10^6,
2^40, 2^62 on the full-vocabulary laws (n = 49,152: real pairs, and the synthetic LLM-like pair of
``--full``; two sparse Dirichlet(0.1) pairs, alpha_k < 1 at huge k, where the greedy pass takes its slow
path) and on n = 2000 Dirichlet(1) pairs, with alpha_k, its status and coordinate (``origin`` 1: the
depth coordinate x = s - 1, k > 64); with ``--against`` also the other checkout's gap (its
``build_keys``, no fallback) and the construction time of ``optimal_verifier(p, q, k)`` side by side
(interleaved rounds, medians, the load average before and after). ``--only LABEL`` (repeatable): only
the laws whose label contains it.

``--huge-mixture [--against DIR]``: the same for the mixture of priority orders (``method="direct"``,
``"colgen"``, and ``"direct"`` with ``max_iter=1``, which falls back to column generation): gap, status,
``|sum z - 1|``, the stated tol and the number of warnings at k = 64, 65, 10^4, 10^6, 2^40, 2^62 on an
n = 1000 Dirichlet(0.1) pair, an n = 200 LLM-like pair and two n = 9 pairs of one token of mass about 1
(alpha_k < 1 at every k); with ``--against`` the other checkout's side by side.

``--mixture-time --against DIR [--rounds 7]``: the construction time of ``optimal_verifier(p, q, k, method)``
alone, ``method="direct"`` and ``"keys"``, at k = 8, 64, 65, 10^4 on the two ``--huge-mixture`` pairs (n = 1000
Dirichlet(0.1), n = 200 LLM-like), this checkout against DIR: interleaved rounds after a warm-up, medians and
min-max ranges, the CPU-time ratio, Python-level call counts (cProfile; load-independent), UTC time and load
average before and after.

``--full``: construction time at full vocabulary as a ratio to an
argsort of the same vocabulary (``np.argsort(q / p)``) measured in the same
run, on the real pairs (n = 49,152) and on synthetic LLM-like pairs (n =
1,000 ... 49,152 and 2^18), k = 2, 4, 8, 16. Targets: median ratio <= 50 and
slowest <= 200 on the real pairs; rows over 200 are marked ``MISS``, and the
summary line says whether the median target is met. "stored" is the number
of order entries the verifier keeps (its chain of blocks) against
``orders x n`` for the materialised mixture.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import otspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402
from _bench import llm_like, print_table  # noqa: E402


def timeit(fn, *, repeat=5, min_time=0.0):
    """Median time after a warm-up (shared helper, this script's defaults)."""
    return _bench.timeit(fn, repeat=repeat, min_time=min_time)


def fmt_ms(t):
    return f"{t * 1e3:.3g}"


def part_direct(quick, rst):
    ns = [10, 100, 1_000, 4_096] if quick else [10, 100, 1_000, 4_096, 16_384, 32_768]
    ks = [2, 8] if quick else [2, 4, 8, 16]
    rows = []
    for n in ns:
        for k in ks:
            rng = np.random.default_rng(1000 * n + k)
            p, q = llm_like(n, rng)
            alpha = float(otspec.alpha_k(p, q, k))
            rep = 5 if n <= 4_096 else 3
            t_alpha = timeit(lambda: otspec.alpha_k(p, q, k), repeat=rep, min_time=0.02)
            t_dir = timeit(lambda: otspec.optimal_verifier(p, q, k, method="direct"), repeat=rep)
            v = otspec.optimal_verifier(p, q, k, method="direct")
            drafts = rng.choice(n, size=k, p=p)
            gen = np.random.default_rng(0)
            t_samp = timeit(lambda: v.sample(drafts, rng=gen), repeat=5, min_time=0.02)
            rows.append((n, k, f"{alpha:.6f}", fmt_ms(t_alpha), fmt_ms(t_dir), f"{t_dir / t_alpha:.0f}",
                         v.n_orders, v.n_iter, f"{v.gap:.1e}", v.status, f"{t_samp * 1e6:.0f}"))
    head = ("n", "k", "alpha_k", "alpha_k ms", "direct ms", "ratio", "orders", "steps", "gap", "status",
            "sample us")
    print_table("Direct construction against n and k (ratio: direct time / closed-form alpha_k time)", head, rows, rst)


def part_compare(quick, rst):
    cases = [(10, 2), (10, 4), (30, 3), (100, 2), (100, 4), (300, 8)] if quick else [
        (10, 2), (10, 4), (10, 8), (30, 3), (100, 2), (100, 4), (300, 2), (300, 8), (1_000, 2)]
    rows = []
    for n, k in cases:
        rng = np.random.default_rng(7 * n + k)
        p, q = llm_like(n, rng)
        alpha = float(otspec.alpha_k(p, q, k))
        t_dir = timeit(lambda: otspec.optimal_verifier(p, q, k, method="direct"), repeat=3)
        v = otspec.optimal_verifier(p, q, k, method="direct")
        budget = 300
        t0 = time.perf_counter()
        cg = otspec.optimal_verifier(p, q, k, method="colgen", max_iter=budget)
        t_cg = time.perf_counter() - t0
        n_sets = math.comb(n + k - 1, k)
        if n_sets <= 600_000:
            t0 = time.perf_counter()
            lp = otspec.otm_lp(p, q, k)
            t_lp = time.perf_counter() - t0
            lp_cell = f"{fmt_ms(t_lp)} ({t_lp / t_dir:.0f}x)"
            lp_err = f"{abs(lp.alpha - alpha):.1e}" if lp.success else lp.status
        else:
            lp_cell, lp_err = "too large", "-"
        rows.append((n, k, fmt_ms(t_dir), f"{v.gap:.1e}", f"{fmt_ms(t_cg)} ({t_cg / t_dir:.0f}x)", cg.n_iter,
                     cg.n_orders, f"{cg.gap:.1e}", cg.status, lp_cell, lp_err))
    head = ("n", "k", "direct ms", "direct gap", "colgen ms (ratio)", "colgen rounds", "colgen orders",
            "colgen gap", "colgen status", "reduced LP ms (ratio)", "LP abs err")
    print_table("Direct construction vs column generation (budget 300 rounds) vs the reduced LP", head, rows, rst)


REAL_KS = (2, 4, 8)
REAL_HEADS = (64, 256, 1024, 4096, None)  # None: the full vocabulary
REAL_LP_MAX_SETS = 100_000
REAL_MEM_LIMIT = 4 * 2**30


def _real_module():
    import importlib.util


    path = Path(__file__).resolve().parent / "real_pair_dists.py"
    spec = importlib.util.spec_from_file_location("real_pair_dists", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _real_case(p, q, k, repeat):
    """(alpha, alpha_k time, direct time, verifier) for one pair; the direct time is a median."""
    alpha = float(otspec.alpha_k(p, q, k))
    t_alpha = timeit(lambda: otspec.alpha_k(p, q, k), repeat=repeat, min_time=0.02)
    t0 = time.perf_counter()
    v = otspec.optimal_verifier(p, q, k, method="direct")
    times = [time.perf_counter() - t0]
    if times[0] < 3.0:  # the first call was the warm-up; two more
        for _ in range(repeat - 1):
            t0 = time.perf_counter()
            otspec.optimal_verifier(p, q, k, method="direct")
            times.append(time.perf_counter() - t0)
    return alpha, t_alpha, statistics.median(times), v


def _real_child(pair, k):
    """Child process entry (--_real-child): one full-vocabulary case, printed as one JSON line."""
    import json
    import resource

    p, q = _real_module().load_real_pairs(pair + 1)[pair]
    resource.setrlimit(resource.RLIMIT_AS, (REAL_MEM_LIMIT, REAL_MEM_LIMIT))
    try:
        alpha, t_alpha, t_dir, v = _real_case(p, q, k, repeat=3)
        out = {"alpha": alpha, "t_alpha": t_alpha, "t_dir": t_dir, "orders": v.n_orders, "steps": v.n_iter,
               "gap": v.gap, "status": v.status}
    except MemoryError:
        out = {"error": "MemoryError (4 GiB limit)"}
    print(json.dumps(out), flush=True)


def part_real(n_pairs, timeout, rst):
    import json
    import subprocess


    mod = _real_module()
    pairs = mod.load_real_pairs(n_pairs)
    rows = []
    for i, (p0, q0) in enumerate(pairs):
        for K in REAL_HEADS:
            for k in REAL_KS:
                if K is None:
                    n = p0.shape[0]
                    t0 = time.perf_counter()
                    try:
                        res = subprocess.run([sys.executable, __file__, "--_real-child", str(i), str(k)],
                                             capture_output=True, text=True, timeout=timeout)
                        lines = res.stdout.strip().splitlines()
                        r = json.loads(lines[-1]) if res.returncode == 0 and lines else {
                            "error": f"child failed (rc {res.returncode}): {res.stderr.strip()[-80:]}"}
                    except subprocess.TimeoutExpired:
                        r = {"error": f"> {timeout:g} s (stopped)"}
                    if "error" in r:
                        alpha = float(otspec.alpha_k(p0, q0, k))
                        t_alpha = timeit(lambda: otspec.alpha_k(p0, q0, k), repeat=3, min_time=0.02)
                        rows.append((i, "full", n, k, f"{alpha:.6f}", fmt_ms(t_alpha), r["error"], "-", "-", "-",
                                     "-", "-", "-"))
                        print(f"  pair {i} full k={k}: {r['error']} ({time.perf_counter() - t0:.0f} s)", flush=True)
                        continue
                    alpha, t_alpha, t_dir = r["alpha"], r["t_alpha"], r["t_dir"]
                    orders, steps, gap, status = r["orders"], r["steps"], r["gap"], r["status"]
                else:
                    p, q = mod.top_k_pair(p0, q0, K)
                    n = p.shape[0]
                    alpha, t_alpha, t_dir, v = _real_case(p, q, k, repeat=3)
                    orders, steps, gap, status = v.n_orders, v.n_iter, v.gap, v.status
                lp_cell, lp_err = "too large", "-"
                if K is not None and math.comb(n + k - 1, k) <= REAL_LP_MAX_SETS:
                    t0 = time.perf_counter()
                    lp = otspec.otm_lp(p, q, k)
                    t_lp = time.perf_counter() - t0
                    lp_cell = f"{fmt_ms(t_lp)} ({t_lp / t_dir:.0f}x)"
                    lp_err = f"{abs(lp.alpha - alpha):.1e}" if lp.success else lp.status
                rows.append((i, "full" if K is None else K, n, k, f"{alpha:.6f}", fmt_ms(t_alpha), fmt_ms(t_dir),
                             f"{t_dir / t_alpha:.0f}", orders, steps, f"{gap:.1e}", status, f"{lp_cell} {lp_err}"))
    head = ("pair", "head K", "n", "k", "alpha_k", "alpha_k ms", "direct ms", "ratio", "orders", "steps", "gap",
            "status", "reduced LP ms (ratio) abs err")
    print_table("Real next-token laws (SmolLM2-135M target, layer-skipped draft, T = 1): direct construction vs "
                "alpha_k and the reduced LP", head, rows, rst)


FULL_KS = (2, 4, 8, 16)


def _full_row(label, n, k, p, q, rows, ratios, mixture):
    t_sort = timeit(lambda: np.argsort(q / p), repeat=5, min_time=0.02)
    v = otspec.optimal_verifier(p, q, k)  # warm-up (and numba's compilation on the first call)
    t_keys = timeit(lambda: otspec.optimal_verifier(p, q, k), repeat=5)
    alpha = float(otspec.alpha_k(p, q, k))
    ratio = t_keys / t_sort
    ratios.append(ratio)
    mix_cell = "-"
    if mixture:
        t0 = time.perf_counter()
        otspec.optimal_verifier(p, q, k, method="direct")
        t_mix = time.perf_counter() - t0
        mix_cell = f"{fmt_ms(t_mix)} ({t_mix / t_sort:.0f}x)"
    rows.append((label, n, k, f"{alpha:.6f}", fmt_ms(t_sort), fmt_ms(t_keys),
                 f"{ratio:.0f}" + ("" if ratio <= 200 else " MISS"), v.n_pieces, f"{v.n_pieces / n:.2f}",
                 f"{v.gap:.1e}", f"{v.tol:.1e}", v.status, mix_cell))
    print(f"  {label} n={n} k={k}: {ratio:.0f}x argsort", flush=True)


def part_full(n_pairs, quick, rst, mixture=False):
    rows, ratios = [], []
    try:
        pairs = _real_module().load_real_pairs(n_pairs)
    except Exception as exc:  # noqa: BLE001 - the synthetic part still runs
        print(f"real pairs unavailable ({type(exc).__name__}: {exc}); synthetic pairs only")
        pairs = []
    print(f"priority-key layout compiled by numba: {otspec.multidraft._keys_kernel.JIT}", flush=True)
    for i, (p, q) in enumerate(pairs):
        for k in FULL_KS:
            _full_row(f"real {i}", p.shape[0], k, p, q, rows, ratios, mixture)
    real = list(ratios)
    ns = [1_000, 16_384, 49_152] if quick else [1_000, 4_096, 16_384, 49_152, 2**18]
    for n in ns:
        for k in FULL_KS if n < 2**18 else (2, 8):
            p, q = llm_like(n, np.random.default_rng(10 * n + k))
            _full_row("synthetic", n, k, p, q, rows, ratios, mixture and n < 2**18)
    head = ("pair", "n", "k", "alpha_k", "argsort ms", "keys ms", "ratio (<= 200)", "intervals", "intervals / n",
            "gap", "tol", "status", "mixture ms (ratio)")
    print_table("Optimal verifier at full vocabulary (priority keys, the default construction): construction time "
                "over an argsort of the same vocabulary", head, rows, rst)
    if real:
        med, worst = statistics.median(real), max(real)
        print(f"\nreal pairs: median ratio {med:.0f} (target <= 50: {'met' if med <= 50 else 'MISS'}), "
              f"slowest {worst:.0f} (target <= 200: {'met' if worst <= 200 else 'MISS'})", flush=True)


HUGE_KS = (2, 8, 64, 65, 10**4, 10**6, 2**40, 2**62)
HUGE_TIME_KS = (2, 8, 64, 10**4, 10**6, 2**40)


def _load_package(root: str):
    """Another checkout's ``otspec`` (:func:`_bench.load_against`), its priority keys compiled."""
    return _bench.load_against(root, ["multidraft._priority_keys"])


def _keys_gap(pkg, p, q, k):
    """(gap, status, origin, seconds, alpha_k) of a package's priority-key layout (its build_keys: no fallback)."""
    import importlib
    import warnings

    pk = importlib.import_module(pkg.__name__ + ".multidraft._priority_keys")
    alpha_mod = importlib.import_module(pkg.__name__ + ".otm._alpha")
    supp = np.flatnonzero(p > 0)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflowing powers of the former code at k = 2**62
        cut = alpha_mod.min_cut(p, q, k)
        in0 = np.zeros(p.shape[0], dtype=bool)
        in0[cut.omega0] = True
        v = pk.build_keys(p, q, p[supp], q[supp], supp, k, in0[supp], cut.alpha, None)
    return v.gap, v.status, getattr(v, "origin", 0), time.perf_counter() - t0, cut.alpha


def _limited(fn, limit):
    """``fn()`` in a forked child, stopped after ``limit`` seconds (then None): the former code's greedy pass
    could take minutes at huge k."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=lambda: send.send(fn()))
    child.start()
    ready = recv.poll(limit)
    out = recv.recv() if ready else None
    if not ready:
        child.kill()
    child.join()
    return out


def part_huge(against, n_pairs, rst, limit, only=()):
    import datetime
    import os

    old = _load_package(against) if against else None
    laws = []
    try:
        for i, (p, q) in enumerate(_real_module().load_real_pairs(n_pairs)):
            laws.append((f"real {i}", p, q))
    except Exception as exc:  # noqa: BLE001 - the synthetic laws still run
        print(f"real pairs unavailable ({type(exc).__name__}: {exc})")
    laws.append(("llm-like", *llm_like(49_152, np.random.default_rng(10 * 49_152 + 8))))
    rng = np.random.default_rng(0)
    laws.append(("dirichlet", rng.dirichlet(np.ones(2000)), rng.dirichlet(np.ones(2000))))
    # alpha_k < 1 at huge k (the greedy pass's slow path): sparse Dirichlet(0.1) pairs at full vocabulary
    for seed in (1, 2):
        g = np.random.default_rng(seed)
        laws.append((f"dir0.1 s{seed}", g.dirichlet(np.full(49_152, 0.1)), g.dirichlet(np.full(49_152, 0.1))))
    if only:
        laws = [law for law in laws if any(o in law[0] for o in only)]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}",
          flush=True)
    rows = []
    slow = set()
    for label, p, q in laws:
        for k in HUGE_KS:
            gap, status, origin, dt, alpha = _keys_gap(otspec, p, q, k)
            row = [label, p.shape[0], k if k < 2**20 else f"2^{k.bit_length() - 1}", f"{alpha:.4f}", f"{gap:.1e}",
                   status, origin, f"{dt:.2f}"]
            if old is not None:
                res = _limited(lambda p=p, q=q, k=k: _keys_gap(old, p, q, k), limit)
                if res is None:
                    row += ["-", f"> {limit:g} s (stopped)", "-"]
                    slow.add((label, k))
                else:
                    g0, s0, _, d0, _ = res
                    row += [f"{g0:.1e}", s0, f"{d0:.2f}"]
            rows.append(tuple(row))
            print("  ", row, flush=True)
    head = ["law", "n", "k", "alpha_k", "gap", "status", "origin", "s"] + (["former gap", "former status", "former s"] if old
                                                               else [])
    print_table("Priority-key layout: gap to alpha_k at huge k (build_keys, no fallback)", tuple(head), rows, rst)
    if old is None:
        return
    rows = []
    load0 = os.getloadavg()[0]
    for label, p, q in laws:
        if p.shape[0] != 49_152:
            continue
        for k in HUGE_TIME_KS:
            if (label, k) in slow:
                continue
            fns = {"this": lambda: otspec.optimal_verifier(p, q, k), "former": lambda: old.optimal_verifier(p, q, k)}
            for fn in fns.values():
                fn()  # warm-up (compilation)
            times = {name: [] for name in fns}
            for _ in range(5):  # interleaved rounds
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - t0)
            med = {name: statistics.median(t) for name, t in times.items()}
            rows.append((label, k if k < 2**20 else f"2^{k.bit_length() - 1}", fmt_ms(med["former"]),
                         fmt_ms(med["this"]), f"{med['this'] / med['former']:.2f}"))
            print("  ", rows[-1], flush=True)
    print_table(f"optimal_verifier(p, q, k), keys, n = 49,152: median of 5 interleaved rounds (load {load0:.2f} -> "
                f"{os.getloadavg()[0]:.2f})", ("law", "k", "former ms", "this ms", "ratio"), rows, rst)


#: ``--huge-mixture``: the constructions of the mixture of priority orders (method, max_iter); max_iter=1 forces
#: the fallback of a direct construction to column generation ("direct+colgen")
MIXTURE_METHODS = (("direct", None), ("colgen", None), ("direct", 1))
MIXTURE_KS = (64, 65, 10**4, 10**6, 2**40, 2**62)
#: ``--huge-mixture``: the ks of its timing table (the former direct construction ends "optimal" without a fallback)
MIXTURE_TIME_KS = (8, 64, 65, 10**4)


def _tiny_law(k, seed, lo, hi, n=9):
    """One token of mass about 1 and ``n - 1`` of mass ``U(lo, hi) / k`` (tests/test_optimal_verifier_direct_huge_k_cc)."""
    rng = np.random.default_rng(seed)
    tiny = rng.uniform(lo, hi, n - 1) / k
    p = np.concatenate([[1.0 - tiny.sum()], tiny])
    qt = rng.dirichlet(np.full(n - 1, 0.5)) * rng.uniform(0.2, 0.9)
    return p, np.concatenate([[1.0 - qt.sum()], qt])


def _mixture_run(pkg, p, q, k, method, max_iter):
    """(gap, status, method, |sum z - 1|, tol, warnings, seconds) of a package's mixture of orders, or the error."""
    import warnings

    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            v = pkg.optimal_verifier(p, q, k, method=method, max_iter=max_iter)
        except Exception as exc:  # noqa: BLE001 - the former code raised at k = 2**62
            return (None, f"{type(exc).__name__}", "-", None, None, len(caught), time.perf_counter() - t0)
        out = (v.gap, v.status, v.method, abs(float(v.z.sum()) - 1.0), v.tol, len(caught), time.perf_counter() - t0)
    return out


def part_huge_mixture(against, rst, only=()):
    """Gaps, statuses, tolerances and warnings of method="direct"/"colgen"/"direct+colgen" at huge k, side by side."""
    import datetime
    import os

    old = _load_package(against) if against else None
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}",
          flush=True)
    # column generation tails off on the LLM-like pair: n = 200
    laws = _mixture_laws() + [("tiny 0", lambda k: _tiny_law(k, 0, 0.005, 0.5)),
                              ("tiny 137", lambda k: _tiny_law(k, 137, 0.01, 1.0))]
    if only:
        laws = [law for law in laws if any(o in law[0] for o in only)]
    rows = []
    for label, make in laws:
        for k in MIXTURE_KS:
            p, q = make(k)
            alpha = float(otspec.alpha_k(p, q, k))
            for method, max_iter in MIXTURE_METHODS:
                name = method if max_iter is None else f"{method}, max_iter={max_iter}"
                row = [label, p.shape[0], k if k < 2**20 else f"2^{k.bit_length() - 1}", f"{alpha:.4f}", name]
                for pkg in (otspec,) + ((old,) if old is not None else ()):
                    gap, status, used, zerr, tol, nw, dt = _mixture_run(pkg, p, q, k, method, max_iter)
                    if gap is None:
                        row += ["-", status, "-", "-", "-", nw, f"{dt:.2f}"]
                    else:
                        row += [f"{gap:.1e}", f"{status} ({used})", f"{zerr:.0e}", f"{tol:.0e}", nw, f"{dt:.2f}"]
                rows.append(tuple(row))
                print("  ", row, flush=True)
    head = ["law", "n", "k", "alpha_k", "method", "gap", "status", "sum z - 1", "tol", "warn", "s"]
    if old is not None:
        head += ["former gap", "former status", "former sum z - 1", "former tol", "former warn", "former s"]
    print_table("Mixture of priority orders at huge k: gap to alpha_k, status, stated tol, warnings", tuple(head), rows,
                rst)
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}",
          flush=True)
    if old is None:
        return
    _mixture_time_table(old, [law for law in laws if not law[0].startswith("tiny")], rst, rounds=3)


def _mixture_laws():
    """The ``--huge-mixture`` laws timed: the n = 1000 Dirichlet(0.1) pair and the n = 200 LLM-like pair."""
    g = np.random.default_rng(1)
    sparse = (g.dirichlet(np.full(1000, 0.1)), g.dirichlet(np.full(1000, 0.1)))
    llm = llm_like(200, np.random.default_rng(10 * 200 + 8))
    return [("dir0.1", lambda k: sparse), ("llm-like", lambda k: llm)]


def _mixture_time_table(old, laws, rst, *, rounds, methods=("direct",), ks=MIXTURE_TIME_KS):
    """Construction time of ``optimal_verifier(p, q, k, method)``, this checkout against ``old``: interleaved
    rounds (after one warm-up call each; a call under 20 ms is repeated to fill 20 ms a sample), wall-clock
    medians, each side's spread (min-max over the rounds), the ratio of the CPU-time medians (process time: less
    sensitive to other jobs on the cores) and each side's Python-level call count (:func:`_python_calls`)."""
    import os

    rows = []
    load0 = os.getloadavg()[0]
    for label, make in laws:
        for method in methods:
            for k in ks:
                p, q = make(k)
                fns = {"this": lambda: otspec.optimal_verifier(p, q, k, method=method),
                       "former": lambda: old.optimal_verifier(p, q, k, method=method)}
                calls = {}
                for name, fn in fns.items():  # warm-up (compilation, caches); short calls repeated to 20 ms a sample
                    t0 = time.perf_counter()
                    fn()
                    calls[name] = max(1, math.ceil(0.02 / max(time.perf_counter() - t0, 1e-6)))
                times = {name: [] for name in fns}
                cpu = {name: [] for name in fns}
                for _ in range(rounds):  # interleaved rounds
                    for name, fn in fns.items():
                        c0, t0 = time.process_time(), time.perf_counter()
                        for _ in range(calls[name]):
                            fn()
                        times[name].append((time.perf_counter() - t0) / calls[name])
                        cpu[name].append((time.process_time() - c0) / calls[name])
                med = {name: statistics.median(t) for name, t in times.items()}
                cmed = {name: statistics.median(t) for name, t in cpu.items()}
                spread = {name: f"{fmt_ms(min(t))}-{fmt_ms(max(t))}" for name, t in times.items()}
                n_calls = {name: _python_calls(fn) for name, fn in fns.items()}
                rows.append((label, method, k, fmt_ms(med["former"]), spread["former"], fmt_ms(med["this"]),
                             spread["this"], f"{med['this'] / med['former']:.2f}",
                             f"{cmed['this'] / cmed['former']:.2f}", n_calls["former"], n_calls["this"]))
                print("  ", rows[-1], flush=True)
    print_table(f"optimal_verifier(p, q, k, method): median of {rounds} interleaved rounds (load {load0:.2f} "
                f"-> {os.getloadavg()[0]:.2f})",
                ("law", "method", "k", "former ms", "former range", "this ms", "this range", "ratio", "cpu ratio",
                 "former calls", "this calls"), rows, rst)


def _python_calls(fn) -> int:
    """Python-level function calls of one ``fn()`` (cProfile's count: numpy's Python wrappers included, its C
    loops not): a count that does not depend on the machine's load."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return int(pstats.Stats(prof).total_calls)


def part_mixture_time(against, rst, rounds, only=()):
    """``--mixture-time``: the timing table of ``--huge-mixture`` alone (direct and keys, k = 8, 64, 65, 10^4)."""
    import datetime
    import os

    old = _load_package(against)
    laws = _mixture_laws()
    if only:
        laws = [law for law in laws if any(o in law[0] for o in only)]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}, "
          f"against {against}", flush=True)
    _mixture_time_table(old, laws, rst, rounds=rounds, methods=("direct", "keys"))
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC, load {os.getloadavg()[0]:.2f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes (default run is short)")
    ap.add_argument("--rst", action="store_true", help="print reST tables for docs/")
    ap.add_argument("--real", action="store_true", help="real SmolLM2 next-token laws instead of LLM-like pairs")
    ap.add_argument("--pairs", type=int, default=4, help="--real: number of real pairs (default 4)")
    ap.add_argument("--timeout", type=float, default=45.0,
                    help="--real: seconds allowed per full-vocabulary case (default 45)")
    ap.add_argument("--full", action="store_true", help="full-vocabulary ratios to an argsort")
    ap.add_argument("--mixture", action="store_true",
                    help="--full: also time the mixture-of-orders construction (method='direct'; slow)")
    ap.add_argument("--huge", action="store_true", help="gaps of the priority-key layout at huge k")
    ap.add_argument("--huge-mixture", action="store_true",
                    help="gaps of the mixture of priority orders (direct, colgen, direct+colgen) at huge k")
    ap.add_argument("--mixture-time", action="store_true",
                    help="construction time alone (direct and keys, k = 8, 64, 65, 10^4) against --against")
    ap.add_argument("--rounds", type=int, default=7, help="--mixture-time: interleaved rounds (default 7)")
    ap.add_argument("--against", default=None,
                    help="--huge, --huge-mixture, --mixture-time: another checkout to compare with")
    ap.add_argument("--only", action="append",
                    help="--huge, --huge-mixture: only the laws whose label contains this (repeatable)")
    ap.add_argument("--_real-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._real_child:
        _real_child(*args._real_child)
        return
    print(f"numpy {np.__version__}")
    if args.mixture_time:
        if not args.against:
            ap.error("--mixture-time needs --against DIR")
        part_mixture_time(args.against, args.rst, args.rounds, tuple(args.only or ()))
        return
    if args.huge_mixture:
        part_huge_mixture(args.against, args.rst, tuple(args.only or ()))
        return
    if args.huge:
        part_huge(args.against, args.pairs, args.rst, args.timeout, tuple(args.only or ()))
        return
    if args.full:
        part_full(args.pairs, args.quick, args.rst, args.mixture)
        return
    if args.real:
        t0 = time.perf_counter()
        part_real(args.pairs, args.timeout, args.rst)
        print(f"\n--real: {time.perf_counter() - t0:.0f} s", flush=True)
        return
    part_direct(args.quick, args.rst)
    part_compare(args.quick, args.rst)


if __name__ == "__main__":
    main()
