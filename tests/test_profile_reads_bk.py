"""A subsampled position of the profile's walk with the tree bound reads the host once on the device route.

Before the position's one read, from the device's laws and tokens alone, the sampled trees (drawn on the device, their
tree call fed there) are scored and verified (:func:`otspec.profile._trees.score_sampled`) and the bound's contexts'
expansion is begun (:func:`otspec.profile._tree_bound.begin_bounds`): their first values travel in that read, which is
all the bound needs before its own tree-attention calls, made at the position (the models' states hold its context
there). After the read the other trees are scored from their tokens, the costly chain quantities laid out from the
drafts, and the bound stopped before its frontiers' first read (``position_bounds(..., defer=True)``): their values
ride the next read of the walk (the next profiled position's, a position not profiled's target law, or the renewal
hook's read along the text at the walk's end, :func:`otspec.profile._renewal_hook.emission_rows`' ``before``), the
position's rows written then, before any later row. The race of a family drawn without replacement still needs its
power sums before its values: one read more per phase where it runs (the contexts', the frontiers').

The walk's laws are CPU tensors standing in for a GPU's (:func:`otspec.profile._collect.analysis_device` patched); its
rows are compared with the numpy route's (every row in the same order, the values to 1e-12: float64 sums in another
order) and read counts are pinned (the code before this change reads 2 to 3 times per such position and once more at
the walk's end: it fails them).
"""

from __future__ import annotations

import struct

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.profile._collect as C  # noqa: E402
import otspec.profile._tree_bound as TB  # noqa: E402
import otspec.profile._trees_device as TD  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._renewal_hook import emission_rows  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

V, T = 40, 4
#: The families of the rows test: i.i.d. and without replacement (the bound on both), top-k and EAGLE-2.
TREES = ("iid:branching(3,2):specinfer", "wor:branching(3,2):sequoia", "topk:branching(2,2)", "eagle2:3,3,6")
#: Families whose bound runs no race (i.i.d. draws; two children drawn without replacement: ranks 0 and 1 in closed
#: form at the contexts, and branching(2, 2)'s frontier of depth 2 ends the search).
NO_RACE = ("iid:branching(3,2):specinfer", "topk:branching(2,2)", "eagle2:3,3,6")


def _walk(monkeypatch, trees, *, B: int, stride: int, subsample: int = 1, host: bool = False, renewal=None,
          budget: int = 12, same_trees: bool = False):
    """The rows (every column, the timing rows left out, in the order written) of a walk of ``B`` prompts on the device
    route (torch CPU tensors; ``host``: the numpy route; ``same_trees``: the sampled trees drawn as the numpy route
    draws them), and its host reads."""
    if not host:
        monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
        if same_trees:  # the sampled trees drawn from the host route's stream (SampledTrees' check route)
            monkeypatch.setattr(TD, "device_generator", lambda rngs, dev: None)
    monkeypatch.setattr(TB, "BOUND_ON_DEVICE", True)
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    # float64 forwards: the two routes need not call the models in the same order on the same shapes (the sampled
    # trees are scored before the position's read on the device route), and float32 products of other shapes may
    # round otherwise (seen on an AVX2 machine: 9e-9 in a law, far above the rows' 1e-12); in float64 that is 1e-16
    draft.model.double(), target.model.double()
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=T, subsample=subsample, stride=stride, batch_size=B,
                        verifiers=("token", "kseq"), families=("token", "kseq"), trees=trees,
                        bound_budget=budget).for_vocabulary(V)
    prompts = [[3 + b, 7, 1 + 2 * b] for b in range(B)]
    with HostReads() as mode:
        if B == 1:
            got = [C.profile_prompt(draft, target, prompts[0], None, s, 0, renewal=renewal)]
        else:
            got = C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)), renewal=renewal)
    monkeypatch.undo()
    rows = [[tuple(r[c][i] for c in C.COLUMNS[:-1]) + (struct.pack("<d", r["value"][i]),)
             for i in range(len(r["kind"])) if r["kind"][i] not in C.TIMING_KINDS] for r in got]
    return rows, len(mode.reads)


def _same_rows(dev: list, ref: list) -> None:
    """Every row of ``dev`` is ``ref``'s, in the same order, the values to 1e-12 (the bound's remainder relative to
    its value: a difference of two near sums)."""
    assert [[row[:-1] for row in r] for r in dev] == [[row[:-1] for row in r] for r in ref]
    for rd, rr in zip(dev, ref):
        val = {}
        for a, b in zip(rd, rr):
            x, y = struct.unpack("<d", a[-1])[0], struct.unpack("<d", b[-1])[0]
            if a[2] == TB.BOUND_KIND and a[5] == 1:
                val[(a[1], a[3])] = abs(y)
            scale = max(abs(y), 1.0) if not (a[2] == TB.BOUND_KIND and a[5] == 2) else max(val[(a[1], a[3])], 1.0)
            assert abs(x - y) <= 1e-12 * scale, (a[:-1], x, y)


