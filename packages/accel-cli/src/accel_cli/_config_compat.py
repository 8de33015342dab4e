"""accelerate's `accelerate config` function names, over accel's questionnaire."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class BulletMenu:
    """A numbered choice asked on the terminal; `run()` returns the chosen index."""

    def __init__(self, prompt: str | None = None, choices: list[str] | None = None) -> None:
        self.prompt = prompt or ""
        self.choices = list(choices or [])

    def run(self, default_choice: int = 0) -> int:
        if self.prompt:
            print(self.prompt)
        for index, choice in enumerate(self.choices):
            print(f"  {index}) {choice}{'  (default)' if index == default_choice else ''}")
        while True:
            answer = input("> ").strip()
            if not answer:
                return default_choice
            if answer.isdigit() and int(answer) < len(self.choices):
                return int(answer)
            if answer in self.choices:
                return self.choices.index(answer)
            print(f"{answer!r} is not one of 0-{len(self.choices) - 1}; try again.")


def get_cluster_input() -> Any:
    """Ask the questionnaire's questions and return the answers as a `ClusterConfig`."""
    from accel_cli._config_args import ClusterConfig
    from accel_cli._questionnaire import Asker, run_questionnaire

    values = run_questionnaire(Asker())
    return ClusterConfig(**ClusterConfig.process_config(values))


def get_user_input() -> Any:
    """The questionnaire's answers as a config (accel asks about local machines only)."""
    return get_cluster_input()


def get_sagemaker_input() -> NoReturn:
    raise NotImplementedError(
        "get_sagemaker_input asks for an Amazon SageMaker launch, which accel does not "
        "provide. Build a SageMakerConfig(...) in code, or use accelerate's questionnaire."
    )


def get_config_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The `accel config` parser (with its default/show/validate/update subcommands)."""
    from accel_cli._commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["config"]


def update_config(args: argparse.Namespace) -> str:
    """Rewrite `args.config_file` (default: the default file) with today's keys; return
    its path."""
    from pathlib import Path

    from accel_cli._config import ConfigFileNotFound, read_config_data
    from accel_cli._environment import default_config_path
    from accel_cli._migrate import rewrite
    from accel_cli._migrate import update_config as updated

    path = Path(getattr(args, "config_file", None) or default_config_path())
    if not path.is_file():
        raise ConfigFileNotFound(
            f"The config file {str(path)!r} does not exist; create it with `accel config`."
        )
    values, _ = updated(read_config_data(path))
    rewrite(path, values, path)
    return str(path)
