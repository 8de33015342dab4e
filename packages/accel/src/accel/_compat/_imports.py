"""`is_*_available` probes: they look for an installed module (importlib.util.find_spec) or
ask torch about its backends; none imports an optional library."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import Any

import torch

from accel_state.xla_env import xla_opted_out


@functools.cache
def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _probe(module: str) -> Callable[..., bool]:
    def probe(*args: Any, **kwargs: Any) -> bool:
        return _installed(module)

    probe.__doc__ = f"True when `{module}` is installed (it is not imported)."
    return probe


is_aim_available = _probe("aim")
is_amdsmi_available = _probe("amdsmi")
is_boto3_available = _probe("boto3")
is_clearml_available = _probe("clearml")
is_comet_ml_available = _probe("comet_ml")
is_datasets_available = _probe("datasets")
is_deepspeed_available = _probe("deepspeed")
is_dvclive_available = _probe("dvclive")
is_import_timer_available = _probe("import_timer")
is_lomo_available = _probe("lomo_optim")
is_matplotlib_available = _probe("matplotlib")
is_megatron_lm_available = _probe("megatron")
is_mlflow_available = _probe("mlflow")
is_msamp_available = _probe("msamp")
is_pandas_available = _probe("pandas")
is_peft_available = _probe("peft")
is_pippy_available = _probe("torch.distributed.pipelining")
is_pynvml_available = _probe("pynvml")
is_pytest_available = _probe("pytest")
is_rich_available = _probe("rich")
is_sagemaker_available = _probe("sagemaker")
is_schedulefree_available = _probe("schedulefree")
is_swanlab_available = _probe("swanlab")
is_tensorboard_available = _probe("tensorboard")
is_timm_available = _probe("timm")
is_torchao_available = _probe("torchao")
is_torchdata_available = _probe("torchdata")
is_torchdata_stateful_dataloader_available = _probe("torchdata.stateful_dataloader")
is_torchvision_available = _probe("torchvision")
is_trackio_available = _probe("trackio")
is_transformer_engine_available = _probe("transformer_engine")
is_transformers_available = _probe("transformers")
is_triton_available = _probe("triton")
is_wandb_available = _probe("wandb")
is_bnb_available = _probe("bitsandbytes")
is_4bit_bnb_available = is_bnb_available
is_8bit_bnb_available = is_bnb_available
is_bitsandbytes_multi_backend_available = is_bnb_available
is_transformer_engine_mxfp8_available = is_transformer_engine_available
is_neuron_available = _probe("torch_neuronx")
is_tqdm_available = _probe("tqdm")

# accelerate's switch, read once at import: USE_TORCH_XLA=0 keeps a machine with torch-xla on
# torch's own devices (the XLA strategy and every probe below ask the same rule, xla_opted_out).
USE_TORCH_XLA = not xla_opted_out(os.environ)


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    """True when numpy is installed at `min_version` or newer (it is not imported)."""
    from accel._compat._versions import compare_versions

    return _installed("numpy") and compare_versions("numpy", ">=", min_version)


def is_torch_distributed_available() -> bool:
    """True when this torch build has `torch.distributed`."""
    return torch.distributed.is_available()


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """accelerate's: torch-xla installed and not turned off (`USE_TORCH_XLA=0`); with
    `check_is_tpu` / `check_is_gpu`, its runtime's device a TPU / a GPU (torch-xla is imported
    only then)."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("check_is_tpu and check_is_gpu cannot both be true.")
    if xla_opted_out(os.environ):
        return False
    if not _installed("torch_xla"):
        return False
    if check_is_tpu or check_is_gpu:
        import torch_xla.runtime as xr

        kind = xr.device_type()
        return kind == "TPU" if check_is_tpu else kind in ("GPU", "CUDA")
    return True


def _backend(name: str) -> bool:
    module = getattr(torch, name, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    return torch.version.hip is not None and torch.cuda.is_available()


def is_mps_available(min_version: str = "1.12") -> bool:
    return torch.backends.mps.is_available()


def is_xpu_available(check_device: bool = False) -> bool:
    return _backend("xpu")


def is_npu_available(check_device: bool = False) -> bool:
    return _installed("torch_npu") and _backend("npu")


def is_mlu_available(check_device: bool = False) -> bool:
    return _installed("torch_mlu") and _backend("mlu")


def is_musa_available(check_device: bool = False) -> bool:
    return _installed("torch_musa") and _backend("musa")


def is_sdaa_available(check_device: bool = False) -> bool:
    return _installed("torch_sdaa") and _backend("sdaa")


def is_hpu_available(init_hccl: bool = False) -> bool:
    return _installed("habana_frameworks") and _backend("hpu")


def is_habana_gaudi1() -> bool:
    return False


def is_xccl_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and hasattr(dist, "is_xccl_available") and dist.is_xccl_available()


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """True where bf16 autocast works: CPU always, CUDA when the device supports it."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    return True


def is_fp8_available() -> bool:
    """True when an fp8 backend (TransformerEngine or torchao) is installed."""
    return is_transformer_engine_available() or is_torchao_available()


def is_weights_only_available() -> bool:
    return True


def deepspeed_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: the function raises ImportError naming the install when DeepSpeed is absent."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_deepspeed_available():
            raise ImportError(f"{func.__name__} needs DeepSpeed: pip install deepspeed")
        return func(*args, **kwargs)

    return wrapper


def torchao_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: the function raises ImportError naming the install when torchao is absent."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__name__} needs torchao: pip install 'accel-precision[ao]'")
        return func(*args, **kwargs)

    return wrapper
