"""accelerate's `launch` flags that accel adds to its own launch flags, and what each does.

Every flag of accelerate 1.15's `launch` is accepted with the same spelling, type and
default. Each one here is either honoured (passed to torchrun, to the workers' launch
configuration, or acted on by the launcher) or refused before anything starts, with the
reason and what to use instead. None is accepted and ignored; a flag left at its default
asks for nothing and is never refused.

Argparse defaults are None so that resolution can tell a given flag from one left out;
`Flag.default` is accelerate's default, the value a flag left out stands for.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

# Why a group of flags is refused, and what to use instead.
TPU = (
    "torch no longer ships TorchDynamo's TPU backends (torch-xla registers 'openxla'); on XLA "
    "devices launch with --tpu and compile in the script, or pass --dynamo_backend no"
)
TPU_POD = (
    "the TPU pod launcher ran torch-xla's xla_dist, which torch-xla 2.1 removed; run `accel "
    "launch --tpu SCRIPT` on every worker of the pod instead (`accel tpu-config --tpu_name NAME "
    "--tpu_zone ZONE --command 'accel launch --tpu SCRIPT'` runs it on all of them)"
)
DOWNCAST_BF16 = (
    "--downcast_bf16 set XLA_DOWNCAST_BF16, which torch-xla 2.9 no longer reads; bf16 on XLA "
    "runs through autocast (--mixed_precision bf16), which leaves float64 tensors as they are"
)
SAGEMAKER = (
    "Amazon SageMaker is not provided by accel: `accel launch` runs on this machine; submit "
    "SageMaker jobs with `accelerate launch` or the SageMaker Python SDK"
)
MSAMP = (
    "MS-AMP is not supported by accel-precision; use --fp8_backend te (TransformerEngine) or "
    "ao (torchao)"
)


def str_to_bool(value: str) -> bool:
    """'yes'/'true'/'1'/... -> True, 'no'/'false'/'0'/... -> False (accelerate's spellings)."""
    text = str(value).strip().lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid truth value {value!r}: expected true or false")


def bool_triple(value: str) -> tuple[bool, bool, bool]:
    """'false,true,false' -> (False, True, False): fprop, dgrad, wgrad."""
    parts = tuple(str_to_bool(v) for v in str(value).strip("()[] ").split(","))
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected three comma-separated booleans (fprop,dgrad,wgrad)"
        )
    return parts  # type: ignore[return-value]


def loose_bool(value: str) -> bool:
    """Any non-empty string is True: accelerate parses its megatron_lm booleans with `bool`."""
    return bool(value)


@dataclasses.dataclass(frozen=True)
class Flag:
    """One accelerate launch flag as accel declares it."""

    name: str  # accelerate's dest; the flag is --name and --name-with-dashes
    default: Any = None  # accelerate's default (what a flag left out means)
    type: Callable[[str], Any] | None = None  # None: store_true
    choices: tuple[Any, ...] | None = None
    help: str = ""
    refused: str | None = None  # why accel does not provide it (None: honoured)
    options: tuple[str, ...] = ()  # the option strings, when not the usual two
    append: bool = False  # repeatable (--vm, --env)

    @property
    def option_strings(self) -> tuple[str, ...]:
        if self.options:
            return self.options
        dashed = f"--{self.name.replace('_', '-')}"
        return (f"--{self.name}",) if dashed == f"--{self.name}" else (f"--{self.name}", dashed)

    def is_default(self, value: Any) -> bool:
        """Whether `value` asks for nothing beyond the flag's default."""
        if value is None or value == self.default:
            return True
        if self.type is None:  # store_true: False is the default
            return not value
        return str(value).strip().lower() == str(self.default).strip().lower()


def _f(name: str, default: Any = None, kind: Any = str, **kw: Any) -> Flag:
    return Flag(name, default, kind, **kw)


def _switch(name: str, **kw: Any) -> Flag:
    return Flag(name, False, None, **kw)


DYNAMO_BACKENDS = (
    "no",
    "eager",
    "aot_eager",
    "inductor",
    "aot_ts_nvfuser",
    "nvprims_nvfuser",
    "cudagraphs",
    "ofi",
    "fx2trt",
    "onnxrt",
    "tensorrt",
    "aot_torchxla_trace_once",
    "torhchxla_trace_once",
    "tvm",
)
# Backends torch no longer ships, and the XLA ones: refused before the launch.
REFUSED_DYNAMO_BACKENDS = {
    "aot_ts_nvfuser": "nvFuser was removed from torch; use inductor",
    "nvprims_nvfuser": "nvFuser was removed from torch; use inductor",
    "ofi": "torch no longer ships the 'ofi' backend; use inductor",
    "fx2trt": "torch no longer ships the 'fx2trt' backend; use tensorrt (torch-tensorrt) or inductor",
    "aot_torchxla_trace_once": TPU,
    "torhchxla_trace_once": TPU,
}

