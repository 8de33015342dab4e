"""Config files: find the one in effect, read and validate it, write a new one.

Only one file is ever read: `--config_file` when given, else the default file (see
`default_config_path`). The two are not layered, so a forgotten default file cannot leak
values into a run that names its own file. Files use accelerate's YAML keys (see `_schema`);
an unknown key is an error that names the key, the file and the closest known key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from accel_cli import _schema
from accel_cli._environment import ENV_CONFIG_FILE, default_config_path
from accel_cli._refusals import section_refusals


class ConfigError(ValueError):
    """A configuration value, key, file or flag combination that accel cannot use."""


@dataclasses.dataclass(frozen=True)
class ConfigFile:
    """A validated config file: the values accel uses, hands down, or only notes."""

    path: Path
    origin: str  # "--config_file", "$ACCEL_CONFIG_FILE" or "default location"
    values: dict[str, Any]  # LaunchConfig field -> raw value from the file
    handed_down: dict[str, Any]  # passed to the workers unchanged
    noted: tuple[str, ...] = ()  # keys set to something neither accel nor accelerate acts on
    # One message per key set to a feature accel does not provide: `accel launch` refuses them.
    refused: tuple[str, ...] = ()
    data: dict[str, Any] = dataclasses.field(default_factory=dict)  # the file's mapping as read


class ConfigFileNotFound(ConfigError, FileNotFoundError):
    """A config file that was named and does not exist."""


class ConfigFileExists(ConfigError, FileExistsError):
    """A file that would be replaced without --overwrite / --force."""


def closest_key_error(key: str, known: Iterable[str], where: str) -> ConfigError:
    """An error for an unknown key that suggests the closest known one."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else f" Known keys: {', '.join(known)}."
    return ConfigError(f"Unknown key {key!r} in {where}.{hint} Fix or remove it.")


def find_config_file(
    explicit: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None
) -> tuple[Path, str] | None:
    """The config file in effect and where it came from, or None when there is none."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigFileNotFound(
                f"--config_file {str(explicit)!r} does not exist. Create it with "
                f"`accel config default --config_file {explicit}` or pass another path."
            )
        return path, "--config_file"
    path = default_config_path(env)
    if env.get(ENV_CONFIG_FILE):
        if not path.is_file():
            raise ConfigError(
                f"${ENV_CONFIG_FILE}={env[ENV_CONFIG_FILE]!r} names no file. Create it with "
                f"`accel config default`, or unset {ENV_CONFIG_FILE}."
            )
        return path, f"${ENV_CONFIG_FILE}"
    return (path, "default location") if path.is_file() else None


def load_config_file(path: str | os.PathLike[str], origin: str = "--config_file") -> ConfigFile:
    """Read and validate a YAML (or JSON) config file written with accelerate's keys."""
    path = Path(path).expanduser().absolute()
    return config_from_data(read_config_data(path), path, origin)


