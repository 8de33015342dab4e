"""The tracker interface every back-end implements, and the lazy import of its library."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar


def import_optional(module: str, extra: str, tracker: str) -> ModuleType:
    """Import a tracker's library, or raise an ImportError naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"The {tracker!r} tracker needs the `{module}` package, which is not installed. "
            f"Install it with `pip install accel-tracking[{extra}]`."
        ) from exc


def module_installed(module: str) -> bool:
    """Whether a top-level module can be imported, without importing it."""
    return importlib.util.find_spec(module) is not None


class GeneralTracker:
    """Base of every tracker: one experiment run on one back-end.

    A tracker is made with the project name (and the logging directory when
    `requires_logging_directory` is True), then `start()` creates the run. The caller decides
    which process logs; trackers know nothing of processes.

    Subclasses set `name` and `requires_logging_directory` and implement `log`; the other
    methods have safe defaults (`log_images` and `log_table` warn once and do nothing), so code
    written against this interface runs with any tracker.
    """

    name: ClassVar[str] = ""
    requires_logging_directory: ClassVar[bool] = False
    # For built-in trackers: the extra that installs the library, and the modules it needs.
    extra: ClassVar[str | None] = None
    libraries: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def is_available(cls) -> bool:
        """Whether the libraries this tracker needs are installed (nothing is imported)."""
        return all(module_installed(m) for m in cls.libraries)

    def start(self) -> None:
        """Create the underlying run. Called once after construction; a no-op by default."""

    @property
    def tracker(self) -> Any:
        """The back-end's own run object, for what this interface does not cover."""
        return None

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters (call once, at the start)."""

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record `values` (a possibly nested dict of scalars) at `step`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement log(values, step=None, **kwargs); a "
            f"tracker must define it."
        )

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record images (arrays or PIL images by name) where the back-end has them."""
        self._unsupported("log_images")

    def log_table(
        self,
        table_name: str,
        columns: Sequence[str] | None = None,
        data: Sequence[Sequence[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Record a table (columns + rows, or a dataframe) where the back-end has them."""
        self._unsupported("log_table")

    def finish(self) -> None:
        """Close the run and flush what is buffered. A no-op by default."""

    def _unsupported(self, method: str) -> None:
        seen = self.__dict__.setdefault("_unsupported_warned", set())
        if method not in seen:
            seen.add(method)
            warnings.warn(
                f"The {self.name or type(self).__name__!r} tracker has no {method}; the call "
                f"is ignored.",
                UserWarning,
                stacklevel=3,
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
