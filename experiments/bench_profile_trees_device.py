"""The profile's sampled tree families (i.i.d., without replacement) on the host (numpy) against the laws' device.

At every profiled position the profile draws each sampled tree family's tree, scores it with one target call and
verifies it (:func:`otspec.profile._trees.draw_and_score`, :func:`otspec.profile._trees.position_values`). The host
route moves every node's ``(V,)`` laws to numpy, draws and verifies there; the device route
(``on_device=True``, :mod:`otspec.profile._trees_device`) draws every node of a depth at once, verifies one forest
per rule and reads the host once per position. This script times both routes on the same contexts, ``B`` prompts
walked together, with the random-weight Llama pair of ``bench_profile.py --llama`` (V = 128,256, forwards that
cost little), per position: wall seconds in the two calls, of which in the models' calls (``logits``,
``tree_logits``, ``Sampling.probs``), and the rest; side by side, with the load average.

    python experiments/bench_profile_trees_device.py                  # CPU: numpy vs torch CPU tensors
    python experiments/bench_profile_trees_device.py --device cuda    # the models and the laws on the GPU

On the CPU the profile takes the host route (``analysis_device`` is None there); the torch-CPU column shows what
the device route's arithmetic costs without an accelerator.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: 16 and 64 draft nodes, each process with its default rule and the target-only rule.
FAMILIES = ["iid:branching(4,3):specinfer,target-only", "wor:branching(4,3):sequoia,target-only",
            "iid:branching(8,7):specinfer", "wor:branching(8,7):sequoia"]


def run(route: str, pair, prompts, positions: int, families, device) -> dict:
    """Seconds per position of ``draw_and_score`` + ``position_values`` on ``route`` ("host" or "device")."""
    import torch

    sys.path.insert(0, str(HERE))
    from bench_profile import _CallClock, _patch

    from otspec.decoding._sampling import Sampling
    from otspec.profile._trees import draw_and_score, position_values, resolve_trees, tree_rng

    _, target, draft = pair
    plan = resolve_trees(families)
    s = Sampling(1.0, None, None, "ties")
    V = int(target.vocab_size)
    rng = np.random.default_rng(0)
    ctx = np.array(prompts, dtype=np.int64)
    rngs = [tree_rng(0, b) for b in range(len(prompts))]
    fwd, saved = _CallClock(), {}
    classes = {c for m in (type(draft), type(target)) for c in type.mro(m) if c is not object}
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    total = 0.0
    taus = []
    try:
        for pos in range(positions + 1):  # the first position warms up (kernels, first shapes): not timed
            ids = torch.as_tensor(ctx).to(device)
            ds, ts = draft.new_state(), target.new_state()
            p = s.probs(draft.logits(ds, ids)[:, -1]).to("cpu").numpy()
            q = s.probs(target.logits(ts, ids)[:, -1]).to("cpu").numpy()
            if pos == 1:
                _patch(classes, ("logits", "tree_logits"), fwd, saved)
                _patch({Sampling}, ("probs",), fwd, saved)
            sync()
            t0 = time.perf_counter()
            got = draw_and_score(draft, ds, target, ts, ctx[:, -1], ctx.shape[1], p, q, plan, s, rngs,
                                 on_device=route == "device")
            vals = [position_values(plan, g, V) for g in got]
            sync()
            if pos:
                total += time.perf_counter() - t0
                taus.append([v["tree"][n] for v in vals for n in plan.names()])
            ctx = np.concatenate([ctx, rng.integers(0, V, size=(len(prompts), 1))], axis=1)
    finally:
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)
    return {"total": total / positions, "forward": fwd.wall / positions, "tau": np.mean(taus, axis=0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--positions", type=int, default=4)
    ap.add_argument("--families", nargs="+", default=FAMILIES)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE))
    from bench_profile import llama_pair

    from otspec.decoding import HFCausalLM

    device = torch.device(args.device)
    _, target, draft = llama_pair()
    if device.type != "cpu":
        target, draft = (HFCausalLM(m.model.to(device), name=m.name) for m in (target, draft))
    pair = (None, target, draft)
    V = 128_256
    prompts = [[(7919 * i + 13 * j + 1) % V for j in range(6)] for i in range(args.prompts)]
    print(f"sampled trees, random-weight Llama pair, V = 128,256, {args.device}, 1 torch thread, {args.prompts} "
          f"prompts walked together x {args.positions} positions; os.getloadavg {os.getloadavg()} on "
          f"{os.cpu_count()} cores", flush=True)
    print("family | route | per position: total ms | models' calls ms | other ms | other: device / host")
    for fam in args.families:
        got = {route: run(route, pair, prompts, args.positions, [fam], device) for route in ("host", "device")}
        h, d = got["host"], got["device"]
        for route, r in got.items():
            other = r["total"] - r["forward"]
            ratio = f"{other / (h['total'] - h['forward']):.2f}" if route == "device" else ""
            print(" | ".join([fam, route if route == "host" else f"device ({device.type} tensors)",
                              f"{r['total'] * 1e3:.1f}", f"{r['forward'] * 1e3:.1f}", f"{other * 1e3:.1f}", ratio]),
                  flush=True)
        print(f"  mean E[tau | T] per name, host {np.round(h['tau'], 3).tolist()}, device "
              f"{np.round(d['tau'], 3).tolist()} (different streams: the same law, not the same trees)", flush=True)
    print(f"os.getloadavg at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
