"""Benchmark of otspec.profile: work outside the forward passes, and peak memory against the number of prompts.

Three measurements, each printed as ratios side by side and marked when they miss:

1. Overhead at V = 49,152 (SmolLM2-135M-Instruct and its layer-skipped draft, CPU, 1 torch thread),
   k_max = 4, L_max = 4, the default quantities (costly ones on every ``subsample``-th position):
   seconds in forward passes (draft steps and target scorings, laws included) vs everything else
   the profile does (sampling, exact quantities, renewal tables, Parquet), measured in the same run,
   in wall time and in process CPU time. Target: overhead / forward <= 0.10 in wall time, on an idle
   machine: the 1-minute load average (``os.getloadavg``), less 1 for this benchmark's own thread, must be
   at most ``MAX_LOAD_PER_CORE`` = 0.5 per core at the start and at the end of the run, else no verdict
   is given ("loaded") and the CPU-time ratio is the number to read (other processes slow the
   forward passes and the analysis by different factors, so a loaded wall-time ratio means little).
   Also with the cheap quantities only (subsample = 0) to show what the costly ones add. Then the
   exact analysis of the first positions of that run (the laws the models gave), timed in CPU
   milliseconds per position with the laws as numpy arrays and as torch CPU tensors (the array-API
   path a GPU run takes), cheap quantities and a subsampled position with every quantity.
2. Peak memory (max RSS of a fresh process) profiling 10 vs 200 prompts on a small model
   (a 2-layer Llama, V = 2,048, HFCausalLM): growth <= 10 %.
3. Batching prompts (``batch_size``, left-padded batches): seconds in forward passes per profiled
   position and wall seconds of the whole ``profile`` call at B = 1 vs B = 8, the same prompts in the
   same run: on the SmolLM2 pair (1 torch thread) the first 24 chat prompts of ``_chat_prompts.py`` with the
   chat template (35 to 41 tokens: every batch is padded), the settings of ``make reproduce``'s profile
   (k_max = 2, L_max = 4, temperature 1, top-k 50, every quantity at every position) but a few
   positions per prompt; on the toy bigram pair (calls that cost almost nothing: its wall time is the
   exact analysis, not batched) 24 prompts of 8 to 14 tokens, cheap quantities, forward time only.
   Target: batched / unbatched < 1.

4. Draft trees (``--trees``, alone): for each tree family of ``TREE_SETTINGS`` (top-k, EAGLE-2, i.i.d. with
   SpecInfer's rule, without replacement with Sequoia's rule, about 16 and 64 draft nodes) one ``profile`` call on
   the SmolLM2 pair (V = 49,152, 1 torch thread), ``k_max = 2``, ``L_max = 4``, cheap quantities
   (``subsample=0``), ``--tree-prompts`` prompts x ``--tree-positions`` positions: seconds in every model call
   (``logits`` and ``tree_logits`` of both models, the float64 laws ``Sampling.probs``; the per-shard cost
   calibration's calls included) vs everything else in the same call, wall and process CPU time, and the same
   within the walk along the prompts alone (every position, trees included; without the per-run work: cost
   calibration, renewal tables, weight fingerprints, Parquet), with the
   seconds of the KV-cache reordering (``select``, counted in "other") shown apart; the same load-average gate as
   measurement 1. Then the peak RSS of a fresh process profiling 2 vs 6 prompts (``--tree-memory-positions``
   positions) with each family (growth <= 10 %).

Measurements 1 and 4 report per-position and per-run costs apart. Per position: the walk along the prompts
(``profile_prompt``/``profile_bucket``: every profiled position, its renewal tables included) outside its forward
passes, target ``PER_POSITION_TARGET`` = 0.10 of the walk's forward seconds. Per run: the cost calibration (wall
seconds, target ``CALIBRATION_TARGET_S``: the default budget ``calibration_s`` plus its first round of call shapes;
printed with what it timed: configurations, timed decodes, those left untimed, call timings), the models' fingerprints (computed cold: the benchmark
forgets the weights digests its warm-up computed), the Parquet writing and the rest outside the walk (checks,
manifest), target ``PER_RUN_TARGET_S`` = 2 s outside the calibration whatever the number of prompts (on an idle
machine; loaded, the CPU seconds are judged). The whole call's other / forward is printed too: on a run of 32
positions it is dominated by the per-run work.

5. ``--llama``: the random-weight Llama pair at V = 128,256 (hidden size 64, 4 layers: the forward passes are
   cheap, so the exact analysis at that vocabulary shows), ``k_max = L_max = 4``, the chain quantities alone and
   with the tree families ``topk:branching(4,2)``, ``eagle2:4,4,16``, ``topk:branching(8,4,2)``,
   ``iid:branching(4,2):specinfer``: per position the seconds outside the forward passes and their share, per run
   its seconds by phase (``--tree-prompts`` x ``--tree-positions``). With ``--against DIR`` (an older checkout's
   root), the same run in a fresh process for that checkout's ``otspec`` and this one's, in turn (``--rounds``): the
   before/after ratios side by side in one run, each with its load average.

6. ``--bound``: the upper bound on every lossless verifier of the sampled tree families (``bound_budget``) on the
   SmolLM2 pair (V = 49,152, 1 torch thread): for ``iid:branching(8,7):specinfer`` and
   ``wor:branching(8,7):sequoia`` (64 draft nodes), one ``profile`` call with the bound at every position
   (``subsample=1``, the token verifier alone, so that nothing else runs on the subsample) at ``--bound-budget``
   (default 64) and one with it off (0), ``--tree-prompts`` x ``--tree-positions``: per position the walk's seconds
   in model calls (the bound's one tree-attention call per model included) and outside them, and their ratio, side
   by side in the same run (``--quick``: 1 prompt x 2 positions).

Usage: ``python experiments/bench_profile.py [--quick] [--batching-only] [--overhead-only] [--trees] [--llama]
[--bound]``
(``--quick``: fewer positions, for a smoke run; ``--batching-only``: measurement 3 alone;
``--overhead-only``: measurement 1 alone; ``--trees``: measurement 4 alone, ``--tree-only SPEC ...`` to run some
of its families, ``none`` for the same run without trees).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHAT = ["Write a short story about a robot.", "Explain photosynthesis to a child.",
        "Give three tips for learning a language.", "What is the capital of France? Explain its history.",
        "Describe the water cycle in simple words.", "How do airplanes stay in the air?",
        "Suggest a name for a small bakery.", "Why is the sky blue during the day?"]


#: Largest 1-minute load average per core, besides this benchmark's own thread, at which the overhead
#: measurement gives a verdict (above it the wall-time ratio says more about the other processes).
MAX_LOAD_PER_CORE = 0.5


def _load_per_core() -> float:
    """The 1-minute load average per core, less the one runnable thread of this benchmark."""
    return max(os.getloadavg()[0] - 1.0, 0.0) / (os.cpu_count() or 1)


def _sync() -> None:
    """Wait for the GPU's queued work (a no-op on the CPU), so that a clock charges each call only its own work."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class _Phases:
    """Wall and process CPU seconds of the phases of ``profile`` calls, by patching the functions that run them:
    per-run work (the cost calibration ``cost_rows``, the models' fingerprints, the Parquet shards' writing) and
    the walk along the prompts (``profile_prompt``/``profile_bucket``: every profiled position, its renewal
    tables included), with the forward seconds that fall inside the walk (``fwd``: a clock whose ``wall`` and
    ``cpu`` grow inside the model calls, or None: then the caller reads the walk's forward seconds from the run's
    own timing rows)."""

    PER_RUN = {"calibration": ("_shard", "cost_rows"), "fingerprints": ("_run", "fingerprint"),
               "parquet": ("_run", "write_shard")}
    WALK = (("_shard", "profile_prompt"), ("_shard", "profile_bucket"))

    def __init__(self, fwd=None):
        self.fwd = fwd
        self.wall = {k: 0.0 for k in (*self.PER_RUN, "walk")}
        self.cpu = dict(self.wall)
        self.walk_fwd = self.walk_fwd_cpu = 0.0
        self.saved = []

    def _wrap(self, phase, fn):
        def timed(*args, **kw):
            _sync()
            w0, c0 = time.perf_counter(), time.process_time()
            f0, g0 = (self.fwd.wall, self.fwd.cpu) if self.fwd is not None else (0.0, 0.0)
            try:
                return fn(*args, **kw)
            finally:
                _sync()
                self.wall[phase] += time.perf_counter() - w0
                self.cpu[phase] += time.process_time() - c0
                if phase == "walk" and self.fwd is not None:
                    self.walk_fwd += self.fwd.wall - f0
                    self.walk_fwd_cpu += self.fwd.cpu - g0
        return timed

    def __enter__(self):
        import importlib

        for phase, targets in [(k, [v]) for k, v in self.PER_RUN.items()] + [("walk", list(self.WALK))]:
            for mod_name, fn_name in targets:
                mod = importlib.import_module(f"otspec.profile.{mod_name}")
                self.saved.append((mod, fn_name, getattr(mod, fn_name)))
                setattr(mod, fn_name, self._wrap(phase, getattr(mod, fn_name)))
        return self

    def __exit__(self, *exc):
        for mod, fn_name, fn in reversed(self.saved):
            setattr(mod, fn_name, fn)
        self.saved = []

    def per_run(self, wall: float) -> dict:
        """Seconds of every per-run phase, and ``other``: the rest of the call outside the walk (checks, manifest,
        shard merging)."""
        out = {k: self.wall[k] for k in self.PER_RUN}
        out["other"] = wall - self.wall["walk"] - sum(out.values())
        out["total"] = wall - self.wall["walk"]
        out["cpu_outside_calibration"] = sum(self.cpu[k] for k in self.PER_RUN if k != "calibration")
        out["calibration_cpu"] = self.cpu["calibration"]
        return out


