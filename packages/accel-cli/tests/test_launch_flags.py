"""Every flag of `accelerate launch` (1.15) is accepted by `accel launch`: honoured, or refused
before anything starts. The real 2-process launch at the end shows the honoured flags' effects
in the workers."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from accel_cli import _flags
from accel_cli._affinity import core_share
from accel_cli._command import find_mpirun, mpirun_command, with_rendezvous
from accel_cli._commands import build_parser
from accel_cli._resolve import resolve_launch_config
from accel_cli.main import main
from accel_testkit.launch import launch_command, worker_env

DATA = Path(__file__).parent / "data" / "accelerate_launch_flags.json"


def accelerate_flags() -> list[dict]:
    """accelerate's launch flags: from its parser when importable, else the committed list."""
    try:
        from accelerate.commands.launch import launch_command_parser
    except ImportError:
        return json.loads(DATA.read_text())["flags"]
    parser = launch_command_parser()
    defaults = vars(parser.parse_args(["x.py"]))
    out = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        default = defaults.get(action.dest)
        out.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "type": getattr(action.type, "__name__", None) if action.type else None,
                "default": list(default) if isinstance(default, tuple) else default,
                "choices": list(action.choices) if action.choices else None,
            }
        )
    return out


def _launch_actions() -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices["launch"]._actions for o in a.option_strings}


def test_committed_list_matches_accelerate_when_installed():
    pytest.importorskip("accelerate.commands.launch")
    committed = json.loads(DATA.read_text())["flags"]
    live = accelerate_flags()
    assert [f["options"] for f in live] == [f["options"] for f in committed]


def test_every_accelerate_flag_is_in_accel_launch():
    actions = _launch_actions()
    flags = accelerate_flags()
    assert len(flags) >= 120
    missing = [o for f in flags for o in f["options"] if o not in actions]
    assert missing == [], f"accel launch lacks accelerate's flags: {missing}"


def test_same_types_defaults_and_choices():
    actions = _launch_actions()
    for flag in accelerate_flags():
        action = actions[flag["options"][0]]
        ours = getattr(action.type, "__name__", None) if action.type else None
        if flag["type"] in ("int", "float", "str"):
            assert ours in (flag["type"], None if flag["type"] == "str" else ""), flag
        if flag["choices"]:  # accel may accept more (mixed_precision's fp16-true, bf16-true)
            assert set(flag["choices"]) <= set(action.choices), flag
        declared = _flags.BY_NAME.get(action.dest)
        if declared is not None and action.dest != "no_tpu_cluster":
            default = declared.default
            default = list(default) if isinstance(default, tuple) else default
            assert default == flag["default"] or (not default and not flag["default"]), flag
        else:  # the core flags: absent means "not given" in both
            assert flag["default"] in (None, False, 0, "static"), flag


# One non-default value for each refused flag.
def _non_default(flag: _flags.Flag) -> list[str]:
    option = flag.option_strings[0]
    if flag.type is None:
        return [option]
    if flag.choices:
        return [option, next(str(c) for c in flag.choices if c != flag.default)]
    value = {int: "7", float: "0.5"}.get(flag.type, "yes" if flag.type is not str else "x")
    if flag.type is _flags.loose_bool:
        value = "" if flag.default else "yes"  # bool(""): the only False
    return [option, value]


# (A flag whose only choice is its default, such as --parallelism_config_cp_backend torch,
# can ask for nothing else.)
REFUSED = [f for f in _flags.FLAGS if f.refused and f.choices != (f.default,)]


