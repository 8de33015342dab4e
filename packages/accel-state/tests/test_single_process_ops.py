"""Nested-data operations that need no process group, and the state's initialized view."""

import pytest
import torch

import accel_state as S


def test_recursively_apply_names_the_unsupported_type():
    with pytest.raises(TypeError) as info:
        S.recursively_apply(torch.tensor, (torch.tensor(1), 1), error_on_other_type=True)
    assert str(info.value) == (
        "Unsupported types (<class 'int'>) passed to `tensor`. Only nested list/tuple/dicts of "
        "objects that are valid for `is_torch_tensor` should be passed."
    )


def test_concatenate_returns_a_single_batch_as_is():
    assert S.concatenate(["text"]) == "text"
    one = torch.ones(2)
    assert S.concatenate([one]) is one
    assert S.concatenate([one, one]).shape == (4,)


def test_pad_across_processes_leaves_a_nested_tensor_with_a_warning():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.warns(S.CannotPadNestedTensorWarning):
        assert S.pad_across_processes(nested) is nested


def test_shared_state_is_empty_until_a_state_exists():
    S.PartialState._reset_state()
    assert S.PartialState._shared_state == {}
    S.PartialState()
    assert S.PartialState._shared_state != {}