def _cold_fingerprints() -> None:
    """Forget the weights digests this process computed, so that the measured run pays them as a fresh one does."""
    from otspec.profile import _store

    getattr(_store, "_WEIGHTS_DIGESTS", {}).clear()


def _verdict(ratio: float, idle: bool) -> str:
    return ("ok" if ratio <= PER_POSITION_TARGET else "MISS") if idle else "loaded"


def _run_verdict(per_run: dict, idle: bool) -> str:
    """The per-run target on wall seconds on an idle machine; when loaded, "loaded" and the CPU seconds' verdict."""
    if idle:
        return "ok" if per_run["total"] - per_run["calibration"] <= PER_RUN_TARGET_S else "MISS"
    return "loaded (CPU " + ("ok" if per_run["cpu_outside_calibration"] <= PER_RUN_TARGET_S else "MISS") + ")"


#: Per-position target: the walk's work outside the forward passes, at most this share of its forward seconds.
PER_POSITION_TARGET = 0.10
#: Per-run target: seconds of the per-run work outside the cost calibration (fingerprints, checks, manifest,
#: Parquet) on the SmolLM2 pair, whatever the number of prompts and positions.
PER_RUN_TARGET_S = 2.0


#: Per-run target: wall seconds of the cost calibration at most the default budget (``ProfileSettings.calibration_s``)
#: plus its first round of call shapes, which always runs (on the SmolLM2 pair, 21 shapes: about 2 to 5 s).
CALIBRATION_TARGET_S = 30.0 + 5.0