def read_config_data(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw mapping in a YAML (or JSON) config file, unvalidated."""
    import yaml

    path = Path(path).expanduser()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"Config file {str(path)!r} does not exist.") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"Config file {str(path)!r} is not valid YAML: {err}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {str(path)!r} must hold a mapping of keys to values, "
            f"got a {type(data).__name__}."
        )
    return data


def config_from_data(
    data: Any, path: str | os.PathLike[str], origin: str = "--config_file"
) -> ConfigFile:
    """Validate the mapping read from the config file at `path` (named in errors)."""
    path = Path(path)
    data = dict(data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {str(path)!r} must hold a mapping of keys to values, "
            f"got a {type(data).__name__}."
        )
    for key in data:
        if key not in _schema.ALL_KEYS:
            raise closest_key_error(str(key), _schema.ALL_KEYS, f"config file {str(path)!r}")
    if data.get("distributed_type") is False:  # YAML 1.1 reads a bare NO as false
        data["distributed_type"] = "NO"
    _check_choice(data, "compute_environment", _schema.COMPUTE_ENVIRONMENTS, path)
    if data.get("compute_environment") == "AMAZON_SAGEMAKER":
        raise ConfigError(
            f"Config file {str(path)!r} has compute_environment: AMAZON_SAGEMAKER; accel launch "
            f"runs on the local machine. Use LOCAL_MACHINE, or launch on SageMaker with accelerate."
        )
    _check_choice(data, "distributed_type", _schema.DISTRIBUTED_TYPES, path)
    values = {field: data[key] for key, field in _schema.USED_KEYS.items() if key in data}
    if data.get("fp16") and "mixed_precision" not in data:  # accelerate's old spelling
        values["mixed_precision"] = "fp16"
    if "cpu" not in values and data.get("distributed_type") == "MULTI_CPU":
        values["cpu"] = True
    handed_down = _handed_down(data, path)
    mpirun = data.get("mpirun_config") or {}
    if mpirun.get("mpirun_hostfile"):
        values["mpirun_hostfile"] = mpirun["mpirun_hostfile"]
    given = {**data, **{f"mpirun_config.{k}": v for k, v in mpirun.items()}}
    noted = tuple(
        key
        for key, inert in _schema.NOTED_KEYS.items()
        if key in given and not _schema.is_inert(given[key], inert)
    )
    return ConfigFile(
        path=path,
        origin=origin,
        values=values,
        handed_down=handed_down,
        noted=noted,
        refused=_refused(data, handed_down, path),
        data=data,
    )


def _refused(
    data: Mapping[str, Any], handed_down: Mapping[str, Any], path: Path
) -> tuple[str, ...]:
    """One message per key that asks for a feature accel does not provide."""
    where = f"in {str(path)!r}"
    out = []
    kind = data.get("distributed_type")
    if kind in _schema.REFUSED_TYPES:
        out.append(f"distributed_type: {kind} {where}: {_schema.REFUSED_TYPES[kind]}.")
    for key, (inert, why) in _schema.REFUSED_KEYS.items():
        if key in data and not _schema.is_inert(data[key], inert):
            out.append(f"{key}: {data[key]!r} {where}: {why}.")
    for section, why in _schema.REFUSED_SECTIONS.items():
        if data.get(section) and kind not in _schema.REFUSED_TYPES:
            out.append(f"{section} {where}: {why}. Remove the section.")
    out += [f"{msg} ({where})" for msg in section_refusals(handed_down)]
    return tuple(out)


def _check_choice(data: Mapping[str, Any], key: str, choices: tuple[str, ...], path: Path) -> None:
    value = data.get(key)
    if value is not None and value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"{key}: {value!r} in {str(path)!r} is not one of {', '.join(choices)}.{hint}"
        )


def _check_section(data: Mapping[str, Any], section: str, known: tuple[str, ...], path: Path):
    """The section's mapping (None when absent or empty), with every key checked."""
    value = data.get(section)
    if value in (None, {}):
        return None
    if not isinstance(value, dict):
        raise ConfigError(
            f"{section} in {str(path)!r} must be a mapping, got {type(value).__name__} {value!r}."
        )
    for key in value:
        if key not in known:
            raise closest_key_error(
                f"{section}.{key}", [f"{section}.{k}" for k in known], repr(str(path))
            )
    return value


def _handed_down(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    for section, known in _schema.CHECKED_SECTIONS.items():
        _check_section(data, section, known, path)
    out: dict[str, Any] = {}
    for section, known in _schema.HANDED_DOWN_SECTIONS.items():
        value = _check_section(data, section, known, path)
        if value is not None:
            out[section] = dict(value)
    backend = data.get("dynamo_backend")  # the old top-level spelling
    if backend is not None and not (out.get("dynamo_config") or {}).get("dynamo_backend"):
        out["dynamo_config"] = {**out.get("dynamo_config", {}), "dynamo_backend": backend}
    if data.get("distributed_type") in _schema.STRATEGY_TYPES:
        out["distributed_type"] = data["distributed_type"]
    return out


def default_file_values(
    *, mixed_precision: str = "no", cpu: bool = False, num_processes: int = 1
) -> dict[str, Any]:
    """The content of a new config file, in accelerate's shape so both tools can read it."""
    if mixed_precision not in _schema.PRECISIONS:
        raise ConfigError(
            f"mixed_precision {mixed_precision!r} is not one of {', '.join(_schema.PRECISIONS)}."
        )
    if num_processes < 1:
        raise ConfigError(f"num_processes={num_processes}: expected at least 1.")
    distributed_type = "NO" if num_processes == 1 else "MULTI_CPU" if cpu else "MULTI_GPU"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed_type,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision,
        "num_machines": 1,
        "num_processes": num_processes,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": cpu,
    }


def write_config_file(
    path: str | os.PathLike[str], values: Mapping[str, Any], *, force: bool = False
) -> Path:
    """Write `values` as YAML (JSON for a .json path), atomically; an existing file is kept
    unless `force`."""
    import yaml

    path = Path(path).expanduser()
    if path.exists() and not force:
        raise ConfigError(
            f"{str(path)!r} already exists; pass --force to overwrite it, or --config_file to "
            f"write elsewhere."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if path.suffix.lower() == ".json":
                json.dump(dict(values), f, indent=2, sort_keys=True)
                f.write("\n")
            else:
                yaml.safe_dump(dict(values), f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
