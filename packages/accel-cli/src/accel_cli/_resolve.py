"""Resolve one launch configuration from flags, a config file and defaults.

Precedence: a flag > the config file in effect > the defaults below. Where a flag contradicts
the file, the flag wins and a one-line notice names both values.

The workers receive the result as one JSON object in `$ACCEL_LAUNCH_CONFIG`
(`LaunchConfig.to_worker_dict`). Its schema (version 1):

    version                      1
    cpu                          bool: run on the CPU even when an accelerator is visible
    backend                      str | null: process-group backend (null: accel-state picks)
    mixed_precision              "no" | "fp16" | "bf16" | "fp8" | "fp16-true" | "bf16-true"
    gradient_accumulation_steps  int >= 1
    num_processes                int: total processes across all machines
    num_machines                 int: the machines of a fixed run; an elastic one's most
    machine_rank                 int: this machine's index
    main_process_ip              str | null
    main_process_port            int | null
    gpu_ids                      str | null: "0,1" as given ("all" or null: every device)
    config_file                  str | null: the file that was read, for the record
    debug                        bool: check shapes before collectives (also sets
                                 ACCEL_DEBUG_MODE=1 for the workers)
    as_accelerate                bool: the workers' `import accelerate` gets accel (also sets
                                 ACCEL_AS_ACCELERATE=1 for the workers)
    enable_cpu_affinity          bool: each process was pinned to its share of the cores
    explicit                     [str]: the fields above that a flag or the file set (the
                                 rest are defaults; code may override them silently)
    distributed_type             "DEEPSPEED" | "FSDP" (only when the file names a strategy)
    fsdp_config, deepspeed_config, fp8_config, parallelism_config, dynamo_config
                                 mapping, accelerate's keys, unchanged (only when set)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from accel_cli import _schema
from accel_cli._config import ConfigError, ConfigFile

SCHEMA_VERSION = 1
_FIELD_TO_KEY = {
    **{field: key for key, field in _schema.USED_KEYS.items()},
    "mpirun_hostfile": "mpirun_config.mpirun_hostfile",
}
_GPU_IDS = re.compile(r"^\d+(,\d+)*$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """Everything `accel launch` decided, validated; it reads no environment."""

    num_processes: int = 1
    num_machines: int = 1
    # An elastic run (torchrun's --nnodes MIN:MAX): it starts, and goes on, with as few as
    # min_machines of the num_machines; None: always num_machines.
    min_machines: int | None = None
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: str = "no"
    cpu: bool = False
    gpu_ids: str | None = None
    gradient_accumulation_steps: int = 1
    backend: str | None = None
    rdzv_backend: str = "static"
    max_restarts: int = 0
    num_cpu_threads_per_process: int | None = None
    multi_gpu: bool = False
    same_network: bool = False
    enable_cpu_affinity: bool = False
    debug: bool = False
    as_accelerate: bool = False
    mpirun_hostfile: str | None = None
    # torchrun's own options, passed through (see `torchrun --help`).
    tee: str = "0"
    log_dir: str | None = None
    role: str = "default"
    rdzv_conf: str = ""
    rdzv_id: str | None = None
    monitor_interval: float = 0.1
    no_python: bool = False
    config_file: str | None = None
    handed_down: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The fields a flag or the config file set (not defaults): the worker warns about a
    # conflict with the code only for these.
    explicit: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_processes", "num_machines", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: expected at least 1.")
        self._check_elastic()
        if not 0 <= self.machine_rank < self.num_machines:
            raise ConfigError(
                f"machine_rank={self.machine_rank} with num_machines={self.num_machines}: expected "
                f"0 <= machine_rank < num_machines (the main machine is 0)."
            )
        if self.num_processes % self.num_machines:
            lo = max(self.num_machines, self.num_processes // self.num_machines * self.num_machines)
            raise ConfigError(
                f"num_processes={self.num_processes} is the total across num_machines="
                f"{self.num_machines} machines and must be a multiple of it (each machine runs "
                f"num_processes / num_machines). Pass --num_processes {lo} or "
                f"{lo + self.num_machines}."
            )
        if self.num_machines > 1 and not self.main_process_ip:
            raise ConfigError(
                f"num_machines={self.num_machines} needs --main_process_ip: the address of machine "
                f"0, the same on every machine."
            )
        if self.main_process_port is not None and not 0 < self.main_process_port < 65536:
            raise ConfigError(f"main_process_port={self.main_process_port}: expected 1 to 65535.")
        if self.mixed_precision not in _schema.PRECISIONS:
            raise ConfigError(
                f"mixed_precision={self.mixed_precision!r}: expected one of "
                f"{', '.join(_schema.PRECISIONS)}."
            )
        if self.rdzv_backend not in _schema.RDZV_BACKENDS:
            raise ConfigError(
                f"rdzv_backend={self.rdzv_backend!r}: expected one of "
                f"{', '.join(_schema.RDZV_BACKENDS)}."
            )
        if self.max_restarts < 0:
            raise ConfigError(f"max_restarts={self.max_restarts}: expected 0 or more.")
        if self.num_cpu_threads_per_process is not None and self.num_cpu_threads_per_process < 1:
            raise ConfigError(
                f"num_cpu_threads_per_process={self.num_cpu_threads_per_process}: expected at "
                f"least 1."
            )
        if self.monitor_interval <= 0:
            raise ConfigError(f"monitor_interval={self.monitor_interval}: expected seconds > 0.")
        if self.multi_gpu and self.cpu:
            raise ConfigError(
                "--multi_gpu and --cpu contradict: --multi_gpu runs one process per GPU, --cpu "
                "runs on the CPU. Drop one of them."
            )
        if self.mpirun_hostfile is not None and not self.cpu:
            raise ConfigError(
                f"mpirun_hostfile={self.mpirun_hostfile!r}: mpirun starts multi-CPU runs only; "
                f"add --cpu, or drop the hostfile to launch GPU processes through torchrun."
            )
        self._check_gpu_ids()

    def _check_elastic(self) -> None:
        if self.min_machines is None:
            return
        if not 1 <= self.min_machines <= self.num_machines:
            raise ConfigError(
                f"num_machines={self.min_machines}:{self.num_machines}: an elastic range MIN:MAX "
                f"needs 1 <= MIN <= MAX, such as 1:{max(self.num_machines, 2)}."
            )
        if self.rdzv_backend == "static":
            raise ConfigError(
                f"num_machines={self.nnodes} is an elastic range, which torchrun's static "
                f"rendezvous cannot form: add --rdzv_backend c10d (with --rdzv_endpoint HOST:PORT, "
                f"or --main_process_ip and --main_process_port, the same on every machine)."
            )
        if self.mpirun_hostfile is not None:
            raise ConfigError(
                f"num_machines={self.nnodes} is an elastic range and mpirun starts a fixed set "
                f"of processes: drop --mpirun_hostfile to launch through torchrun, or give one "
                f"number of machines."
            )

    def _check_gpu_ids(self) -> None:
        ids = self.gpu_id_list
        if ids is None or self.cpu:
            return
        if self.nproc_per_node > len(ids):
            raise ConfigError(
                f"{self.nproc_per_node} processes per machine but gpu_ids={self.gpu_ids!r} lists "
                f"{len(ids)} device(s). List one GPU per process, or lower --num_processes."
            )

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines

    @property
    def elastic(self) -> bool:
        """Whether the run may go on with fewer machines than `num_machines`."""
        return self.min_machines is not None and self.min_machines < self.num_machines

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: "N", or "MIN:MAX" for an elastic run."""
        if self.elastic:
            return f"{self.min_machines}:{self.num_machines}"
        return str(self.num_machines)

    @property
    def distributed(self) -> bool:
        """Whether the launch goes through torchrun: more than one process in all, or a
        torchrun option that only torchrun can honour (tee, log_dir, restarts, ...)."""
        return self.num_processes > 1 or self.num_machines > 1 or self.uses_torchrun_options

    @property
    def uses_torchrun_options(self) -> bool:
        return (
            self.tee != "0"
            or self.log_dir is not None
            or self.role != "default"
            or self.rdzv_conf != ""
            or self.rdzv_id is not None
            or self.monitor_interval != 0.1
            or self.max_restarts > 0
        )

    @property
    def gpu_id_list(self) -> list[int] | None:
        if self.gpu_ids in (None, "all"):
            return None
        return [int(i) for i in self.gpu_ids.split(",")]

    def to_worker_dict(self) -> dict[str, Any]:
        """The JSON object handed to every worker (schema in the module docstring)."""
        return {
            "version": SCHEMA_VERSION,
            "cpu": self.cpu,
            "backend": self.backend,
            "mixed_precision": self.mixed_precision,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "num_processes": self.num_processes,
            "num_machines": self.num_machines,
            "machine_rank": self.machine_rank,
            "main_process_ip": self.main_process_ip,
            "main_process_port": self.main_process_port,
            "gpu_ids": self.gpu_ids,
            "config_file": self.config_file,
            "debug": self.debug,
            "as_accelerate": self.as_accelerate,
            "enable_cpu_affinity": self.enable_cpu_affinity,
            "explicit": list(self.explicit),
            **self.handed_down,
        }