@pytest.mark.parametrize("flag", REFUSED, ids=[f.name for f in REFUSED])
def test_refused_flags_are_refused_before_anything_starts(flag, tmp_path, capsys):
    script = tmp_path / "never_run.py"
    script.write_text("raise SystemExit('started')\n")
    assert main(["launch", *_non_default(flag), str(script)]) == 2
    err = capsys.readouterr().err
    assert flag.option_strings[0] in err and flag.refused in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--dynamo_backend", "aot_ts_nvfuser"], "nvFuser was removed"),
        (["--dynamo_backend", "torhchxla_trace_once"], "TPU"),
        (["--mixed_precision", "fp8", "--fp8_backend", "msamp"], "MS-AMP"),
        (["--mixed_precision", "fp8", "--fp8_opt_level", "O1"], "MS-AMP"),
        (["--mixed_precision", "fp8", "--fp8_format", "E5M2"], "HYBRID"),
        (["--fp8_margin", "2"], "only with --mixed_precision fp8"),
        (["--main_training_function", "train"], "notebook_launcher(train)"),
        (["--no_python", "-m"], "contradict"),
        (["--multi_gpu", "--cpu"], "contradict"),
        (["--mpirun_hostfile", "hosts"], "add --cpu"),
    ],
)
def test_values_accel_cannot_honour_are_refused(argv, expected, tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["launch", "--dry_run", *argv, str(script)]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dynamo_config:\n  dynamo_backend: NVPRIMS_NVFUSER\n", "nvFuser"),
        ("mixed_precision: fp8\nfp8_config:\n  backend: MSAMP\n", "MS-AMP"),
    ],
)
def test_config_keys_accel_does_not_provide_are_refused(text, expected, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["launch", "--dry_run", "--config_file", str(cfg), str(script)]) == 2
    err = capsys.readouterr().err
    assert expected in err and str(cfg) in err


def test_a_config_written_for_tpu_config_launches_with_a_note(tmp_path, capsys):
    # accelerate's tests/test_configs/latest.yaml shape: keys only `tpu-config` (or a TPU
    # launch) reads, beside a distributed_type that is not XLA. accelerate launches it.
    cfg = tmp_path / "latest.yaml"
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\n"
        "num_processes: 1\nuse_cpu: false\ndowncast_bf16: 'yes'\ntpu_env: [A=1]\n"
        "tpu_name: test-tpu\ntpu_zone: us-central1-a\ncommand_file: commands.sh\n"
        "commands: [echo hello]\n"
    )
    script = tmp_path / "s.py"
    script.write_text("")
    assert main(["launch", "--dry_run", "--config_file", str(cfg), str(script)]) == 0
    err = capsys.readouterr().err
    assert "sets downcast_bf16, tpu_name, tpu_zone, command_file, commands, tpu_env" in err


