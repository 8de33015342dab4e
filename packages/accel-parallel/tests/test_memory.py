"""Training-memory estimates against the peak a real step reaches on this CPU, measured by
`accel_testkit.memory.measured_peak` (the CPU allocator's live bytes from torch's profiler
memory events, from the first training step on).

Bound: the estimate is within 10% of the measured peak (the issue's bound). Where the traced
step and the real one run the same kernels on the same sizes, they agree to the byte; what
differs is memory allocated inside a kernel that fake tensors do not see (a kernel's own
workspace) and the collectives' own buffers on gloo.
"""

from __future__ import annotations

import functools

import pytest
import torch

from accel_parallel import _memory_repeat as repeat
from accel_parallel import _memory_trace as trace
from accel_parallel.memory import estimate_training_memory, parse_memory, plan_training
from accel_testkit.memory import measured_peak
from accel_testkit.models import Stack

CPU = torch.device("cpu")
BOUND = 0.10
MLP = functools.partial(Stack, width=256, depth=4, hidden=1024, in_features=256, out_features=256)
MLP_BATCH = 256
LLAMA_BATCH, LLAMA_SEQ = 4, 64


def tiny_llama(layers: int = 2, hidden: int = 128, intermediate: int = 344) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        attn_implementation="eager",
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def measured_peak_of(build, batch_of, mixed_precision: str = "no") -> int:
    """The measured peak (accel_testkit.memory) of two real AdamW steps."""

    def setup() -> tuple:
        model = build()
        return model, torch.optim.AdamW(model.parameters()), batch_of(model)

    def steps(state: tuple) -> None:
        for _ in range(2):
            trace.train_step(*state, mixed_precision)

    return measured_peak(setup, steps)


def _mlp_batch(model: torch.nn.Module) -> dict:
    return {"args": (torch.randn(MLP_BATCH, 256),)}


def _llama_batch(model: torch.nn.Module) -> dict:
    ids = torch.randint(0, 512, (LLAMA_BATCH, LLAMA_SEQ))
    return {"input_ids": ids, "labels": ids}


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= BOUND * measured


def _build_for(engine: str, factory, info, reshard: bool = True):
    from accel_parallel import DDPStrategy, FSDP2Strategy, FullyShardedDataParallelPlugin

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        model = factory()
        if engine == "ddp":
            return DDPStrategy(info).wrap_model(model) if info.num_processes > 1 else model
        plugin = FullyShardedDataParallelPlugin(reshard_after_forward=reshard)
        return FSDP2Strategy(info, plugin).wrap_model(model)

    return build


CASES = {
    "mlp-ddp": (MLP, _mlp_batch, "ddp", True),
    "mlp-fsdp2": (MLP, _mlp_batch, "fsdp2", True),
    "mlp-fsdp2-noreshard": (MLP, _mlp_batch, "fsdp2", False),
    "llama-ddp": (tiny_llama, _llama_batch, "ddp", True),
    "llama-fsdp2": (tiny_llama, _llama_batch, "fsdp2", True),
}


def _measure_all() -> dict[str, int]:
    """Each case's measured peak on this rank (run inside the launched workers)."""
    from accel_parallel import ProcessInfo
    from accel_state import PartialState

    state = PartialState(cpu=True)
    info = ProcessInfo(CPU, state.num_processes, state.process_index)
    return {
        name: measured_peak_of(_build_for(engine, factory, info, reshard), batch_of)
        for name, (factory, batch_of, engine, reshard) in CASES.items()
    }


def _predicted(world_size: int) -> dict[str, int]:
    out = {}
    for name, (factory, batch_of, engine, reshard) in CASES.items():
        (row,) = estimate_training_memory(
            factory, world_size=world_size, batch=batch_of, engines=[engine],
            offload=[False], reshard_after_forward=[reshard],
        )  # fmt: skip
        assert sum(row.parts.values()) == row.peak_bytes
        out[name] = row.peak_bytes
    return out


@pytest.mark.needs("transformers")
@pytest.mark.parametrize("world_size", [1, 2])
def test_predicted_peak_matches_measured(world_size: int) -> None:
    """One process: every case within the bound. Two gloo processes: never above the measured
    peak (the estimate misses memory, it adds none), and short of it by at most one copy of
    the model's parameters: gloo's collectives sometimes hold one more buffer (a DDP bucket,
    an FSDP2 unit's gathered or reduced tensors) past a collective's end, depending on thread
    timing (0-19% of the peak here, run to run), which the traced step does not model."""
    from accel_state.testing import run_distributed

    predicted = _predicted(world_size)
    results = run_distributed(_measure_all, world_size=world_size, timeout=300)
    for rank, measured in enumerate(results):
        for name, peak in measured.items():
            case = (world_size, rank, name, predicted[name], peak)
            if world_size == 1:
                assert _close(predicted[name], peak), case
            else:
                assert predicted[name] <= peak + 64, case  # 64: allocator-side byte slack
                assert peak <= predicted[name] + _parameter_bytes(name) + 64, case


