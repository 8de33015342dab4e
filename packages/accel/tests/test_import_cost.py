"""What `from accel import Accelerator` imports: the Accelerator's own modules, not the engines.

Which engine and precision a run takes is decided when an Accelerator is made, so importing the
strategy modules (DeepSpeed, FSDP2, the mesh, the pipeline, XLA, fault tolerance, Megatron's
settings) or the precision package with the class would cost every program what only some use
(issue 50: the import within 1.03x of `import torch`).
"""

from __future__ import annotations

import subprocess
import sys

DEFERRED = (
    "accel_parallel._ddp",
    "accel_parallel._deepspeed",
    "accel_parallel._deepspeed_plugin",
    "accel_parallel._dtensor_strategy",
    "accel_parallel._fault_tolerant",
    "accel_parallel._fsdp",
    "accel_parallel._fsdp_plugin",
    "accel_parallel._fsdp_sharder",
    "accel_parallel._megatron",
    "accel_parallel._mesh",
    "accel_parallel._parallelism_config",
    "accel_parallel._pipeline",
    "accel_parallel._registry",
    "accel_parallel._xla",
    "accel_parallel.fault_tolerance",
    "accel_precision",
)


def _loaded_after(code: str) -> set[str]:
    probe = f"import sys\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_importing_the_accelerator_imports_no_engine() -> None:
    loaded = _loaded_after("from accel import Accelerator")
    assert sorted(loaded & set(DEFERRED)) == []


def test_making_an_accelerator_imports_what_it_chose_and_registers_every_strategy() -> None:
    loaded = _loaded_after(
        "from accel import Accelerator\n"
        "import accel_parallel\n"
        "acc = Accelerator(cpu=True)\n"
        "assert type(acc.strategy).__name__ == 'SingleDeviceStrategy', acc.strategy\n"
        "assert 'fsdp' in accel_parallel.registered_strategies()"
    )
    assert {"accel_parallel._single", "accel_parallel._fsdp", "accel_precision"} <= loaded
