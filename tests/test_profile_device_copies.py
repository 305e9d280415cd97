"""The profile's walk on the device route makes a bounded number of tensors from host data per position.

On a GPU every host array or Python number made into a device tensor (``torch.as_tensor``, ``torch.asarray``,
``torch.tensor``, ``torch.from_numpy``, ``torch.scalar_tensor``) is a copy from pageable host memory that waits for
the device's queue, and every ``Tensor.to`` costs a Python dispatch even when it moves nothing. The walk is run on
the device route with the laws kept as torch tensors on the CPU (:func:`otspec.profile._collect.analysis_device`
patched): every CPU tensor stands for a device-resident one, so a tensor made of host data stands for a
host-to-device copy. The calls the models' own forward passes make (inside ``transformers``) are not counted: they
are the forwards, not the profile's work beside them.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.overrides import TorchFunctionMode  # noqa: E402

from otspec.decoding._sampling import on_device  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._collect import profile_prompt  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

T = 4  # positions walked (stride 1: every one profiled)


class DeviceCopies(TorchFunctionMode):
    """Counts the tensors made of host data (``made``) and the ``Tensor.to``/``cuda`` calls and conversions of a
    tensor by a making function (``moves``), outside the models' forward passes (a caller inside
    ``transformers``)."""

    MAKE = {"asarray", "as_tensor", "tensor", "scalar_tensor", "from_numpy"}

    def __init__(self):
        super().__init__()
        self.made = 0
        self.moves = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        f = sys._getframe(1)
        while f is not None and "/torch/" in f.f_code.co_filename:
            f = f.f_back
        if f is None or "/transformers/" not in f.f_code.co_filename:
            if name in self.MAKE and not (args and torch.is_tensor(args[0])):
                self.made += 1
            elif name in self.MAKE or func in (torch.Tensor.to, torch.Tensor.cuda):
                self.moves += 1
        return func(*args, **(kwargs or {}))


NAMES = dict(verifiers=["token", "optimal", "kseq", "multiround"], families=["token", "block", "block-onestep", "kseq"])
TREES = {"chains": None, "topk": ["topk:branching(4,2)"], "eagle2": ["eagle2:4,4,16"],
         "iid": ["iid:branching(4,2):specinfer"], "wor": ["wor:branching(4,2):sequoia"]}


def walk_copies(monkeypatch, subsample: int, trees) -> tuple[dict, float, float]:
    """The rows of a tiny Llama pair's walk (k_max = L_max = 4) on the device route, with the tensors made of host
    data and the moves per position."""
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    kw = {} if trees is None else dict(trees=trees)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=T, subsample=subsample, **NAMES, **kw).for_vocabulary(40)
    with DeviceCopies() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    return rows, mode.made / T, mode.moves / T


#: (tensors made of host data, moves) per position, by tree family and subsample. Before (6 positions; the same
#: walk over 4 gives within half a copy of them): chains
#: 9 / 36 (10 / 62 subsampled), topk 15 / 46 (16 / 72), eagle2 23 / 54 (24 / 80), iid 29.8 / 60 (29 / 100), wor
#: 28 / 62 (29 / 102). The made ones left are the path's tokens (one per model call that feeds them), the numpy
#: generator's uniforms of each draft step's draws, the tree families' host-drawn shapes and nodes.
BOUND = {("chains", 0): (8, 11), ("chains", 1): (9, 33), ("topk", 0): (12, 18), ("topk", 1): (13, 40),
         ("eagle2", 0): (20, 24), ("eagle2", 1): (21, 46), ("iid", 0): (28, 32), ("iid", 1): (26, 68),
         ("wor", 0): (25, 34), ("wor", 1): (26, 70)}


@pytest.mark.parametrize("family", list(TREES))
@pytest.mark.parametrize("subsample", [0, 1])
def test_copies_per_position_on_the_device_route(monkeypatch, family, subsample):
    rows, made, moves = walk_copies(monkeypatch, subsample, TREES[family])
    assert {"acc", "tau"} <= set(rows["kind"])
    made_max, moves_max = BOUND[family, subsample]
    assert made <= made_max and moves <= moves_max, (made, moves)


def test_on_device_skips_the_move_of_a_tensor_in_place():
    t = torch.arange(3, dtype=torch.float64)
    assert on_device(t, "cpu") is t and on_device(t, torch.device("cpu"), torch.float64) is t
    assert on_device(t) is t and on_device(t, dtype=torch.float64) is t
    f = on_device(t, "cpu", torch.float32)
    assert f.dtype == torch.float32 and np.array_equal(f.numpy(), [0, 1, 2]) and t.dtype == torch.float64
    if torch.cuda.is_available():  # pragma: no cover - a GPU
        c = on_device(t, "cuda")
        assert c.device.type == "cuda" and on_device(c, "cuda") is c and on_device(c, "cpu") is not c


def test_select_makes_its_rows_on_the_device_once(monkeypatch):
    # the walk keeps the same rows at every step: the index tensor is made once per rows (not per call)
    from otspec.decoding import HFCausalLM

    lm = tiny_llama(1, vocab=40)
    assert isinstance(lm, HFCausalLM)
    st = lm.new_state()
    lm.logits(st, torch.tensor([[1, 2, 3]] * 3))
    with DeviceCopies() as mode:
        for _ in range(3):
            lm.logits(st, torch.tensor([[4]] * 3))
            lm.select(st, [0, 2, 1], st.length - 1)
    assert mode.made == 3 + 1, mode.made  # one per step's tokens, one index tensor
