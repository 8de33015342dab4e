"""What the XLA tests share: the skip where XLA's CPU device is absent, a small model, its data,
and the eager CPU loop that is the reference.

The tests run on torch-xla's CPU backend (``PJRT_DEVICE=CPU``; ``CPU_NUM_DEVICES`` virtual
devices for SPMD): a real XLA device (lazy tensors, compiled graphs, transfers that must
happen) on a machine without a TPU. CI's torch-xla lane sets the variables (.ci/run).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest
import torch
from torch import nn

from accel_testkit.tolerance import float32_error, norm_terms

STEPS, ACCUMULATE, BATCH, CLIP, LR = 3, 2, 8, 0.3, 0.1
SAMPLES = STEPS * ACCUMULATE * BATCH


def xla_cpu_reason() -> str | None:
    """Why the XLA tests cannot run here (None: they can)."""
    if importlib.util.find_spec("torch_xla") is None:
        return 'torch-xla is not installed (pip install "accel-parallel[xla]"; .ci/run\'s XLA lane)'
    if os.environ.get("PJRT_DEVICE") != "CPU":
        return "runs on XLA's CPU device: set PJRT_DEVICE=CPU (CI's torch-xla lane does)"
    return None


skip_without_xla_cpu = pytest.mark.skipif(
    xla_cpu_reason() is not None, reason=str(xla_cpu_reason())
)


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


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 8, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def loader(batch: int = BATCH) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(), batch_size=batch)


def eager_reference() -> dict[str, Any]:
    """Plain PyTorch on the CPU: ACCUMULATE micro-batches per step, the loss divided by
    ACCUMULATE, clipped to CLIP, one SGD step."""
    model = make_net()
    opt = make_optimizer(model)
    norms, losses = [], []
    for i, (x, y) in enumerate(loader()):
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(float(loss.detach()))
        (loss / ACCUMULATE).backward()
        if (i + 1) % ACCUMULATE == 0:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
            opt.step()
            opt.zero_grad()
    return {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "norms": norms, "losses": losses}  # fmt: skip


def train_accelerated(accelerator: Any) -> dict[str, Any]:
    """The same loop written for accel: accumulate, backward, clip, step."""
    model, opt = make_net(), None
    opt = make_optimizer(model)
    model, opt, data = accelerator.prepare(model, opt, loader())
    norms, losses, devices = [], [], set()
    for x, y in data:
        devices.add(x.device.type)
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), y)
            losses.append(float(loss.detach()))
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), CLIP)))
            opt.step()
            opt.zero_grad()
    state = accelerator.get_state_dict(model)
    return {"state": state, "norms": norms, "losses": losses, "devices": devices,
            "model": model, "optimizer": opt, "loader": data}  # fmt: skip


# Why the tolerance is what it is (accel_testkit.tolerance): XLA compiles the step into other
# kernels than eager CPU (fused, other summation orders), so the two differ by float32
# rounding alone: float32_error of one step's clipped gradients of Net (3 linear layers, sums
# of at most 16 terms), and STEPS steps of SGD (linear in the gradient) add STEPS of them. A
# gradient reduced twice, a lost micro-batch or a wrong clip is off by 0.1 or more.
BOUND = STEPS * float32_error(3, 16, norm_terms(make_net().parameters()))