_DYNAMO = (
    _f("dynamo_backend", kind=str, choices=DYNAMO_BACKENDS, help="torch.compile backend ('no': "
       "no compilation)."),
    _f("dynamo_mode", "default", choices=("default", "reduce-overhead", "max-autotune"),
       help="torch.compile mode."),
    _switch("dynamo_use_fullgraph", help="Compile the whole model as one graph (no breaks)."),
    _switch("dynamo_use_dynamic", help="Trace with dynamic shapes."),
    _switch("dynamo_use_regional_compilation",
            help="Compile each repeated block (children of an nn.ModuleList) instead of the whole "
                 "model."),
)  # fmt: skip

_FP8 = (
    _f("fp8_backend", choices=("ao", "te", "msamp"), help="fp8 backend: te (TransformerEngine) or "
       "ao (torchao); default: the first installed."),
    _switch("fp8_use_autocast_during_eval", help="TE: run eval forwards in fp8 too."),
    _f("fp8_margin", 0, int, help="TE: margin of the scaling factor."),
    _f("fp8_interval", 1, int, help="TE: steps between scaling factor updates."),
    _f("fp8_format", "HYBRID", choices=("HYBRID", "E4M3", "E5M2"), help="TE: fp8 format."),
    _f("fp8_amax_history_len", 1024, int, help="TE: amax history length."),
    _f("fp8_amax_compute_algo", "most_recent", choices=("max", "most_recent"),
       help="TE: how amax is taken from the history."),
    _f("fp8_override_linear_precision", (False, False, False), bool_triple,
       help="TE: fprop,dgrad,wgrad GEMMs in higher precision, e.g. false,false,true."),
    _f("fp8_opt_level", "O2", choices=("O1", "O2"), help="MS-AMP opt level (not supported)."),
    _f("fp8_enable_fsdp_float8_all_gather", True, str_to_bool,
       help="ao: float8 all-gather under FSDP2."),
    _f("fp8_pad_inner_dim", True, str_to_bool, help="ao: pad GEMM inner dimensions to 16."),
)  # fmt: skip

# Flags whose value goes into a config-file section handed to the workers: flag -> (section, key).
SECTION_KEYS: dict[str, tuple[str, str]] = {
    **{f.name: ("dynamo_config", f.name) for f in _DYNAMO},
    "fp8_backend": ("fp8_config", "backend"),
    "fp8_use_autocast_during_eval": ("fp8_config", "use_autocast_during_eval"),
    "fp8_margin": ("fp8_config", "margin"),
    "fp8_interval": ("fp8_config", "interval"),
    "fp8_format": ("fp8_config", "fp8_format"),
    "fp8_amax_history_len": ("fp8_config", "amax_history_length"),
    "fp8_amax_compute_algo": ("fp8_config", "amax_compute_algorithm"),
    "fp8_override_linear_precision": ("fp8_config", "override_linear_precision"),
    "fp8_opt_level": ("fp8_config", "optimization_level"),
    "fp8_enable_fsdp_float8_all_gather": ("fp8_config", "enable_fsdp_float8_all_gather"),
    "fp8_pad_inner_dim": ("fp8_config", "pad_inner_dim"),
}

_TORCHRUN = (
    _f("tee", "0", options=("-t", "--tee"), help="torchrun: tee each worker's output to a log file "
       "as well as the console (0 none, 1 stdout, 2 stderr, 3 both)."),
    _f("log_dir", help="torchrun: folder for the workers' log files."),
    _f("role", "default", options=("--role",), help="torchrun: role name of the workers."),
    _f("rdzv_conf", "", help="torchrun: extra rendezvous settings, k1=v1,k2=v2."),
    _f("nnodes", help="torchrun's spelling of --num_machines; MIN:MAX (e.g. 1:4) makes the run "
       "elastic: it starts and goes on with MIN to MAX machines (with --rdzv_backend c10d)."),
    _f("nproc_per_node", help="torchrun's spelling: processes per machine (--num_processes is "
       "this times the machines, the most of an elastic range)."),
    _f("rdzv_endpoint", help="torchrun's spelling of --main_process_ip and --main_process_port: "
       "HOST:PORT of the rendezvous, the same on every machine."),
    _f("rdzv_id", help="torchrun: the job's id, the same on every machine (default 'none')."),
    _f("monitor_interval", 0.1, float, help="torchrun: seconds between checks of the workers."),
    Flag("no_python", None, None, help="Run SCRIPT as a program, without `python`."),
)  # fmt: skip

