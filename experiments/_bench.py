"""Shared helpers of the benchmark scripts: interleaved timings, LLM-like pairs, tables.

The machine is shared and noisy: contenders of one row are timed interleaved
in every repeat (so they see the same load) and the median is kept; compare
the ratios within a row, not absolute times across runs.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

__all__ = ["timeit", "timeit_many", "llm_like", "print_table", "target_column"]


def _calls_for(fn, min_time):
    """How many calls of ``fn`` one timed sample makes (at least ``min_time`` seconds, at most 1000); the first
    call is the warm-up."""
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-9)
    return max(1, min(1000, int(np.ceil(min_time / one))))


def timeit_many(fns, *, repeat=9, min_time=0.03, device=None):
    """Median seconds per call of each function, the functions interleaved in every repeat (after one warm-up
    each), through the package's one timing function (:func:`otspec._timing.timed_rounds`: ``device``
    synchronised before and after each sample)."""
    from otspec._timing import timed_rounds

    counts = [_calls_for(fn, min_time) for fn in fns]
    calls = {i: (lambda fn=fn, n=n: [fn() for _ in range(n)]) for i, (fn, n) in enumerate(zip(fns, counts))}
    got = timed_rounds(calls, device=device, warmup=0, repeats=repeat)
    return [statistics.median(np.array(got[i].samples) / n) for i, n in enumerate(counts)]


def timeit(fn, *, repeat=7, min_time=0.05, device=None):
    """Median time of one function after a warm-up."""
    return timeit_many([fn], repeat=repeat, min_time=min_time, device=device)[0]


def llm_like(n, rng, sigma=3.0, noise=1.0):
    """An LLM-like (draft p, target q) pair: softmax of Gaussian logits, the draft's logits perturbed."""
    logits = rng.normal(0, sigma, n)
    q = np.exp(logits - logits.max())
    q /= q.sum()
    d = logits + rng.normal(0, noise, n)
    p = np.exp(d - d.max())
    p /= p.sum()
    return p, q


def target_column(head, rows, target):
    """Append a verdict column for ``target = (column name, upper bound)``: "met" or "MISSED".

    Returns the new head, the new rows and the number of rows that miss.
    """
    if target is None:
        return tuple(head), [tuple(r) for r in rows], 0
    col, bound = target
    i = list(head).index(col)
    out, missed = [], 0
    for r in rows:
        v = float(r[i])
        ok = v <= bound
        missed += not ok
        out.append(tuple(r) + ("met" if ok else f"MISSED ({v:.3g} > {bound:g})",))
    return tuple(head) + (f"target {col} <= {bound:g}",), out, missed


def print_table(title, head, rows, rst, *, target=None):
    """Print a table, as reST (``rst=True``, for docs/perf) or as plain aligned text.

    ``target=(column, bound)``: a stated target "column <= bound"; every row gets
    a verdict cell ("met" / "MISSED (value > bound)") and a line under the table
    counts the misses, so a benchmark never prints a target beside a row that
    misses it without saying so.
    """
    head, rows, missed = target_column(head, rows, target)

    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"
        return str(v)

    body = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    print()
    print(title)
    print()
    if rst:
        sep = "  ".join("=" * w for w in widths)
        print(sep)
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        print(sep)
        for b in body:
            print("  ".join(c.ljust(w) for c, w in zip(b, widths)))
        print(sep, flush=True)
    else:
        print(" | ".join(h.rjust(w) for h, w in zip(head, widths)))
        for b in body:
            print(" | ".join(c.rjust(w) for c, w in zip(b, widths)))
        print(end="", flush=True)
    if target is not None:
        col, bound = target
        verdict = "all rows meet it" if not missed else f"{missed} of {len(rows)} rows MISS it"
        print(f"\nTarget {col} <= {bound:g}: {verdict}.", flush=True)


def load_against(root, submodules=()):
    """Another checkout's ``otspec`` (``root``), imported as the package ``otspec_against`` beside this one (its
    relative imports stay inside it), with ``submodules`` (names under it, e.g. ``"tree._bound"``) imported too.

    Its numba kernels cache their machine code in a folder of the system's temporary directory, not in that
    checkout's ``__pycache__``: numba's cache names the module that compiled a kernel, and a cache written under
    ``otspec_against`` fails to load when that checkout later runs as ``otspec``."""
    import importlib
    import importlib.util
    import sys
    import tempfile
    from pathlib import Path

    try:
        from numba.core import config as numba_config
    except ImportError:  # pragma: no cover - without the ``fast`` extra nothing is compiled
        numba_config = None
    pkg = Path(root).resolve() / "otspec"
    spec = importlib.util.spec_from_file_location("otspec_against", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["otspec_against"] = mod
    cache = None if numba_config is None else numba_config.CACHE_DIR
    if numba_config is not None:
        numba_config.CACHE_DIR = str(Path(tempfile.gettempdir()) / "otspec_against_numba_cache")
    try:
        spec.loader.exec_module(mod)
        for name in submodules:  # compiled under the separate cache
            importlib.import_module(f"otspec_against.{name}")
    finally:
        if numba_config is not None:
            numba_config.CACHE_DIR = cache
    return mod
