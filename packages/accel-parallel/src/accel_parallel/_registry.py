"""Strategies by name, and the one resolver that turns a run's configuration into one.

Each strategy module registers itself (`register_strategy`): its name, how to build it from a
`StrategyRequest`, and how strongly it claims a run that names no strategy (`claims`). `resolve_strategy` is the only place that reads the engine plugins, the
`ParallelismConfig` (code, `accel launch`, accelerate's PARALLELISM_CONFIG_* variables), the
Megatron settings and the launch configuration; the Accelerator calls it once. A new engine is
a new module that registers; nothing else lists the strategies.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

from accel_parallel._strategy import ProcessInfo, Strategy


@dataclasses.dataclass(frozen=True, kw_only=True)
class StrategyRequest:
    """What a run asks of its engine, once the resolver has read every source.

    `parallelism_config` is resolved for the world size (None: no mesh was asked for);
    `launch` is the `accel launch` configuration ({} outside it); `clip_norm` the global
    gradient norm to clip to at each step (Megatron's ``gradient_clipping``).
    """

    info: ProcessInfo
    mixed_precision: str = "no"
    ddp_kwargs: Any = None
    fsdp_plugin: Any = None
    deepspeed_plugin: Any = None
    parallelism_config: Any = None
    launch: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    clip_norm: float | None = None
    fault_tolerance: Any = None  # a FaultTolerancePlugin: this run is one of several groups

    @property
    def launched_type(self) -> str:
        """The launch configuration's distributed_type ("FSDP", "DEEPSPEED", ... or "")."""
        return str(self.launch.get("distributed_type") or "").upper()

    def launch_section(self, name: str) -> Mapping[str, Any]:
        return self.launch.get(name) or {}


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    build: Callable[[StrategyRequest], Strategy]
    claims: Callable[[StrategyRequest], int | None]
    module: str | None  # where `build` was defined
    kind: type[Strategy]  # the class whose class-level capabilities (`placement`) it has


_REGISTRY: dict[str, _Entry] = {}
# The built-in strategies' modules, in the order their strategies are listed (as when importing
# the package imported them all, before anything else could register).
_BUILTIN_MODULES = (
    "accel_parallel._ddp",
    "accel_parallel._deepspeed",
    "accel_parallel._fault_tolerant",
    "accel_parallel._fsdp",
    "accel_parallel._mesh",
    "accel_parallel._pipeline",
    "accel_parallel._single",
    "accel_parallel._xla",
)
_builtins_loaded = False
_LOADING = threading.RLock()


def _registry() -> dict[str, _Entry]:
    """The registry, with every built-in strategy in it (their modules imported on the first
    call)."""
    if not _builtins_loaded:
        with _LOADING:
            if not _builtins_loaded:
                _load_builtins()
    return _REGISTRY


def _load_builtins() -> None:
    global _builtins_loaded
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)  # each registers its strategies
    # The built-ins first, in their modules' order, then the others as they came (a built-in
    # module imported on its own before registered ahead of the rest).
    rank = {module: i for i, module in enumerate(_BUILTIN_MODULES)}
    entries = sorted(_REGISTRY.values(), key=lambda entry: rank.get(entry.module, len(rank)))
    _REGISTRY.clear()
    _REGISTRY.update((entry.name, entry) for entry in entries)
    _builtins_loaded = True


def register_strategy(
    name: str,
    build: Callable[[StrategyRequest], Strategy],
    *,
    claims: Callable[[StrategyRequest], int | None] | None = None,
    kind: type[Strategy] = Strategy,
) -> None:
    """Make `name` a strategy `Accelerator(strategy=name)` and the resolver can build.

    `build(request)` makes it. `claims(request)`: how strongly it serves a run that names no
    strategy (an int; None: it does not), the strongest claim winning (the built-in ones: 0
    one device, 10 DDP, 20 FSDP2 or DeepSpeed that the launch configured, 30 an XLA device,
    40 an FSDP or DeepSpeed plugin given, 50 a device mesh, 55 DeepSpeed with sequence
    parallel (sp_size > 1), 60 a pipeline, 70 replica groups: a fault-tolerance plugin).
    Without `claims`, it runs only when named. `kind`: the class `build` makes, asked before
    it is built (`Strategy.placement`).
    """
    # A built-in module registers itself as it is imported; anyone else's name is checked
    # against the built-ins, and follows them, as when they were all registered on import.
    module = getattr(build, "__module__", None)
    registry = _REGISTRY if module in _BUILTIN_MODULES else _registry()
    known = registry.get(name)
    if known is not None and known.build is not build:
        raise ValueError(
            f"a strategy named {name!r} is registered already ({known.build!r}); pick another "
            f"name for {build!r}."
        )
    registry[name] = _Entry(name, build, claims or (lambda request: None), module, kind)


def registered_strategies() -> tuple[str, ...]:
    """The names of the registered strategies, in the order they were registered."""
    return tuple(_registry())


def process_placement(
    strategy: str | Strategy | None, environ: Mapping[str, str]
) -> ProcessInfo | None:
    """Where this process runs when the run's engine places it (`Strategy.placement`), asked
    before the process state is made: the named strategy's, else, where none is named, the
    first registered one that places the run. None where accel-state decides, and for a
    ready Strategy (made where it runs) or a name no strategy is registered as."""
    if isinstance(strategy, Strategy):
        return None
    registry = _registry()
    if isinstance(strategy, str):
        entry = registry.get(strategy)
        return None if entry is None else entry.kind.placement(environ, named=True)
    for entry in registry.values():
        placed = entry.kind.placement(environ, named=False)
        if placed is not None:
            return placed
    return None


