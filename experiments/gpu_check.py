"""Does the profile's speed-up come true on this device? One table, from a random-weight pair built on the device.

Builds the random-weight draft/target pair of a named serving shape on ``--device`` (no download:
``transformers.LlamaForCausalLM(config)``; the draft is the target's embedding, its first layers, its
final norm and its output head), then, printing each part of the table as soon as it is measured:

1. **forward**: the target's and the draft's forward passes timed directly, synchronised
   (:func:`otspec._timing.timed_rounds`: warm-up, interleaved rounds, median and spread);
2. **calibration**: the same calls as the profile's cost calibration measured them
   (:class:`otspec.profile.Costs`), with any call flagged cheaper than a smaller one;
3. **decoders**: the recommended scheme, the runner-up, a chain and a tree decoded with
   :func:`otspec.decoding.speculative_decode` beside :func:`otspec.decoding.autoregressive_decode` on the
   profile's own prompts (:func:`otspec.profile._check.check_decodes`), each with its prediction (a)
   (otspec's decoder: forward passes plus the decoder's measured work outside them) and (b) (the forward
   passes alone), the measured speed-up and the decoder's share of time outside the forward passes;
4. **transformers**: ``generate`` plain and assisted (``assistant_model=``, ``num_assistant_tokens=L``)
   at the recommended ``L``, on the same prompts.

    python experiments/gpu_check.py                      # the 1B shape (Llama-3.2-1B) on cuda
    python experiments/gpu_check.py --tiny               # a tiny shape on the CPU, well under a minute
    python experiments/gpu_check.py --shape llama-3.2-1b --device cuda --budget-s 330
    python experiments/gpu_check.py --profile-only       # the forward passes and the profile's own work alone
    python experiments/gpu_check.py --budget-s 60 --rounds 3 --seed 1   # the decoders' part only, three rounds

The default run on one H100 is sized for about 6 minutes; ``--budget-s`` stops starting new parts once it
is spent (the parts already printed stand). The load average and the device are printed with the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Shape:
    """A Llama-shaped serving pair: the target's config and the draft's number of layers."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    draft_layers: int
    dtype: str


#: Named shapes: the target's config; the draft keeps the embedding, the first ``draft_layers`` layers and the head.
SHAPES = {
    "llama-3.2-1b": Shape(2048, 16, 32, 8, 8192, 128_256, 4, "bfloat16"),
    "tiny": Shape(32, 2, 4, 2, 64, 2048, 1, "float32"),
    "tiny-128k": Shape(64, 4, 4, 2, 128, 128_256, 1, "float32"),
}

#: What each size runs: the profile, the decodes and transformers' generate.
PLANS = {
    "full": dict(prompts=4, prompt_len=16, positions=16, k_max=2, L_max=4, trees=("topk:branching(4,2)",),
                 families=("token", "kseq", "block-onestep", "block"), decode_tokens=48, rounds=2),
    "tiny": dict(prompts=2, prompt_len=6, positions=4, k_max=2, L_max=2, trees=("topk:branching(2,2)",),
                 families=("token", "block-onestep"), decode_tokens=8, rounds=1),
}


def llama_config(shape: Shape, *, tie: bool = False):
    """The ``transformers.LlamaConfig`` of the target of ``shape`` (output head tied to the embedding with ``tie``)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads, max_position_embeddings=4096,
                       tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def build_pair(shape: Shape, device: str, seed: int = 0):
    """The random-weight ``(draft, target)`` transformers models of ``shape`` on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, shape.dtype)
    cfg = llama_config(shape)
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(cfg).to(dtype).eval()
        draft = LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": shape.draft_layers})
                                 ).to(dtype).eval()
    keep = {k: v for k, v in target.state_dict().items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < shape.draft_layers}
    draft.load_state_dict(keep)
    return draft, target


