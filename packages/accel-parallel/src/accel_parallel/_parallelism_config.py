"""The parallel degrees of a run, validated once, and the one `DeviceMesh` built from them.

Dimensions (accelerate's names), outermost first: ``pp`` (pipeline stages: the model is
split into consecutive stages, run by a `torch.distributed.pipelining` schedule; see
`accel_parallel._pipeline`), ``dp_replicate`` (replicas of the whole
model: HSDP's outer dimension, or DDP), ``dp_shard`` (FSDP2 shards parameters over it),
``cp`` (context parallel: the sequence is split over it), ``sp`` (DeepSpeed's sequence
parallel, ALST / Ulysses: the DeepSpeed strategy makes its groups, no mesh is built), ``tp`` (tensor parallel: each
weight is split over it). Only the dimensions larger than one are in the mesh; the flattened
sub-meshes ``dp`` (dp_replicate x dp_shard), ``dp_shard_cp`` (what FSDP2 shards over) and
``dp_cp`` (what a loss is averaged over) are added when their dimensions exist.

Ranks of one tensor/context-parallel group see the same batch; different data-parallel
ranks see disjoint ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from accel_parallel._sequence_parallel import DeepSpeedSequenceParallelConfig

# The environment variables accelerate's launcher sets for its workers (read only by
# `ParallelismConfig.from_environment`, given the mapping to read).
ENV_USE_PARALLELISM_CONFIG = "ACCELERATE_USE_PARALLELISM_CONFIG"
ENV_PREFIX = "PARALLELISM_CONFIG_"
ENV_DP_REPLICATE_SIZE = "PARALLELISM_CONFIG_DP_REPLICATE_SIZE"
ENV_DP_SHARD_SIZE = "PARALLELISM_CONFIG_DP_SHARD_SIZE"
ENV_TP_SIZE = "PARALLELISM_CONFIG_TP_SIZE"
ENV_CP_SIZE = "PARALLELISM_CONFIG_CP_SIZE"
ENV_CP_COMM_STRATEGY = "PARALLELISM_CONFIG_CP_COMM_STRATEGY"

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
_SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "pp_size")
_SP_OPTIONS = ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")
# The fields a ParallelismConfig fills when left unset (None), with accel's defaults.
_DEFAULTS = {"dp_replicate_size": 1, "dp_shard_size": 1, "tp_size": 1, "cp_size": 1,
             "cp_backend": "torch", "sp_size": 1, "sp_backend": "deepspeed", "pp_size": 1}  # fmt: skip
_CP_STRATEGIES = ("allgather", "alltoall")
# Keys of the launch section (`parallelism_config:` in an accelerate config file, or the
# --parallelism_config_* flags) that ask for something accel does not provide.
_REFUSED_KEYS = {
    "sp_backend": ("deepspeed", "sequence parallel is DeepSpeed's ALST / Ulysses: 'deepspeed'"),
    "cp_backend": ("torch", "context parallel runs on torch's ring attention only; use 'torch'"),
}  # fmt: skip


@dataclasses.dataclass
class TorchTensorParallelConfig:
    """Tensor-parallel options. ``enable_async_tp`` overlaps the TP collectives with the
    matmuls (torch's micro-pipelined TP: CUDA with symmetric memory, under torch.compile).
    ``sequence_parallel`` (accel's addition; Megatron-LM's sequence parallelism) splits the
    activations between the tensor-parallel blocks along the sequence (see
    `accel_parallel._tp_sequence`)."""

    enable_async_tp: bool = False
    _: dataclasses.KW_ONLY
    sequence_parallel: bool = False


@dataclasses.dataclass
class TorchContextParallelConfig:
    """Context-parallel options: how the ring attention exchanges keys and values,
    ``"allgather"`` (all of them, then attend) or ``"alltoall"`` (rotate round the ring).
    Mutable and positional, as accelerate's is."""

    cp_comm_strategy: str | None = None

    def _default_strategy(self) -> str:
        """The strategy when none is given; accel's familiar-path subclass reads
        accelerate's environment variable here."""
        return "allgather"

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = self._default_strategy()
        if self.cp_comm_strategy not in _CP_STRATEGIES:
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}; expected one of "
                f"{list(_CP_STRATEGIES)}."
            )