_OTHER = (
    _switch("enable_cpu_affinity", help="Pin each process to its share of this machine's cores."),
    _switch("same_network", help="Machines share a network: rendezvous on --main_process_ip "
            "and --main_process_port directly."),
    Flag("debug", None, None, help="Check tensor shapes on every process before each gather, "
         "reduce, broadcast and pad, and fail on a mismatch instead of hanging."),
    _f("mpirun_hostfile", help="Start the CPU processes with mpirun and this hostfile."),
    _f("main_training_function", help="With --tpu: the script's function each XLA process "
       "runs (default main); without --tpu, refused unless 'main'."),
    _switch("downcast_bf16", refused=DOWNCAST_BF16),
    _f("gradient_clipping", kind=float, help="DeepSpeed: clip every step to this norm "
       "(without it, only accelerator.clip_grad_norm_ in the loop clips)."),
)  # fmt: skip

_TPU = (
    _switch("tpu", help="Run on this host's XLA devices (TPU; XLA's CPU device with "
            "PJRT_DEVICE=CPU) through torch-xla's launcher: one process per device, each "
            "calling --main_training_function (accelerate's tpu_launcher)."),
    _switch("tpu_use_cluster", options=("--tpu_cluster", "--tpu-cluster"), refused=TPU_POD),
    Flag("no_tpu_cluster", None, None, options=("--no_tpu_cluster", "--no-tpu-cluster"),
         help="With --tpu: this host's devices only (what --tpu does: the pod launcher is "
         "refused)."),
    _switch("tpu_use_sudo", refused=TPU_POD),
    _f("vm", append=True, refused=TPU_POD),
    _f("env", append=True, refused=TPU_POD),
)  # fmt: skip

_SAGEMAKER = (
    _f("aws_access_key_id", refused=SAGEMAKER),
    _f("aws_secret_access_key", refused=SAGEMAKER),
)

DEEPSPEED_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "slurm", "nossh")
_DEEPSPEED = (
    _switch("use_deepspeed", help="Train with DeepSpeed ZeRO; the flags below set its "
            "deepspeed_config (accelerate's keys)."),
    _f("deepspeed_config_file", help="A DeepSpeed JSON config; \"auto\" values are filled "
       "from the run at prepare."),
    _f("zero_stage", kind=int, help="ZeRO stage: 0, 1, 2 (default) or 3."),
    _f("offload_optimizer_device", help="none, cpu (DeepSpeedCPUAdam) or nvme: where the "
       "optimizer state lives."),
    _f("offload_param_device", help="none, cpu or nvme: where ZeRO-3 parameters live."),
    _f("offload_optimizer_nvme_path", help="Folder for --offload_optimizer_device nvme."),
    _f("offload_param_nvme_path", help="Folder for --offload_param_device nvme."),
    _f("zero3_init_flag", help="ZeRO-3: partition parameters as the model "
       "is built (DeepSpeedPlugin.zero3_init())."),
    _f("zero3_save_16bit_model", help="ZeRO-3: gather full 16-bit weights "
       "for get_state_dict / save_model."),
    _f("deepspeed_hostfile", help="Hostfile (`host slots=N` lines): several machines through "
       "DeepSpeed's runner."),
    _f("deepspeed_exclusion_filter", help="DeepSpeed runner --exclude, e.g. worker-2:0,1."),
    _f("deepspeed_inclusion_filter", help="DeepSpeed runner --include, e.g. worker-1:0."),
    _f("deepspeed_multinode_launcher", help="How DeepSpeed's runner reaches the machines: "
       f"{', '.join(DEEPSPEED_LAUNCHERS)} (default pdsh; standard: torchrun on each machine)."),
    _f("deepspeed_moe_layer_cls_names", help="Comma-separated MoE layer classes kept whole "
       "under ZeRO-3."),
)  # fmt: skip
SECTION_KEYS.update({f.name: ("deepspeed_config", f.name) for f in _DEEPSPEED[1:]})
SECTION_KEYS["gradient_clipping"] = ("deepspeed_config", "gradient_clipping")

