"""FaultTolerancePlugin and the fault_tolerant strategy's refusals (in this process; the
replica groups themselves run in integration-tests/test_replica_groups.py)."""

from __future__ import annotations

import time

import pytest
import torch

from accel_parallel import ProcessInfo, resolve_strategy
from accel_parallel.fault_tolerance import FaultTolerancePlugin, lighthouse_from


def test_a_plugin_refuses_what_no_run_could_do() -> None:
    with pytest.raises(ValueError, match=r"min_replica_groups=3 with num_replica_groups=2"):
        FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, min_replica_groups=3)
    with pytest.raises(ValueError, match=r"replica_group_id=2 with num_replica_groups=2"):
        FaultTolerancePlugin(replica_group_id=2, num_replica_groups=2)
    with pytest.raises(ValueError, match=r"semi_sync='ddp'"):
        FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, semi_sync="ddp")
    with pytest.raises(ValueError, match=r"lighthouse='nowhere': expected http://HOST:PORT"):
        FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, lighthouse="nowhere")
    plugin = FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2)
    with pytest.raises(ValueError, match="TORCHFT_LIGHTHOUSE"):
        lighthouse_from(plugin, {})
    assert lighthouse_from(plugin, {"TORCHFT_LIGHTHOUSE": "h:1"}) == "http://h:1"


@pytest.mark.needs("torchft")
def test_an_unreachable_lighthouse_fails_within_the_timeout(monkeypatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHFT_LIGHTHOUSE"):
        monkeypatch.delenv(name, raising=False)
    plugin = FaultTolerancePlugin(
        replica_group_id=0, num_replica_groups=1, lighthouse="http://127.0.0.1:9", timeout=2
    )
    info = ProcessInfo(torch.device("cpu"))
    strategy = resolve_strategy(info, fault_tolerance=plugin).strategy
    assert strategy.name == "fault_tolerant"
    assert (strategy.data_parallel_size, strategy.data_parallel_rank) == (1, 0)
    model = torch.nn.Linear(2, 2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"could not reach the lighthouse at http://127.0.0.1:9"):
        strategy.prepare([model], [torch.optim.SGD(model.parameters(), lr=0.1)])
    assert time.monotonic() - start < 60  # not a hang (the timeout is 2 s)


def test_two_plugins_of_engines_are_refused() -> None:
    pytest.importorskip("torchft", reason="needs torchft (accel-parallel[ft])")
    from accel_parallel import FullyShardedDataParallelPlugin

    plugin = FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, lighthouse="h:1")
    info = ProcessInfo(torch.device("cpu"), num_processes=2)
    with pytest.raises(ValueError, match="fsdp_plugin"):
        resolve_strategy(info, fault_tolerance=plugin, fsdp_plugin=FullyShardedDataParallelPlugin())
