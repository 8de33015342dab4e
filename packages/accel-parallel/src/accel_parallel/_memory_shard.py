"""FSDP2's sharding of a parameter at the cost of one shard, not of the world size.

`fully_shard` splits each parameter into one chunk per rank (`torch.chunk`, padded with empty
tensors to the world size) and keeps the chunk of its own rank and the size of chunk 0 (the
padded size every rank all-gathers). Under a fake process group of N ranks that is N fake
views per parameter, twice, and it dominated the traced estimate: a 2-layer Llama spent
12 s of the 14 s of its two FSDP2 traces there at N = 1024. While `sharding_by_index` is
active, FSDP2 gets a sequence that makes a chunk only when indexed: the same narrow view of
the same rows (`torch.chunk`'s rule: ceil(dim / N) rows per chunk, the last ones short or
empty), so the traced step, and the estimate, are the same to the byte
(tests/test_memory_shard.py compares them with torch's own chunking); only the cost no
longer grows with N.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch


class _Chunks(Sequence):
    """`torch.chunk(tensor, count, dim)` padded with empty tensors to `count`, each chunk
    made when indexed."""

    def __init__(self, tensor: torch.Tensor, count: int, dim: int) -> None:
        self.tensor, self.count, self.dim = tensor, count, dim
        size = tensor.size(dim)
        self.step = -(-size // count)  # torch.chunk's split size
        self.made = -(-size // self.step)  # how many chunks torch.chunk returns

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if index < 0:
            index += self.count
        if not 0 <= index < self.count:
            raise IndexError(f"chunk {index} of {self.count}")
        if index >= self.made:  # as FSDP2 pads: an empty tensor like chunk 0
            return self[0].new_empty(0)
        start = index * self.step
        length = min(self.step, self.tensor.size(self.dim) - start)
        return self.tensor.narrow(self.dim, start, length)


def _by_index(original: Callable[..., list]) -> Callable[..., Sequence]:
    def chunk(tensor: torch.Tensor, num_chunks: int, dim: int) -> Sequence:
        if tensor.dim() == 0 or tensor.size(dim) == 0:  # torch.chunk's edge cases: its own
            return original(tensor, num_chunks, dim)
        return _Chunks(tensor, num_chunks, dim)

    return chunk


@contextlib.contextmanager
def sharding_by_index() -> Iterator[None]:
    """FSDP2's parameter sharding makes only the chunks it indexes, for the duration (applied
    around `fully_shard` in the traced estimate, never in training)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = _by_index(original)
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original
