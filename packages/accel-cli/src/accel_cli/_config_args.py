"""accelerate's config-file dataclasses: `BaseConfig`, `ClusterConfig`, `SageMakerConfig`.

Code written for accelerate builds configs with these, reads them with
`load_config_from_file`, and writes them with `to_yaml_file` / `to_json_file`. The fields
are accelerate's YAML keys; `accel launch` reads the same files (see `_schema`). Loading
fills accelerate's defaults and turns the old spellings (`fp16`, a top-level
`dynamo_backend`) into today's keys; an unknown key is a ValueError naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import os
from pathlib import Path
from typing import Any

from accel_cli._config import ConfigError
from accel_cli._constants import (
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
)
from accel_cli._environment import default_config_path
from accel_state import DistributedType


class ComputeEnvironment(str, enum.Enum):
    """Where a config file's run happens (accel launches LOCAL_MACHINE runs only)."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


# accelerate's SageMaker distributed types, kept as strings (accel does not launch SageMaker).
SAGEMAKER_DISTRIBUTED_TYPES = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")


def _plain(value: Any) -> Any:
    """`value` with enums turned into their values and empty mappings into None."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()} or None
    return value


@dataclasses.dataclass
class BaseConfig:
    """The keys every config file has."""

    compute_environment: ComputeEnvironment
    distributed_type: Any  # DistributedType, or a SageMaker type name
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        self.compute_environment = ComputeEnvironment(_plain(self.compute_environment))
        kind = _plain(self.distributed_type)
        if kind is False:  # YAML 1.1 reads a bare NO as false
            kind = "NO"
        if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
            if kind not in SAGEMAKER_DISTRIBUTED_TYPES:
                raise ValueError(
                    f"distributed_type={kind!r} is not a SageMaker type; accepted: "
                    f"{', '.join(SAGEMAKER_DISTRIBUTED_TYPES)}."
                )
            self.distributed_type = kind
        else:
            self.distributed_type = DistributedType(kind)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}

    def to_dict(self) -> dict[str, Any]:
        """The fields as a config file holds them: enums as strings, unset ones left out."""
        out = {k: _plain(v) for k, v in vars(self).items()}
        return {k: v for k, v in out.items() if v is not None}

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """`config_dict` with accelerate's defaults filled in and old keys renamed."""
        data = dict(config_dict)
        data.setdefault("compute_environment", ComputeEnvironment.LOCAL_MACHINE)
        if "distributed_type" not in data:
            raise ValueError(
                "A config needs a distributed_type (NO, MULTI_CPU, MULTI_GPU, FSDP, "
                "DEEPSPEED, ...); add one, or rewrite the file with `accel config update`."
            )
        if data["distributed_type"] is False:
            data["distributed_type"] = "NO"
        if "num_processes" not in data and data["distributed_type"] == DistributedType.NO:
            data["num_processes"] = 1
        if "mixed_precision" not in data:
            data["mixed_precision"] = "fp16" if data.get("fp16") else None
        data.pop("fp16", None)
        if "dynamo_backend" in data:
            backend = data.pop("dynamo_backend")
            data["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            data.setdefault(key, False)
        return data

    @classmethod
    def _from_data(cls, data: Any, path: str | os.PathLike[str]) -> BaseConfig:
        if not isinstance(data, dict):
            raise ConfigError(
                f"Config file {str(path)!r} must hold a mapping of keys to values, got "
                f"{type(data).__name__}."
            )
        given = set(data)
        data = cls.process_config(data)
        known = [f.name for f in dataclasses.fields(cls)]
        for filled in set(data) - given - set(known):  # a default this class has no field for
            del data[filled]
        extra = sorted(set(data) - set(known))
        if extra:
            hints = [difflib.get_close_matches(k, known, n=1) for k in extra]
            named = ", ".join(
                f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in zip(extra, hints)
            )
            raise ConfigError(
                f"The config file at {path} had unknown keys ({named}) for {cls.__name__}. "
                f"Fix or remove them."
            )
        return cls(**data)

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str] | None = None) -> BaseConfig:
        """The config in a JSON file (default: the default config file)."""
        path = default_config_path() if json_file is None else json_file
        with open(path, encoding="utf-8") as f:
            return cls._from_data(json.load(f), path)

    @classmethod
    def from_yaml_file(cls, yaml_file: str | os.PathLike[str] | None = None) -> BaseConfig:
        """The config in a YAML file (default: the default config file)."""
        import yaml

        path = default_config_path() if yaml_file is None else yaml_file
        with open(path, encoding="utf-8") as f:
            return cls._from_data(yaml.safe_load(f) or {}, path)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        with open(json_file, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        import yaml

        with open(yaml_file, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f)


@dataclasses.dataclass
class ClusterConfig(BaseConfig):
    """A run on this machine or a cluster of machines (what `accel launch` reads)."""

    num_processes: int = -1  # -1: decided at launch (SLURM, --num_processes)
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: dict | None = None
    deepspeed_config: dict | None = None
    fsdp_config: dict | None = None
    parallelism_config: dict | None = None
    megatron_lm_config: dict | None = None
    mpirun_config: dict | None = None
    downcast_bf16: bool = False
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict | None = None

    def __post_init__(self) -> None:
        for name in (
            "deepspeed_config",
            "fsdp_config",
            "megatron_lm_config",
            "mpirun_config",
            "fp8_config",
            "parallelism_config",
        ):
            if getattr(self, name) is None:
                setattr(self, name, {})
        super().__post_init__()


@dataclasses.dataclass
class SageMakerConfig(BaseConfig):
    """A SageMaker job's config. accel reads and writes it; `accel launch` does not run it."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False


def _read_mapping(path: Path) -> dict[str, Any]:
    from accel_cli._config import read_config_data

    if path.suffix.lower() == ".json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    return read_config_data(path)


def load_config_from_file(config_file: str | os.PathLike[str] | None = None) -> BaseConfig:
    """The config in `config_file` (default: the default file) as a `ClusterConfig`, or a
    `SageMakerConfig` when its compute_environment is AMAZON_SAGEMAKER."""
    if config_file is not None:
        if not Path(config_file).expanduser().is_file():
            raise FileNotFoundError(
                f"The configuration file {str(config_file)!r} does not exist. Pass an existing "
                f"file, or create the default one with `accel config`."
            )
        path = Path(config_file).expanduser()
    else:
        path = default_config_path()
        if not path.is_file():
            raise FileNotFoundError(
                f"There is no default configuration file ({path}). Create it with "
                f"`accel config` or `accel config default`."
            )
    data = _read_mapping(path)
    sagemaker = data.get("compute_environment") == ComputeEnvironment.AMAZON_SAGEMAKER
    cls = SageMakerConfig if sagemaker else ClusterConfig
    if path.suffix.lower() == ".json":
        return cls.from_json_file(path)
    return cls.from_yaml_file(path)
