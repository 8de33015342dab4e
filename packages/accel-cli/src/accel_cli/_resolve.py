"""Resolve one launch configuration from flags, a config file and defaults.

Precedence: a flag > the scheduler's or operator's environment (a SLURM step: `_slurm`; a
Kubernetes operator's pod: `_operators`, which says why) > the config file in effect > the
defaults below. Where a flag contradicts the environment or the file, or the environment
the file, the one higher up wins and a one-line notice names both values.

The result is a `LaunchConfig` (see `_launch_config`, which also describes what the
workers receive); `check_launch` then refuses what accel does not provide.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from accel_cli import _schema
from accel_cli._config import ConfigError, ConfigFile
from accel_cli._launch_config import LaunchConfig
from accel_cli._refusals import flag_refusals

_FIELD_TO_KEY = {
    **{field: key for key, field in _schema.USED_KEYS.items()},
    "mpirun_hostfile": "mpirun_config.mpirun_hostfile",
}
_GPU_IDS = re.compile(r"^\d+(,\d+)*$")


@dataclasses.dataclass(frozen=True)
class FromEnvironment:
    """Launch values that a scheduler's or an operator's environment variables give."""

    source: str  # who set them, for messages: "the SLURM allocation", "Kubeflow TrainJob"
    values: Mapping[str, Any]  # LaunchConfig fields (num_machines may be "MIN:MAX")
    # field -> the variable(s) it was read from, for the "from the environment" line
    variables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kind: str = "environment"  # the Resolution.sources tag of these values
    per_node: int | None = None  # processes per machine: num_processes = this x machines
    notices: tuple[str, ...] = ()
    # what to say when neither a flag nor the file gives num_machines, which these need
    needs_machines: str | None = None
    # fields a flag num_machines other than these values' takes out with it
    topology: tuple[str, ...] = ()

    def named(self, name: str) -> str:
        """`name`'s origin in a message: "PET_NNODES (Kubeflow TrainJob)" or the source."""
        variable = self.variables.get(name)
        return f"{variable} ({self.source})" if variable else self.source


@dataclasses.dataclass(frozen=True)
class Resolution:
    """A resolved config, where each value came from, and the notices to print."""

    config: LaunchConfig
    sources: dict[str, str]  # field -> "flag", "slurm", "environment", "file" or "default"
    notices: list[str]
    environment: FromEnvironment | None = None

    def environment_line(self) -> str | None:
        """ "from the environment (SOURCE): name=value (VARIABLE), ..." for the values taken
        from named variables (None where none was)."""
        env = self.environment
        if env is None:
            return None
        taken = [
            f"{name}={self._shown(name)} ({env.variables[name]})"
            for name in (f.name for f in dataclasses.fields(LaunchConfig))
            if self.sources[name] == env.kind and name in env.variables
        ]
        return f"from the environment ({env.source}): {', '.join(taken)}" if taken else None

    def _shown(self, name: str) -> str:
        if name == "num_machines":
            return self.config.nnodes  # "MIN:MAX" for an elastic run
        return _show(getattr(self.config, name))


