"""`accel config`: the questionnaire driven through stdin writes files every command accepts."""

from __future__ import annotations

import io
import json

import pytest
import yaml

from accel_cli import default_file_values, load_config_file, resolve_launch_config
from accel_cli.main import main

# One answer per line, in the order the questions come; an empty line takes the default.
SINGLE = ["", "", "", "", "", "", ""]  # this machine, no distribution, defaults throughout
CPU_2 = [
    "0",  # this machine
    "multi-CPU",  # machine type, by name
    "",  # 1 machine
    "no",  # debug
    "no",  # dynamo
    "",  # engine: none (DDP)
    "2",  # processes
    "bf16",  # mixed precision, by name
]
FSDP2 = [
    "0", "2", "1", "no",  # this machine, multi-GPU, 1 machine, no debug
    "no",  # dynamo
    "1",  # engine: FSDP2
    "4",  # processes
    "", "",  # reshard after forward (yes), offload (no)
    "0", "LlamaDecoderLayer",  # transformer-based wrap and its class
    "1",  # FULL_STATE_DICT
    "", "yes",  # cpu-ram-efficient loading (yes), activation checkpointing
    "yes", "1", "2", "1",  # device mesh: replicate 1, tp 2, cp 1 -> shard 2
    "0,1,2,3",  # devices
    "bf16",
]  # fmt: skip
DEEPSPEED = [
    "0", "2", "", "",  # this machine, multi-GPU, 1 machine, no debug
    "",  # dynamo
    "2",  # engine: DeepSpeed
    "2",  # processes
    "no", "3",  # no JSON file; ZeRO-3
    "cpu", "none",  # offload optimizer to cpu, parameters nowhere
    "4",  # gradient accumulation
    "yes", "0.5",  # clipping
    "yes",  # save a 16-bit model
    "no",  # zero3 init
    "",  # devices: all
    "fp16",
]  # fmt: skip


def ask(monkeypatch, capsys, path, answers, *extra):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(a + "\n" for a in answers)))
    code = main(["config", "--config_file", str(path), *extra])
    return code, capsys.readouterr()


