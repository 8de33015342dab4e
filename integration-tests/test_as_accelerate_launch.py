"""`accel launch --as_accelerate`: every worker's `import accelerate` gets accel.

transformers' Trainer on 2 gloo processes, started the way a user starts it; the flows and
their outputs are those of `packages/accel/tests/_client_flows.py`.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest
import torch

from accel._as_accelerate import ENV_AS_ACCELERATE, REPORTED_VERSION
from accel_testkit.launch import launch_command, worker_env

ROOT = Path(__file__).resolve().parents[1]
FLOWS = ROOT / "packages" / "accel" / "tests" / "_client_flows.py"
ACCEL_DIR = str(Path(importlib.util.find_spec("accel").origin).parent)


def _env() -> dict[str, str]:
    return worker_env(drop=[ENV_AS_ACCELERATE], PYTHONWARNINGS="ignore")


def _launch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        launch_command(*args), capture_output=True, text=True, timeout=timeout, env=_env()
    )


def test_the_flag_sets_the_variable_for_every_worker(tmp_path: Path) -> None:
    from accel_cli._environment import ENV_AS_ACCELERATE as CLI_NAME

    assert CLI_NAME == ENV_AS_ACCELERATE
    script = tmp_path / "s.py"
    script.write_text("")
    on = _launch("--as_accelerate", "--dry_run", str(script))
    assert f"{ENV_AS_ACCELERATE}=1" in on.stdout.splitlines(), on.stdout + on.stderr
    off = _launch("--dry_run", str(script))
    assert off.returncode == 0 and ENV_AS_ACCELERATE not in off.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers not installed"
)
def test_trainer_on_two_processes(tmp_path: Path) -> None:
    proc = _launch("--as_accelerate", str(FLOWS), str(tmp_path), "trainer_ddp")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"trainer_ddp_rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert result["rank"] == rank and result["world_size"] == 2
        assert result["distributed_type"].endswith("MULTI_CPU")
        # switched on by the environment variable at interpreter start, not by the script
        assert result["switched_by_env"] and result["accelerate_file"].startswith(ACCEL_DIR)
        assert result["accelerate_version"] == REPORTED_VERSION
        assert result["losses"][-1] < result["losses"][0] - 0.3
    weights = [torch.load(tmp_path / f"ddp_rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers not installed"
)
def test_trainer_with_fsdp2_settings_checkpoints_resumes_and_saves(tmp_path: Path) -> None:
    proc = _launch("--as_accelerate", str(FLOWS), str(tmp_path), "trainer_fsdp")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"trainer_fsdp_rank{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        assert result["is_fsdp"] and result["strategy"] == "FSDP2Strategy"
        assert result["losses"][-1] < result["losses"][0] - 0.3
    assert ranks[0]["losses"] == ranks[1]["losses"]
    # the Trainer's FSDP checkpoint files, written through accel's FSDP2 strategy
    assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= set(ranks[0]["checkpoint_files"])
    # trainer.save_model wrote the gathered weights; from_pretrained reads them back.
    full = torch.load(tmp_path / "fsdp_full.pt", weights_only=True)
    reloaded = torch.load(tmp_path / "fsdp_reloaded.pt", weights_only=True)
    assert full.keys() == reloaded.keys()
    for key in full:
        assert torch.equal(full[key], reloaded[key]), key
    # resume_from_checkpoint at step 4 ends with the uninterrupted run's weights
    resumed = torch.load(tmp_path / "fsdp_resumed.pt", weights_only=True)
    for key in full:
        assert torch.equal(full[key], resumed[key]), key


def _plugin_keeps_the_trainers_config() -> bool:
    """transformers fills the "auto" values of its DeepSpeed config through the
    HfDeepSpeedConfig it passes to DeepSpeedPlugin(hf_ds_config=...), read back as
    `plugin.hf_ds_config`: the plugin must keep that object."""
    try:
        from accel_parallel import DeepSpeedPlugin, HfDeepSpeedConfig
    except ImportError:
        return False
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 2}, "train_batch_size": "auto"})
    return DeepSpeedPlugin(hf_ds_config=config).hf_ds_config is config


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("deepspeed") is None,
    reason="transformers or deepspeed not installed",
)
def test_trainer_with_a_deepspeed_config_on_two_processes(tmp_path: Path) -> None:
    if not _plugin_keeps_the_trainers_config():
        pytest.skip("DeepSpeedPlugin does not keep the HfDeepSpeedConfig the Trainer passes")
    proc = _launch("--as_accelerate", str(FLOWS), str(tmp_path), "trainer_deepspeed")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    ranks = [json.loads((tmp_path / f"trainer_deepspeed_rank{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        assert result["is_deepspeed"] and result["strategy"] == "DeepSpeedStrategy"
        assert result["losses"][-1] < result["losses"][0] - 0.3
    assert ranks[0]["losses"] == ranks[1]["losses"]
    full = torch.load(tmp_path / "ds_full.pt", weights_only=True)
    reloaded = torch.load(tmp_path / "ds_reloaded.pt", weights_only=True)
    assert full.keys() == reloaded.keys()
    for key in full:
        assert torch.equal(full[key], reloaded[key]), key
