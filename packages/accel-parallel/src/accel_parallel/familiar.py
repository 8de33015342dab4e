"""What accelerate's module paths take from accel-parallel beyond its main API: the
parallelism configuration classes as accelerate's users construct them (a field left unset is
read from the ``PARALLELISM_CONFIG_*`` variable `accel launch` and `accelerate launch` set),
accelerate's DeepSpeed helpers (`GatheredParameters`, `map_pytorch_optim_to_deepspeed`), and
the refusal of recurrent layers under sequence parallelism (`refuse_recurrent_layers`, which
accelerate keeps in `big_modeling`).
The umbrella re-exports these at accelerate's paths (``accel.parallelism_config``,
``accel.utils``)."""

from accel_parallel._deepspeed_gather import GatheredParameters
from accel_parallel._deepspeed_parts import map_pytorch_optim_to_deepspeed
from accel_parallel._deepspeed_ulysses import refuse_recurrent_layers
from accel_parallel._env_filled import (
    DeepSpeedSequenceParallelConfig,
    ParallelismConfig,
    TorchContextParallelConfig,
)

__all__ = [
    "DeepSpeedSequenceParallelConfig",
    "GatheredParameters",
    "ParallelismConfig",
    "TorchContextParallelConfig",
    "map_pytorch_optim_to_deepspeed",
    "refuse_recurrent_layers",
]
