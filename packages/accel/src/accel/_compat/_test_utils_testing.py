"""Test helpers with accelerate's `test_utils.testing` names: skip decorators built from the
`is_*_available` probes, the device the tests run on, launch commands for `accel launch`,
subprocess runners, and TestCase bases that reset accel's state."""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from accel._compat import _imports as probes
from accel._compat._environment import parse_flag_from_env
from accel._compat._versions import compare_versions, is_torch_version

# Set to a true value to run the tests marked `@slow`.
ENV_RUN_SLOW = "RUN_SLOW"


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """(device type, how many of them, the function giving the bytes allocated on the current
    one) for the accelerator tests run on: CUDA, MPS, XPU, else the CPU (one, 0 bytes)."""
    if probes.is_cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if probes.is_mps_available():
        return "mps", 1, torch.mps.current_allocated_memory
    if probes.is_xpu_available():
        return "xpu", torch.xpu.device_count(), torch.xpu.memory_allocated
    return "cpu", 1, lambda: 0


torch_device, device_count, memory_allocated_func = get_backend()


def get_launch_command(**kwargs: Any) -> list[str]:
    """``["accel", "launch", ...]`` with ``--key=value`` per keyword (``--key`` for True; None
    and False are left out), ready for `execute_subprocess_async`."""
    command = ["accel", "launch"]
    for key, value in kwargs.items():
        if value is True:
            command.append(f"--{key}")
        elif value is not None and value is not False:
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def _skip_unless(condition: bool, reason: str) -> Callable[[Any], Any]:
    def decorate(test_case: Any) -> Any:
        return unittest.skipUnless(condition, reason)(test_case)

    return decorate


def skip(test_case: Any) -> Any:
    """Skip the test unconditionally."""
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case: Any) -> Any:
    """Skip the test unless RUN_SLOW is set to a true value."""
    return unittest.skipUnless(parse_flag_from_env(ENV_RUN_SLOW), "test is slow")(test_case)


def require_cpu(test_case: Any) -> Any:
    """Run only where no accelerator is available."""
    return _skip_unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case: Any) -> Any:
    """Run only where an accelerator (GPU, XPU, MPS) is available."""
    return _skip_unless(torch_device != "cpu", "test requires a GPU")(test_case)


def require_single_device(test_case: Any) -> Any:
    return _skip_unless(
        torch_device != "cpu" and device_count == 1, "test requires a single device accelerator"
    )(test_case)


def require_multi_device(test_case: Any) -> Any:
    return _skip_unless(device_count > 1, "test requires multiple hardware accelerators")(test_case)


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _xpu_count() -> int:
    return torch.xpu.device_count() if probes.is_xpu_available() else 0


def require_single_gpu(test_case: Any) -> Any:
    return _skip_unless(_cuda_count() == 1, "test requires a GPU")(test_case)


def require_multi_gpu(test_case: Any) -> Any:
    return _skip_unless(_cuda_count() > 1, "test requires multiple GPUs")(test_case)


def require_single_xpu(test_case: Any) -> Any:
    return _skip_unless(_xpu_count() == 1, "test requires a XPU")(test_case)


