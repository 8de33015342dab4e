"""Stand-ins for names of features accel deliberately leaves out: importable, failing on use."""

from __future__ import annotations

from typing import Any, NoReturn


def _message(name: str, feature: str, alternative: str) -> str:
    return f"{name} belongs to {feature}, which accel does not provide. {alternative}"


def unsupported(name: str, feature: str, alternative: str) -> Any:
    """A class (for a capitalized name) or a function named `name` that raises
    NotImplementedError naming `feature` and `alternative` when instantiated or called."""
    message = _message(name, feature, alternative)

    def fail(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(message)

    if name[:1].isupper():
        return type(name, (), {"__init__": fail, "__doc__": message})
    fail.__name__ = fail.__qualname__ = name
    fail.__doc__ = message
    return fail


def unsupported_names(names: list[str], feature: str, alternative: str) -> dict[str, Any]:
    """`unsupported` for each of `names`, as a dict to merge into a module's globals."""
    return {name: unsupported(name, feature, alternative) for name in names}


TPU_POD = (
    "the TPU pod launcher (torch-xla's xla_dist, removed in torch-xla 2.1)",
    "Run `accel launch --tpu SCRIPT` on every worker of the pod: `accel tpu-config --tpu_name NAME "
    "--tpu_zone ZONE --command 'accel launch --tpu SCRIPT'` starts it on all of them.",
)
TPU_INSTALL = (
    "install_xla (it installed Colab wheels of torch-xla from a bucket that no longer serves them)",
    'Install torch-xla from PyPI: pip install "accel[xla]" torch==2.9.0 (torch-xla X.Y needs '
    "torch X.Y).",
)
SAGEMAKER = ("Amazon SageMaker launching", "Launch with `accel launch` inside the job instead.")
MEGATRON = ("Megatron-LM", "Use FSDP2 (FullyShardedDataParallelPlugin) or tensor parallelism.")
BNB = ("bitsandbytes quantization", "Quantize with the bitsandbytes or transformers APIs directly.")
MSAMP = ("MS-AMP", "Use mixed_precision='fp8' with TransformerEngine or torchao.")
DEEPSPEED = (
    "the part of accelerate's DeepSpeed integration beyond ZeRO 0-3",
    "Use DeepSpeedPlugin for ZeRO, or deepspeed's own API.",
)
FSDP_INTERNAL = (
    "accelerate's FSDP internals",
    "accel's FSDP2 strategy does this inside prepare(), save_state() and load_state().",
)
LAUNCH_ENV = (
    "accelerate's launch-environment builders",
    "`accel launch` builds one torchrun command (see `accel launch --dry-run`).",
)
FP8_INTERNAL = (
    "accelerate's fp8 conversion internals",
    "Use Accelerator(mixed_precision='fp8') with TERecipeKwargs or AORecipeKwargs.",
)
