"""The profile's tree bound on the device route reads the host once per subsampled position for its own values: the
contexts' expansion (:func:`otspec.profile._tree_bound.begin_bounds`) reads only the contexts' laws, so it is begun
before the walk's tree values are read and its first read is taken with theirs; the frontier's expansion after the
scoring call is the bound's one read of its own (one more where a family drawn without replacement needs the
exponential race's power sums at the contexts). The walk's laws are CPU tensors standing in for a GPU's
(:func:`otspec.profile._collect.analysis_device` patched); the rows are the same to the bit as the bound not begun
(its every read inside :func:`otspec.profile._tree_bound.position_bounds`, the code before)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import otspec.profile._tree_bound as TB  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from tests.test_profile_host_reads import HostReads  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

T = 2  # positions walked, each subsampled
V = 300
#: Families without the race at the contexts (the i.i.d. draws, and ranks 0 and 1 without replacement: two children,
#: the race at the frontier) and with it (four children drawn without replacement: ranks 2 and 3 by the race).
FAMILIES = {"iid": ["iid:branching(4,2)", "iid:branching(8,7)"], "wor": ["wor:branching(2,3)"],
            "race": ["wor:branching(4,2):sequoia", "iid:branching(4,2)"]}
#: The contexts' expansion begun (:func:`begin_bounds`) takes one read of the walk's own: measured 6, 9 and 7 reads
#: per position of the whole walk (before 7, 10 and 8).


def _walk(monkeypatch, trees: list, budget: int, *, begun: bool):
    """The rows of a tiny Llama pair's device walk of 2 prompts (but the times), the host reads of the whole walk per
    position, and those inside the bound (:func:`position_bounds`) and inside the bound's own reads
    (``_bound._read``)."""
    import otspec.profile._collect as C
    import otspec.tree._bound as TBd

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    monkeypatch.setattr(TB, "BOUND_ON_DEVICE", True)
    if not begun:               # every read of the bound inside position_bounds (the code before)
        monkeypatch.setattr(C, "begin_bounds", lambda *a, **k: None)
    inside, own = [], [0]
    real, real_read = C.position_bounds, TBd._read

    def counted(*a, **k):
        with HostReads() as mode:
            out = real(*a, **k)
        inside.append(len(mode.reads))
        return out

    def read(parts):
        own[0] += 1
        return real_read(parts)

    monkeypatch.setattr(C, "position_bounds", counted)
    monkeypatch.setattr(TBd, "_read", read)
    draft, target = tiny_llama(1, vocab=V), tiny_llama(2, vocab=V)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=T, subsample=1, verifiers=["token"], families=["token"],
                        trees=trees, bound_budget=budget).for_vocabulary(V)
    with HostReads() as mode:
        rows = C.profile_bucket(draft, target, [[3, 7, 1], [5, 2, 9]], [None] * 2, s, [0, 1])
    monkeypatch.undo()
    assert len(inside) == T
    out = {}
    for b, r in enumerate(rows):
        keep = np.asarray(r["kind"]) != "time"      # every row but the measured times
        for key in r:
            out[(b, key)] = np.asarray(r[key])[keep]
    return out, len(mode.reads) / T, max(inside), own[0] / T


@pytest.mark.parametrize("fams", list(FAMILIES))
def test_begun_bound_is_the_same_to_the_bit_in_one_read_fewer(monkeypatch, fams):
    new, walk_new, _, _ = _walk(monkeypatch, FAMILIES[fams], 16, begun=True)
    old, walk_old, _, _ = _walk(monkeypatch, FAMILIES[fams], 16, begun=False)
    assert set(new) == set(old) and any(np.any(old[(b, "kind")] == TB.BOUND_KIND) for b in (0, 1))
    for key, v in old.items():
        assert v.dtype == new[key].dtype and np.array_equal(v, new[key]), key
    assert walk_new == walk_old - 1, (walk_new, walk_old)


#: The bound's own reads (``_bound._read``) per subsampled position of the walk above, at the profile's budget 64 and
#: at 256, measured: 1 (the frontiers' values) for the i.i.d. families, 2 where the race runs once (at the contexts:
#: their values after its power sums; or at the frontier, branching(2, 3)'s three children drawn without
#: replacement). Before (the contexts' first read inside the bound): 2, 3 and 3.
OWN_READS = {"iid": 1, "wor": 2, "race": 2}
#: Then the frontiers' first read rides the walk's next read (otspec.profile._tree_bound.BoundsLater, the rows written
#: then; tests/test_profile_reads_bk.py): measured 0, 1 and 1 (the race's values after its power sums), which the
#: code before fails.
OWN_READS.update({"iid": 0, "wor": 1, "race": 1})
#: Every host read inside ``position_bounds`` per position, measured: those above and the 2 checks of the laws that
#: the scoring call's ``Sampling.probs`` reads (before: 4, 5 and 5).
INSIDE_READS = {"iid": 3, "wor": 4, "race": 4}


@pytest.mark.parametrize("budget", [64, 256])
@pytest.mark.parametrize("fams", list(FAMILIES))
def test_reads_of_the_bound_per_subsampled_position(monkeypatch, fams, budget):
    _, _, inside, own = _walk(monkeypatch, FAMILIES[fams], budget, begun=True)
    assert own == OWN_READS[fams], own
    assert inside <= INSIDE_READS[fams], inside