def build_strategy(name: str, request: StrategyRequest) -> Strategy:
    """The strategy registered as `name`, built for `request`."""
    registry = _registry()
    entry = registry.get(name)
    if entry is None:
        raise ValueError(
            f"Unknown strategy {name!r}; registered: {list(registry)}. Pass one of those, a "
            f"Strategy instance, or register yours with accel_parallel.register_strategy."
        )
    return entry.build(request)


def claimed_strategy(request: StrategyRequest) -> str:
    """The name of the registered strategy with the strongest claim on `request` (the first
    registered among equals)."""
    best: tuple[int, str] | None = None
    for entry in _registry().values():
        strength = entry.claims(request)
        if strength is not None and (best is None or strength > best[0]):
            best = (strength, entry.name)
    if best is None:
        raise ValueError(f"no registered strategy serves this run ({request!r}).")
    return best[1]


@dataclasses.dataclass(frozen=True)
class ResolvedEngine:
    """What `resolve_strategy` decided: the strategy, and the run's resolved parallel
    configuration (None when no mesh was asked for)."""

    strategy: Strategy
    parallelism_config: Any


def resolve_strategy(
    info: ProcessInfo,
    *,
    strategy: str | Strategy | None = None,
    ddp_kwargs: Any = None,
    fsdp_plugin: Any = None,
    deepspeed_plugin: Any = None,
    torch_tp_plugin: Any = None,
    megatron_lm_plugin: Any = None,
    parallelism_config: Any = None,
    launch_config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    mixed_precision: str = "no",
    fault_tolerance: Any = None,
) -> ResolvedEngine:
    """The run's strategy, from every source, strongest first.

    `strategy` (a registered name or a ready Strategy); the engine plugins (`fsdp_plugin`,
    `deepspeed_plugin`; a `torch_tp_plugin` or a `MegatronLMPlugin` become a
    ParallelismConfig); the code's ParallelismConfig, else the `accel launch` section, else
    accelerate's PARALLELISM_CONFIG_* variables in `environ`; the launch's distributed_type;
    else the registered strategy with the strongest claim on the run (DDP with several
    processes, one device with one).
    """
    launch = dict(launch_config or {})
    plugins = {
        "fsdp_plugin": fsdp_plugin,
        "deepspeed_plugin": deepspeed_plugin,
        "torch_tp_plugin": torch_tp_plugin,
        "megatron_lm_plugin": megatron_lm_plugin,
        "parallelism_config": parallelism_config,
        "ddp_kwargs": ddp_kwargs,
        "fault_tolerance": fault_tolerance,
    }
    if isinstance(strategy, Strategy):
        given = sorted(k for k, v in plugins.items() if v is not None)
        if given:
            raise ValueError(
                f"strategy={type(strategy).__name__}(...) is a ready strategy; it takes no "
                f"{', '.join(given)} (configure the strategy instance instead)."
            )
        return ResolvedEngine(strategy, getattr(strategy, "config", None))
    if strategy is not None and not isinstance(strategy, str):
        raise TypeError(
            f"strategy={strategy!r}: expected a registered name {list(_registry())} or a "
            f"Strategy instance."
        )
    if fsdp_plugin is not None and deepspeed_plugin is not None:
        raise ValueError("Pass fsdp_plugin or deepspeed_plugin, not both.")
    from accel_parallel._megatron import megatron_settings
    from accel_parallel._parallelism_config import resolve_parallelism_config

    if parallelism_config is None and torch_tp_plugin is not None:
        parallelism_config = torch_tp_plugin.to_parallelism_config(info.num_processes)
    parallelism_config, fsdp_plugin, clip_norm = megatron_settings(
        megatron_lm_plugin,
        launch,
        world_size=info.num_processes,
        parallelism_config=parallelism_config,
        fsdp_plugin=fsdp_plugin,
    )
    config = resolve_parallelism_config(
        parallelism_config,
        world_size=info.num_processes,
        launch_section=launch.get("parallelism_config"),
        environ=environ,
    )
    request = StrategyRequest(
        info=info,
        mixed_precision=mixed_precision,
        ddp_kwargs=ddp_kwargs,
        fsdp_plugin=fsdp_plugin,
        deepspeed_plugin=deepspeed_plugin,
        parallelism_config=config,
        launch=launch,
        clip_norm=clip_norm,
        fault_tolerance=fault_tolerance,
    )
    name = strategy if strategy is not None else claimed_strategy(request)
    built = build_strategy(name, request)
    if config is not None and config.sp_enabled:
        _check_sequence_parallel(built, config)
    return ResolvedEngine(built, config)


def _check_sequence_parallel(strategy: Strategy, config: Any) -> None:
    if config.sp_backend not in strategy.sequence_parallel_backends:
        raise ValueError(
            f"ParallelismConfig(sp_size={config.sp_size}, sp_backend={config.sp_backend!r}) is "
            f"DeepSpeed's sequence parallel (ALST / Ulysses), which runs under DeepSpeed; this "
            f"run's strategy is {strategy.name!r}. Pass deepspeed_plugin=DeepSpeedPlugin(...) "
            f"(or `accel launch --use_deepspeed`), or use cp_size={config.sp_size} for torch's "
            f"context parallel."
        )
