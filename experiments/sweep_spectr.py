"""SpecTr block efficiency on Markov-chain pairs, exactly: K in {1, 2, 4, 8}, L in {4, 8}, several verifiers.

The shape of SpecTr's Table 4 (arXiv, LM1B, three draft-model sizes) and of
the conference version's Table 2 (the 6M draft), with LM-like toy models:

* target: an order-1 Markov chain on ``V`` tokens, Dirichlet(``conc``) rows
  (peaked, like a language model's next-token law);
* drafts: ``softmax(log T + sigma * G)`` per row with one fixed Gaussian
  perturbation ``G``, ``sigma`` calibrated (Brent) so that the *exact* K = 1,
  L = 4 block efficiency equals the paper's "Speculative" row of the draft
  size it stands for (1.86, 2.21, 2.71 for the 2M, 6M, 20M drafts). Every
  other cell (K > 1, L = 8, each verifier) is then a prediction of the toy
  model, computed exactly by :func:`otspec.spectr.block_efficiency`.
* block efficiency is averaged over the context token drawn from the
  target chain's stationary law (the papers average over test prompts).

Usage::

    python experiments/sweep_spectr.py            # V = 6, three drafts, all cells (about a minute)
    python experiments/sweep_spectr.py --quick    # V = 4, one draft, K <= 4
    python experiments/sweep_spectr.py --out results/sweep_spectr.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import otspec
from otspec import spectr
from otspec.models import MarkovModel

#: SpecTr arXiv Table 4 (LM1B, 97M target): block efficiency by draft model, (K, L).
PAPER_TABLE4 = {
    "2M": {(1, 4): 1.86, (2, 4): 2.07, (4, 4): 2.32, (8, 4): 2.56,
           (1, 8): 1.91, (2, 8): 2.15, (4, 8): 2.41, (8, 8): 2.68},
    "6M": {(1, 4): 2.21, (2, 4): 2.43, (4, 4): 2.74, (8, 4): 2.99,
           (1, 8): 2.33, (2, 8): 2.61, (4, 8): 2.96, (8, 8): 3.27},
    "20M": {(1, 4): 2.71, (2, 4): 2.96, (4, 4): 3.28, (8, 4): 3.49,
            (1, 8): 3.12, (2, 8): 3.48, (4, 8): 3.85, (8, 8): 4.15},
}
#: SpecTr conference Table 2 (LM1B, 6M draft, 97M target): decoded tokens per serial call.
PAPER_CONF_TABLE2 = {(1, 4): 2.2, (2, 4): 2.4, (4, 4): 2.7, (8, 4): 3.0,
                     (1, 8): 2.3, (2, 8): 2.6, (4, 8): 3.0, (8, 8): 3.3}

KS = (1, 2, 4, 8)
LS = (4, 8)


def available_verifiers() -> list[str]:
    """Verifier names of otspec.spectr present in this version (k-Seq, the LP plan, ...)."""
    names = []
    for name, attr in [("kseq", "kseq"), ("lp", "otm_lp"), ("optimal", "optimal_verifier"),
                       ("multiround", "multiround")]:
        if hasattr(otspec, attr):
            names.append(name)
    return names


def stationary(T: np.ndarray) -> np.ndarray:
    """Stationary law of a row-stochastic matrix (eigenvector of eigenvalue 1)."""
    w, v = np.linalg.eig(T.T)
    s = np.real(v[:, int(np.argmin(np.abs(w - 1.0)))])
    return s / s.sum()


@dataclass(frozen=True, eq=False)
class Pair:
    """A (draft, target) Markov pair with its calibration."""

    label: str
    draft: MarkovModel
    target: MarkovModel
    pi: np.ndarray
    sigma: float
    acceptance: float  # stationary-weighted per-step acceptance sum_x min(p, q)


def average_block_efficiency(pair: Pair, K: int, L: int, verifier, branching=None) -> float:
    """Exact block efficiency averaged over the context token s ~ pi (stationary law of the target)."""
    return float(sum(pi_s * spectr.block_efficiency(pair.draft, pair.target, K, L, verifier=verifier,
                                                    branching=branching, prefix=(s,))
                     for s, pi_s in enumerate(pair.pi) if pi_s > 0))


def make_pair(V: int, k1_l4_efficiency: float, *, label: str = "", conc: float = 0.3, seed: int = 0) -> Pair:
    """Target chain and a perturbed draft calibrated to a K = 1, L = 4 block efficiency."""
    from scipy.optimize import brentq

    gen = np.random.default_rng(seed)
    T = gen.dirichlet(np.full(V, conc), size=V)
    T = np.maximum(T, 1e-12)
    T /= T.sum(axis=1, keepdims=True)
    G = gen.standard_normal((V, V))
    pi = stationary(T)
    target = MarkovModel(T)

    def draft_table(sigma):
        lg = np.log(T) + sigma * G
        P = np.exp(lg - lg.max(axis=1, keepdims=True))
        return P / P.sum(axis=1, keepdims=True)

    k1 = spectr.resolve_verifier("kseq")  # K = 1: every verifier is the maximal coupling

    def gap(sigma):
        pair = Pair(label, MarkovModel(draft_table(sigma)), target, pi, sigma, 0.0)
        return average_block_efficiency(pair, 1, 4, k1) - k1_l4_efficiency

    sigma = brentq(gap, 0.0, 50.0, xtol=1e-10)
    P = draft_table(sigma)
    acc = float(pi @ np.minimum(P, T).sum(axis=1))
    return Pair(label, MarkovModel(P), target, pi, float(sigma), acc)


def paper_pairs(V: int = 6, seed: int = 0, labels=("2M", "6M", "20M")) -> list[Pair]:
    """One pair per draft size of Table 4, calibrated to its K = 1, L = 4 value."""
    return [make_pair(V, PAPER_TABLE4[lab][1, 4], label=lab, seed=seed) for lab in labels]


def sweep(pairs, verifiers, Ks=KS, Ls=LS, *, progress: bool = True) -> list[dict]:
    """Exact block efficiency of every (pair, verifier, K, L); one verifier cache per (pair, verifier)."""
    cells = [(pair, v, K, L) for pair in pairs for v in verifiers for L in Ls for K in Ks]
    factories = {(id(pair), v): spectr.resolve_verifier(v) for pair in pairs for v in verifiers}
    it = cells
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(cells, desc="SpecTr sweep", unit="cell")
    rows = []
    for pair, v, K, L in it:
        t0 = time.perf_counter()
        be = average_block_efficiency(pair, K, L, factories[id(pair), v])
        rows.append({"draft": pair.label, "acceptance": pair.acceptance, "sigma": pair.sigma,
                     "verifier": v, "K": K, "L": L, "block_efficiency": be,
                     "paper": PAPER_TABLE4.get(pair.label, {}).get((K, L), float("nan")),
                     "seconds": time.perf_counter() - t0})
    return rows


def shape_checks(rows) -> dict[str, bool]:
    """The qualitative claims of Table 4 on the sweep's numbers."""
    be = {(r["draft"], r["verifier"], r["K"], r["L"]): r["block_efficiency"] for r in rows}
    drafts = sorted({r["draft"] for r in rows})
    verifiers = sorted({r["verifier"] for r in rows})
    Ks = sorted({r["K"] for r in rows})
    Ls = sorted({r["L"] for r in rows})
    out = {}
    out["rises with K"] = all(be[d, v, a, L] < be[d, v, b, L] for d in drafts for v in verifiers
                              for L in Ls for a, b in zip(Ks, Ks[1:]))
    out["rises with L"] = all(be[d, v, K, a] < be[d, v, K, b] for d in drafts for v in verifiers
                              for K in Ks for a, b in zip(Ls, Ls[1:]))
    if "kseq" in verifiers:
        out["k-Seq above K = 1"] = all(be[d, "kseq", K, L] > be[d, "kseq", 1, L] for d in drafts
                                       for K in Ks if K > 1 for L in Ls)
    for opt in ("lp", "optimal"):
        if opt in verifiers and "kseq" in verifiers:
            out[f"{opt} >= k-Seq"] = all(be[d, opt, K, L] >= be[d, "kseq", K, L] - 1e-12
                                         for d in drafts for K in Ks for L in Ls)
    return out