#: ``profile``'s ``calibration_s`` when ``--calibration-s`` is given (0: unbounded); else the settings' default.
CALIBRATION: dict = {}


def calibration_record(out) -> dict:
    """What a run's cost calibration timed: configurations whose decoder step was timed, their timings, those left
    untimed (the racing calibration's rows; none before it) and the call shapes' timings."""
    from otspec.profile._summary import cost_timings

    tm = cost_timings(out)
    steps = {key: len(v) for key, v in tm.items() if key[0].startswith("step:")}
    return {"configs": len(steps), "decodes": sum(steps.values()),
            "untimed": sum(1 for key in tm if key[0].startswith("untimed:")),
            "shape_timings": sum(len(v) for key, v in tm.items() if key[0] in ("target", "draft", "tree-target"))}


def _calibration_row(pr: dict, rec: dict) -> tuple:
    """The benchmark's row of the calibration's seconds against :data:`CALIBRATION_TARGET_S` (wall: the budget is
    wall seconds whatever the load)."""
    return (f"per run: the cost calibration's seconds ({rec['configs']} configurations timed, {rec['decodes']} timed "
            f"decodes, {rec['untimed']} left untimed, {rec['shape_timings']} call timings)",
            f"{pr['calibration']:.1f} s (CPU {pr['calibration_cpu']:.1f} s)",
            f"<= {CALIBRATION_TARGET_S:g} s", "ok" if pr["calibration"] <= CALIBRATION_TARGET_S else "MISS")


def overhead(n_prompts: int, max_new: int, subsample: int, keep: int = 0) -> dict:
    """Wall and CPU seconds in forward passes vs the rest of one ``profile`` call, per position (the walk along the
    prompts) and per run (cost calibration, fingerprints, Parquet, the rest); ``keep`` first trees kept."""
    import torch

    torch.set_num_threads(1)
    import otspec.decoding as D
    import otspec.profile._collect as C
    from otspec.profile import profile
    from otspec.profile._summary import _timing

    tok, target, draft = D.smollm2_pair(device="cpu", threads=1)
    sys.path.insert(0, str(ROOT / "experiments"))
    from _chat_prompts import chat_ids

    prompts = [chat_ids(tok, text) for text in CHAT[:n_prompts]]
    with tempfile.TemporaryDirectory() as out:  # warm-up: imports, first calls
        profile(prompts[:1], out=out, draft=draft, target=target, k_max=4, L_max=4, max_new_tokens=2,
                progress=False, subsample=1)
    # process CPU seconds inside the forward passes (the same calls the profile's own wall timer covers),
    # and the first `keep` draft trees with their laws (to time the analysis alone afterwards)
    cpu = {"forward": 0.0}
    trees = []
    timer_call, rows_fn = C._Timer.call, C.position_rows

    def timed_call(self, *args, **kw):
        t0 = time.process_time()
        try:
            return timer_call(self, *args, **kw)
        finally:
            cpu["forward"] += time.process_time() - t0

    def kept_rows(rows, pos, X, P, Q, settings, costly, **kw):
        if len(trees) < keep:
            trees.append((pos, X.copy(), P.copy(), Q.copy(), settings))
        return rows_fn(rows, pos, X, P, Q, settings, costly, **kw)

    C._Timer.call, C.position_rows = timed_call, kept_rows
    _cold_fingerprints()
    try:
        with tempfile.TemporaryDirectory() as out, _Phases() as ph:
            load0 = _load_per_core()
            c0, t0 = time.process_time(), time.perf_counter()
            run = profile(prompts, out=out, draft=draft, target=target, k_max=4, L_max=4, max_new_tokens=max_new,
                          progress=False, subsample=subsample, **CALIBRATION)
            wall, cpu_all = time.perf_counter() - t0, time.process_time() - c0
            load1 = _load_per_core()
            fwd = _forward_seconds(out)
            d, q = _timing(out)
            calib = calibration_record(out)
    finally:
        C._Timer.call, C.position_rows = timer_call, rows_fn
    walk, walk_cpu = ph.wall["walk"], ph.cpu["walk"]
    return {"wall": wall, "forward": fwd, "other": wall - fwd, "ratio": (wall - fwd) / fwd, "draft_step": d,
            "target_call": q, "positions": n_prompts * max_new, "settings": run.settings.to_dict(),
            "cpu_forward": cpu["forward"], "cpu_other": cpu_all - cpu["forward"],
            "cpu_ratio": (cpu_all - cpu["forward"]) / cpu["forward"], "load": (load0, load1), "trees": trees,
            "walk": walk, "walk_ratio": (walk - fwd) / fwd, "walk_cpu_ratio": (walk_cpu - cpu["forward"]) / cpu["forward"],
            "per_position_other": (walk - fwd) / (n_prompts * max_new), "per_run": ph.per_run(wall),
            "calibration": calib}


