"""The parallelism configuration classes as accelerate's users construct them: a field left
unset (None) is read from the ``PARALLELISM_CONFIG_*`` variable that ``accelerate launch
--parallelism_config_*`` (and ``accel launch``) sets for its workers, else accel's default.

accel's familiar paths (``accel.parallelism_config``, ``accel.utils``) export these; the
classes of `accel_parallel` itself never read the environment. Each is a subclass, so
everything that accepts the plain class accepts these.
"""

from __future__ import annotations

import os
from typing import Any

from accel_parallel import _parallelism_config as _plain
from accel_parallel import _sequence_parallel as _sp

ENV_PREFIX = _plain.ENV_PREFIX
ENV_CP_COMM_STRATEGY = _plain.ENV_CP_COMM_STRATEGY
ENV_SP_SEQ_LENGTH = "PARALLELISM_CONFIG_SP_SEQ_LENGTH"
ENV_SP_SEQ_LENGTH_IS_VARIABLE = "PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE"
ENV_SP_ATTN_IMPLEMENTATION = "PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION"


def _whole_number(variable: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{variable}={raw!r} is not a whole number; set it to a size such as 2, or unset it."
        ) from None


class TorchContextParallelConfig(_plain.TorchContextParallelConfig):
    """accel_parallel's `TorchContextParallelConfig`; ``cp_comm_strategy`` left unset is
    read from PARALLELISM_CONFIG_CP_COMM_STRATEGY (else ``"allgather"``)."""

    def _default_strategy(self) -> str:
        return os.environ.get(ENV_CP_COMM_STRATEGY, super()._default_strategy())


class DeepSpeedSequenceParallelConfig(_sp.DeepSpeedSequenceParallelConfig):
    """accel_parallel's `DeepSpeedSequenceParallelConfig`; unset fields are read from
    PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE (``"true"``/``"false"``),
    PARALLELISM_CONFIG_SP_SEQ_LENGTH (only for fixed lengths; ``"None"`` is unset) and
    PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION."""

    def _default(self, name: str) -> object:
        if name == "sp_seq_length_is_variable":
            return os.environ.get(ENV_SP_SEQ_LENGTH_IS_VARIABLE, "true").lower() == "true"
        if name == "sp_attn_implementation":
            return os.environ.get(ENV_SP_ATTN_IMPLEMENTATION)
        raw = os.environ.get(ENV_SP_SEQ_LENGTH, "None")
        if self.sp_seq_length_is_variable or raw == "None":
            return None
        return _whole_number(ENV_SP_SEQ_LENGTH, raw)


class ParallelismConfig(_plain.ParallelismConfig):
    """accel_parallel's `ParallelismConfig`; each size or backend left unset is read from
    PARALLELISM_CONFIG_<FIELD> (DP_REPLICATE_SIZE, DP_SHARD_SIZE, TP_SIZE, CP_SIZE,
    CP_BACKEND, SP_SIZE, SP_BACKEND), and the handlers it makes read theirs."""

    def _default(self, name: str) -> Any:
        variable = ENV_PREFIX + name.upper()
        raw = os.environ.get(variable)
        if raw is None:
            return super()._default(name)
        return _whole_number(variable, raw) if name.endswith("_size") else raw

    def _default_handler(self, name: str) -> Any:
        if name == "cp":
            return TorchContextParallelConfig()
        if name == "sp":
            return DeepSpeedSequenceParallelConfig()
        return super()._default_handler(name)
