"""Per-rank checkpoint plans of a world of N ranks, built in one process from the sharding
rules, for measuring the coordinator's planning at 8 to 16,384 ranks (tools/bench).

FSDP2 (`fsdp2_save_plans`): each parameter is a DTensor with ``Shard(0)`` over the N ranks,
split as torch.chunk splits (ceil(rows / N) rows each; a rank past the last row holds an empty
shard whose offset is the row count). Building N x 291 DTensors through a DeviceMesh per rank
is too slow at 16k ranks, so each rank's `SavePlan` is built directly from that arithmetic with
torch's own plan classes, as torch's `create_default_local_save_plan` builds it from DTensors
(item for item: the tests compare them over a fake process group at small N), including the
flattening mappings DefaultSavePlanner attaches. The optimizer of such a model (Adam) adds two
sharded states per parameter and a 0-d ``step`` tensor that every rank holds.

DeepSpeed ZeRO (`zero_files`) and DDP (`ddp_files`): the file names each rank writes into a
save_state folder, from DeepSpeed's naming rule and accelerate's layout.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

__all__ = [
    "LLAMA_8B",
    "ddp_files",
    "fsdp2_chunk",
    "fsdp2_save_plans",
    "llama_tensors",
    "local_chunks",
    "optimizer_tensors",
    "storage_of",
    "zero_files",
]

_PROPERTY_FIELDS = {f.name for f in dataclasses.fields(TensorProperties)}
# (hidden, intermediate, layers, kv width, vocab) of Llama-3-8B
LLAMA_8B = (4096, 14336, 32, 1024, 128256)


def llama_tensors(dims: tuple[int, int, int, int, int] = LLAMA_8B) -> list[tuple[str, tuple]]:
    """(name, shape) of every tensor of a Llama model's state dict: 291 for Llama-3-8B."""
    hidden, inter, layers, kv, vocab = dims
    out: list[tuple[str, tuple]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
            (p + "input_layernorm.weight", (hidden,)),
            (p + "post_attention_layernorm.weight", (hidden,)),
        ]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def optimizer_tensors(model: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
    """Adam's state of `model` as `get_optimizer_state_dict` names it: two sharded moments
    per parameter and a 0-d step (shape ``()``, the same on every rank)."""
    out = []
    for name, shape in model:
        out += [
            (f"state.{name}.exp_avg", shape),
            (f"state.{name}.exp_avg_sq", shape),
            (f"state.{name}.step", ()),
        ]
    return out


def fsdp2_chunk(shape: tuple, n: int, rank: int) -> tuple[tuple, tuple]:
    """(sizes, offsets) of `rank`'s shard of a tensor of `shape` under Shard(0) over `n`."""
    rows = shape[0]
    per = math.ceil(rows / n)
    start = min(rank * per, rows)
    end = min(start + per, rows)
    return (end - start, *shape[1:]), (start, *(0 for _ in shape[1:]))


def _strides(sizes: tuple) -> tuple:
    """The strides of a contiguous tensor of `sizes`."""
    return tuple(math.prod(sizes[i + 1 :]) for i in range(len(sizes)))


def _properties(dtype: torch.dtype, sizes: tuple, cache: dict) -> TensorProperties:
    """One TensorProperties per (dtype, sizes), shared by the items that have them."""
    key = (dtype, sizes)
    if key not in cache:
        # torch 2.9's TensorProperties has no strides; later releases record the local one's
        strides = {"strides": _strides(sizes)} if "strides" in _PROPERTY_FIELDS else {}
        cache[key] = TensorProperties(dtype=dtype, **strides)
    return cache[key]


def fsdp2_save_plans(
    tensors: list[tuple[str, tuple]],
    n: int,
    prefix: str = "model",
    dtype: torch.dtype = torch.bfloat16,
    ranks: range | None = None,
) -> list[SavePlan]:
    """The local SavePlan of each rank (of `ranks`, default all `n`) saving ``{prefix:
    state}`` where `state` holds `tensors` sharded by FSDP2: what DefaultSavePlanner's
    create_local_plan returns on each rank (0-d tensors are plain tensors, on every rank)."""
    keys = [f"{prefix}.{name}" for name, _ in tensors]
    mappings = {key: (prefix, name) for key, (name, _) in zip(keys, tensors)}
    cache: dict[Any, TensorProperties] = {}
    sizes_of = [torch.Size(shape) for _, shape in tensors]
    plans = []
    for rank in ranks if ranks is not None else range(n):
        items = []
        for key, (_, shape), size in zip(keys, tensors, sizes_of):
            if not shape:  # a plain 0-d tensor: every rank plans it, the coordinator dedups
                chunk = ChunkStorageMetadata(offsets=torch.Size([]), sizes=torch.Size([]))
                items.append(
                    WriteItem(
                        index=MetadataIndex(key, torch.Size([])),
                        type=WriteItemType.TENSOR,
                        tensor_data=TensorWriteData(
                            chunk=chunk, properties=_properties(torch.float32, (), cache), size=size
                        ),
                    )
                )
                continue
            local, offsets = fsdp2_chunk(shape, n, rank)
            offsets = torch.Size(offsets)
            items.append(
                WriteItem(
                    index=MetadataIndex(key, offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=torch.Size(local)),
                        properties=_properties(dtype, local, cache),
                        size=size,
                    ),
                )
            )
        plans.append(SavePlan(items, planner_data=mappings))
    return plans


def storage_of(global_plan: list[SavePlan], threads: int) -> dict[Any, Any]:
    """The storage entries FileSystemWriter returns for `global_plan`: each rank's items
    spread over its `threads` files ``__<rank>_<i>.distcp`` (lengths: the items' bytes)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    storage = {}
    offsets: dict[str, int] = {}
    for rank, plan in enumerate(global_plan):
        for i, item in enumerate(plan.items):
            name = f"__{rank}_{i % threads}.distcp"
            length = item.tensor_storage_size() or 0
            storage[item.index] = _StorageInfo(name, offsets.get(name, 0), length)
            offsets[name] = offsets.get(name, 0) + length
    return storage


def local_chunks(tensors: list[tuple[str, tuple]], n: int, rank: int, prefix: str = "model"):
    """{flattened key: [ChunkStorageMetadata]} of `rank`'s shards: what a resuming rank asks
    the checkpoint for (0-d tensors: the whole value)."""
    out = {}
    for name, shape in tensors:
        local, offsets = fsdp2_chunk(shape, n, rank) if shape else ((), ())
        out[f"{prefix}.{name}"] = [
            ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(local))
        ]
    return out


def zero_files(n: int, stage: int, engine: str = "pytorch_model") -> list[str]:
    """The files DeepSpeed's save_checkpoint writes under its tag folder for `n` data-parallel
    ranks (no model parallelism): the model states once (ZeRO-1/2) or per rank (ZeRO-3), the
    optimizer partition per rank (bf16 runs prefix ``bf16_``; the count is the same)."""
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: expected 1, 2 or 3")
    if stage == 3:
        model = [f"{engine}/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(n)]
    else:
        model = [f"{engine}/mp_rank_00_model_states.pt"]
    optim = [f"{engine}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(n)]
    return [*model, *optim]


def ddp_files(n: int) -> list[str]:
    """The files of a DDP save_state of one model, optimizer and scheduler (accelerate's
    layout, accel's extras included, the marker excluded): the writing rank's full files, and
    every rank's RNG and accel process file."""
    shared = ["model.safetensors", "optimizer.bin", "scheduler.bin"]
    per_rank = [f for r in range(n) for f in (f"random_states_{r}.pkl", f"accel_process_{r}.pt")]
    return shared + per_rank
