"""The options of DeepSpeed's sequence parallel (Ulysses / ALST), accelerate's
``DeepSpeedSequenceParallelConfig``: a configuration accel validates and carries to the
DeepSpeed strategy, which runs ``sp_size > 1`` (`accel_parallel._deepspeed_ulysses`); the
resolver refuses it only under a strategy that does not run it.
"""

from __future__ import annotations

import dataclasses

_BUILTIN_ATTENTION = ("flash_attention_2", "flash_attention_3", "sdpa")
_REFUSED_ATTENTION = ("eager", "flex_attention")


@dataclasses.dataclass(frozen=True)
class DeepSpeedSequenceParallelConfig:
    """How the sequence is split: ``sp_seq_length`` (one length for every batch) or
    ``sp_seq_length_is_variable`` (default True: the length may change per batch), and the
    attention kernel (``"flash_attention_2"``, ``"flash_attention_3"``, ``"sdpa"`` or a
    hub-hosted flash-attention kernel such as ``"kernels-community/flash-attn2"``)."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def _default(self, name: str) -> object:
        """The value of a field left unset (None); accel's familiar-path subclass reads
        accelerate's environment variables here."""
        return True if name == "sp_seq_length_is_variable" else None

    def __post_init__(self) -> None:
        for name in ("sp_seq_length_is_variable", "sp_seq_length", "sp_attn_implementation"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self._default(name))
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            raise ValueError(
                "DeepSpeedSequenceParallelConfig(sp_seq_length_is_variable=False) needs "
                "sp_seq_length (the one sequence length of every batch): pass it, or set "
                "PARALLELISM_CONFIG_SP_SEQ_LENGTH."
            )
        attention = self.sp_attn_implementation
        if attention is None or attention in _BUILTIN_ATTENTION:
            return
        if attention in _REFUSED_ATTENTION or "/" not in attention or "flash-attn" not in attention:
            raise ValueError(
                f"Invalid sp_attn_implementation: {attention}; expected one of "
                f"{list(_BUILTIN_ATTENTION)} or a hub-hosted flash-attention kernel (e.g. "
                f"'kernels-community/flash-attn2'); 'eager' and 'flex_attention' do not work "
                f"with sequence parallel."
            )
