import os

import pytest
import torch

from accel_bigmodel import (
    compute_module_sizes,
    cpu_offload,
    cpu_offload_with_hook,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    load_checkpoint_in_model,
    remove_hook_from_module,
)


def empty(kit):
    with init_empty_weights():
        return kit.TinyLM().eval()


def budget_for_two_blocks(kit):
    sizes = compute_module_sizes(empty(kit))
    return sizes["embed"] + sizes["pos"] + 2 * sizes["body.layers.0"]


@pytest.mark.parametrize("mode", ["auto", "balanced", "balanced_low_0", "sequential"])
@pytest.mark.parametrize("as_string", [False, True])
def test_every_device_map_mode_matches_the_plain_model(
    kit, reference, ids, tmp_path, mode, as_string
):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 2)
    cpu = budget_for_two_blocks(kit)
    max_memory = {"cpu": f"{cpu / 1000:.3f}KB" if as_string else cpu, "disk": "1GiB"}
    model = load_checkpoint_and_dispatch(
        empty(kit), path, device_map=mode, max_memory=max_memory,
        no_split_module_classes=["Block"], offload_folder=tmp_path / "offload",
    )  # fmt: skip
    assert model.hf_device_map["body.layers.3"] == "disk"
    assert model.hf_device_map["body.layers.0"] == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids))
        torch.testing.assert_close(model(ids), reference(ids))  # hooks reload every forward
    assert model.body.layers[3].mlp[0].weight.is_meta


def test_disk_blocks_on_the_cpu_reuse_their_views_and_parameters_but_keep_no_grads(
    kit, reference, ids, tmp_path
):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 2)
    model = load_checkpoint_and_dispatch(
        empty(kit), path, device_map="auto", no_split_module_classes=["Block"],
        max_memory={"cpu": budget_for_two_blocks(kit), "disk": "1GiB"},
        offload_folder=tmp_path / "offload",
    )  # fmt: skip
    block = model.body.layers[3]
    hook = block._hf_hook
    loader = hook.weights_map.dataset
    name = "body.layers.3.mlp.0.weight"
    assert name in loader._views  # mapped when dispatched: the first forward reads no header
    assert loader[name] is loader[name]
    seen = []
    block.mlp[0].register_forward_pre_hook(lambda m, args: seen.append(m.weight))
    with torch.no_grad():
        first, again = model(ids), model(ids)
    torch.testing.assert_close(first, reference(ids))
    torch.testing.assert_close(again, first)
    assert seen[0] is seen[1]  # one Parameter for both forwards, viewing the map
    assert seen[0].data_ptr() == loader[name].data_ptr()
    # with gradients on, each forward gets its own Parameter: a backward leaves its .grad on
    # that one, which nothing keeps after the step
    model(ids).sum().backward()
    model(ids).sum().backward()
    assert seen[2] is not seen[3] and seen[2] is not seen[0]
    assert seen[0].grad is None and all(p.grad is None for p, _ in hook._wrapped.values())
    # an entry put in the index again is read again, not served from the old view
    old_view = loader[name]
    loader.index[name] = dict(loader.index[name])
    fresh = loader[name]
    assert fresh is not old_view and loader[name] is fresh
    torch.testing.assert_close(fresh, reference.state_dict()[name])


def test_dispatch_on_one_device_moves_the_model_without_hooks(kit, reference, ids, tmp_path):
    path = kit.write_checkpoint(reference, str(tmp_path), "bin")
    model = load_checkpoint_and_dispatch(empty(kit), path, device_map="cpu")
    assert not any(hasattr(m, "_hf_hook") for m in model.modules())
    assert model.head.weight is model.embed.weight
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids))
    with pytest.raises(ValueError, match=r"no data \(meta device\)"):
        dispatch_model(empty(kit), {"": "cpu"})


def test_disk_mapped_modules_use_stored_buffers_and_ties(kit, reference, ids, tmp_path):
    """The head (tied to the embedding) and the blocks with trained buffers live on disk."""
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors")
    device_map = {"embed": "disk", "pos": "cpu", "body": "disk", "head": "disk"}
    model = empty(kit)
    load_checkpoint_in_model(model, path, device_map, offload_folder=tmp_path / "off")
    dispatch_model(model, device_map, offload_dir=tmp_path / "off")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids))
    assert model.head.weight is model.embed.weight  # still one (meta) parameter between calls