_FSDP = (
    _switch("use_fsdp", help="Shard parameters, gradients and optimizer state with FSDP2 "
            "(torch's fully_shard); the fsdp_* flags below set its fsdp_config."),
    _f("fsdp_version", "1", choices=("1", "2"), help="1 is translated to FSDP2 with a notice."),
    _f("fsdp_offload_params", "false", help="Keep the shards on the CPU."),
    _f("fsdp_min_num_params", 100000000, int, help="size_based_wrap: parameters per group."),
    _f("fsdp_sharding_strategy", "FULL_SHARD", help="FSDP1 name, translated "
       "(FULL_SHARD / SHARD_GRAD_OP -> reshard_after_forward)."),
    _f("fsdp_reshard_after_forward", "true", help="Free gathered parameters after forward."),
    _f("fsdp_auto_wrap_policy", help="TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP."),
    _f("fsdp_transformer_layer_cls_to_wrap", help="Comma-separated class names to shard "
       "separately (default: the model's _no_split_modules)."),
    _f("fsdp_backward_prefetch", help="FSDP1 only: dropped with a notice."),
    _f("fsdp_state_dict_type", help="SHARDED_STATE_DICT or FULL_STATE_DICT."),
    _f("fsdp_forward_prefetch", "false", help="Gather the next block during forward."),
    _f("fsdp_use_orig_params", "true", help="FSDP1 only: dropped with a notice."),
    _f("fsdp_cpu_ram_efficient_loading", "true", help="Rank 0 holds the weights; the others "
       "receive their shards at prepare."),
    _f("fsdp_sync_module_states", "true", help="FSDP1 only: dropped with a notice."),
    _f("fsdp_activation_checkpointing", "false", help="Recompute block activations."),
    _f("fsdp_activation_checkpointing_offload", "false",
       refused="offloading checkpointed activations is not supported by accel's FSDP2; use "
       "--fsdp_activation_checkpointing alone"),
)  # fmt: skip
SECTION_KEYS.update({f.name: ("fsdp_config", f.name) for f in _FSDP if f.name != "use_fsdp"})

_MEGATRON = (
    _switch(
        "use_megatron_lm",
        help="Pipeline / tensor parallel as accelerate's Megatron-LM plugin asks, on accel's "
        "device mesh (MegatronLMPlugin); the --megatron_lm_* flags fill it.",
    ),
    _f("megatron_lm_tp_degree", 1, int),
    *(
        _f(f"megatron_lm_{n}", False, loose_bool)
        for n in (
            "use_custom_fsdp",
            "no_load_optim",
            "eod_mask_loss",
            "overlap_cpu_optimizer_d2h_h2d",
            "no_save_optim",
            "optimizer_cpu_offload",
            "use_precision_aware_optimizer",
        )
    ),
    _f("megatron_lm_decoder_last_pipeline_num_layers", kind=int),
    _f("megatron_lm_pp_degree", 1, int),
    _f("megatron_lm_num_micro_batches", kind=int),
    _f("megatron_lm_sequence_parallelism"),
    _f("megatron_lm_recompute_activations"),
    _f("megatron_lm_use_distributed_optimizer"),
    _f("megatron_lm_gradient_clipping", 1.0, float),
    _f("megatron_lm_recompute_granularity"),
    _f("megatron_lm_recompute_method"),
    _f("megatron_lm_recompute_num_layers", kind=int),
    _f("megatron_lm_attention_backend"),
    _f("megatron_lm_expert_model_parallel_size", kind=int),
    _f("megatron_lm_context_parallel_size", kind=int),
    _f("megatron_lm_attention_dropout", kind=float),
    _f("megatron_lm_hidden_dropout", kind=float),
    _f("megatron_lm_attention_softmax_in_fp32"),
    _f("megatron_lm_expert_tensor_parallel_size", kind=int),
    _f("megatron_lm_calculate_per_token_loss"),
    _f("megatron_lm_use_rotary_position_embeddings"),
)

SECTION_KEYS.update(
    {f.name: ("megatron_lm_config", f.name) for f in _MEGATRON if f.name != "use_megatron_lm"}
)

_PARALLELISM = (
    _switch("use_parallelism_config", help="Lay the processes out on a device mesh; the sizes "
            "below shape it (none given: every process a data-parallel replica, DDP)."),
    _f("parallelism_config_dp_replicate_size", 1, int, help="Replicas of the model (HSDP's "
       "outer dimension)."),
    _f("parallelism_config_dp_shard_size", 1, int, help="FSDP2 shards parameters over this "
       "many processes."),
    _f("parallelism_config_tp_size", 1, int, help="Tensor parallel: each weight split this "
       "many ways."),
    _f("parallelism_config_cp_size", 1, int, help="Context parallel (CUDA only): sequences "
       "split this many ways."),
    _f("parallelism_config_cp_backend", "torch", choices=("torch",), help="torch's ring "
       "attention."),
    _f("parallelism_config_cp_comm_strategy", "allgather", choices=("allgather", "alltoall"),
       help="How the ring attention exchanges keys and values."),
    _f("parallelism_config_sp_size", 1, int, help="DeepSpeed's sequence parallel (ALST / "
       "Ulysses, with --use_deepspeed): how many processes share each sequence."),
    _f("parallelism_config_sp_backend", "deepspeed", choices=("deepspeed",)),
    _f("parallelism_config_sp_seq_length", help="The one sequence length of every batch."),
    _f("parallelism_config_sp_seq_length_is_variable", True, loose_bool),
    _f("parallelism_config_sp_attn_implementation", "sdpa"),
)  # fmt: skip
SECTION_KEYS.update({
    f.name: ("parallelism_config", f.name)
    for f in _PARALLELISM if f.type is not None and not f.refused
})  # fmt: skip

