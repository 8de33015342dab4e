"""`accel estimate-memory --train` / `--plan`: the per-device peak of a training step for each
engine, from accel-parallel's estimator (imported here, with an install hint), and the plan's
best configuration written as an `accel launch` config file."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accel_cli._config import ConfigError

DEFAULT_PLAN_FILE = "accel_plan.yaml"
_COLUMNS = ("weights", "gradients", "optimizer_states", "activations", "temporaries",
            "communication")  # fmt: skip
_SHORT = {"weights": "weights", "gradients": "grads", "optimizer_states": "optim",
          "activations": "activ.", "temporaries": "temp", "communication": "comm"}  # fmt: skip


def _memory() -> Any:
    try:
        from accel_parallel import memory
    except ImportError as err:
        raise ConfigError(
            f"--train and --plan need accel-parallel ({err}); install it with "
            "`pip install accel-parallel`."
        ) from None
    return memory


def model_factory(source: str) -> Callable[[], Any]:
    """A factory for SOURCE: MODULE:FACTORY as given, or a folder with config.json built by
    transformers' auto classes from the config alone (offline, no weights read)."""
    from accel_cli._model_shapes import _FACTORY, _import

    path = Path(source).expanduser()
    if (path / "config.json").is_file():
        return _transformers_factory(path)
    match = _FACTORY.match(source)
    if not match or path.exists():
        raise ConfigError(
            f"{source!r}: --train needs a folder with config.json or MODULE:FACTORY (a "
            "function that builds the model)."
        )
    factory: Any = _import(match["module"])
    for part in match["name"].split("."):
        if not hasattr(factory, part):
            raise ConfigError(f"{match['module']!r} has no {match['name']!r} (from {source!r}).")
        factory = getattr(factory, part)
    return factory


def _transformers_factory(folder: Path) -> Callable[[], Any]:
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            f"{folder}: building a model from config.json needs transformers; install it "
            "with `pip install transformers`."
        ) from None
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)

    def build() -> Any:
        try:
            return transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:  # not a causal LM: the base model
            return transformers.AutoModel.from_config(config)

    return build