# the default suite: each B and each stride once (B = 1 at stride 1, B = 3 at stride 2: the prompt's and the bucket's
# routes, positions profiled back to back and apart; B = 3 at stride 1 in the renewal test below too); the two other
# corners of the grid under -m slow
@pytest.mark.parametrize(("stride", "B"), [(1, 1), (2, 3), pytest.param(2, 1, marks=pytest.mark.slow),
                                          pytest.param(1, 3, marks=pytest.mark.slow)])
def test_rows_with_every_tree_family_and_the_bound_are_the_numpy_route_s(monkeypatch, B, stride):
    # subsample 2: subsampled positions beside cheap ones (the bound's rows between the trees' and the next
    # position's); the walk's end read on its own (with the renewal hook's read: the test below)
    dev, _ = _walk(monkeypatch, TREES, B=B, stride=stride, subsample=2, same_trees=True)
    ref, _ = _walk(monkeypatch, TREES, B=B, stride=stride, subsample=2, host=True)
    kinds = {row[2] for r in dev for row in r}
    assert {"tree", TB.BOUND_KIND, "acc"} <= kinds, kinds
    assert all(any(row[2] == TB.BOUND_KIND and row[3].startswith(p) for row in dev[0]) for p in ("iid", "wor"))
    _same_rows(dev, ref)


# the default suite: each B and each stride once (B = 1 at stride 1, B = 3 at stride 2: the prompt's and the bucket's
# routes, positions profiled back to back and apart; B = 3 at stride 1 in the renewal test below too); the two other
# corners of the grid under -m slow
@pytest.mark.parametrize(("stride", "B"), [(1, 1), (2, 3), pytest.param(2, 1, marks=pytest.mark.slow),
                                          pytest.param(1, 3, marks=pytest.mark.slow)])
def test_a_subsampled_position_with_the_bound_reads_once(monkeypatch, B, stride):
    # every profiled position subsampled, the bound on (no race): one read a position, profiled or not, and, with a
    # profiled position last (stride 1), one at the walk's end for its values. Before: 2 reads a profiled position
    # besides the bound's 1 (the drafts, the trees' ranks and the path's law; then the trees' and the position's
    # values with the contexts' first read; then the frontiers'), and the walk's end: 13 here at stride 1, B = 1.
    rows, reads = _walk(monkeypatch, NO_RACE, B=B, stride=stride)
    assert any(row[2] == TB.BOUND_KIND for row in rows[0])
    assert reads == T + (stride == 1), reads


@pytest.mark.parametrize("B", [1, 3])
def test_the_walk_s_last_values_ride_the_renewal_hook_s_read(monkeypatch, B):
    # the renewal tables along the text read once per prompt; the walk's last position's values (the bound's
    # frontiers, the trees' and the costly quantities' values) in the first prompt's read: T + B reads in all (before:
    # one more, the walk's own read at its end)
    seen = []

    def hook(*a, **kw):
        seen.append("before" in kw)
        return emission_rows(*a, **kw)

    rows, reads = _walk(monkeypatch, NO_RACE, B=B, stride=1, renewal=hook)
    assert seen == [True] + [False] * (B - 1)
    assert reads == T + B, reads
    same, _ = _walk(monkeypatch, NO_RACE, B=B, stride=1, renewal=emission_rows, same_trees=True)
    ref, _ = _walk(monkeypatch, NO_RACE, B=B, stride=1, renewal=emission_rows, host=True)
    _same_rows(same, ref)


#: Host reads per position of the walk above (stride 1, every position subsampled, B = 1) with a family drawn without
#: replacement whose race runs: one more for each phase where it runs, measured 2 at the contexts (branching(4, 2):
#: ranks 2 and 3 by the race) and 3 with the frontier's too (branching(2, 3)): the contexts' power sums ride the
#: position's read, their values need a read of their own; at the frontier the power sums ride the next read, the
#: values a read of their own. Before: 4 and 5 (the walk's end apart).
RACE = {"wor:branching(4,2):sequoia": 2, "wor:branching(2,3)": 2}


@pytest.mark.parametrize("tree", list(RACE))
def test_the_race_needs_a_read_of_its_own(monkeypatch, tree):
    rows, reads = _walk(monkeypatch, (tree,), B=1, stride=1)
    assert any(row[2] == TB.BOUND_KIND for row in rows[0])
    assert (reads - 1) / T == RACE[tree], reads


def test_the_bound_stopped_before_its_frontiers_read_gives_the_same_bounds(monkeypatch):
    # position_bounds(..., defer=True): the same TreeBound values as read at once, whenever its parts are read
    got = {}
    real = C.position_bounds

    def both(*a, defer=False, **k):
        later = real(*a, defer=True, **k)
        assert defer
        flat = later.parts
        from otspec.profile._quantities import read_parts

        read_parts(flat)
        out = later.finish()
        got.setdefault("n", []).append(len(flat))
        return TB.BoundsLater(None, lambda: out)

    monkeypatch.setattr(C, "position_bounds", both)
    dev, _ = _walk(monkeypatch, TREES, B=1, stride=1)
    ref, _ = _walk(monkeypatch, TREES, B=1, stride=1)
    # (the parts: the bound's scoring calls' bad-logits flags, then the frontiers' first read)
    assert dev == ref and got["n"] and all(n == 2 for n in got["n"])
