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
    assert convert_file_size_to_int("1.5 gb") == 1_500_000_000
    assert convert_file_size_to_int("10KiB") == 10240
    for bad in ("12 parsecs", "MB", "-5MB", -1, 1.5, True):
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
    cpu = sizes["embed"] + sizes["pos"] + 2 * block_bytes(kit)
    device_map = infer_auto_device_map(model, {"cpu": cpu, "disk": "1GB"}, ["Block"])
    assert device_map == {
        "pos": "cpu",
        "embed": "cpu",
        "head": "cpu",  # tied to embed: planned with it, so the tie stays one tensor
        "body.layers.0": "cpu",
        "body.layers.1": "cpu",
        "body.layers.2": "disk",
        "body.layers.3": "disk",
    }
    check_device_map(model, device_map)
    assert all(not k.startswith("body.layers.0.") for k in device_map)  # no split inside a block
    # without no_split, the third block is split to fill the budget
    extra = sizes["body.layers.2.scale"] + sizes["body.layers.2.norm"]
    split = infer_auto_device_map(model, {"cpu": cpu + extra, "disk": "1GB"})
    assert split["body.layers.2.norm"] == "cpu" and split["body.layers.2.mlp"] == "disk"
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
    assert planned["body"] == "disk" or planned.get("body.layers.0") == "disk", planned
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
    model = nn.Sequential(nn.Linear(100, 100), nn.Linear(4, 4))
    budget = {"cpu": 500, "disk": "1GB"}
    plain = infer_auto_device_map(model, budget, ["Linear"], clean_result=False)
    assert plain == {"0": "disk", "1": "disk"}
    fallback = infer_auto_device_map(model, budget, ["Linear"], fallback_allocation=True)
    assert fallback == {"1": "cpu", "0": "disk"}


def test_check_device_map_names_missing_repeated_and_unknown(kit):
    model = kit.TinyLM()
    with pytest.raises(ValueError, match=r"does not place .*'head'"):
        check_device_map(model, {"embed": "cpu", "body": "cpu", "pos": "cpu"})
    with pytest.raises(ValueError, match=r"twice \('body' contains 'body.layers.0'\)"):
        check_device_map(
            model, {"embed": 0, "head": 0, "pos": 0, "body": "cpu", "body.layers.0": "cpu"}
        )
    with pytest.raises(ValueError, match=r"names \['bodyy'\]"):
        check_device_map(model, {"bodyy": "cpu"})
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
