"""The built-in device kinds: cpu, cuda, xla, mps, xpu, npu, hpu.

Each is a `DeviceKind` with what differs for it; torch's defaults (``torch.accelerator`` or the
device module) do the rest. A PrivateUse1 backend (a vendor's extension that registers its own
device type) needs no entry here: `device_entry` gives any unregistered kind torch's defaults,
which ask ``torch.accelerator`` when that kind is torch's current accelerator.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from accel_state._device_kind import DeviceKind, register_device_kind
from accel_state._enums import DistributedType
from accel_state.xla_env import xla_opted_out, xla_requested


@register_device_kind
class CPUKind(DeviceKind):
    """The host: always present, one device, the generator is torch's own."""

    name = "cpu"
    is_host = True
    selects_device = False
    default_backend_name = "gloo"
    autocast_dtypes = (torch.bfloat16, torch.float16)

    def _probe(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def device_for_rank(self, local_rank: int, world_size: int) -> torch.device:
        return torch.device("cpu")

    @property
    def rng_key(self) -> str:
        return "torch_manual_seed"

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    def get_rng_state_all(self) -> Any:
        return torch.get_rng_state()

    def set_rng_state_all(self, state: Any) -> None:
        torch.set_rng_state(state)


@register_device_kind
class CUDAKind(DeviceKind):
    """NVIDIA (and ROCm) GPUs; present when torch sees one (no CUDA context is created)."""

    name = "cuda"
    async_copies = True
    default_backend_name = "nccl"
    autocast_dtypes = (torch.float16, torch.bfloat16)
    records_memory_history = True
    ring_attention = True
    multi_process_type = DistributedType.MULTI_GPU

    def device_name(self, device: torch.device) -> str:
        return torch.cuda.get_device_name(device)

    def tf32_matmul(self) -> bool:
        return bool(torch.backends.cuda.matmul.allow_tf32)


def on_xla(environ: Mapping[str, str]) -> bool:
    """Whether this process runs (or will run) on an XLA device: torch-xla is imported, or
    `accel_state.xla_env` says a run that names no strategy runs on XLA; never when the run
    opted out (`USE_TORCH_XLA=0`). Imports nothing."""
    if xla_opted_out(environ):
        return False
    return "torch_xla" in sys.modules or xla_requested(environ)


def _xm() -> Any:
    import torch_xla.core.xla_model as xm

    return xm


@register_device_kind
class XLAKind(DeviceKind):
    """An XLA device through torch-xla (TPU, or PJRT_DEVICE=CPU/CUDA): the runtime picks each
    process's device and its backend meets without an address; a run is XLA at any size."""

    name = "xla"
    selects_device = False
    default_backend_name = "xla"  # registered by torch_xla.distributed.xla_backend
    rendezvous_init_method = "xla://"
    autocast_dtypes = (torch.bfloat16,)
    multi_process_type = DistributedType.XLA

    def is_available(self) -> bool:
        return on_xla(os.environ)  # not cached: follows USE_TORCH_XLA and the import

    def module(self) -> Any:
        return None

    def device_count(self) -> int:
        return len(_xm().get_xla_supported_devices())

    def device_for_rank(self, local_rank: int, world_size: int) -> torch.device:
        return torch.device(_xm().xla_device())

    def synchronize(self, device: torch.device | None = None) -> None:
        _xm().wait_device_ops()

    @property
    def rng_key(self) -> str:
        return "xm_seed"  # accelerate's key for XLA's generator

    def manual_seed_all(self, seed: int) -> None:
        _xm().set_rng_state(seed)

    def get_rng_state(self) -> torch.Tensor:
        return torch.tensor(_xm().get_rng_state())

    def set_rng_state(self, state: torch.Tensor) -> None:
        _xm().set_rng_state(int(state))

    def get_rng_state_all(self) -> Any:
        return self.get_rng_state()

    def set_rng_state_all(self, state: Any) -> None:
        self.set_rng_state(state)

    def _memory_info(self, device: torch.device | None) -> dict[str, Any] | None:
        xm = _xm()
        try:
            return dict(xm.get_memory_info(device or xm.xla_device()))
        except Exception:  # some PJRT clients (CPU) keep no allocator statistics
            return None

    def memory_allocated(self, device: torch.device | None = None) -> int | None:
        info = self._memory_info(device)
        return None if info is None or "bytes_used" not in info else int(info["bytes_used"])

    def max_memory_allocated(self, device: torch.device | None = None) -> int | None:
        info = self._memory_info(device)
        return (
            None if info is None or "peak_bytes_used" not in info else int(info["peak_bytes_used"])
        )

    def total_memory(self, device: torch.device | None = None) -> int | None:
        info = self._memory_info(device)
        return None if info is None or "bytes_limit" not in info else int(info["bytes_limit"])

    def distributed_type(self, world_size: int) -> DistributedType:
        return DistributedType.XLA


@register_device_kind
class MPSKind(DeviceKind):
    """Apple's GPU: one device, no process-group backend of its own."""

    name = "mps"
    selects_device = False
    autocast_dtypes = (torch.float16, torch.bfloat16)


@register_device_kind
class XPUKind(DeviceKind):
    """Intel GPUs (torch's xpu; the backend torch registers for it, xccl)."""

    name = "xpu"
    async_copies = True
    autocast_dtypes = (torch.bfloat16, torch.float16)
    multi_process_type = DistributedType.MULTI_XPU


@register_device_kind
class NPUKind(DeviceKind):
    """Ascend NPUs through torch_npu, which registers the device type and its hccl backend."""

    name = "npu"
    async_copies = True
    autocast_dtypes = (torch.float16, torch.bfloat16)
    multi_process_type = DistributedType.MULTI_NPU


@register_device_kind
class HPUKind(DeviceKind):
    """Intel Gaudi through habana_frameworks, which registers ``torch.hpu`` and hccl."""

    name = "hpu"
    autocast_dtypes = (torch.bfloat16, torch.float16)
    multi_process_type = DistributedType.MULTI_HPU
