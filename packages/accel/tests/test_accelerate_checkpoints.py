"""accel and the real accelerate resume each other's save_state folders.

For a single device, DDP on 2 processes, FSDP2 (sharded and full state dicts) and DeepSpeed
ZeRO-2 and ZeRO-3 on 2 gloo processes: each library trains 5 steps uninterrupted, saving after
3 on the way; the other library loads that save and trains the last 2 steps. The resumed run must end exactly where
the uninterrupted one of the library that resumed ends: weights, AdamW state, scheduler,
registered object and the torch RNG (the model has dropout, so the resumed steps depend on the
restored RNG). accelerate runs FSDP and DeepSpeed only on accelerators; here their code runs
on gloo.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import _interop

from accel_state.testing import run_distributed

pytest.importorskip("accelerate")


def _assert_resumed_equals_uninterrupted(results: dict) -> None:
    for key, r in results.items():
        whole, resumed = r["whole"], r["resumed"]
        assert whole["weights"].keys() == resumed["weights"].keys(), key
        for name, value in whole["weights"].items():
            assert torch.equal(value, resumed["weights"][name]), (key, name)
        assert whole["optimizer"].keys() == resumed["optimizer"].keys(), key
        for param, state in whole["optimizer"].items():
            for k, v in state.items():
                assert torch.equal(v, resumed["optimizer"][param][k]), (key, param, k)
        assert whole["scheduler"] == resumed["scheduler"], key
        assert whole["seen"] == resumed["seen"] == 5, key
        assert torch.equal(whole["rng"], resumed["rng"]), key


DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
NO_DEEPSPEED = "deepspeed is not installed (pip install accel-parallel[deepspeed])"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interchange")
    engines = ["ddp", "fsdp_sharded", "fsdp_full"]
    if DEEPSPEED:  # last: the runs before it never see DeepSpeed imported
        engines += ["deepspeed_zero2", "deepspeed_zero3"]
    ranks = run_distributed(_interop.interchange, str(folder), engines, world_size=2, timeout=400)
    return folder, ranks


def test_ddp_and_fsdp2_checkpoints_resume_in_the_other_library(two_processes):
    folder, ranks = two_processes
    for results in ranks:
        results = {k: r for k, r in results.items() if not k.startswith("deepspeed")}
        assert len(results) == 6
        _assert_resumed_equals_uninterrupted(results)
    files = {k: r["files"] for k, r in ranks[0].items()}
    accelerate_files = {"custom_checkpoint_0.pkl", "random_states_0.pkl", "random_states_1.pkl",
                        "scheduler.bin"}  # fmt: skip
    extras = {"accel_checkpoint.json", "accel_process_0.pt", "accel_process_1.pt"}
    expected = {
        "ddp": {"model.safetensors", "optimizer.bin"},
        "fsdp_sharded": {"pytorch_model_fsdp_0", "optimizer_0"},
        "fsdp_full": {"pytorch_model_fsdp.bin", "optimizer.bin"},
    }
    for engine, own in expected.items():
        # the very same files as accelerate's, plus accel's extras
        assert set(files[f"{engine}: accelerate saves, accel resumes"]) == own | accelerate_files
        assert set(files[f"{engine}: accel saves, accelerate resumes"]) == (
            own | accelerate_files | extras
        )


@pytest.mark.skipif(not DEEPSPEED, reason=NO_DEEPSPEED)
def test_deepspeed_zero2_and_zero3_checkpoints_resume_in_the_other_library(two_processes):
    """accelerate's DeepSpeed code runs here on DeepSpeed's CPU accelerator over gloo (see
    `_interop._deepspeed_accelerator`); both libraries write the engine's tag folder
    ``pytorch_model/`` and the same files beside it."""
    _, ranks = two_processes
    for results in ranks:
        results = {k: r for k, r in results.items() if k.startswith("deepspeed")}
        assert len(results) == 4
        _assert_resumed_equals_uninterrupted(results)
    extras = {"accel_checkpoint.json", "accel_process_0.pt", "accel_process_1.pt"}
    for stage in (2, 3):
        files = {k: set(r["files"]) for k, r in ranks[0].items() if f"zero{stage}" in k}
        by_accelerate = files[f"deepspeed_zero{stage}: accelerate saves, accel resumes"]
        assert {"pytorch_model", "latest", "scheduler.bin", "random_states_1.pkl"} <= by_accelerate
        assert files[f"deepspeed_zero{stage}: accel saves, accelerate resumes"] == by_accelerate | extras  # fmt: skip


def test_merge_fsdp_weights_takes_accelerates_documented_path(two_processes, tmp_path):
    from safetensors.torch import load_file

    from accel.utils import merge_fsdp_weights
    from accel_cli.main import main

    folder, ranks = two_processes
    for saver, loader in (("accelerate", "accel"), ("accel", "accelerate")):
        saved = ranks[0][f"fsdp_sharded: {saver} saves, {loader} resumes"]["saved"]
        ckpt = folder / f"fsdp_sharded_{saver}"
        out = merge_fsdp_weights(ckpt / "pytorch_model_fsdp_0", tmp_path / saver)
        merged = load_file(out / "model.safetensors")
        assert merged.keys() == saved.keys()
        assert all(torch.equal(merged[k], saved[k]) for k in saved)
    cli_out = tmp_path / "cli"
    assert main(["merge-weights", str(folder / "fsdp_sharded_accelerate/pytorch_model_fsdp_0"),
                 str(cli_out), "--unsafe_serialization"]) == 0  # fmt: skip
    merged = torch.load(cli_out / "pytorch_model.bin", weights_only=True)
    assert all(torch.equal(merged[k], saved[k]) for k in saved)
    with pytest.raises(FileNotFoundError, match="pytorch_model_fsdp_0"):
        merge_fsdp_weights(folder, tmp_path / "nothing")  # several checkpoints: which one?


def _single_device(folder: str) -> tuple[dict, dict]:
    import os

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(name)  # one plain process: neither library starts a process group
    return _interop.interchange(folder, ["single"]), _interop.interrupted_save(folder + "/run")


def test_single_device_checkpoints_and_an_interrupted_save(tmp_path):
    [(results, interrupted)] = run_distributed(
        _single_device, str(tmp_path), world_size=1, timeout=300
    )
    _assert_resumed_equals_uninterrupted(results)
    assert set(results["single: accel saves, accelerate resumes"]["files"]) == {
        "accel_checkpoint.json", "accel_process_0.pt", "custom_checkpoint_0.pkl",
        "model.safetensors", "optimizer.bin", "random_states_0.pkl", "scheduler.bin",
    }  # fmt: skip
    # the failed save left its debris outside checkpoints/, where accelerate never looks
    assert "state_dict failed" in interrupted["failed"]
    assert interrupted["listing"] == [".accel_incomplete_checkpoints", "checkpoints"]
    assert interrupted["accelerate"] and interrupted["accel"]
