"""accel.test_utils: accelerate's test helpers under accel's names, driving accel."""

import os
import unittest

import pytest
import torch

import accel
import accel.test_utils as tu
from accel.test_utils import testing, training
from accel.utils import is_deepspeed_available

# The helpers downstream tests import from accelerate.test_utils (its __init__).
INIT_NAMES = [
    "DEFAULT_LAUNCH_COMMAND", "RegressionDataset", "RegressionModel", "are_the_same_tensors",
    "assert_exception", "capture_call_output", "device_count", "execute_subprocess_async",
    "get_launch_command", "get_torch_dist_unique_port", "memory_allocated_func",
    "path_in_accelerate_package", "pytest_xdist_worker_id", "require_bnb", "require_cpu",
    "require_cuda", "require_cuda_or_hpu", "require_cuda_or_xpu", "require_fp16", "require_fp8",
    "require_huggingface_suite", "require_mlu", "require_mps", "require_multi_device",
    "require_multi_gpu", "require_multi_gpu_or_xpu", "require_multi_xpu", "require_musa",
    "require_non_cpu", "require_non_hpu", "require_non_torch_xla", "require_non_xpu",
    "require_npu", "require_pippy", "require_sdaa", "require_single_device", "require_single_gpu",
    "require_single_xpu", "require_torch_min_version", "require_torchao", "require_torchvision",
    "require_tpu", "require_transformer_engine", "require_transformer_engine_mxfp8",
    "require_xpu", "run_first", "skip", "slow", "torch_device",
]  # fmt: skip
TESTING_EXTRA = [
    "AccelerateTestCase", "MockingTestCase", "TempDirTestCase", "get_backend", "require_deepspeed",
    "require_peft", "require_transformers", "require_tensorboard", "require_wandb", "require_mlflow",
    "require_trackers", "require_tp", "require_fsdp2", "run_command", "SubprocessCallException",
]  # fmt: skip


def test_names_exist():
    assert sorted(tu.__all__) == sorted(INIT_NAMES)
    for name in INIT_NAMES:
        assert getattr(tu, name) is not None
    for name in TESTING_EXTRA:
        assert getattr(testing, name) is not None
    assert training.RegressionModel is tu.RegressionModel


def _outcome(decorated) -> str:
    class Case(unittest.TestCase):
        @decorated
        def test_it(self):
            pass

    result = unittest.TestResult()
    Case("test_it").run(result)
    return "skipped" if result.skipped else "ran"


def test_decorators_skip_by_the_machine_and_the_installed_libraries():
    on_cpu = not torch.cuda.is_available()
    assert _outcome(tu.require_cpu) == ("ran" if tu.torch_device == "cpu" else "skipped")
    assert _outcome(tu.require_non_cpu) == ("skipped" if tu.torch_device == "cpu" else "ran")
    if on_cpu:
        assert _outcome(tu.require_cuda) == "skipped"
        assert _outcome(tu.require_multi_gpu) == "skipped"
    assert _outcome(tu.skip) == "skipped"
    assert _outcome(tu.require_non_torch_xla) == "ran"
    assert _outcome(tu.require_torch_min_version(version="1.0")) == "ran"
    assert _outcome(tu.require_torch_min_version(version="999.0")) == "skipped"
    assert _outcome(testing.require_deepspeed) == ("ran" if is_deepspeed_available() else "skipped")


def test_slow_follows_run_slow(monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    assert _outcome(tu.slow) == "skipped"
    monkeypatch.setenv("RUN_SLOW", "yes")
    assert _outcome(tu.slow) == "ran"


def test_launch_command_is_accel_launch():
    assert tu.get_launch_command(num_processes=2, debug=True, config_file=None, cpu=False) == [
        "accel", "launch", "--num_processes=2", "--debug",
    ]  # fmt: skip
    assert tu.DEFAULT_LAUNCH_COMMAND[:2] == ["accel", "launch"]
    assert f"--num_processes={tu.device_count}" in tu.DEFAULT_LAUNCH_COMMAND


def test_path_points_inside_accel():
    path = tu.path_in_accelerate_package("test_utils", "testing.py")
    assert path.is_file()
    assert path.parent.parent == type(path)(accel.__file__).parent


def test_assert_exception_and_captured_output():
    with tu.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with pytest.raises(AssertionError, match="ran without issue"), tu.assert_exception(ValueError):
        pass
    assert tu.capture_call_output(print, "hello") == "hello\n"


def test_execute_subprocess_async_reports_failure(tmp_path):
    ok = tu.execute_subprocess_async(["python", "-c", "print('hi')"], env=os.environ.copy())
    assert ok.returncode == 0 and ok.stdout == ["hi"]
    with pytest.raises(RuntimeError, match="failed with returncode 3"):
        tu.execute_subprocess_async(["python", "-c", "import sys; sys.exit(3)"], quiet=True)


class _Tmp(testing.TempDirTestCase):
    def test_a(self):
        (self.tmpdir / "f").write_text("x")

    def test_b(self):
        assert not any(self.tmpdir.iterdir())


def test_temp_dir_test_case_clears_between_tests():
    result = unittest.TestResult()
    unittest.TestSuite([_Tmp("test_a"), _Tmp("test_b")]).run(result)
    assert result.wasSuccessful(), result.failures + result.errors


def test_regression_model_trains_on_the_regression_dataset():
    torch.manual_seed(0)
    data = tu.RegressionDataset(a=2, b=3, length=64, seed=42)
    assert len(data) == 64 and set(data[0]) == {"x", "y"}
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    model = tu.RegressionModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        for batch in loader:
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert abs(model.a.item() - 2) < 0.1 and abs(model.b.item() - 3) < 0.1