def _parameter_bytes(case: str) -> int:
    """One full copy of the case's model parameters, in bytes."""
    model = CASES[case][0]()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_breakdown_and_engines() -> None:
    rows = estimate_training_memory(MLP, world_size=4, batch=_mlp_batch)
    labels = {r.label() for r in rows}
    assert {"ddp", "fsdp2", "fsdp2+offload", "fsdp2+no-reshard", "zero1", "zero3+offload"} <= labels
    for row in rows:
        assert row.peak_bytes == sum(row.parts.values()) > 0
        assert row.as_row()["peak_bytes"] == row.peak_bytes
    by = {r.label(): r for r in rows}
    # sharding over 4 ranks: FSDP2 keeps a quarter of the AdamW states that DDP keeps
    states = by["ddp"].parts["optimizer_states"]
    # each rank keeps AdamW's step counter per parameter (a float32 scalar, 8 bytes with its
    # storage rounding) unsharded
    counters = 4 * 8 * len(list(MLP().parameters()))
    assert abs(by["fsdp2"].parts["optimizer_states"] * 4 - states) <= counters
    assert by["fsdp2+offload"].peak_bytes < by["fsdp2"].peak_bytes < by["ddp"].peak_bytes
    assert by["zero3"].parts["weights"] < by["zero1"].parts["weights"]


def test_untraceable_model_falls_back_to_formula() -> None:
    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.fc(x)
            return y * 2 if y.sum().item() > 0 else y  # needs the data

    (row,) = estimate_training_memory(DataDependent, batch_size=2, engines=["ddp"])
    assert row.method == "approximate"
    assert any("DataDependent" in n or "(root)" in n for n in row.notes), row.notes
    assert any(n.startswith("approximate") for n in row.notes)
    assert row.parts["weights"] == (8 * 8 + 8) * 4


def test_plan_and_errors() -> None:
    rows = estimate_training_memory(MLP, world_size=2, batch=_mlp_batch)
    ddp = next(r for r in rows if r.label() == "ddp")
    plan = plan_training(MLP, world_size=2, batch=_mlp_batch, device_memory=ddp.peak_bytes)
    assert plan and all(r.peak_bytes <= 0.9 * ddp.peak_bytes for r in plan)
    assert [r.step_cost for r in plan] == sorted(r.step_cost for r in plan)
    assert parse_memory("80GiB") == 80 * 2**30 and parse_memory("1.5GB") == 1_500_000_000
    with pytest.raises(ValueError, match="80 parsecs"):
        parse_memory("80 parsecs")
    with pytest.raises(ValueError, match="engines \\['zero4'\\]"):
        estimate_training_memory(MLP, engines=["zero4"])
    with pytest.raises(ValueError, match="optimizer='lamb'"):
        estimate_training_memory(MLP, optimizer="lamb")


def _all_rows(build, extrapolate: bool) -> list:
    """Every engine and option, bf16 autocast, batch 4 x 128, over 2 fake ranks."""
    return estimate_training_memory(
        build, world_size=2, batch_size=4, seq_len=128, mixed_precision="bf16",
        extrapolate=extrapolate,
    )  # fmt: skip


@pytest.mark.needs("transformers")
def test_repeated_blocks_extrapolate_to_the_byte() -> None:
    """A Llama of 6 identical decoder layers: traced with 3, 4 and 5 of them and extended to
    6, every row (DDP, ZeRO-1/2/3 and FSDP2 with their options) equals the whole model's
    trace to the byte."""
    layers = 6
    build = functools.partial(tiny_llama, layers, hidden=64, intermediate=172)
    fast, whole = _all_rows(build, True), _all_rows(build, False)
    assert len(fast) == len(whole) == 11
    blocks = f"3, 4 and 5 of {layers} LlamaDecoderLayer blocks, extrapolated"
    for a, b in zip(fast, whole, strict=True):
        assert a.label() == b.label()
        assert a.method == f"{b.method} ({blocks})"
        assert (a.parts, a.comm_bytes, a.host_bytes, a.notes) == (
            b.parts,
            b.comm_bytes,
            b.host_bytes,
            b.notes,
        ), a.label()


@pytest.mark.needs("transformers")
def test_differing_blocks_are_traced_whole() -> None:
    """One layer of six differs (a bias more): the model is traced whole."""

    def build() -> torch.nn.Module:
        model = tiny_llama(6, hidden=64, intermediate=172)
        model.model.layers[3].mlp.down_proj = torch.nn.Linear(172, 64, bias=True)
        return model

    rows = estimate_training_memory(build, world_size=2, batch_size=4, seq_len=128,
                                    extrapolate=True)  # fmt: skip
    assert repeat.repeated_blocks(build()) is None
    assert rows and all(r.method.startswith("traced") for r in rows)
    assert not any("extrapolated" in r.method for r in rows)


def test_public_names() -> None:
    from accel_parallel import memory

    assert memory.__all__ == [
        "ENGINES",
        "OPTIMIZERS",
        "MemoryEstimate",
        "estimate_training_memory",
        "parse_memory",
        "plan_training",
    ]
