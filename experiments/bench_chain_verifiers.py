"""The chains' verifiers, before and after a change: the decoder's time outside the forward passes per iteration.

Every chain verifier named (``verifier:L``: speculative sampling ``token``, one-step block verification
``block-onestep``, block verification ``block``; ``k = 1``, ``engine="auto"``: the device route where the verifier
has one) decodes the same prompts with the same seeds in child processes that alternate between a checkout of the
package at an earlier commit (``--before PATH``) and this one, one process per repeat and checkout (each builds the
pair, warms up and decodes every prompt), so both see the same load. Printed per verifier and checkout: the medians
over repeats of ms and CPU ms per generated token, ms per iteration, ms outside the forwards per iteration (every
``logits`` call of both models timed by the decoder's clock, :class:`bench_decode_overhead.Timed`) and its share of
the iteration, with the load average before and after. Targets: the share at most 0.25 for the small V = 128,256
pair and 0.10 for SmolLM2 on the CPU.

Run: ``python experiments/bench_chain_verifiers.py --before CHECKOUT [--pair small] [--cases
token:2,token:4,block-onestep:2,block-onestep:4,block:2,block:4] [--tokens 32] [--repeats 5] [--threads 1] [--rst]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench import print_table  # noqa: E402

TARGETS = {"smollm2": 0.10, "small": 0.25}
FIELDS = ("ms/token", "CPU ms/token", "ms/iteration", "outside ms/iteration", "outside forwards")


def child(pair: str, cases: list[tuple[str, int]], tokens: int, threads: int) -> None:
    """One process: build the pair, warm up every case, decode every prompt once per case; print the totals."""
    import numpy as np
    import torch
    from bench_decode_overhead import Timed, small_pair, smollm2

    import otspec.decoding as D

    torch.set_num_threads(threads)
    target, draft, prompts = (small_pair if pair == "small" else smollm2)("cpu", torch.float32)
    tt, td = Timed(target), Timed(draft)

    def run(v, L, ids, seed):
        tt.forward = td.forward = 0.0
        c0 = time.process_time()
        r = D.speculative_decode(ids, draft=td, target=tt, verifier=v, L=L, max_new_tokens=tokens, rng=seed)
        return np.array([r.wall_time, r.tokens.shape[0], r.iterations, tt.forward + td.forward,
                         time.process_time() - c0])

    for v, L in cases:
        run(v, L, prompts[0][:8], 0)
    out = {}
    for v, L in cases:
        wall, n, it, fwd, cpu = sum(run(v, L, ids, 1000 + i) for i, ids in enumerate(prompts))
        out[f"{v}:{L}"] = [1e3 * wall / n, 1e3 * cpu / n, 1e3 * wall / it, 1e3 * (wall - fwd) / it, 1.0 - fwd / wall]
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of the package at an earlier commit")
    ap.add_argument("--pair", default="small", choices=sorted(TARGETS))
    ap.add_argument("--cases", default="token:2,token:4,block-onestep:2,block-onestep:4,block:2,block:4")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rst", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in a.cases.split(",")]
    if a.child:
        child(a.pair, cases, a.tokens, a.threads)
        return
    here = Path(__file__).resolve().parent.parent
    sides = {"before": Path(a.before).resolve(), "after": here}
    got = {s: [] for s in sides}
    load0 = os.getloadavg()[0]
    for _ in range(a.repeats):
        for side, root in sides.items():
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--before", a.before, "--pair", a.pair,
                   "--cases", a.cases, "--tokens", str(a.tokens), "--threads", str(a.threads)]
            env = dict(os.environ, PYTHONPATH=str(root))
            res = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
            got[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()[0]
    rows = []
    for v, L in cases:
        key = f"{v}:{L}"
        base = statistics.median(g[key][3] for g in got["before"])
        for side in sides:
            med = [statistics.median(g[key][i] for g in got[side]) for i in range(len(FIELDS))]
            rows.append([f"{v}, L = {L}", side, *med[:4], med[3] / base, med[4]])
    head = ("verifier", "checkout", *FIELDS[:4], "outside x before", FIELDS[4])
    print_table(f"pair {a.pair}, {a.tokens} tokens x prompts, medians of {a.repeats} alternating repeats; load "
                f"average {load0:.2f} -> {load1:.2f}", head, rows, a.rst,
                target=(FIELDS[4], TARGETS[a.pair]))


if __name__ == "__main__":
    main()
