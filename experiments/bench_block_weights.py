"""Block verification's path weights past the float range: the cost on the hot paths, before and after, side by side.

The routes that form the weights :math:`w_k = \\prod_{i \\le k} q_i(X_i) / p_i(X_i)` of block verification (Sun et
al., arXiv:2403.10444, Algorithm 3) on rows of paths, timed in fresh processes that alternate between an older
checkout (``--before``) and this one, ``--runs`` times each (best of the repeats inside a process, median over the
processes), on ordinary laws (Dirichlet(1) rows: every weight in the normal range, the hot path):

* ``profile np``, ``profile torch``: :func:`otspec.profile._quantities.block_path_laws_stack` of both schemes
  (numpy; torch on the CPU), ``R`` rows of ``L`` depths over ``V`` tokens;
* ``walk_t``, ``onestep_t``: the decoder's accelerator functions :func:`block_walk_t` and
  :func:`block_onestep_tau_law_t` on CPU tensors (one block of ``L``);
* ``aten ops``: torch's dispatched ops of ``profile torch`` and of ``walk_t`` (a
  :class:`~torch.utils._python_dispatch.TorchDispatchMode`): the torch route is the same on every device (nothing
  read), so the count is a GPU's, where each costs its dispatch and launch.

    python experiments/bench_block_weights.py --before /tmp/otspec-before [--V 32768] [--R 8] [--L 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _best(fn, reps: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def measure(V: int, R: int, L: int) -> dict:
    """One process's timings (seconds per call) and op counts, of the ``otspec`` on ``sys.path``."""
    import numpy as np
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from otspec.decoding._verifiers import block_onestep_tau_law_t, block_walk_t
    from otspec.profile._quantities import block_path_laws_stack

    torch.set_num_threads(1)
    g = np.random.default_rng(0)
    P = g.dirichlet(np.ones(V), size=(R, L))
    Q = g.dirichlet(np.ones(V), size=(R, L + 1))
    X = np.array([[int(g.choice(V, p=P[r, i])) for i in range(L)] for r in range(R)], dtype=np.int64)
    Pt, Qt, Xt = torch.from_numpy(P), torch.from_numpy(Q), torch.from_numpy(X)
    names = ("block", "block-onestep")
    gen = torch.Generator().manual_seed(0)
    out = {
        "profile np": _best(lambda: block_path_laws_stack(names, P, Q, X, L), 5, 10),
        "profile torch": _best(lambda: block_path_laws_stack(names, Pt, Qt, Xt, L), 5, 10),
        "walk_t": _best(lambda: block_walk_t(Xt[0], Pt[0], Qt[0], gen), 5, 50),
        "onestep_t": _best(lambda: block_onestep_tau_law_t(Xt[0], Pt[0], Qt[0]), 5, 50),
    }

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    for key, fn in (("aten ops: profile torch", lambda: block_path_laws_stack(names, Pt, Qt, Xt, L)),
                    ("aten ops: walk_t", lambda: block_walk_t(Xt[0], Pt[0], Qt[0], gen))):
        fn()
        Count.n = 0
        with Count():
            fn()
        out[key] = Count.n
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="an older checkout's root (its otspec imported in the child processes)")
    ap.add_argument("--V", type=int, default=32768)
    ap.add_argument("--R", type=int, default=8)
    ap.add_argument("--L", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.V, args.R, args.L)))
        return 0
    print(f"load before: {os.getloadavg()}", flush=True)
    roots = {"before": args.before, "after": ROOT}
    got: dict = {"before": [], "after": []}
    for _ in range(args.runs):
        for tag, root in roots.items():
            env = dict(os.environ, PYTHONPATH=root)
            res = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--V", str(args.V), "--R",
                                  str(args.R), "--L", str(args.L)], env=env, cwd=root, check=True,
                                 capture_output=True, text=True)
            got[tag].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"load after: {os.getloadavg()}")
    print(f"V = {args.V}, R = {args.R}, L = {args.L}, median of {args.runs} processes each")
    print(f"{'route':<26}{'before':>12}{'after':>12}{'after/before':>14}")
    for key in got["after"][0]:
        b = statistics.median(r[key] for r in got["before"])
        a = statistics.median(r[key] for r in got["after"])
        unit = (lambda v: f"{v:.0f}") if key.startswith("aten") else (lambda v: f"{v * 1e6:.0f} us")
        print(f"{key:<26}{unit(b):>12}{unit(a):>12}{a / b:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
