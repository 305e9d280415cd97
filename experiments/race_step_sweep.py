"""Where the race's quadrature nodes go, and what its step buys: the trapezoidal rule in log t against its step.

The exact laws of the draws without replacement of ``otspec.tree.bound(..., process="wor")`` come from the
exponential race (``otspec.tree._bound._Race``: the trapezoidal rule in :math:`\\log t` from :math:`t_0 = 5 \\cdot
10^{-3}`, its step ``_race_step(r_max)`` the largest whose proven relative error ``_race_rule_error`` is at most
1e-15; about 1/5.4 at the ranks of ``branching(8,7)``, 1/8 before that bound). This script
records the real pair's laws of ``branching(8,7)`` at ``V = 49,152`` (budget 256, 64 prefixes per call), captures the
rows that the bound hands to the race's quadrature (``race_rows_weighted``: the ranks' laws combined by their slot
weights), and recomputes them at several steps, every rule started at :math:`t = 10^{-14}` (so that the part before
the first node, :math:`O(t^3)`, is far below the differences measured) against a reference of step ``1/32``:

* the rule's error (largest over the rows of the relative difference of the head's laws and of the tail's
  coefficients, :math:`\\sum_n |C_n - C^{ref}_n| / C^{ref}_0`),
* the proven bound on the rule's relative error at the largest rank (``_race_rule_error``),
* the difference of the sums of steps ``h`` and ``2h`` (what the acceptance check saw before the proven bound),
* the nodes per row from the bound's first node :math:`t_0` (median), and the kernel's CPU time for all rows.

Usage: python experiments/race_step_sweep.py [--steps 0.125 0.1667 0.2 0.25] (the chosen step added)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tree_bound import _real_pair, _record_laws, _TensorLaws  # noqa: E402


def _capture(K, run) -> list:
    """The arguments of every ``race_rows_weighted`` call of ``run()`` (copied before the call)."""
    got = []
    orig = K.race_rows_weighted

    def capturing(*a):
        got.append([x.copy() if isinstance(x, np.ndarray) else x for x in a])
        return orig(*a)

    K.race_rows_weighted = capturing
    try:
        run()
    finally:
        K.race_rows_weighted = orig
    return got


def _rule(K, c, h: float, vlo: float):
    """``(HL, HL2, C, C2, info, cpu seconds)`` of the captured call ``c`` at step ``h`` from ``log t = vlo``."""
    PH, kh, pmax, nu, ranks, wts, deg, _h, _v, s, mx, HL, HL2, C, C2, info, heads = c
    out = [np.zeros_like(HL), np.zeros_like(HL2), np.zeros_like(C), np.zeros_like(C2), np.zeros_like(info)]
    t = time.process_time()
    K.race_rows_weighted(PH, kh, pmax, nu, ranks, wts, deg, h, vlo, s, 100000, *out, heads)
    return (*out, time.process_time() - t)


def _rel(a, ref, ph):
    """Largest relative difference of head laws (where the reference is above 1e-6 of the token's probability)
    and of tail coefficients (summed over the degrees, relative to the reference's ``C_0``)."""
    HL, C = a
    HLr, Cr = ref
    big = HLr > 1e-6 * ph[:, None, :]
    eh = float(np.max(np.abs(HL - HLr)[big] / HLr[big])) if big.any() else 0.0
    c0 = np.abs(Cr[:, :, 0])
    ok = c0 > 0
    ec = float(np.max((np.abs(C - Cr).sum(axis=2))[ok] / c0[ok])) if ok.any() else 0.0
    return max(eh, ec)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=float, nargs="+", default=[0.125, 1 / 6, 0.2, 0.25])
    args = ap.parse_args(argv)
    import otspec.tree._bound as B
    import otspec.tree._bound_kernels as K
    from otspec.tree import TreeShape, bound

    device, target, draft, ctx, name = _real_pair(argparse.Namespace(device="cpu", threads=1))
    shape = TreeShape.branching(8, 7)
    rec = _record_laws(B, lambda: bound(shape, draft, target, process="wor", prefix=ctx, budget=256, batch=64))
    laws = _TensorLaws(rec, None, stack=False)
    caps = _capture(K, lambda: B._sampled(B._Slots(shape), "wor", laws, 256, 64))
    rows = sum(c[0].shape[0] for c in caps)
    print(f"{name}; V = {target.vocab_size}; branching(8,7), budget 256: {len(caps)} quadrature calls, {rows} rows")
    v_far, v0 = math.log(1e-14), math.log(B._RACE_T0)
    ref = [_rule(K, c, 1 / 32, v_far) for c in caps]
    rmax = max(int(c[4].max()) for c in caps)
    print(f"{'step':>8} | {'rule error':>10} | {'proven':>10} | {'h vs 2h':>10} | {'nodes from t0':>13} | "
          f"{'CPU ms':>7}")
    for h in sorted(set(args.steps) | {B._race_step(rmax)}):
        far = [_rule(K, c, h, v_far) for c in caps]
        err = max(_rel((f[0], f[2]), (r[0], r[2]), c[0]) for f, r, c in zip(far, ref, caps))
        chk = max(_rel((f[0], f[2]), (f[1], f[3]), c[0]) for f, c in zip(far, caps))
        prod = [_rule(K, c, h, v0) for c in caps]
        nodes = float(np.median(np.concatenate([p[4][:, 1] for p in prod])))
        cpu = min(sum(_rule(K, c, h, v0)[5] for c in caps) for _ in range(5))
        print(f"{h:8.4f} | {err:10.1e} | {B._race_rule_error(rmax, h):10.1e} | {chk:10.1e} | {nodes:13.0f} | "
              f"{cpu * 1e3:7.2f}")


if __name__ == "__main__":  # pragma: no cover
    main()
