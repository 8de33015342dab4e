"""The registry and the one resolver: every source of configuration, in its order."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from accel_parallel import (
    DDPStrategy,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    FSDP2Strategy,
    FullyShardedDataParallelPlugin,
    JoinsUnevenInputs,
    MegatronLMPlugin,
    MeshStrategy,
    ParallelismConfig,
    PipelineStrategy,
    ProcessInfo,
    SingleDeviceStrategy,
    Strategy,
    StrategyRequest,
    TorchTensorParallelPlugin,
    register_strategy,
    registered_strategies,
    resolve_strategy,
)

CPU = torch.device("cpu")
ONE, FOUR = ProcessInfo(CPU), ProcessInfo(CPU, num_processes=4)


def _strategy(info: ProcessInfo, **kw) -> Strategy:
    return resolve_strategy(info, **kw).strategy


def test_every_builtin_engine_is_registered_by_its_module() -> None:
    assert set(registered_strategies()) >= {
        "single_device", "ddp", "fsdp", "deepspeed", "mesh", "pipeline",
    }  # fmt: skip


def test_claims_follow_the_processes_plugins_launch_and_mesh() -> None:
    assert isinstance(_strategy(ONE), SingleDeviceStrategy)
    assert isinstance(_strategy(FOUR), DDPStrategy)
    plugin = FullyShardedDataParallelPlugin()
    assert isinstance(_strategy(ONE, fsdp_plugin=plugin), FSDP2Strategy)
    launched = {"distributed_type": "FSDP", "fsdp_config": {"fsdp_reshard_after_forward": False}}
    chosen = _strategy(FOUR, launch_config=launched)
    assert isinstance(chosen, FSDP2Strategy) and chosen.plugin.reshard_after_forward is False
    # A plugin in code wins over the launch's distributed_type.
    assert isinstance(
        _strategy(FOUR, fsdp_plugin=plugin, launch_config={"distributed_type": "DEEPSPEED"}),
        FSDP2Strategy,
    )
    mesh = resolve_strategy(FOUR, parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))
    assert isinstance(mesh.strategy, MeshStrategy) and mesh.parallelism_config.tp_size == 2
    pipe = _strategy(FOUR, parallelism_config=ParallelismConfig(pp_size=2, dp_shard_size=2))
    assert isinstance(pipe, PipelineStrategy)
    # accelerate's PARALLELISM_CONFIG_* variables, and the launch section, are sources too.
    env = {"PARALLELISM_CONFIG_TP_SIZE": "2", "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2"}
    assert isinstance(_strategy(FOUR, environ=env), MeshStrategy)
    section = {"parallelism_config": {"parallelism_config_tp_size": 4}}
    assert resolve_strategy(FOUR, launch_config=section).parallelism_config.tp_size == 4
    # TP plugin and Megatron's settings are translated into the same config.
    tp = resolve_strategy(FOUR, torch_tp_plugin=TorchTensorParallelPlugin(tp_size=2))
    assert isinstance(tp.strategy, MeshStrategy) and tp.parallelism_config.tp_size == 2
    megatron = resolve_strategy(
        FOUR,
        megatron_lm_plugin=MegatronLMPlugin(
            tp_degree=2, use_distributed_optimizer=True, gradient_clipping=0.5
        ),
    )
    assert megatron.parallelism_config.tp_size == 2 and megatron.strategy.clip_norm == 0.5


def test_a_name_or_an_instance_picks_the_strategy() -> None:
    assert isinstance(_strategy(FOUR, strategy="fsdp"), FSDP2Strategy)
    assert isinstance(_strategy(ONE, strategy="ddp"), DDPStrategy)
    mine = SingleDeviceStrategy(ONE)
    assert _strategy(ONE, strategy=mine) is mine
    with pytest.raises(ValueError, match="Unknown strategy 'zero'; registered: .*'ddp'"):
        _strategy(ONE, strategy="zero")
    with pytest.raises(ValueError, match="cannot run 4 processes"):
        _strategy(FOUR, strategy="single_device")
    with pytest.raises(ValueError, match="ready strategy; it takes no fsdp_plugin"):
        _strategy(ONE, strategy=mine, fsdp_plugin=FullyShardedDataParallelPlugin())
    with pytest.raises(TypeError, match="expected a registered name"):
        _strategy(ONE, strategy=3)
    with pytest.raises(ValueError, match="strategy 'mesh' runs a ParallelismConfig"):
        _strategy(FOUR, strategy="mesh")


def test_conflicts_are_named() -> None:
    with pytest.raises(ValueError, match="fsdp_plugin or deepspeed_plugin, not both"):
        _strategy(
            ONE, fsdp_plugin=FullyShardedDataParallelPlugin(), deepspeed_plugin=DeepSpeedPlugin()
        )
    with pytest.raises(ValueError, match="not on DeepSpeed"):
        _strategy(
            FOUR, deepspeed_plugin=DeepSpeedPlugin(),
            parallelism_config=ParallelismConfig(tp_size=2, dp_shard_size=2),
        )  # fmt: skip
    with pytest.raises(ValueError, match="DistributedDataParallelKwargs apply to DDP"):
        _strategy(
            FOUR, ddp_kwargs=DistributedDataParallelKwargs(),
            parallelism_config=ParallelismConfig(tp_size=2, dp_shard_size=2),
        )  # fmt: skip


def test_capabilities_are_methods_not_names() -> None:
    from accel_state import DistributedType

    topology = DistributedType.MULTI_CPU
    assert isinstance(_strategy(FOUR), JoinsUnevenInputs)
    assert not isinstance(_strategy(FOUR, strategy="fsdp"), JoinsUnevenInputs)
    fsdp = _strategy(FOUR, strategy="fsdp")
    assert fsdp.fsdp_plugin is fsdp.plugin and fsdp.distributed_type(topology) == "FSDP"
    assert (
        _strategy(FOUR).fsdp_plugin is None
        and _strategy(FOUR).distributed_type(topology) == topology
    )
    tp_only = _strategy(FOUR, parallelism_config=ParallelismConfig(tp_size=4))
    assert tp_only.fsdp_plugin is None and tp_only.distributed_type(topology) == topology
    assert _strategy(FOUR).engine_plugins() is None


class _Recording(SingleDeviceStrategy):
    name = "recording"


def test_a_new_engine_is_a_registration() -> None:
    seen: list[StrategyRequest] = []

    def build(request: StrategyRequest) -> Strategy:
        seen.append(request)
        return _Recording(request.info)

    register_strategy("recording", build)  # claims nothing: runs only when named
    try:
        assert isinstance(_strategy(ONE), SingleDeviceStrategy)
        chosen = _strategy(ONE, strategy="recording", launch_config={"mixed_precision": "bf16"})
        assert isinstance(chosen, _Recording) and seen[0].launch == {"mixed_precision": "bf16"}
        with pytest.raises(ValueError, match="registered already"):
            register_strategy("recording", lambda request: _Recording(request.info))
        register_strategy("recording", build, claims=lambda request: 100)
        assert isinstance(_strategy(FOUR), _Recording)  # the strongest claim wins
    finally:
        from accel_parallel import _registry

        _registry._REGISTRY.pop("recording")


class _Placing(Strategy):
    """An engine whose runtime places the process: named, or where $PLACED is set."""

    @classmethod
    def placement(cls, environ, *, named: bool) -> ProcessInfo | None:
        return FOUR if named or environ.get("PLACED") else None


def test_the_strategy_places_the_process_where_its_runtime_decides() -> None:
    from accel_parallel import process_placement

    assert process_placement(None, {}) is None  # accel-state decides: no engine places it
    assert process_placement("ddp", {}) is None and process_placement("nonesuch", {}) is None
    register_strategy("placing", lambda request: _Placing(request.info), kind=_Placing)
    try:
        assert process_placement("placing", {}) == FOUR  # named
        assert process_placement(None, {"PLACED": "1"}) == FOUR  # unnamed, and it places it
        assert process_placement(None, {}) is None
        assert process_placement(_Placing(ONE), {"PLACED": "1"}) is None  # a ready strategy
    finally:
        from accel_parallel import _registry

        _registry._REGISTRY.pop("placing")


def test_sequence_parallel_runs_under_deepspeed_from_code_or_launch_and_is_refused_elsewhere():
    """sp_size > 1 is DeepSpeed's (its claim is above a mesh's); any other engine is refused
    with the fix named."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install accel-parallel[deepspeed])")
    from accel_parallel import DeepSpeedStrategy

    config = ParallelismConfig(sp_size=2)
    ds = _strategy(FOUR, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2), parallelism_config=config)
    assert isinstance(ds, DeepSpeedStrategy) and ds.sequence_parallel.sp_size == 2
    launch = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 2},
              "parallelism_config": {"parallelism_config_sp_size": 2}}  # fmt: skip
    launched = resolve_strategy(FOUR, launch_config=launch)
    assert launched.strategy.sequence_parallel.sp_size == 2
    assert launched.parallelism_config.dp_shard_size == 2  # 4 processes, groups of 2
    assert _strategy(FOUR, deepspeed_plugin=DeepSpeedPlugin()).sequence_parallel is None
    for kwargs in ({}, {"fsdp_plugin": FullyShardedDataParallelPlugin()}):
        with pytest.raises(ValueError, match=r"sp_size=2.*runs under DeepSpeed.*deepspeed_plugin"):
            _strategy(FOUR, parallelism_config=config, **kwargs)