def _split(sc, name: str, g, s, c) -> str:
    """One line: a scheme's predicted tokens per call and seconds per iteration (prediction (a): the timed step; (b):
    the calibrated forward passes) beside the decodes' (seconds per token times tokens per call)."""
    if isinstance(sc, str):  # a tree's speed-ups are its tokens per call times plain's seconds over its iteration's
        tpc = s.trees.tokens_per_call[sc].value
        it_a = c.decoder_plain * tpc / s.trees.speedup[sc].value
        it_b = c.plain * tpc / s.trees.speedup_forward[sc].value
    else:
        f, k, L = sc
        tpc = s.tokens_per_call[sc].value
        it_a, it_b = c.decoder_iteration(f, k, L), c.iteration(k, L)
    return (f"#   {name}: tokens per call predicted {tpc:.3f}, measured {g.tokens_per_call:.3f}; ms per iteration "
            f"predicted (a) {1e3 * it_a:.3f}, forward passes (b) {1e3 * it_b:.3f}, measured "
            f"{1e3 * g.seconds_per_token * g.tokens_per_call:.3f}; plain ms per token measured "
            f"{1e3 * g.plain_seconds_per_token:.3f}")


def _row(cells, widths=(44, 11, 9, 20, 14, 10, 11)):
    print(" | ".join(str(c).rjust(w) for c, w in zip(cells, widths)), flush=True)


HEAD = ("what", "ms", "x plain", "predicted (a)", "predicted (b)", "measured", "outside fwd")


def _forward_rows(draft, target, k_max: int, L: int, device: str, rows: list) -> None:
    """Synchronised forward passes (:class:`otspec.decoding.HFCausalLM` ``logits``) of the target and the draft
    after a cached context of 8 tokens, each shape with a state of its own, cut back to the context after every
    call outside the clock."""
    import torch

    from otspec._timing import timed_rounds

    ctx_len = 8

    def calls(lm, shapes):
        states, fns = {}, {}
        for r, n in shapes:
            st = lm.new_state()
            lm.logits(st, torch.arange(1, ctx_len + 1, device=device)[None])
            if r > 1:  # r rows holding the context: one call on r rows, then cut back to the context
                lm.logits(st, torch.ones((r, 1), dtype=torch.long, device=device))
                lm.select(st, list(range(r)), ctx_len)
            states[(r, n)] = st
            ids = torch.ones((r, n), dtype=torch.long, device=device)
            fns[(r, n)] = (lambda ids=ids, key=(r, n): lm.logits(states[key], ids))
        return fns, lambda key: lm.select(states[key], list(range(key[0])) if key[0] > 1 else 0, ctx_len)

    with torch.inference_mode():
        fns, reset = calls(target, [(1, 1), (1, L + 1), (k_max, L + 1)])
        t = timed_rounds(fns, device=device, warmup=2, repeats=7, reset=reset)
        fns, reset = calls(draft, [(1, 1), (k_max, 1)])
        d = timed_rounds(fns, device=device, warmup=2, repeats=7, reset=reset)
    plain = t[(1, 1)].median
    for (r, n), tm in t.items():
        rows.append((f"forward: target {r} x {n} tokens", 1e3 * tm.median, tm.median / plain, "", "", "",
                     f"+-{1e3 * tm.spread:.3f}"))
    for (r, n), tm in d.items():
        rows.append((f"forward: draft {r} x {n} tokens", 1e3 * tm.median, tm.median / plain, "", "", "",
                     f"+-{1e3 * tm.spread:.3f}"))


def _generate_rows(draft, target, prompts, L: int, tokens: int, device: str, rows: list, plain_ms: float) -> None:
    """transformers' ``generate``, plain and assisted at ``L``: ms per generated token (synchronised)."""
    import torch

    from otspec._timing import Stopwatch

    def run(**kw):
        sw = Stopwatch(device)
        n = 0
        for i, p in enumerate(prompts):
            ids = torch.tensor([p], device=device)
            torch.manual_seed(i)
            with sw:
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                      min_new_tokens=tokens, do_sample=True, temperature=1.0, top_k=0,
                                      pad_token_id=0, **kw)
            n += out.shape[1] - ids.shape[1]
        return sw.seconds / max(n, 1)

    run()  # warm-up
    assisted_kw = dict(assistant_model=draft)
    draft.generation_config.num_assistant_tokens = L
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    run(**assisted_kw)
    plain = run()
    assisted = run(**assisted_kw)
    rows.append(("transformers generate", 1e3 * plain, plain / (plain_ms / 1e3), "", "", "", ""))
    rows.append((f"transformers assisted L = {L}", 1e3 * assisted, assisted / (plain_ms / 1e3), "", "",
                 f"{plain / assisted:.2f}", ""))


