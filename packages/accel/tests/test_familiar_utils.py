"""The helpers of accelerate's `utils` paths that accel builds: constants, operations, model
structure questions, launch-environment builders, environment and tracking registry."""

import argparse
import logging
import os
import pickle
import subprocess
import sys
import unittest
import warnings
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch import nn

from accel import tracking
from accel.test_utils import RegressionModel
from accel.utils import (
    constants,
    dataclasses,
    environment,
    fsdp_utils,
    imports,
    launch,
    megatron_lm,
    operations,
    other,
)
from accel.utils.ao import filter_linear_layers, find_first_last_linear_layers
from accel.utils.bnb import get_parameter_device


def test_constants_have_accelerates_values():
    assert constants.FSDP_MODEL_NAME == "pytorch_model_fsdp"
    assert constants.FSDP2_STATE_DICT_TYPE == ["SHARDED_STATE_DICT", "FULL_STATE_DICT"]
    assert constants.TORCH_DYNAMO_MODES == ["default", "reduce-overhead", "max-autotune"]
    assert "slurm" in constants.DEEPSPEED_MULTINODE_LAUNCHERS
    assert constants.CUDA_DISTRIBUTED_TYPES[:2] == ["DEEPSPEED", "MULTI_GPU"]
    assert set(constants.CUDA_DISTRIBUTED_TYPES) < set(constants.TORCH_DISTRIBUTED_OPERATION_TYPES)
    assert nn.Linear in constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert dataclasses.FSDP2_PYTORCH_VERSION == constants.FSDP2_PYTORCH_VERSION == "2.6.0"


def test_enums():
    class Color(dataclasses.BaseEnum):
        RED = "red"

    assert "red" in Color and "blue" not in Color
    assert str(Color.RED) == "red" and Color.list() == ["red"]
    assert dataclasses.FP8BackendType("AO") == "AO"


def test_convert_outputs_to_fp32_wraps_a_forward_and_is_undone_by_extraction():
    model = RegressionModel()
    model._original_forward = model.forward
    model.forward = operations.convert_outputs_to_fp32(
        torch.autocast("cpu", dtype=torch.bfloat16)(model.forward)
    )
    assert isinstance(model.forward, operations.ConvertOutputsToFp32)
    assert model(torch.ones(2)).dtype == torch.float32
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(model)
    plain = other.extract_model_from_parallel(model, keep_fp32_wrapper=False)
    pickle.dumps(plain)
    assert "_original_forward" not in plain.__dict__


def test_shapes_and_dtype_codes():
    data = {"a": torch.zeros(2, 3), "b": [torch.zeros(4)]}
    assert operations.get_shape(data) == {"a": [2, 3], "b": [[4]]}
    assert operations.TENSOR_INT_TO_DTYPE[operations.TENSOR_TYPE_TO_INT[torch.bfloat16]] is (
        torch.bfloat16
    )
    assert not operations.is_torch_xpu_tensor(torch.zeros(1))
    assert operations.is_torch_distributed_available() == torch.distributed.is_available()


def test_verify_and_chained_operation():
    calls = []

    @operations.verify_operation
    def collect(tensor):
        calls.append(tensor)
        return tensor

    with mock.patch.dict(os.environ, {"ACCELERATE_DEBUG_MODE": "1"}):
        assert collect(torch.ones(1)) is calls[0]  # one process: nothing to compare

    @operations.chained_operation
    def outer():
        raise operations.DistributedOperationException("shapes differ")

    with pytest.raises(operations.DistributedOperationException, match="outer") as info:
        outer()
    assert "shapes differ" in str(info.value.__cause__)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(16, 3)


def test_model_structure_helpers():
    net = Net()
    assert fsdp_utils.get_module_class_from_name(net, "Block") is Block
    assert fsdp_utils.get_module_class_from_name(net, "Nope") is None
    assert other.is_repeated_blocks(net.blocks) and not other.is_repeated_blocks(net)
    assert other.has_repeated_blocks(net) and not other.has_repeated_blocks(nn.Linear(1, 1))
    assert find_first_last_linear_layers(net) == ("inp", "out")
    assert filter_linear_layers(net.blocks[0].fc, "blocks.0.fc", ["inp", "out"])
    assert not filter_linear_layers(net.inp, "inp", ["inp", "out"])
    assert not filter_linear_layers(net.out, "x", [])  # 3 output features: not divisible by 16
    params = fsdp_utils.get_parameters_from_modules(r"blocks\.\d+", net, "cpu")
    assert params == set(net.blocks.parameters())
    assert fsdp_utils.get_parameters_from_modules(None, net, "cpu") == set()
    assert get_parameter_device(net) == torch.device("cpu")


