"""How big things are: tensor and module sizes, memory strings, and the memory each device has.

Sizes are plain byte counts. A memory budget (`max_memory`) maps a device (an int for a GPU
index, "cpu", "disk", or a string such as "cuda:1") to bytes or to a string such as "600MB" or
"1GiB"; `get_max_memory` parses and validates it, or measures what is free when none is given.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from accel_bigmodel._device_kinds import is_host

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")

Device = int | str


def torch_device(device: Device | torch.device) -> torch.device:
    """A device map's device (an int is a CUDA index) as a torch.device."""
    if isinstance(device, torch.device):
        return device
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


"""A device as device maps spell it: a GPU index, "cpu", "disk", "mps", or "cuda:1"."""


def convert_file_size_to_int(size: int | float | str) -> int:
    """Turn ``1_000_000``, ``2.5e9``, ``"600MB"`` or ``"1GiB"`` into bytes.

    MB = 10**6 bytes, MiB = 2**20. As in accelerate (and transformers), a decimal unit written
    with a lowercase final "b" ("5Gb", "100mb") counts bits, so it is an eighth of the bytes.
    Floats (transformers hands over byte counts as floats) are rounded down.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float, str)):
        raise ValueError(
            f"Memory size {size!r} is a {type(size).__name__}; give bytes (int or float) or a "
            f"string like '600MB'."
        )
    if isinstance(size, (int, float)):
        if not size >= 0 or size == float("inf"):
            raise ValueError(f"Memory size {size} is not a byte count >= 0; give e.g. 10**9.")
        return int(size)
    match = _SIZE_RE.match(size)
    unit = match.group(2) if match else ""
    if match and unit.upper() in _UNITS:
        value = int(float(match.group(1)) * _UNITS[unit.upper()])
        bits = len(unit) == 2 and unit.endswith("b")  # "Gb", "mb": bits, as accelerate reads them
        return value // 8 if bits else value
    raise ValueError(
        f"Cannot parse the memory size {size!r}. Give a number of bytes (int or float) or a "
        f"string such as '600MB', '1.5GB' or '1GiB' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, "
        f"TiB)."
    )


class CustomDtype(str, enum.Enum):
    """Dtypes torch has no name for, used in `special_dtypes` of device maps (a str enum:
    `CustomDtype.INT4 == "int4"`)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


_CUSTOM_BYTES = {CustomDtype.INT2: 0.25, CustomDtype.INT4: 0.5, CustomDtype.FP8: 1}
"""Bytes per element of the quantized dtypes torch has no name for."""


def dtype_byte_size(dtype: torch.dtype | str) -> int | float:
    """Bytes per element of `dtype`, as accelerate counts them.

    torch.bool counts 1/8 (a bit), and the quantized `CustomDtype` values ("int4", "int2",
    "fp8") their packed size. Module sizes here count bool tensors at their real byte each.
    """
    if isinstance(dtype, str) and dtype in _CUSTOM_BYTES:
        return _CUSTOM_BYTES[dtype]
    dtype = _as_dtype(dtype)
    if dtype == torch.bool:
        return 1 / 8
    return torch.empty((), dtype=dtype, device="meta").element_size()


def _tensor_size(
    tensor: torch.Tensor,
    name: str,
    dtype: torch.dtype | str | None,
    special: Mapping[str, torch.dtype | str],
) -> int:
    if name in special:
        return int(tensor.numel() * dtype_byte_size(special[name]))
    if dtype is not None and tensor.is_floating_point():
        return int(tensor.numel() * min(dtype_byte_size(dtype), tensor.element_size()))
    return tensor.numel() * tensor.element_size()


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterable[tuple[str, torch.Tensor]]:
    """The parameters (and buffers) of `module`, each shared tensor once.

    With `remove_non_persistent`, buffers left out of the state dict are left out here too.
    """
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = _non_persistent(module, recurse) if remove_non_persistent else set()
        yield from ((n, b) for n, b in module.named_buffers(recurse=recurse) if n not in skip)


def _non_persistent(module: nn.Module, recurse: bool) -> set[str]:
    """Full names of the non-persistent buffers of `module` (and of its submodules)."""
    subs = module.named_modules() if recurse else [("", module)]
    return {f"{p}.{b}" if p else b for p, m in subs for b in m._non_persistent_buffers_set}


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every module and tensor of `model`, keyed by name ("" is the whole model).

    With `dtype`, floating tensors are counted as if cast to it (never larger than they are);
    `special_dtypes` overrides that per tensor name. Tied tensors are counted once.
    """
    dtype = _as_dtype(dtype)
    special = {k: _as_dtype(v) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, int] = {}
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, True, True)
    for name, tensor in tensors:
        size = _tensor_size(tensor, name, dtype, special)
        parts = name.split(".")
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            sizes[prefix] = sizes.get(prefix, 0) + size
    sizes.setdefault("", 0)
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
) -> int:
    """Bytes of all the buffers of `model` (counted as `dtype` when given, like the sizes)."""
    sizes = compute_module_sizes(model, dtype, special_dtypes, buffers_only=True)
    return sizes.get("", 0)


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | str | None:
    """`dtype` as a torch.dtype; a quantized `CustomDtype` value stays a string."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _CUSTOM_BYTES:
        return str(getattr(dtype, "value", dtype))
    name = dtype.replace("torch.", "")
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype!r}; give a torch.dtype or a name like 'float16'.")
    return value


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]],
    module_sizes: Mapping[str, int],
    no_split_module_classes: Iterable[str] | None,
) -> tuple[int, list[str]]:
    """The size of the largest block that cannot be split, and the names of all that size.

    A block is a leaf module, or a module whose class name is in `no_split_module_classes`.
    """
    no_split = set(no_split_module_classes or ())
    max_size, names = 0, []
    todo = list(modules)
    while todo:
        name, module = todo.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split:
            size = module_sizes.get(name, 0)
            if size > max_size:
                max_size, names = size, [name]
            elif size == max_size:
                names.append(name)
        else:
            todo = [(f"{name}.{n}" if name else n, m) for n, m in children] + todo
    return max_size, names


