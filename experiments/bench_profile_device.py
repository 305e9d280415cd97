"""The profile's per-position analysis on the host (numpy) against the models' device (torch), side by side.

A profile on a GPU scores a draft tree in a few milliseconds; if the exact quantities of the position
(alpha_k per depth, the maximal coupling, token and block E[tau | X]) then ran on the host, the GPU would
wait on them. ``otspec.profile`` keeps the target's laws on the models' device
(:func:`otspec.profile._collect.analysis_device`) and runs the batched quantities there through the array
API. This script times :func:`otspec.profile._collect.position_rows` on the same trees three ways -- numpy
on the host, torch tensors on the CPU, torch tensors on ``--device`` -- at the real vocabulary
(V = 49,152, k_max = L_max = 4) with peaked laws (softmax of Gaussian logits), and checks that the three
give the same rows (to 1e-12 relative).

    python experiments/bench_profile_device.py                 # CPU only: numpy vs torch-CPU
    python experiments/bench_profile_device.py --device cuda   # adds the GPU column
    python experiments/bench_profile_device.py --text 32       # the renewal tables' text quantities instead

Ratios are printed; the load average is recorded (a loaded CPU slows the host columns).
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def trees(n: int, V: int, k: int, L: int, seed: int = 0):
    """``n`` synthetic draft trees: (X, P, Q) with peaked draft/target laws sharing most of their mass."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        base = rng.normal(0.0, 3.0, size=V)
        P = np.empty((k, L, V))
        Q = np.empty((k, L + 1, V))
        X = np.empty((k, L), dtype=np.int64)
        for j in range(L + 1):
            zq = base + rng.normal(0.0, 1.0, size=V)
            q = np.exp(zq - zq.max())
            Q[:, j] = q / q.sum()
            if j < L:
                zp = zq + rng.normal(0.0, 1.0, size=V)
                p = np.exp(zp - zp.max())
                P[:, j] = p / p.sum()
                X[:, j] = rng.choice(V, size=k, p=P[0, j])
        out.append((X, P, Q))
    return out


def _routes(device: str | None):
    """``{route name: numpy array -> that route's array}`` (numpy, torch CPU, torch on ``device``) and the device to
    synchronise (None on the CPU)."""
    import torch

    routes = {"numpy (host)": lambda a: a, "torch CPU": torch.from_numpy}
    if device and device != "cpu":
        routes[f"torch {device}"] = lambda a: torch.from_numpy(a).to(device)
    return routes, (device if device and device != "cpu" else None)


def _table(times: dict, values: dict, unit: str) -> None:
    """Each route's best time, its ratio to numpy's and its largest relative difference from numpy's values."""
    ref = values["numpy (host)"]
    print(f"{'route':<22}{unit:>14}{'vs numpy':>10}{'max rel. diff':>15}")
    for name, t in times.items():
        diff = float(np.max(np.abs(values[name] - ref) / np.maximum(np.abs(ref), 1e-300)))
        flag = "" if diff <= 1e-12 else "  MISS (values differ)"
        print(f"{name:<22}{1e3 * t:>14.2f}{t / times['numpy (host)']:>10.3f}{diff:>15.1e}{flag}")


def run(device: str | None, n: int, repeat: int) -> None:
    import torch

    from otspec.profile import ProfileSettings
    from otspec.profile._collect import _Rows, position_rows

    V, k, L = 49_152, 4, 4
    settings = ProfileSettings(k_max=k, L_max=L, verifiers=["token", "optimal"], families=["token", "block",
                                                                                          "block-onestep"])
    data = trees(n, V, k, L)
    routes, dev = _routes(device)

    from otspec._timing import timed

    values, times = {}, {}
    for name, conv in routes.items():
        laws = [(X, conv(P), conv(Q)) for X, P, Q in data]
        rows = _Rows(0)
        position_rows(rows, 0, *laws[0], settings, costly=False)  # warm-up (kernels, caches)

        def all_positions(laws=laws):
            rows = _Rows(0)
            for t, (X, P, Q) in enumerate(laws):
                position_rows(rows, t, X, P, Q, settings, costly=False)
            return rows

        # synchronised before and after each repeat (otspec._timing: one way to time device work)
        times[name] = min(timed(all_positions, device=dev, warmup=0, repeats=repeat).samples) / n
        values[name] = np.array(all_positions().cols["value"])
    print(f"load average {os.getloadavg()}; V = {V}, k_max = L_max = {k}; {n} positions x {repeat} repeats (best)")
    if device and device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(0)}")
    _table(times, values, "ms / position")


def text_run(device: str | None, T: int, repeat: int, V: int = 128_256) -> None:
    """The renewal tables' text quantities of one prompt (``T`` text positions at vocabulary ``V``): the ranks of the
    text tokens and the emission tables of a static top-k tree and of an i.i.d. tree with SpecInfer's rule
    (``branching(4,2)``), numpy on the host against torch tensors (CPU, and ``--device``), the same values."""
    from otspec._timing import timed
    from otspec.profile._trees import iid_emission_along, text_ranks, topk_emission_along
    from otspec.tree import TreeShape

    (_, P, Q), = trees(1, V, 1, T)  # one block of T draft laws and T + 1 target laws: a text's laws
    P, Q = P[0], Q[0, :T]
    y = np.array([int(np.random.default_rng(t).choice(V, p=Q[t])) for t in range(T)])
    shape = TreeShape.branching(4, 2)
    routes, dev = _routes(device)
    times, values = {}, {}
    for name, conv in routes.items():
        Pd, Qd = conv(P), conv(Q)

        def once(Pd=Pd, Qd=Qd):
            return (text_ranks(Pd, y), topk_emission_along(shape, Pd, Qd, y), iid_emission_along(shape, Pd, Qd, y))

        once()
        times[name] = min(timed(once, device=dev, warmup=0, repeats=repeat).samples)
        values[name] = np.concatenate([np.ravel(v).astype(np.float64) for v in once()])
    print(f"renewal text quantities, V = {V}, T = {T} text positions, branching(4,2); load average {os.getloadavg()}")
    _table(times, values, "ms / prompt")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="a torch device for the third column (e.g. cuda)")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--text", type=int, default=0, metavar="T",
                    help="instead: the renewal tables' text quantities of one prompt of T positions at V = 128,256")
    args = ap.parse_args(argv)
    if args.text:
        text_run(args.device, args.text, args.repeat)
        return
    run(args.device, args.positions, args.repeat)


if __name__ == "__main__":
    main()
