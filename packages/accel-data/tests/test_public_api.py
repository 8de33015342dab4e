"""The public API is declared once and changes only on purpose."""

from __future__ import annotations

import subprocess
import sys

import accel_data

EXPECTED = [
    "BatchSamplerShard",
    "DataLoaderAdapter",
    "DataLoaderConfiguration",
    "DataLoaderDispatcher",
    "DataLoaderShard",
    "DataLoaderStateMixin",
    "IterableDatasetShard",
    "IterationObserver",
    "SeedableRandomSampler",
    "SkipBatchSampler",
    "SkipDataLoader",
    "continue_data_position",
    "find_batch_size",
    "get_sampler",
    "prepare_data_loader",
    "send_to_device",
    "skip_first_batches",
]


def test_all_is_explicit_and_sorted() -> None:
    assert accel_data.__all__ == EXPECTED
    assert sorted(EXPECTED) == EXPECTED


def test_every_name_resolves() -> None:
    for name in accel_data.__all__:
        assert getattr(accel_data, name) is not None, name


def test_import_imports_no_sibling_and_touches_nothing() -> None:
    code = (
        "import os, sys; before = dict(os.environ); import accel_data; "
        "import torch.distributed as dist; "
        "bad = [m for m in sys.modules if m.startswith('accel_') and m != 'accel_data' "
        "and not m.startswith('accel_data.')]; "
        "assert not bad, bad; assert dict(os.environ) == before; "
        "assert not dist.is_initialized(); "
        "assert 'torchdata' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