def _calibration_rows(c, plan: dict, L: int, rows: list, prof_s: float, flush) -> None:
    """The cost calibration's rows (:class:`otspec.profile.Costs` ``c``), printed, then its violations."""
    rows.append(("calibration: target 1 x 1 (plain)", 1e3 * c.plain, 1.0, "", "", "", ""))
    for k, LL in sorted({(1, L), (plan["k_max"], L)}):
        rows.append((f"calibration: target {k} x {LL + 1} tokens", 1e3 * c.target[(k, LL)], c.target[(k, LL)] / c.plain,
                     "", "", "", ""))
    for k in sorted({1, plan["k_max"]}):
        rows.append((f"calibration: draft {k} x 1 tokens", 1e3 * c.draft[k], c.draft[k] / c.plain, "", "", "", ""))
    rows.append(("calibration: plain beyond fwd", 1e3 * c.overhead_plain, c.overhead_plain / c.plain, "", "", "",
                 f"{c.overhead_plain / (c.plain + c.overhead_plain):.2f}"))
    flush()
    print(f"# profile + summary {prof_s:.1f} s; cost violations: {len(c.violations)}"
          + "".join(f"\n#   {v}" for v in c.violations), flush=True)


#: Target of the profile's walk on the device: its work outside the forward passes, as a share of them (moonshot 0.10).
PROFILE_TARGET, PROFILE_MOONSHOT = 0.25, 0.10


