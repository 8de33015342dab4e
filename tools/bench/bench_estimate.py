"""Time to estimate training memory for Llama-3 8B and 70B configs, and the estimator's RSS.

Each config (written here, no downloads) is estimated in a fresh interpreter with
`accel_parallel.memory.estimate_training_memory` for every engine (the plain step, FSDP2 with
and without reshard-after-forward traced under fake tensors; DDP and ZeRO derived), world
size 8, bf16 autocast, batch 1 x 2048 tokens. Printed per model: wall seconds of the
estimate (building the fake model included, interpreter start and imports not) and the
child's peak RSS (`ru_maxrss`), plus the FSDP2 row's peak.

By default (as the estimate runs) the 32 (80) decoder layers are traced as 3, 4 and 5
layers and each part extended linearly; `--trace_whole` traces every layer
(`extrapolate=False`).

    uv run --frozen python tools/bench/bench_estimate.py [--models 8b 70b] [--trace_whole]
        [--tp_size 2 | --pp_size 8]

`--tp_size` estimates the mesh's rows (tensor parallel x FSDP2 over the rest of the 8);
`--pp_size 8` the pipeline over all 8 (1F1B, 8 micro-batches of 1 x 2048).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LLAMA3 = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8},
}  # fmt: skip

CHILD = """
import json, resource, sys, time
import transformers
from accel_parallel import ParallelismConfig
from accel_parallel.memory import estimate_training_memory

config = transformers.AutoConfig.from_pretrained(sys.argv[1], local_files_only=True)
tp, pp = int(sys.argv[3]), int(sys.argv[4])
degrees = ParallelismConfig(tp_size=tp, pp_size=pp) if tp > 1 or pp > 1 else None
start = time.perf_counter()
rows = estimate_training_memory(
    lambda: transformers.AutoModelForCausalLM.from_config(config),
    world_size=8, batch_size=pp, seq_len=2048, mixed_precision="bf16",
    extrapolate=sys.argv[2] == "1", parallelism=degrees,
)
seconds = time.perf_counter() - start
main = rows[0] if degrees else next(r for r in rows if r.label() == "fsdp2")
print(json.dumps({"seconds": seconds, "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "rows": len(rows), "label": main.label(), "peak_gib": main.peak_bytes / 2**30,
                  "method": main.method}))
"""


def write_config(folder: Path, size: str) -> Path:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
           "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
           "tie_word_embeddings": False, "torch_dtype": "float32", **LLAMA3[size]}  # fmt: skip
    path = folder / size
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(LLAMA3), choices=list(LLAMA3))
    parser.add_argument("--trace_whole", action="store_true")
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel degree (of 8)")
    parser.add_argument("--pp_size", type=int, default=1, help="pipeline degree: 8 (the batch "
                        "is then 8 x 2048, one micro-batch per stage)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.models:
            folder = write_config(Path(tmp), size)
            out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(int(not args.trace_whole)),
                                  str(args.tp_size), str(args.pp_size)], capture_output=True,
                                 text=True, check=True)  # fmt: skip
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"llama3-{size}: {result['seconds']:.1f} s, estimator peak RSS "
                  f"{result['rss_kib'] / 2**20:.2f} GiB, {result['rows']} rows, "
                  f"{result['label']} peak {result['peak_gib']:.2f} GiB/device ({result['method']})")  # fmt: skip


if __name__ == "__main__":
    main()
