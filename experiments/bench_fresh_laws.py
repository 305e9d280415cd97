"""Benchmark: the bound with laws given by ``next_dist`` models that declare ``fresh_laws`` (each law read where it
is, checked in one read) against the same models without the declaration (each law copied as it is checked) and
against the laws handed over as arrays (no check).

``otspec.tree.bound`` on ``branching(8, 7)``, budget 256, 64 prefixes per call, at ``V = 49,152``, over laws made
once (softmax of Gaussian logits, a draft and a target 0.3 apart in logit; every law a row of one block per model,
as the rows of a decoding model's tree call are); beside it the check alone of the 512 laws (``law_in_place``), the
copy-and-check alone (``law_into`` into a block of 64 rows) and one compiled read of them (the floor). CPU time
(``time.process_time``) medians of interleaved rounds, the minor page faults per call, the 1-minute load average.
The four bounds are checked equal to the bit.

Usage: python experiments/bench_fresh_laws.py [--process iid|wor] [--repeat 7]
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import time

import numpy as np

from otspec._validation import law_in_place, law_into
from otspec.tree import TreeShape, bound
from otspec.tree import _bound as B

V = 49152


class _Make:
    """Makes each law on first use (the recording run)."""

    def __init__(self, shift: bool):
        self.vocab_size, self.shift, self.laws = V, shift, {}

    def next_dist(self, prefix):
        prefix = tuple(prefix)
        if prefix not in self.laws:
            z = 3.0 * np.random.default_rng([7, *prefix]).standard_normal(V)
            if self.shift:
                z = z + 0.3 * np.random.default_rng([8, *prefix]).standard_normal(V)
            x = np.exp(z - z.max())
            self.laws[prefix] = x / x.sum()
        return self.laws[prefix]


class _Given:
    """The laws made, read from memory; ``fresh_laws`` as given."""

    def __init__(self, laws: dict, fresh: bool):
        self.laws, self.vocab_size, self.fresh_laws = laws, V, fresh

    def next_dist(self, prefix):
        return self.laws[tuple(prefix)]


class _Arrays:
    """Each frontier's laws as lists of the rows (no check), the route of decoding models on the CPU."""

    def __init__(self, d: dict, t: dict):
        self.d, self.t, self.calls = d, t, 0

    def __call__(self, paths):
        self.calls += 1
        return [self.d[tuple(s)] for s in paths], [self.t[tuple(s)] for s in paths]


def _floor_kernel():
    import numba

    def row_sum(x):
        s = 0.0
        for v in range(x.shape[0]):
            s += x[v]
        return s

    return numba.njit(fastmath=True)(row_sum)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--process", default="iid", choices=["iid", "wor"])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    shape, process = TreeShape.branching(8, 7), args.process
    made = [_Make(False), _Make(True)]
    ref = bound(shape, *made, process=process, budget=256, batch=64)
    laws = []
    for m in made:
        keys = list(m.laws)
        block = np.stack([m.laws[s] for s in keys])          # one base per model, rows in the order asked
        laws.append({s: block[i] for i, s in enumerate(keys)})
    fresh, copied = (_Given(laws[0], True), _Given(laws[1], True)), (_Given(laws[0], False), _Given(laws[1], False))
    rows = [x for d in laws for x in d.values()]
    out = np.empty((64, V))
    row_sum = _floor_kernel()
    fns = {
        "bound, fresh laws (read in place)": lambda: bound(shape, *fresh, process=process, budget=256, batch=64),
        "bound, laws copied": lambda: bound(shape, *copied, process=process, budget=256, batch=64),
        "bound, laws as arrays": lambda: B._sampled(B._Slots(shape), process, _Arrays(*laws), 256, 64),
        "check in place of the laws": lambda: [law_in_place(x) for x in rows],
        "copy and check of the laws": lambda: [law_into(x, out[i % 64]) for i, x in enumerate(rows)],
        "one read of the laws": lambda: [row_sum(x) for x in rows],
    }
    values = {fns[k]().value for k in list(fns)[:3]}
    assert values == {ref.value}, (values, ref.value)
    names = list(fns)
    cpu = {k: [] for k in names}
    faults = {k: [] for k in names}
    load0 = os.getloadavg()[0]
    for r in range(args.repeat + 1):
        for k in names[r % len(names):] + names[:r % len(names)]:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.process_time()
            fns[k]()
            t = time.process_time() - t0
            if r:
                cpu[k].append(t)
                faults[k].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}; process {process}; {len(rows)} laws of V = {V} ({sum(x.nbytes for x in rows) / 1e6:.0f} MB); "
          f"bound {ref.value!r}; load average {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    for k in names:
        print(f"  {k:36s} {1e3 * np.median(cpu[k]):7.1f} ms CPU  {int(np.median(faults[k])):5d} minor faults")


if __name__ == "__main__":
    main()
