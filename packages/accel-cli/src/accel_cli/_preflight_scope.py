"""Where the preflight cannot run, and what `accel launch` says then.

The preflight meets one `accel launch` per machine before torchrun's rendezvous. DeepSpeed's
multi-node runner and mpirun start every machine from this one, torch-xla's launcher has no
rendezvous of torchrun's, and a one-process run none at all: an explicit --preflight there is
an error that names the launcher and the fix; the default one (several machines) a one-line note.
"""

from __future__ import annotations

import dataclasses

from accel_cli._launch_config import LaunchConfig


@dataclasses.dataclass(frozen=True)
class Unavailable:
    """Why the preflight cannot run under a launcher: the launcher's name, the reason, and
    the fix, worded for an explicit --preflight (an error) and for the default (a note)."""

    launcher: str
    why: str
    fix: str

    def error(self) -> str:
        return f"--preflight cannot run under {self.launcher}: {self.why}. {self.fix}"

    def note(self) -> str:
        return f"not run under {self.launcher} ({self.why})"


# `accel launch --tpu`: torch-xla's launcher, one host, no rendezvous of torchrun's.
UNDER_TPU = Unavailable(
    "torch-xla's launcher (--tpu)",
    "it starts this host's XLA processes without a torchrun rendezvous to check",
    "Drop --preflight (or pass --no_preflight).",
)


def unavailable(config: LaunchConfig, *, deepspeed_runner: bool) -> Unavailable | None:
    """Why the preflight cannot check this launch (None: it can, through torchrun). It meets
    one `accel launch` per machine before torchrun's rendezvous; the other launchers start
    every machine from this one, or have no rendezvous at all."""
    drop = "Drop --preflight (or pass --no_preflight)"
    if deepspeed_runner:
        return Unavailable(
            "DeepSpeed's multi-node runner (deepspeed_hostfile with a "
            "deepspeed_multinode_launcher other than 'standard')",
            "it starts every machine's workers from this one, so no accel launch runs on the "
            "others to meet",
            f"{drop}, or set deepspeed_multinode_launcher: standard and run accel launch on "
            f"each machine (torchrun, which the preflight checks).",
        )
    if config.mpirun_hostfile is not None:
        return Unavailable(
            "mpirun (mpirun_hostfile)",
            "mpirun starts every machine's processes from this one, so no accel launch runs "
            "on the others to meet",
            f"{drop}, or leave out mpirun_hostfile and run accel launch on each machine "
            f"(torchrun, which the preflight checks).",
        )
    if not config.distributed:
        return Unavailable(
            "a one-process run (the script is started directly, without torchrun)",
            "there is no rendezvous to check",
            f"{drop}, or start several processes (--num_processes N, --multi_gpu).",
        )
    return None
