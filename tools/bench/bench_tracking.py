"""Per-call cost of `tracker.log` against the raw writer, and accelerate's tracker when installed.

uv run --frozen --group bench python tools/bench/bench_tracking.py [--calls 2000] [--keys 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def _per_call(fn, calls: int) -> float:
    fn(0)  # warm up
    start = time.perf_counter()
    for i in range(1, calls + 1):
        fn(i)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=8)
    args = parser.parse_args()
    values = {f"metric_{k}": 0.5 * k for k in range(args.keys)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        from accel_tracking import JSONLTracker, TensorBoardTracker

        raw = (Path(tmp) / "raw.jsonl").open("a", buffering=1)
        base = _per_call(
            lambda s: raw.write(
                json.dumps({"step": s, "time": time.time(), "values": values}) + "\n"
            ),
            args.calls,
        )
        ours = JSONLTracker("jsonl", tmp)
        rows.append(
            ("jsonl", base, _per_call(lambda s: ours.log(values, step=s), args.calls), None)
        )
        ours.finish()
        raw.close()

        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(Path(tmp) / "tb_raw"))

        def raw_tb(s: int) -> None:
            for k, v in values.items():
                writer.add_scalar(k, v, global_step=s)
            writer.flush()

        base = _per_call(raw_tb, args.calls)
        tb = TensorBoardTracker("tb", tmp)
        mine = _per_call(lambda s: tb.log(values, step=s), args.calls)
        theirs = None
        try:
            from accelerate.tracking import TensorBoardTracker as HFTensorBoard

            hf = HFTensorBoard("hf", tmp)
            hf.start()
            theirs = _per_call(lambda s: hf.log(values, step=s), args.calls)
            hf.finish()
        except ImportError:
            pass
        rows.append(("tensorboard", base, mine, theirs))
        tb.finish()
        writer.close()
    print(f"{args.calls} log calls of {args.keys} scalars; microseconds per call")
    print(f"{'tracker':<12} {'raw':>9} {'accel':>9} {'ratio':>7} {'accelerate':>11} {'ratio':>7}")
    for name, raw_us, ours_us, hf_us in rows:
        hf_cols = f"{hf_us:>11.1f} {hf_us / raw_us:>7.2f}" if hf_us else f"{'-':>11} {'-':>7}"
        print(f"{name:<12} {raw_us:>9.1f} {ours_us:>9.1f} {ours_us / raw_us:>7.2f} {hf_cols}")


if __name__ == "__main__":
    main()
