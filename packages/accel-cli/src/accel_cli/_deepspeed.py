"""Several machines through DeepSpeed's runner: the command `accel launch` builds for a
`deepspeed_hostfile`.

On one machine, and with `deepspeed_multinode_launcher: standard`, a DeepSpeed run starts like
any other (torchrun on each machine). Otherwise DeepSpeed's runner (`deepspeed.launcher.runner`)
reaches every host of the hostfile with its launcher (pdsh by default) and starts
`python -m accel_cli._deepspeed_entry CONFIG MODE TARGET ARGS` there: the entry puts the
resolved launch configuration (CONFIG, base64 JSON, carried on the command line because the
runner exports only a few environment variables to remote hosts) into the worker's
environment and becomes the program.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Sequence

from accel_cli._config import ConfigError
from accel_cli._flags import DEEPSPEED_LAUNCHERS
from accel_cli._launch_config import LaunchConfig

ENTRY_MODULE = "accel_cli._deepspeed_entry"


def _section(config: LaunchConfig) -> dict:
    if config.handed_down.get("distributed_type") != "DEEPSPEED":
        return {}
    return dict(config.handed_down.get("deepspeed_config") or {})


def uses_deepspeed_runner(config: LaunchConfig) -> bool:
    """Whether this launch goes through DeepSpeed's runner (several machines, a hostfile and
    a launcher other than 'standard'); an error for a half-specified multi-machine run."""
    if config.handed_down.get("distributed_type") != "DEEPSPEED":
        return False
    ds = _section(config)
    hostfile = ds.get("deepspeed_hostfile")
    launcher = str(ds.get("deepspeed_multinode_launcher") or "pdsh").lower()
    if launcher not in DEEPSPEED_LAUNCHERS:
        raise ConfigError(
            f"deepspeed_multinode_launcher={launcher!r}: accepted {list(DEEPSPEED_LAUNCHERS)}."
        )
    if config.num_machines == 1 or launcher == "standard":
        if hostfile and config.num_machines == 1:
            raise ConfigError(
                f"deepspeed_hostfile={hostfile!r} with num_machines=1: a hostfile starts several "
                f"machines; set --num_machines to its number of hosts, or drop the hostfile."
            )
        return False
    if not hostfile:
        raise ConfigError(
            f"num_machines={config.num_machines} with deepspeed_multinode_launcher={launcher!r} "
            f"needs --deepspeed_hostfile (lines of `host slots=N`), or use the 'standard' "
            f"launcher (torchrun on each machine)."
        )
    if not os.path.isfile(os.path.expanduser(str(hostfile))):
        raise ConfigError(f"deepspeed_hostfile {hostfile!r} does not exist.")
    return True


def deepspeed_command(
    config: LaunchConfig,
    target: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    python: str | None = None,
) -> list[str]:
    """The DeepSpeed runner's argv for `config` (which has its rendezvous filled in)."""
    python = python or sys.executable
    ds = _section(config)
    cmd = [python, "-m", "deepspeed.launcher.runner"]
    cmd += ["--hostfile", os.path.expanduser(str(ds["deepspeed_hostfile"]))]
    cmd += ["--launcher", str(ds.get("deepspeed_multinode_launcher") or "pdsh").lower()]
    if ds.get("deepspeed_inclusion_filter"):
        cmd += ["--include", str(ds["deepspeed_inclusion_filter"])]
    elif ds.get("deepspeed_exclusion_filter"):
        cmd += ["--exclude", str(ds["deepspeed_exclusion_filter"])]
    else:
        cmd += ["--num_nodes", str(config.num_machines), "--num_gpus", str(config.nproc_per_node)]
    cmd += ["--master_addr", str(config.main_process_ip)]
    cmd += ["--master_port", str(config.main_process_port), "--no_local_rank"]
    mode = "program" if config.no_python else "module" if module else "script"
    return [*cmd, "--module", ENTRY_MODULE, encode(config), mode, target, *args]


def encode(config: LaunchConfig) -> str:
    text = json.dumps(config.to_worker_dict(), sort_keys=True)
    return base64.urlsafe_b64encode(text.encode()).decode()
