"""Helpers over environment variables and the machine, as scripts call them."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

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
    """``KEY=value`` lines for the entries whose key and value hold no newline or '='."""
    valid = []
    for key, value in current_env.items():
        if all(c not in str(key) for c in "\n=") and "\n" not in str(value) and value:
            valid.append(f"{key}={value}\n")
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
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set the variables (names upper-cased, values as str) for the block, then restore them."""
    saved = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the ``ACCELERATE_*`` and ``ACCEL_*`` variables the function (or each test
    method of the class) sets are removed when it returns."""

    def prefixed() -> set[str]:
        return {k for k in os.environ if k.startswith(("ACCELERATE_", "ACCEL_"))}

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = {k: os.environ[k] for k in prefixed()}
            try:
                return func(*args, **kwargs)
            finally:
                for key in prefixed() - set(before):
                    os.environ.pop(key, None)
                os.environ.update(before)

        return wrapper

    if inspect.isclass(func_or_cls):
        for name, member in list(vars(func_or_cls).items()):
            if name.startswith("test") and callable(member):
                setattr(func_or_cls, name, wrap(member))
        return func_or_cls
    return wrap(func_or_cls)


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


def get_cpu_distributed_information() -> Any:
    """Rank, world size, local rank and local world size from the launcher's environment."""
    from types import SimpleNamespace

    return SimpleNamespace(
        rank=get_int_from_env(
            ["RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"], 0
        ),
        world_size=get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"], 1),
        local_rank=get_int_from_env(
            ["LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK"], 0
        ),
        local_world_size=get_int_from_env(
            ["LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"], 1
        ),
    )


def set_numa_affinity(local_process_index: int, verbose: bool | None = None) -> None:
    """Pin this process to the CPUs nearest its GPU (`accel launch --numa` does this at launch)."""
    raise NotImplementedError(
        "set_numa_affinity is applied by `accel launch` (its NUMA affinity option) rather "
        "than from inside a running process."
    )
