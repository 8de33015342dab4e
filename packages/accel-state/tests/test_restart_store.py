"""Process groups under torchrun's elastic agent: each restart attempt gets its own keys."""

from __future__ import annotations

import pytest
import torch

from accel_state import detect_launch
from accel_state._store import restart_prefix
from accel_state.testing import run_distributed

_TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}


def test_restart_count_and_agent_store_are_read_from_torchrun() -> None:
    plain = detect_launch(_TORCHRUN)
    assert plain.restart_count is None and plain.agent_store is False
    env = {**_TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    info = detect_launch(env)
    assert info.restart_count == 2 and info.agent_store is True
    assert restart_prefix(2) == "accel_restart_2/"


def _sum_of_ranks() -> tuple[int, list[str]]:
    import os

    import torch
    import torch.distributed as dist

    from accel_state import PartialState

    state = PartialState(cpu=True)
    total = torch.tensor([state.process_index + 1])
    dist.all_reduce(total)
    # rank 0 hosts the store (no agent here)
    client = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=False)
    if not hasattr(client, "list_keys"):  # older torch (2.9): a store cannot list its keys
        return int(total.item()), None
    return int(total.item()), sorted(client.list_keys())


def test_without_the_agent_store_a_restarted_attempt_uses_no_prefix() -> None:
    # Rank 0 hosts a new store every attempt (torchrun's dynamic rendezvous without a shared
    # store): nothing stale to avoid, and the agents of an elastic run count restarts apart
    # (a node that joins later starts at 0), so a prefix of the count would split the group.
    results = run_distributed(_sum_of_ranks, world_size=2, env={"TORCHELASTIC_RESTART_COUNT": "3"})
    assert [r[0] for r in results] == [3, 3]
    keys = results[0][1]
    if keys is None:
        pytest.skip(
            f"the keys' names are read with TCPStore.list_keys, which torch {torch.__version__} "
            f"lacks (the sum above ran)"
        )
    assert keys and not any(k.startswith(restart_prefix(3)) for k in keys), keys