@dataclasses.dataclass(frozen=True)
class Resolution:
    """A resolved config, where each value came from, and the notices to print."""

    config: LaunchConfig
    sources: dict[str, str]  # field -> "flag", "slurm", "file" or "default"
    notices: list[str]


def resolve_launch_config(
    flags: Mapping[str, Any],
    file: ConfigFile | None = None,
    slurm: Mapping[str, Any] | None = None,
) -> Resolution:
    """Merge flags (only those the user gave) over the SLURM allocation's values (see
    `_slurm`) over a config file over the defaults.

    Besides the fields, `flags` may hold torchrun's spellings (`TORCHRUN_SPELLINGS`):
    nnodes ("N" or "MIN:MAX"), nproc_per_node and rdzv_endpoint ("HOST:PORT")."""
    flags = _from_torchrun_spellings(flags, file, slurm or {})
    unknown = set(flags) - {f.name for f in dataclasses.fields(LaunchConfig)}
    assert not unknown, f"not LaunchConfig fields: {unknown}"
    slurm = slurm or {}
    file_values = dict(file.values) if file is not None else {}
    if file_values.get("num_processes") == -1:  # accelerate's "not set"
        del file_values["num_processes"]
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notices: list[str] = []
    given = [
        f.name for f in dataclasses.fields(LaunchConfig) if f.name in {*flags, *slurm, *file_values}
    ]
    for name in given:  # in field order, so notices come out in a stable order
        if name not in flags and name in slurm:
            chosen[name], sources[name] = slurm[name], "slurm"
            if name in file_values:
                key = _FIELD_TO_KEY[name]
                from_file = coerce(name, file_values[name], f"{key} in {str(file.path)!r}")
                if from_file != slurm[name]:
                    notices.append(
                        f"the SLURM allocation sets {name} {_show(slurm[name])} over {key}: "
                        f"{_show(from_file)} from {file.path}"
                    )
        elif name in flags:
            value = coerce(name, flags[name], f"--{name}")
            chosen[name], sources[name] = value, "flag"
            if name in file_values:
                key = _FIELD_TO_KEY[name]
                from_file = coerce(name, file_values[name], f"{key} in {str(file.path)!r}")
                if from_file != value:
                    notices.append(
                        f"--{name} {_show(value)} overrides {key}: {_show(from_file)} from "
                        f"{file.path}"
                    )
        else:
            key = _FIELD_TO_KEY[name]
            chosen[name] = coerce(name, file_values[name], f"{key} in {str(file.path)!r}")
            sources[name] = "file"
    if isinstance(chosen.get("num_machines"), str):  # "MIN:MAX": an elastic run
        low, chosen["num_machines"] = machine_range(chosen["num_machines"], "num_machines")
        chosen["min_machines"], sources["min_machines"] = low, sources["num_machines"]
    if "num_processes" not in chosen:
        chosen["num_processes"] = _default_num_processes(chosen)
    if file is not None:
        chosen["config_file"] = str(file.path)
        chosen["handed_down"] = dict(file.handed_down)
        sources["config_file"] = sources["handed_down"] = "file"
    chosen["explicit"] = tuple(sorted(k for k, v in sources.items() if k in given))
    for field in dataclasses.fields(LaunchConfig):
        sources.setdefault(field.name, "default")
    config = LaunchConfig(**chosen)
    if config.elastic and config.max_restarts == 0:
        notices.append(
            f"num_machines {config.nnodes} with max_restarts 0: the run starts with any number "
            f"of machines in the range, but a machine lost ends it; pass --max_restarts N to go "
            f"on with the others"
        )
    return Resolution(config, sources, notices)


