"""`LaunchConfig`: everything `accel launch` decided, validated; it reads no environment.

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
    step_metrics                 bool: the Accelerator logs step metrics (log_step_metrics)
    hang_timeout                 float | null: seconds before a step or a collective is
                                 diagnosed as a hang (Accelerator(hang_timeout=...))
    hang_report_note             str: where a worker writes its hang report folder for the
                                 launcher (only with hang_timeout)
    explicit                     [str]: the fields above that a flag or the file set (the
                                 rest are defaults; code may override them silently)
    distributed_type             "DEEPSPEED" | "FSDP" (only when the file names a strategy)
    fsdp_config, deepspeed_config, fp8_config, parallelism_config, dynamo_config
                                 mapping, accelerate's keys, unchanged (only when set)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accel_cli import _schema
from accel_cli._config import ConfigError

SCHEMA_VERSION = 1


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
    step_metrics: bool = False
    hang_timeout: float | None = None
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
        if self.hang_timeout is not None and not self.hang_timeout > 0:
            raise ConfigError(
                f"hang_timeout={self.hang_timeout}: expected seconds > 0 (or leave it out)."
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
            "step_metrics": self.step_metrics,
            **({"hang_timeout": self.hang_timeout} if self.hang_timeout is not None else {}),
            "enable_cpu_affinity": self.enable_cpu_affinity,
            "explicit": list(self.explicit),
            **self.handed_down,
        }
