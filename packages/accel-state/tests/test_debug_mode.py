"""Debug mode of the collectives: which shapes can meet, and the switch.

The real 2-process check (both ranks raise instead of hanging) runs in accel-cli's
`accel launch --debug` test.
"""

from __future__ import annotations

import pytest

from accel_state import _ops


@pytest.mark.parametrize(
    ("operation", "shapes", "dim", "why"),
    [
        ("gather", [[(2, 3)], [(5, 3)]], 0, None),  # the first dimension may vary
        ("gather", [[(2, 3)], [(2, 4)]], 0, "after its first dimension"),
        ("gather", [[(2, 3)], [(2, 3, 1)]], 0, "number of dimensions"),
        ("gather", [[(2,), (1,)], [(2,)]], 0, "different numbers of tensors"),
        ("reduce", [[(4,)], [(4,)]], 0, None),
        ("reduce", [[(4,)], [(5,)]], 0, "must be identical"),
        ("broadcast", [[(2, 2)], [(2, 1)]], 0, "must be identical"),
        ("pad_across_processes", [[(2, 7)], [(2, 9)]], 1, None),
        ("pad_across_processes", [[(2, 7)], [(3, 9)]], 1, "other than dim=1"),
        ("pad_across_processes", [[(2, 7)], [(2, 9)]], -1, None),
    ],
)
def test_shape_mismatch(operation, shapes, dim, why):
    found = _ops.shape_mismatch(operation, shapes, dim)
    if why is None:
        assert found is None
    else:
        assert found is not None and why in found


def test_debug_mode_switch(monkeypatch):
    monkeypatch.delenv(_ops.ENV_DEBUG_MODE, raising=False)
    assert not _ops.debug_mode()
    for on in ("1", "true", "YES"):
        monkeypatch.setenv(_ops.ENV_DEBUG_MODE, on)
        assert _ops.debug_mode()
    monkeypatch.setenv(_ops.ENV_DEBUG_MODE, "0")
    assert not _ops.debug_mode()


def test_single_process_collectives_skip_the_check(monkeypatch):
    import torch

    monkeypatch.setenv(_ops.ENV_DEBUG_MODE, "1")
    t = torch.ones(3)
    assert _ops.gather(t) is t and _ops.broadcast(t) is t


def test_launcher_sets_the_same_variable():
    accel_cli = pytest.importorskip("accel_cli._environment")
    assert accel_cli.ENV_DEBUG_MODE == _ops.ENV_DEBUG_MODE