def resolve_launch_config(
    flags: Mapping[str, Any],
    file: ConfigFile | None = None,
    environment: FromEnvironment | None = None,
) -> Resolution:
    """Merge flags (only those the user gave) over the values of the scheduler's or the
    operator's environment (see `_slurm`, `_operators`) over a config file over the defaults.

    Besides the fields, `flags` may hold torchrun's spellings (`TORCHRUN_SPELLINGS`):
    nnodes ("N" or "MIN:MAX"), nproc_per_node and rdzv_endpoint ("HOST:PORT")."""
    from_env = dict(environment.values) if environment is not None else {}
    flags = _from_torchrun_spellings(flags, file, from_env)
    unknown = set(flags) - {f.name for f in dataclasses.fields(LaunchConfig)}
    assert not unknown, f"not LaunchConfig fields: {unknown}"
    file_values = dict(file.values) if file is not None else {}
    if file_values.get("num_processes") == -1:  # accelerate's "not set"
        del file_values["num_processes"]
    notices: list[str] = list(environment.notices) if environment is not None else []
    if environment is not None:
        from_env = _environment_values(environment, flags, file_values, notices)
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    given = [
        f.name
        for f in dataclasses.fields(LaunchConfig)
        if f.name in {*flags, *from_env, *file_values}
    ]
    for name in given:  # in field order, so notices come out in a stable order
        if name not in flags and name in from_env:
            assert environment is not None
            chosen[name], sources[name] = from_env[name], environment.kind
            if name in file_values:
                key = _FIELD_TO_KEY[name]
                from_file = coerce(name, file_values[name], f"{key} in {str(file.path)!r}")
                if from_file != from_env[name]:
                    notices.append(
                        f"{environment.named(name)} sets {name} {_show(from_env[name])} over "
                        f"{key}: {_show(from_file)} from {file.path}"
                    )
        elif name in flags:
            value = coerce(name, flags[name], f"--{name}")
            chosen[name], sources[name] = value, "flag"
            if name in from_env and from_env[name] != value:
                assert environment is not None
                notices.append(
                    f"--{name} {_show(value)} overrides {name} {_show(from_env[name])} from "
                    f"{environment.named(name)}"
                )
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
    return Resolution(config, sources, notices, environment)


def _environment_values(
    environment: FromEnvironment,
    flags: Mapping[str, Any],
    file_values: Mapping[str, Any],
    notices: list[str],
) -> dict[str, Any]:
    """The environment's values that apply beside these flags and file values: a flag
    num_machines other than the environment's takes its topology out (with a notice); the
    processes per machine become num_processes; an error where the environment needs a
    number of machines that nothing gives."""
    values = dict(environment.values)
    per_node = environment.per_node
    if "num_machines" in flags and "num_machines" in values:
        ours = coerce("num_machines", flags["num_machines"], "--num_machines")
        if ours != values["num_machines"]:
            notices.append(
                f"--num_machines {ours} overrides num_machines {values['num_machines']} from "
                f"{environment.named('num_machines')}, and with it the rank, address and "
                f"processes read there: this launch forms its own world of {ours} machine(s). "
                f"Drop --num_machines (and --nnodes) to join the job's world."
            )
            values = {k: v for k, v in values.items() if k not in environment.topology}
            per_node = None
    if environment.needs_machines and not {"num_machines"} & {*flags, *values, *file_values}:
        raise ConfigError(environment.needs_machines)
    if per_node is not None:
        machines = flags.get("num_machines", values.get("num_machines"))
        machines = file_values.get("num_machines", 1) if machines is None else machines
        values["num_processes"] = per_node * machine_range(machines, "num_machines")[1]
    return values


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
    flags: Mapping[str, Any], file: ConfigFile | None, environment: Mapping[str, Any]
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
        machines = out.get("num_machines", environment.get("num_machines"))
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
        "step_metrics",
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
    if name in ("monitor_interval", "hang_timeout"):
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


def check_launch(config: LaunchConfig, given: Mapping[str, Any], file: ConfigFile | None) -> None:
    """Raise one ConfigError listing everything this launch asks for that accel refuses."""
    kind = config.handed_down.get("distributed_type")
    problems = flag_refusals(
        given, config.mixed_precision, fsdp_from_file=kind == "FSDP",
        deepspeed_from_file=kind == "DEEPSPEED", megatron_from_file=kind == "MEGATRON_LM",
    )  # fmt: skip
    problems += [] if file is None else list(file.refused)
    if given.get("no_python") and given.get("module"):
        problems.append("--no_python and -m/--module contradict: pick one.")
    if problems:
        lines = "\n  - ".join(dict.fromkeys(problems))
        raise ConfigError(f"accel launch does not provide what this run asks for:\n  - {lines}")
