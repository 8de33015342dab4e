"""accel-cli: the `accel` command (launch, config, env) and the pieces it is made of.

The command itself is `accel_cli.main:main`, its subcommands the modules of `_commands`.
accelerate's command-line names (the ones `accel.commands.*` and `accel.utils.launch`
re-export) are in `accel_cli.familiar`. Importing this package does nothing and does not
import torch.
"""

from accel_cli._command import build_command, build_env, free_port, with_rendezvous
from accel_cli._config import (
    ConfigError,
    ConfigFile,
    default_file_values,
    find_config_file,
    load_config_file,
    write_config_file,
)
from accel_cli._environment import ENV_ACCEL_CONFIG, ENV_CONFIG_FILE, default_config_path
from accel_cli._launch_config import LaunchConfig
from accel_cli._resolve import Resolution, resolve_launch_config

__version__ = "0.1.0"

__all__ = [
    "ENV_ACCEL_CONFIG",
    "ENV_CONFIG_FILE",
    "ConfigError",
    "ConfigFile",
    "LaunchConfig",
    "Resolution",
    "build_command",
    "build_env",
    "default_config_path",
    "default_file_values",
    "find_config_file",
    "free_port",
    "load_config_file",
    "resolve_launch_config",
    "with_rendezvous",
    "write_config_file",
]