def gib(n: int) -> str:
    """`n` bytes in GiB, or in MiB under 1 GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _unit(rows: list[Any]) -> tuple[str, int]:
    """GiB, or MiB when every peak is under 1 GiB."""
    return ("MiB", 2**20) if max(r.peak_bytes for r in rows) < 2**30 else ("GiB", 2**30)


def render(rows: list[Any], device_memory: int | None) -> str:
    """One line per configuration: the peak and its parts in GiB, and how it was made."""
    unit, size = _unit(rows)
    head = ["config", f"peak {unit}", *(_SHORT[c] for c in _COLUMNS)]
    if device_memory is not None:
        head.append("fits")
    lines = []
    for r in rows:
        line = [r.label(), *(f"{n / size:.2f}" for n in (r.peak_bytes, *r.parts.values()))]
        if device_memory is not None:
            line.append("yes" if r.peak_bytes <= device_memory else "no")
        lines.append(line)
    widths = [max(len(str(x[i])) for x in [head, *lines]) for i in range(len(head))]
    out = ["  ".join(str(x).rjust(w) if i else str(x).ljust(w)
                     for i, (x, w) in enumerate(zip(line, widths))) for line in [head, *lines]]  # fmt: skip
    methods = sorted({r.method for r in rows})
    shared = {m.partition(" (")[2] for m in methods}
    if len(shared) == 1 and shared != {""}:  # every row extrapolated the same way: say it once
        methods = [m.partition(" (")[0] for m in methods] + [f"each {shared.pop()[:-1]}"]
    out.append(f"per device; method: {'; '.join(methods)}")
    notes = sorted({n for r in rows for n in r.notes})
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def launch_config(row: Any) -> dict[str, Any]:
    """The `accel launch --config_file` content that runs configuration `row`."""
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "num_machines": 1,
        "num_processes": row.world_size,
        "mixed_precision": row.mixed_precision,
    }
    if row.tp_size > 1:
        cfg["parallelism_config"] = {
            "parallelism_config_tp_size": row.tp_size,
            "parallelism_config_dp_shard_size": row.world_size // row.tp_size,
        }
    if row.engine in ("ddp", "tp"):
        cfg["distributed_type"] = "MULTI_GPU" if row.world_size > 1 else "NO"
    elif row.engine == "fsdp2":
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": bool(row.reshard_after_forward),
            "fsdp_offload_params": row.offload,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_activation_checkpointing": row.activation_checkpointing,
        }
    else:
        offload = "cpu" if row.offload else "none"
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "zero_stage": int(row.engine[-1]),
            "offload_optimizer_device": offload,
            "offload_param_device": offload if row.engine == "zero3" else "none",
        }
    return cfg


def run(args: argparse.Namespace) -> int:
    """--train: the table (or --json rows); --plan: the fitting configurations, cheapest
    first, and the best written to --plan_file."""
    memory = _memory()
    args.margin = 0.1 if args.margin is None else args.margin
    args.plan_file = args.plan_file or DEFAULT_PLAN_FILE
    device_memory = None
    if args.device_memory is not None:
        try:
            device_memory = memory.parse_memory(args.device_memory)
        except ValueError as err:
            raise ConfigError(f"--device_memory: {err}") from None
    if args.plan and device_memory is None:
        raise ConfigError("--plan needs --device_memory (e.g. --device_memory 80GiB).")
    options = {
        "world_size": args.num_processes or 1,
        "batch_size": args.batch_size or 1,
        "seq_len": args.seq_len,
        "mixed_precision": args.mixed_precision or "no",
        "optimizer": args.optimizer or "adamw",
        "engines": args.engines or memory.ENGINES,
        "extrapolate": not args.trace_whole,
    }
    if (args.tp_size or 1) > 1 or (args.pp_size or 1) > 1:
        from types import SimpleNamespace

        if args.plan and (args.pp_size or 1) > 1:
            raise ConfigError(
                "--plan writes an accel launch config, which holds no pipeline degree (set "
                "ParallelismConfig(pp_size=...) in the script); estimate it with --train."
            )
        options["parallelism"] = SimpleNamespace(
            tp_size=args.tp_size or 1, pp_size=args.pp_size or 1,
            pp_microbatches=args.pp_microbatches, pp_schedule=args.pp_schedule,
        )  # fmt: skip
    factory = model_factory(args.model_name)
    try:
        if args.plan:
            rows = memory.plan_training(factory, device_memory=device_memory,
                                        margin=args.margin, **options)  # fmt: skip
        else:
            rows = memory.estimate_training_memory(
                factory, activation_checkpointing=bool(args.activation_checkpointing), **options
            )
    except (ValueError, NotImplementedError) as err:
        raise ConfigError(str(err)) from None
    if args.plan:
        return _report_plan(args, rows, device_memory)
    print(
        json.dumps([r.as_row() for r in rows], indent=2)
        if args.json
        else render(rows, device_memory)
    )
    return 0


def _report_plan(args: argparse.Namespace, rows: list[Any], device_memory: int) -> int:
    import yaml

    if not rows:
        raise ConfigError(
            f"no configuration fits {gib(device_memory)} per device with a {args.margin:.0%} "
            "margin; lower --batch_size or --seq_len, or add processes (--num_processes)."
        )
    best = launch_config(rows[0])
    Path(args.plan_file).write_text(yaml.safe_dump(best, sort_keys=False))
    if args.json:
        print(json.dumps({"plan": [r.as_row() for r in rows], "config_file": args.plan_file,
                          "config": best}, indent=2))  # fmt: skip
        return 0
    print(f"fits {gib(device_memory)} with a {args.margin:.0%} margin, cheapest step first "
          "(bytes moved per step, more with recomputation):")  # fmt: skip
    print(render(rows, device_memory))
    print(f"best: {rows[0].label()}, written to {args.plan_file}; run it with "
          f"`accel launch --config_file {args.plan_file} train.py`")  # fmt: skip
    return 0
