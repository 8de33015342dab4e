"""`accel env`: the facts a bug report needs, as lines to paste into an issue."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from accel_cli._environment import (
    ENV_ACCEL_CONFIG,
    ENV_CONFIG_FILE,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_OMP_NUM_THREADS,
    default_config_path,
)

_PACKAGES = (
    "accel",
    "accel-state",
    "accel-data",
    "accel-precision",
    "accel-parallel",
    "accel-bigmodel",
    "accel-tracking",
    "accel-cli",
    "torch",
    "numpy",
    "safetensors",
    "deepspeed",
    "transformer-engine",
    "torchao",
    "accelerate",
)
_ENV_VARS = (
    ENV_CONFIG_FILE,
    ENV_ACCEL_CONFIG,
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_OMP_NUM_THREADS,
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "SLURM_JOB_ID",
)


def _versions() -> list[str]:
    lines = []
    for name in _PACKAGES:
        try:
            lines.append(f"- {name}: {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return lines


def _devices() -> list[str]:
    import torch

    lines = [f"- torch CUDA build: {torch.version.cuda or 'none'}"]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            memory = props.total_memory / 2**30
            lines.append(
                f"- cuda:{i}: {props.name} ({memory:.1f} GiB, sm_{props.major}{props.minor})"
            )
    else:
        lines.append("- CUDA available: no")
    acc = getattr(torch, "accelerator", None)
    current = acc.current_accelerator() if acc is not None and acc.is_available() else None
    lines.append(f"- accelerator: {current.type if current is not None else 'none (CPU only)'}")
    from accel_state import available_backends

    lines.append(f"- distributed backends: {', '.join(available_backends()) or 'none'}")
    return lines


def _machine() -> list[str]:
    import psutil

    memory = psutil.virtual_memory()
    return [
        f"- python: {sys.version.split()[0]} ({sys.executable})",
        f"- platform: {platform.platform()}",
        f"- CPUs: {psutil.cpu_count(logical=False)} physical, {psutil.cpu_count()} logical",
        f"- RAM: {memory.total / 2**30:.1f} GiB total, {memory.available / 2**30:.1f} GiB available",
    ]


def _config(environ: Mapping[str, str]) -> list[str]:
    path = default_config_path(environ)
    if not path.is_file():
        return [f"- default config file: {path} (none)"]
    text = path.read_text(encoding="utf-8", errors="replace").rstrip()
    body = "\n".join(f"    {line}" for line in text.splitlines())
    return [f"- default config file: {path}", body]


def environment_report(environ: Mapping[str, str]) -> str:
    """The report `accel env` prints: versions, machine, devices, config, variables."""
    lines = ["accel environment (paste this into a bug report)", "", "Versions:"]
    lines += _versions()
    lines += ["", "Machine:", *_machine(), "", "Devices:", *_devices(), "", "Configuration:"]
    lines += _config(environ)
    lines += ["", "Variables:"]
    set_vars = [f"- {name}={environ[name]}" for name in _ENV_VARS if name in environ]
    lines += set_vars or ["- no launcher or accel variables set"]
    return "\n".join(lines)


def env_info(
    environ: Mapping[str, str],
    config_file: str | None = None,
    which: Callable[[str], str | None] | None = None,
) -> dict[str, Any]:
    """The facts of `accel env` as a dict with the keys accelerate's `env` returns, and
    its lines printed; `which` finds the `accel` executable (default: shutil.which)."""
    import shutil

    import psutil
    import torch

    from accel_cli import __version__

    info: dict[str, Any] = {
        "`accel` version": __version__,
        "Platform": platform.platform(),
        "`accel` bash location": (which or shutil.which)("accel") or "Not found",
        "Python version": platform.python_version(),
        "PyTorch version": torch.__version__,
        "PyTorch accelerator": "CUDA" if torch.cuda.is_available() else "N/A",
        "System RAM": f"{psutil.virtual_memory().total / 1024**3:.2f} GB",
    }
    try:
        import numpy

        info["Numpy version"] = numpy.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        info["GPU type"] = torch.cuda.get_device_name()
    path = Path(config_file) if config_file else default_config_path(environ)
    if path.is_file():
        from accel_cli._config_args import load_config_from_file

        info["`accel` configs"] = load_config_from_file(str(path)).to_dict()
    else:
        info["`accel` configs"] = "Not found"
    print("\nCopy-and-paste the text below in your GitHub issue\n")
    print("\n".join(f"- {key}: {value}" for key, value in info.items()))
    return info
