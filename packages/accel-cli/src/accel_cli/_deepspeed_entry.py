"""What DeepSpeed's runner starts on each host: `python -m accel_cli._deepspeed_entry CONFIG
{script|module|program} TARGET [ARGS...]`. It puts the launch configuration into this
process's environment and becomes the program (see `_deepspeed`)."""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Sequence

from accel_cli._affinity import become
from accel_cli._environment import ENV_ACCEL_CONFIG


def main(argv: Sequence[str]) -> None:
    config, mode, target, *args = argv
    os.environ[ENV_ACCEL_CONFIG] = base64.urlsafe_b64decode(config.encode()).decode()
    become(mode, target, args)


if __name__ == "__main__":
    main(sys.argv[1:])
