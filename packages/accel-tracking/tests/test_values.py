import math
import warnings

import numpy as np
import pytest

from accel_tracking import TrackerValueWarning, flatten_dict
from accel_tracking._values import (
    coerce_step,
    json_safe,
    param_values,
    scalar_values,
    to_python,
)


def test_flatten_joins_nested_keys_and_leaves_input_alone():
    values = {"train": {"loss": 1.0, "acc": {"top1": 0.5}}, "lr": 0.1}
    before = repr(values)
    assert flatten_dict(values) == {"train/loss": 1.0, "train/acc/top1": 0.5, "lr": 0.1}
    assert repr(values) == before


def test_to_python_numpy():
    assert to_python(np.float32(0.5)) == 0.5 and type(to_python(np.float32(0.5))) is float
    assert type(to_python(np.int64(3))) is int
    assert to_python(np.array([1.0, 2.0])) == [1.0, 2.0]
    assert to_python(np.array(7)) == 7


def test_to_python_torch():
    torch = pytest.importorskip("torch")
    value = torch.tensor(2.5, requires_grad=True) * 2
    assert to_python(value) == 5.0 and type(to_python(value)) is float
    assert to_python(torch.tensor([3])) == 3
    assert to_python(torch.arange(3)) == [0, 1, 2]
    assert coerce_step(torch.tensor(12)) == 12


def test_scalar_values_converts_and_skips_with_one_warning_per_key():
    values = {"loss": np.float64(0.25), "ok": True, "none": None, "name": "x", "vec": [1, 2]}
    warned: set[str] = set()
    with pytest.warns(TrackerValueWarning) as caught:
        out = scalar_values(values, tracker="t", warned=warned)
        again = scalar_values(values, tracker="t", warned=warned)
    assert out == again == {"loss": 0.25, "ok": 1}
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 3  # none, name, vec: once each
    assert any("'none' is None" in m for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scalar_values({"name": "x"}, tracker="t", warned=set(), strings=True) == {
            "name": "x"
        }


def test_param_values_and_json_safe():
    class Opt:
        def __str__(self):
            return "Opt()"

    with pytest.warns(TrackerValueWarning, match="'skip' is None"):
        params = param_values(
            {"a": {"b": [1, 2]}, "o": Opt(), "skip": None}, tracker="t", warned=set()
        )
    assert params == {"a/b": "[1, 2]", "o": "Opt()"}
    safe = json_safe({"x": np.float32(1.5), "y": (1, Opt()), "z": {"w": float("nan")}})
    assert safe["x"] == 1.5 and safe["y"] == [1, "Opt()"] and math.isnan(safe["z"]["w"])


def test_bad_step_is_rejected_with_the_value():
    with pytest.raises(TypeError, match=r"step='3'"):
        coerce_step("3")
    assert coerce_step(4.0) == 4 and coerce_step(None) is None
