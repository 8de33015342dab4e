from collections import OrderedDict

import pytest
import torch
from torch import nn

from accel_bigmodel import (
    check_device_map,
    clean_device_map,
    compute_module_sizes,
    convert_file_size_to_int,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    infer_auto_device_map,
    init_empty_weights,
)


def block_bytes(kit) -> int:
    d = kit.DIM
    return 4 * (2 * d + d * 2 * d + 2 * d + 2 * d * d + d + d)  # norm, fc1, fc2, scale


def test_sizes_parse_bytes_and_strings():
    assert convert_file_size_to_int(123) == 123
    assert convert_file_size_to_int("600MB") == 600 * 10**6
    assert convert_file_size_to_int("1GiB") == 2**30
    assert convert_file_size_to_int("1.5 GB") == 1_500_000_000
    assert convert_file_size_to_int("10KiB") == 10240
    # a lowercase final "b" on a decimal unit counts bits, as accelerate and transformers read it
    assert convert_file_size_to_int("8Gb") == convert_file_size_to_int("8gb") == 10**9
    # transformers hands over measured byte counts as floats
    assert convert_file_size_to_int(21925745049.6) == 21925745049
    assert convert_file_size_to_int(2.5e3) == 2500
    for bad in ("12 parsecs", "MB", "-5MB", -1, -1.5, float("nan"), float("inf"), True, None):
        with pytest.raises(ValueError, match="memory size|Memory size"):
            convert_file_size_to_int(bad)