def show_json(path, capsys, *flags):
    assert main(["config", "show", "--config_file", str(path), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def assert_round_trip(path, capsys):
    """Every key of the written file comes back from `accel config show` with its value."""
    written = yaml.safe_load(path.read_text())
    shown = show_json(path, capsys)["values"]
    renamed = {"use_cpu": "cpu"}
    for key, value in written.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                assert shown[f"{key}.{sub}"] == {"value": inner, "source": "file"}, (key, sub)
        else:
            assert shown[renamed.get(key, key)] == {"value": value, "source": "file"}, key


def test_single_process_defaults_equal_config_default(tmp_path, monkeypatch, capsys):
    path = tmp_path / "single.yaml"
    code, out = ask(monkeypatch, capsys, path, SINGLE)
    assert code == 0, out.err
    assert yaml.safe_load(path.read_text()) == default_file_values()
    assert "In which compute environment" in out.out and "0) This machine" in out.out
    assert_round_trip(path, capsys)
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["launch", "--dry_run", "--config_file", str(path), str(script)]) == 0
    assert capsys.readouterr().out.startswith(f"{__import__('sys').executable} {script}")


def test_two_process_cpu_file_is_launched_through_torchrun(tmp_path, monkeypatch, capsys):
    path = tmp_path / "cpu.yaml"
    code, out = ask(monkeypatch, capsys, path, CPU_2)
    assert code == 0, out.err
    data = yaml.safe_load(path.read_text())
    assert data == {
        **default_file_values(cpu=True, num_processes=2, mixed_precision="bf16"),
        "debug": False,
    }
    assert data["distributed_type"] == "MULTI_CPU" and data["use_cpu"] is True
    assert_round_trip(path, capsys)
    script = tmp_path / "train.py"
    script.write_text("")
    assert main(["launch", "--dry_run", "--config_file", str(path), str(script)]) == 0
    out = capsys.readouterr().out
    assert "-m torch.distributed.run --nproc-per-node 2" in out
    handed = json.loads(out.splitlines()[-1].split("=", 1)[1])
    assert handed["cpu"] is True and handed["mixed_precision"] == "bf16"


def test_fsdp2_file_with_a_device_mesh(tmp_path, monkeypatch, capsys):
    path = tmp_path / "fsdp2.yaml"
    code, out = ask(monkeypatch, capsys, path, FSDP2)
    assert code == 0, out.err
    data = yaml.safe_load(path.read_text())
    assert data["distributed_type"] == "FSDP" and data["num_processes"] == 4
    assert data["fsdp_config"] == {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": True,
        "fsdp_offload_params": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_activation_checkpointing": True,
    }
    assert data["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1,
        "parallelism_config_dp_shard_size": 2,
        "parallelism_config_tp_size": 2,
        "parallelism_config_cp_size": 1,
    }
    assert "the FSDP shard size is what is left: 2" in out.out
    assert "does not run" not in out.out  # FSDP2 runs: no note says otherwise
    assert main(["config", "validate", "--config_file", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"
    assert_round_trip(path, capsys)
    worker = resolve_launch_config({}, load_config_file(path)).config.to_worker_dict()
    assert worker["distributed_type"] == "FSDP" and worker["fsdp_config"]["fsdp_version"] == 2


def test_deepspeed_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "ds.yaml"
    code, out = ask(monkeypatch, capsys, path, DEEPSPEED)
    assert code == 0, out.err
    data = yaml.safe_load(path.read_text())
    assert data["distributed_type"] == "DEEPSPEED" and data["mixed_precision"] == "fp16"
    assert data["deepspeed_config"] == {
        "zero_stage": 3,
        "offload_optimizer_device": "cpu",
        "offload_param_device": "none",
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 0.5,
        "zero3_save_16bit_model": True,
        "zero3_init_flag": False,
    }
    assert main(["config", "validate", "--config_file", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"
    assert_round_trip(path, capsys)


def test_bad_answers_are_asked_again_and_running_out_writes_nothing(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.yaml"
    answers = ["7", "0", "1", "", "", "", "", "1", "2", ""]  # 7: no such choice; 1: odd count
    code, out = ask(monkeypatch, capsys, path, answers)
    assert code == 0, out.err
    assert "'7' is not a number from 0 to 1; try again." in out.out
    assert "'1': 1 is below 2; try again." in out.out
    assert yaml.safe_load(path.read_text())["num_processes"] == 2

    other = tmp_path / "other.yaml"
    code, out = ask(monkeypatch, capsys, other, ["0", "1"])
    assert code == 2 and not other.exists()
    assert "The answers ended before the question 'How many machines?" in out.err


def test_an_existing_file_is_replaced_only_when_confirmed(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("num_processes: 3\n")
    code, out = ask(monkeypatch, capsys, path, ["no"])
    assert code == 1 and path.read_text() == "num_processes: 3\n"
    code, out = ask(monkeypatch, capsys, path, ["yes", *SINGLE])
    assert code == 0 and yaml.safe_load(path.read_text()) == default_file_values()
    code, out = ask(monkeypatch, capsys, path, CPU_2, "--force")
    assert code == 0 and yaml.safe_load(path.read_text())["num_processes"] == 2


def test_sagemaker_is_refused(tmp_path, monkeypatch, capsys):
    code, out = ask(monkeypatch, capsys, tmp_path / "s.yaml", ["1"])
    assert code == 2 and "SageMaker" in out.err


def test_show_names_flag_environment_file_and_default(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("mixed_precision: bf16\nnum_processes: 2\nuse_cpu: true\n")
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(path))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert main(["config", "show", "--json", "--num_processes", "4"]) == 0
    shown = json.loads(capsys.readouterr().out)
    values = shown["values"]
    assert shown["config_file"] == {"path": str(path), "origin": "$ACCEL_CONFIG_FILE"}
    assert values["num_processes"] == {"value": 4, "source": "flag"}
    assert values["mixed_precision"] == {"value": "bf16", "source": "file"}
    assert values["backend"] == {"value": None, "source": "default"}
    assert values["num_cpu_threads_per_process"] == {
        "value": 3,
        "source": "environment (OMP_NUM_THREADS)",
    }
    assert values["config_file"]["source"] == "environment (ACCEL_CONFIG_FILE)"
    assert main(["config", "show", "--num_processes", "4"]) == 0
    text = capsys.readouterr().out
    assert "num_processes: 4  [flag]" in text
    assert "note: --num_processes 4 overrides num_processes: 2" in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fsdp_config:\n  fsdp_reshard_after_froward: true\n", "fsdp_reshard_after_forward"),
        ("deepspeed_config:\n  offload_optimiser_device: cpu\n", "offload_optimizer_device"),
        ("parallelism_config:\n  parallelism_config_tp_sise: 2\n", "parallelism_config_tp_size"),
        ("megatron_lm_config:\n  megatron_lm_tp_degre: 2\n", "megatron_lm_tp_degree"),
        ("dynamo_config:\n  dynamo_bakend: INDUCTOR\n", "dynamo_backend"),
    ],
)
def test_misspelled_section_keys_are_rejected_with_the_closest(tmp_path, capsys, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["config", "show", "--config_file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Unknown key" in err and f".{expected}'?" in err
