"""Familiar path `accelerate.commands.config.config`: re-exports from the packages that own the code."""

from accel._compat._commands import (
    cli_command,
    cli_main,
    cli_parser,
)
from accel_cli.familiar import (
    ComputeEnvironment,
    get_cluster_input,
    get_sagemaker_input,
    get_user_input,
    load_config_from_file,
)

config_command = cli_command("config_questionnaire_command")


config_command_parser = cli_parser("config")


main = cli_main("config")


__all__ = ["config_command", "config_command_parser", "main"]


__all__ += [
    "ComputeEnvironment",
    "load_config_from_file",
]

__all__ += [
    "get_cluster_input",
    "get_sagemaker_input",
    "get_user_input",
]
