"""The `accel` command end to end: help, config commands, env, and real launches."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from accel_cli.main import main
from accel_testkit.launch import accel_command, worker_env


def _accel(*argv: str, cwd=None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        accel_command(*argv),
        env=worker_env(),  # the test process's environment, already isolated by conftest
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )


def test_help_and_config_commands_do_not_import_torch(tmp_path):
    cfg = tmp_path / "c.yaml"
    asked = tmp_path / "asked.yaml"
    fsdp1 = tmp_path / "fsdp1.yaml"
    fsdp1.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 16, '
        '"n_positions": 8}'
    )
    script = tmp_path / "s.py"
    script.write_text("")
    code = textwrap.dedent(
        f"""
        import contextlib, io, sys
        from accel_cli.main import main
        sys.stdin = io.StringIO("\\n" * 7)
        codes = []
        for argv in (["--help"], ["launch", "--help"], ["config", "--help"], ["env", "--help"],
                     ["estimate-memory", "--help"], ["test", "--help"], ["to-fsdp2", "--help"],
                     ["config", "default", "--config_file", {str(cfg)!r}, "--cpu"],
                     ["config", "--config_file", {str(asked)!r}],
                     ["config", "show", "--config_file", {str(cfg)!r}],
                     ["config", "validate", "--config_file", {str(cfg)!r}],
                     ["config", "update", "--config_file", {str(cfg)!r}],
                     ["to-fsdp2", "--config_file", {str(fsdp1)!r}, "--overwrite"],
                     ["estimate-memory", {str(model)!r}],
                     ["launch", "--dry_run", "--num_processes", "2", "--cpu", {str(script)!r}]):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                codes.append(main(argv))
        state = sorted(m for m in sys.modules if m.split(".")[0] == "accel_state")
        print(codes, "torch" in sys.modules, ",".join(state) or "-")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    *codes, torch_loaded, state_loaded = out.stdout.split()
    assert "".join(codes) == "[" + ",".join(["0"] * 15) + "]"
    assert torch_loaded == "False"
    # of accel-state, only its torch-free network rule (the launcher's route and interface)
    assert set(state_loaded.split(",")) <= {"accel_state", "accel_state.hosts"}, state_loaded


