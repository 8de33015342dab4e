"""Every device kind present here passes the same contract; the lookup and registration work.

On a CPU machine the contract runs for cpu; with torch-xla and PJRT_DEVICE=CPU it runs for
xla too, and on a GPU machine for cuda: the parametrization is the registry's present kinds.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from accel_state import (
    DeviceKind,
    DistributedType,
    accelerator_entry,
    device_entry,
    device_kinds,
    present_device_kinds,
    register_device_kind,
    unregister_device_kind,
)

PRESENT = present_device_kinds()


@pytest.fixture(params=PRESENT, ids=[kind.name for kind in PRESENT])
def kind(request: pytest.FixtureRequest) -> DeviceKind:
    return request.param


def test_presence_and_the_device_of_a_rank(kind: DeviceKind) -> None:
    assert kind.is_available() and kind.is_available()  # cached answer, same both times
    assert kind.device_count() >= 1
    device = kind.device_for_rank(0, 1)
    assert device.type == kind.name
    assert device_entry(device) is kind
    assert torch.ones(2, device=device).sum().item() == 2.0


def test_select_and_synchronize(kind: DeviceKind) -> None:
    device = kind.device_for_rank(0, 1)
    kind.set_device(device)
    torch.ones(4, device=device).mul_(2)
    kind.synchronize(device)
    kind.synchronize()


def test_rng_state_round_trip_reproduces_the_numbers(kind: DeviceKind) -> None:
    device = kind.device_for_rank(0, 1)
    kind.manual_seed_all(1234)
    saved = kind.get_rng_state_all()
    first = torch.rand(8, device=device).cpu()
    kind.set_rng_state_all(saved)
    assert torch.equal(torch.rand(8, device=device).cpu(), first)
    one = kind.get_rng_state()
    again = torch.rand(8, device=device).cpu()
    kind.set_rng_state(one)
    assert torch.equal(torch.rand(8, device=device).cpu(), again)
    assert isinstance(kind.rng_key, str) and kind.rng_key


def test_memory_queries_answer_ints_or_none(kind: DeviceKind) -> None:
    device = kind.device_for_rank(0, 1)
    for answer in (
        kind.memory_allocated(device),
        kind.max_memory_allocated(device),
        kind.max_memory_reserved(device),
        kind.total_memory(device),
    ):
        assert answer is None or (isinstance(answer, int) and answer >= 0)
    kind.reset_peak_memory_stats(device)
    kind.empty_cache()
    assert isinstance(kind.device_name(device), str) and kind.device_name(device)
    assert isinstance(kind.tf32_matmul(), bool)


def test_backend_is_available_in_torch_distributed(kind: DeviceKind) -> None:
    backend = kind.default_backend()
    if kind.name == "xla":
        pytest.importorskip("torch_xla.distributed.xla_backend")  # registers "xla"
    assert dist.is_backend_available(backend), backend
    assert kind.distributed_type(1) in (DistributedType.NO, DistributedType.XLA)
    assert kind.distributed_type(2) is not DistributedType.NO


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_autocast_takes_the_dtypes_the_entry_names(kind: DeviceKind, dtype: torch.dtype) -> None:
    if dtype not in kind.autocast_dtypes:
        pytest.skip(f"{kind.name} does not autocast to {dtype}")
    device = kind.device_for_rank(0, 1)
    a = torch.randn(4, 4, device=device)
    with torch.autocast(device_type=kind.name, dtype=dtype):
        assert torch.is_autocast_enabled(kind.name)
        out = a @ a
    assert out.dtype == dtype


def test_lookup_takes_devices_and_strings() -> None:
    cpu = device_entry("cpu")
    assert cpu is device_entry(torch.device("cpu")) and cpu.is_host
    assert device_entry("cuda:1") is device_entry(torch.device("cuda", 0))
    assert device_entry("npu").name == "npu"  # a registered kind torch may not know here
    assert set(device_kinds()) >= {"cpu", "cuda", "xla", "mps", "xpu", "npu", "hpu"}
    assert cpu in PRESENT
    assert device_entry("cuda").default_backend() == "nccl" and device_entry("cuda").async_copies
    assert device_entry("xla").rendezvous_init_method == "xla://"
    assert device_entry("xla").distributed_type(1) is DistributedType.XLA
    assert cpu.rendezvous_init_method is None and not cpu.async_copies
    assert cpu.rng_key == "torch_manual_seed"
    assert device_entry("cuda").rng_key == "torch_cuda_manual_seed"  # accelerate's file keys
    assert device_entry("xla").rng_key == "xm_seed"
    assert device_entry("cuda").records_memory_history and device_entry("cuda").ring_attention
    assert not cpu.records_memory_history and not cpu.ring_attention
    assert cpu.device_name(torch.device("cpu")) == "cpu" and not cpu.tf32_matmul()


def test_an_unregistered_kind_gets_torchs_defaults() -> None:
    other = device_entry("mlu")
    assert other.name == "mlu" and device_entry("mlu:3") is other
    assert not other.is_available()
    assert other.distributed_type(2) is DistributedType.MULTI_MLU
    assert other.memory_allocated() is None and other.total_memory() is None
    other.empty_cache()  # no device module: a no-op


def test_accelerator_entry_is_torchs_current_accelerator() -> None:
    current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    entry = accelerator_entry()
    assert (entry is None) == (current is None)
    if entry is not None:
        assert entry is device_entry(current)


def test_a_new_kind_is_one_registered_entry() -> None:
    @register_device_kind
    class FakeKind(DeviceKind):
        name = "fakedev"
        default_backend_name = "gloo"
        autocast_dtypes = (torch.bfloat16,)
        multi_process_type = DistributedType.MULTI_CPU

        def _probe(self) -> bool:
            return True

    try:
        entry = device_entry("fakedev:2")
        assert isinstance(entry, FakeKind) and entry in present_device_kinds()
        assert entry.default_backend() == "gloo"
        assert entry.distributed_type(4) is DistributedType.MULTI_CPU
        assert entry.memory_allocated() is None  # torch has no such module: no answer
        entry.synchronize()
    finally:
        unregister_device_kind("fakedev")
    assert "fakedev" not in device_kinds()
    with pytest.raises(ValueError, match="has no `name`"):
        register_device_kind(type("Nameless", (DeviceKind,), {}))