@dataclasses.dataclass
class TorchTensorParallelPlugin:
    """accelerate's older spelling of tensor parallel: ``tp_size`` alone (fields in accelerate's
    order, mutable as there). Prefer ``ParallelismConfig(tp_size=...)``; `Accelerator` turns
    this into one."""

    tp_size: int = 1
    torch_device_mesh: Any = None

    def __post_init__(self) -> None:
        if self.torch_device_mesh is not None:
            raise ValueError(
                "TorchTensorParallelPlugin(torch_device_mesh=...): accel builds the one device "
                "mesh itself from the sizes; pass tp_size only (or a ParallelismConfig)."
            )

    def to_parallelism_config(self, world_size: int) -> ParallelismConfig:
        if world_size % self.tp_size:
            raise ValueError(
                f"TorchTensorParallelPlugin(tp_size={self.tp_size}) does not divide the "
                f"{world_size} processes; pick a tp_size that divides it."
            )
        return ParallelismConfig(dp_shard_size=world_size // self.tp_size, tp_size=self.tp_size)


@dataclasses.dataclass(frozen=True)
class ParallelismConfig:
    """How many ways each parallel dimension splits the processes (see the module docstring).

    ``dp_replicate_size x dp_shard_size x cp_size x tp_size`` must equal the number of
    processes. Left unset (None), a size is 1; with every size unset the processes are all
    data-parallel replicas (DDP). ``tp_plan`` (accel's addition) is the tensor-parallel plan
    for models that do not declare one: module-name pattern (``*`` is one name part) ->
    ``"colwise"``, ``"rowwise"``, ``"sequence_parallel"``, ``"replicate"`` (and transformers'
    other names) or a torch ``ParallelStyle``. The fields are in accelerate's order, so
    positional arguments mean what they mean there. ``sp_size`` / ``sp_backend`` /
    ``sp_handler``: DeepSpeed's sequence parallel (ALST / Ulysses), run by the DeepSpeed
    strategy, which makes its own process groups; it composes with data parallel only.

    Pipeline parallel (accel's addition, after accelerate's fields): ``pp_size`` stages of
    the model on as many ranks; ``pp_schedule`` one of torch's schedules (`PP_SCHEDULES`,
    default ``"1F1B"``); ``pp_microbatches`` how many micro-batches one batch is split into
    (default ``pp_size``); ``pp_virtual_stages`` the stages each rank
    holds (default 1, 2 for the interleaved, zero-bubble and V schedules); ``pp_plan`` how
    the model is cut (see `accel_parallel._pipeline_plan`; transformers decoder models need
    none); ``pp_loss_fn(output, labels) -> loss`` for a model without a built-in loss.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: DeepSpeedSequenceParallelConfig | None = None
    tp_plan: Mapping[str, Any] | None = None
    pp_size: int | None = None
    pp_schedule: str | None = None
    pp_microbatches: int | None = None
    pp_virtual_stages: int | None = None
    pp_plan: Any = None
    pp_loss_fn: Any = None

    def _default(self, name: str) -> Any:
        """The value of a field left unset (None); accel's familiar-path subclass reads
        accelerate's PARALLELISM_CONFIG_* variables here."""
        return _DEFAULTS[name]

    def _default_handler(self, name: str) -> Any:
        """The handler made for an enabled dimension given none (``"tp"``, ``"cp"``, ``"sp"``)."""
        kinds = {"tp": TorchTensorParallelConfig, "cp": TorchContextParallelConfig,
                 "sp": DeepSpeedSequenceParallelConfig}  # fmt: skip
        return kinds[name]()

    def __post_init__(self) -> None:
        for name in _DEFAULTS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, self._default(name))
        for name in (*_SIZES, "sp_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"ParallelismConfig.{name}={value!r}: expected a whole number >= 1."
                )
        for name, accepted in (("cp_backend", "torch"), ("sp_backend", "deepspeed")):
            if getattr(self, name) != accepted:
                raise ValueError(
                    f"ParallelismConfig.{name}={getattr(self, name)!r}: the one backend is "
                    f"{accepted!r}."
                )
        for size, field in (("tp_size", "tp_handler"), ("tp_size", "tp_plan"),
                            ("cp_size", "cp_handler"), ("sp_size", "sp_handler"),
                            ("pp_size", "pp_plan"), ("pp_size", "pp_schedule"),
                            ("pp_size", "pp_microbatches"),
                            ("pp_size", "pp_virtual_stages")):  # fmt: skip
            if getattr(self, field) is not None and getattr(self, size) == 1:
                raise ValueError(
                    f"ParallelismConfig({field}=...) with {size}=1: it would do nothing. Set "
                    f"{size} > 1, or drop {field}."
                )
        for dim in ("tp", "cp", "sp"):
            if getattr(self, f"{dim}_size") > 1 and getattr(self, f"{dim}_handler") is None:
                object.__setattr__(self, f"{dim}_handler", self._default_handler(dim))
        if self.cp_handler is not None and not isinstance(
            self.cp_handler, TorchContextParallelConfig
        ):
            raise ValueError(
                f"ParallelismConfig(cp_backend='torch') takes a TorchContextParallelConfig "
                f"as cp_handler, not {type(self.cp_handler).__name__}."
            )
        if self.cp_size > 1 and self.sp_size > 1:
            raise ValueError(
                f"ParallelismConfig(cp_size={self.cp_size}, sp_size={self.sp_size}): context "
                f"parallel and sequence parallel split the same sequence; set one of them to 1."
            )
        if self.pp_size > 1:
            from accel_parallel._pipeline_plan import check_pipeline_options

            check_pipeline_options(self)
        if (
            (self.tp_size > 1 or self.cp_size > 1 or self.pp_size > 1)
            and self.dp_replicate_enabled
            and not self.dp_shard_enabled
        ):
            raise ValueError(
                f"ParallelismConfig(dp_replicate_size={self.dp_replicate_size}, "
                f"dp_shard_size=1, tp_size={self.tp_size}, cp_size={self.cp_size}, "
                f"pp_size={self.pp_size}): tensor/context/pipeline parallel composes with "
                f"FSDP2 over the data-parallel ranks, not with pure replication. Use dp_shard_size="
                f"{self.dp_replicate_size} (same training, sharded) or add dp_shard_size>1 "
                f"for HSDP."
            )
        object.__setattr__(self, "_mesh", None)
        object.__setattr__(self, "_flat", {})

    # -- accelerate's derived names --------------------------------------------------------
    dp_replicate_enabled = property(lambda self: self.dp_replicate_size > 1)
    dp_shard_enabled = property(lambda self: self.dp_shard_size > 1)
    tp_enabled = property(lambda self: self.tp_size > 1)
    cp_enabled = property(lambda self: self.cp_size > 1)
    pp_enabled = property(lambda self: self.pp_size > 1)
    sp_enabled = property(lambda self: self.sp_size > 1)
    total_size = property(lambda self: self.data_parallel_size * self.non_data_parallel_size)
    data_parallel_size = property(lambda self: self.dp_replicate_size * self.dp_shard_size)
    non_data_parallel_size = property(
        lambda self: self.tp_size * self.cp_size * self.sp_size * self.pp_size
    )

    def _enabled(self, *dims: str) -> list[str]:
        return [d for d in dims if getattr(self, f"{d}_size") > 1]

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions over which batches differ."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks see the same batch."""
        return self._enabled("pp", "tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into the one FSDP2 shards parameters over."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions over which a loss is averaged."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP2 is applied over (2-D for HSDP)."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def model_shard_dim_names(self) -> list[str]:
        return self._enabled("dp_shard", "tp")

    @property
    def active_mesh_dims(self) -> list[str]:
        return [d for d in MESH_ORDER if getattr(self, f"{d}_size") > 1]

    @property
    def device_mesh(self) -> Any:
        """The mesh built by `build_device_mesh` / `get_device_mesh` (None before)."""
        return self._mesh

    # -- checks and the mesh -----------------------------------------------------------------
    def resolved(self, world_size: int) -> ParallelismConfig:
        """This configuration for `world_size` processes: every size left at 1 on several
        processes means plain data parallel; otherwise the product must equal `world_size`.
        Under sequence parallel the data-parallel sizes left at 1 become what the groups of
        `sp_size` leave (DeepSpeed's data parallel over them)."""
        if self.sp_enabled:
            if self.tp_size > 1 or self.pp_size > 1:
                raise ValueError(
                    f"ParallelismConfig(sp_size={self.sp_size}, tp_size={self.tp_size}, "
                    f"pp_size={self.pp_size}): DeepSpeed's sequence parallel composes with data "
                    f"parallel only; set tp_size=1 and pp_size=1, or sp_size=1."
                )
            if world_size % self.sp_size:
                raise ValueError(
                    f"ParallelismConfig(sp_size={self.sp_size}) does not divide the "
                    f"{world_size} processes; pick an sp_size that divides {world_size}."
                )
            if self.data_parallel_size == 1 and world_size > self.sp_size:
                return dataclasses.replace(self, dp_shard_size=world_size // self.sp_size)
        if self.total_size == 1 and world_size > 1:
            return dataclasses.replace(self, dp_replicate_size=world_size)
        if self.total_size != world_size:
            raise ValueError(
                f"ParallelismConfig: pp_size x dp_replicate_size x dp_shard_size x tp_size x "
                f"cp_size x sp_size = {self.pp_size} x {self.dp_replicate_size} x "
                f"{self.dp_shard_size} x {self.tp_size} x {self.cp_size} x {self.sp_size} = "
                f"{self.total_size}, but the run has "
                f"{world_size} processes. Pick sizes whose product is {world_size}, or launch {self.total_size} processes."
            )
        return self

    def _get_mesh(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(the enabled dimension names, their sizes), outermost first: what
        `build_device_mesh` hands `init_device_mesh`."""
        dims = tuple(self.active_mesh_dims)
        return dims, tuple(getattr(self, f"{d}_size") for d in dims)

    def build_device_mesh(self, device_type: str) -> Any:
        """Build the mesh over every process, with the flattened sub-meshes ``dp``,
        ``dp_shard_cp`` and ``dp_cp`` (sliced by the lists of their dimension names). None
        when every dimension is 1, or under DeepSpeed's sequence parallel (which makes its
        own groups). The sizes must multiply to the default process group's size, checked
        before the mesh is made where that group exists, else once `init_device_mesh` made it."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        dims, shape = self._get_mesh()
        if not dims or self.sp_enabled:
            return None
        had_group = dist.is_initialized()
        if had_group:
            self.resolved(dist.get_world_size())
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=dims)
        if not had_group and dist.is_initialized():
            self.resolved(dist.get_world_size())
        _forget_flattened(mesh)
        flat = {}
        for name, parts in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if parts:
                flat[name] = mesh[parts]._flatten(name)
        object.__setattr__(self, "_flat", flat)
        object.__setattr__(self, "_mesh", mesh)
        return mesh

    def sub_mesh(self, name: str, device_type: str | None = None) -> Any:
        """The 1-D mesh of one dimension, flattened ones included (kept when they were
        made: torch deprecates slicing them out of the whole mesh)."""
        mesh = self.get_device_mesh(device_type)
        return self._flat[name] if name in self._flat else mesh[name]

    def fsdp_mesh(self, device_type: str | None = None) -> Any:
        """The mesh FSDP2 shards over: ``dp_shard_cp``, with ``dp_replicate`` outside it
        (2-D) for HSDP."""
        mesh = self.get_device_mesh(device_type)
        shard = self.dp_shard_cp_dim_names
        if not self.dp_replicate_enabled:
            return self.sub_mesh("dp_shard_cp")
        if len(shard) == 1:
            return mesh[("dp_replicate", shard[0])]
        return mesh[("dp_replicate", "dp_shard_cp")]

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh built before, or built now for `device_type`."""
        mesh = self._mesh
        if mesh is None:
            if device_type is None:
                raise ValueError(
                    "get_device_mesh(): no mesh has been built yet; pass device_type "
                    "(e.g. 'cuda' or 'cpu') to build it."
                )
            return self.build_device_mesh(device_type)
        if device_type is not None and mesh.device_type != device_type:
            raise ValueError(
                f"get_device_mesh(device_type={device_type!r}): the mesh was built for "
                f"{mesh.device_type!r}; ask for that device type."
            )
        return mesh

    # -- from a launch -------------------------------------------------------------------------
    @classmethod
    def from_launch_config(cls, section: Mapping[str, Any]) -> ParallelismConfig | None:
        """From the ``parallelism_config`` section `accel launch` hands down (accelerate's
        YAML keys, ``parallelism_config_tp_size`` ...); None when the section is empty. With
        every size 1 the processes are data-parallel replicas (DDP), laid out on a mesh."""
        values = {
            str(k).removeprefix("parallelism_config_"): v
            for k, v in section.items()
            if v is not None
        }
        return cls._from_values(values, "the parallelism_config section of `accel launch`")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ParallelismConfig | None:
        """From accelerate's PARALLELISM_CONFIG_* variables in `environ`, or, with only
        ACCELERATE_USE_PARALLELISM_CONFIG=true, every process a replica (None when unset)."""
        values = {
            k.removeprefix(ENV_PREFIX).lower(): v
            for k, v in environ.items()
            if k.startswith(ENV_PREFIX) and v != ""
        }
        config = cls._from_values(values, "the PARALLELISM_CONFIG_* environment variables")
        use = environ.get(ENV_USE_PARALLELISM_CONFIG, "").strip().lower() in ("1", "true", "yes")
        return cls() if config is None and use else config

    @classmethod
    def _from_values(cls, values: Mapping[str, Any], where: str) -> ParallelismConfig | None:
        known = {*_SIZES, "sp_size", "cp_comm_strategy", *_SP_OPTIONS}
        for key, (inert, why) in _REFUSED_KEYS.items():
            if key in values and str(values[key]).lower() != str(inert).lower():
                raise ValueError(f"{where}: {key}={values[key]!r}: {why}.")
        unknown = sorted(set(values) - known - set(_REFUSED_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown}; accepted: {sorted(known)}.")
        sizes: dict[str, int] = {}
        for name in (*_SIZES, "sp_size"):
            if name in values:
                try:
                    sizes[name] = int(values[name])
                except (TypeError, ValueError):
                    raise ValueError(
                        f"{where}: {name}={values[name]!r} is not a whole number."
                    ) from None
        cp = values.get("cp_comm_strategy")
        if not values:
            return None
        handler = TorchContextParallelConfig(cp_comm_strategy=str(cp)) if cp else None
        if handler is not None and sizes.get("cp_size", 1) == 1:
            handler = None
        sp_handler = _sp_handler(values, where) if sizes.get("sp_size", 1) > 1 else None
        return cls(**sizes, cp_handler=handler, sp_handler=sp_handler)


def _sp_handler(values: Mapping[str, Any], where: str) -> DeepSpeedSequenceParallelConfig:
    """The sequence-parallel options of a launch (accelerate writes "None" for unset ones)."""
    given = {k: values[k] for k in _SP_OPTIONS if str(values.get(k, "None")) != "None"}
    if "sp_seq_length" in given:
        try:
            given["sp_seq_length"] = int(given["sp_seq_length"])
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: sp_seq_length={given['sp_seq_length']!r} is not a whole number."
            ) from None
    if "sp_seq_length_is_variable" in given:
        given["sp_seq_length_is_variable"] = str(given["sp_seq_length_is_variable"]).lower() in (
            "1", "true", "yes"
        )  # fmt: skip
    return DeepSpeedSequenceParallelConfig(**given)


def _sizes(config: ParallelismConfig) -> tuple[int, ...]:
    return tuple(getattr(config, n) for n in (*_SIZES, "sp_size"))


def resolve_parallelism_config(
    code: ParallelismConfig | None,
    *,
    world_size: int,
    launch_section: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ParallelismConfig | None:
    """The run's configuration: the code's, else `accel launch`'s section, else accelerate's
    PARALLELISM_CONFIG_* variables; resolved for `world_size` (None: no mesh asked for).
    Where the code and the launch disagree, the code wins and a warning names both."""
    import warnings

    launched = ParallelismConfig.from_launch_config(launch_section) if launch_section else None
    if launched is None and environ is not None:
        launched = ParallelismConfig.from_environment(environ)
    if code is None:
        config = launched
    else:
        if launched is not None and _sizes(launched) != _sizes(code):
            warnings.warn(
                f"The code passes {code!r} but the launch was configured with {launched!r}; "
                f"using the code's.",
                stacklevel=3,
            )
        config = code
    return None if config is None else config.resolved(world_size)


def _forget_flattened(mesh: Any) -> None:
    """Let a newly built `mesh` flatten its dimensions into meshes of its own.

    torch 2.9 keeps flattened meshes in one process-wide table keyed by meshes that compare
    equal by shape, names and device, so a mesh built again after the process group was
    destroyed and made anew (a second trace of `accel_parallel.memory`'s estimate, an
    Accelerator made after ``end_training`` in the same process) got the first mesh's flattened
    meshes back, whose groups no longer exist ("Could not resolve the process group registered
    under the name ..."). Later torch keeps them on each mesh, and has no such table.
    """
    from torch.distributed import device_mesh

    resources = getattr(device_mesh, "_mesh_resources", None)
    for table in ("root_to_flatten_mapping", "flatten_name_to_root_dims"):
        cached = getattr(resources, table, None)
        if isinstance(cached, dict):
            cached.pop(mesh, None)
