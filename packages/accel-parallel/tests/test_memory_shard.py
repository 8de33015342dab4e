"""The traced estimate's two shortcuts against torch's own code, to the byte: FSDP2's
shards made by index (`_memory_shard`: the chunks are torch.chunk's) and the trackers' peak
update over the running modules only (`_memory_trace._ActiveOnly`), at world sizes that pad
(a dim shorter than the world, a last shard short) and with a tensor split."""

from __future__ import annotations

import contextlib

import pytest
import torch

from accel_parallel import ParallelismConfig
from accel_parallel import _memory_shard as shard
from accel_parallel import _memory_trace as trace
from accel_parallel.memory import estimate_training_memory


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=300, hidden_size=96, intermediate_size=200, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def test_chunks_are_torch_chunk_padded() -> None:
    """Every chunk, by index, is torch.chunk's (padded with empties to the count)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    by_index = shard._by_index(_chunk_with_empty)
    for rows in (1, 5, 7, 64, 100):
        tensor = torch.arange(rows * 3.0).view(rows, 3)
        for count in (1, 3, 8, 64, 256):
            want = _chunk_with_empty(tensor, count, 0)
            got = by_index(tensor, count, 0)
            assert len(got) == len(want) == count
            for i in {0, min(1, count - 1), count // 2, count - 1, -1}:
                assert got[i].shape == want[i].shape, (rows, count, i)
                assert torch.equal(got[i], want[i])
                if got[i].numel():
                    assert got[i].storage_offset() == want[i].storage_offset()


def _torch_trackers(monkeypatch) -> None:
    """torch's own trackers in place of `_ActiveOnly`'s subclasses, for the duration."""
    ours = trace._tracker
    monkeypatch.setattr(trace, "_tracker", lambda kind: ours(kind).__bases__[1])


def _rows(world_size: int, tp: int = 1) -> list[dict]:
    rows = estimate_training_memory(
        tiny_llama, world_size=world_size, batch_size=2, seq_len=16, engines=["fsdp2"],
        offload=[False], reshard_after_forward=[True, False], extrapolate=False,
        parallelism=ParallelismConfig(tp_size=tp) if tp > 1 else None,
    )  # fmt: skip
    return [r.as_row() for r in rows]


@pytest.mark.needs("transformers")
@pytest.mark.parametrize(("world_size", "tp"), [(8, 1), (64, 1), (256, 1), (32, 2)])
def test_estimate_equals_torch_code(monkeypatch, world_size: int, tp: int) -> None:
    """The estimate equals, to the byte, the one traced with torch's own chunking (one chunk
    per rank) and torch's own trackers."""
    fast = _rows(world_size, tp)
    monkeypatch.setattr(shard, "sharding_by_index", contextlib.nullcontext)
    _torch_trackers(monkeypatch)
    assert _rows(world_size, tp) == fast


@pytest.mark.needs("transformers")
def test_plain_rows_equal_torch_trackers(monkeypatch) -> None:
    """DDP and ZeRO rows (the plain model's trace) equal those of torch's own tracker."""
    kw = {"world_size": 4, "batch_size": 2, "seq_len": 16, "engines": ["ddp", "zero3"],
          "offload": [False], "extrapolate": False, "mixed_precision": "bf16"}  # fmt: skip
    fast = [r.as_row() for r in estimate_training_memory(tiny_llama, **kw)]
    _torch_trackers(monkeypatch)
    assert [r.as_row() for r in estimate_training_memory(tiny_llama, **kw)] == fast
