"""The opt-in switch that makes `import accelerate` import accel.

Libraries built on accelerate (transformers, PEFT, TRL, diffusers) import `accelerate` and its
submodules, and check that it is installed and recent enough through `importlib.metadata`. With
the switch on, one finder placed first on `sys.meta_path` answers both:

- `accelerate.<path>` imports `accel.<path>`: the very same module object, so
  `accelerate.utils is accel.utils`. The top-level `accelerate` is a thin view of `accel` that
  reports `__version__` as `REPORTED_VERSION`.
- `importlib.metadata.version("accelerate")` is `REPORTED_VERSION`: the accelerate release whose
  public API accel mirrors, with accel's own version as a local label (`1.15.0+accel.0.1.0`).

This holds whether or not the real accelerate distribution is installed: the finder comes
first, so it answers before the real one is looked at. Nothing happens until the switch is
turned on (`use_as_accelerate()`, the `ACCEL_AS_ACCELERATE` environment variable read at
interpreter start by the `accel_as_accelerate.pth` start-up hook, or `accel launch
--as_accelerate`). This module imports only the standard library, so that the start-up hook
does not import torch; accel itself is imported when `accelerate` first is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import sys
import types
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "ACCELERATE_API_VERSION",
    "ENV_AS_ACCELERATE",
    "REPORTED_VERSION",
    "is_used_as_accelerate",
    "use_as_accelerate",
]

ENV_AS_ACCELERATE = "ACCEL_AS_ACCELERATE"
"""Set to 1 (or true/yes/on) to turn the switch on from interpreter start."""

ACCELERATE_API_VERSION = "1.15.0"
"""The accelerate release whose public names and module paths accel keeps."""

_ACCEL_VERSION = "0.1.0"
REPORTED_VERSION = f"{ACCELERATE_API_VERSION}+accel.{_ACCEL_VERSION}"
"""What `accelerate.__version__` and `importlib.metadata.version("accelerate")` say."""

_NAME = "accelerate"
# Libraries that check at import whether accelerate is installed and remember the answer.
_CLIENTS = ("transformers", "peft", "trl", "diffusers")
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"", "0", "false", "no", "off", "n", "f"}


def _target(fullname: str) -> str:
    return "accel" + fullname[len(_NAME) :]


def _is_accelerate_name(fullname: str) -> bool:
    return fullname == _NAME or fullname.startswith(_NAME + ".")


class _AccelerateModule(types.ModuleType):
    """`accelerate` as its importers see it: accel's namespace, accelerate's version."""

    def __init__(self, accel_module: types.ModuleType) -> None:
        super().__init__(_NAME, accel_module.__doc__)
        self.__dict__["_accel_module"] = accel_module
        self.__version__ = REPORTED_VERSION
        self.__path__ = list(accel_module.__path__)
        self.__file__ = accel_module.__file__
        self.__all__ = list(getattr(accel_module, "__all__", []))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_accel_module"], name)

    def __dir__(self) -> list[str]:
        own = {k for k in self.__dict__ if k != "_accel_module"}
        return sorted(own | set(dir(self.__dict__["_accel_module"])))


class _AliasLoader(importlib.abc.Loader):
    """Loads `accelerate.<path>` by importing `accel.<path>` and handing back that module."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(self.target)
        return _AccelerateModule(module) if spec.name == _NAME else module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the accel module was executed when it was imported."""


class _AccelerateDistribution(importlib.metadata.Distribution):
    """The installed-distribution record `importlib.metadata` finds for `accelerate`."""

    def read_text(self, filename: str) -> str | None:
        if filename == "METADATA":
            return (
                "Metadata-Version: 2.1\n"
                f"Name: {_NAME}\n"
                f"Version: {REPORTED_VERSION}\n"
                "Summary: accel answering for accelerate (accel.use_as_accelerate)\n"
            )
        if filename == "top_level.txt":
            return _NAME + "\n"
        return None

    def locate_file(self, path: Any) -> Path:
        spec = importlib.util.find_spec("accel")
        assert spec is not None and spec.origin is not None
        return Path(spec.origin).parent.parent / str(path)


class _AccelerateFinder(importlib.metadata.DistributionFinder):
    """Maps the `accelerate` import name and distribution onto accel."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _is_accelerate_name(fullname):
            return None
        accel_spec = importlib.util.find_spec(_target(fullname))
        if accel_spec is None:
            return None
        is_package = accel_spec.submodule_search_locations is not None
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(_target(fullname)), is_package=is_package
        )

    def find_distributions(
        self, context: importlib.metadata.DistributionFinder.Context | None = None
    ) -> list[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is not None and re.sub(r"[-_.]+", "-", name).lower() != _NAME:
            return []
        return [_AccelerateDistribution()]

    def invalidate_caches(self) -> None:
        """No caches: every answer is computed on the spot."""


_FINDER = _AccelerateFinder()


def is_used_as_accelerate() -> bool:
    """Whether the switch is on in this interpreter."""
    return _FINDER in sys.meta_path


def _imported_accelerate() -> list[str]:
    return sorted(name for name in sys.modules if _is_accelerate_name(name))


def use_as_accelerate() -> None:
    """Make `import accelerate` (and every `accelerate.*` path) import accel from now on, and
    report accelerate as installed at `REPORTED_VERSION` to `importlib.metadata`.

    Call it before importing the library that imports accelerate (transformers, peft, ...):
    those check availability once and remember the answer. Calling it again does nothing.
    Raises RuntimeError when the real accelerate was already imported, since two copies of its
    state (`AcceleratorState`, hooks) in one program would disagree.
    """
    if is_used_as_accelerate():
        if sys.meta_path[0] is not _FINDER:
            sys.meta_path.remove(_FINDER)
            sys.meta_path.insert(0, _FINDER)
        return
    loaded = _imported_accelerate()
    if loaded:
        origin = getattr(sys.modules[loaded[0]], "__file__", None)
        raise RuntimeError(
            f"accelerate is already imported (from {origin}), so accel cannot stand in for it "
            "in this program. Call accel.use_as_accelerate() before anything imports "
            f"accelerate or transformers, or set {ENV_AS_ACCELERATE}=1 in the environment "
            "(`accel launch --as_accelerate` does that for every process)."
        )
    sys.meta_path.insert(0, _FINDER)
    importlib.invalidate_caches()
    early = [name for name in _CLIENTS if name in sys.modules]
    if early:
        warnings.warn(
            f"accel.use_as_accelerate() was called after {', '.join(early)} was imported; "
            "it may have recorded already whether accelerate is installed. Call it before "
            f"importing them (or set {ENV_AS_ACCELERATE}=1).",
            stacklevel=2,
        )


def _stop_using_as_accelerate() -> None:
    """Turn the switch off and forget the `accelerate` modules imported through it (tests)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in _imported_accelerate():
        del sys.modules[name]


def _env_switch() -> bool:
    """The value of `ACCEL_AS_ACCELERATE`; raises ValueError naming accepted values."""
    value = os.environ.get(ENV_AS_ACCELERATE, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{ENV_AS_ACCELERATE}={os.environ[ENV_AS_ACCELERATE]!r} is not a truth value; "
        f"use one of {sorted(_TRUE)} to turn the switch on, or {sorted(_FALSE - {''})} (or unset) "
        "to leave it off."
    )


def _start() -> None:
    """Run by the start-up hook in every interpreter: turn the switch on when the environment
    asks for it. A bad value is reported on stderr, not raised, so no interpreter fails to
    start because of it."""
    try:
        on = _env_switch()
    except ValueError as error:
        print(f"accel: {error}", file=sys.stderr)
        return
    if on:
        use_as_accelerate()
