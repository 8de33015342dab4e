import pytest
import torch
from torch import nn

from accel_bigmodel import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    find_tied_parameters,
    init_empty_weights,
    init_on_device,
    remove_hook_from_module,
    retie_parameters,
    send_to_device,
    set_module_tensor_to_device,
)


class AddOne(ModelHook):
    def pre_forward(self, module, *args, **kwargs):
        return (args[0] + 1,), kwargs


class Double(ModelHook):
    def post_forward(self, module, output):
        return output * 2


class Record(ModelHook):
    def __init__(self):
        self.events = []

    def init_hook(self, module):
        self.events.append("init")
        return module

    def detach_hook(self, module):
        self.events.append("detach")
        return module


def test_hooks_stack_in_order_and_removal_restores_the_class_forward():
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    plain = layer(x)
    add_hook_to_module(layer, AddOne())
    torch.testing.assert_close(layer(x), layer._old_forward(x + 1))
    add_hook_to_module(layer, Double(), append=True)
    assert isinstance(layer._hf_hook, SequentialHook) and len(layer._hf_hook.hooks) == 2
    torch.testing.assert_close(layer(x), 2 * layer._old_forward(x + 1))
    recorder = Record()
    add_hook_to_module(layer, recorder)  # replaces the stack
    torch.testing.assert_close(layer(x), plain)
    remove_hook_from_module(layer)
    assert recorder.events == ["init", "detach"]
    assert "forward" not in layer.__dict__ and not hasattr(layer, "_hf_hook")
    assert layer.forward.__func__ is nn.Linear.forward
    torch.testing.assert_close(layer(x), plain)


def test_remove_recurses_into_submodules():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    for m in model.modules():
        add_hook_to_module(m, Double())
    remove_hook_from_module(model, recurse=True)
    assert not any(hasattr(m, "_hf_hook") or "forward" in m.__dict__ for m in model.modules())


def test_empty_init_keeps_ties_made_in_init_and_real_buffers(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    assert model.embed.weight.is_meta and model.head.weight is model.embed.weight
    assert not model.pos.is_meta and not model.body.layers[0].scale.is_meta
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    with init_empty_weights(include_buffers=True):
        model = kit.TinyLM()
    assert model.pos.is_meta and model.body.layers[0].scale.is_meta
    assert nn.Linear.register_parameter is nn.Module.register_parameter  # patch undone
    with init_on_device("cpu"):
        real = nn.Linear(2, 2)
    assert real.weight.device.type == "cpu"


def test_set_module_tensor_casts_and_keeps_parameters(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    value = torch.randn(kit.VOCAB, kit.DIM, dtype=torch.float64)
    set_module_tensor_to_device(model, "embed.weight", "cpu", value=value)
    weight = model.embed.weight
    assert isinstance(weight, nn.Parameter) and weight.dtype == torch.float32
    torch.testing.assert_close(weight, value.float())
    set_module_tensor_to_device(
        model, "pos", "cpu", value=torch.ones(kit.SEQ, kit.DIM), dtype="float16"
    )
    assert model.pos.dtype == torch.float16
    retie_parameters(model, [["embed.weight", "head.weight"]])
    assert model.head.weight is model.embed.weight
    with pytest.raises(ValueError, match="no data"):
        set_module_tensor_to_device(model, "body.layers.0.norm.weight", "cpu")
    with pytest.raises(ValueError, match="no tensor named 'wieght'"):
        set_module_tensor_to_device(model, "body.layers.0.norm.wieght", "cpu", value=value)


def test_align_devices_hook_offloads_and_reloads_each_forward(reference, ids):
    expected = reference(ids)
    block = reference.body.layers[1]
    x = torch.randn(2, 8, block.norm.normalized_shape[0])
    before = block(x)
    hook = AlignDevicesHook("cpu", offload=True, io_same_device=True, place_submodules=True)
    add_hook_to_module(block, hook)
    assert block.mlp[0].weight.is_meta and not block.scale.is_meta  # buffers stay by default
    torch.testing.assert_close(block(x), before)
    assert block.mlp[0].weight.is_meta  # dropped again after the forward
    torch.testing.assert_close(reference(ids), expected)
    remove_hook_from_module(block)
    assert not block.mlp[0].weight.is_meta
    torch.testing.assert_close(block(x), before)


def test_send_to_device_walks_containers():
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    data = {"x": [torch.ones(1), (torch.zeros(1), "s")], "p": Pair(torch.ones(1), 3), "k": 1}
    moved = send_to_device(data, "meta", skip_keys=["k"])
    assert moved["x"][0].is_meta and moved["x"][1][0].is_meta and moved["x"][1][1] == "s"
    assert isinstance(moved["p"], Pair) and moved["p"].a.is_meta and moved["k"] == 1
