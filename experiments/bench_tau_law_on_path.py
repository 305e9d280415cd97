"""Time :func:`otspec.block.tau_law_on_path` of one checkout (task CG: the check of its rows).

``python experiments/bench_tau_law_on_path.py CHECKOUT V NAME...``: ``CHECKOUT`` a worktree whose ``otspec`` is
imported, ``V`` the vocabulary, ``NAME`` the block verifiers ("token", "block-onestep", "block"); ``L = 4``
Dirichlet(1) rows and one random block (seed 0), best of 7 x 100 calls, in microseconds per call.
"""

from __future__ import annotations

import sys
import time

import numpy as np


def main(argv: list[str]) -> None:
    checkout, V, names = argv[0], int(argv[1]), argv[2:]
    sys.path.insert(0, checkout)
    from otspec.block import tau_law_on_path

    g = np.random.default_rng(0)
    L = 4
    P, Q = g.dirichlet(np.ones(V), size=L), g.dirichlet(np.ones(V), size=L)
    block = tuple(int(x) for x in g.integers(0, V, L))
    cs, cb = [P[i] for i in range(L)], [Q[i] for i in range(L)]
    for name in names:
        tau_law_on_path(name, block, cs, cb)
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(100):
                tau_law_on_path(name, block, cs, cb)
            best = min(best, (time.perf_counter() - t0) / 100)
        print(f"{checkout} {name} V={V} L={L}: {best * 1e6:.0f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
