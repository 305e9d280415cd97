"""How biased is the profile's per-position average on real text? (docs/theory/profile.rst, "Measured on real text")

Real speculative decoding starts its iterations at positions chosen by the
decoding; a profile averages over every position. On target-sampled texts
the start probabilities r(t) are exact (``otspec.profile.starts_recursion``),
so tokens per target call has an unbiased renewal estimate
(``otspec.profile.tokens_per_call``), and the per-position average
(``otspec.profile.per_position_tokens_per_call``) can be compared with it on
the same texts, paired.

At draft length ``L = 1`` everything is exact from two teacher-forced
passes over each text: ``m(t) = 1 + a(t)`` with ``a(t)`` the verifier's
acceptance at the text's context (token verification: the maximal coupling,
Leviathan et al., arXiv:2211.17192, Algorithm 1; k-Seq, SpecTr, Sun et al.,
arXiv:2310.15141, Algorithm 2, and recursive rejection with two i.i.d.
drafts), and the emission tables from the laws along the text
(``otspec.profile.emission_probs_along``).

Pair: target SmolLM2-135M-Instruct, draft = it with six layers skipped
(``otspec.decoding.smollm2_pair``); texts sampled from the target at
temperature 1 over the whole vocabulary (no top-k), up to ``--max-new-tokens``
tokens after each chat prompt, ending at the end-of-sequence token.

Prints, per scheme: the per-position average, the renewal estimate
(``T / sum r``: tokens per call of decoding these texts, the last
iteration's overshoot cut at the text's end), the Palm average (the
per-position values weighted by r: consistent for the long-run tokens per
call, overshoot included), and the relative excess of the per-position
average over the Palm average with a 95 % bootstrap interval over texts
(paired: the same resampled texts for both).

Usage::

    python experiments/renewal_bias_real.py                    # 40 prompts x 128 tokens, ~15 min on 2 CPU cores
    python experiments/renewal_bias_real.py --prompts 8 --max-new-tokens 32   # a quick look
    python experiments/renewal_bias_real.py --json results/renewal_bias.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chat_prompts import CHAT_PROMPTS, chat_ids  # noqa: E402

#: (scheme, k): the schemes with a closed-form emission table and a batched acceptance at L = 1.
SCHEMES = (("token", 1), ("kseq", 2), ("multiround", 2))
N_BOOT = 2000


def sample_text(target, prompt: list[int], max_new_tokens: int, eos: int | None, rng: np.random.Generator):
    """A continuation sampled from the target (temperature 1, whole vocabulary): tokens and their laws (T, V)."""
    import torch

    from otspec.decoding import Sampling
    from otspec.decoding._sampling import sample_rows

    sampling = Sampling(1.0)
    state = target.new_state()
    logits = target.logits(state, torch.tensor([prompt]))[:, -1:]
    ys, qs = [], []
    for _ in range(max_new_tokens):
        q = sampling.probs(logits)[0, 0].numpy()
        y = int(sample_rows(q[None], rng)[0])
        ys.append(y)
        qs.append(q)
        if y == eos:
            break
        logits = target.logits(state, torch.tensor([[y]]))
    return np.array(ys, dtype=np.int64), np.array(qs)


def draft_laws(draft, prompt: list[int], y: np.ndarray) -> np.ndarray:
    """``p(. | prompt, y_<t)`` for every t: one teacher-forced draft pass, (T, V) float64."""
    import torch

    from otspec.decoding import Sampling

    ids = torch.tensor([list(prompt) + y[:-1].tolist()])
    return Sampling(1.0).probs(draft.logits(draft.new_state(), ids)[:, -len(y):])[0].numpy()


def acceptance_rows(scheme: str, k: int, P: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Exact acceptance at each row (L = 1): the batched closed forms, or the verifier's own ``acceptance()``."""
    from otspec.multidraft import batched_kseq_acceptance, batched_maximal_coupling_acceptance, multiround

    if scheme == "token":
        return np.asarray(batched_maximal_coupling_acceptance(P, Q), dtype=np.float64)
    if scheme == "kseq":
        return np.asarray(batched_kseq_acceptance(P, Q, k), dtype=np.float64)
    return np.array([multiround(p, q, k).acceptance() for p, q in zip(P, Q)])


def measure(n_prompts: int, max_new_tokens: int, seed: int, threads: int, progress: bool) -> dict:
    import torch

    from otspec.decoding import smollm2_pair
    from otspec.profile import emission_probs_along, starts_recursion

    torch.set_num_threads(threads)
    tok, target, draft = smollm2_pair(device="cpu", threads=threads)
    per_text = {f"{s} k={k}": [] for s, k in SCHEMES}
    lengths = []
    t0 = time.perf_counter()
    for i, text in enumerate(CHAT_PROMPTS[:n_prompts]):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(i,)))
        prompt = chat_ids(tok, text)
        y, Q = sample_text(target, prompt, max_new_tokens, tok.eos_token_id, rng)
        P = draft_laws(draft, prompt, y)
        log_q = np.log(Q[np.arange(len(y)), y])
        lengths.append(len(y))
        for s, k in SCHEMES:
            m = 1.0 + acceptance_rows(s, k, P, Q)
            r = starts_recursion(emission_probs_along(s, P, Q, y, L=1, k=k), log_q)
            per_text[f"{s} k={k}"].append((m.sum(), r.sum(), (r * m).sum()))
        if progress:
            print(f"text {i + 1}/{n_prompts}: {len(y)} tokens, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    T = np.array(lengths, dtype=np.float64)
    boot = np.random.default_rng(seed).integers(0, len(T), size=(N_BOOT, len(T)))
    out = {"pair": {"target": target.name, "draft": draft.name}, "texts": len(T), "tokens": int(T.sum()),
           "settings": {"prompts": n_prompts, "max_new_tokens": max_new_tokens, "seed": seed, "L": 1,
                        "temperature": 1.0, "top_k": None},
           "schemes": {}}
    for key, rows in per_text.items():
        M, R, RM = (np.array(c) for c in zip(*rows))
        naive, renewal, palm = M.sum() / T.sum(), T.sum() / R.sum(), RM.sum() / R.sum()
        excess = (M[boot].sum(1) / T[boot].sum(1)) / (RM[boot].sum(1) / R[boot].sum(1)) - 1.0
        lo, hi = np.quantile(excess, [0.025, 0.975])
        out["schemes"][key] = {"per_position": round(float(naive), 6), "renewal": round(float(renewal), 6),
                               "palm": round(float(palm), 6), "excess": round(float(naive / palm - 1.0), 6),
                               "excess_lo": round(float(lo), 6), "excess_hi": round(float(hi), 6)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=40, help="chat prompts (at most %(default)s by default; 72 exist)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--progress", action="store_true")
    a = ap.parse_args(argv)
    if not 1 <= a.prompts <= len(CHAT_PROMPTS):
        ap.error(f"--prompts must lie in [1, {len(CHAT_PROMPTS)}], got {a.prompts}")
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be >= 1, got {a.max_new_tokens}")
    res = measure(a.prompts, a.max_new_tokens, a.seed, a.threads, a.progress)
    print(f"{res['texts']} texts, {res['tokens']} tokens, L = 1")
    print(f"{'scheme':<14}{'per-position':>13}{'renewal':>10}{'Palm':>10}   excess [95 % interval]")
    for key, v in res["schemes"].items():
        print(f"{key:<14}{v['per_position']:>13.4f}{v['renewal']:>10.4f}{v['palm']:>10.4f}   "
              f"{100 * v['excess']:+.2f} % [{100 * v['excess_lo']:+.2f}, {100 * v['excess_hi']:+.2f}] %")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
