"""Familiar path `accelerate.utils.megatron_lm`: re-exports from the packages that own the code."""

from accel._compat._left_out import (
    AbstractTrainStep,
    BertTrainStep,
    GPTTrainStep,
    MegatronLMDummyDataLoader,
    MegatronLMDummyScheduler,
    T5TrainStep,
    avg_losses_across_data_parallel_group,
)

__all__ = [
    "AbstractTrainStep",
    "BertTrainStep",
    "GPTTrainStep",
    "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler",
    "T5TrainStep",
    "avg_losses_across_data_parallel_group",
]