def require_multi_xpu(test_case: Any) -> Any:
    return _skip_unless(_xpu_count() > 1, "test requires multiple XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case: Any) -> Any:
    return _skip_unless(
        _cuda_count() > 1 or _xpu_count() > 1, "test requires multiple GPUs or XPUs"
    )(test_case)


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Run only with torch >= `version`; usable bare or as ``@require_torch_min_version(version=...)``."""
    if version is None:
        raise ValueError("require_torch_min_version needs version='X.Y' (the minimum torch).")
    if test_case is None:
        return functools.partial(require_torch_min_version, version=version)
    return _skip_unless(is_torch_version(">=", version), f"test requires torch >= {version}")(
        test_case
    )


def require_tp(test_case: Any) -> Any:
    ok = (
        is_torch_version(">=", "2.3.0")
        and probes.is_transformers_available()
        and compare_versions("transformers", ">=", "4.52.0")
    )
    return _skip_unless(ok, "test requires torch >= 2.3.0 and transformers >= 4.52.0")(test_case)


def require_fsdp2(test_case: Any) -> Any:
    return require_torch_min_version(test_case, version="2.5.0")


def require_fp8(test_case: Any) -> Any:
    ok = probes.is_fp8_available() and torch.cuda.is_available()
    return _skip_unless(ok, "test requires an fp8 backend (TransformerEngine or torchao) on a GPU")(
        test_case
    )


def require_huggingface_suite(test_case: Any) -> Any:
    ok = probes.is_transformers_available() and probes.is_datasets_available()
    return _skip_unless(ok, "test requires the transformers and datasets libraries")(test_case)


def require_trackers(test_case: Any) -> Any:
    """Run only when some experiment tracker besides the built-in JSONL one is installed."""
    from accel_tracking import available_trackers

    ok = any(name != "jsonl" for name in available_trackers())
    return _skip_unless(ok, "test requires at least one tracker to be available")(test_case)


def _requirement(condition: Callable[[], bool], reason: str) -> Callable[[Any], Any]:
    """A skip decorator that runs the test only when `condition()` holds."""

    def decorate(test_case: Any) -> Any:
        return _skip_unless(condition(), reason)(test_case)

    return decorate


def _cuda() -> bool:
    return probes.is_cuda_available()


# Decorators that check one condition: name -> (condition, what the skip says is missing).
_SIMPLE: dict[str, tuple[Callable[[], bool], str]] = {
    "require_cuda": (_cuda, "a CUDA GPU"),
    "require_cuda_or_hpu": (lambda: _cuda() or probes.is_hpu_available(), "a GPU or HPU"),
    "require_cuda_or_xpu": (lambda: _cuda() or probes.is_xpu_available(), "a GPU or XPU"),
    "require_xpu": (probes.is_xpu_available, "an XPU"),
    "require_non_xpu": (lambda: torch_device != "xpu", "a device other than XPU"),
    "require_non_hpu": (lambda: torch_device != "hpu", "a device other than HPU"),
    "require_mps": (probes.is_mps_available, "an MPS device"),
    "require_mlu": (probes.is_mlu_available, "an MLU"),
    "require_sdaa": (probes.is_sdaa_available, "an SDAA"),
    "require_musa": (probes.is_musa_available, "a MUSA device"),
    "require_npu": (probes.is_npu_available, "an NPU"),
    "require_neuron": (probes.is_neuron_available, "a Neuron device"),
    "require_tpu": (lambda: probes.is_torch_xla_available(check_is_tpu=True), "a TPU"),
    "require_non_torch_xla": (lambda: not probes.is_torch_xla_available(), "no torch_xla"),
    "require_fp16": (probes.is_fp16_available, "fp16 support"),
    "require_peft": (probes.is_peft_available, "peft"),
    "require_datasets": (probes.is_datasets_available, "datasets"),
    "require_transformers": (probes.is_transformers_available, "transformers"),
    "require_timm": (probes.is_timm_available, "timm"),
    "require_torchvision": (probes.is_torchvision_available, "torchvision"),
    "require_triton": (probes.is_triton_available, "triton"),
    "require_schedulefree": (probes.is_schedulefree_available, "schedulefree"),
    "require_bnb": (probes.is_bnb_available, "bitsandbytes"),
    "require_deepspeed": (probes.is_deepspeed_available, "DeepSpeed"),
    "require_tensorboard": (probes.is_tensorboard_available, "tensorboard"),
    "require_wandb": (probes.is_wandb_available, "wandb"),
    "require_trackio": (probes.is_trackio_available, "trackio"),
    "require_comet_ml": (probes.is_comet_ml_available, "comet_ml"),
    "require_aim": (probes.is_aim_available, "aim"),
    "require_clearml": (probes.is_clearml_available, "clearml"),
    "require_dvclive": (probes.is_dvclive_available, "dvclive"),
    "require_swanlab": (probes.is_swanlab_available, "swanlab"),
    "require_pandas": (probes.is_pandas_available, "pandas"),
    "require_mlflow": (probes.is_mlflow_available, "mlflow"),
    "require_matplotlib": (probes.is_matplotlib_available, "matplotlib"),
    "require_pippy": (probes.is_pippy_available, "torch.distributed.pipelining"),
    "require_import_timer": (probes.is_import_timer_available, "import_timer"),
    "require_transformer_engine": (probes.is_transformer_engine_available, "TransformerEngine"),
    "require_transformer_engine_mxfp8": (
        probes.is_transformer_engine_mxfp8_available,
        "TransformerEngine with MXFP8",
    ),
    "require_torchao": (probes.is_torchao_available, "torchao"),
    "require_torchdata_stateful_dataloader": (
        probes.is_torchdata_stateful_dataloader_available,
        "torchdata's StatefulDataLoader",
    ),
}
for _name, (_condition, _needs) in _SIMPLE.items():
    _decorator = _requirement(_condition, f"test requires {_needs}")
    _decorator.__name__ = _decorator.__qualname__ = _name
    _decorator.__doc__ = f"Skip the test unless it has {_needs}."
    globals()[_name] = _decorator
del _name, _condition, _needs, _decorator


def run_first(test_case: Any) -> Any:
    """Mark the test to run first when pytest-order is installed (`pytest.mark.order(1)`)."""
    if probes.is_pytest_available():
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case


class TempDirTestCase(unittest.TestCase):
    """One temporary directory per TestCase class (`self.tmpdir`, a Path), emptied before each
    test when `clear_on_setup` and removed after the last one."""

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self) -> None:
        if self.clear_on_setup:
            for path in list(self.tmpdir.iterdir()):
                shutil.rmtree(path) if path.is_dir() else path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """Resets the accelerator and gradient state after each test, so no test sees another's."""

    def tearDown(self) -> None:
        super().tearDown()
        from accel._accelerator_state import AcceleratorState
        from accel._gradient_state import GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


class MockingTestCase(unittest.TestCase):
    """`add_mocks(...)` (called at the end of `setUp`) starts mocks that stop after each test."""

    def add_mocks(self, mocks: Any) -> None:
        self.mocks = list(mocks) if isinstance(mocks, (tuple, list)) else [mocks]
        for mock in self.mocks:
            mock.start()
            self.addCleanup(mock.stop)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """True when every process holds the same `tensor` (gathered and compared)."""
    from accel_state import PartialState, gather

    local = tensor[None].clone().to(PartialState().device)
    everyone = gather(local).cpu()
    return all(torch.equal(row, local[0].cpu()) for row in everyone)


class _RunOutput:
    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class SubprocessCallException(Exception):
    """`run_command`'s command failed; the message holds its output."""


def execute_subprocess_async(
    cmd: list[Any],
    env: dict[str, str] | None = None,
    stdin: Any = None,
    timeout: float | None = 180,
    quiet: bool = False,
    echo: bool = True,
) -> _RunOutput:
    """Run `cmd` (Paths allowed) to completion, echoing its output unless `quiet`; returns its
    return code and output lines. A non-zero exit raises RuntimeError holding its stderr."""
    cmd = [str(c) for c in cmd]
    if echo:
        print("\nRunning: ", " ".join(cmd))
    done = subprocess.run(
        cmd, env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    out, err = done.stdout.splitlines(), done.stderr.splitlines()
    if not quiet:
        for line in out:
            print("stdout:", line)
        for line in err:
            print("stderr:", line, file=sys.stderr)
    if done.returncode > 0:
        raise RuntimeError(
            f"'{' '.join(cmd)}' failed with returncode {done.returncode}\n\n"
            f"The combined stderr from workers follows:\n" + "\n".join(err)
        )
    return _RunOutput(done.returncode, out, err)


def run_command(
    command: list[Any], return_stdout: bool = False, env: dict[str, str] | None = None
) -> str | None:
    """Run `command`; its output when `return_stdout`. Failure raises SubprocessCallException."""
    command = [str(c) for c in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT, env=env)
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(
            f"Command `{' '.join(command)}` failed with the following error:\n\n"
            f"{error.output.decode()}"
        ) from error
    return output.decode("utf-8") if return_stdout else None


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (0 without xdist)."""
    return int(re.sub(r"^gw", "", os.environ.get("PYTEST_XDIST_WORKER", "gw0")))


def get_torch_dist_unique_port() -> int:
    """29500 plus the xdist worker's number, so concurrent workers use different ports."""
    return 29500 + pytest_xdist_worker_id()


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed `accel` package's directory."""
    import accel

    return Path(inspect.getfile(accel)).parent.joinpath(*components)


@contextlib.contextmanager
def assert_exception(
    exception_class: type[BaseException], msg: str | None = None
) -> Iterator[None]:
    """The block must raise `exception_class` (with `msg` in its message when given)."""
    try:
        yield
    except Exception as error:
        assert isinstance(error, exception_class), (
            f"Expected exception of type {exception_class} but got {type(error)}"
        )
        if msg is not None:
            assert msg in str(error), (
                f"Expected message '{msg}' to be in exception but got '{error}'"
            )
        return
    raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """What `func(*args, **kwargs)` printed to stdout."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        func(*args, **kwargs)
    return buffer.getvalue()
