"""The script `accel test` launches on every process (run as a script, never imported).

Each part runs in turn and its result goes to `<out>/rank<N>.json` as soon as it is known, so
a part that crashes or hangs still leaves the earlier results behind. A part passes on a
process when its check holds there; `accel test` reads every process's file.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path(sys.argv[1])
RESULTS: dict[str, dict[str, Any]] = {}
RANK = int(os.environ.get("RANK", "0"))
STEPS_DATA = 64  # samples; every process sees 4 per step


def record(part: str, status: str, detail: str) -> None:
    RESULTS[part] = {"status": status, "detail": detail}
    tmp = OUT / f".rank{RANK}.json.tmp"
    tmp.write_text(json.dumps({"rank": RANK, "parts": RESULTS}))
    os.replace(tmp, OUT / f"rank{RANK}.json")


def run(part: str, check: Callable[[], str]) -> bool:
    try:
        detail = check()
    except Exception as err:
        traceback.print_exc()
        record(part, "fail", f"{type(err).__name__}: {err}")
        return False
    record(part, "pass", detail)
    return True


def start() -> str:
    from accel_state import PartialState

    state = PartialState()
    return f"{state.num_processes} processes, backend {state.backend}, device {state.device.type}"


def collectives() -> str:
    import torch

    from accel_state import PartialState, broadcast, gather, gather_object, reduce

    state = PartialState()
    n, r = state.num_processes, state.process_index
    mine = torch.tensor([float(r + 1)], device=state.device)
    total = reduce(mine, "sum").item()
    assert total == n * (n + 1) / 2, f"all_reduce sum gave {total}, expected {n * (n + 1) / 2}"
    rows = gather(mine).tolist()
    assert rows == [float(i + 1) for i in range(n)], f"all_gather gave {rows}"
    sent = broadcast(torch.tensor([float(10 * r + 7)], device=state.device), from_process=0)
    assert sent.item() == 7.0, f"broadcast from rank 0 gave {sent.item()} on rank {r}"
    ranks = [o["rank"] for o in gather_object({"rank": r})]
    assert ranks == list(range(n)), f"gather_object gave ranks {ranks}"
    state.wait_for_everyone()
    return "all_reduce, all_gather, broadcast, gather_object, barrier"


class Training:
    """A small regression trained with the Accelerator and, alongside, by plain PyTorch on
    the whole global batch of every step: one process doing what all of them did."""

    def __init__(self) -> None:
        import torch

        from accel import Accelerator

        self.torch = torch
        self.acc = Accelerator()
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(STEPS_DATA, 4, generator=gen)
        self.y = self.x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.reference = copy.deepcopy(model).to(self.acc.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.ref_opt = torch.optim.SGD(self.reference.parameters(), lr=0.05, momentum=0.9)
        data = torch.utils.data.TensorDataset(torch.arange(STEPS_DATA), self.x, self.y)
        loader = torch.utils.data.DataLoader(data, batch_size=4)
        self.model, self.opt, self.loader = self.acc.prepare(model, opt, loader)
        mixed = self.acc.mixed_precision != "no"
        self.tolerance = 2e-2 if mixed else 1e-5

    def step(self, x: Any, y: Any) -> None:
        loss = self.torch.nn.functional.mse_loss(self.model(x), y)
        self.acc.backward(loss)
        self.opt.step()
        self.opt.zero_grad()

    def params(self) -> list[Any]:
        return [
            p.detach().float().cpu().clone() for p in self.acc.unwrap_model(self.model).parameters()
        ]

    def run(self) -> str:
        steps, worst = 0, 0.0
        for idx, x, y in self.loader:
            self.step(x, y)
            every = self.acc.gather(idx).cpu()  # the global batch of this step
            if not self.acc.optimizer_step_was_skipped:
                device = self.acc.device
                with self.acc.autocast():
                    out = self.reference(self.x[every].to(device))
                ref_loss = self.torch.nn.functional.mse_loss(out, self.y[every].to(device))
                ref_loss.backward()
                self.ref_opt.step()
                self.ref_opt.zero_grad()
            steps += 1
        for mine, ref in zip(self.params(), self.reference.parameters()):
            diff = (mine - ref.detach().float().cpu()).abs().max().item()
            scale = 1.0 + ref.detach().abs().max().item()
            worst = max(worst, diff)
            assert diff <= self.tolerance * scale, (
                f"after {steps} steps a parameter differs from the 1-process reference by "
                f"{diff:.3g} (tolerance {self.tolerance * scale:.3g})"
            )
        return f"{steps} steps, largest difference {worst:.2g}"

    def checkpoint(self) -> str:
        folder = OUT / "checkpoint"
        self.acc.save_state(folder)
        saved = self.params()
        saved_opt = copy.deepcopy(self.opt.state_dict())
        x, y = self.x[:4].to(self.acc.device), self.y[:4].to(self.acc.device)
        self.step(x, y)
        after = self.params()
        assert any(not a.equal(b) for a, b in zip(after, saved)), "a step changed no weight"
        self.acc.load_state(folder)
        restored = self.params()
        for a, b in zip(restored, saved):
            assert a.equal(b), "the weights loaded back differ from those saved"
        _same_state(self.opt.state_dict(), saved_opt)
        self.step(x, y)
        for a, b in zip(self.params(), after):
            assert self.torch.allclose(a, b, rtol=0, atol=1e-6), (
                "the step after loading differs from the same step before saving"
            )
        return "save_state, load_state: weights and optimizer state restored, next step equal"


def _same_state(a: Any, b: Any) -> None:
    import torch

    if isinstance(a, torch.Tensor):
        assert torch.equal(a.cpu(), b.cpu()), "the optimizer state loaded back differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"optimizer state keys {sorted(a)} != {sorted(b)}"
        for key in a:
            _same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), "optimizer state lengths differ"
        for x, y in zip(a, b):
            _same_state(x, y)
    else:
        assert a == b, f"optimizer setting {a!r} != {b!r}"


def main() -> int:
    failed = not run("start", start)
    failed |= not run("collectives", collectives)
    if importlib.util.find_spec("accel") is None:
        for part in ("training", "checkpoint"):
            record(part, "skip", "accel is not installed (pip install accel)")
    else:
        training: list[Training] = []

        def train() -> str:
            training.append(Training())
            return training[0].run()

        if run("training", train):
            failed |= not run("checkpoint", training[0].checkpoint)
        else:
            failed = True
            record("checkpoint", "skip", "not run: training failed")
    from accel_state import PartialState

    PartialState().destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