def test_module_sizes_count_tied_once_and_honor_dtype(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    sizes = compute_module_sizes(model)
    d, v, n = kit.DIM, kit.VOCAB, kit.LAYERS
    assert sizes["body.layers.0"] == block_bytes(kit)
    assert sizes["embed"] == v * d * 4
    assert "head" not in sizes or sizes["head"] == 0  # the tied weight is counted with embed
    assert sizes[""] == v * d * 4 + n * block_bytes(kit) + kit.SEQ * d * 4
    half = compute_module_sizes(model, dtype=torch.float16)
    assert half[""] * 2 == sizes[""]
    special = compute_module_sizes(
        model, dtype="float16", special_dtypes={"embed.weight": "float32"}
    )
    assert special["embed"] == sizes["embed"]
    size, names = get_max_layer_size(list(model.named_children()), sizes, ["Block"])
    assert names == [f"body.layers.{i}" for i in range(n)] and size == block_bytes(kit)


def test_sequential_map_fills_devices_in_order_and_keeps_blocks_whole(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    sizes = compute_module_sizes(model)
    # the CPU is a main device: it keeps room for the largest block (offloaded ones run there)
    cpu = sizes["embed"] + sizes["pos"] + 3 * block_bytes(kit)
    device_map = infer_auto_device_map(model, {"cpu": cpu, "disk": "1GB"}, ["Block"])
    assert device_map == {
        "embed": "cpu",
        "head": "cpu",  # tied to embed: planned with it, so the tie stays one tensor
        "body.layers.0": "cpu",
        "body.layers.1": "cpu",
        "body.layers.2": "disk",
        "body.layers.3": "disk",
        "pos": "disk",  # once a device is left, later entries never go back to it
    }
    check_device_map(model, device_map)
    assert all(not k.startswith("body.layers.0.") for k in device_map)  # no split inside a block
    # without no_split, the third block is split to fill the budget
    extra = sizes["body.layers.2.scale"] + sizes["body.layers.2.norm"]
    split = infer_auto_device_map(model, {"cpu": cpu + extra, "disk": "1GB"})
    assert split["body.layers.2.norm"] == "cpu" and split["body.layers.2.mlp.2"] == "disk"
    check_device_map(model, split)


def test_everything_fits_collapses_to_the_root(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    assert infer_auto_device_map(model, {"cpu": "1GiB"}, ["Block"]) == {"": "cpu"}
    raw = infer_auto_device_map(model, {"cpu": "1GiB"}, ["Block"], clean_result=False)
    assert set(raw.values()) == {"cpu"} and "" not in raw
    assert clean_device_map(raw) == {"": "cpu"}


def test_what_fits_nowhere_spills_to_disk_and_dispatch_needs_a_folder(kit, reference, tmp_path):
    from accel_bigmodel import load_checkpoint_and_dispatch

    with init_empty_weights():
        model = kit.TinyLM()
    need = block_bytes(kit)
    sizes = compute_module_sizes(model)
    budget = {"cpu": sizes["embed"] + sizes["pos"] + need // 2}
    planned = infer_auto_device_map(model, budget, ["Block"])  # as accelerate: no error
    assert "disk" in planned.values(), planned
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 1)
    with pytest.raises(ValueError, match="would go to disk, which needs an offload folder"):
        load_checkpoint_and_dispatch(
            model, path, device_map="auto", max_memory=budget, no_split_module_classes=["Block"]
        )


def test_gpu_budgets_reserve_room_and_balance(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    sizes = compute_module_sizes(model)
    total, block = sizes[""], block_bytes(kit)
    budget = {0: total, 1: total, "cpu": total}
    sequential = infer_auto_device_map(model, budget, ["Block"])
    assert sequential == {"": 0}
    balanced = get_balanced_memory(model, budget, ["Block"])
    assert balanced[0] < total and balanced[1] == total
    spread = infer_auto_device_map(model, balanced, ["Block"])
    assert {0, 1} <= set(spread.values())
    low0 = get_balanced_memory(model, budget, ["Block"], low_zero=True)
    assert low0[0] == 0
    assert 0 not in infer_auto_device_map(model, low0, ["Block"]).values()
    # one GPU too small: blocks spill to the CPU and the GPU keeps room for one block
    small = {0: sizes["embed"] + 2 * block, "cpu": total}
    spill = infer_auto_device_map(model, small, ["Block"], clean_result=False)
    on_gpu = sum(sizes.get(k, 0) for k, v in spill.items() if v == 0)
    assert "cpu" in spill.values() and on_gpu + block <= small[0]


def test_fallback_allocation_fills_a_device_with_a_later_module():
    block = nn.Sequential(nn.Linear(10, 4), nn.Linear(4, 4), nn.Linear(4, 8))  # 176, 80, 160 B
    model = nn.Sequential(OrderedDict(block=block))
    budget = {0: 256}  # GPU 0 keeps 176 B for the largest layer: only 80 B are free to plan
    assert infer_auto_device_map(model, budget) == {"": "disk"}
    fallback = infer_auto_device_map(model, budget, fallback_allocation=True)
    assert fallback == {"block.1": 0, "block.0": "disk", "block.2": "disk"}


def test_check_device_map_names_missing_repeated_and_unknown(kit):
    model = kit.TinyLM()
    with pytest.raises(ValueError, match=r"does not place .*'head'"):
        check_device_map(model, {"embed": "cpu", "body": "cpu", "pos": "cpu"})
    with pytest.raises(ValueError, match=r"twice \('body' contains 'body.layers.0'\)"):
        check_device_map(
            model, {"embed": 0, "head": 0, "pos": 0, "body": "cpu", "body.layers.0": "cpu"}
        )
    # an unknown key is warned about and ignored, as accelerate does
    with pytest.warns(UserWarning, match=r"do not match any submodules .* \['bodyy'\]"):
        check_device_map(model, {"bodyy": "cpu", "": "cpu"})
    with pytest.raises(ValueError, match="Unknown device"):
        check_device_map(model, {"": "warp-drive"})
    check_device_map(model, {"embed": "cpu", "body": "disk", "head": "cpu", "pos": "cpu"})


def test_max_memory_devices_and_strings_are_validated():
    assert list(get_max_memory({"disk": "1GB", "cpu": "600MB"})) == ["cpu", "disk"]
    assert get_max_memory({"cpu": "600MB"}) == {"cpu": 600 * 10**6}
    missing = torch.cuda.device_count()
    with pytest.raises(ValueError, match=rf"Device {missing} \(cuda:{missing}\) does not exist"):
        get_max_memory({missing: "1GB", "cpu": "1GB"})
    with pytest.raises(ValueError, match="Cannot parse the memory size '1 GBB'"):
        get_max_memory({"cpu": "1 GBB"})
    measured = get_max_memory()
    assert measured["cpu"] > 0 and len(measured) == torch.cuda.device_count() + 1


def test_available_host_memory_reads_memavailable_and_falls_back_to_psutil(tmp_path, monkeypatch):
    from accel_bigmodel._sizes import available_host_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684120 kB\nMemAvailable:   23922340 kB\nCached: 1 kB\n")
    assert available_host_memory(str(meminfo)) == 23922340 * 1024
    import psutil

    class Answer:
        available = 12345

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Answer)
    meminfo.write_text("MemTotal:       24684120 kB\n")  # a kernel without the line
    assert available_host_memory(str(meminfo)) == 12345
    assert available_host_memory(str(tmp_path / "absent")) == 12345  # not Linux


def test_max_memory_accepts_int_float_and_str_on_every_path(kit):
    with init_empty_weights():
        model = kit.TinyLM()
    total = compute_module_sizes(model)[""]
    for size in (total * 2, float(total * 2) + 0.6, f"{total * 2}B", f"{total * 2 / 1000}KB"):
        budget = {"cpu": size}
        assert get_max_memory(budget) == {"cpu": int(total * 2)}
        assert get_balanced_memory(model, budget) == {"cpu": int(total * 2)}
        assert infer_auto_device_map(model, budget) == {"": "cpu"}
    measured = {k: v * 0.9 for k, v in get_max_memory().items()}  # what transformers passes
    assert all(isinstance(v, int) for v in get_max_memory(measured).values())
    assert infer_auto_device_map(model, get_balanced_memory(model, measured))


class Stack(nn.Module):
    """Blocks of linear and norm layers, with a buffer at the top: no ties, no block buffers."""

    def __init__(self, width: int = 16, blocks: int = 5) -> None:
        super().__init__()
        self.inp = nn.Linear(4, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 2 * width), nn.BatchNorm1d(2 * width),
                          nn.Linear(2 * width, width))
            for _ in range(blocks)
        )  # fmt: skip
        self.out = nn.Linear(width, 3)
        self.register_buffer("offset", torch.zeros(3))


@pytest.mark.parametrize("no_split", [None, ["Sequential"]])
@pytest.mark.parametrize("case", ["cpu_disk", "two_gpus", "gpu_cpu", "tight", "three_gpus"])
def test_plans_equal_accelerates_plans(case, no_split):
    """The same model and budget give the map HuggingFace accelerate gives (when installed)."""
    modeling = pytest.importorskip("accelerate.utils.modeling")
    with init_empty_weights():
        model = Stack()
    sizes = compute_module_sizes(model)
    total, block = sizes[""], sizes["blocks.0"]
    budget = {
        "cpu_disk": {"cpu": total // 2, "disk": total},
        "two_gpus": {0: total // 2, 1: total // 2, "cpu": total},
        "gpu_cpu": {0: 2 * block, "cpu": 3 * block},
        "tight": {0: block, 1: block + 100, "cpu": 2 * block},
        "three_gpus": {0: total // 3, 1: total // 3, 2: total // 3, "cpu": total},
    }[case]
    for kwargs in ({}, {"fallback_allocation": True}, {"clean_result": False}):
        ours = infer_auto_device_map(model, dict(budget), no_split, **kwargs)
        theirs = modeling.infer_auto_device_map(model, dict(budget), no_split, **kwargs)
        assert ours == dict(theirs), kwargs
    if "disk" not in budget:  # accelerate's get_balanced_memory fails on a "disk" key
        for low_zero in (False, True):
            ours = get_balanced_memory(model, dict(budget), no_split, low_zero=low_zero)
            theirs = modeling.get_balanced_memory(model, dict(budget), no_split, low_zero=low_zero)
            assert ours == theirs, low_zero
