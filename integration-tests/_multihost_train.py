"""The familiar loop on one engine, launched by test_multihost.py on separate network hosts
(`accel launch` in each host's network namespace); rank 0 writes the final weights, or every
process does where OUT names its place for the rank (`state.{rank}.pt`: test_operator_pods.py).

    python _multihost_train.py ddp|fsdp2|zero2 OUT.pt

One process of plain PyTorch on the whole global batch (`reference`) is what every launch
must equal. AdamW with an eps above every gradient element keeps the step about linear in the
gradient (see accel_testkit.tolerance), and every engine clips at CLIP (DeepSpeed's "auto"
gradient_clipping is 1.0, as accelerate's).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from torch import nn

SAMPLES, GLOBAL_BATCH, STEPS, LR, CLIP, ADAM_EPS = 64, 16, 4, 1e-2, 1.0, 1.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.hidden = nn.Linear(16, 16)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(torch.tanh(self.inp(x)))))


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def reference() -> dict[str, torch.Tensor]:
    """One process, plain PyTorch, the whole global batch each step."""
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=GLOBAL_BATCH)
    for _, (x, y) in zip(range(STEPS), loader):
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _accelerator(engine: str) -> Any:
    from accel import Accelerator
    from accel.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin

    if engine == "zero2":
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # DeepSpeed's autotuner's
        return Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    if engine == "fsdp2":
        return Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    return Accelerator(cpu=True)


def train(engine: str, out: str) -> None:
    acc = _accelerator(engine)
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, eps=ADAM_EPS)
    batch = GLOBAL_BATCH // acc.num_processes
    loader = torch.utils.data.DataLoader(dataset(), batch_size=batch)
    model, opt, loader = acc.prepare(net, opt, loader)
    for _, (x, y) in zip(range(STEPS), loader):
        acc.backward(nn.functional.mse_loss(model(x), y))
        if engine != "zero2":  # DeepSpeed clips inside its step (gradient_clipping 1.0)
            acc.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    state = {k: v.detach().float().cpu().clone() for k, v in acc.get_state_dict(model).items()}
    if acc.is_main_process or "{rank}" in out:
        torch.save(
            {
                "state": state,
                "world": acc.num_processes,
                "gloo": os.environ.get("GLOO_SOCKET_IFNAME"),
            },
            out.format(rank=acc.process_index),
        )
    acc.end_training()


if __name__ == "__main__":
    train(sys.argv[1], sys.argv[2])
