"""A subsampled position of the profile's walk reads the host once: its costly quantities' values ride in the next read.

The batched forms of the costly quantities (k-Seq's, multi-round's and typical acceptance's conditional laws at every
node of the draft tree) lay the tree's nodes out on the host from the drafts. The drafts used to be read on their own
first (with the draft calls' bad-logits flags), then the position's values; now the drafts come in the position's one
read (with the path's target law and the flags, as at a cheap position), the nodes are laid out after it and the
position's values are read with the next read of the walk (the next profiled position's, a position not profiled's
target law, or the walk's end), its rows written then, before any later row. The rows are those of a walk that reads
the values at once (the same arithmetic on the same laws, read later), bit for bit and in the same order.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from otspec.profile import ProfileSettings  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

V, T = 40, 4
VERIFIERS = ("token", "optimal", "kseq", "multiround", "typical")
FAMILIES = ("token", "kseq", "multiround", "typical", "block")


def _walk(monkeypatch, *, trees, stride, B, at_once: bool, host: bool = False):
    """The rows (every column, the timing rows left out, in the order written) of a walk on the device route (torch
    CPU tensors), every profiled position subsampled, and its host reads; ``at_once``: each position's values read at
    the position (:func:`otspec.profile._collect.batch_builds` made to read at once, whatever the walk asks);
    ``host``: the numpy route instead (each position's rows written at the position)."""
    import otspec.profile._collect as C

    if not host:
        monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    if at_once:
        real = C.batch_builds

        def now(*a, defer=False, **kw):
            got = real(*a, **kw)
            return (got, []) if defer else got

        monkeypatch.setattr(C, "batch_builds", now)
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = ProfileSettings(k_max=3, L_max=2, max_new_tokens=T, subsample=1, stride=stride, batch_size=B,
                        verifiers=VERIFIERS, families=FAMILIES, trees=trees).for_vocabulary(V)
    prompts = [[3 + b, 7, 1 + 2 * b] for b in range(B)]
    with HostReads() as mode:
        if B == 1:
            got = [C.profile_prompt(draft, target, prompts[0], None, s, 0)]
        else:
            got = C.profile_bucket(draft, target, prompts, [None] * B, s, list(range(B)))
    rows = [[tuple(r[c][i] for c in C.COLUMNS[:-1]) + (struct.pack("<d", r["value"][i]),)
             for i in range(len(r["kind"])) if r["kind"][i] not in C.TIMING_KINDS] for r in got]
    monkeypatch.undo()
    return rows, len(mode.reads)


@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("trees", [(), ("topk:branching(2,2)",)])
def test_a_subsampled_position_reads_once_and_writes_the_rows_of_a_read_at_once(monkeypatch, trees, stride, B):
    # at_once: the old route's reads (the drafts with the flags, then the values) at every subsampled position
    now, reads_now = _walk(monkeypatch, trees=trees, stride=stride, B=B, at_once=True)
    later, reads = _walk(monkeypatch, trees=trees, stride=stride, B=B, at_once=False)
    assert all(r for r in later) and any(row[2] == "acc" and row[3] == "kseq" for row in later[0])
    assert later == now  # every row, bit for bit, in the same order (the position's rows before its trees')
    # the order and the values of the numpy route, which writes every row at its position (the values to rounding:
    # float64 sums in another order)
    ref, _ = _walk(monkeypatch, trees=trees, stride=stride, B=B, at_once=False, host=True)
    assert [[row[:-1] for row in r] for r in later] == [[row[:-1] for row in r] for r in ref]
    np.testing.assert_allclose([struct.unpack("<d", row[-1])[0] for r in later for row in r],
                               [struct.unpack("<d", row[-1])[0] for r in ref for row in r], rtol=1e-12, atol=1e-300)
    profiled = len(range(0, T, stride))
    # one read a position, profiled or not (a profiled one's values with the next read); the last profiled
    # position's values at the walk's end when no position follows it (stride 1), else with that one's law
    assert reads == T + (stride == 1), (reads, reads_now)
    # at once: two reads a profiled position (the drafts, then the values), the trees' values left for the next read
    assert reads_now == reads + profiled - (stride == 1 and not trees), (reads, reads_now)


def test_a_position_with_the_tree_bound_reads_its_values_at_once(monkeypatch):
    # with the bound (a sampled family, subsampled positions) the trees are scored before the position's values are
    # read and the bound needs them at once: the position's values come in that read, nothing left for the next
    trees = ("iid:branching(2,2):specinfer",)
    now, _ = _walk(monkeypatch, trees=trees, stride=1, B=1, at_once=True)
    later, _ = _walk(monkeypatch, trees=trees, stride=1, B=1, at_once=False)
    assert later == now and any(row[2] == "treebound" for row in later[0])