def calculate_maximum_sizes(model: nn.Module) -> tuple[int, tuple[int, list[str]]]:
    """(total bytes of `model`, (bytes of its largest unsplittable block, their names)).

    The model's own `_no_split_modules` (transformers models declare them) are blocks; the
    top level's own parameters and buffers count as blocks of their own.
    """
    sizes = compute_module_sizes(model)
    top = [
        *model.named_parameters(recurse=False),
        *model.named_children(),
        *model.named_buffers(recurse=False),
    ]
    no_split = getattr(model, "_no_split_modules", None) or []
    return sizes[""], get_max_layer_size(top, sizes, no_split)


def _device_sort_key(device: Device) -> tuple[int, str]:
    if isinstance(device, int):
        return (0, f"{device:08d}")
    if device == "cpu":
        return (2, "")
    if device == "disk":
        return (3, "")
    return (1, device)


def normalize_device(device: Device | torch.device) -> Device:
    """Spell a device the way device maps do: 0 for "cuda:0", "cpu", "disk", "mps"."""
    if isinstance(device, torch.device):
        device = str(device)
    if isinstance(device, bool):
        raise ValueError(f"Device {device!r} is a bool; give an int, 'cpu', 'disk' or 'cuda:N'.")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"Device index {device} is negative; GPU indices start at 0.")
        return device
    if not isinstance(device, str):
        raise ValueError(f"Device {device!r} is not an int, a string or a torch.device.")
    if device in ("cpu", "disk", "meta"):
        return device
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    try:
        torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"Unknown device {device!r}: use a GPU index such as 0, 'cuda:1', 'cpu', 'disk' or "
            f"another torch device type ('mps', 'xpu:0')."
        ) from None
    return device


def check_device_same(first_device: torch.device, second_device: torch.device) -> bool:
    """True when two torch devices are one: "cuda" and "cuda:0" are (index None means 0)."""
    if first_device.type != second_device.type:
        return False
    if is_host(first_device):
        return first_device == second_device
    return (first_device.index or 0) == (second_device.index or 0)


def check_device_exists(device: Device) -> None:
    """Raise a ValueError naming `device` if this machine does not have it."""
    if device in ("cpu", "disk", "meta"):
        return
    if isinstance(device, int):
        count = torch.cuda.device_count()
        if device >= count:
            raise ValueError(
                f"Device {device} (cuda:{device}) does not exist: this machine has {count} CUDA "
                f"device(s). Use an index below {count}, or 'cpu' / 'disk'."
            )
        return
    kind = torch.device(device)
    module = getattr(torch, kind.type, None)
    available = getattr(module, "is_available", None)
    if available is None or not available():
        raise ValueError(f"Device {device!r} does not exist on this machine; use 'cpu' or 'disk'.")


def available_host_memory(meminfo: str = "/proc/meminfo") -> int:
    """The RAM available now, in bytes: psutil's `virtual_memory().available`.

    On Linux that is the kernel's MemAvailable, read here from `meminfo` directly: importing
    psutil costs more (~15 ms) than the rest of a warm disk-spilling load's planning.
    Elsewhere, or when the file has no such line, psutil answers.
    """
    try:
        with open(meminfo, "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB (KiB)
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return psutil.virtual_memory().available


def get_max_memory(
    max_memory: Mapping[Device, int | float | str] | None = None,
) -> dict[Device, int]:
    """Bytes available per device, GPUs first, then "cpu", then "disk".

    Without `max_memory`, measures the free memory of every CUDA device and the available RAM.
    With it, parses strings ("600MB", "1GiB") and floats, normalizes device names and checks each exists.
    """
    if max_memory is None:
        result: dict[Device, int] = {}
        for index in range(torch.cuda.device_count()):
            result[index] = torch.cuda.mem_get_info(index)[0]
        result["cpu"] = available_host_memory()
        return result
    result = {}
    for key, value in max_memory.items():
        device = normalize_device(key)
        check_device_exists(device)
        result[device] = convert_file_size_to_int(value)
    if isinstance(max_memory, dict):
        # Size strings in the caller's dict become bytes, as accelerate does: transformers
        # compares the caller's values with the result afterwards.
        for key, value in max_memory.items():
            if isinstance(value, str):
                max_memory[key] = result[normalize_device(key)]
    return dict(sorted(result.items(), key=lambda kv: _device_sort_key(kv[0])))


def parse_max_memory(max_memory: Mapping[Device, int | float | str]) -> dict[Device, int]:
    """Like `get_max_memory` for planning only: parses and sorts, checks no device exists."""
    result = {normalize_device(k): convert_file_size_to_int(v) for k, v in max_memory.items()}
    return dict(sorted(result.items(), key=lambda kv: _device_sort_key(kv[0])))
