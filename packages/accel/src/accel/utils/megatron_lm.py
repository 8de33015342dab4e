"""Familiar path `accelerate.utils.megatron_lm`: re-exports from the packages that own the code."""

from accel._accelerator import (
    AcceleratedOptimizer,
    AcceleratedScheduler,
)
from accel._compat._imports import (
    is_megatron_lm_available,
)
from accel._compat._left_out import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronEngine,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    MegatronLMOptimizerWrapper,
    MegatronLMSchedulerWrapper,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
    finish_mpu_init,
    gather_across_data_parallel_groups,
    initialize,
    model_provider_func,
    prepare_model_optimizer_scheduler,
    prepare_optimizer,
    prepare_scheduler,
)
from accel._data_loader import (
    prepare_data_loader,
)
from accel_state import (
    recursively_apply,
    send_to_device,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronEngine",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "MegatronLMOptimizerWrapper",
    "MegatronLMSchedulerWrapper",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
    "finish_mpu_init",
    "gather_across_data_parallel_groups",
    "initialize",
    "model_provider_func",
    "prepare_model_optimizer_scheduler",
    "prepare_optimizer",
    "prepare_scheduler",
]

# accelerate's module binds these too; users import them from here
__all__ += [
    "AcceleratedOptimizer",
    "AcceleratedScheduler",
    "is_megatron_lm_available",
    "prepare_data_loader",
    "recursively_apply",
    "send_to_device",
]
