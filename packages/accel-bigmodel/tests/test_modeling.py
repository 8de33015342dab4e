import json

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    align_module_device,
    init_empty_weights,
    load_checkpoint_in_model,
    set_module_tensor_to_device,
)


class Tagged(nn.Parameter):
    """A parameter subclass carrying an attribute, as quantized weights do."""

    def __new__(cls, data: torch.Tensor, requires_grad: bool = True, tag: str = "") -> "Tagged":
        out = super().__new__(cls, data, requires_grad)
        out.tag = tag
        return out


def test_empty_init_buffers_follow_the_argument_or_the_environment(monkeypatch):
    with init_empty_weights():
        norm = nn.BatchNorm1d(4)
    assert norm.weight.is_meta and not norm.running_mean.is_meta
    register = nn.Module.register_parameter
    with init_empty_weights(include_buffers=True):
        assert nn.Module.register_parameter is register  # torch's device context, no patching
        norm = nn.BatchNorm1d(4)
    assert norm.weight.is_meta and norm.running_mean.is_meta
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        assert nn.BatchNorm1d(4).running_mean.is_meta
    assert not nn.BatchNorm1d(4).weight.is_meta  # nothing leaks out of the block


def test_empty_init_keeps_parameter_attributes():
    class WithHfFlag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            weight = nn.Parameter(torch.ones(2))
            weight._is_hf_initialized = True
            self.weight = weight
            self.tagged = Tagged(torch.ones(2), tag="q")

    with init_empty_weights():
        module = WithHfFlag()
    assert module.weight.is_meta and module.weight._is_hf_initialized is True
    assert isinstance(module.tagged, Tagged) and module.tagged.tag == "q"


def test_set_tensor_checks_shape_and_casts_like_load_state_dict():
    model = nn.Linear(3, 4)
    with pytest.raises(ValueError, match=r'shape torch.Size\(\[2, 2\]\) in "weight"'):
        set_module_tensor_to_device(model, "weight", "cpu", value=torch.zeros(2, 2))
    set_module_tensor_to_device(model, "weight", "cpu", value=torch.ones(4, 3, dtype=torch.half))
    assert model.weight.dtype == torch.float32 and isinstance(model.weight, nn.Parameter)
    set_module_tensor_to_device(model, "bias", "cpu", value=[1.0, 2.0, 3.0, 4.0])  # not a tensor
    assert model.bias.tolist() == [1.0, 2.0, 3.0, 4.0]
    set_module_tensor_to_device(model, "bias", "cpu", value=torch.zeros(4), dtype=torch.half)
    assert model.bias.dtype == torch.half
    model.register_buffer("steps", torch.zeros((), dtype=torch.long))
    set_module_tensor_to_device(model, "steps", "cpu", value=torch.tensor(7), dtype=torch.half)
    assert model.steps.dtype == torch.long  # integer tensors never take `dtype`
    model.tagged = Tagged(torch.zeros(2), tag="q")
    set_module_tensor_to_device(model, "tagged", "cpu", value=torch.ones(2))
    assert isinstance(model.tagged, Tagged) and model.tagged.tag == "q"
    same = model.weight
    set_module_tensor_to_device(model, "weight", "cpu")
    assert model.weight is same  # already there: untouched
    set_module_tensor_to_device(model, "weight", "meta", dtype=torch.half)
    assert model.weight.is_meta and model.weight.dtype == torch.half


def test_align_module_device_moves_only_own_parameters_of_a_module_not_offloaded():
    with init_empty_weights():
        model = nn.Sequential(nn.Linear(2, 2))  # a child with no data (say, offloaded)
    model.register_parameter("scale", nn.Parameter(torch.ones(1)))
    with align_module_device(model, "cpu"):  # the child is not asked for its data
        assert model.scale.device.type == "cpu" and model[0].weight.is_meta


def test_a_plain_name_to_file_index_is_read(tmp_path):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    names = {"0": "part1.bin", "1": "part2.bin"}
    index = {k: names[k.split(".")[0]] for k in model.state_dict()}
    for prefix, file in names.items():
        part = {k: v for k, v in model.state_dict().items() if k.startswith(prefix)}
        torch.save(part, tmp_path / file)
    (tmp_path / "weight_map.index.json").write_text(json.dumps(index))
    fresh = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    load_checkpoint_in_model(fresh, tmp_path / "weight_map.index.json")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())


def test_set_module_tensor_to_device_reuses_a_tied_weight_already_placed() -> None:
    from accel_bigmodel import set_module_tensor_to_device

    model = torch.nn.ModuleDict({"a": torch.nn.Linear(3, 3), "b": torch.nn.Linear(3, 3)})
    shared = torch.randn(3, 3)
    tied = {shared.data_ptr(): {}}
    set_module_tensor_to_device(model, "a.weight", "meta", value=shared, tied_params_map=tied)
    set_module_tensor_to_device(model, "b.weight", "meta", value=shared, tied_params_map=tied)
    assert model["a"].weight is model["b"].weight  # one placement for the tie, not two
    assert list(tied[shared.data_ptr()]) == ["meta"]


def test_set_module_tensor_to_device_refuses_statistics_for_a_plain_weight() -> None:
    from accel_bigmodel import set_module_tensor_to_device

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"'weight', a Parameter.*\(Int8Params\) only"):
        set_module_tensor_to_device(
            model, "weight", "cpu", value=torch.zeros(2, 2), fp16_statistics=torch.zeros(2)
        )


def test_calculate_maximum_sizes_counts_blocks_as_the_model_declares_them() -> None:
    from accel_bigmodel import calculate_maximum_sizes

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    class Net(nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self) -> None:
            super().__init__()
            self.block, self.head = Block(), nn.Linear(4, 8)
            self.scale = nn.Parameter(torch.ones(100))

    total, (largest, names) = calculate_maximum_sizes(Net())
    assert total == 4 * (2 * 20 + 40 + 100)
    assert (largest, names) == (4 * 100, ["scale"])  # a top-level parameter is a block too
    net = Net()
    net.scale = nn.Parameter(torch.ones(1))
    assert calculate_maximum_sizes(net)[1] == (4 * 40, ["block", "head"])
