"""Per-batch overhead of a prepared loader, and time to the first batch of a resumed epoch.

    uv run --frozen --group bench python tools/bench/bench_data.py [--samples N] [--repeats R]

1. Iterates the same cheap map-style dataset (a tensor per sample, default collate) through
   the raw DataLoader, accel-data's prepared loader, and accelerate's prepare_data_loader
   when importable; prints seconds per epoch and the ratio to raw (best of R, interleaved).
2. Resuming at batch 10,000: accel-data's load_state_dict (skips index batches, reads no
   sample) vs skipping by iterating the loader (what a loader without a saved position does).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

from accel_data import prepare_data_loader, skip_first_batches


class Cheap(Dataset):
    def __init__(self, n: int) -> None:
        self.data = torch.arange(n, dtype=torch.float32).reshape(n, 1).repeat(1, 8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def _epoch_seconds(loader) -> float:
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def overhead(samples: int, batch_size: int, repeats: int) -> None:
    dataset = Cheap(samples)
    loaders = {"raw DataLoader": DataLoader(dataset, batch_size=batch_size, shuffle=True)}
    loaders["accel-data"] = prepare_data_loader(
        DataLoader(dataset, batch_size=batch_size, shuffle=True),
        num_processes=1, process_index=0, data_seed=0,
    )  # fmt: skip
    try:
        from accelerate.data_loader import prepare_data_loader as hf_prepare

        loaders["accelerate"] = hf_prepare(
            DataLoader(dataset, batch_size=batch_size, shuffle=True),
            num_processes=1, process_index=0, put_on_device=False,
        )  # fmt: skip
    except ImportError:
        print("(accelerate not importable: run with --group bench to compare)")
    best = {name: float("inf") for name in loaders}
    for _ in range(repeats):  # interleaved, so drift on a shared machine hits all alike
        for name, loader in loaders.items():
            best[name] = min(best[name], _epoch_seconds(loader))
    batches = len(loaders["raw DataLoader"])
    raw = best["raw DataLoader"]
    print(f"\n{samples} samples, batch {batch_size} ({batches} batches), best of {repeats}:")
    for name, seconds in best.items():
        per = seconds / batches * 1e6
        print(f"  {name:15s} {seconds:8.4f} s/epoch  {per:7.2f} us/batch  x{seconds / raw:.3f}")


def resume(at: int, batch_size: int) -> None:
    dataset = Cheap((at + 10) * batch_size)
    make = lambda: prepare_data_loader(  # noqa: E731
        DataLoader(dataset, batch_size=batch_size, shuffle=True),
        num_processes=1, process_index=0, data_seed=0,
    )  # fmt: skip
    source = make()
    state = source.state_dict() | {"batches_yielded": at}
    start = time.perf_counter()
    restored = make()
    restored.load_state_dict(state)
    first = next(iter(restored))
    t_state = time.perf_counter() - start
    start = time.perf_counter()
    it = iter(make())
    for _ in range(at):
        next(it)
    expected = next(it)
    t_iter = time.perf_counter() - start
    assert torch.equal(first, expected)
    start = time.perf_counter()
    next(iter(skip_first_batches(make(), at)))
    t_skip = time.perf_counter() - start
    print(f"\nfirst batch when resuming at batch {at}:")
    print(f"  load_state_dict (sampler-level)    {t_state * 1e3:9.2f} ms")
    print(f"  skip_first_batches (sampler-level) {t_skip * 1e3:9.2f} ms")
    print(f"  skipping by iteration              {t_iter * 1e3:9.2f} ms  x{t_iter / t_state:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--resume-at", type=int, default=10_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    overhead(args.samples, args.batch_size, args.repeats)
    resume(args.resume_at, args.batch_size)


if __name__ == "__main__":
    main()