# torchrun's names for what accelerate's flags say, accepted beside them.
TORCHRUN_SPELLINGS = ("nnodes", "nproc_per_node", "rdzv_endpoint")


def machine_range(value: Any, where: str) -> tuple[int | None, int]:
    """(MIN, MAX) of an elastic "MIN:MAX" number of machines; (None, N) for one number."""
    text = str(value).strip()
    low, sep, high = text.partition(":")
    try:
        numbers = [int(low), int(high)] if sep else [int(text)]
    except ValueError:
        numbers = []
    if isinstance(value, bool) or not numbers or min(numbers) < 1 or numbers[0] > numbers[-1]:
        raise ConfigError(
            f"{where}={value!r}: expected a number of machines N >= 1, or an elastic range "
            f"MIN:MAX with 1 <= MIN <= MAX (torchrun's --nnodes), such as 1:2."
        )
    return (numbers[0] if sep else None), numbers[-1]


def _from_torchrun_spellings(
    flags: Mapping[str, Any], file: ConfigFile | None, slurm: Mapping[str, Any]
) -> dict[str, Any]:
    """`flags` with torchrun's --nnodes, --nproc_per_node and --rdzv_endpoint turned into the
    fields they set; an error where they contradict accelerate's spelling of the same."""
    out = {k: v for k, v in flags.items() if k not in TORCHRUN_SPELLINGS}

    def put(name: str, value: Any, torchrun: str) -> None:
        if name in out and coerce(name, out[name], f"--{name}") != coerce(name, value, torchrun):
            raise ConfigError(
                f"{torchrun}={flags[torchrun[2:]]!r} and --{name}={out[name]!r} contradict "
                f"({torchrun} means {name} {value}): give one of them."
            )
        out[name] = value

    if flags.get("nnodes") is not None:
        low, high = machine_range(flags["nnodes"], "--nnodes")
        put("num_machines", high if low is None or low == high else f"{low}:{high}", "--nnodes")
    if flags.get("rdzv_endpoint") is not None:
        host, sep, port = str(flags["rdzv_endpoint"]).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"--rdzv_endpoint={flags['rdzv_endpoint']!r}: expected HOST:PORT, such as "
                f"10.0.0.1:29400 (the same on every machine)."
            )
        put("main_process_ip", host.strip("[]"), "--rdzv_endpoint")
        put("main_process_port", int(port), "--rdzv_endpoint")
    if flags.get("nproc_per_node") is not None:
        per_node = coerce("num_processes", flags["nproc_per_node"], "--nproc_per_node")
        if per_node < 1:
            raise ConfigError(f"--nproc_per_node={per_node}: expected at least 1.")
        file_values = file.values if file is not None else {}
        machines = out.get("num_machines", slurm.get("num_machines"))
        machines = file_values.get("num_machines", 1) if machines is None else machines
        _, most = machine_range(machines, "num_machines")
        put("num_processes", per_node * most, "--nproc_per_node")
    return out