def format_table(rows) -> str:
    verifiers = list(dict.fromkeys(r["verifier"] for r in rows))
    be = {(r["draft"], r["verifier"], r["K"], r["L"]): r["block_efficiency"] for r in rows}
    acc = {r["draft"]: r["acceptance"] for r in rows}
    lines = [f"{'draft':>6} {'acc':>6} {'K':>2} {'L':>2} {'paper':>6} " + " ".join(f"{v:>10}" for v in verifiers)]
    for d in dict.fromkeys(r["draft"] for r in rows):
        for L in sorted({r["L"] for r in rows}):
            for K in sorted({r["K"] for r in rows}):
                paper = PAPER_TABLE4.get(d, {}).get((K, L), float("nan"))
                lines.append(f"{d:>6} {acc[d]:6.3f} {K:2d} {L:2d} {paper:6.2f} "
                             + " ".join(f"{be[d, v, K, L]:10.4f}" for v in verifiers))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="V = 4, the 6M-like draft only, K in {1, 2, 4}")
    ap.add_argument("--V", type=int, default=None, help="vocabulary size (default 6; 4 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the rows as CSV here")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    V = args.V or (4 if args.quick else 6)
    labels = ("6M",) if args.quick else ("2M", "6M", "20M")
    Ks = (1, 2, 4) if args.quick else KS
    t0 = time.perf_counter()
    pairs = paper_pairs(V, args.seed, labels)
    rows = sweep(pairs, available_verifiers(), Ks, LS, progress=not args.no_progress)
    print(format_table(rows))
    for name, ok in shape_checks(rows).items():
        print(f"{name}: {'yes' if ok else 'NO'}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
