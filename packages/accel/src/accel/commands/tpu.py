"""Familiar path `accelerate.commands.tpu`: re-exports from the packages that own the code."""

from accel_cli.familiar import load_config_from_file, tpu_command_launcher, tpu_command_parser


def main() -> None:
    """`accel tpu-config` with the process's command-line arguments."""
    tpu_command_launcher(tpu_command_parser().parse_args())


__all__ = ["load_config_from_file", "main", "tpu_command_launcher", "tpu_command_parser"]
