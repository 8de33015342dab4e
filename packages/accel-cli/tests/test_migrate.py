"""`accel to-fsdp2` and `accel config update`: old files rewritten, checked before writing."""

from __future__ import annotations

import yaml

from accel_cli.main import main

# The FSDP1 file `accelerate config` writes (as in accelerate's FSDP documentation and tests).
FSDP1_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_cpu_ram_efficient_loading: true
  fsdp_forward_prefetch: false
  fsdp_offload_params: false
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""


def test_to_fsdp2_converts_the_documented_example(tmp_path, capsys):
    src = tmp_path / "fsdp1.yaml"
    src.write_text(FSDP1_YAML)
    out = tmp_path / "fsdp2.yaml"
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(out)]) == 0
    converted = yaml.safe_load(out.read_text())
    assert converted["fsdp_config"] == {
        "fsdp_activation_checkpointing": False,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_offload_params": False,
        "fsdp_reshard_after_forward": True,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_transformer_layer_cls_to_wrap": "BertLayer",
        "fsdp_version": 2,
    }
    original = yaml.safe_load(FSDP1_YAML)
    assert {k: v for k, v in converted.items() if k != "fsdp_config"} == {
        k: v for k, v in original.items() if k != "fsdp_config"
    }
    err = capsys.readouterr().err
    assert "dropped fsdp_use_orig_params" in err and "dropped fsdp_backward_prefetch" in err
    assert src.read_text() == FSDP1_YAML  # the input is untouched
    assert main(["config", "validate", "--config_file", str(out)]) == 0


def test_to_fsdp2_refuses_to_overwrite_and_maps_strategies(tmp_path, capsys):
    src = tmp_path / "c.yaml"
    src.write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: 2\n  fsdp_version: 1\n"
    )
    assert main(["to-fsdp2", "--config_file", str(src)]) == 2
    assert "--output_file PATH" in capsys.readouterr().err
    taken = tmp_path / "taken.yaml"
    taken.write_text("x")
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(taken)]) == 2
    assert "--overwrite" in capsys.readouterr().err and taken.read_text() == "x"
    assert main(["to-fsdp2", "--config_file", str(src), "--overwrite"]) == 0
    assert yaml.safe_load(src.read_text())["fsdp_config"] == {
        "fsdp_reshard_after_forward": False,  # 2 is SHARD_GRAD_OP in accelerate's old numbering
        "fsdp_version": 2,
    }
    # Already FSDP2: written unchanged, with a note.
    assert main(["to-fsdp2", "--config_file", str(src), "--overwrite"]) == 0
    assert "already 2" in capsys.readouterr().err


def test_to_fsdp2_notes_hybrid_sharding(tmp_path, capsys):
    src = tmp_path / "c.yaml"
    src.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n")
    out = tmp_path / "o.yaml"
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(out)]) == 0
    assert "parallelism_config_dp_replicate_size" in capsys.readouterr().err
    assert yaml.safe_load(out.read_text())["fsdp_config"]["fsdp_reshard_after_forward"] is True


def test_to_fsdp2_checks_the_result_before_writing(tmp_path, capsys):
    src = tmp_path / "c.yaml"
    src.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n")
    src.write_text(src.read_text() + "  fsdp_ofload_params: true\n")
    out = tmp_path / "o.yaml"
    assert main(["to-fsdp2", "--config_file", str(src), "--output_file", str(out)]) == 2
    assert "Did you mean 'fsdp_config.fsdp_offload_params'?" in capsys.readouterr().err
    assert not out.exists()


OLD_YAML = """\
compute_environment: LOCAL_MACHINE
deepspeed_config: {}
distributed_type: 'NO'
fsdp_config:
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_sharding_strategy: 1
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
fp16: true
dynamo_backend: INDUCTOR
num_machines: 1
num_processes: 1
use_cpu: false
"""


def test_config_update_rewrites_old_keys(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_YAML)
    assert main(["config", "update", "--config_file", str(path)]) == 0
    out = capsys.readouterr().out
    assert "- fp16: true -> mixed_precision: fp16" in out and f"updated {path}" in out
    data = yaml.safe_load(path.read_text())
    assert data["mixed_precision"] == "fp16" and "fp16" not in data
    assert data["dynamo_config"] == {"dynamo_backend": "INDUCTOR"}
    assert data["fsdp_config"] == {
        "fsdp_backward_prefetch": "BACKWARD_PRE",
        "fsdp_sharding_strategy": "FULL_SHARD",
    }
    assert "deepspeed_config" not in data and "main_process_ip" not in data
    assert data["rdzv_backend"] == "static" and data["debug"] is False
    assert main(["config", "update", "--config_file", str(path)]) == 0
    assert "already up to date" in capsys.readouterr().out


def test_config_update_keeps_json_and_refuses_unknown_keys(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text('{"distributed_type": "MULTI_CPU", "num_processes": 2, "fp16": false}')
    assert main(["config", "update", "--config_file", str(path)]) == 0
    assert yaml.safe_load(path.read_text())["mixed_precision"] == "no"
    assert path.read_text().startswith("{\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("fp16: true\nnum_procesess: 2\n")
    assert main(["config", "update", "--config_file", str(bad)]) == 2
    assert "Did you mean 'num_processes'?" in capsys.readouterr().err
    assert bad.read_text() == "fp16: true\nnum_procesess: 2\n"
