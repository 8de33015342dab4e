"""What `accel launch --tpu` runs: `python -m accel_cli._xla_entry [--num_processes N]
--main_training_function F [-m] SCRIPT [ARGS...]`.

As accelerate's `tpu_launcher`: the script is imported as a module (its folder on sys.path;
its `if __name__ == "__main__":` block does not run), `sys.argv` becomes the script's, and
torch-xla's launcher calls F() once per XLA device of this host. torch-xla 2.9 starts one
process or one per device (`nprocs` 1 or None); `--num_processes` is honoured as that:
1 is one process, the host's device count (or leaving it out) is every device, and on XLA's
CPU device (`PJRT_DEVICE=CPU`) N sets `CPU_NUM_DEVICES=N`. Any other count is refused,
naming the devices there are.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accel_state.xla_env import XLAProcessCountError, xla_nprocs

INSTALL_HINT = 'pip install "accel-parallel[xla]" torch==<torch-xla\'s version, e.g. 2.9.0>'


class _Main:
    """The function each XLA process calls (picklable: the spawned processes import the
    script's module by name, from the sys.path they inherit)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self, index: int) -> None:
        self.fn()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("accel_cli._xla_entry")
    parser.add_argument("--num_processes", type=int, default=None)
    parser.add_argument("--main_training_function", default="main")
    parser.add_argument("-m", "--module", action="store_true")
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    return parser


def load_function(script: str, name: str, *, module: bool) -> tuple[Callable[[], Any], str]:
    """The script's function `name` and the module's file."""
    if module:
        mod_name = script
    else:
        path = Path(script)
        sys.path.append(str(path.parent.resolve()))
        mod_name = path.stem
    mod = importlib.import_module(mod_name)
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise SystemExit(
            f"accel launch --tpu: {script} has no function named {name!r}; define it, or pass "
            f"--main_training_function with the name of the function that trains."
        )
    return fn, str(getattr(mod, "__file__", script))


def nprocs(count: int | None, environ: dict[str, str] | os._Environ[str]) -> int | None:
    """torch-xla's `nprocs` for `--num_processes count` (accel_state.xla_env's rule, see the
    module docstring); on the CPU device, CPU_NUM_DEVICES is set in `environ`."""
    try:
        out, env = xla_nprocs(count, environ)
    except XLAProcessCountError as err:
        if err.here is not None:
            raise SystemExit(
                f"accel launch --tpu: --num_processes {count}, and torch-xla starts 1 process or "
                f"one per TPU chip of this host ({err.here} here): pass --num_processes 1 or "
                f"{err.here}, or leave it out (TPU_PROCESS_BOUNDS limits the chips torch-xla "
                f"uses)."
            ) from None
        raise SystemExit(
            f"accel launch --tpu: --num_processes {count} on PJRT_DEVICE={err.device}: torch-xla "
            f"starts 1 process or one per device; pass 1, or leave it out and set "
            f"{err.device}_NUM_DEVICES."
        ) from None
    environ.update(env)
    return out


def spawn(
    script: str,
    function: str,
    script_args: Sequence[str],
    *,
    module: bool = False,
    num_processes: int | None = None,
) -> None:
    """Import `script` (a module's name with `module`), make `sys.argv` the script's, and
    call its `function` once per XLA device through torch-xla's launcher."""
    try:
        import torch_xla.distributed.xla_multiprocessing as xmp
    except ImportError as error:
        raise SystemExit(
            f"accel launch --tpu needs torch-xla ({error}); install it with: {INSTALL_HINT}"
        ) from None
    count = nprocs(num_processes, os.environ)
    fn, file = load_function(script, function, module=module)
    sys.argv = [file, *script_args]
    xmp.spawn(_Main(fn), nprocs=count)


def main(argv: Sequence[str]) -> None:
    args = _parser().parse_args(list(argv))
    spawn(
        args.script,
        args.main_training_function,
        args.script_args,
        module=args.module,
        num_processes=args.num_processes,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