def test_usage_errors_name_the_fix(tmp_path, capsys):
    assert main(["launch", "--num_proceses", "2", "x.py"]) == 2
    assert "Did you mean --num_processes?" in capsys.readouterr().err
    assert main(["launch", "missing.py"]) == 2
    assert "'missing.py' does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("mixed_precison: fp16\n")
    assert main(["config", "validate", "--config_file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "'mixed_precison'" in err and str(bad) in err and "'mixed_precision'" in err
    assert main(["config", "validate"]) == 2
    assert "accel config default" in capsys.readouterr().err


def test_config_default_show_and_launch_read_the_same_file(tmp_path, capsys, monkeypatch):
    target = tmp_path / "xdg" / "accel" / "default_config.yaml"
    assert main(["config", "default", "--mixed_precision", "bf16", "--num_processes", "2"]) == 0
    assert target.is_file() and yaml.safe_load(target.read_text())["mixed_precision"] == "bf16"
    assert main(["config", "default"]) == 2  # kept without --force
    assert "--force" in capsys.readouterr().err
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert f"config file: {target} (default location)" in out
    assert 'mixed_precision: "bf16"  [file]' in out and "backend: null  [default]" in out
    assert f'config_file: "{target}"  [file]' in out

    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["launch", "--dry_run", "--cpu", "--mixed_precision", "fp16", str(script), "--x", "1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"using config file {target} (default location)" in captured.err
    assert f"--mixed_precision fp16 overrides mixed_precision: bf16 from {target}" in captured.err
    lines = captured.out.splitlines()
    assert " -m torch.distributed.run --nproc-per-node 2 --nnodes 1 --node-rank 0" in lines[0]
    assert lines[0].endswith(f"{script} --x 1")
    handed = json.loads(lines[-1].split("=", 1)[1])
    assert handed["mixed_precision"] == "fp16" and handed["cpu"] is True
    assert handed["num_processes"] == 2 and handed["config_file"] == str(target)


def test_env_report(tmp_path, monkeypatch, capsys):
    import torch

    cfg = tmp_path / "env.yaml"
    cfg.write_text("mixed_precision: bf16\n")
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(cfg))
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert f"- torch: {torch.__version__.split('+')[0]}" in out
    assert "- accel-cli: 0.1.0" in out and "RAM:" in out and "gloo" in out
    assert f"- default config file: {cfg}" in out and "    mixed_precision: bf16" in out
    assert f"- ACCEL_CONFIG_FILE={cfg}" in out


WORKER = """\
import json, os, sys
import torch
import torch.distributed as dist
from accel_state import PartialState, resolved_launch_config

state = PartialState()
total = torch.tensor([float(state.process_index + 1)])
dist.all_reduce(total)
launched = resolved_launch_config()
result = {
    "rank": state.process_index,
    "world": state.num_processes,
    "device": str(state.device),
    "backend": state.backend,
    "sum": total.item(),
    "argv": sys.argv[1:],
    "mixed_precision": launched["mixed_precision"],
    "cpu": launched["cpu"],
    "gas": launched["gradient_accumulation_steps"],
    "omp": os.environ.get("OMP_NUM_THREADS"),
}
out = os.path.join(sys.argv[1], f"rank{state.process_index}.json")
with open(out, "w") as f:
    json.dump(result, f)
state.destroy_process_group()
"""


def test_real_two_process_launch_from_a_written_config(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    assert (
        _accel(
            "config", "default", "--config_file", str(cfg), "--mixed_precision", "bf16"
        ).returncode
        == 0
    )
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run = _accel(
        "launch", "--config_file", str(cfg), "--num_processes", "2", "--cpu",
        "--gradient_accumulation_steps", "4", str(script), str(tmp_path), "--flag", "value",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"using config file {cfg} (--config_file)" in run.stderr
    assert f"--num_processes 2 overrides num_processes: 1 from {cfg}" in run.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, res in enumerate(results):
        assert res == {
            "rank": rank,
            "world": 2,
            "device": "cpu",
            "backend": "gloo",
            "sum": 3.0,
            "argv": [str(tmp_path), "--flag", "value"],
            "mixed_precision": "bf16",
            "cpu": True,
            "gas": 4,
            "omp": "1",
        }


MODULE = """\
import json, os, sys
rank = int(os.environ["RANK"])
out = os.path.join(sys.argv[1], f"m{rank}.json")
with open(out + ".part", "w") as f:
    json.dump({"world": os.environ["WORLD_SIZE"], "argv": sys.argv[2:],
               "config": json.loads(os.environ["ACCEL_LAUNCH_CONFIG"])}, f)
os.replace(out + ".part", out)
if rank == 1:
    # torchrun stops every worker once one fails: rank 1 fails only after rank 0 has written
    import time
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(sys.argv[1], "m0.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(5)
"""


def test_module_launch_through_torchrun_and_a_failing_rank_fails_the_launch(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(MODULE)
    run = _accel(
        "launch", "--num-processes", "2", "--cpu", "-m", "pkg.job", str(tmp_path), "a", cwd=tmp_path
    )
    assert run.returncode == 1, run.stdout + run.stderr  # torchrun reports a failed worker as 1
    for rank in range(2):
        res = json.loads((tmp_path / f"m{rank}.json").read_text())
        assert res["world"] == "2" and res["argv"] == ["a"]
        assert res["config"]["num_processes"] == 2 and res["config"]["cpu"] is True


def test_single_process_runs_directly_and_keeps_the_exit_code(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import os, sys\n"
        "assert 'RANK' not in os.environ and 'torch' not in sys.modules\n"
        "print(os.environ['ACCEL_LAUNCH_CONFIG'])\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    run = _accel("launch", "--mixed_precision", "fp16", str(script), "3")
    assert run.returncode == 3, run.stderr
    assert json.loads(run.stdout)["mixed_precision"] == "fp16"
    (tmp_path / "mod.py").write_text("import sys; sys.exit(len(sys.argv))\n")
    assert _accel("launch", "-m", "mod", "x", "y", cwd=tmp_path).returncode == 3


def test_sigterm_is_forwarded_to_the_script(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text(
        "import pathlib, signal, sys, time\n"
        "out = pathlib.Path(sys.argv[1])\n"
        "def stop(signum, frame):\n"
        "    out.with_suffix('.stopped').write_text(str(signum))\n"
        "    sys.exit(7)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "out.write_text('ready')\n"
        "time.sleep(60)\n"
    )
    ready = tmp_path / "flag.txt"
    proc = subprocess.Popen(accel_command("launch", script, ready), env=worker_env())
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "script never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7
        assert ready.with_suffix(".stopped").read_text() == str(int(signal.SIGTERM))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.gpu
def test_gpu_ids_select_the_device(tmp_path):
    script = tmp_path / "g.py"
    script.write_text(
        "import os, torch\nprint(os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.device_count())\n"
    )
    run = _accel("launch", "--gpu_ids", "0", str(script))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "1"]
