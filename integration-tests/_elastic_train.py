"""DDP training that an elastic launch may shrink or grow: every start resumes from the newest
complete checkpoint on whatever number of processes the rendezvous formed. Run by
test_elastic.py through `accel launch`.

    python _elastic_train.py PROJECT [--stop_after STEP] [--hold WORLD:STEP ...]
    python _elastic_train.py PROJECT --planned WORLD:STEP ... (see `planned`)

Each start writes PROJECT/starts/<pid>.json: the checkpoint it resumed from, the step, the
world size. --stop_after: return after saving the checkpoint of that step (one part of a run
that changes its number of processes on purpose). --hold WORLD:STEP: on WORLD processes,
wait after saving the checkpoint of STEP (STEP 0: before the first one), so that the test
changes the membership at a known step. Several processes keep meeting (a barrier every few milliseconds) until one of
them is gone, which fails the survivors; one process waits until it is asked to stop (the
agent's SIGTERM when a node joins).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from _resumable_train import prepare_and_resume  # the same model, data and Progress
from torch import nn

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed

SAVE_EVERY = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train(project: Path, stop_after: int = -1, hold: Sequence[str] = ()) -> None:
    set_seed(0)
    acc = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(
            project_dir=str(project), automatic_checkpoint_naming=True, fsync=False
        ),
    )
    model, opt, loader, progress, resumed = prepare_and_resume(acc)
    world = acc.num_processes
    holds = {int(s) for w, s in (h.split(":") for h in hold) if int(w) == world}
    start = {"resumed": resumed, "step": progress.step, "world": world, "rank": acc.process_index}
    (project / "starts").mkdir(parents=True, exist_ok=True)
    (project / "starts" / f"{os.getpid()}.json").write_text(json.dumps(start))

    def hold_here() -> bool:
        """Wait while this step is held; True when asked to stop."""
        while progress.step in holds:
            if world > 1:
                acc.wait_for_everyone()
            elif acc.should_stop():
                return True
            time.sleep(0.05)
        return False

    if hold_here():
        return
    while progress.epoch < 2:
        for x, y in loader:
            acc.backward(nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
            progress.step += 1
            if progress.step % SAVE_EVERY == 0:
                acc.save_state()
                if progress.step == stop_after:
                    return
            if hold_here():
                return
        progress.epoch += 1
    acc.save_model(model, project / "final")
    if acc.is_main_process:
        (project / "done.json").write_text(json.dumps({"world": world, "step": progress.step}))


def planned(project: Path, parts: Sequence[str]) -> None:
    """Train with the number of processes changing on purpose: each part "N:STEP" (STEP -1:
    to the end) runs N processes, forked from this one (torch is imported once), with the
    variables torchrun would set, and resumes from the previous part's checkpoint."""
    import torch._dynamo  # noqa: F401  (every optimizer imports it: once, before forking)

    for part in parts:
        world, stop_after = (int(v) for v in part.split(":"))
        port = free_port()
        children = []
        for rank in range(world):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.environ.update(
                        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                        LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port),
                    )  # fmt: skip
                    train(project, stop_after)
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        deadline = time.monotonic() + 120
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if time.monotonic() > deadline:
                    for child in children:
                        os.kill(child, signal.SIGKILL)
                    raise SystemExit(f"part {part}: timed out")
                time.sleep(0.05)
                continue
            children.remove(pid)
            if os.waitstatus_to_exitcode(status) != 0:
                for child in children:
                    os.kill(child, signal.SIGKILL)
                raise SystemExit(f"part {part}: a process failed ({status})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("project")
    parser.add_argument("--stop_after", type=int, default=-1)
    parser.add_argument("--hold", action="append", default=[])
    parser.add_argument("--planned", nargs="+", default=[])
    args = parser.parse_args()
    if args.planned:
        planned(Path(args.project), args.planned)
    else:
        train(Path(args.project), args.stop_after, args.hold)


if __name__ == "__main__":
    main()
