"""Tracker names, and the resolver that turns `log_with` into started trackers.

`log_with` is what a user hands the Accelerator: None, a tracker name, ``"all"``, a tracker
instance, or a list of those. `filter_trackers` validates it (unknown names, missing
libraries, a missing logging directory) without creating anything; `resolve_trackers` then
creates and starts one tracker per entry. Registering a class by name makes a custom tracker
usable by name like the built-in ones; an instance is always accepted as is.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from accel_tracking._aim import AimTracker
from accel_tracking._base import GeneralTracker
from accel_tracking._clearml import ClearMLTracker
from accel_tracking._comet import CometMLTracker
from accel_tracking._dvclive import DVCLiveTracker
from accel_tracking._jsonl import JSONLTracker
from accel_tracking._mlflow import MLflowTracker
from accel_tracking._swanlab import SwanLabTracker
from accel_tracking._tensorboard import TensorBoardTracker
from accel_tracking._trackio import TrackioTracker
from accel_tracking._wandb import WandBTracker

ALL = "all"

_BUILTIN: dict[str, type[GeneralTracker]] = {
    cls.name: cls
    for cls in (
        JSONLTracker,
        TensorBoardTracker,
        WandBTracker,
        MLflowTracker,
        CometMLTracker,
        AimTracker,
        ClearMLTracker,
        DVCLiveTracker,
        SwanLabTracker,
        TrackioTracker,
    )
}
# The live registry, name -> class: the built-ins, then what `register_tracker_class` adds (a
# registered class may replace a built-in under its name). Mutable on purpose: code written
# for accelerate snapshots and restores it as a dict.
TRACKER_CLASSES: dict[str, type] = dict(_BUILTIN)

LogWith = str | GeneralTracker | Sequence[str | GeneralTracker] | None


def _normalize(name: Any) -> str:
    """A tracker name from a str or a str-valued enum (`LoggerType.WANDB`), lower-cased."""
    value = getattr(name, "value", name)
    if not isinstance(value, str):
        raise TypeError(f"A tracker name must be a string; got {name!r} ({type(name).__name__}).")
    return value.lower()


def _is_tracker(obj: Any) -> bool:
    """A tracker instance: ours, or any object with a `name` and a callable `log`."""
    if isinstance(obj, GeneralTracker):
        return True
    return (
        not isinstance(obj, (str, type))
        and callable(getattr(obj, "log", None))
        and (isinstance(getattr(obj, "name", None), str))
    )


def register_tracker_class(cls: type, name: str | None = None, *, overwrite: bool = False) -> type:
    """Make `cls` usable by name in `log_with` (``name`` defaults to ``cls.name``).

    The class must define ``requires_logging_directory``; it is created as
    ``cls(project_name, logging_dir, **init_kwargs)`` when that is True, else
    ``cls(project_name, **init_kwargs)``. Returns `cls`, so it also works as a decorator.
    """
    key = _normalize(name if name is not None else getattr(cls, "name", None))
    if not isinstance(cls, type) or not isinstance(
        getattr(cls, "requires_logging_directory", None), bool
    ):
        raise TypeError(
            f"register_tracker_class expects a tracker class with a boolean "
            f"`requires_logging_directory` attribute; got {cls!r}. Subclass GeneralTracker."
        )
    if key == ALL:
        raise ValueError(f"{ALL!r} is reserved for 'every installed tracker'; choose another name.")
    taken = TRACKER_CLASSES.get(key)
    if taken is not None and taken is not cls and not overwrite:
        raise ValueError(
            f"A tracker named {key!r} is already registered ({taken.__name__}). Choose another "
            f"name, or pass overwrite=True to replace it."
        )
    TRACKER_CLASSES[key] = cls
    return cls


def unregister_tracker_class(name: str) -> None:
    """Remove a custom tracker; a built-in one it replaced is visible again."""
    key = _normalize(name)
    custom = sorted(n for n, cls in TRACKER_CLASSES.items() if _BUILTIN.get(n) is not cls)
    if key not in custom:
        raise ValueError(f"No custom tracker named {key!r} is registered; custom: {custom}.")
    if key in _BUILTIN:
        TRACKER_CLASSES[key] = _BUILTIN[key]
    else:
        del TRACKER_CLASSES[key]


def known_trackers() -> list[str]:
    """Every tracker name, installed or not: built-ins first, then registered ones."""
    return list(TRACKER_CLASSES)


def get_tracker(name: str) -> type:
    """The tracker class registered under `name`."""
    key = _normalize(name)
    cls = TRACKER_CLASSES.get(key)
    if cls is None:
        raise ValueError(
            f"Unknown tracker {name!r}. Known trackers: {', '.join(known_trackers())}, or "
            f"{ALL!r}. A custom tracker is passed as an instance or registered with "
            f"register_tracker_class."
        )
    return cls


def _installed(cls: type) -> bool:
    check = getattr(cls, "is_available", None)
    return bool(check()) if callable(check) else True


def available_trackers() -> list[str]:
    """The names of the trackers whose libraries are installed (nothing is imported)."""
    return [name for name in known_trackers() if _installed(get_tracker(name))]


def _check_usable(name: str, logging_dir: Any) -> None:
    cls = get_tracker(name)
    if not _installed(cls):
        extra = getattr(cls, "extra", None) or name
        raise ImportError(
            f"The {name!r} tracker is not installed. Install it with "
            f"`pip install accel-tracking[{extra}]`, or remove it from log_with."
        )
    if cls.requires_logging_directory and logging_dir is None:
        raise ValueError(
            f"Logging with `{name}` requires a `logging_dir`: the tracker writes files, and no "
            f"directory was given. Pass logging_dir (the Accelerator's project_dir)."
        )
    url = "://" in str(logging_dir).replace("file://", "")
    if cls.requires_logging_directory and url and not getattr(cls, "writes_to_urls", False):
        raise ValueError(
            f"Logging with `{name}` writes local files into logging_dir, which is a URL "
            f"({logging_dir!r}; it defaults to project_dir): pass a local folder, "
            f"ProjectConfiguration(project_dir=..., logging_dir='runs'), or log with "
            f"tensorboard, which writes to store URLs."
        )


def filter_trackers(log_with: LogWith, logging_dir: Any = None) -> list[str | Any]:
    """Validate `log_with` into a list of tracker names and instances, without creating any.

    ``"all"`` expands to every installed tracker. Repeated entries are kept once. An unknown
    name raises ValueError; a named tracker whose library is missing raises ImportError with
    the install command; one that needs a logging directory when none is given, ValueError.
    """
    if log_with is None:
        return []
    entries = [log_with] if isinstance(log_with, str) or _is_tracker(log_with) else log_with
    if not isinstance(entries, Sequence):
        entries = list(entries)
    result: list[str | Any] = []
    for entry in entries:
        if _is_tracker(entry):
            if not any(entry is r for r in result):
                result.append(entry)
            continue
        if not isinstance(getattr(entry, "value", entry), str):
            raise TypeError(
                f"log_with entries must be tracker names, {ALL!r}, or tracker instances; got "
                f"{entry!r} ({type(entry).__name__})."
            )
        name = _normalize(entry)
        names = available_trackers() if name == ALL else [name]
        for one in names:
            _check_usable(one, logging_dir)
            if one not in result:
                result.append(one)
    return result


def _kwargs_for(name: str, init_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = init_kwargs.get(name)
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(
            f"init_kwargs[{name!r}] must be a dict of keyword arguments for that tracker; got "
            f"{kwargs!r}."
        )
    return dict(kwargs)


def resolve_trackers(
    log_with: LogWith,
    project_name: str,
    *,
    logging_dir: str | os.PathLike[str] | None = None,
    init_kwargs: Mapping[str, Mapping[str, Any] | None] | None = None,
    config: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Create and start the trackers `log_with` asks for; call it on the logging process only.

    Named trackers are created with `project_name` (and `logging_dir` when they need one) and
    ``init_kwargs[name]``; instances are used as given. Every tracker is then started, and
    given `config` with `store_init_configuration` when `config` is not None. If one fails,
    those already started are finished before the error propagates.
    """
    entries = filter_trackers(log_with, logging_dir)
    init_kwargs = dict(init_kwargs or {})
    names = {_normalize(k) for k in init_kwargs}
    selected = {e if isinstance(e, str) else getattr(e, "name", "") for e in entries}
    if names - selected:
        warnings.warn(
            f"init_kwargs has entries for {sorted(names - selected)}, which are not among the "
            f"trackers in use ({sorted(selected)}); they are ignored.",
            stacklevel=2,
        )
    init_kwargs = {_normalize(k): v for k, v in init_kwargs.items()}
    started: list[Any] = []
    try:
        for entry in entries:
            tracker = (
                entry
                if not isinstance(entry, str)
                else _create(entry, project_name, logging_dir, init_kwargs)
            )
            started.append(tracker)
            tracker.start()
            if config is not None:
                tracker.store_init_configuration(config)
    except BaseException:
        for tracker in started:
            try:
                tracker.finish()
            except Exception as exc:  # the first error is the one to report
                warnings.warn(f"finishing {tracker!r} after a failed start: {exc}", stacklevel=2)
        raise
    return started


def _create(name: str, project_name: str, logging_dir: Any, init_kwargs: Mapping) -> Any:
    cls = get_tracker(name)
    kwargs = _kwargs_for(name, init_kwargs)
    if cls.requires_logging_directory:
        return cls(project_name, logging_dir, **kwargs)
    return cls(project_name, **kwargs)
