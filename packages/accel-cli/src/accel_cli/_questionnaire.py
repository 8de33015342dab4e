"""`accel config`: ask about the setup and return the content of a config file.

The questions follow the order of accelerate's questionnaire (machine type, machines,
engine, processes, devices, precision) and the answers become the keys `accel config
default` writes, plus the `fsdp_config`, `deepspeed_config`, `parallelism_config`,
`dynamo_config` and `fp8_config` sections where they apply. Choices are numbered; an answer
is the number or the choice's text, and an empty answer takes the default shown in brackets.
Answers come from stdin, so they can be piped in, one per line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeVar

from accel_cli import _schema
from accel_cli._config import ConfigError, default_file_values

T = TypeVar("T")

_MACHINE_TYPES = ("NO", *(t for t in _schema.DISTRIBUTED_TYPES if t.startswith("MULTI_")))
_MACHINE_LABELS = {
    "NO": "No distributed training (one process)",
    **{t: f"multi-{t.removeprefix('MULTI_')}" for t in _MACHINE_TYPES[1:]},
}
ENGINES = ("DDP", "FSDP2", "DEEPSPEED")
_ENGINE_LABELS = {
    "DDP": "none: one device, or DDP over several",
    "FSDP2": "FSDP2 (fully sharded data parallel)",
    "DEEPSPEED": "DeepSpeed ZeRO",
}
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
_FSDP2_STATE_DICTS = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
_DS_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh", "slurm")
_DYNAMO_BACKENDS = ("inductor", "eager", "aot_eager", "cudagraphs", "onnxrt", "tensorrt")
_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")


class Asker:
    """Asks one question at a time on `out` and reads each answer as one line of `inp`."""

    def __init__(self, inp: TextIO | None = None, out: TextIO | None = None) -> None:
        self.inp = inp if inp is not None else sys.stdin
        self.out = out if out is not None else sys.stdout

    def _line(self, prompt: str) -> str:
        self.out.write(prompt)
        self.out.flush()
        line = self.inp.readline()
        if not line:
            raise ConfigError(
                f"The answers ended before the question {prompt.strip()!r}; nothing was written."
            )
        if not self.inp.isatty():  # echo piped answers so the transcript reads as a dialogue
            self.out.write(line if line.endswith("\n") else line + "\n")
        return line.strip()

    def ask(
        self,
        question: str,
        convert: Callable[[str], T],
        default: T | None = None,
    ) -> T:
        """A free answer, converted; a bad one is explained and asked again."""
        shown = "" if default is None else f" [{_show(default)}]"
        while True:
            text = self._line(f"{question}{shown}: ")
            if not text and default is not None:
                return default
            try:
                return convert(text)
            except ValueError as err:
                self.out.write(f"  {text!r}: {err}; try again.\n")

    def yes(self, question: str, default: bool = False) -> bool:
        return self.ask(question, _yes_no, default)

    def choose(
        self,
        question: str,
        options: Sequence[T],
        default: int = 0,
        labels: dict[Any, str] | None = None,
    ) -> T:
        """One of `options`, by number or by name."""
        labels = labels or {}
        self.out.write(f"{question}\n")
        for i, option in enumerate(options):
            self.out.write(f"  {i}) {labels.get(option, option)}\n")

        def pick(text: str) -> T:
            if text.isdigit() and int(text) < len(options):
                return options[int(text)]
            for option in options:
                if text.lower() in (str(option).lower(), labels.get(option, "").lower()):
                    return option
            raise ValueError(f"{text!r} is not a number from 0 to {len(options) - 1}")

        while True:
            text = self._line(f"Choose 0-{len(options) - 1} [{default}]: ")
            if not text:
                return options[default]
            try:
                return pick(text)
            except ValueError as err:
                self.out.write(f"  {err}; try again.\n")


def _show(value: Any) -> str:
    return "yes" if value is True else "no" if value is False else str(value)


def _yes_no(text: str) -> bool:
    answer = text.strip().lower()
    if answer in ("y", "yes", "true", "1"):
        return True
    if answer in ("n", "no", "false", "0"):
        return False
    raise ValueError(f"{text!r} is not yes or no")


def _int_at_least(low: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)
        if value < low:
            raise ValueError(f"{value} is below {low}")
        return value

    return convert


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"{value} is not positive")
    return value


def run_questionnaire(asker: Asker) -> dict[str, Any]:
    """Ask every question that applies and return the file's content."""
    env = asker.choose(
        "In which compute environment are you running?",
        ("LOCAL_MACHINE", "AMAZON_SAGEMAKER"),
        labels={"LOCAL_MACHINE": "This machine", "AMAZON_SAGEMAKER": "AWS (Amazon SageMaker)"},
    )
    if env == "AMAZON_SAGEMAKER":
        raise ConfigError(
            "accel launches on the machines you run it on; for SageMaker jobs use accelerate's "
            "`accelerate config`. Nothing was written."
        )
    machine = asker.choose(
        "Which type of machine are you using?", _MACHINE_TYPES, labels=_MACHINE_LABELS
    )
    values: dict[str, Any] = {}
    num_machines = 1
    if machine != "NO":
        num_machines = _ask_machines(asker, values)
        values["debug"] = asker.yes(
            "Check collectives for mismatched shapes while running (slower, catches hangs)?"
        )
    cpu = machine == "MULTI_CPU" or (
        machine == "NO" and asker.yes("Run on the CPU only, even when an accelerator is visible?")
    )
    if asker.yes("Compile the model with torch.compile (dynamo)?"):
        values["dynamo_config"] = _ask_dynamo(asker)
    engine = "DDP"
    if not (cpu and machine == "NO"):
        engines = ENGINES if not cpu else ENGINES[:2]
        engine = asker.choose("Which training engine?", engines, labels=_ENGINE_LABELS, default=0)
    num_processes = _ask_processes(asker, machine, engine, num_machines)
    if engine == "FSDP2":
        values["fsdp_config"] = _ask_fsdp2(asker)
        mesh = _ask_mesh(asker, num_processes)
        if mesh:
            values["parallelism_config"] = mesh
    elif engine == "DEEPSPEED":
        values["deepspeed_config"] = _ask_deepspeed(asker, num_machines)
    if not cpu:
        values["gpu_ids"] = asker.ask(
            "Which devices (by index) on this machine, comma-separated?", _gpu_ids, "all"
        )
    precision = _ask_precision(asker, values)
    base = default_file_values(mixed_precision=precision or "no", cpu=cpu, num_processes=1)
    base["num_processes"] = num_processes
    base["distributed_type"] = _distributed_type(machine, engine, num_processes, num_machines)
    base["num_machines"] = num_machines
    if precision is None:  # the DeepSpeed JSON file decides
        del base["mixed_precision"]
    base.update(values)
    return base


