"""`accel estimate-memory --train` and `--plan`: the JSON rows, and a plan's configuration
launched on 2 gloo processes, whose measured peak stays under the memory given.

The launched script measures its peak with `accel_testkit.memory.measured_peak` (the CPU
allocator's live bytes from torch's profiler memory events, from the first step on).
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import yaml

from accel_testkit.launch import accel_command, launch_command, worker_env

FACTORY = """
import functools
from accel_testkit.models import Stack
mlp = functools.partial(Stack, width=256, depth=4, hidden=1024, in_features=256, out_features=256)
"""

TRAIN = """
import json
import torch
from accel import Accelerator
from accel_testkit.memory import measured_peak
from plan_models import mlp

accelerator = Accelerator()
engine = []

def build():
    torch.manual_seed(0)
    model = mlp()
    model, opt = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
    engine.append(type(model).__name__)
    return model, opt, torch.randn(256, 256)

def steps(state):
    model, opt, x = state
    for _ in range(2):
        accelerator.backward(model(x).float().mean())
        opt.step()
        opt.zero_grad(set_to_none=True)

peak = measured_peak(build, steps)
with open(f"peak_{accelerator.process_index}.json", "w") as f:
    json.dump({"rank": accelerator.process_index, "peak": peak, "engine": engine[0]}, f)
"""

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512,
    "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
}  # fmt: skip


def _accel(*argv: object, cwd: object = None) -> subprocess.CompletedProcess:
    env = worker_env(PYTHONPATH=str(cwd)) if cwd else worker_env()
    return subprocess.run(
        accel_command(*argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.needs("transformers", "accel_parallel")
def test_train_json_rows_from_config_folder(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    proc = _accel("estimate-memory", tmp_path, "--train", "--json", "--batch_size", 2,
                  "--seq_len", 16, "--num_processes", 2, "--engines", "ddp", "fsdp2", "zero3")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["engine"] for r in rows} == {"ddp", "fsdp2", "zero3"}
    parts = ("weights", "gradients", "optimizer_states", "activations", "temporaries",
             "communication")  # fmt: skip
    for row in rows:
        assert row["peak_bytes"] == sum(row[f"{p}_bytes"] for p in parts) > 0
        assert row["world_size"] == 2 and row["method"]
    text = _accel("estimate-memory", tmp_path, "--train", "--engines", "fsdp2", "--seq_len", 16)
    assert text.returncode == 0, text.stderr
    assert "fsdp2+offload" in text.stdout and "peak MiB" in text.stdout
    pipe = _accel("estimate-memory", tmp_path, "--train", "--json", "--batch_size", 4,
                  "--seq_len", 16, "--num_processes", 2, "--pp_size", 2)  # fmt: skip
    assert pipe.returncode == 0, pipe.stderr
    (row,) = json.loads(pipe.stdout)
    assert row["engine"] == "pp" and row["pp_size"] == 2 and len(row["stage_peak_bytes"]) == 2
    assert row["peak_bytes"] == max(row["stage_peak_bytes"]) and "1F1B" in row["method"]
    refused = _accel("estimate-memory", tmp_path, "--plan", "--pp_size", 2, "--num_processes", 2,
                     "--device_memory", "1GiB")  # fmt: skip
    assert refused.returncode == 2 and "holds no pipeline degree" in refused.stderr


@pytest.mark.needs("transformers", "accel_parallel")
def test_tensor_parallel_plan_writes_the_mesh(tmp_path) -> None:
    """--tp_size 2 of 4 processes: the mesh's rows (FSDP2 over the other 2), and the plan's
    config file holds the mesh's degrees."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    proc = _accel("estimate-memory", tmp_path, "--plan", "--json", "--seq_len", 16,
                  "--num_processes", 4, "--tp_size", 2, "--device_memory", "1GiB",
                  "--plan_file", tmp_path / "tp.yaml", "--engines", "fsdp2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["plan"]
    assert {(r["engine"], r["tp_size"], r["activation_checkpointing"]) for r in rows} == {
        ("fsdp2", 2, False), ("fsdp2", 2, True)}  # fmt: skip
    config = yaml.safe_load((tmp_path / "tp.yaml").read_text())
    assert config["parallelism_config"] == {
        "parallelism_config_tp_size": 2, "parallelism_config_dp_shard_size": 2}  # fmt: skip
    assert config["num_processes"] == 4 and config["distributed_type"] == "FSDP"


@pytest.mark.needs("accel_parallel")
def test_plan_needs_device_memory_and_reports_nothing_fits(tmp_path) -> None:
    (tmp_path / "plan_models.py").write_text(FACTORY)
    proc = _accel("estimate-memory", "plan_models:mlp", "--plan", cwd=tmp_path)
    assert proc.returncode != 0 and "--plan needs --device_memory" in proc.stderr
    proc = _accel("estimate-memory", "plan_models:mlp", "--plan", "--device_memory", "1MiB",
                  "--engines", "ddp", cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "no configuration fits 1.0 MiB" in proc.stderr
    proc = _accel("estimate-memory", "plan_models:mlp", "--train", "--device_memory", "9 parsecs",
                  cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "'9 parsecs'" in proc.stderr


@pytest.mark.needs("accel_parallel", "accel")
def test_plan_config_runs_on_two_processes_under_the_memory(tmp_path) -> None:
    (tmp_path / "plan_models.py").write_text(FACTORY)
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    memory = 44 * 2**20  # below DDP's peak for this model and batch (about 45 MiB per process)
    proc = _accel("estimate-memory", "plan_models:mlp", "--plan", "--engines", "ddp", "fsdp2",
                  "--batch_size", 256, "--num_processes", 2, "--device_memory", memory,
                  "--json", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    best = plan["plan"][0]
    assert best["engine"] == "fsdp2" and best["peak_bytes"] <= 0.9 * memory
    config = tmp_path / "accel_plan.yaml"
    assert config.is_file()
    run = subprocess.run(
        launch_command("--config_file", config, "train.py", num_processes=None),
        env=worker_env(PYTHONPATH=str(tmp_path)), cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    # One file per rank: two ranks printing at once to one unbuffered pipe interleave.
    peaks = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("peak_*.json"))]
    assert sorted(p["rank"] for p in peaks) == [0, 1], run.stderr[-3000:]
    for p in peaks:
        assert p["engine"].startswith("FSDP"), p
        assert p["peak"] < memory, (p, memory)


@pytest.mark.needs("transformers", "accel_parallel")
def test_train_extrapolate_matches_whole_trace(tmp_path) -> None:
    """A Llama of 6 identical layers is extrapolated by default: the row of the whole trace
    (--trace_whole), saying it was extrapolated (every engine: accel-parallel's
    test_repeated_blocks_extrapolate_to_the_byte)."""
    cfg = {**LLAMA, "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 6}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    argv = ("estimate-memory", tmp_path, "--train", "--json", "--batch_size", 4, "--seq_len", 128,
            "--num_processes", 2, "--engines", "ddp", "--mixed_precision", "bf16")  # fmt: skip
    fast, whole = _accel(*argv), _accel(*argv, "--trace_whole")
    assert fast.returncode == 0 and whole.returncode == 0, fast.stderr + whole.stderr
    fast_rows, whole_rows = json.loads(fast.stdout), json.loads(whole.stdout)
    assert len(fast_rows) == len(whole_rows) == 1
    for a, b in zip(fast_rows, whole_rows, strict=True):
        assert (
            a.pop("method")
            == f"{b.pop('method')} (3, 4 and 5 of 6 LlamaDecoderLayer blocks, extrapolated)"
        )
        assert a == b
