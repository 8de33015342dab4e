"""Shard a DataLoader across processes and resume it mid-epoch, with only torch + accel-data.

    torchrun --nproc-per-node 2 examples/data_torchrun.py
    torchrun --nproc-per-node 2 examples/data_torchrun.py --resume   # continues from the save

The first run stops in the middle of epoch 1 and saves each rank's loader position; the
second run restores it and sees exactly the samples an unbroken run would have seen.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from accel_data import prepare_data_loader

EPOCHS, STOP_AT = 3, (1, 2)  # save the position after batch 2 of epoch 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--folder", default=os.path.join(tempfile.gettempdir(), "accel-data-ex"))
    args = parser.parse_args()
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)

    dataset = TensorDataset(torch.arange(50))
    loader = prepare_data_loader(
        DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True),
        num_processes=world,
        process_index=rank,
    )
    state_file = folder / f"loader-rank{rank}.pkl"
    if args.resume:
        loader.load_state_dict(pickle.loads(state_file.read_bytes()))
        print(f"[rank {rank}] resumed at epoch {loader.iteration}", flush=True)

    for epoch in range(loader.iteration, EPOCHS):
        loader.set_epoch(epoch)  # the same shuffle on every rank, a new one each epoch
        start = loader.state_dict()["batches_yielded"]  # > 0 only in a resumed epoch
        for step, (ids,) in enumerate(loader, start=start):
            last = " (last batch)" if loader.end_of_dataloader else ""
            print(f"[rank {rank}] epoch {epoch} step {step}: {ids.tolist()}{last}", flush=True)
            if not args.resume and (epoch, step) == STOP_AT:
                state_file.write_bytes(pickle.dumps(loader.state_dict()))
                print(f"[rank {rank}] saved the position; rerun with --resume", flush=True)
                dist.destroy_process_group()
                return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
