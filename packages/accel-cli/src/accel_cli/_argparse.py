"""argparse pieces with accelerate's names: every `--a_b` flag also answers to `--a-b`,
help lists only the underscore spelling, and a parsed namespace records which flags the
command line gave (`namespace.nondefault`), so a flag equal to its default still wins over a
config file."""

from __future__ import annotations

import argparse
from typing import Any


def _with_dashed(option_strings: list[str]) -> list[str]:
    out: list[str] = []
    for option in option_strings:
        out.append(option)
        dashed = option[:2] + option[2:].replace("_", "-")
        if option.startswith("--") and dashed != option and dashed not in option_strings:
            out.append(dashed)
    return out


def _record(namespace: argparse.Namespace, dest: str) -> None:
    if not hasattr(namespace, "nondefault"):
        namespace.nondefault = set()
    namespace.nondefault.add(dest)


class _Store(argparse._StoreAction):
    def __init__(self, option_strings: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(_with_dashed(list(option_strings)), *args, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        super().__call__(parser, namespace, values, option_string)
        _record(namespace, self.dest)


class _StoreTrue(argparse._StoreTrueAction):
    def __init__(self, option_strings: list[str], *args: Any, **kwargs: Any) -> None:
        super().__init__(_with_dashed(list(option_strings)), *args, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None):
        super().__call__(parser, namespace, values, option_string)
        _record(namespace, self.dest)


def _custom_action(kwargs: dict[str, Any]) -> dict[str, Any]:
    action = kwargs.get("action")
    if action is None:
        kwargs["action"] = _Store
    elif action == "store_true":
        kwargs["action"] = _StoreTrue
    return kwargs


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose flags take both spellings and record being given."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*args, **_custom_action(kwargs))


class CustomArgumentParser(argparse.ArgumentParser):
    """An argument parser whose flags take both spellings and record being given."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        return super().add_argument(*args, **_custom_action(kwargs))

    def add_argument_group(self, *args: Any, **kwargs: Any) -> CustomArgumentGroup:
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group


def clean_option(option: str) -> str | None:
    """`--num-processes` -> `num_processes` (None for a word that is not a long flag)."""
    if "fp8_backend" in option:
        option = "--fp8_backend"
    if option.startswith("--"):
        return option[2:].replace("-", "_")
    return None


class CustomHelpFormatter(argparse.HelpFormatter):
    """Help that shows each flag once, in its underscore spelling, and leaves out the
    sections that end up empty."""

    def add_argument(self, action: argparse.Action) -> None:
        shown = [s for s in action.option_strings if "-" not in s[2:]] or action.option_strings
        if shown != action.option_strings:
            action = _copy_with(action, option_strings=shown)
        super().add_argument(action)

    def end_section(self) -> None:
        if len(self._current_section.items) < 2:
            self._current_section.items = []
            self._current_section.heading = ""
        super().end_section()


def _copy_with(action: argparse.Action, **changes: Any) -> argparse.Action:
    import copy

    clone = copy.copy(action)
    for key, value in changes.items():
        setattr(clone, key, value)
    return clone


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help for a subcommand, without the `<command> [<args>]` placeholder in its usage."""

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        return text.replace("<command> [<args>] ", "")