def analysis_ms(trees, torch_laws: bool, costly: bool, repeat: int = 3) -> float | None:
    """CPU milliseconds of the exact analysis (``position_rows``) per position on the kept trees; None when the
    installed otspec cannot take torch tensors."""
    import torch

    from otspec.profile._collect import _Rows, position_rows

    def conv(a):
        return torch.from_numpy(a) if torch_laws else a

    try:
        position_rows(_Rows(0), *trees[0][:2], conv(trees[0][2]), conv(trees[0][3]), trees[0][4], costly=costly)
    except (TypeError, ValueError, AttributeError):
        if torch_laws:
            return None
        raise
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for pos, X, P, Q, settings in trees:
            position_rows(_Rows(0), pos, X, conv(P), conv(Q), settings, costly=costly)
        best = min(best, (time.process_time() - t0) / len(trees))
    return best * 1e3


def _forward_seconds(out) -> float:
    """Seconds in forward passes of a run (the ``kind="time"`` rows, ``j = 1``, every prompt)."""
    import pyarrow.compute as pc

    from otspec.profile import read_table

    t = read_table(out, timing=True)
    t = t.filter(pc.and_(pc.equal(t["kind"], "time"), pc.equal(t["j"], 1)))
    return float(sum(t["value"].to_pylist()))


