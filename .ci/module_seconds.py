"""Write .ci/module_seconds.json from a run's timeline: the seconds each test module ran.

    ACCEL_MODULE_TIMES=/tmp/times.tsv uv run pytest -n 3
    uv run python .ci/module_seconds.py /tmp/times.tsv

The timeline has a line per module (conftest._record_module_time): worker, module, when it
asked for the machine, started and ended. Under pytest -n the root conftest hands out the
longest modules first by this file, so a run with new or grown modules may refresh it; a module
it does not list is handed out after those it does. Modules the run did not have keep their
seconds (a run of a few files refreshes those); a module whose file is gone is dropped. Prints the run's timeline summary:
the wall time, each worker's busy time and the serial modules' share.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(timeline: str) -> None:
    rows = []
    for line in Path(timeline).read_text().splitlines():
        worker, module, asked, started, ended = line.split("\t")
        rows.append((worker, module, float(asked), float(started), float(ended)))
    if not rows:
        sys.exit(f"{timeline} has no module lines: run pytest -n N with ACCEL_MODULE_TIMES set")
    seconds = {module: round(ended - started, 1) for _, module, _, started, ended in rows}
    out = Path(__file__).with_name("module_seconds.json")
    kept = json.loads(out.read_text()) if out.is_file() else {}  # modules this run left out
    kept = {module: s for module, s in kept.items() if Path(module).is_file()}
    out.write_text(json.dumps(dict(sorted({**kept, **seconds}.items())), indent=1) + "\n")
    first = min(r[2] for r in rows)
    last = max(r[4] for r in rows)
    print(f"{len(rows)} modules, wall {last - first:.0f} s -> {out}")
    for worker in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == worker]
        busy = sum(r[4] - r[3] for r in mine)
        waited = sum(r[3] - r[2] for r in mine)
        print(f"  {worker}: ran {busy:.0f} s, waited {waited:.0f} s, {len(mine)} modules")
    print("the ten longest:")
    for module, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {s:7.1f} s  {module}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