def test_fsdp2_auto_wrap_policy():
    net = Net()
    by_class = fsdp_utils.fsdp2_prepare_auto_wrap_policy(
        SimpleNamespace(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=None
        ),
        net,
    )
    assert by_class(net.blocks[0]) and not by_class(net.inp)
    by_size = fsdp_utils.fsdp2_prepare_auto_wrap_policy(
        SimpleNamespace(auto_wrap_policy="size_based_wrap", min_num_params=300), net
    )
    assert by_size(net.blocks[0]) is False and by_size(net) is True
    with pytest.raises(ValueError, match="Missing"):
        fsdp_utils.fsdp2_prepare_auto_wrap_policy(
            SimpleNamespace(auto_wrap_policy="transformer_based_wrap",
                            transformer_cls_names_to_wrap=["Missing"]), net,
        )  # fmt: skip
    assert (
        fsdp_utils.fsdp2_prepare_auto_wrap_policy(SimpleNamespace(auto_wrap_policy="no_wrap"), net)
        is None
    )


def test_launch_environment_builders(monkeypatch):
    monkeypatch.setenv("SOME_PATH", "/a::/b")
    assert launch.env_var_path_add("SOME_PATH", "/c") == "/a:/b:/c"
    args = argparse.Namespace(fp8_backend="te", fp8_format=None,
                              fp8_override_linear_precision=(True, False, True), other=1)  # fmt: skip
    env = launch.setup_fp8_env(args, {})
    assert env == {
        "ACCELERATE_FP8_BACKEND": "te",
        "ACCELERATE_FP8_OVERRIDE_FPROP": "True",
        "ACCELERATE_FP8_OVERRIDE_DGRAD": "False",
        "ACCELERATE_FP8_OVERRIDE_WGRAD": "True",
    }
    sizes = {f"parallelism_config_{k}": v for k, v in dict(
        dp_replicate_size=1, dp_shard_size=2, tp_size=1, cp_size=2, cp_backend="torch",
        cp_comm_strategy="alltoall", sp_size=1, sp_backend="deepspeed").items()}  # fmt: skip
    env = launch.prepare_extend_env_parallelism_config(argparse.Namespace(**sizes), {})
    assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_CP_COMM_STRATEGY"] == "alltoall"
    assert "PARALLELISM_CONFIG_SP_SEQ_LENGTH" not in env
    port = launch.get_free_port()
    assert 0 < port < 65536 and not other.is_port_in_use(port)