def _default_num_processes(chosen: Mapping[str, Any]) -> int:
    """One process per listed GPU on each machine, else one per machine."""
    machines = chosen.get("num_machines", 1)
    ids = chosen.get("gpu_ids")
    if ids not in (None, "all") and not chosen.get("cpu", False):
        return len(ids.split(",")) * machines
    return machines


def _show(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


_INT_FIELDS = frozenset(
    {
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_port",
        "gradient_accumulation_steps",
        "max_restarts",
        "num_cpu_threads_per_process",
    }
)
_BOOL_FIELDS = frozenset(
    {
        "cpu",
        "multi_gpu",
        "same_network",
        "enable_cpu_affinity",
        "debug",
        "as_accelerate",
        "no_python",
    }
)


def coerce(name: str, value: Any, where: str) -> Any:
    """Turn a flag or file value into the field's type; `where` names it in errors."""
    if value is None:
        return None
    if name == "num_machines" and isinstance(value, str) and ":" in value:
        low, high = machine_range(value, where)
        return high if low == high else f"{low}:{high}"
    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ConfigError(f"{where}={value!r}: expected an integer.")
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{where}={value!r}: expected an integer.") from None
        return None if name == "main_process_port" and number == 0 else number  # 0: pick one
    if name == "monitor_interval":
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}={value!r}: expected a number of seconds.") from None
    if name in _BOOL_FIELDS:
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            value = value.lower() in ("true", "yes")
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r}: expected true or false.")
        return value
    if name == "mixed_precision":
        text = "no" if value is False else str(value).strip().lower()
        if text not in _schema.PRECISIONS:
            raise ConfigError(
                f"{where}={value!r}: expected one of {', '.join(_schema.PRECISIONS)}."
            )
        return text
    if name == "gpu_ids":
        return _gpu_ids(value, where)
    return str(value)


def _gpu_ids(value: Any, where: str) -> str:
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value).replace(" ", "")
    if text.lower() == "all":
        return "all"
    if not _GPU_IDS.match(text):
        raise ConfigError(f"{where}={value!r}: expected 'all' or device indices such as '0,1'.")
    return text
