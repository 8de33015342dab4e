"""CUDA offload with prefetch: same outputs as the plain model, weights in pinned memory."""

import pytest
import torch

from accel_bigmodel import (
    cpu_offload,
    disk_offload,
    dispatch_model,
    init_empty_weights,
    load_checkpoint_and_dispatch,
)
from accel_bigmodel._prefetch import Prefetcher


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [True, False])
def test_dispatch_with_cpu_and_disk_blocks_on_cuda(kit, reference, ids, tmp_path, prefetch):
    path = kit.write_checkpoint(reference, str(tmp_path / "ckpt"), "safetensors", 2)
    device_map = {
        "embed": 0, "pos": 0, "body.layers.0": 0, "body.layers.1": "cpu",
        "body.layers.2": "disk", "body.layers.3": "cpu", "head": 0,
    }  # fmt: skip
    with init_empty_weights():
        model = kit.TinyLM().eval()
    load_checkpoint_and_dispatch(
        model, path, device_map=device_map, offload_folder=tmp_path / "off", prefetch=prefetch
    )
    hook = model.body.layers[1]._hf_hook
    assert isinstance(hook.prefetcher, Prefetcher) == prefetch
    if prefetch:
        assert hook.weights_map["mlp.0.weight"].is_pinned()
    with torch.no_grad():
        expected = reference(ids)
        for _ in range(3):  # the first pass learns the order, the next ones prefetch
            out = model(ids)
            assert out.device == ids.device
            torch.testing.assert_close(out, expected)
        cuda_out = model(ids.cuda())
        assert cuda_out.device.type == "cuda"
        torch.testing.assert_close(cuda_out.cpu(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["cpu", "disk"])
def test_offload_with_prefetch_keeps_outputs(kit, ids, tmp_path, where):
    model = kit.make_reference()
    with torch.no_grad():
        expected = model(ids)
        if where == "cpu":
            cpu_offload(model, execution_device=0)
        else:
            disk_offload(model, tmp_path / "off", execution_device=0)
        assert model.pos.is_cuda  # a top-level buffer is placed on the execution device
        for _ in range(3):
            out = model(ids)  # CPU inputs in, CPU outputs back
            assert out.device.type == "cpu"
            torch.testing.assert_close(out, expected)
        torch.testing.assert_close(model(ids.cuda()).cpu(), expected)
    assert model.body.layers[0].mlp[0].weight.is_meta


@pytest.mark.gpu
def test_dispatch_whole_model_to_cuda_keeps_ties(kit, ids):
    model = kit.make_reference()
    with torch.no_grad():
        expected = model(ids)
        dispatch_model(model, {"": 0})
        assert model.head.weight is model.embed.weight and model.head.weight.is_cuda
        torch.testing.assert_close(model(ids.cuda()).cpu(), expected)