def test_sequence_parallel_refuses_what_ulysses_cannot_shard():
    from accel_parallel._deepspeed_ulysses import UlyssesSequenceParallel

    sp = UlyssesSequenceParallel(2, None)
    with pytest.raises(ValueError, match="Linear.*has no `config`.*transformers models only"):
        sp.register(torch.nn.Linear(2, 2), 1)
    model = torch.nn.Linear(2, 2)
    model.config = type("C", (), {"layer_types": ["full_attention", "linear_attention"]})()
    with pytest.raises(ValueError, match=r"\['linear_attention'\] carry a recurrent state"):
        sp.register(model, 1)
    with pytest.raises(ValueError, match="needs the model prepared first"):
        sp.adapt_loader([], CPU)


def _fresh(code: str) -> str:
    """What `code` prints in a new interpreter (the registry as a program starts with it)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


BUILTINS = ("ddp", "deepspeed", "fault_tolerant", "fsdp", "mesh", "pipeline", "single_device",
            "xla", "xla_spmd")  # fmt: skip
STRATEGY_MODULES = ("_ddp", "_deepspeed", "_fault_tolerant", "_fsdp", "_mesh", "_pipeline",
                    "_single", "_xla")  # fmt: skip


def test_importing_the_package_imports_no_engine_and_the_first_read_imports_them_all() -> None:
    out = _fresh(
        "import sys, accel_parallel\n"
        f"engines = [f'accel_parallel.{{m}}' for m in {STRATEGY_MODULES!r}]\n"
        "settings = ['accel_parallel._megatron', 'accel_parallel._parallelism_config']\n"
        "print([m for m in engines + settings if m in sys.modules])\n"
        "print(accel_parallel.registered_strategies())\n"
        "print([m for m in engines if m not in sys.modules])\n"
    )
    assert out.splitlines() == ["[]", repr(BUILTINS), "[]"]


def test_a_strategy_registered_before_the_first_read_follows_the_builtins() -> None:
    """As when importing the package registered every built-in: yours come after them, in
    your order, and a built-in's name is taken (the same error)."""
    out = _fresh(
        "from accel_parallel import register_strategy, registered_strategies\n"
        "register_strategy('mine', lambda request: None)\n"
        "register_strategy('yours', lambda request: None, claims=lambda request: 0)\n"
        "print(registered_strategies())\n"
        "try:\n"
        "    register_strategy('fsdp', lambda request: None)\n"
        "except ValueError as err:\n"
        "    print(str(err).split(' (')[0])\n"
    )
    assert out.splitlines() == [
        repr((*BUILTINS, "mine", "yours")),
        "a strategy named 'fsdp' is registered already",
    ]


def test_a_builtin_module_imported_first_keeps_the_builtins_order() -> None:
    """The order decides ties between equal claims: a built-in module imported on its own
    before the registry is read does not move its strategy ahead of the others."""
    out = _fresh(
        "import accel_parallel._xla, accel_parallel._single\n"
        "from accel_parallel import register_strategy, registered_strategies\n"
        "register_strategy('mine', lambda request: None)\n"
        "print(registered_strategies())\n"
    )
    assert out == repr((*BUILTINS, "mine"))
