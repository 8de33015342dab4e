import logging

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    LayerwiseCastingHook,
    attach_layerwise_casting_hooks,
    check_device_same,
    compute_module_sizes,
    compute_module_total_buffer_size,
    cpu_offload,
    fallback_allocate,
    find_tied_parameters,
    get_module_leaves,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    named_module_tensors,
)


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.sub = nn.Module()
        self.sub.register_buffer("cache", torch.zeros(4), persistent=False)
        self.register_buffer("scale", torch.ones(2))


def test_module_leaves_are_names_nothing_extends():
    sizes = compute_module_sizes(nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU())))
    assert sorted(get_module_leaves(sizes)) == ["0.bias", "0.weight"]
    assert get_module_leaves({"": 1, "a": 1, "a.b": 1, "c": 1}) == ["a.b", "c"]


def test_module_size_with_ties_counts_each_tied_holder_without_the_shared_tensor():
    layers = 12  # "1" is a prefix of "10" and "11": the holder is found by "name." only
    model = nn.ModuleList(nn.Linear(4, 4) for _ in range(layers))
    for i in range(1, layers):
        model[i].weight = model[0].weight
    sizes = {
        **{str(i): 80 for i in range(layers)},
        **{f"{i}.weight": 64 for i in range(layers)},
        **{f"{i}.bias": 16 for i in range(layers)},
    }
    todo = list(model.named_children())[1:]
    tied = find_tied_parameters(model)[0][1:]
    size, names, modules = get_module_size_with_ties(tied, 80, sizes, todo)
    assert size == 80 + (layers - 1) * 16
    assert names == sorted(n for n, _ in todo)
    assert modules == [dict(todo)[n] for n in names]
    assert get_module_size_with_ties([], 80, sizes, todo) == (80, [], [])
    with pytest.raises(ValueError, match="'nowhere.weight'"):
        get_module_size_with_ties(["nowhere.weight"], 80, sizes, todo)


def test_fallback_allocate_finds_a_later_piece_that_fits():
    model = nn.Sequential(nn.Linear(10, 10), nn.Sequential(nn.Linear(10, 10), nn.Linear(2, 2)))
    sizes = compute_module_sizes(model)
    entries = list(model.named_children())
    name, module, rest = fallback_allocate(entries, sizes, sizes["1.1"])
    assert name == "1.1" and module is model[1][1]
    assert [n for n, _ in rest] == ["0", "1.0"]  # the parent was split into what is left
    assert fallback_allocate(entries, sizes, "1B") == (None, None, entries)
    assert fallback_allocate(entries, sizes, "not a size") == (None, None, entries)
    # a class that must not be split is taken whole or not at all
    assert fallback_allocate(entries, sizes, sizes["1.1"], ["Sequential"])[0] is None


def test_check_device_same_treats_a_missing_index_as_zero():
    assert check_device_same(torch.device("cuda"), torch.device("cuda:0"))
    assert not check_device_same(torch.device("cuda:1"), torch.device("cuda"))
    assert not check_device_same(torch.device("cpu"), torch.device("cuda"))
    assert check_device_same(torch.device("cpu"), torch.device("cpu"))


def test_buffer_sizes_and_non_persistent_buffers():
    model = WithBuffers()
    assert compute_module_total_buffer_size(model) == (4 + 2) * 4
    assert compute_module_total_buffer_size(model, dtype=torch.float16) == (4 + 2) * 2
    found = get_non_persistent_buffers(model, recurse=True)
    assert found == {"cache"} and found is not model.sub._non_persistent_buffers_set
    assert model._non_persistent_buffers_set == set()  # nothing of the module changed
    assert get_non_persistent_buffers(model) == set()
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"sub.cache"}
    names = [n for n, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)]
    assert "sub.cache" not in names and "scale" in names


def test_state_dicts_of_an_offloaded_model(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.Linear(3, 2)))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, "cpu")
    assert model[0].weight.device.type == "meta"
    state = get_state_dict_offloaded_model(model)
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    filled = get_state_dict_from_offload(model[1][0], "1.0.weight", {"1.0.weight": "", "x": 1})
    assert torch.equal(filled["1.0.weight"], expected["1.0.weight"]) and filled["x"] == 1
    assert model[1][0].weight.device.type == "meta"  # back to offloaded afterwards
    model[0]._parameters["bias"] = nn.Parameter(torch.empty(3, device="meta"))
    model[0]._hf_hook.weights_map = {"weight": expected["0.weight"]}
    with caplog.at_level(logging.WARNING):
        state = get_state_dict_offloaded_model(model)
    assert "0.bias" not in state and "0.bias" in caplog.text


def test_layerwise_casting_covers_linear_and_conv_and_skips_whole_subtrees():
    assert nn.Linear in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert nn.Embedding not in SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    class Norm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(2, 2)

    model = nn.ModuleDict(
        {"emb": nn.Embedding(4, 2), "fc": nn.Linear(2, 2), "norm": Norm(), "n2": Norm()}
    )
    attach_layerwise_casting_hooks(
        model, torch.float8_e4m3fn, torch.float32, skip_modules_pattern="norm",
        skip_modules_classes=(nn.Conv1d,),
    )  # fmt: skip
    hooked = {n for n, m in model.named_modules() if isinstance(getattr(m, "_hf_hook", None),
              LayerwiseCastingHook)}  # fmt: skip
    assert hooked == {"fc", "n2.proj"}
    assert model["fc"].weight.dtype == torch.float8_e4m3fn
    attach_layerwise_casting_hooks(model["n2"], torch.bfloat16, torch.float32,
                                   skip_modules_classes=(Norm,))  # fmt: skip
    assert model["n2"].proj.weight.dtype == torch.float8_e4m3fn  # the class skip stops descent
