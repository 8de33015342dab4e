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


def test_a_timeout_at_or_below_the_lighthouse_heartbeat_is_refused() -> None:
    """After a loss, the survivors' quorum waits out the dead group's heartbeat: a quorum
    timeout that is not above it would fail them. The message names both values and the fix."""
    with pytest.raises(ValueError) as refused:
        FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, timeout=5)
    message = str(refused.value)
    assert "timeout=5 s is at or below the lighthouse's heartbeat timeout" in message
    assert "heartbeat_timeout_ms=5000" in message  # the default, as `accel lighthouse`'s
    assert "--ft_timeout" in message and "timeout=10" in message  # the fix
    assert "--heartbeat_timeout_ms" in message and "--ft_heartbeat_timeout_ms" in message
    with pytest.raises(ValueError, match=r"timeout=20 s .*\(heartbeat_timeout_ms=30000"):
        FaultTolerancePlugin.from_launch(
            {"replica_group_id": 0, "num_replica_groups": 2, "timeout": 20.0,
             "heartbeat_timeout_ms": 30000}
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"heartbeat_timeout_ms=0: expected milliseconds > 0"):
        FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, heartbeat_timeout_ms=0)
    # above it: accepted, from the plugin and from `accel launch --ft_*` flags
    FaultTolerancePlugin(replica_group_id=0, num_replica_groups=2, timeout=5.5)
    FaultTolerancePlugin(
        replica_group_id=0, num_replica_groups=2, timeout=2, heartbeat_timeout_ms=1000
    )
    plugin = FaultTolerancePlugin.from_launch(
        {"replica_group_id": 1, "num_replica_groups": 2, "timeout": 61.0,
         "heartbeat_timeout_ms": 60000}
    )  # fmt: skip
    assert (plugin.timeout, plugin.heartbeat_timeout_ms) == (61.0, 60000)


@pytest.mark.needs("torchft")
def test_an_unreachable_lighthouse_fails_within_the_timeout(monkeypatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHFT_LIGHTHOUSE"):
        monkeypatch.delenv(name, raising=False)
    plugin = FaultTolerancePlugin(
        replica_group_id=0, num_replica_groups=1, lighthouse="http://127.0.0.1:9", timeout=2,
        heartbeat_timeout_ms=1000,
    )  # fmt: skip
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
