"""Ranks that keep meeting in accel's numbered collectives until a test takes one machine
away (its link cut, or its processes killed); run by test_multihost.py under
`accel launch --hang_timeout`.

    python _multihost_hang.py READY_FILE

Rank 0 writes READY_FILE after a few collectives, when every rank is known to be in the loop.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from accel import Accelerator

acc = Accelerator(cpu=True)
ready = Path(sys.argv[1])
for step in range(100_000):
    acc.reduce(torch.ones(4), reduction="sum")  # a numbered collective, once per step
    if step == 5 and acc.is_main_process:
        ready.write_text("ready")
    time.sleep(0.02)
