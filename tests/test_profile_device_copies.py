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

import otspec.decoding._models as M  # noqa: E402
import otspec.profile._trees_device as TD  # noqa: E402
from otspec.decoding._sampling import on_device  # noqa: E402
from otspec.profile import ProfileSettings  # noqa: E402
from otspec.profile._collect import profile_prompt  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

T = 4  # positions walked (stride 1: every one profiled)


class DeviceCopies(TorchFunctionMode):
    """Counts the tensors made of host data (``made``) and the ``Tensor.to``/``cuda`` calls and conversions of a
    tensor by a making function (``moves``), outside the models' forward passes (a caller inside
    ``transformers``)."""

    MAKE = {"asarray", "as_tensor", "tensor", "scalar_tensor"}

    def __init__(self):
        super().__init__()
        self.made = 0
        self.moves = 0

    def __enter__(self):
        # torch.from_numpy does not pass through a mode: wrapped while the mode is on
        self._from_numpy = torch.from_numpy

        def from_numpy(a):
            self.made += _ours(sys._getframe(1))
            return self._from_numpy(a)

        torch.from_numpy = from_numpy
        return super().__enter__()

    def __exit__(self, *exc):
        torch.from_numpy = self._from_numpy
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if _ours(sys._getframe(1)):
            if name in self.MAKE and not (args and torch.is_tensor(args[0])):
                self.made += 1
            elif name in self.MAKE or func in (torch.Tensor.to, torch.Tensor.cuda):
                self.moves += 1
        return func(*args, **(kwargs or {}))


def _ours(f) -> bool:
    """Whether the first caller outside torch of frame ``f`` is not inside ``transformers`` (a model's forward)."""
    while f is not None and "/torch/" in f.f_code.co_filename:
        f = f.f_back
    return f is None or "/transformers/" not in f.f_code.co_filename


NAMES = dict(verifiers=["token", "optimal", "kseq", "multiround"], families=["token", "block", "block-onestep", "kseq"])
TREES = {"chains": None, "topk": ["topk:branching(4,2)"], "eagle2": ["eagle2:4,4,16"],
         "iid": ["iid:branching(4,2):specinfer"], "wor": ["wor:branching(4,2):sequoia"]}


def walk_copies(monkeypatch, subsample: int, trees) -> tuple[dict, float, float]:
    """The rows of a tiny Llama pair's walk (k_max = L_max = 4) on the device route, with the tensors made of host
    data and the moves per position."""
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    # the tree shapes and the sampled forests' layouts are made on the device once per run and kept by their
    # modules: emptied, so that the count is this run's whatever ran before in the process
    monkeypatch.setattr(M, "_SHAPES", {})
    monkeypatch.setattr(TD, "_FORESTS", {})
    draft, target = tiny_llama(1, vocab=40), tiny_llama(2, vocab=40)
    kw = {} if trees is None else dict(trees=trees)
    s = ProfileSettings(k_max=4, L_max=4, max_new_tokens=T, subsample=subsample, **NAMES, **kw).for_vocabulary(40)
    with DeviceCopies() as mode:
        rows = profile_prompt(draft, target, [3, 7, 1], None, s, 0)
    return rows, mode.made / T, mode.moves / T


#: (tensors made of host data, moves) per position, by tree family and subsample. Before (measured over 6
#: positions): chains 9 / 36 (10 / 62 subsampled), topk 19 / 46 (20 / 72), eagle2 27 / 54 (28 / 80), iid 34.8 / 60
#: (42 / 100), wor 33 / 62 (42 / 102). The made ones left: the path's new tokens and the draft steps' uniforms (one
#: copy each per position), the pending tokens of each tree call, the tree families' per-call indices of the drawn
#: nodes (one copy per draw for iid and wor, per ranking for EAGLE-2's expansions; the verifiers' node rules several).
#: The sampled trees' roots then drawn from the draft's law where it is (before: read to the host and sent back, one
#: copy and one move per position; iid 18.25 / 25.5 (21.5 / 58.5), wor 15.5 / 27.5 (21 / 60)). Those counts were
#: taken after other tests had made the sampled forests' layouts (cached per run, :data:`_FORESTS`), and failed in a
#: fresh process (iid 23.25, wor 22.75 subsampled; wor 17.25 cheap): now every run counts its own layouts. The bound on
#: every lossless tree verifier on the device route (subsampled positions) adds 2 (iid) and 3 (wor) small tensors of
#: host data per position instead of copying its laws to the host: iid 25.25 / 43.5, wor 25.75 / 47 (chains 2.5 /
#: 10.5 and 3.5 / 18.5, topk 8.25 / 16.25 and 9.25 / 24.25, eagle2 14.5 / 22.5 and 15.5 / 30.5, iid and wor cheap
#: 17.25 / 24.5 and 17.25 / 26.5).
BOUND = {("chains", 0): (3, 11), ("chains", 1): (4, 19), ("topk", 0): (9, 17), ("topk", 1): (10, 25),
         ("eagle2", 0): (15, 23), ("eagle2", 1): (16, 31), ("iid", 0): (18, 25), ("iid", 1): (26, 44),
         ("wor", 0): (18, 27), ("wor", 1): (26, 48)}


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
