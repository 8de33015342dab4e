"""accelerate's `register_tracker_class`: the registry check and overwrite rules of
`accelerate.tracking`, over accel-tracking's live registry."""

from __future__ import annotations

import warnings

from accel_tracking import TRACKER_CLASSES, GeneralTracker
from accel_tracking import register_tracker_class as _register


def _declares(cls: type, attribute: str) -> bool:
    """Whether `cls` or a base other than GeneralTracker sets `attribute` itself."""
    return any(attribute in vars(base) for base in cls.__mro__ if base is not GeneralTracker)


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Make `tracker_class` usable by its `name` in `Accelerator(log_with=...)`.

    It must subclass GeneralTracker and set a non-empty `name` and `requires_logging_directory`
    (ValueError otherwise). Registering a name already taken, a built-in included, replaces it
    with a UserWarning naming both.
    """
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(
            f"register_tracker_class expects a subclass of GeneralTracker; got {tracker_class!r}."
        )
    name = getattr(tracker_class, "name", None)
    if not name:
        raise ValueError(
            f"{tracker_class.__name__} has no `name`; set the class attribute `name` to the "
            f"string `log_with` will use."
        )
    if not _declares(tracker_class, "requires_logging_directory"):
        raise ValueError(
            f"{tracker_class.__name__} does not set `requires_logging_directory`; set it to True "
            f"when the tracker needs a logging directory, False otherwise."
        )
    taken = TRACKER_CLASSES.get(name)
    if taken is not None and taken is not tracker_class:
        warnings.warn(
            f"A tracker named {name!r} is already registered ({taken.__name__}); "
            f"{tracker_class.__name__} replaces it.",
            UserWarning,
            stacklevel=2,
        )
    _register(tracker_class, name, overwrite=True)
