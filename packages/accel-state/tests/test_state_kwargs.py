"""PartialState takes accelerate's keywords: what it does not use itself reaches
`torch.distributed.init_process_group`, as accelerate passes them (transformers'
`TrainingArguments` gives `timeout=` on every machine where `use_cpu` is left False)."""

from __future__ import annotations

import datetime

import pytest
import torch

from accel_state import InitProcessGroupKwargs, PartialState
from accel_state.testing import run_distributed


@pytest.fixture(autouse=True)
def _fresh_state():
    PartialState._reset_state()
    yield
    PartialState._reset_state()


def _made_like_transformers() -> dict:
    import torch.distributed as dist

    # What TrainingArguments("out") passes with its defaults (ddp_backend=None,
    # ddp_timeout=1800), and then InitProcessGroupKwargs(...).to_kwargs() as accelerate's
    # docs show it.
    state = PartialState(backend=None, timeout=datetime.timedelta(seconds=1800))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    again = PartialState(**InitProcessGroupKwargs(timeout=60).to_kwargs())
    return {
        "rank": state.process_index,
        "world": state.num_processes,
        "timeout_s": backend.options._timeout.total_seconds(),
        "same": again.process_index == state.process_index,
    }


def test_timeout_reaches_the_process_group_of_two_processes() -> None:
    results = run_distributed(_made_like_transformers, world_size=2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["same"] for r in results)
    assert all(r["timeout_s"] == 1800 for r in results)


def test_one_process_accepts_the_same_keywords() -> None:
    state = PartialState(backend=None, timeout=datetime.timedelta(seconds=1800))
    assert state.num_processes == 1 and state.device.type in ("cpu", "cuda", "xpu", "mps")


def test_a_keyword_init_process_group_does_not_take_is_named() -> None:
    with pytest.raises(TypeError, match=r"does not take \['timout'\].*'timeout'"):
        PartialState(timout=30)
    assert PartialState._topology is None  # refused before anything was made


def test_to_kwargs_gives_only_what_was_set() -> None:
    assert InitProcessGroupKwargs().to_kwargs() == {}
    kw = InitProcessGroupKwargs(backend="gloo", timeout=5)
    assert kw.to_kwargs() == {"backend": "gloo", "timeout": datetime.timedelta(seconds=5)}


def test_sagemaker_data_parallel_is_refused_with_the_fix() -> None:
    with pytest.raises(NotImplementedError, match=r"_use_sagemaker_dp=True\) is not supported"):
        PartialState(_use_sagemaker_dp=True)
