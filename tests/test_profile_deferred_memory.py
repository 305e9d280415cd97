"""What a cheap tree position keeps alive while its values wait on the device for the next position's read.

On the device route a position with trees and no bound leaves its trees' values unread (``tree_rows(...,
defer=True)`` returns a :class:`otspec.profile._collect.TreesLater`) and the walk reads them with the next
position's values. Until then the deferred object holds that position's tree laws on the device. The tensors it
reaches (the models, their states and the walk's own buffers excluded: those live anyway) are counted here: the
bytes held must not grow along the walk (memory flat in its length), and stay within a few laws per tree node.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from otspec.profile import ProfileSettings  # noqa: E402
from tests.toy_lm import tiny_llama  # noqa: E402

#: Free variables of the deferred closure that are alive whatever the deferral does (the models and their states,
#: the walk's rows, settings, generators and buffers): not counted.
LIVE_ANYWAY = {"draft", "target", "ds", "ts", "buffers", "rows", "settings", "rngs", "drawn", "plan"}


def held_bytes(obj) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj`` (through containers, instances' attributes and
    closures' cells, not through modules, classes, ``nn.Module`` or :data:`LIVE_ANYWAY` cells)."""
    seen, storages, total = set(), set(), 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            s = o.untyped_storage()
            if s.data_ptr() not in storages:
                storages.add(s.data_ptr())
                total += s.nbytes()
        elif isinstance(o, (torch.nn.Module, types.ModuleType, type, str, bytes, int, float, np.ndarray)):
            continue
        elif isinstance(o, types.FunctionType):
            for name, cell in zip(o.__code__.co_freevars, o.__closure__ or ()):
                if name not in LIVE_ANYWAY:
                    try:
                        stack.append(cell.cell_contents)
                    except ValueError:  # an empty cell
                        pass
        elif isinstance(o, types.MethodType):
            stack += [o.__self__, o.__func__]
        elif isinstance(o, dict):
            stack += list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack += list(o)
        else:
            if hasattr(o, "__dict__"):
                stack.append(vars(o))
            stack += [getattr(o, s) for s in getattr(type(o), "__slots__", ()) if hasattr(o, s)]
    return total


def deferred_bytes(monkeypatch, tree: str, T: int, V: int, *, chain_previous: bool = False) -> list[int]:
    """The bytes each deferred position holds along a walk of ``T`` positions (tiny Llama pair, device route on the
    CPU). ``chain_previous``: a broken deferral that keeps the previous position's object alive (the test's own
    check that an accumulation is seen)."""
    import otspec.profile._collect as C

    monkeypatch.setattr(C, "analysis_device", lambda lm: torch.device("cpu"))
    real, held, last = C.tree_rows, [], []

    def spy(*a, **kw):
        later = real(*a, **kw)
        if later is not None:
            if chain_previous:
                later.previous = last[-1] if last else None
                last.append(later)
            held.append(held_bytes(later))
        return later

    monkeypatch.setattr(C, "tree_rows", spy)
    s = ProfileSettings(k_max=2, L_max=2, max_new_tokens=T, subsample=0, verifiers=["token"], families=["token"],
                        trees=[tree]).for_vocabulary(V)
    C.profile_prompt(tiny_llama(1, vocab=V), tiny_llama(2, vocab=V), [3, 7, 1], None, s, 0)
    return held


TREES = {"topk:branching(4,2)": 13, "eagle2:3,3,8": 9, "iid:branching(3,2):specinfer": 10,
         "wor:branching(3,2):sequoia": 10}  # nodes of each tree, root included


@pytest.mark.parametrize("tree", list(TREES))
def test_the_deferred_trees_hold_a_bounded_memory_flat_along_the_walk(monkeypatch, tree):
    V, T = 400, 7
    held = deferred_bytes(monkeypatch, tree, T, V)
    assert len(held) == T, held  # every position deferred (no bound, no subsample)
    # measured at V = 400: 11,401 bytes (top-k), 8,121-9,721 (EAGLE-2), 53,057 (i.i.d.), 53,121 (without
    # replacement) at every position: the draft's and target's logits and float64 laws of the position's tree calls
    assert max(held[3:]) <= max(held[:3]), held  # nothing accumulates from one position to the next
    assert max(held) <= 4 * TREES[tree] * V * 8, held  # a few float64 laws a node, at most


def test_an_accumulating_deferral_is_seen(monkeypatch):
    # the check above fails for a deferral that keeps the previous position's values alive
    held = deferred_bytes(monkeypatch, "iid:branching(3,2):specinfer", 5, 400, chain_previous=True)
    assert held == sorted(held) and held[-1] > held[2] > held[0], held
