"""pytest plugin loaded (`-p _transformers_suite_shim`) into every run of transformers' trainer tests.

Used by `run_transformers_trainer.py` only, on both sides alike (accelerate and accel), so it
changes nothing in the comparison. It does three things:

1. Names that the pinned test files import at module level but that transformers 5.23.0 no
   longer has (`GlueDataset`, `GlueDataTrainingArguments`: the `transformers.data.datasets`
   package was removed) get a placeholder class, so the file still collects. Only `@slow` tests use
   them, and those are skipped here; a placeholder raises if anything does call it.
2. Registers the markers transformers' own conftest.py registers (that conftest is not copied),
   so pytest does not warn about them.
3. Writes which `accelerate` the session imports into the file named by
   `$ACCEL_COMPAT_REPORT_ACCELERATE` (and into the report header), so the runner can check that
   the switch took effect.
"""

from __future__ import annotations

import os

_REMOVED_NAMES = ("GlueDataset", "GlueDataTrainingArguments")
_MARKERS = (
    "torch_compile_test: a test that compiles with torch.compile",
    "torch_export_test: a test that exports with torch.export",
    "flash_attn_test: a flash-attention test",
    "flash_attn_3_test: a flash-attention 3 test",
    "training_ci: a training CI test",
    "bitsandbytes: a bitsandbytes test",
    "generate: a generation test",
    "is_pipeline_test: a pipeline test",
    "is_staging_test: a test that needs the staging Hub",
    "accelerate_tests: an accelerate test",
    "not_device_test: a test that does not need a device",
)


def _placeholder(name: str) -> type:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"transformers {_version()} has no {name}; the placeholder was called")

    return type(name, (), {"__init__": __init__, "__module__": "transformers"})


def _version() -> str:
    import transformers

    return transformers.__version__


def pytest_configure(config):
    for marker in _MARKERS:
        config.addinivalue_line("markers", marker)
    _install_placeholders()


def _install_placeholders() -> None:
    """transformers replaces its own module object in `sys.modules` while it loads its
    submodules, so an attribute set on one object can vanish: the placeholders are answered by
    the lazy module's class instead, for the top-level `transformers` module only."""
    import transformers
    from transformers.utils import import_utils

    missing = {}
    for name in _REMOVED_NAMES:
        try:
            getattr(transformers, name)
        except (AttributeError, ImportError):
            missing[name] = _placeholder(name)
    if not missing:
        return
    lazy = import_utils._LazyModule
    original = lazy.__getattr__

    def __getattr__(self, name):
        if name in missing and self.__name__ == "transformers":
            return missing[name]
        return original(self, name)

    lazy.__getattr__ = __getattr__


def _accelerate_identity() -> str:
    try:
        import accelerate
    except Exception as exc:  # reported, not raised
        return f"import failed: {type(exc).__name__}: {exc}"
    return f"{getattr(accelerate, '__version__', '?')} {getattr(accelerate, '__file__', '?')}"


def pytest_sessionstart(session):
    path = os.environ.get("ACCEL_COMPAT_REPORT_ACCELERATE")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(_accelerate_identity() + "\n")


def pytest_report_header(config):
    return [f"accelerate: {_accelerate_identity()}"]