def _profile_overhead(draft, target, prompts, positions: int, keep: str | None = None) -> None:
    """The profile's own work outside its forward passes on this device at ``k_max = L_max = 4``: the chain
    quantities alone, then with the four tree families of ``experiments/bench_profile.py --llama``; per position
    (the walk along the prompts) and for the whole call (per-run work included). Forward passes and phases are
    timed with the device synchronised at both ends (``bench_profile._CallClock``/``_Phases``). ``keep``: a folder
    where the two profiles stay (``chains``, ``trees``: their cost calibration's every repetition, for
    :func:`otspec.profile.summarize`)."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_profile as B

    threads = torch.get_num_threads()
    print(f"# profile overhead, k_max = L_max = 4, {len(prompts)} prompts x {positions} positions; target: other / "
          f"forward <= {PROFILE_TARGET} per position (moonshot {PROFILE_MOONSHOT})", flush=True)
    print("trees | per position: other ms | forward ms | other / forward | verdict | whole call: wall s | "
          "forward s | other / forward | calibration s | fingerprints s", flush=True)
    try:
        for spec in ("none", B.LLAMA_TREES):
            r = B.tree_overhead(spec, len(prompts), positions, (None, target, draft), prompts=prompts,
                                settings=dict(k_max=4, L_max=4),
                                keep=None if keep is None else os.path.join(keep, "chains" if spec == "none" else
                                                                            "trees"))
            n = r["positions"]
            fwd = r["walk_forward"] / n
            ratio = r["walk_ratio"]
            verdict = ("moonshot" if ratio <= PROFILE_MOONSHOT else "ok" if ratio <= PROFILE_TARGET else "MISS")
            pr = r["per_run"]
            print(" | ".join([spec if isinstance(spec, str) else " ".join(spec), f"{ratio * fwd * 1e3:.1f}",
                              f"{fwd * 1e3:.1f}", f"{ratio:.3f}", verdict, f"{r['wall']:.1f}", f"{r['forward']:.1f}",
                              f"{r['ratio']:.3f}", f"{pr['calibration']:.1f}", f"{pr['fingerprints']:.2f}"]),
                  flush=True)
    finally:
        torch.set_num_threads(threads)
    import bench_profile_ops as O

    ops = O.ops_per_position(draft, target, int(target.vocab_size))
    print("# aten ops per position outside the forward passes (experiments/bench_profile_ops.py; one prompt x 2 "
          "positions, no calibration): " + ", ".join(f"{'trees' if t else 'chains'} {'subsampled' if s else 'cheap'} "
                                                     f"{n:.0f}" for (t, s), n in ops.items()), flush=True)


def _guarded(name: str, fn, *args) -> bool:
    """Run one part (a table's rows, a file); a failure is printed with its traceback and the later parts still run
    (here and in ``gpu_profile_walk.py``)."""
    import traceback

    try:
        fn(*args)
        return True
    except Exception:  # noqa: BLE001 -- one part's failure must not lose the others' rows on a lent machine
        print(f"# part {name!r} failed:", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return False


def check_device_arg(device: str) -> str | None:
    """Why ``--device`` cannot run here (None when it can): no CUDA at all, an index past the devices torch
    sees, or a name torch cannot parse (:func:`otspec.decoding._models.check_device`)."""
    import torch

    from otspec.decoding._models import check_device

    if device.startswith("cuda") and not torch.cuda.is_available():
        return f"--device {device!r} but torch sees no CUDA device"
    try:
        check_device(device, "device")
    except ValueError as exc:
        return str(exc).replace("`device`", "--device")
    return None


def device_card(device: str) -> str:
    """The name of ``device``'s card (CUDA), or the host's processor (``/proc/cpuinfo``'s model name where
    ``platform.processor()`` gives none)."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    if platform.processor():
        return platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "CPU")
    except OSError:
        return "CPU"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default=None, choices=sorted(SHAPES), help="serving shape (default llama-3.2-1b)")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape and plan, on the CPU unless --device")
    ap.add_argument("--device", default=None, help="torch device (default cuda, or cpu with --tiny)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="start no new part after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="counted rounds of the decoders' part (default: the plan's)")
    ap.add_argument("--keep", default=None, help="a folder where the profile-overhead part's two profiles stay")
    ap.add_argument("--positions", type=int, default=None,
                    help="positions per prompt of the profile-overhead part (default the plan's: 16, or 4 with --tiny); "
                    "a longer walk shows the per-run calibration amortised")
    ap.add_argument("--profile-only", action="store_true",
                    help="only the forward passes and the profile's own work (part 4), a few minutes shorter")
    args = ap.parse_args(argv)
    if not (np.isfinite(args.budget_s) and args.budget_s >= 0):
        ap.error(f"--budget-s must be a finite number of seconds >= 0, got {args.budget_s}")
    if args.rounds is not None and args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.positions is not None and args.positions < 1:
        ap.error(f"--positions must be at least 1, got {args.positions}")
    import torch
    import transformers

    from otspec.decoding import HFCausalLM
    from otspec.profile import ProfileSettings, profile, summarize
    from otspec.profile._check import check_decodes

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    shape = SHAPES[args.shape or ("tiny" if args.tiny else "llama-3.2-1b")]
    plan = PLANS["tiny" if args.tiny else "full"]
    device = args.device or ("cpu" if args.tiny else "cuda")
    if device == "cpu":
        torch.set_num_threads(1)  # tiny CPU calls: one thread, no intra-op spinning against the machine's load
    why = check_device_arg(device)
    if why is not None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    card = device_card(device)
    print(f"# gpu_check: {args.shape or ('tiny' if args.tiny else 'llama-3.2-1b')} {shape} on {device} ({card}); "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()}; torch "
          f"{torch.__version__}, transformers {transformers.__version__}", flush=True)
    d_model, t_model = build_pair(shape, device, args.seed)
    draft, target = HFCausalLM(d_model, name="draft"), HFCausalLM(t_model, name="target")
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(3, shape.vocab, size=plan["prompt_len"]).tolist() for _ in range(plan["prompts"])]
    print(f"# pair built in {time.perf_counter() - t_start:.1f} s", flush=True)
    _row(HEAD)
    rows: list = []

    def flush():
        for r in rows:
            _row([f"{c:.3f}" if isinstance(c, float) else c for c in r])
        done.extend(rows)
        rows.clear()

    done: list = []
    L = plan["L_max"]
    overhead_positions = args.positions or plan["positions"]
    _guarded("forward", lambda: (_forward_rows(draft, target, plan["k_max"], L, device, rows), flush()))
    rows.clear()  # a failed part's rows are not printed
    if args.profile_only:
        _guarded("profile overhead", _profile_overhead, draft, target, prompts, overhead_positions, args.keep)
        print(f"# total {time.perf_counter() - t_start:.1f} s", flush=True)
        return 0
    settings = dict(k_max=plan["k_max"], L_max=L, max_new_tokens=plan["positions"], families=list(plan["families"]),
                    verifiers=["token"], trees=list(plan["trees"]), seed=args.seed)
    got: dict = {}

    def calibration():
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            profile(prompts, out=out, draft=draft, target=target, progress=False, **settings)
            got["s"] = summarize(out, n_boot=500)
            got["prof_s"] = time.perf_counter() - t0
        _calibration_rows(got["s"].costs, plan, L, rows, got["prof_s"], flush)

    if not _guarded("calibration", calibration):
        rows.clear()
        print("# no profile: decoders and transformers skipped (they run its recommendation)", flush=True)
        _guarded("profile overhead", _profile_overhead, draft, target, prompts, overhead_positions, args.keep)
        print(f"# total {time.perf_counter() - t_start:.1f} s", flush=True)
        return 0
    s = got["s"]
    c = s.costs
    rec = s.recommendation
    chain = ("token", 1, L)
    tree = next(iter(s.trees.speedup)) if s.trees is not None and s.trees.speedup else None
    schemes = list(dict.fromkeys(x for x in (rec.best, rec.runner_up, chain, tree) if x is not None))
    plain_ms = [1e3 * c.plain]

    def decoders():
        lines = [f"# plain decoding: predicted (a) {1e3 * c.decoder_plain:.3f} ms per token (forward {1e3 * c.plain:.3f}"
                 f" + beyond it {1e3 * c.overhead_plain:.3f}), measured in the decodes below"]
        checked = check_decodes(draft, target, prompts, schemes, ProfileSettings(**settings), rounds=args.rounds or plan["rounds"],
                            max_new_tokens=plan["decode_tokens"], seed=args.seed)
        first = next(iter(checked.values()))
        plain_ms[0] = 1e3 * first.plain_seconds_per_token
        rows.append(("otspec autoregressive_decode", plain_ms[0], 1.0, "", "", "", f"{first.plain_outside_share:.2f}"))
        for sc, g in checked.items():
            a = s.trees.speedup[sc] if isinstance(sc, str) else s.speedup[sc]
            b = s.trees.speedup_forward[sc] if isinstance(sc, str) else s.speedup_forward[sc]
            tag = " (recommended)" if sc == rec.best else " (runner-up)" if sc == rec.runner_up else ""
            name = sc if isinstance(sc, str) else f"{sc[0]} k={sc[1]} L={sc[2]}"
            rows.append((f"otspec {name}{tag}", 1e3 * g.seconds_per_token, g.seconds_per_token / (plain_ms[0] / 1e3),
                         f"{a.value:.2f} [{a.lo:.2f}, {a.hi:.2f}]", f"{b.value:.2f}", f"{g.speedup:.2f}",
                         f"{g.outside_share:.2f}"))
            lines.append(_split(sc, name, g, s, c))
        flush()
        for line in lines:  # where a prediction and its measurement part: tokens per call and seconds per iteration
            print(line, flush=True)
        steps = {key: v for key, v in c.samples.items() if str(key[0]).startswith("step:")}
        print("# the calibration's timed steps, ms per iteration (plain: per token), every repetition: "
              + "; ".join(f"{n[5:]} {k}x{m} " + ",".join(f"{1e3 * x:.2f}" for x in v)
                          for (n, k, m), v in sorted(steps.items(), key=str)), flush=True)

    parts = [("decoders", decoders),
             ("profile overhead", lambda: _profile_overhead(draft, target, prompts, overhead_positions, args.keep)),
             ("transformers", lambda: (_generate_rows(d_model, t_model, prompts,
                                                      rec.best[2] if isinstance(rec.best, tuple) else L,
                                                      plan["decode_tokens"], device, rows, plain_ms[0]), flush()))]
    for name, fn in parts:
        if time.perf_counter() - t_start < args.budget_s:
            if not _guarded(name, fn):
                rows.clear()  # a failed part's rows are not printed under the next part
        else:
            print(f"# budget spent: {name} skipped", flush=True)
    print(f"# total {time.perf_counter() - t_start:.1f} s; 'x plain': seconds over otspec's plain decoding per "
          "token (decoders) or over the target's one-token forward (calls); 'measured': speed-up over plain "
          "decoding of the same library", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