def test_environment_helpers(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    info = environment.get_cpu_distributed_information()
    assert isinstance(info, environment.CPUInformation) and info.rank == 3
    with pytest.raises(NotImplementedError, match="accel launch"):
        environment.override_numa_affinity(0)
    env = {"ACCELERATE_DEBUG_MODE": "1", "BAD_ENV_NAME": "<mything", "OTHER_ENV": "2"}
    with unittest.TestCase().assertLogs("accel.utils.environment", level="WARNING") as logs:
        assert environment.convert_dict_to_env_variables(env) == [
            "ACCELERATE_DEBUG_MODE=1\n", "OTHER_ENV=2\n",
        ]  # fmt: skip
    assert "BAD_ENV_NAME" in logs.output[0]


@environment.purge_accelerate_environment
class _Purged(unittest.TestCase):
    def test_sets(self):
        os.environ["ACCELERATE_LEAK"] = "1"


class _Child(_Purged):
    def test_child_sets(self):
        os.environ["ACCELERATE_LEAK_CHILD"] = "1"


def test_purge_covers_inherited_and_subclass_tests():
    result = unittest.TestResult()
    unittest.TestSuite([_Child("test_sets"), _Child("test_child_sets")]).run(result)
    assert result.wasSuccessful()
    assert "ACCELERATE_LEAK" not in os.environ and "ACCELERATE_LEAK_CHILD" not in os.environ


def test_other_helpers(tmp_path):
    with (
        mock.patch(
            "platform.uname", return_value=SimpleNamespace(release="5.4.0-1", system="Linux")
        ),
        unittest.TestCase().assertLogs(level="WARNING") as logs,
    ):
        other.check_os_kernel()
    assert "5.4.0" in logs.output[0] and "5.5.0" in logs.output[0]
    model = RegressionModel()
    assert other.get_model_tp_size(model) is None
    model.config = SimpleNamespace(distributed_config={"tp_size": 8})
    assert other.get_model_tp_size(model) == 8
    tied = nn.Sequential(nn.Linear(2, 2))
    state = {"a.weight": tied[0].weight, "b.weight": tied[0].weight}
    with unittest.TestCase().assertLogs(level="WARNING") as logs:
        other.save(state, tmp_path / "m.safetensors", safe_serialization=True)
    assert "Removed shared tensor" in logs.output[0]
    import numpy as np

    torch.save({"rng": np.random.get_state()}, tmp_path / "rng.pt")
    assert other.load(tmp_path / "rng.pt")["rng"][0] == "MT19937"
    assert np.ndarray in other.TORCH_SAFE_GLOBALS


def test_imports_probes():
    assert imports.is_numpy_available() and not imports.is_numpy_available("999.0")
    assert imports.is_tqdm_available() in (True, False)


def test_use_torch_xla_reads_the_environment_at_import():
    code = "import accel.utils.imports as i; print(i.USE_TORCH_XLA)"
    unset = {k: v for k, v in os.environ.items() if k != "USE_TORCH_XLA"}
    for value, expected in ((None, "True"), ("0", "False"), ("false", "False"), ("1", "True")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env=unset if value is None else {**unset, "USE_TORCH_XLA": value},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == expected, (value, out)


def test_left_out_features_raise_naming_the_alternative():
    with pytest.raises(NotImplementedError, match="Megatron-LM"):
        megatron_lm.MegatronEngine()
    assert set(dataclasses.MODEL_CONFIGS_TO_MEGATRON_PARSERS) >= {"gpt2", "llama", "t5"}


class _MyTracker(tracking.GeneralTracker):
    name = "my_familiar_tracker"
    requires_logging_directory = False

    def __init__(self, run_name, **kwargs):
        self.run_name = run_name

    def log(self, values, step=None, **kwargs):
        pass


def test_tracker_registry_is_a_live_dict():
    snapshot = dict(tracking.LOGGER_TYPE_TO_CLASS)
    try:
        assert tracking.LOGGER_TYPE_TO_CLASS["tensorboard"] is tracking.TensorBoardTracker
        tracking.register_tracker_class(_MyTracker)
        assert tracking.LOGGER_TYPE_TO_CLASS["my_familiar_tracker"] is _MyTracker
        assert tracking.get_tracker("my_familiar_tracker") is _MyTracker
        with pytest.raises(ValueError):
            tracking.register_tracker_class(dict)

        class NoFlag(tracking.GeneralTracker):
            name = "no_flag"

        with pytest.raises(ValueError, match="requires_logging_directory"):
            tracking.register_tracker_class(NoFlag)

        class Shadow(_MyTracker):
            requires_logging_directory = False

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tracking.register_tracker_class(Shadow)
        assert "my_familiar_tracker" in str(caught[0].message)
    finally:
        tracking.LOGGER_TYPE_TO_CLASS.clear()
        tracking.LOGGER_TYPE_TO_CLASS.update(snapshot)
    assert "my_familiar_tracker" not in tracking.LOGGER_TYPE_TO_CLASS


def test_logger_is_quiet_by_default():
    assert logging.getLogger("accel.utils.other").level == logging.NOTSET


def test_find_executable_batch_size_refuses_a_zero_start():
    from accel.utils.memory import find_executable_batch_size

    calls = []

    @find_executable_batch_size(starting_batch_size=0)
    def train(batch_size):
        calls.append(batch_size)

    with pytest.raises(RuntimeError, match="reached zero"):
        train()
    assert calls == []


def test_fsdp_ram_efficient_loading_switches_what_transformers_reads(monkeypatch):
    for name in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        monkeypatch.setenv(name, "")  # recorded, so that the teardown restores the original
        monkeypatch.delenv(name)
    fsdp_utils.enable_fsdp_ram_efficient_loading()
    assert os.environ["ACCELERATE_USE_FSDP"] == "True"
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "True"
    fsdp_utils.disable_fsdp_ram_efficient_loading()
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "False"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")  # a value already set is kept
    fsdp_utils.enable_fsdp_ram_efficient_loading()
    assert os.environ["ACCELERATE_USE_FSDP"] == "false"


def test_fsdp2_canonicalize_names_drops_checkpoint_and_compile_wrappers():
    names = {
        "_orig_mod.layers.0._checkpoint_wrapped_module.w": 1,
        "layers.1._orig_mod.w": 2,
        "head.bias": 3,
    }
    assert fsdp_utils.fsdp2_canonicalize_names(names) == {
        "layers.0.w": 1, "layers.1.w": 2, "head.bias": 3,
    }  # fmt: skip


def test_fsdp2_grad_scaler_is_torchs_with_the_arguments_given():
    scaler = fsdp_utils.get_fsdp2_grad_scaler(device="cpu", init_scale=8.0)
    assert type(scaler) is torch.amp.GradScaler and scaler.get_scale() == 8.0


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


@pytest.mark.parametrize("name", ["compile_regions_fsdp2", "compile_regions_deepspeed"])
def test_in_place_regional_compilation(name):
    """Each repeated block and the head compiled in place: the model object and its parameter
    names stay (an engine's hooks on it still run), and the output is the eager one."""
    torch.manual_seed(0)
    model, x = _Blocks(), torch.randn(3, 4)
    expected = model(x)
    names = [n for n, _ in model.named_parameters()]
    returned = getattr(other, name)(model, backend="eager")
    assert returned is (model if name == "compile_regions_fsdp2" else None)
    compiled = [n for n, m in model.named_modules() if m._compiled_call_impl is not None]
    assert compiled == ["layers.0", "layers.1", "head"]
    assert [n for n, _ in model.named_parameters()] == names
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)  # eager backend: same ops


def test_sagemaker_distributed_type_is_accelerates_enum():
    from accel.commands.config.config_args import SageMakerDistributedType as from_config
    from accel.utils import SageMakerDistributedType

    assert from_config is SageMakerDistributedType and SageMakerDistributedType("NO") == "NO"
    assert [t.value for t in SageMakerDistributedType] == ["NO", "DATA_PARALLEL", "MODEL_PARALLEL"]
