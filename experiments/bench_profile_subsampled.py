"""Benchmark: the exact analysis of one subsampled profile position at V = 128,256, before and after, side by side.

At a subsampled position the profile computes every quantity of the ``(k, L)`` grid (the default verifiers and
families at that vocabulary: ``ProfileSettings(k_max=4, L_max=4).for_vocabulary(128_256)``) from the draft tree's
laws. This script times ``position_rows`` on such positions (synthetic draft trees: ``k_max = L_max = 4``, a law per
distinct prefix, softmax of Gaussian logits of scale 3, drafts drawn from them; fixed seeds), with the laws as
numpy arrays and as torch CPU tensors through the device route (``batch_builds``: the batched quantities computed
in the laws' namespace, read once), in process CPU milliseconds per position (median of ``--repeat``), for a cheap
position and a subsampled one. With ``--against DIR`` (an older checkout's root) the same runs in a fresh process
for that checkout's ``otspec`` and this one's, in turn (``--rounds``), the 1-minute load average printed by each,
and the largest relative difference between the two checkouts' rows (every value of every position).

Usage: ``python experiments/bench_profile_subsampled.py [--against DIR] [--rounds 2] [--positions 3] [--repeat 3]
[--V 128256]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
V = 128_256  # the vocabulary (--V: e.g. 49,152, SmolLM2's)
K_MAX = L_MAX = 4


def tree(seed: int):
    """A draft tree of ``K_MAX`` blocks of ``L_MAX`` tokens whose laws depend on the prefix only."""
    rng = np.random.default_rng(seed)
    X = np.zeros((K_MAX, L_MAX), dtype=np.int64)
    P, Q = np.empty((K_MAX, L_MAX, V)), np.empty((K_MAX, L_MAX + 1, V))
    laws: dict = {}

    def law():
        z = rng.standard_normal(V) * 3.0
        w = np.exp(z - z.max())
        return w / w.sum()

    for r in range(K_MAX):
        for j in range(L_MAX + 1):
            key = tuple(X[r, :j].tolist())
            if key not in laws:
                laws[key] = (law(), law())
            Q[r, j] = laws[key][1]
            if j < L_MAX:
                P[r, j] = laws[key][0]
                X[r, j] = rng.choice(V, p=P[r, j])
    return X, P, Q


def child(positions: int, repeat: int, out: str) -> None:
    """Time this checkout's ``position_rows`` (numpy; torch through ``batch_builds``) and dump its rows."""
    import torch

    from otspec.profile import ProfileSettings
    from otspec.profile._collect import _Rows, batch_builds, position_rows

    torch.set_num_threads(1)
    s = ProfileSettings(k_max=K_MAX, L_max=L_MAX).for_vocabulary(V)
    trees = [tree(i) for i in range(positions)]

    def run(X, P, Q, lib, costly):
        rows = _Rows(0)
        if lib == "numpy":
            position_rows(rows, 0, X, P, Q, s, costly=costly)
            return rows
        Pt, Qt = torch.from_numpy(P), torch.from_numpy(Q)
        try:
            bl = batch_builds(X[None], Pt[None], Qt[None], s, [costly])
        except TypeError:  # a checkout whose batch_builds takes no subsampled flags
            bl = batch_builds(X[None], Pt[None], Qt[None], s)
        position_rows(rows, 0, X, Pt, Qt, s, costly=costly, builds=bl[0])
        return rows

    res = {"load": os.getloadavg()[0], "verifiers": list(s.verifiers), "families": list(s.families)}
    values = {}
    for lib in ("numpy", "torch"):
        for costly in (False, True):
            times = []
            for rep in range(repeat):
                for i, (X, P, Q) in enumerate(trees):
                    t0 = time.process_time()
                    rows = run(X, P, Q, lib, costly)
                    times.append(time.process_time() - t0)
                    if rep == 0 and costly:
                        c = rows.cols
                        for n in range(len(c["value"])):
                            key = f"{lib}|{i}|{c['kind'][n]}|{c['name'][n]}|{c['k'][n]}|{c['j'][n]}"
                            values[key] = float(c["value"][n])
            res[f"{lib}-{'subsampled' if costly else 'cheap'}"] = float(np.median(times)) * 1e3
    res["load_end"] = os.getloadavg()[0]
    Path(out).write_text(json.dumps({"timing": res, "values": values}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--positions", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--V", type=int, default=V)
    a = ap.parse_args()
    globals()["V"] = a.V
    if a.child:
        child(a.positions, a.repeat, a.child)
        return
    roots = [("before", Path(a.against).resolve())] if a.against else []
    roots.append(("after", ROOT))
    print(f"one position's exact analysis, V = {V:,}, k_max = L_max = {K_MAX}, synthetic laws, 1 torch thread, "
          f"process CPU ms per position (median of {a.repeat} x {a.positions} positions); "
          f"{os.cpu_count()} cores", flush=True)
    print("round | checkout | numpy cheap | numpy subsampled | torch cheap | torch subsampled | load (1 min) start->end")
    last = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for label, root in roots:
                out = str(Path(tmp) / f"{label}.json")
                env = dict(os.environ, PYTHONPATH=str(root))
                subprocess.run([sys.executable, __file__, "--child", out, "--positions", str(a.positions),
                                "--repeat", str(a.repeat), "--V", str(a.V)], env=env, check=True)
                got = json.loads(Path(out).read_text())
                t = got["timing"]
                last[label] = got
                print(" | ".join([str(r + 1), label] + [f"{t[k]:.0f}" for k in (
                    "numpy-cheap", "numpy-subsampled", "torch-cheap", "torch-subsampled")]
                    + [f"{t['load']:.2f}->{t['load_end']:.2f}"]), flush=True)
    if "before" in last:
        b, n = last["before"]["values"], last["after"]["values"]
        assert set(b) == set(n), sorted(set(b) ^ set(n))[:5]
        worst, where = 0.0, None
        for key, v in b.items():
            w = n[key]
            if v == w or (v != v and w != w):
                continue
            d = abs(w - v) / abs(v) if v else float("inf")
            if d > worst:
                worst, where = d, key
        print(f"rows of the subsampled positions: {len(b)} values, largest relative difference before/after "
              f"{worst:.2e} ({where})")
        print("verifiers", last["after"]["timing"]["verifiers"], "families", last["after"]["timing"]["families"])


if __name__ == "__main__":
    main()
