"""Fault tolerance across replica groups (torchft) in this process: a real lighthouse and real
managers, each replica group one Accelerator (one process per group, or a thread per group
where two must meet). The launched runs are in integration-tests/test_replica_groups.py.

- Gradient accumulation: exactly one quorum and one commit per optimizer step.
- Two groups given one id: both fail with an error that names the id, within the timeout.
- A checkpoint keeps the groups' step: a run restarted whole from it continues counting.
- end_training stops the manager (its server, threads, exit hook), once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from accel import Accelerator
from accel_testkit.tolerance import assert_same_training, float32_error

pytestmark = [pytest.mark.needs("torchft"), pytest.mark.serial]


@pytest.fixture
def lighthouse(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], str]]:
    """Starts a lighthouse on loopback for `min_replicas` groups; returns its address."""
    from accel_parallel.fault_tolerance import serve_lighthouse

    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHFT_LIGHTHOUSE"):
        monkeypatch.delenv(name, raising=False)
    servers: list[Any] = []

    def serve(min_replicas: int) -> str:
        servers.append(serve_lighthouse(min_replicas, "127.0.0.1:0"))
        return servers[-1].address()

    yield serve
    for server in servers:
        server.shutdown()


def _accelerator(lighthouse: str, group: int, groups: int, **kwargs: Any) -> Accelerator:
    from accel.utils import FaultTolerancePlugin

    plugin = FaultTolerancePlugin(
        replica_group_id=group, num_replica_groups=groups, min_replica_groups=groups,
        lighthouse=lighthouse, timeout=10.0,
    )  # fmt: skip
    return Accelerator(cpu=True, fault_tolerance=plugin, **kwargs)


def _count_calls(manager: Any, names: tuple[str, ...]) -> dict[str, int]:
    counts = dict.fromkeys(names, 0)
    for name in names:
        call = getattr(manager, name)

        def counted(*args: Any, _call: Any = call, _name: str = name, **kw: Any) -> Any:
            counts[_name] += 1
            return _call(*args, **kw)

        setattr(manager, name, counted)
    return counts


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def test_accumulation_takes_one_quorum_and_one_commit_per_optimizer_step(
    lighthouse: Callable[[int], str],
) -> None:
    acc = _accelerator(lighthouse(1), 0, 1, gradient_accumulation_steps=2)
    model = _model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    strategy = acc.strategy
    counts = _count_calls(strategy.manager, ("start_quorum", "should_commit"))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 4, generator=g), torch.randn(12, 1, generator=g)
    seen = []
    try:
        for i in range(6):  # 3 optimizer steps of 2 micro-batches
            with acc.accumulate(model):
                acc.backward(
                    nn.functional.mse_loss(model(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2])
                )
                optimizer.step()
                optimizer.zero_grad()
            seen.append((counts["start_quorum"], counts["should_commit"], strategy.current_step))
    finally:
        strategy.shutdown()
    # micro-batch i: the quorum opens at the first forward of each step, commits at its end
    assert seen == [(1, 0, 0), (1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 2, 2), (3, 3, 3)]
    # the same arithmetic by hand: the mean of the two micro-batches' halved losses' gradients
    reference = _model()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for s in range(3):
        for i in (2 * s, 2 * s + 1):
            (
                nn.functional.mse_loss(reference(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]) / 2
            ).backward()
        sgd.step()
        sgd.zero_grad()
    # 2 layers, sums of at most 8 terms (the width), 3 steps
    got = acc.unwrap_model(model).state_dict()
    assert_same_training(got, reference.state_dict(), start, bound=3 * float32_error(2, 8))


@pytest.mark.gpu
def test_a_replica_group_on_cuda_runs_its_collectives_over_nccl(
    lighthouse: Callable[[int], str],
) -> None:
    """On a GPU the group's process group is torchft's ProcessGroupNCCL (the device entry's
    backend), its quorum configures it, and 3 steps through it (each averaging the gradients
    over the replica groups, one here) equal plain SGD on the same GPU."""
    from accel.utils import FaultTolerancePlugin

    plugin = FaultTolerancePlugin(
        replica_group_id=0, num_replica_groups=1, min_replica_groups=1,
        lighthouse=lighthouse(1), timeout=30.0,
    )  # fmt: skip
    acc = Accelerator(fault_tolerance=plugin)
    assert acc.device.type == "cuda"
    model = _model().to(acc.device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    strategy = acc.strategy
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 4, generator=g).cuda(), torch.randn(6, 1, generator=g).cuda()
    try:
        for i in range(3):
            acc.backward(nn.functional.mse_loss(model(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]))
            optimizer.step()
            optimizer.zero_grad()
        backend = type(strategy.manager._pg).__name__
        steps = strategy.current_step
    finally:
        strategy.shutdown()
    assert backend == "ProcessGroupNCCL" and steps == 3
    reference = _model().cuda()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i in range(3):
        nn.functional.mse_loss(reference(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]).backward()
        sgd.step()
        sgd.zero_grad()
    # 2 layers, sums of at most 8 terms (the width), 3 steps
    got = {k: v.cpu() for k, v in acc.unwrap_model(model).state_dict().items()}
    want = {k: v.cpu() for k, v in reference.state_dict().items()}
    start = {k: v.cpu() for k, v in start.items()}
    assert_same_training(got, want, start, bound=3 * float32_error(2, 8))


def test_two_groups_given_one_id_fail_clearly_not_hang(
    lighthouse: Callable[[int], str],
) -> None:
    address = lighthouse(2)
    errors: list[BaseException | None] = [None, None]

    def group(i: int) -> None:
        acc = _accelerator(address, 0, 2)  # both say replica_group_id=0
        model = _model()
        model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        try:
            acc.backward(model(torch.ones(2, 4)).sum())
            optimizer.step()
        except BaseException as err:  # the test reads it
            errors[i] = err
        finally:
            acc.strategy.shutdown()

    threads = [threading.Thread(target=group, args=(i,)) for i in (0, 1)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a group hung"
    for err in errors:
        assert isinstance(err, ValueError), err
        assert "two replica groups run with replica_group_id=0" in str(err)
    assert time.monotonic() - start < 60  # the timeout is 10 s


def test_a_run_restarted_whole_from_a_checkpoint_continues_the_groups_step(
    lighthouse: Callable[[int], str], tmp_path: Path
) -> None:
    from accel import ProjectConfiguration

    def run(address: str) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
        config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
        acc = _accelerator(address, 0, 1, project_config=config)
        model = _model()
        model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        return acc, model, optimizer

    def step(acc: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        acc.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        optimizer.zero_grad()

    first = run(lighthouse(1))
    try:
        for _ in range(2):
            step(*first)
        assert first[0].strategy.current_step == 2
        first[0].save_state()
    finally:
        first[0].strategy.shutdown()
    again = run(lighthouse(1))  # a new lighthouse and manager: the whole run restarted
    try:
        assert again[0].strategy.current_step == 0
        again[0].load_state_if_any()
        assert again[0].strategy.current_step == 2
        for key, value in again[0].unwrap_model(again[1]).state_dict().items():
            assert torch.equal(value, first[0].unwrap_model(first[1]).state_dict()[key]), key
        step(*again)
        assert again[0].strategy.current_step == 3
    finally:
        again[0].strategy.shutdown()


def test_end_training_stops_the_manager_once(
    lighthouse: Callable[[int], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import atexit
    from urllib.parse import urlsplit

    exit_hooks: list[Any] = []  # what would run at interpreter exit (the real list too)
    register, unregister = atexit.register, atexit.unregister
    monkeypatch.setattr(atexit, "register", lambda f: (exit_hooks.append(f), register(f))[1])
    monkeypatch.setattr(
        atexit, "unregister", lambda f: ([exit_hooks.remove(h) for h in exit_hooks if h == f],
                                         unregister(f))[1]
    )  # fmt: skip
    acc = _accelerator(lighthouse(1), 0, 1)
    model = _model()
    model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.backward(model(torch.ones(2, 4)).sum())
    optimizer.step()
    assert acc.strategy.close in exit_hooks  # a script that never ends training: at exit
    manager = acc.strategy.manager
    served = urlsplit(manager._manager.address())
    shutdowns = _count_calls(manager, ("shutdown",))
    acc.end_training()
    assert shutdowns == {"shutdown": 1}
    assert acc.strategy.close not in exit_hooks  # stopped already: nothing left for exit
    assert manager._executor._shutdown  # the manager's threads are told to stop
    assert _closes(served.hostname, served.port)  # its server (the lighthouse's client) too
    acc.end_training()  # a second end_training is harmless: nothing is stopped twice
    acc.strategy.shutdown()
    assert shutdowns == {"shutdown": 1}


def _closes(host: str, port: int, within: float = 20.0) -> bool:
    """Whether the server at host:port stops accepting connections within `within` seconds
    (torchft's manager server stops on its own threads after shutdown returns)."""
    import socket

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            return True
        time.sleep(0.1)
    return False


def test_every_ft_launch_flag_reaches_a_field_of_the_plugin() -> None:
    """`accel launch --ft_*` flags become the worker's FaultTolerancePlugin: each names one of
    its fields (--ft_heartbeat_timeout_ms included, which the timeout is checked against)."""
    import dataclasses

    from accel.utils import FaultTolerancePlugin
    from accel_cli._flags import SECTION_KEYS

    fields = {f.name for f in dataclasses.fields(FaultTolerancePlugin)}
    keys = {key for section, key in SECTION_KEYS.values() if section == "fault_tolerance_config"}
    assert "heartbeat_timeout_ms" in keys and keys <= fields, keys - fields