def chat_prompts(tok) -> list[list[int]]:
    """The first 24 chat prompts of the real-pair experiments, tokenised with the chat template."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from _chat_prompts import CHAT_PROMPTS, chat_ids

    return [chat_ids(tok, text) for text in CHAT_PROMPTS[:24]]


def without_padding(lm):
    """The model as one without ``new_state(pad=...)`` (a shallow copy sharing its weights): the profile then
    batches prompts of equal length only (length buckets), for comparison with left-padded batches."""
    import copy

    out = copy.copy(lm)
    out.new_state = lambda: type(lm).new_state(out)
    return out


def batching(which: str, sizes=(1, 8), T: int = 2) -> list[dict]:
    """Forward seconds per profiled position and wall seconds of the ``profile`` call at each batch size.

    ``which``: ``"toy"`` (bigram pair, V = 256, prompts of 8 to 14 tokens, cheap quantities) or ``"smollm2"``
    (V = 49,152, the first 24 chat prompts, 35 to 41 tokens, every quantity at every position as in ``make
    reproduce``'s profile). Prompts of unequal lengths: every batch is left-padded. k_max = 2, L_max = 4,
    temperature 1, top-k 50.
    """
    import torch

    torch.set_num_threads(1)
    from otspec.profile import profile

    if which == "toy":
        from otspec.profile import toy_pair

        draft, target = toy_pair(256, seed=0)
        prompts = [[(7 * i + j) % 256 for j in range(8 + i % 7)] for i in range(24)]
    else:
        import otspec.decoding as D

        tok, target, draft = D.smollm2_pair(device="cpu", threads=1)
        prompts = chat_prompts(tok)
    n = len(prompts)
    kw = dict(draft=draft, target=target, k_max=2, L_max=4, temperature=1.0, top_k=50,
              subsample=0 if which == "toy" else 1, max_new_tokens=T, progress=False, shard_size=max(sizes))
    with tempfile.TemporaryDirectory() as out:  # warm-up: imports, first calls
        profile(prompts[:2], out=out, **dict(kw, max_new_tokens=2), batch_size=2)
    rows = []
    runs = [(B, "padded") for B in sizes] + [(max(sizes), "length buckets")]
    for B, how in runs:
        models = {} if how == "padded" else dict(draft=without_padding(draft), target=without_padding(target))
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            profile(prompts, out=out, batch_size=B, **dict(kw, **models))
            wall = time.perf_counter() - t0
            fwd = _forward_seconds(out)
        rows.append({"B": B, "how": how, "forward": fwd / (n * T), "wall": wall, "positions": n * T,
                     "lengths": (min(map(len, prompts)), max(map(len, prompts)))})
    return rows


def memory_child(n_prompts: int) -> None:
    import resource

    import torch
    import transformers

    torch.set_num_threads(1)
    from otspec.decoding import HFCausalLM
    from otspec.profile import profile

    cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    target = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="tiny-target")
    torch.manual_seed(1)
    draft = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="tiny-draft")
    prompts = [[(7 * i + j) % 2048 for j in range(4)] for i in range(n_prompts)]
    with tempfile.TemporaryDirectory() as out:
        profile(prompts, out=out, draft=draft, target=target, k_max=4, L_max=4, max_new_tokens=4,
                progress=False, verifiers=["token", "optimal", "kseq"], families=["token", "block", "block-onestep"])
    # VmHWM: the peak resident set of this process image (ru_maxrss survives exec on Linux, so a child
    # started by a process that loaded a large model would report the parent's peak)
    hwm = next((int(line.split()[1]) / 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:")), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps({"maxrss_mb": hwm}))


def memory(n: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, __file__, "--memory-child", str(n)], capture_output=True, text=True,
                         env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["maxrss_mb"]


#: The tree families of measurement 4: about 16 and 64 draft nodes per process (EAGLE-2's third number counts
#: the root).
TREE_SETTINGS = ["topk:branching(4,3)", "topk:branching(8,7)", "eagle2:4,4,17", "eagle2:6,8,65",
                 "iid:branching(4,3):specinfer", "iid:branching(8,7):specinfer",
                 "wor:branching(4,3):sequoia", "wor:branching(8,7):sequoia"]
TREE_KW = dict(k_max=2, L_max=4, subsample=0)


class _CallClock:
    """Wall and process CPU seconds inside the patched methods (outermost call only: nested ones not twice)."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self.depth = 0
        self.calls = 0

    def wrap(self, fn):
        def timed(*args, **kw):
            if self.depth:
                return fn(*args, **kw)
            self.depth += 1
            _sync()
            w0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                _sync()
                self.wall += time.perf_counter() - w0
                self.cpu += time.process_time() - c0
                self.depth -= 1
                self.calls += 1
        return timed


def _patch(classes, names, clock, saved):
    for cls in classes:
        for name in names:
            if name in vars(cls) and (cls, name) not in saved:
                saved[(cls, name)] = vars(cls)[name]
                setattr(cls, name, clock.wrap(vars(cls)[name]))


def tree_overhead(spec, n_prompts: int, positions: int, pair=None, prompts=None, settings=None, keep=None) -> dict:
    """Wall and CPU seconds in model calls vs the rest of one ``profile`` call with the tree family ``spec`` (one
    spec, a list of specs, or ``"none"``); ``prompts`` (token ids) and ``settings`` (default :data:`TREE_KW`) for
    another pair than SmolLM2's; ``keep``: a new folder where the measured call's profile stays (else a temporary
    one)."""
    import torch

    torch.set_num_threads(1)
    import otspec.decoding as D
    from otspec.decoding._sampling import Sampling
    from otspec.profile import profile

    tok, target, draft = pair if pair is not None else D.smollm2_pair(device="cpu", threads=1)
    if prompts is None:
        sys.path.insert(0, str(ROOT / "experiments"))
        from _chat_prompts import chat_ids

        prompts = [chat_ids(tok, text) for text in CHAT[:n_prompts]]
    trees = None if spec == "none" else ([spec] if isinstance(spec, str) else list(spec))
    kw = dict(draft=draft, target=target, trees=trees, progress=False, **(TREE_KW if settings is None else settings))
    from otspec.profile import _shard

    # warm-up: imports, first calls, first tree shapes; without the cost calibration (a per-run cost the measured
    # call pays and reports apart: warming it up too would double its minutes on a GPU for nothing)
    calibrate, _shard.cost_rows = _shard.cost_rows, lambda *a, **k: None
    try:
        with tempfile.TemporaryDirectory() as out:
            profile(prompts[:1], out=out, max_new_tokens=1, **kw)
    finally:
        _shard.cost_rows = calibrate
    fwd, sel, saved = _CallClock(), _CallClock(), {}
    # the walk along the prompts (every profiled position, trees included; not the per-run work: cost
    # calibration, fingerprints, Parquet), with the forward seconds inside it
    models = {type(draft), type(target)}
    classes = {c for m in models for c in type.mro(m) if c is not object}
    _patch(classes, ("logits", "tree_logits"), fwd, saved)
    _patch({Sampling}, ("probs",), fwd, saved)
    _patch(classes, ("select",), sel, saved)
    _cold_fingerprints()
    try:
        where = tempfile.TemporaryDirectory() if keep is None else contextlib.nullcontext(keep)
        with where as out, _Phases(fwd) as ph:
            load0 = _load_per_core()
            c0, t0 = time.process_time(), time.perf_counter()
            profile(prompts, out=out, max_new_tokens=positions, **kw)
            wall, cpu_all = time.perf_counter() - t0, time.process_time() - c0
            load1 = _load_per_core()
            calib = calibration_record(out)
    finally:
        for (cls, name), fn in saved.items():
            setattr(cls, name, fn)
    walk = {"wall": ph.wall["walk"], "cpu": ph.cpu["walk"], "fwd": ph.walk_fwd, "fwd_cpu": ph.walk_fwd_cpu}
    return {"walk_ratio": (walk["wall"] - walk["fwd"]) / walk["fwd"],
            "walk_cpu_ratio": (walk["cpu"] - walk["fwd_cpu"]) / walk["fwd_cpu"], "walk_forward": walk["fwd"],
            "spec": spec, "wall": wall, "forward": fwd.wall, "ratio": (wall - fwd.wall) / fwd.wall,
            "cpu_forward": fwd.cpu, "cpu_ratio": (cpu_all - fwd.cpu) / fwd.cpu, "select": sel.wall,
            "calls": fwd.calls, "positions": n_prompts * positions, "load": (load0, load1),
            "per_run": ph.per_run(wall), "calibration": calib}


def tree_memory_child(spec: str, n_prompts: int, positions: int) -> None:
    import torch

    torch.set_num_threads(1)
    import otspec.decoding as D
    from otspec.profile import profile

    tok, target, draft = D.smollm2_pair(device="cpu", threads=1)
    sys.path.insert(0, str(ROOT / "experiments"))
    from _chat_prompts import chat_ids

    prompts = [chat_ids(tok, text) for text in CHAT[:n_prompts]]
    with tempfile.TemporaryDirectory() as out:
        profile(prompts, out=out, draft=draft, target=target, trees=None if spec == "none" else [spec], progress=False,
                max_new_tokens=positions, **TREE_KW)
    hwm = next(int(line.split()[1]) / 1024 for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("VmHWM:"))
    print(json.dumps({"maxrss_mb": hwm}))


def tree_memory(spec: str, n: int, positions: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, __file__, "--tree-memory-child", spec, str(n), str(positions)],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["maxrss_mb"]


def trees_main(args) -> None:
    sys.path.insert(0, str(ROOT))  # this checkout's otspec, as in the memory children
    import otspec.decoding as D

    specs = args.tree_only or TREE_SETTINGS
    print(f"draft trees, SmolLM2 pair, V = 49,152, 1 torch thread, {TREE_KW}, {args.tree_prompts} prompts x "
          f"{args.tree_positions} positions; os.getloadavg {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    pair = D.smollm2_pair(device="cpu", threads=1)
    rows = []
    for spec in specs if args.tree_positions else ():
        r = tree_overhead(spec, args.tree_prompts, args.tree_positions, pair)
        idle = max(r["load"]) <= MAX_LOAD_PER_CORE
        verdict = _verdict(r["walk_ratio"], idle)
        cpu_verdict = "ok" if r["walk_cpu_ratio"] <= PER_POSITION_TARGET else "MISS"
        pr = r["per_run"]
        run_verdict = _run_verdict(pr, idle)
        rows.append((spec, f"{r['walk_ratio']:.3f}", f"{r['walk_cpu_ratio']:.3f}", f"{r['ratio']:.3f}",
                     f"{r['cpu_ratio']:.3f}", f"{r['walk_forward']:.1f}", f"{r['forward']:.1f}", f"{r['wall']:.1f}",
                     f"{pr['calibration']:.1f}", f"{pr['fingerprints']:.2f}",
                     f"{pr['total'] - pr['calibration']:.2f} ({pr['cpu_outside_calibration']:.2f})",
                     f"{r['select']:.2f}", f"{r['load'][0]:.2f}->{r['load'][1]:.2f}",
                     f"{verdict} (CPU {cpu_verdict}); per run {run_verdict}"))
        print("  " + " | ".join(rows[-1]), flush=True)
    mem = []
    if args.tree_memory_positions:
        for spec in specs:
            a, b = (tree_memory(spec, n, args.tree_memory_positions) for n in (2, 6))
            g = b / a - 1.0
            mem.append((spec, f"{a:.0f} MB -> {b:.0f} MB ({g:+.1%})", "ok" if g <= 0.10 else "MISS"))
            print("  " + " | ".join(mem[-1]), flush=True)
    print("family | per position (walk): other/forward wall | CPU | whole call: other/forward wall | CPU | "
          "walk forward s | forward s | wall s | per run: calibration s | fingerprints s | outside the calibration s (CPU) | "
          f"select s | load per core | verdict (per position <= {PER_POSITION_TARGET}, per run outside the "
          f"calibration <= {PER_RUN_TARGET_S} s)")
    for r in rows:
        print(" | ".join(r))
    if mem:
        print(f"peak RSS, 2 vs 6 prompts x {args.tree_memory_positions} positions (target growth <= +10 %)")
        for m in mem:
            print(" | ".join(m))
    print(f"os.getloadavg at the end: {os.getloadavg()}")


#: The tree families of the random-weight Llama pair at V = 128,256 (measurement 5).
LLAMA_TREES = ["topk:branching(4,2)", "eagle2:4,4,16", "topk:branching(8,4,2)", "iid:branching(4,2):specinfer"]


def llama_pair(V: int = 128_256):
    """A random-weight Llama-shaped pair at vocabulary ``V`` (hidden size 64, 4 layers: the forward passes are
    cheap, so the analysis at that vocabulary shows), wrapped as ``HFCausalLM``; ``(None, target, draft)``."""
    import torch
    import transformers

    from otspec.decoding import HFCausalLM

    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    target = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="llama-v128k-target")
    torch.manual_seed(1)
    draft = HFCausalLM(transformers.LlamaForCausalLM(cfg), name="llama-v128k-draft")
    return None, target, draft


def llama_main(args) -> None:
    """Measurement 5: the random-weight Llama pair at V = 128,256, k_max = L_max = 4, the chain quantities alone,
    and with the four tree families of :data:`LLAMA_TREES`: per position the walk's seconds outside the forward
    passes (and their share), per run its seconds by phase."""
    pair = llama_pair()
    V = 128_256
    prompts = [[(7919 * i + 13 * j + 1) % V for j in range(6)] for i in range(args.tree_prompts)]
    kw = dict(k_max=4, L_max=4, **CALIBRATION)
    print(f"random-weight Llama pair, V = 128,256, 1 torch thread, {kw}, {len(prompts)} prompts x "
          f"{args.tree_positions} positions; os.getloadavg {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    print("trees | per position: other ms | forward ms | other / forward (CPU) | per run: calibration s | "
          "fingerprints s | outside the calibration s | load per core")
    for spec in ("none", LLAMA_TREES):
        r = tree_overhead(spec, len(prompts), args.tree_positions, pair, prompts=prompts, settings=kw)
        n = r["positions"]
        fwd = r["walk_forward"] / n
        other = r["walk_ratio"] * fwd
        pr = r["per_run"]
        print(" | ".join([spec if isinstance(spec, str) else " ".join(spec), f"{other * 1e3:.0f}", f"{fwd * 1e3:.0f}",
                          f"{r['walk_ratio']:.3f} ({r['walk_cpu_ratio']:.3f})", f"{pr['calibration']:.1f}",
                          f"{pr['fingerprints']:.2f}", f"{pr['total'] - pr['calibration']:.2f}",
                          f"{r['load'][0]:.2f}->{r['load'][1]:.2f}"]), flush=True)
        print("  " + " | ".join(_calibration_row(pr, r["calibration"])), flush=True)


#: The sampled tree families of measurement 6 (64 draft nodes each).
BOUND_TREES = ["iid:branching(8,7):specinfer", "wor:branching(8,7):sequoia"]


def bound_main(args) -> None:
    """Measurement 6: the walk's seconds per position outside and inside the model calls, with the bound at every
    position (``--bound-budget``) and without it (0), on the SmolLM2 pair, side by side in one run."""
    sys.path.insert(0, str(ROOT))
    import otspec.decoding as D

    prompts, positions = (1, 2) if args.quick else (args.tree_prompts, args.tree_positions)
    pair = D.smollm2_pair(device="cpu", threads=1)
    base = dict(k_max=2, L_max=4, subsample=1, verifiers=["token"], families=["token"])
    print(f"the bound in the profile, SmolLM2 pair, V = 49,152, 1 torch thread, {base}, {prompts} prompts x "
          f"{positions} positions; os.getloadavg {os.getloadavg()} on {os.cpu_count()} cores", flush=True)
    print("family | bound_budget | per position: forward ms | other ms | other / forward wall (CPU) | load per core")
    for spec in BOUND_TREES:
        got = {}
        for budget in (0, args.bound_budget):
            r = tree_overhead(spec, prompts, positions, pair, settings=dict(base, bound_budget=budget))
            n = r["positions"]
            fwd = r["walk_forward"] / n
            got[budget] = (fwd, r["walk_ratio"] * fwd)
            print(" | ".join([spec, str(budget), f"{fwd * 1e3:.0f}", f"{r['walk_ratio'] * fwd * 1e3:.0f}",
                              f"{r['walk_ratio']:.3f} ({r['walk_cpu_ratio']:.3f})",
                              f"{r['load'][0]:.2f}->{r['load'][1]:.2f}"]), flush=True)
        (f0, o0), (f1, o1) = got[0], got[args.bound_budget]
        print(f"  {spec}: with the bound / without, per position: forward {f1 / f0:.3f}, other {o1 / o0:.3f}, "
              f"forward + other {(f1 + o1) / (f0 + o0):.3f}", flush=True)
    print(f"os.getloadavg at the end: {os.getloadavg()}")


def llama_against(args) -> None:
    """Measurement 5 side by side: the same ``--llama`` run in a fresh process for each checkout (``--against DIR``,
    an older checkout's root holding ``otspec``, then this one), ``--rounds`` times in turn, the load average
    printed by each."""
    env = dict(os.environ)
    for r in range(args.rounds):
        for label, root in (("before", Path(args.against).resolve()), ("after", ROOT)):
            print(f"--- round {r + 1}, {label}: otspec from {root}", flush=True)
            env["PYTHONPATH"] = str(root)
            subprocess.run([sys.executable, __file__, "--llama", "--tree-prompts", str(args.tree_prompts),
                            "--tree-positions", str(args.tree_positions)], env=env, check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", type=int)
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--batching-only", action="store_true")
    ap.add_argument("--overhead-only", action="store_true")
    ap.add_argument("--trees", action="store_true")
    ap.add_argument("--llama", action="store_true")
    ap.add_argument("--tree-only", nargs="+")
    ap.add_argument("--tree-prompts", type=int, default=2)
    ap.add_argument("--tree-positions", type=int, default=8)
    ap.add_argument("--tree-memory-positions", type=int, default=4)
    ap.add_argument("--tree-memory-child", nargs=3)  # spec, prompts, positions
    ap.add_argument("--bound", action="store_true")
    ap.add_argument("--bound-budget", type=int, default=64)
    ap.add_argument("--against", help="with --llama: an older checkout's root, measured in turn with this one")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--calibration-s", type=float, help="the profile's calibration_s (0: unbounded; default: its own)")
    args = ap.parse_args()
    if args.calibration_s is not None:
        CALIBRATION["calibration_s"] = args.calibration_s or None
    if args.memory_child:
        memory_child(args.memory_child)
        return
    if args.tree_memory_child:
        spec, n, positions = args.tree_memory_child
        tree_memory_child(spec, int(n), int(positions))
        return
    if args.trees:
        trees_main(args)
        return
    if args.llama and args.against:
        llama_against(args)
        return
    if args.llama:
        llama_main(args)
        return
    if args.bound:
        bound_main(args)
        return
    rows = []
    if not (args.batching_only or args.overhead_only):
        m10, m200 = memory(10), memory(200)
        growth = m200 / m10 - 1.0
        rows.append(("peak RSS, 200 vs 10 prompts (small model, V = 2,048)", f"{m10:.0f} MB -> {m200:.0f} MB "
                     f"({growth:+.1%})", "<= +10 %", "ok" if growth <= 0.10 else "MISS"))
    for which, T in () if args.overhead_only else (("toy", 2 if args.quick else 8), ("smollm2", 1 if args.quick else 2)):
        res = batching(which, T=T)
        base = res[0]
        for r in res:
            print(f"  {which}, B = {r['B']} ({r['how']}): forward {r['forward'] * 1e3:.1f} ms / position, profile call "
                  f"{r['wall']:.1f} s ({r['positions']} positions, prompts of {r['lengths'][0]}-{r['lengths'][1]} "
                  "tokens)")
        for r in res[1:]:
            for what in ("forward",) if which == "toy" else ("forward", "wall"):
                ratio = r[what] / base[what]
                label = "forward s / position" if what == "forward" else "profile call wall time"
                rows.append((f"{label}, B = {r['B']} {r['how']} vs B = 1, {which}", f"{ratio:.3f}", "< 1",
                             "ok" if ratio < 1 else "MISS"))
    if not args.skip_overhead and not args.batching_only:
        n, T = (1, 4) if args.quick else (2, 16)
        for label, sub in (("default quantities, costly ones every 32nd position", 32), ("cheap quantities only (subsample=0)", 0)):
            r = overhead(n, T, sub, keep=4 if sub else 0)
            idle = max(r["load"]) <= MAX_LOAD_PER_CORE
            pr = r["per_run"]
            rows.append((f"per position: walk's other / forward, V = 49,152, k_max = L_max = 4, {label}",
                         f"{r['walk_ratio']:.3f} (CPU {r['walk_cpu_ratio']:.3f})", f"<= {PER_POSITION_TARGET}",
                         _verdict(r["walk_ratio"], idle)))
            rest = pr["total"] - pr["calibration"]
            rows.append((f"per run: seconds outside the walk and the calibration, {label}",
                         f"{rest:.2f} s (CPU {pr['cpu_outside_calibration']:.2f} s)", f"<= {PER_RUN_TARGET_S} s",
                         _run_verdict(pr, idle)))
            rows.append(_calibration_row(pr, r["calibration"]))
            rows.append((f"whole call other / forward (per-run work on {r['positions']} positions), {label}",
                         f"{r['ratio']:.3f} (CPU {r['cpu_ratio']:.3f})", "(reported)", ""))
            print(f"  {label}: wall {r['wall']:.1f} s, forward {r['forward']:.1f} s, other {r['other']:.1f} s over "
                  f"{r['positions']} positions; per position: walk {r['walk']:.1f} s, other "
                  f"{r['per_position_other'] * 1e3:.0f} ms / position; per run: calibration {pr['calibration']:.2f} s, "
                  f"fingerprints {pr['fingerprints']:.2f} s, Parquet {pr['parquet']:.2f} s, rest {pr['other']:.2f} s; "
                  f"draft step {r['draft_step']:.3f} s, target call {r['target_call']:.3f} s; "
                  f"CPU forward {r['cpu_forward']:.1f} s, other {r['cpu_other']:.1f} s; load per core besides this "
                  f"run {r['load'][0]:.2f} -> {r['load'][1]:.2f} (verdict at most {MAX_LOAD_PER_CORE}; "
                  f"os.getloadavg {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores)")
            if r["trees"]:
                for costly in (False, True):
                    ms = {lib: analysis_ms(r["trees"], lib == "torch", costly) for lib in ("numpy", "torch")}
                    what = "every quantity (a subsampled position)" if costly else "cheap quantities"
                    torch_ms = "n/a" if ms["torch"] is None else f"{ms['torch']:.1f}"
                    print(f"  exact analysis per position, {what}, laws as numpy: {ms['numpy']:.1f} ms CPU, as torch "
                          f"CPU tensors: {torch_ms} ms CPU ({len(r['trees'])} positions of the run above)")
    w = max(len(r[0]) for r in rows)
    print(f"{'measurement':<{w}}  {'measured':>24}  {'target':>9}  verdict")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:>24}  {r[2]:>9}  {r[3]}")


if __name__ == "__main__":
    main()
