"""`accel estimate-memory`: how much memory a model takes to load and to train.

The arithmetic, per parameter, with Adam:
- loading: 4 bytes in float32, 2 in float16/bfloat16, 1 in int8, 0.5 in int4;
- training in float32: weights 4 + gradients 4 + Adam's two moments 8 = 16 bytes;
- mixed-precision training (float16/bfloat16): 16-bit weights 2 + gradients 2 + float32
  master weights and moments 12 = 16 bytes (autocast keeps float32 weights and gradients
  instead: the same 16);
- per process on N processes: DDP keeps everything; ZeRO-1 shards the optimizer part,
  ZeRO-2 also the gradients, ZeRO-3 and FSDP2 also the weights, and then hold one layer's
  weights and gradients whole while it runs (the largest layer counts);
- activations (no checkpointing, fused attention that keeps no seq x seq scores), per layer
  and token: 6 x hidden + 2 x k/v width + the MLP (4 x intermediate when gated, 2 x
  otherwise), in the compute dtype; plus float32 logits and their gradient, 8 x vocab.
These are estimates of the steady state, without the allocator's fragmentation, the CUDA
context, communication buffers or temporary copies: budget 10-20% more.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from accel_cli._model_shapes import Dims, ModelShape

LOAD_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}
# bytes per parameter with Adam: (weights, gradients, optimizer states incl. master weights)
TRAIN_SPLIT = {"float32": (4, 4, 8), "float16": (2, 2, 12), "bfloat16": (2, 2, 12)}
STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "FSDP2")
DEFAULT_PROCESSES = 8
DEFAULT_SEQ_LEN = 2048
ACTIVATION_METHOD = (
    "per layer and token: 6 x hidden + 2 x k/v width + MLP (4 x intermediate if gated, "
    "else 2 x) elements in the compute dtype, plus float32 logits and their gradient "
    "(8 bytes x vocab); no activation checkpointing, fused attention (no seq x seq scores)"
)


def training_bytes(params: int, dtype: str) -> int | None:
    """Weights, gradients and Adam states on one process; None for int8/int4 (not trained)."""
    split = TRAIN_SPLIT.get(dtype)
    return None if split is None else params * sum(split)


def per_process(params: int, largest: int, dtype: str, n: int) -> dict[str, int]:
    """Model-state bytes per process for each strategy, on `n` processes."""
    w, g, o = TRAIN_SPLIT[dtype]
    gathered = 2 * w * largest if n > 1 else 0  # one layer's weights and gradients whole
    # ZeRO-3 and FSDP2 both shard all 16 bytes (FSDP2 keeps float32 shards and gathers in
    # the compute dtype; ZeRO-3 keeps 16-bit shards plus float32 master states).
    fully_sharded = round(params * (w + g + o) / n + gathered)
    return {
        "DDP": params * (w + g + o),
        "ZeRO-1": round(params * (w + g) + params * o / n),
        "ZeRO-2": round(params * w + params * (g + o) / n),
        "ZeRO-3": fully_sharded,
        "FSDP2": fully_sharded,
    }


def activation_bytes(dims: Dims, batch: int, seq: int, dtype: str) -> int:
    """Activations kept for backward on one process (see ACTIVATION_METHOD)."""
    mlp = (4 if dims.gated_mlp else 2) * dims.intermediate
    per_token_layer = 6 * dims.hidden + 2 * dims.kv_dim + mlp
    tokens = batch * seq
    logits = 8 * dims.vocab * tokens if dims.vocab else 0
    return int(tokens * dims.layers * per_token_layer * LOAD_BYTES[dtype] + logits)


def estimate(
    shape: ModelShape,
    dtypes: Sequence[str],
    num_processes: int,
    batch_size: int,
    seq_len: int,
) -> dict[str, Any]:
    """Every figure of the report, in bytes (the `--json` output)."""
    total = shape.total
    layer, largest = shape.largest_layer()
    rows = {
        dtype: {
            "largest_layer_bytes": int(largest * LOAD_BYTES[dtype]),
            "total_bytes": int(total * LOAD_BYTES[dtype]),
            "training_adam_bytes": training_bytes(total, dtype),
        }
        for dtype in dtypes
    }
    training = ("float32", "bfloat16")
    out: dict[str, Any] = {
        "source": shape.source,
        "method": shape.method,
        "parameters": total,
        "largest_layer": {"name": layer, "parameters": largest},
        "dtypes": rows,
        "per_process": {
            "num_processes": num_processes,
            **{d: per_process(total, largest, d, num_processes) for d in training},
        },
        "activations": None,
        "notes": list(shape.notes),
    }
    if shape.stored_bytes is not None:
        out["stored"] = {"bytes": shape.stored_bytes, "dtypes": list(shape.stored_dtypes)}
    if shape.dims is not None:
        out["activations"] = {
            "batch_size": batch_size,
            "seq_len": seq_len,
            **{
                f"{d}_bytes": activation_bytes(shape.dims, batch_size, seq_len, d) for d in training
            },
            "method": ACTIVATION_METHOD,
        }
    else:
        out["notes"].append(
            "activations not estimated: the hidden size and layer count are unknown (put the "
            "model's config.json beside its safetensors files)"
        )
    return out


def human(size: float | None) -> str:
    """Bytes in binary units: 1.50 GiB."""
    if size is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} B" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = [str(c).rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def render(report: dict[str, Any]) -> str:
    label = {"float16": "float16/bfloat16", "bfloat16": "bfloat16"}
    layer = report["largest_layer"]
    lines = [
        f"Memory for {report['source']}",
        f"{report['parameters']:,} parameters, {report['method']}; largest layer "
        f"{layer['name']} ({layer['parameters']:,} parameters)",
    ]
    if "stored" in report:
        stored = report["stored"]
        lines.append(f"stored as {', '.join(stored['dtypes'])}: {human(stored['bytes'])}")
    lines.append("")
    rows = [
        [label.get(d, d), human(r["largest_layer_bytes"]), human(r["total_bytes"]),
         human(r["training_adam_bytes"])]
        for d, r in report["dtypes"].items()
    ]  # fmt: skip
    lines += table(["dtype", "largest layer", "total size", "training with Adam"], rows)
    pp = report["per_process"]
    lines += ["", f"Training per process on {pp['num_processes']} processes (weights, "
              f"gradients and Adam states; activations below):", ""]  # fmt: skip
    rows = [[s, human(pp["float32"][s]), human(pp["bfloat16"][s])] for s in STRATEGIES]
    act = report["activations"]
    if act is not None:
        rows.append(
            [f"+ activations, batch {act['batch_size']} x {act['seq_len']} tokens",
             human(act["float32_bytes"]), human(act["bfloat16_bytes"])]
        )  # fmt: skip
    lines += table(["strategy", "float32", "float16/bfloat16 mixed"], rows)
    footer = [f"Activations estimated {act['method']}."] if act is not None else []
    footer += [f"note: {n}" for n in report["notes"]]
    footer.append(
        "Steady-state figures without allocator fragmentation, CUDA context or communication "
        "buffers: leave 10-20% spare."
    )
    lines.append("")
    for paragraph in footer:
        lines += textwrap.wrap(paragraph, width=92)
    return "\n".join(lines)