# accel's own: this launch is one replica group of a fault-tolerant run (torchft; the
# worker's FaultTolerancePlugin, unless the script passes its own).
_FT = (
    _f("ft_replica_group_id", kind=int, help="This launch's replica group, 0 .. N-1 (one "
       "`accel launch` per group; each its own --main_process_port on a shared machine)."),
    _f("ft_num_replica_groups", kind=int, help="How many replica groups train together."),
    _f("ft_min_replica_groups", 1, int, help="The fewest groups a step commits with."),
    _f("ft_lighthouse", help="The lighthouse's address, http://HOST:PORT (`accel lighthouse` "
       "prints it; default: $TORCHFT_LIGHTHOUSE)."),
    _f("ft_timeout", 30.0, float, help="Seconds for connecting, a quorum, a collective, a "
       "commit; above the lighthouse's heartbeat timeout (a survivor's quorum waits that long)."),
    _f("ft_heartbeat_timeout_ms", 5000, int, help="The lighthouse's --heartbeat_timeout_ms "
       "(default 5000, as `accel lighthouse`'s): --ft_timeout must exceed it."),
    _f("ft_semi_sync", choices=("local_sgd", "diloco"), help="Synchronize every "
       "--ft_sync_every steps instead of every step: local_sgd averages the weights, diloco "
       "the pseudo-gradients (outer Nesterov SGD)."),
    _f("ft_sync_every", kind=int, help="Steps between synchronizations (with --ft_semi_sync)."),
)  # fmt: skip
SECTION_KEYS.update({f.name: ("fault_tolerance_config", f.name[3:]) for f in _FT})

FLAGS: tuple[Flag, ...] = (
    *_DYNAMO,
    *_FP8,
    *_TORCHRUN,
    *_OTHER,
    *_FT,
    *_TPU,
    *_SAGEMAKER,
    *_DEEPSPEED,
    *_FSDP,
    *_MEGATRON,
    *_PARALLELISM,
)
BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}

_GROUPS = (
    ("torch.compile (dynamo)", _DYNAMO),
    ("fp8 (with --mixed_precision fp8)", _FP8),
    ("torchrun", _TORCHRUN),
    ("other", _OTHER),
    ("fault tolerance across replica groups (torchft; accel-parallel[ft])", _FT),
    ("TPU (XLA devices through torch-xla; the pod launcher is refused)", _TPU),
    ("refused: SageMaker", _SAGEMAKER),
    ("DeepSpeed ZeRO (with --use_deepspeed, or distributed_type: DEEPSPEED)", _DEEPSPEED),
    ("FSDP2 (with --use_fsdp, or distributed_type: FSDP in the file)", _FSDP),
    ("Megatron-LM plugin (with --use_megatron_lm): mapped onto accel's mesh", _MEGATRON),
    ("ParallelismConfig: one device mesh (parallelism_config)", _PARALLELISM),
)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag of `FLAGS` to the launch parser, each in its group."""
    for title, flags in _GROUPS:
        group = parser.add_argument_group(title)
        for flag in flags:
            kwargs: dict[str, Any] = {"dest": flag.name, "default": None}
            text = flag.help or f"Refused: {flag.refused}."
            if flag.default not in (None, False):
                text += f" (default: {flag.default})"
            if flag.type is None:
                kwargs["action"] = "store_true"
            else:
                kwargs["type"] = flag.type
                kwargs["action"] = "append" if flag.append else "store"
                if flag.choices:
                    kwargs["choices"] = flag.choices
                else:
                    kwargs["metavar"] = "VALUE"
            group.add_argument(*flag.option_strings, help=text, **kwargs)


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of `FLAGS` that the command line set, by name."""
    return {f.name: getattr(args, f.name) for f in FLAGS if getattr(args, f.name) is not None}


def effective(name: str, given: Mapping[str, Any]) -> Any:
    """A flag's value: the one given, else accelerate's default."""
    value = given.get(name)
    return BY_NAME[name].default if value is None else value