def _distributed_type(machine: str, engine: str, processes: int, machines: int) -> str:
    if engine == "FSDP2":
        return "FSDP"
    if engine == "DEEPSPEED":
        return "DEEPSPEED"
    return "NO" if processes == 1 and machines == 1 else machine


def _ask_machines(asker: Asker, values: dict[str, Any]) -> int:
    machines = asker.ask("How many machines?", _int_at_least(1), 1)
    if machines == 1:
        return 1
    values["machine_rank"] = asker.ask(
        f"What is the rank of this machine (0 to {machines - 1}, 0 for the main one)?",
        _int_below(machines),
        0,
    )
    values["main_process_ip"] = asker.ask("What is the IP address of the main machine?", _nonempty)
    values["main_process_port"] = asker.ask(
        "Which port on the main machine for the rendezvous?", _port, 29500
    )
    values["same_network"] = asker.yes("Are all the machines on the same local network?", True)
    if not values["same_network"]:
        values["rdzv_backend"] = asker.choose(
            "Which rendezvous backend?", _schema.RDZV_BACKENDS, default=1
        )
    return machines


def _int_below(high: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        value = int(text)
        if not 0 <= value < high:
            raise ValueError(f"{value} is not between 0 and {high - 1}")
        return value

    return convert


def _nonempty(text: str) -> str:
    if not text:
        raise ValueError("an answer is needed")
    return text


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(f"{value} is not a port (1 to 65535)")
    return value


def _gpu_ids(text: str) -> str:
    cleaned = text.replace(" ", "")
    if cleaned.lower() == "all":
        return "all"
    if not cleaned or not all(part.isdigit() for part in cleaned.split(",")):
        raise ValueError(f"{text!r} is not 'all' or indices such as 0,1")
    return cleaned


def _ask_processes(asker: Asker, machine: str, engine: str, machines: int) -> int:
    if machine == "NO" and engine == "DDP":
        return 1
    low = 2 if machines == 1 and engine == "DDP" else machines

    def convert(text: str) -> int:
        value = _int_at_least(low)(text)
        if value % machines:
            raise ValueError(f"{value} is not a multiple of the {machines} machines")
        return value

    default = low if machine == "NO" else max(low, 2)
    return asker.ask("How many processes in all (across every machine)?", convert, default)


def _ask_dynamo(asker: Asker) -> dict[str, Any]:
    backend = asker.choose("Which dynamo backend?", _DYNAMO_BACKENDS)
    out: dict[str, Any] = {"dynamo_backend": backend.upper()}
    if asker.yes("Change the defaults passed to torch.compile?"):
        out["dynamo_mode"] = asker.choose("Which mode?", _DYNAMO_MODES)
        out["dynamo_use_fullgraph"] = asker.yes("Compile the whole model as one graph?")
        out["dynamo_use_dynamic"] = asker.yes("Trace dynamic shapes?")
        out["dynamo_use_regional_compilation"] = asker.yes(
            "Compile repeated blocks once (regional compilation)?"
        )
    return out


def _ask_fsdp2(asker: Asker) -> dict[str, Any]:
    out: dict[str, Any] = {"fsdp_version": 2}
    out["fsdp_reshard_after_forward"] = asker.yes(
        "Free the gathered parameters after forward (reshard_after_forward)?", True
    )
    out["fsdp_offload_params"] = asker.yes("Offload parameters and gradients to the CPU?")
    policy = asker.choose("Which auto wrap policy?", _WRAP_POLICIES)
    out["fsdp_auto_wrap_policy"] = policy
    if policy == "TRANSFORMER_BASED_WRAP":
        classes = asker.ask(
            "Layer classes to wrap, comma-separated (empty: the model's _no_split_modules)",
            str,
            "",
        )
        if classes:
            out["fsdp_transformer_layer_cls_to_wrap"] = classes
    elif policy == "SIZE_BASED_WRAP":
        out["fsdp_min_num_params"] = asker.ask(
            "Smallest number of parameters of a wrapped module?", _int_at_least(1), 100_000_000
        )
    out["fsdp_state_dict_type"] = asker.choose("Which state dict type?", _FSDP2_STATE_DICTS)
    out["fsdp_cpu_ram_efficient_loading"] = asker.yes(
        "Load the weights on rank 0 only and send them to the others (saves CPU RAM)?", True
    )
    out["fsdp_activation_checkpointing"] = asker.yes("Use activation checkpointing?")
    return out


def _ask_mesh(asker: Asker, num_processes: int) -> dict[str, Any]:
    if not asker.yes("Set the device mesh (data replicate, tensor and context parallel sizes)?"):
        return {}
    while True:
        replicate = asker.ask("Data parallel replicate size?", _int_at_least(1), 1)
        tp = asker.ask("Tensor parallel size?", _int_at_least(1), 1)
        cp = asker.ask("Context parallel size?", _int_at_least(1), 1)
        if num_processes % (replicate * tp * cp) == 0:
            break
        asker.out.write(
            f"  {replicate} x {tp} x {cp} does not divide the {num_processes} processes; "
            f"try again.\n"
        )
    shard = num_processes // (replicate * tp * cp)
    asker.out.write(f"  the FSDP shard size is what is left: {shard}\n")
    prefix = "parallelism_config_"
    mesh = {
        prefix + "dp_replicate_size": replicate,
        prefix + "dp_shard_size": shard,
        prefix + "tp_size": tp,
        prefix + "cp_size": cp,
    }
    if cp > 1:
        mesh[prefix + "cp_comm_strategy"] = asker.choose(
            "Context parallel communication?", ("allgather", "alltoall")
        )
    return mesh


def _ask_deepspeed(asker: Asker, num_machines: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if asker.yes("Use a DeepSpeed JSON config file?"):
        out["deepspeed_config_file"] = asker.ask("Path of the JSON file?", _nonempty)
    else:
        out["zero_stage"] = asker.choose("Which ZeRO stage?", (0, 1, 2, 3), default=2)
        if out["zero_stage"] >= 2:
            for what, key in (("optimizer states", "optimizer"), ("parameters", "param")):
                device = asker.choose(f"Offload {what} to?", _OFFLOAD_DEVICES)
                out[f"offload_{key}_device"] = device
                if device == "nvme":
                    out[f"offload_{key}_nvme_path"] = asker.ask(
                        f"NVMe path for the {what}?", _nonempty, "/nvme"
                    )
        out["gradient_accumulation_steps"] = asker.ask(
            "Gradient accumulation steps?", _int_at_least(1), 1
        )
        if asker.yes("Clip gradients?"):
            out["gradient_clipping"] = asker.ask("Clip to what norm?", _positive_float, 1.0)
        if out["zero_stage"] == 3:
            out["zero3_save_16bit_model"] = asker.yes("Save a 16-bit model with ZeRO-3?")
    if out.get("zero_stage", 3) == 3:  # ZeRO-3, or a JSON file that may say so
        out["zero3_init_flag"] = asker.yes("Build the model already partitioned (zero3_init)?")
    if num_machines > 1:
        launcher = asker.choose("Which multi-node launcher?", _DS_LAUNCHERS)
        out["deepspeed_multinode_launcher"] = launcher
        if launcher != "standard":
            out["deepspeed_hostfile"] = asker.ask("Path of the hostfile?", _nonempty)
    return out


def _ask_precision(asker: Asker, values: dict[str, Any]) -> str | None:
    if "deepspeed_config_file" in values.get("deepspeed_config", {}):
        return None
    precision = asker.choose("Which mixed precision?", ("no", "fp16", "bf16", "fp8"))
    if precision == "fp8":
        backend = asker.choose(
            "Which fp8 backend?",
            ("AO", "TE"),
            labels={"AO": "torchao", "TE": "Transformer Engine"},
        )
        values["fp8_config"] = {"backend": backend}
    return precision
