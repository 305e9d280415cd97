"""What the batched k-Seq rho* costs on torch with its tiny-beta rows exact: aten ops, host reads and ms per call.

:func:`otspec.multidraft._batched._rho_star_rows` on torch tensors runs, besides the float search, a second search of
every row in the ``c(beta) - rho`` form, kept where beta(rho*) is tiny (``tiny_beta=True``, the public functions'
route); ``tiny_beta=False`` is the float search alone (the profile's route). Both side by side in one run, on CPU
tensors (an op there costs its dispatch and its elements; on a GPU in eager mode its dispatch and launch).

    python experiments/bench_kseq_tiny_beta.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import array_api_compat
    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import bench_profile_ops as O

    import otspec.multidraft._batched as MB

    torch.set_num_threads(1)
    xp = array_api_compat.array_namespace(torch.zeros(1))
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{'B':>4} {'V':>6} {'k':>2}  {'ops before':>10} {'ops after':>9} {'reads':>5}  "
          f"{'ms before':>9} {'ms after':>8} {'ratio':>5}")
    for B, V in ((8, 64), (64, 4096)):
        r = np.random.default_rng(0)
        P = torch.from_numpy(r.dirichlet(np.full(V, 0.5), B))
        Q = torch.from_numpy(r.dirichlet(np.full(V, 0.5), B))
        for k in (2, 4):
            got = []
            for tiny in (False, True):
                MB._rho_star_rows(P, Q, k, xp, tiny_beta=tiny)  # warm-up: the constants made once per run
                c = O.Counts()
                with O.counting(c):
                    MB._rho_star_rows(P, Q, k, xp, tiny_beta=tiny)
                ts = []
                for _ in range(9):
                    t0 = time.perf_counter()
                    MB._rho_star_rows(P, Q, k, xp, tiny_beta=tiny)
                    ts.append(time.perf_counter() - t0)
                got.append((c.aten, c.reads, 1e3 * min(ts)))
            (a0, _, m0), (a1, r1, m1) = got
            print(f"{B:>4} {V:>6} {k:>2}  {a0:>10} {a1:>9} {r1:>5}  {m0:>9.2f} {m1:>8.2f} {m1 / m0:>5.2f}")


if __name__ == "__main__":
    main()