def _dry_run(capsys, *argv: str) -> tuple[list[str], dict[str, str]]:
    assert main(["launch", "--dry_run", *argv]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    env = dict(line.split("=", 1) for line in lines[1:])
    return shlex.split(lines[0]), env


def test_defaults_given_explicitly_are_not_refused(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    cfg = tmp_path / "accelerate.yaml"  # what `accelerate config` writes for one CPU
    cfg.write_text(
        "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: 'NO'\n"
        "downcast_bf16: 'no'\nenable_cpu_affinity: false\nmain_training_function: main\n"
        "mixed_precision: 'no'\nnum_machines: 1\nnum_processes: 1\nrdzv_backend: static\n"
        "same_network: true\ntpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\n"
        "use_cpu: true\nfsdp_config: {}\n"
    )
    argv = [
        "--config_file", str(cfg), "--dynamo_backend", "no", "--dynamo_mode", "default",
        "--fsdp_version", "1", "--fsdp_offload_params", "false", "--megatron_lm_tp_degree", "1",
        "--parallelism_config_tp_size", "1", "--fp8_opt_level", "O2", "--fp8_margin", "0",
        "--main_training_function", "main", "--tee", "0", "--role", "default",
        "--monitor_interval", "0.1", "--fp8_pad_inner_dim", "true", str(script),
    ]  # fmt: skip
    cmd, env = _dry_run(capsys, *argv)
    assert cmd[1:] == [str(script)]  # one process, run directly: nothing asked of torchrun
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["dynamo_config"] == {"dynamo_backend": "no", "dynamo_mode": "default"}
    assert "fp8_config" not in launched and "ACCEL_DEBUG_MODE" not in env


def test_fsdp_flags_and_file_reach_the_workers(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    _, env = _dry_run(
        capsys, "--use_fsdp", "--fsdp_reshard_after_forward", "false",
        "--fsdp_auto_wrap_policy", "NO_WRAP", "--num_processes", "2", "--cpu", str(script),
    )  # fmt: skip
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["distributed_type"] == "FSDP"
    assert launched["fsdp_config"] == {
        "fsdp_reshard_after_forward": False, "fsdp_auto_wrap_policy": "NO_WRAP"
    }  # fmt: skip
    cfg = tmp_path / "fsdp.yaml"
    cfg.write_text(
        "distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n"
        "  fsdp_version: 2\n  fsdp_offload_params: false\n"
    )
    _, env = _dry_run(capsys, "--config_file", str(cfg), "--fsdp_state_dict_type",
                      "FULL_STATE_DICT", str(script))  # fmt: skip
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["distributed_type"] == "FSDP"
    assert launched["fsdp_config"] == {"fsdp_version": 2, "fsdp_offload_params": False,
                                       "fsdp_state_dict_type": "FULL_STATE_DICT"}  # fmt: skip
    # an FSDP setting without an FSDP run is refused before anything starts
    assert main(["launch", "--dry_run", "--fsdp_offload_params", "true", str(script)]) == 2
    assert "add --use_fsdp" in capsys.readouterr().err


def test_torchrun_options_are_passed_through(tmp_path, capsys):
    logs = tmp_path / "logs"
    cmd, _ = _dry_run(
        capsys, "--tee", "3", "--log_dir", str(logs), "--role", "trainer", "--rdzv_conf",
        "timeout=5", "--monitor_interval", "0.5", "--max_restarts", "2", "--no_python", "echo",
        "hi",
    )  # fmt: skip
    # One process still goes through torchrun, the only place these options mean something.
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    run = cmd[3:]
    for option, value in (
        ("--tee", "3"),
        ("--log-dir", str(logs)),
        ("--role", "trainer"),
        ("--rdzv-conf", "timeout=5"),
        ("--monitor-interval", "0.5"),
        ("--max-restarts", "2"),
    ):
        assert run[run.index(option) + 1] == value
    assert run[-3:] == ["--no-python", "echo", "hi"]
    cmd, _ = _dry_run(capsys, "--cpu", "--num_processes", "2", "-m", "pkg.train", "x")
    assert cmd[-3:] == ["-m", "pkg.train", "x"]


@pytest.mark.needs("accel_precision")
def test_debug_affinity_dynamo_and_fp8_reach_the_workers(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("")
    argv = [
        "--cpu", "--num_processes", "2", "--debug", "--enable_cpu_affinity",
        "--dynamo_backend", "inductor", "--dynamo_mode", "max-autotune",
        "--dynamo_use_fullgraph", "--dynamo_use_regional_compilation",
        "--mixed_precision", "fp8", "--fp8_backend", "te", "--fp8_margin", "2",
        "--fp8_format", "E4M3", "--fp8_override_linear_precision", "false,false,true",
        "--fp8_use_autocast_during_eval", str(script), "--lr", "1",
    ]  # fmt: skip
    cmd, env = _dry_run(capsys, *argv)
    assert env["ACCEL_DEBUG_MODE"] == "1"
    assert cmd[-6:] == ["-m", "accel_cli._affinity", "script", str(script), "--lr", "1"]
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["debug"] is True and launched["enable_cpu_affinity"] is True
    assert launched["dynamo_config"] == {
        "dynamo_backend": "inductor",
        "dynamo_mode": "max-autotune",
        "dynamo_use_fullgraph": True,
        "dynamo_use_regional_compilation": True,
    }
    fp8 = launched["fp8_config"]
    assert (fp8["backend"], fp8["margin"], fp8["fp8_format"]) == ("te", 2, "E4M3")
    assert fp8["override_linear_precision"] == [False, False, True]
    assert fp8["use_autocast_during_eval"] is True
    # Keys the flags left out take accelerate's launch defaults.
    assert (fp8["amax_compute_algorithm"], fp8["amax_history_length"]) == ("most_recent", 1024)
    from accel_precision import FP8RecipeKwargs

    recipe = FP8RecipeKwargs.from_config(fp8)  # what the worker's Accelerator builds
    assert recipe.te.override_linear_precision == (False, False, True)


def test_multi_gpu_uses_every_visible_gpu(tmp_path, capsys, monkeypatch):
    from accel_cli._commands import launch

    script = tmp_path / "s.py"
    script.write_text("")
    monkeypatch.setattr(launch, "visible_gpus", lambda environ: 0)
    assert main(["launch", "--dry_run", "--multi_gpu", str(script)]) == 2
    assert "Pass --num_processes N to start N processes on the CPU" in capsys.readouterr().err
    # No GPU, a count given: accelerate's launch starts that many CPU processes over gloo.
    assert main(["launch", "--dry_run", "--multi_gpu", "--num_processes", "2", str(script)]) == 0
    out = capsys.readouterr()
    assert "no GPU visible: starting the processes on the CPU over gloo" in out.err
    cmd = out.out.splitlines()[0].split()
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert '"cpu": true' in out.out
    monkeypatch.setattr(launch, "visible_gpus", lambda environ: 3)
    cmd, env = _dry_run(capsys, "--multi_gpu", str(script))
    assert cmd[cmd.index("--nproc-per-node") + 1] == "3"
    cmd, _ = _dry_run(capsys, "--multi_gpu", "--num_processes", "2", str(script))
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"


def test_mpirun_hostfile(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    flags = {"cpu": True, "num_processes": 2, "mpirun_hostfile": str(hosts), "debug": True}
    cfg = with_rendezvous(resolve_launch_config(flags).config)
    program = ["py", "train.py"]
    cmd = mpirun_command(cfg, program, ("/usr/bin/mpirun", "openmpi"))
    assert cmd[:7] == ["/usr/bin/mpirun", "--hostfile", str(hosts), "--npernode", "2", "-n", "2"]
    assert "ACCEL_LAUNCH_CONFIG" in cmd and "ACCEL_DEBUG_MODE" in cmd and cmd[-2:] == program
    cmd = mpirun_command(cfg, program, ("mpiexec", "hydra"))
    assert cmd == ["mpiexec", "-f", str(hosts), "-ppn", "2", "-n", "2", *program]
    with pytest.raises(Exception, match="apt install openmpi-bin"):
        find_mpirun(lambda name: None)


def test_core_share_splits_cores_evenly():
    assert core_share([0, 1, 2, 3], 0, 2) == [0, 1]
    assert core_share([3, 2, 1, 0], 1, 2) == [2, 3]
    assert core_share([0, 1], 2, 3) == [0]  # more processes than cores: shared round-robin
    assert core_share([5], 0, 1) == [5]


WORKER = """\
import json, os, sys
import torch
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule
from accel import Accelerator
from accel_state._ops import DistributedOperationException

acc = Accelerator()
model = acc.prepare(nn.Linear(2, 2))
out = {"compiled": isinstance(model, OptimizedModule), "cores": sorted(os.sched_getaffinity(0))}
rank = acc.process_index
try:
    acc.gather(torch.zeros(1, 2 + rank))  # rank 0: (1, 2), rank 1: (1, 3)
    out["error"] = None
except DistributedOperationException as err:
    out["error"] = str(err)
print("worker", rank, "done", flush=True)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
acc.state.destroy_process_group()
# torch 2.15 sometimes aborts at interpreter exit after torch.compile in a gloo process
# ("terminate called without an active exception"; a plain torch script with no accel does it
# in about 1 run of 3): leave without the interpreter's teardown.
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.needs("accel")
def test_real_launch_with_dynamo_tee_log_dir_affinity_and_debug(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    logs = tmp_path / "logs"
    argv = launch_command(
        "--dynamo_backend", "eager", "--tee", "3", "--log_dir", logs, "--enable_cpu_affinity",
        "--debug", script, tmp_path,
    )  # fmt: skip
    run = subprocess.run(
        argv,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for res in results:
        assert res["compiled"] is True
        assert "process 0: [(1, 2)]" in res["error"] and "process 1: [(1, 3)]" in res["error"]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        assert not set(results[0]["cores"]) & set(results[1]["cores"])
        assert len(results[0]["cores"]) == len(cores) // 2
    logged = {p.parent.name: p.read_text() for p in logs.rglob("stdout.log")}
    assert {"0", "1"} <= set(logged) and "worker 1 done" in logged["1"]


def test_parallelism_flags_reach_the_workers(tmp_path, capsys):
    """--parallelism_config_* flags (and the file's section) become the workers'
    parallelism_config section, which the Accelerator builds its mesh from."""
    script = tmp_path / "s.py"
    script.write_text("")
    argv = ["launch", "--dry_run", "--cpu", "--num_processes", "4",
            "--parallelism_config_dp_shard_size", "2", "--parallelism_config_tp_size", "2",
            str(script)]  # fmt: skip
    assert main(argv) == 0
    handed = json.loads(capsys.readouterr().out.split("ACCEL_LAUNCH_CONFIG=", 1)[1].split("\n")[0])
    assert handed["parallelism_config"] == {
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 2,
    }
    assert main(["launch", "--dry_run", "--use_parallelism_config", str(script)]) == 0
    handed = json.loads(capsys.readouterr().out.split("ACCEL_LAUNCH_CONFIG=", 1)[1].split("\n")[0])
    assert handed["parallelism_config"] == {"parallelism_config_dp_replicate_size": 1}


@pytest.mark.needs("accel_parallel")
def test_megatron_flags_and_file_reach_the_workers(tmp_path, capsys):
    """--use_megatron_lm and the --megatron_lm_* flags (or the megatron_lm_config keys of a
    file) are handed to the workers, where MegatronLMPlugin maps them onto the mesh."""
    from accel_parallel import megatron_settings

    script = tmp_path / "s.py"
    script.write_text("")
    _, env = _dry_run(
        capsys, "--use_megatron_lm", "--megatron_lm_pp_degree", "2",
        "--megatron_lm_num_micro_batches", "4", "--megatron_lm_gradient_clipping", "0.5",
        "--megatron_lm_recompute_activations", "true", "--num_processes", "2", "--cpu",
        str(script),
    )  # fmt: skip
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    assert launched["distributed_type"] == "MEGATRON_LM"
    assert launched["megatron_lm_config"]["megatron_lm_pp_degree"] == 2
    config, fsdp, clip = megatron_settings(
        None, launched, world_size=2, parallelism_config=None, fsdp_plugin=None
    )
    assert (config.pp_size, config.pp_microbatches, clip) == (2, 4, 0.5)
    assert fsdp.activation_checkpointing

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "distributed_type: MEGATRON_LM\nnum_processes: 4\nuse_cpu: true\nmegatron_lm_config:\n"
        "  megatron_lm_tp_degree: 2\n  megatron_lm_pp_degree: 2\n"
    )
    _, env = _dry_run(capsys, "--config_file", str(cfg), str(script))
    launched = json.loads(env["ACCEL_LAUNCH_CONFIG"])
    config, _, _ = megatron_settings(
        None, launched, world_size=4, parallelism_config=None, fsdp_plugin=None
    )
    assert (config.tp_size, config.pp_size) == (2, 2)
    assert main(["launch", "--dry_run", "--megatron_lm_pp_degree", "2", str(script)]) == 2
    assert "apply only with --use_megatron_lm" in capsys.readouterr().err
