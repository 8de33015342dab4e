"""Helpers over environment variables and the machine, as scripts call them."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

_log = logging.getLogger("accel.utils.environment")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Marks a function purge_accelerate_environment already wrapped (never wrapped twice).
_PURGED = "_accel_purges_environment"
_TRUE = {"y", "yes", "t", "true", "on", "1"}
_FALSE = {"n", "no", "f", "false", "off", "0"}


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 (True) for y/yes/t/true/on/1, 0 (False) for n/no/f/false/off/0, any case."""
    lowered = str(value).lower()
    if lowered in _TRUE:
        return True if to_bool else 1
    if lowered in _FALSE:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}; use one of {sorted(_TRUE | _FALSE)}.")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of `env_keys` set to a non-negative integer, else `default`."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    return bool(str_to_bool(os.environ.get(key, str(default))))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def convert_dict_to_env_variables(current_env: dict[str, Any]) -> list[str]:
    """``KEY=value`` lines (for an environment file a shell reads) for the entries whose key is
    a valid variable name and whose value is non-empty and free of ; < > spaces and newlines;
    the others are skipped with a warning naming them."""
    valid, skipped = [], []
    for key, value in current_env.items():
        text = str(value)
        if _ENV_NAME.fullmatch(str(key)) and text and not any(c in text for c in ";\n<> "):
            valid.append(f"{key}={value}\n")
        else:
            skipped.append(key)
    if skipped:
        _log.warning(
            f"Skipped {skipped}: an environment variable's name must be letters, digits and "
            f"underscores (not starting with a digit) and its value non-empty, without any of "
            f"';', '<', '>', spaces or newlines (the file is read by a shell)."
        )
    return valid


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Inside the block os.environ is empty; afterwards it is restored."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def environment(values: Mapping[str, str], *, whole: bool = False) -> Iterator[None]:
    """Set `values` in os.environ for the block, then put them back as they were: the one
    save/restore of the umbrella (patch_environment, the notebook and XLA launchers). `whole`
    puts back the whole environment (torch's elastic agent sets variables of its own in the
    launching process, where no user code runs meanwhile)."""
    before = dict(os.environ) if whole else {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        if whole:
            for key in set(os.environ) - set(before):
                del os.environ[key]
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set the variables (names upper-cased, values as str) for the block, then restore them."""
    with environment({key.upper(): str(value) for key, value in kwargs.items()}):
        yield


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the ``ACCELERATE_*`` and ``ACCEL_*`` variables the function (or each test
    method of the class, inherited ones and those of subclasses included) sets are removed
    when it returns, and those it changed get their values back."""

    def prefixed() -> set[str]:
        return {k for k in os.environ if k.startswith(("ACCELERATE_", "ACCEL_"))}

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(func, _PURGED, False):
            return func

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = {k: os.environ[k] for k in prefixed()}
            try:
                return func(*args, **kwargs)
            finally:
                for key in prefixed() - set(before):
                    os.environ.pop(key, None)
                os.environ.update(before)

        setattr(wrapper, _PURGED, True)
        return wrapper

    if not inspect.isclass(func_or_cls):
        return wrap(func_or_cls)

    def wrap_tests(cls: type) -> None:
        for name in dir(cls):
            member = getattr(cls, name, None)
            if name.startswith("test") and inspect.isfunction(member):
                setattr(cls, name, wrap(member))

    wrap_tests(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(func_or_cls, cls).__init_subclass__(**kwargs)
        wrap_tests(cls)

    func_or_cls.__init_subclass__ = classmethod(init_subclass)
    return func_or_cls


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of `library_names` already imported."""
    return [name for name in library_names if name in sys.modules]


def get_current_device_type() -> tuple[str, str]:
    """(device type, the env variable that selects visible devices) for this machine."""
    if torch.cuda.is_available():
        return "cuda", "CUDA_VISIBLE_DEVICES"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu", "ZE_AFFINITY_MASK"
    return "cpu", "CUDA_VISIBLE_DEVICES"


def check_cuda_fp8_capability() -> bool:
    """True on a CUDA device of compute capability 8.9 or newer."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def check_cuda_p2p_ib_support() -> bool:
    """False for consumer RTX 30/40 cards with more than one visible device (their P2P and
    InfiniBand paths are unreliable), True otherwise."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return True
    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    return not any(("RTX 30" in n or "RTX 40" in n) for n in names)


def get_gpu_info() -> tuple[list[str], int]:
    """(the names of the visible CUDA devices, their count); no GPU gives ([], 0)."""
    if not torch.cuda.is_available():
        return [], 0
    count = torch.cuda.device_count()
    return [torch.cuda.get_device_name(i) for i in range(count)], count


@dataclasses.dataclass
class CPUInformation:
    """Where this process sits in a CPU (multi-process) job: global and per-machine rank/size."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1


def get_cpu_distributed_information() -> CPUInformation:
    """Rank, world size, local rank and local world size from the launcher's environment
    (torchrun, Intel MPI, Open MPI or MVAPICH variables, the first one set)."""
    return CPUInformation(
        rank=get_int_from_env(
            ["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0
        ),
        world_size=get_int_from_env(
            ["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1
        ),
        local_rank=get_int_from_env(
            [
                "LOCAL_RANK",
                "MPI_LOCALRANKID",
                "OMPI_COMM_WORLD_LOCAL_RANK",
                "MV2_COMM_WORLD_LOCAL_RANK",
            ],
            0,
        ),
        local_world_size=get_int_from_env(
            [
                "LOCAL_WORLD_SIZE",
                "MPI_LOCALNRANKS",
                "OMPI_COMM_WORLD_LOCAL_SIZE",
                "MV2_COMM_WORLD_LOCAL_SIZE",
            ],
            1,
        ),
    )


def get_driver_version() -> str:
    """The NVIDIA driver version of the first GPU, asked of `nvidia-smi` (CUDA stays
    uninitialized). Raises FileNotFoundError when `nvidia-smi` is not on PATH."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise FileNotFoundError(
            "get_driver_version needs `nvidia-smi` on PATH (an NVIDIA driver); none was found."
        )
    out = subprocess.check_output(
        [smi, "--query-gpu=driver_version", "--format=csv,noheader"], text=True
    )
    return out.strip().splitlines()[0]


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs nearest its GPU (`accel launch --numa` does this at launch)."""
    raise NotImplementedError(
        "set_numa_affinity is applied by `accel launch` (its NUMA affinity option) rather "
        "than from inside a running process."
    )


def override_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Re-pin this process to the CPUs nearest its GPU, replacing any affinity already set."""
    raise NotImplementedError(
        "override_numa_affinity is applied by `accel launch` (its NUMA affinity option) rather "
        "than from inside a running process."
    )
