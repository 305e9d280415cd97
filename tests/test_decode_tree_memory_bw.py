"""The tree decoder's memory guard: :func:`otspec.decoding._tree_loop.tree_law_bytes` counted by hand and held
against the peak of the allocations measured on the CPU, and ``speculative_decode(tree=...)`` refusing a tree whose
laws pass ``MAX_LAW_BYTES`` or a CUDA device's free memory before any model call (``torch.cuda`` patched, as in
tests/test_gpu_paths_bs.py)."""

from __future__ import annotations

import tracemalloc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.decoding._loop as _loop  # noqa: E402
import otspec.decoding._tree_device as _td  # noqa: E402
from otspec.decoding import CallableLM, Sampling, speculative_decode  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402


def _plan(spec, V, sampling=None, target=None):
    from otspec.decoding._tree_loop import tree_plan

    target = CallableLM(lambda ids: torch.zeros(ids.shape + (V,)), V) if target is None else target
    return tree_plan(spec, process=None, verifier=None, options=None, allow_lossy=False, target=target, V=V,
                     sampling=sampling or Sampling())


def _raising(V, device="cpu"):
    """A model that fails the test if it is ever called."""
    def fn(ids):
        raise AssertionError("the model was called")

    return CallableLM(fn, V, device=device)


# --------------------------------------------------------------------------- the count, by hand
def test_count_of_a_small_shape_by_hand():
    from otspec.decoding._tree_loop import tree_law_bytes

    V, prompt = 1000, 5
    plan = _plan("iid:branching(2,2)", V)  # 6 draft nodes: the root's 2 children, 2 of each
    assert (plan.shape.n, plan.L) == (6, 2)
    s = Sampling()
    dev = tree_law_bytes(plan, V, s, device=True, prompt=prompt)
    # full step: draft laws at the 3 nodes with children, target laws there, the level pass, the draws' sums of the
    # widest call (2 rows), the accepted node's 3 rows = 14; the depth-1 step: 1 + 1 + 1 + 1 + 3 = 7
    assert dev["laws"] == 8 * V * (14 + 7)
    # the target's call (prompt + nodes), the draft's 3 rows, the target's 3 rows gathered
    assert dev["logits"] == 4 * V * (prompt + 6 + 3 + 3)
    assert dev["temporaries"] == 8 * V * 3 and dev["root laws"] == 0
    # the ring of root logits (2 x 64 rows, float32), their laws formed and stacked (4 x 64 rows, float64), the
    # sort's eight arrays of its chunk of 2**19 entries
    assert tree_law_bytes(plan, V, s, device=True, prompt=prompt, log_laws=True)["root laws"] == \
        2 * 64 * V * 4 + 4 * 64 * V * 8 + 8 * 64 * V * 8  # 2**19 // V = 524 rows: the batch's 64
    host = tree_law_bytes(plan, V, s, device=False, prompt=prompt)
    assert host["laws"] == 8 * V * (3 + 3 * 7)  # draft laws at the 3 inner nodes; Q, Pn, emission at the 7 nodes
    assert host["logits"] == 4 * V * (prompt + 6 + 2) and host["temporaries"] == 8 * V * 7 * 2
    # top-k children verified by the target-only rule form no draft law on the device; truncation adds 2 copies
    topk = tree_law_bytes(_plan("topk:branching(2,2)", V), V, s, device=True, prompt=prompt)
    assert topk["laws"] == 8 * V * ((3 + 3) + (1 + 3))
    assert tree_law_bytes(plan, V, Sampling(top_k=5), device=True)["temporaries"] == 8 * V * 3 * 3
    # SpecHub (host route only): the (V, V) pair law of a node with two children and its running sums
    hub = tree_law_bytes(_plan("spechub:branching(2,2)", V), V, s, device=False, prompt=prompt)
    assert hub["temporaries"] == 8 * V * 7 * 2 + 2 * 8 * V * V


def test_count_of_eagle2_static_sizes():
    from otspec.decoding._tree_loop import tree_law_bytes

    V = 1000
    plan = _plan("eagle2:3,2,5", V)  # depth 3, top_k 2, 4 draft nodes (5 tokens): expanded slots 1 + (3 - 1) 2 = 5
    assert plan.shape.n == 4
    got = tree_law_bytes(plan, V, Sampling(), device=True, prompt=1)
    # target-only rule: no draft law but the ranking laws (5 slots), the target's at the slots, 3 rows; then the
    # depth-1 step (1 slot: 1 + 1 + 3) and the depth-2 step (3 slots: 3 + 3 + 3)
    assert got["laws"] == 8 * V * ((5 + 5 + 3) + (1 + 1 + 3) + (3 + 3 + 3))
    assert got["logits"] == 4 * V * (1 + 4 + 5 + 5)  # the prompt's token, the 4 nodes; the draft's 5 slots, gathered


