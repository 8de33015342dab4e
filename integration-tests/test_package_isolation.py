"""Each package imported alone, in a fresh interpreter, pulls in only what DESIGN.md allows.

Importing must not pull a sibling package that DESIGN.md does not allow, nor any optional
library, nor change os.environ, initialize CUDA, or create a process group.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SIBLINGS = {
    "accel_state",
    "accel_data",
    "accel_precision",
    "accel_parallel",
    "accel_bigmodel",
    "accel_tracking",
    "accel_cli",
    "accel",
}
ALLOWED_SIBLINGS = {
    "accel_state": set(),
    "accel_data": set(),
    "accel_precision": set(),
    "accel_parallel": {"accel_state"},
    "accel_bigmodel": set(),
    "accel_tracking": set(),
    "accel_cli": set(),  # accel-state only inside the commands that need it
    "accel": SIBLINGS - {"accel"},
}
OPTIONAL = ["deepspeed", "transformer_engine", "torchao", "tensorboard", "wandb", "mlflow"]
OPTIONAL += ["matplotlib", "yaml", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio"]

PROBE = r"""
import json, os, sys
before = dict(os.environ)
import {name}
import torch
import torch.distributed as dist
print(json.dumps({{
    "modules": sorted({{m.split(".")[0] for m in sys.modules}}),
    "env_changed": sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)),
    "cuda_initialized": torch.cuda.is_initialized(),
    "process_group": dist.is_available() and dist.is_initialized(),
}}))
"""


def _probe_all() -> dict[str, dict]:
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", PROBE.format(name=name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in sorted(ALLOWED_SIBLINGS)
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"import {name} failed:\n{stderr}"
        out[name] = json.loads(stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    return _probe_all()


@pytest.mark.parametrize("name", sorted(ALLOWED_SIBLINGS))
def test_import_pulls_only_allowed_packages(name: str, probes: dict[str, dict]) -> None:
    result = probes[name]
    modules = set(result["modules"])
    siblings = (modules & SIBLINGS) - {name}
    assert siblings <= ALLOWED_SIBLINGS[name], (
        f"import {name} pulled siblings {sorted(siblings - ALLOWED_SIBLINGS[name])} that "
        f"DESIGN.md does not allow"
    )
    optional = sorted(modules & set(OPTIONAL))
    assert not optional, f"import {name} imported optional libraries {optional} at import time"
    assert result["env_changed"] == [], f"import {name} changed os.environ: {result['env_changed']}"
    assert not result["cuda_initialized"], f"import {name} initialized CUDA"
    assert not result["process_group"], f"import {name} created a process group"
