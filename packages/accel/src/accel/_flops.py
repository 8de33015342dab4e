"""Model FLOPs and the device's peak FLOP/s, for the step metrics (MFU).

`device_peak_flops` looks the device up in a table of dense peak FLOP/s of common NVIDIA
data-center GPUs per compute dtype (the vendors' datasheets, without structured sparsity);
on a CPU, or a device or dtype the table lacks, it measures a peak once with a short matmul
probe and says so (`PeakFlops.source == "measured"`). `flop_counter` gives the
`torch.utils.flop_counter.FlopCounterMode` that counts a forward + backward.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import torch

from accel_state import device_entry

# Dense peak TFLOP/s by compute dtype. "tf32" is float32 matmuls on tensor cores (used when
# torch allows TF32); "fp32" is plain float32 on the CUDA cores.
_TABLE: tuple[tuple[tuple[str, ...], dict[str, float]], ...] = (
    # (words that must all appear in the upper-cased device name, its peaks): first match wins
    (("B200",), {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0}),
    (("H200",), {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("GH200",), {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("H100", "PCIE"), {"fp8": 1513.0, "bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (("H100", "NVL"), {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (("H100",), {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("H800",), {"fp8": 1978.9, "bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (("H20",), {"fp8": 296.0, "bf16": 148.0, "fp16": 148.0, "tf32": 74.0, "fp32": 44.0}),
    (("A100",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("A800",), {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (("A10G",), {"bf16": 70.0, "fp16": 70.0, "tf32": 35.0, "fp32": 31.2}),
    (("A10",), {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (("L40S",), {"fp8": 733.0, "bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    (("L40",), {"fp8": 362.1, "bf16": 181.0, "fp16": 181.0, "tf32": 90.5, "fp32": 90.5}),
    (("L4",), {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (("V100",), {"fp16": 125.0, "fp32": 15.7}),
    (("T4",), {"fp16": 65.0, "fp32": 8.1}),
)
_DTYPES = {"fp8": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class PeakFlops:
    """A device's peak FLOP/s for one compute dtype, and where the figure comes from:
    "table" (a datasheet's dense figure) or "measured" (a matmul probe on this machine)."""

    flops_per_sec: float
    source: str
    device_name: str
    dtype: str


def compute_dtype(mixed_precision: str, device: torch.device) -> str:
    """The dtype label the matmuls run in: "fp8", "bf16", "fp16", "tf32" or "fp32"."""
    mode = mixed_precision.split("-")[0]
    if mode in ("fp8", "bf16", "fp16"):
        return mode
    tf32 = device_entry(device).tf32_matmul()
    return "tf32" if tf32 or torch.get_float32_matmul_precision() != "highest" else "fp32"


def table_peak(device_name: str, dtype: str) -> float | None:
    """The table's dense peak FLOP/s of `device_name` in `dtype`, or None when not listed."""
    name = device_name.upper()
    for words, peaks in _TABLE:
        if all(word in name for word in words):
            tflops = peaks.get(dtype)
            return None if tflops is None else tflops * 1e12
    return None


def device_name(device: torch.device) -> str:
    return device_entry(device).device_name(device)


def device_peak_flops(device: torch.device, dtype: str) -> PeakFlops:
    """The peak FLOP/s that MFU is measured against: the table's, else measured once."""
    name = device_name(device)
    peak = table_peak(name, dtype)  # a kind without product names ("cpu") matches no row
    if peak is not None:
        return PeakFlops(peak, "table", name, dtype)
    return PeakFlops(_measured_peak(str(device), dtype), "measured", name, dtype)


@functools.cache
def _measured_peak(device: str, dtype: str, seconds: float = 0.2) -> float:
    """The best FLOP/s of square matmuls over about `seconds` (after a warm-up), cached per
    device and dtype: the most this process gets from this device in practice."""
    where = torch.device(device)
    n = 512 if device_entry(where).is_host else 4096
    torch_dtype = _DTYPES.get(dtype, torch.float32)
    a = torch.randn(n, n, device=where, dtype=torch_dtype)
    b = torch.randn(n, n, device=where, dtype=torch_dtype)
    sync = _synchronizer(where)
    torch.matmul(a, b)
    sync()
    best, spent = 0.0, 0.0
    while spent < seconds:
        start = time.perf_counter()
        for _ in range(4):
            torch.matmul(a, b)
        sync()
        took = time.perf_counter() - start
        spent += took
        best = max(best, 4 * 2 * n**3 / took)
    return best


def _synchronizer(device: torch.device) -> Callable[[], None]:
    entry = device_entry(device)
    if entry.is_host:
        return lambda: None
    return lambda: entry.synchronize(device)


class _GlobalOnly:
    """FlopCounterMode's module tracker reduced to the one total this module reads. The real
    one hooks the backward of every module it sees, which `torch.autograd.grad` (the pipeline
    schedules' backward) refuses; the FLOP formulas and the dispatch mode are torch's."""

    parents = ("Global",)

    def __enter__(self) -> _GlobalOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


def flop_counter() -> torch.utils.flop_counter.FlopCounterMode:
    """A FlopCounterMode that prints nothing and keeps only the total (`get_total_flops`)."""
    from torch.utils.flop_counter import FlopCounterMode

    mode = FlopCounterMode(display=False)
    if hasattr(mode, "mod_tracker"):
        mode.mod_tracker = _GlobalOnly()
    return mode