def test_count_of_a_target_scoring_by_rows():
    from otspec.decoding._tree_loop import tree_law_bytes

    V, prompt = 1000, 5
    plan = _plan("iid:branching(2,2)", V)  # 4 leaves of depth 2, 7 nodes
    s = Sampling()
    host = tree_law_bytes(plan, V, s, device=False, prompt=prompt, by_rows=True)
    assert host["logits"] == 4 * V * (4 * (prompt + 2) + 7 + 2)  # a row per leaf, the 7 rows gathered, a draft call
    dev = tree_law_bytes(plan, V, s, device=True, prompt=prompt, by_rows=True)
    assert dev["logits"] == 4 * V * (7 * (prompt + 6) + 7 + 3 + 3)  # a row per node's path (prompt + n columns)


def test_a_target_without_4d_masks_is_counted_by_rows(monkeypatch):
    seen = []
    real = _loop.tree_law_bytes

    def spy(*args, **kw):
        seen.append(kw["by_rows"])
        return real(*args, **kw)

    monkeypatch.setattr(_loop, "tree_law_bytes", spy)
    V = 16
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    speculative_decode([1], draft=draft, target=target, tree="iid:branching(2)", max_new_tokens=2, rng=0)
    target.model.config._attn_implementation = "flash_attention_2"  # takes no 4-D mask: scored by rows
    monkeypatch.setattr(_loop, "MAX_LAW_BYTES", 0)
    with pytest.raises(ValueError, match="exceed MAX_LAW_BYTES"):
        speculative_decode([1], draft=draft, target=target, tree="iid:branching(2)", max_new_tokens=2, rng=0)
    assert seen == [False, True]


# --------------------------------------------------------------------------- the count against measured allocation
def _peak(run) -> int:
    """Peak bytes allocated during ``run()`` on the CPU: torch's allocations (the profiler's memory events, each at
    the op that made it, in time order) plus numpy's (tracemalloc), the two peaks added."""
    _td._POOL.free.clear()  # no block handed on from an earlier decode: the run allocates its own
    tracemalloc.start()
    try:
        with torch.autograd.profiler.profile(profile_memory=True) as prof:
            run()
        numpy_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    cur = top = 0
    for e in sorted(prof.function_events, key=lambda e: e.time_range.start):
        cur += e.self_cpu_memory_usage
        top = max(top, cur)
    return top + numpy_peak


@pytest.mark.parametrize("spec,engine,log_laws,top_k", [
    ("iid:branching(4,3)", "torch", True, None),
    pytest.param("iid:branching(4,3)", "torch", False, 50, marks=pytest.mark.slow),
    pytest.param("wor:branching(3,2,2)", "torch", True, None, marks=pytest.mark.slow),
    pytest.param("topk:branching(3,2)", "torch", False, None, marks=pytest.mark.slow),
    pytest.param("eagle2:3,3,8", "torch", False, None, marks=pytest.mark.slow),
    ("iid:branching(4,3)", "numpy", False, None),
    pytest.param("eagle2:3,3,8", "numpy", False, None, marks=pytest.mark.slow),
])
def test_count_bounds_the_measured_peak_within_a_factor_two(monkeypatch, spec, engine, log_laws, top_k):
    """The count is an upper bound of the peak measured on the CPU, and at most twice it.

    At least the peak: every block the decoder allocates is counted. At most twice: the count is the accelerator's
    route (the test runs it on the CPU: ``read_on_host`` off, the root logits copied), and counts upper bounds --
    every shorter depth's step, each temporary at its largest, float32 logits for the model's own dtype, the kept
    root logits' whole ring of ``LAW_BATCH`` rows where a short run fills a few. The model's weights are made before
    the measure; the tiny model's activations are a few rows of 16 floats."""
    from otspec.decoding._tree_loop import tree_law_bytes

    monkeypatch.setattr(_td.TreeStepT, "read_on_host", False)
    monkeypatch.setattr(_td.TreeStepT, "copy_root_laws", True)
    monkeypatch.setattr(_loop, "LAW_BATCH", 3)  # the ring of kept root logits filled and flushed within the run
    V, prompt = 4096, [1, 2, 3, 4, 5]
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = Sampling(top_k=top_k)
    plan = _plan(spec, V, s, target)
    pred = sum(tree_law_bytes(plan, V, s, device=engine == "torch", prompt=len(prompt), log_laws=log_laws,
                              law_batch=3).values())

    def run():
        speculative_decode(prompt, draft=draft, target=target, tree=spec, engine=engine, max_new_tokens=10, rng=0,
                           log_laws=log_laws, top_k=top_k)

    run()  # once before: what the first decode makes once (compiled kernels, kept constants) is not measured
    measured = _peak(run)
    print(f"{spec} {engine} log_laws={log_laws} top_k={top_k}: counted {pred} B, measured {measured} B, "
          f"ratio {pred / measured:.2f}")
    assert measured > 8 * V * 10  # the measure sees the laws (more than ten float64 rows)
    assert measured <= pred <= 2 * measured, (pred, measured)


