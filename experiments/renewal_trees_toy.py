"""Draft trees on the bigram toy pair: the profile's renewal estimate and Palm average against the exact law of
tree decoding and against many real decodes with ``speculative_decode``.

On a bigram pair the context of an iteration is its last token, so decoding ``T`` tokens is a Markov renewal
process over start states whose kernel is read off the tree verifiers' own emission laws on every realised tree
(``tests/test_profile_renewal_trees.py``, an independent route from the profile's emission tables along the text).
Printed per family: the exact tokens kept per call ``T / E[calls]`` (TPC_T) beside the profile's renewal estimate
and the decodes' kept tokens per call; the exact tokens emitted per call ``E[T + overshoot] / E[calls]`` (BE_T)
beside the profile's Palm average and the decodes' emitted tokens per call; the long-run rate; the profile's
per-position average. Intervals: the profile's 95 % bootstrap over prompts, the decodes' 95 % delta method over
decodes.

    python experiments/renewal_trees_toy.py [V seed closeness T n_prompts_and_decodes x0]

Defaults ``5 4 0.8 8 2000 1`` (the tests' pair, the reproduce report's 8 tokens): a few minutes of CPU.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otspec.profile import profile, summarize  # noqa: E402
from tests.test_profile_renewal_trees import (  # noqa: E402
    FAMILIES,
    TREES,
    _decodes,
    _exact,
    _kernel,
    _long_run,
    _pair,
    _ratio,
)


def main(V=5, seed=4, closeness=0.8, T=8, n=2000, x0=1) -> None:
    import torch

    torch.set_num_threads(1)
    draft, target, Md, Mt = _pair(V, seed, closeness)
    with tempfile.TemporaryDirectory() as out:
        profile([[x0]] * n, out=out, draft=draft, target=target, trees=TREES, k_max=1, L_max=2, max_new_tokens=T,
                verifiers=["token"], families=["token"], shard_size=32, seed=0, progress=False)
        ts = summarize(out, n_boot=200).trees
    print(f"toy pair V={V} seed={seed} closeness={closeness}, prompt [{x0}], T={T}, {n} profiled texts, "
          f"{n} decodes per family")

    def ci(e):
        return "-" if e is None else f"{e.value:.4f} [{e.lo:.4f}, {e.hi:.4f}]"

    for name, (shape, process, v) in FAMILIES.items():
        K = _kernel(shape, process, v, Md, Mt)
        tpc, be = _exact(K, x0, T)
        kept, emitted, calls = _decodes(draft, target, shape, process, v, n, x0=x0, n_tokens=T, seed=10_000)
        (kr, ks), (er, es) = _ratio(kept, calls), _ratio(emitted, calls)
        print(f"{name}: kept per call: exact {tpc:.4f}, renewal {ci(ts.renewal.get(name))}, decodes {kr:.4f} +- "
              f"{1.96 * ks:.4f} | emitted per call: exact {be:.4f}, Palm {ci(ts.palm.get(name))}, decodes "
              f"{er:.4f} +- {1.96 * es:.4f} | long run {_long_run(K):.4f} | per-position "
              f"{ci(ts.tokens_per_call.get(name))}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    kinds = (int, int, float, int, int, int)
    main(*(k(a) for k, a in zip(kinds, args)))
