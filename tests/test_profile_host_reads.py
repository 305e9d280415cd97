"""The profile's chain walk on the device route reads the host a bounded number of times per position.

On a GPU every read of a tensor into host memory (``tolist``, ``item``, ``numpy``, ``np.asarray``, a Python number
made of a tensor) waits for the device's queue, so the profile's cost outside the forward passes grows with the
number of reads per position more than with their size. The walk is run on the device route (the laws kept as torch
tensors, here on the CPU: :func:`otspec.profile._collect.analysis_device` patched) and every read counted.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.overrides import TorchFunctionMode  # noqa: E402

from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._collect import profile_prompt  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

T = 6  # positions walked (stride 1: every one profiled)


class HostReads(TorchFunctionMode):
    """Counts every call that copies a tensor's values into host memory (a synchronisation on a GPU); the calls a
    read makes inside it (``np.asarray`` calling ``numpy``) are not seen twice (a mode is off in its own handler)."""

    READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.numpy, torch.Tensor.__array__,
             torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []
        self.values = 0  # entries read

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            self.reads.append(func.__name__)
            self.values += args[0].numel()
        return func(*args, **(kwargs or {}))


#: The verifiers and families walked: the batched cheap ones and a costly one of each (on the subsample).
NAMES = dict(verifiers=["token", "optimal", "kseq", "multiround"], families=["token", "block", "block-onestep", "kseq"])


def walk_reads(monkeypatch, subsample: int) -> tuple[dict, float]:
    """The rows of a tiny Llama pair's walk (k_max = L_max = 4) on the device route, and its host reads per
    position."""
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=T, subsample=subsample, **NAMES).for_vocabulary(40)
    with HostReads() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    return rows, len(mode.reads) / T


#: Reads per position: the drafts (drawn on the device) with the four draft calls' checks for bad logits, the path's
#: target law with the target call's, and one read of every batched quantity of the position (before: each draft
#: step's law read to be sampled on the host, one read per batched quantity and one per call's check: 15 and 18,
#: then 8 and 11 with the checks read alone). On the subsample the costly quantities named here (k-Seq's and
#: multi-round's acceptance and expected tokens) have batched forms read in that same one read (before: the host
#: copies of the laws for the per-depth and per-node builds, and k-Seq's acceptance apart). Then the path's target law
#: and the target call's check read with the position's batched quantities: 3 -> 2. Then, at a position with no costly
#: quantity, the drafts and the draft calls' checks read with those too (the costly quantities lay the drafts' tree out
#: on the host before their read: still 2 there): 2 -> 1.
BOUND = {0: 1, 1: 2}


@pytest.mark.parametrize("subsample", [0, 1])
def test_reads_per_position_on_the_device_route(monkeypatch, subsample):
    rows, reads = walk_reads(monkeypatch, subsample)
    assert {"acc", "tau"} <= set(rows["kind"]) and ("multiround" in rows["name"]) == (subsample > 0)
    assert reads <= BOUND[subsample], reads


#: Host reads and entries read per position with the optimal verifier's and Khisti's expected tokens on the subsample
#: (V = 400, top_k = 5, k_max = L_max = 4), measured: 5 reads and 3,746 entries. Before: 5 reads and 14,841 entries
#: (the (k, L) laws copied whole for the verifiers built per node, and built at every node); now the nodes with one
#: draft come with the position's other values, and the laws reach the host restricted to their support. Then the
#: path's target law read with the position's batched quantities: 4 reads.
SUPPORT_BOUND = (4, 4000)
#: Then the support's columns read with the position's batched quantities (gathered on the device to top_k times the
#: laws' rows: otspec.profile._quantities.support_part), the host copy in one read: measured 3 reads and 3,614 entries
#: (before 4 and 3,833, which fail these).
SUPPORT_BOUND = (3, 3650)


@pytest.mark.parametrize("family", ["optimal", "khisti"])
def test_the_per_node_builds_read_the_support_only(monkeypatch, family):
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=400), tiny_llama(2, vocab=400)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=T, subsample=1, top_k=5, verifiers=["token"],
                        families=["token", family]).for_vocabulary(400)
    with HostReads() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    assert family in set(rows["name"])
    reads, values = len(mode.reads) / T, mode.values / T
    assert reads <= SUPPORT_BOUND[0] and values <= SUPPORT_BOUND[1], (reads, values)


def test_a_support_wider_than_its_width_is_read_as_before(monkeypatch):
    # ties at top_k can keep more tokens than support_width: the columns are then read apart (one read more per
    # position), and every row is the same, bit for bit
    import otspec.profile._collect as C
    import otspec.profile._quantities as Qm

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=400), tiny_llama(2, vocab=400)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=T, subsample=1, top_k=5, verifiers=["token", "khisti"],
                        families=["token", "optimal"]).for_vocabulary(400)
    got = {}
    for name, width in (("gathered", Qm.support_width), ("overflow", lambda top_k, P, Q: 1)):
        monkeypatch.setattr(Qm, "support_width", width)
        with HostReads() as mode:
            got[name] = (profile_prompt(draft, target, [3, 7, 1], None, s, 0), len(mode.reads))
    (a, ra), (b, rb) = got["gathered"], got["overflow"]
    assert rb == ra + T, (ra / T, rb / T)  # whole counts: one more per position
    n = len(a["value"]) - 4  # all but the seconds of the two time rows
    assert n > 0 and {c: v[:n] for c, v in a.items()} == {c: v[:n] for c, v in b.items()}


#: Host reads and entries read per position of the walk with one tree family (V = 400, k_max = L_max = 4, no
#: subsample), measured: topk 9 reads / 479 entries, eagle2 15 / 564, iid 4 / 469, wor 4 / 474. Before: 9 / 871, 15 /
#: 956, 5 / 869, 5 / 874 -- the roots' draft law read whole (V entries) to rank or draw the roots' children on the host
#: (and sent back to the device for the sampled trees): now ranked where it is, (B, K) ranks and values read. Then
#: the path's target law read with the position's batched quantities, a depth's ranks, values and own-law values in
#: one read (before: one each), a text's ranks and the probabilities there in one: topk 6, eagle2 10, iid 3, wor 3
#: reads (the same entries). Then the roots' ranks and values read with the first depth's (its draft tokens gathered
#: from the roots' rankings on the device): topk 5, eagle2 9. Then every depth drafted with no read (EAGLE-2's
#: frontier chosen on the device; its draft laws checked in the read, no longer one check read per depth), the depths'
#: ranks and values read once: topk 4 reads / 478 entries, eagle2 4 / 613 (the entries of EAGLE-2's logarithms, and
#: of every row of a depth ranked at once, added). Then the drafts and the draft calls' checks read with the position's
#: batched quantities: topk 3, eagle2 3, iid 2, wor 2 (the same entries). Then the trees drafted before that read and
#: their depths' ranks and values read in it (expanded and scored after it): topk 2, eagle2 2 (the same entries).
#: Then each position's tree values (scored and verified after the position's read) read with the next position's
#: read, the last position's at the walk's end: n + 1 reads per walk of n positions, 1.25 per position at n = 4
#: (before: 2 n), every family (the same entries).
TREE_BOUND = {"topk:branching(4,2)": (1.25, 479), "eagle2:4,4,16": (1.25, 620),
              "iid:branching(4,2):specinfer": (1.25, 469), "wor:branching(4,2):sequoia": (1.25, 474)}


@pytest.mark.parametrize("tree", list(TREE_BOUND))
def test_the_trees_roots_are_expanded_where_their_law_is(monkeypatch, tree):
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    V, n = 400, 4
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=n, subsample=0, verifiers=["token"], families=["token"],
                        trees=[tree]).for_vocabulary(V)
    with HostReads() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    assert "tree" in set(rows["kind"])
    reads, values = len(mode.reads) / n, mode.values / n
    assert reads <= TREE_BOUND[tree][0] and values <= TREE_BOUND[tree][1], (reads, values)


class Unmoved(TorchFunctionMode):
    """Records every read of a tensor into numpy (``numpy``, ``np.asarray``) that no move to the CPU preceded: on a
    GPU each raises (a device tensor has no numpy view); on the CPU stand-in of the device route it passes silently.
    A tensor counts as moved when it is the result of ``cpu()`` or ``to("cpu")``."""

    def __init__(self):
        super().__init__()
        self.moved: set = set()
        self.bad: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        where = list(args[1:]) + list((kwargs or {}).values())
        if func is torch.Tensor.cpu or (func is torch.Tensor.to and any(
                (isinstance(a, str) and a == "cpu") or (isinstance(a, torch.device) and a.type == "cpu") for a in where)):
            self.moved.add(id(out))
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and id(args[0]) not in self.moved:
            self.bad.append(tuple(args[0].shape))
        return out


def test_no_tensor_is_read_into_numpy_in_place_with_trees(monkeypatch):
    # the trees' roots were handed to the tree walk as np.asarray(draft law): on a GPU that raises (the law is a device
    # tensor since the drafts are drawn there); every read of the walk, with the four tree families and the bound on the
    # subsample, goes through a move to the CPU first
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    trees = ["topk:branching(4,2)", "eagle2:4,4,16", "iid:branching(4,2):specinfer", "wor:branching(4,2):sequoia"]
    s = ProfileSettings(k_max=3, L_max=3, max_new_tokens=3, subsample=1, trees=trees).for_vocabulary(40)
    with Unmoved() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    assert {"tree", "treebound"} <= set(rows["kind"]) and not mode.bad, mode.bad


class _Poisoned:
    """A language model whose ``bad``-th call of ``logits`` made by the walk's timed calls (``_Timer.call``: the
    chains' draft steps and target calls, not the tree families' calls), counted from 0, has a NaN entry (its law
    then has no row)."""

    timed = [0]  # > 0 inside _Timer.call

    def __init__(self, lm, bad: int, name: str):
        self.lm, self.bad, self.name, self.n = lm, bad, name, 0

    def __getattr__(self, attr):
        return getattr(self.lm, attr)

    def logits(self, state, ids):
        out = self.lm.logits(state, ids)
        if self.timed[0]:
            if self.n == self.bad:
                out = out.clone()
                out[..., -1] = float("nan")
            self.n += 1
        return out


#: The four tree families, small: drafted, at a cheap position on the device route, before the position's one read.
TREES = ["topk:branching(2,2)", "eagle2:2,2,4", "iid:branching(2,2):specinfer", "wor:branching(2,2):sequoia"]


@pytest.mark.parametrize("route", ["device", "host"])
@pytest.mark.parametrize("bucket", [False, True])
@pytest.mark.parametrize("trees", [(), TREES])
def test_bad_logits_in_any_call_of_a_position_raise_before_its_rows(monkeypatch, route, bucket, trees):
    """A NaN in any model call of a position -- each draft step, the target's scoring call, the target's call at a
    position not profiled -- raises the error naming the model and the position, before any row of that position is
    written (the checks read with the drafts and the path's law on the device route; on the host copies
    otherwise). With trees, drafted on the device route from the position's draft laws before that read (a NaN root
    law among them) and scored after it: the same error, before any row."""
    import otspec.profile._collect as C

    if route == "device":
        monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    call = C._Timer.call

    def timed(self, *a, **kw):
        _Poisoned.timed[0] += 1
        try:
            return call(self, *a, **kw)
        finally:
            _Poisoned.timed[0] -= 1

    monkeypatch.setattr(C._Timer, "call", timed)
    written: list[int] = []
    real = C.position_rows
    monkeypatch.setattr(C, "position_rows", lambda rows, t, *a, **kw: (written.append(t), real(rows, t, *a, **kw))[1])
    L = 3
    prompts = [[3, 7, 1], [5, 2, 9]] if bucket else [[3, 7, 1]]
    B = len(prompts)
    # (model, its poisoned call, stride, the position that fails): position 2's draft steps and target call; with
    # stride 2, the target's call at position 1 (not profiled: its law read to the host to draw the path's token)
    cases = [("draft", 2 * L + c, 1, 2) for c in range(L)] + [("target", 2, 1, 2), ("target", 1, 2, 1)]
    for which, bad, stride, pos in cases:
        s = ProfileSettings(k_max=2, L_max=L, max_new_tokens=4, stride=stride, verifiers=["token"],
                            families=["token"], trees=trees).for_vocabulary(40)
        draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
        if which == "draft":
            draft = _Poisoned(draft, bad, "bad-draft")
        else:
            target = _Poisoned(target, bad, "bad-target")
        written.clear()
        with pytest.raises(ValueError, match=rf"the {which} model 'bad-{which}' gave non-finite logits \(NaN or inf\) "
                                             rf"at path position {pos}\b.*logits gave no valid law"):
            if bucket:
                C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)))
            else:
                C.profile_prompt(draft, target, prompts[0], None, s, 0)
        assert written == [t for t in range(0, pos, stride) for _ in range(B)], (which, bad, written)


def test_ranked_rows_on_the_device_need_no_nonzero():
    # the trees' ranking of a torch law: no nonzero (its output's size is a host read on a GPU), nor any other read,
    # and the host's ranking (ties to the lower id), ties and zeros included
    from otspec.profile._trees import ranked_rows

    p = np.array([[0.1, 0.4, 0.1, 0.4, 0.0], [0.25, 0.25, 0.0, 0.25, 0.25], [0.5, 0.0, 0.0, 0.0, 0.5]])
    calls = []

    class Seen(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    for K in (1, 2, 3, 5):
        with Seen():
            ids_t, vals_t = ranked_rows(torch.from_numpy(p), K)
        assert "nonzero" not in calls and not set(calls) & {f.__name__ for f in HostReads.READS}, calls
        ids, vals = ranked_rows(p, K)
        np.testing.assert_array_equal(ids_t.numpy(), ids)
        np.testing.assert_array_equal(vals_t.numpy(), vals)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.booleans())
def test_sample_rows_of_a_tensor_draw_the_numpy_route_s_ids_from_the_same_stream(seed, n, broadcast):
    # laws with zero-mass entries (never drawn), one law broadcast to every row or one law per row: the same ids as
    # the numpy route's, from the same uniforms (the generators end in the same state), as a tensor where P lives
    from otspec.decoding._sampling import sample_rows

    r = np.random.default_rng(seed)
    V = 9
    P = r.random((1 if broadcast else n, V)) * (r.random((1 if broadcast else n, V)) < 0.6)
    P[:, r.integers(V)] += 0.5
    P /= P.sum(axis=1, keepdims=True)
    Pn = np.broadcast_to(P, (n, V)) if broadcast else P
    Pt = torch.from_numpy(P).expand(n, V) if broadcast else torch.from_numpy(P)
    g1, g2 = np.random.default_rng(seed + 1), np.random.default_rng(seed + 1)
    for _ in range(5):
        with HostReads() as mode:
            got = sample_rows(Pt, g2)
        assert torch.is_tensor(got) and got.dtype == torch.long and not mode.reads
        np.testing.assert_array_equal(got.numpy(), sample_rows(Pn, g1))
    assert g1.random() == g2.random()


@pytest.mark.parametrize("renewal", [("token", "block-onestep"), ("token", "block-onestep", "kseq")])
def test_the_renewal_tables_along_the_text_read_the_host_once_per_walk(monkeypatch, renewal):
    # every value along the text computed on the device (the text tokens' draft probabilities, the static top-k
    # families' ranks, the i.i.d. families' levels, the whole laws for a scheme reading every token) and the
    # teacher-forced draft pass's bad-logits check: one read per walk (before: the pass's check, then one read per
    # scheme's text probabilities, per top-k family's ranks, per i.i.d. family's levels and text probabilities: 7 with
    # two top-k families and one i.i.d. family, 3 for the schemes alone)
    import otspec.profile._collect as C
    from otspec.profile._renewal_hook import emission_rows

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    trees = ["topk:branching(2,2)", "topk:branching(3,1)", "iid:branching(2,2):specinfer"]
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=4, verifiers=["token"], families=["token", "kseq"],
                        renewal=list(renewal), trees=trees).for_vocabulary(40)
    seen = []

    def hook(*a, **kw):
        with HostReads() as mode:
            emission_rows(*a, **kw)
        seen.append(len(mode.reads))

    rows = C.profile_prompt(draft, target, [3, 7, 1], None, s, 0, renewal=hook)
    names = {n for k, n in zip(rows["kind"], rows["name"]) if k == "e"}
    assert set(renewal) <= names and len(names) >= len(renewal) + 3, names
    assert seen == [1], seen


def test_bad_logits_along_the_text_raise_the_checked_error(monkeypatch):
    # the teacher-forced draft pass's check rides in the hook's one read: a NaN there raises the error the pass
    # checked at once raises (the processed law's), before any row of the hook is written
    import otspec.profile._collect as C
    import otspec.profile._renewal_hook as H
    from otspec.decoding._sampling import NO_LAW

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=3, verifiers=["token"], families=["token"],
                        trees=["topk:branching(2,2)"]).for_vocabulary(40)
    real = draft.logits

    def bad(state, ids):
        out = real(state, ids)
        if ids.shape[1] > 3:  # the teacher-forced pass over the prompt and the text (the walk feeds fewer tokens)
            out = out.clone()
            out[0, -2, 5] = float("nan")
        return out

    monkeypatch.setattr(draft, "logits", bad)
    n = []
    real_rows = H.emission_rows

    def hook(rows, *a, **kw):
        n.append(len(rows.cols["value"]))
        try:
            real_rows(rows, *a, **kw)
        finally:
            n.append(len(rows.cols["value"]))
            kinds.extend(rows.cols["kind"])
            last.extend(rows.cols["pos"])

    kinds, last = [], []
    with pytest.raises(ValueError, match=re.escape(NO_LAW)):
        C.profile_prompt(draft, target, [3, 7, 1], None, s, 0, renewal=hook)
    # the walk's last position's values ride in the hook's read (its rows written first, as the walk's own read at
    # its end wrote them before): no row of the hook's (kinds "e", "logq"), every row of the walk's last position
    assert len(n) == 2 and not {"e", "logq"} & set(kinds) and 2 in last and "tree" in kinds, n


@pytest.mark.parametrize("tree", ["topk:branching(2,2)", "iid:branching(2,2):specinfer"])
@pytest.mark.parametrize("bucket", [False, True])
def test_a_bad_tree_law_read_with_the_next_position_raises_before_its_tree_rows(monkeypatch, tree, bucket):
    # the trees' values of position 1 ride in position 2's read: a NaN in position 1's tree scoring call raises the
    # checked route's error there, before position 1's tree rows and position 2's rows are written (the same rows as
    # when the trees were read at their own position); a walk without the NaN writes every position's rows, in order
    import otspec.profile._collect as C
    from otspec.decoding._sampling import NO_LAW

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    chain, trees = [], []
    real_rows, real_tree = C.position_rows, C.record_position
    monkeypatch.setattr(C, "position_rows", lambda rows, t, *a, **kw: (chain.append(t), real_rows(rows, t, *a, **kw))[1])
    monkeypatch.setattr(C, "record_position", lambda r, pos, *a, **kw: (trees.append(pos), real_tree(r, pos, *a, **kw))[1])
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=4, subsample=0, verifiers=["token"], families=["token"],
                        trees=[tree]).for_vocabulary(40)  # no bound: one tree scoring call per position
    prompts = [[3, 7, 1], [5, 2, 9]] if bucket else [[3, 7, 1]]
    B = len(prompts)

    def walk(draft, target):
        if bucket:
            return C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)))
        return [C.profile_prompt(draft, target, prompts[0], None, s, 0)]

    walk(tiny_llama(1, vocab=40), tiny_llama(2, vocab=40))
    assert chain == [t for t in range(4) for _ in range(B)] and trees == chain, (chain, trees)
    chain.clear()
    trees.clear()
    target = tiny_llama(2, vocab=40)
    real, calls = target.tree_logits, []

    def bad(*a, **kw):
        out = real(*a, **kw)
        calls.append(1)
        if len(calls) == 2:  # position 1's scoring call
            out = out.clone()
            out[..., 0, -1] = float("nan")
        return out

    monkeypatch.setattr(target, "tree_logits", bad)
    with pytest.raises(ValueError, match=re.escape(NO_LAW)):
        walk(tiny_llama(1, vocab=40), target)
    assert chain == [t for t in range(2) for _ in range(B)] and trees == [0] * B, (chain, trees)