# --------------------------------------------------------------------------- the refusals
def test_a_tree_above_max_law_bytes_is_refused_before_any_model_call(monkeypatch):
    V = 1000
    monkeypatch.setattr(_loop, "MAX_LAW_BYTES", 8 * V * 4)  # 4 float64 rows
    with pytest.raises(ValueError, match=r"`tree`='iid:branching\(16,8\)' \(144 draft nodes, depth 2, device route\)"
                                         r".*at V=1000.*exceed MAX_LAW_BYTES.*fewer nodes"):
        speculative_decode([1, 2], draft=_raising(V), target=_raising(V), tree="iid:branching(16,8)", rng=0)
    for tree, engine in (("eagle2:4,3,20", "auto"), ("topk:branching(4,4)", "auto"), ("iid:branching(16,8)", "numpy")):
        with pytest.raises(ValueError, match="exceed MAX_LAW_BYTES"):
            speculative_decode([1], draft=_raising(V), target=_raising(V), tree=tree, engine=engine, rng=0)


def test_the_limit_is_the_count_exactly_and_normal_trees_still_decode(monkeypatch):
    from otspec.decoding._tree_loop import tree_law_bytes

    V, spec = 40, "iid:branching(2,2)"
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    parts = tree_law_bytes(_plan(spec, V, target=target), V, Sampling(), device=True, prompt=3, log_laws=True)
    assert parts["root laws"] > 0  # speculative_decode's default log_laws=True keeps the root's laws
    need = parts["laws"] + parts["root laws"]
    res = speculative_decode([1, 2, 3], draft=draft, target=target, tree=spec, max_new_tokens=6, rng=0)
    assert res.tokens.shape == (6,)
    monkeypatch.setattr(_loop, "MAX_LAW_BYTES", need)  # exactly fits
    again = speculative_decode([1, 2, 3], draft=draft, target=target, tree=spec, max_new_tokens=6, rng=0)
    assert again.tokens.tolist() == res.tokens.tolist()
    monkeypatch.setattr(_loop, "MAX_LAW_BYTES", need - 1)
    calls = draft.n_calls, target.n_calls
    with pytest.raises(ValueError, match=f"{need / 2**30:.2f} GiB at V=40"):
        speculative_decode([1, 2, 3], draft=draft, target=target, tree=spec, max_new_tokens=6, rng=0)
    assert (draft.n_calls, target.n_calls) == calls  # refused before any model call


def test_a_tree_above_a_cuda_devices_free_memory_is_refused_before_any_model_call(monkeypatch):
    from otspec.decoding._tree_loop import tree_law_bytes

    asked = []
    free = {"bytes": 2**40}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (free["bytes"], 2**41))
    V, spec = 128_256, "iid:branching(16,8)"
    peak = sum(tree_law_bytes(_plan(spec, V), V, Sampling(), device=True, prompt=2, log_laws=True).values())
    draft, target = _raising(V, "cuda:0"), _raising(V, "cuda:0")
    free["bytes"] = peak - 1
    with pytest.raises(ValueError, match=r"144 draft nodes.*at V=128256.*free on the device \(with the logits and "
                                         r"temporaries: "):
        speculative_decode([1, 2], draft=draft, target=target, tree=spec, rng=0)
    assert asked == [torch.device("cuda:0")]
    free["bytes"] = peak  # exactly fits: passes the guard, then the (fake) device is reached
    with pytest.raises(Exception) as info:
        speculative_decode([1, 2], draft=draft, target=target, tree=spec, rng=0)
    assert "free on the device" not in str(info.value)