def test_cpu_offload_and_disk_offload_match_and_restore(kit, reference, ids, tmp_path):
    with torch.no_grad():
        expected = reference(ids)
        model = kit.make_reference()
        cpu_offload(model, execution_device="cpu")
        assert model.body.layers[0].mlp[0].weight.is_meta
        # The top module holds only a buffer: it still gets a hook (that moves the buffer to
        # the execution device), after the hook that records where the inputs came from.
        top = model._hf_hook.hooks
        assert top[0].io_same_device and top[1].execution_device == torch.device("cpu")
        torch.testing.assert_close(model(ids), expected)
        remove_hook_from_module(model, recurse=True)
        assert not model.body.layers[0].mlp[0].weight.is_meta
        torch.testing.assert_close(model(ids), expected)

        model = kit.make_reference()
        disk_offload(model, tmp_path / "off", execution_device="cpu")
        files = os.listdir(tmp_path / "off")
        assert "index.json" in files and "embed.weight.dat" in files
        assert "head.weight.dat" not in files  # tied weights are written once
        torch.testing.assert_close(model(ids), expected)
        again = disk_offload(kit.TinyLM().eval(), tmp_path / "off", execution_device="cpu",
                             offload_buffers=True)  # fmt: skip
        torch.testing.assert_close(again(ids), expected)  # weights and buffers from the folder


def test_cpu_offload_with_hook_chains_models(monkeypatch, ids):
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    x = torch.randn(3, 4)
    expected = second(first(x))
    first, hook1 = cpu_offload_with_hook(first, "cpu")
    second, hook2 = cpu_offload_with_hook(second, "cpu", prev_module_hook=hook1)
    calls = []
    monkeypatch.setattr(hook1, "offload", lambda: calls.append("first offloaded"))
    torch.testing.assert_close(second(first(x)), expected)
    assert calls == ["first offloaded"]
    hook2.remove()
    assert "forward" not in second.__dict__


def test_dispatch_errors_name_the_problem(kit, reference, tmp_path):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors")
    model = empty(kit)
    load_checkpoint_in_model(model, path, {"": "cpu"})
    with pytest.raises(ValueError, match="neither offload_dir nor offload_index"):
        dispatch_model(model, {"embed": "cpu", "pos": "cpu", "body": "disk", "head": "cpu"})
    missing = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"Device {missing} .* does not exist"):
        dispatch_model(model, {"": missing})
    with pytest.raises(ValueError, match="does not place"):
        dispatch_model(model, {"embed": "cpu"})
    with pytest.raises(ValueError, match="not understood"):
        load_checkpoint_and_dispatch(empty(kit), path, device_map="fastest")


@pytest.mark.parametrize("offload_buffers", [False, True])
def test_load_checkpoint_and_dispatch_to_disk_keeps_ties_and_buffers(
    kit, reference, ids, tmp_path, offload_buffers
):
    """accelerate's recipe with modules on disk: the tied head stays one tensor with the
    embedding, and trained buffers hold the checkpoint's values with or without
    offload_buffers."""
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 2)
    for i, device_map in enumerate((
        {"embed": "disk", "pos": "cpu", "body": "disk", "head": "disk"},
        {"embed": "cpu", "pos": "cpu", "body": "disk", "head": "disk"},  # a tie split in two
    )):  # fmt: skip
        model = load_checkpoint_and_dispatch(
            empty(kit), path, device_map=device_map, offload_folder=tmp_path / f"off{i}",
            offload_buffers=offload_buffers,
        )  # fmt: skip
        if device_map["embed"] == device_map["head"]:
            assert model.head.weight is model.embed.weight
        with torch.no_grad():
            torch.testing.assert_close(model(ids), reference(ids))
        sizes = compute_module_sizes(empty(kit))
        spilled = load_checkpoint_and_dispatch(
            empty(kit), path, device_map="auto", no_split_module_classes=["Block"],
            max_memory={"cpu": sizes["embed"] + sizes["pos"] + sizes["body.layers.0"]},
            offload_folder=tmp_path / "off2", offload_buffers=offload_buffers,
        )  # fmt: skip
        assert "disk" in set(spilled.hf_device_map.values())
        assert spilled.head.weight is spilled.embed.weight
        torch.testing.assert_close(spilled(ids), reference(ids))


def test_dispatch_model_writes_disk_modules_to_an_empty_offload_folder(
    kit, reference, ids, tmp_path
):
    """As accelerate: weights in memory of modules mapped to disk go to the folder."""
    model = kit.make_reference()
    dispatch_model(
        model, {"embed": "cpu", "pos": "cpu", "body": "disk", "head": "cpu"},
        offload_dir=tmp_path / "off",
    )  # fmt: skip
    assert (tmp_path / "off" / "index.json").is_file()
    assert model.body.layers[0].mlp[0].weight.is_meta
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids))
