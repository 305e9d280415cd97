"""The profile's tree bound on the device route: the walk's laws and the bound's scored frontier kept as tensors where
the walk holds them (CPU tensors standing in for a GPU's: :func:`otspec.profile._collect.analysis_device` patched),
the bound computed there, its rows within 1e-12 of the bound's host route on the same laws, and a number of host reads
per position that grows with neither the vocabulary nor the prompts of a batch. The walk takes this route when
:data:`otspec.profile._tree_bound.BOUND_ON_DEVICE` is set (here patched on)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.profile._tree_bound as TB  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

TREES = ["iid:branching(4,2):specinfer", "wor:branching(4,2):sequoia", "wor:branching(3,2,2):sequoia",
         "iid:branching(8,7)"]
T = 3  # positions walked, each subsampled


def _walk(monkeypatch, V: int, B: int, *, bound_on_device: bool):
    """The treebound rows of a tiny Llama pair's device walk of ``B`` prompts, and the host reads and values the
    bound made per position."""
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TB, "BOUND_ON_DEVICE", True)
    if not bound_on_device:  # the same walk, the bound on the host's numpy route from host copies of the same laws
        monkeypatch.setattr(TB, "_route_device", lambda p_root: None)
    reads, values = [], []
    real = C.position_bounds

    def counted(*a, **k):
        with HostReads() as mode:
            out = real(*a, **k)
        reads.append(len(mode.reads))
        values.append(mode.values)
        return out

    monkeypatch.setattr(C, "position_bounds", counted)
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=T, subsample=1, verifiers=["token"], families=["token"],
                        trees=TREES, bound_budget=16).for_vocabulary(V)
    prompts = [[3, 7, 1], [5, 2, 9], [1, 1, 4]][:B]
    rows = C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)))
    out = {}
    for b, r in enumerate(rows):
        keep = np.asarray(r["kind"]) == TB.BOUND_KIND
        for pos, name, j, v in zip(*(np.asarray(r[c])[keep] for c in ("pos", "name", "j", "value"))):
            out[(b, int(pos), str(name), int(j))] = float(v)
    monkeypatch.undo()
    return out, reads, values


@pytest.mark.parametrize("B", [1, 3])
def test_device_route_rows_equal_the_host_route(monkeypatch, B):
    dev, reads, values = _walk(monkeypatch, 300, B, bound_on_device=True)
    host, _, _ = _walk(monkeypatch, 300, B, bound_on_device=False)
    assert set(dev) == set(host) and len(dev) == B * T * len(TREES) * len(TB.BOUND_FIELDS)
    for key, v in host.items():
        if key[3] == 1:      # the value
            assert abs(dev[key] - v) <= 1e-12 * max(abs(v), 1.0), key
        elif key[3] == 2:    # the remainder
            assert abs(dev[key] - v) <= 1e-12 * max(abs(host[key[:3] + (1,)]), 1.0), key
        else:                # pi exact, prefixes expanded
            assert dev[key] == v, key


#: Host reads of the bound per position on the device route with the four families above, for every prompt of the
#: batch and every family together (their expansions' reads shared, otspec.tree._bound._run_reads): per phase
#: (the contexts, then the scored frontiers) one read, and one more before it where a family drawn without replacement
#: needs the race's power sums; here 3 (2 for the contexts, 1 for the frontiers: no race at depth 1 of these shapes),
#: plus the 2 checks of the laws that the scoring call's ``Sampling.probs`` reads: measured 5 at every V and B here.
#: Before: one or two reads per family and phase, 12 (10 and the 2 checks). The host route (the bound before, on
#: this walk) reads 10-12 times but copies the laws: 30,302 values per position at V = 300 and B = 1, 490,502 at
#: V = 1,500 and B = 3; the device route 830 and 2,486. Then the contexts' expansion begun before the walk's tree
#: values are read, its first read (the race's power sums here) taken with theirs (otspec.profile._tree_bound.
#: begin_bounds): 4 (tests/test_profile_tree_bound_reads.py).
READS_PER_POSITION = 4


@pytest.mark.parametrize(("V", "B"), [(300, 1), (300, 3), (1500, 3)])
def test_host_reads_per_position_grow_with_neither_V_nor_the_batch(monkeypatch, V, B):
    _rows, reads, values = _walk(monkeypatch, V, B, bound_on_device=True)
    assert len(reads) == T and max(reads) <= READS_PER_POSITION, reads
    # per-row values only: no law of V entries (the candidates of the contexts' expansion and the race's sums)
    assert max(values) <= B * 4 * (16 * 8 + 200) + 2000, values


def _bound_ops(monkeypatch, V: int, B: int, budget: int) -> tuple[float, float]:
    """aten ops and host reads per position inside the bound (``position_bounds``) of the device walk above, the
    models' forward passes left out (``experiments/bench_profile_ops.py``'s counting)."""
    import sys
    from pathlib import Path

    import otspec.profile._collect as C

    root = Path(__file__).resolve().parents[1] / "experiments"
    sys.path.insert(0, str(root))
    try:
        import bench_profile_ops as O
    finally:
        sys.path.remove(str(root))
    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TB, "BOUND_ON_DEVICE", True)
    c, n, real = O.Counts(), [0], C.position_bounds

    def counted(*a, **k):
        n[0] += 1
        with O.counting(c):
            return real(*a, **k)

    monkeypatch.setattr(C, "position_bounds", counted)
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=T, subsample=1, verifiers=["token"], families=["token"],
                        trees=TREES, bound_budget=budget).for_vocabulary(V)
    C.profile_bucket(draft, target, [[3, 7, 1], [5, 2, 9], [1, 1, 4]][:B], [None] * B, s, list(range(B)))
    monkeypatch.undo()
    assert n[0] == T
    return c.aten / T, c.reads / T


#: aten ops per position of the bound on the device route with the four families above (V = 300, measured: 735.3 at
#: B = 1 and 742.7 at B = 3, the same at budgets 16 and 48). Before: one indexing op per scored path and per held law
#: (each prompt's context's children and its trees' internal nodes): 937.3 and 1,092 at B = 1, 1,235.7 and 1,686.3
#: at B = 3 (budgets 16 and 48); then one gather per tensor that holds some (the tree call's laws, the walk's draft
#: and target laws), split into rows by one ``unbind``: 824.3 and 827.7; then the bound's own passes in fewer ops
#: (tests/test_tree_bound_device.py, ``OPS``) and the families' reads shared: 735.3 and 742.7.
OPS_PER_POSITION = 745


@pytest.mark.parametrize("B", [1, 3])
def test_ops_per_position_grow_with_neither_the_budget_nor_the_batch(monkeypatch, B):
    ops = {b: _bound_ops(monkeypatch, 300, B, b) for b in (16, 48)}
    assert ops[48][0] - ops[16][0] <= 8, ops      # not one op per scored path or held law
    assert max(o for o, _ in ops.values()) <= OPS_PER_POSITION, ops
    assert max(r for _, r in ops.values()) <= READS_PER_POSITION, ops
