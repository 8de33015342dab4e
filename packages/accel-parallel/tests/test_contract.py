"""The strategy contract: every registered strategy runs one loop through the Strategy API.

The loop is what the Accelerator drives, written against accel-parallel alone (torch and
accel-state; a stand-in precision object, no umbrella): prepare a toy model with its SGD
optimizer, accumulate two micro-batches (the first under ``no_sync``), backward, clip,
optimizer step and zero_grad through the strategy, for two steps; then the full model and
optimizer state, the strategy's save files, and a freshly prepared model and optimizer that
load them. Each strategy must end where one process of plain PyTorch ends on the same global
batches, reload to the very same weights and optimizer state, and continue from there exactly
as the run that saved.

The cases come from `registered_strategies()` when the tests are collected, so a new engine
(a module that registers itself) is run through the contract without being listed here
(`test_a_registered_strategy_joins_the_contract` shows it); `_REQUESTS` says what to ask of
those that need more than their name (a plugin, a ParallelismConfig).

Cost: one spawn of 2 gloo workers runs every 2-process strategy in turn (each spawn pays a
torch import per worker); the 1-process ones run in the test process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import accel_parallel
from accel_parallel import (
    DDPStrategy,
    ProcessInfo,
    Strategy,
    StrategyRequest,
    register_strategy,
    registered_strategies,
    resolve_strategy,
)
from accel_parallel.checkpoint import model_name, optimizer_name, weights_file
from accel_state.testing import run_distributed
from accel_testkit.tolerance import float32_error, norm_terms, training_drift

pytest_plugins = ["pytester"]

CPU = torch.device("cpu")
STEPS, ACCUMULATE, GLOBAL_BATCH = 2, 2, 16  # a global micro-batch: GLOBAL_BATCH // ACCUMULATE
LR, MOMENTUM, CLIP = 0.1, 0.9, 0.5  # momentum: an optimizer state to save and load
PLAN = ["inp", "blocks", "out"]  # the pipeline's cut of Net, in the order it runs
TOY = "contract_toy"  # the strategy test_a_registered_strategy_joins_the_contract registers


# -- the model, the data, the reference -------------------------------------------------------
class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class Net(nn.Module):
    """inp -> blocks -> out, each a module (so a pipeline plan can cut it); with labels it
    returns its loss, as the pipeline's prepared model does."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block(16) for _ in range(2))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        out = self.out(h)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def make_optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def micro_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global micro-batch `micro` of optimizer step `step` (the same on every process)."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(GLOBAL_BATCH // ACCUMULATE, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def reference() -> dict[str, Any]:
    """One process of plain PyTorch on the whole global batches: the loss of each micro-batch
    divided by ACCUMULATE, clipped to CLIP, one SGD step per ACCUMULATE micro-batches."""
    model = make_net()
    opt = make_optimizer(model.parameters())
    norms = []
    for step in range(STEPS):
        for micro in range(ACCUMULATE):
            x, y = micro_batch(step, micro)
            (model(x, labels=y)["loss"] / ACCUMULATE).backward()
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
    return {"state": _cpu(model.state_dict()), "norms": norms}


# Why the tolerance is what it is (accel_testkit.tolerance reasons it out): a run that splits
# the same work over processes, shards or stages differs from the reference by float32
# rounding alone, float32_error of one step's clipped gradients of Net; SGD is linear in the
# gradient, so gradients a fraction e apart move the weights e of their movement apart, and
# STEPS steps add STEPS such errors. A broken engine (a missing or doubled reduction, a lost
# micro-batch, a wrong shard, another clip coefficient) is off by a large fraction: 0.1 or
# more.
LAYERS, TERMS = 4, 16  # 4 linear layers; sums of at most 16 terms (16 features; 8 rows + 2)
# about 5e-4: the relative drift the runs may have
BOUND = STEPS * float32_error(LAYERS, TERMS, norm_terms(make_net().parameters()))


# -- the stand-ins for what the caller passes -------------------------------------------------
class PlainPrecision:
    """What strategies call of accel-precision's object, for float32 without a loss scale."""

    scaler = None

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def unscale_once(self, optimizer: torch.optim.Optimizer) -> None:
        pass

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        optimizer.step()
        return True

    def update(self) -> None:
        pass


def write_full(state: dict[str, torch.Tensor], base: Path) -> None:
    """The caller's full-weights format (here torch's): ``pytorch_model.bin`` for ``model``."""
    torch.save(state, base.with_name(weights_file(base.name, safe=False)))


def read_full(base: Path) -> dict[str, torch.Tensor]:
    return torch.load(base.with_name(weights_file(base.name, safe=False)), weights_only=True)


# -- what each strategy is asked for ----------------------------------------------------------
def _requests() -> dict[str, dict[str, Any]]:
    """resolve_strategy's keywords for the strategies that need more than their name (made in
    the worker: a ParallelismConfig builds its mesh there). A strategy not listed gets none."""
    from accel_parallel import DeepSpeedPlugin, ParallelismConfig

    return {
        "mesh": {"parallelism_config": ParallelismConfig(dp_shard_size=2)},
        "pipeline": {
            "parallelism_config": ParallelismConfig(
                pp_size=2, pp_plan=PLAN, pp_microbatches=2, pp_loss_fn=nn.functional.mse_loss
            )
        },
        # the engine clips every step: at the loop's norm, so the two agree
        "deepspeed": {"deepspeed_plugin": DeepSpeedPlugin(zero_stage=2, gradient_clipping=CLIP)},
    }


def world_size(name: str) -> int:
    """One process for the single-device ones (XLA's CPU device runs one replica per process)."""
    return 1 if name in ("single_device", "xla", "xla_spmd") else 2


def missing_library(name: str) -> str | None:
    """Why strategy `name` cannot run here (None: it can)."""
    if name == "fault_tolerant":
        return (
            "replica groups need a lighthouse and one launch per group: "
            "integration-tests/test_replica_groups.py runs them against plain DDP"
        )
    if name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (pip install accel-parallel[deepspeed])"
    if name in ("xla", "xla_spmd"):
        if importlib.util.find_spec("torch_xla") is None:
            return 'torch-xla is not installed (pip install "accel-parallel[xla]")'
        if os.environ.get("PJRT_DEVICE") != "CPU":
            return "the XLA contract runs on XLA's CPU device: set PJRT_DEVICE=CPU"
        if name == "xla_spmd":
            return "SPMD mode must be on from the runtime's start: test_xla_spmd.py (accel) runs it"
    return None


# -- the contract loop ------------------------------------------------------------------------
def _prepare(name: str, info: ProcessInfo, seed: int) -> tuple[Strategy, Any, Any, dict]:
    """A strategy resolved by name, with a Net and its SGD optimizer prepared; `flag["sync"]`
    is what the strategy's sync_gradients reports (False on an accumulation micro-step)."""
    strategy = resolve_strategy(info, strategy=name, **_requests().get(name, {})).strategy
    precision = PlainPrecision()
    strategy.attach_precision(precision)
    model = make_net(seed)
    opt = make_optimizer(model.parameters())
    flag = {"sync": True}
    # an engine that sizes itself from the data loader (DeepSpeed) reads one process's
    # micro-batch from it
    micro = GLOBAL_BATCH // ACCUMULATE // strategy.data_parallel_size
    loader = torch.utils.data.DataLoader(range(GLOBAL_BATCH), batch_size=micro)
    strategy.begin_prepare(
        [model, opt, loader],
        gradient_accumulation_steps=ACCUMULATE,
        sync_gradients=lambda: flag["sync"],
    )
    (model,), (opt,) = strategy.prepare([model], [opt])
    return strategy, model, opt, flag


def _step(strategy: Strategy, model: Any, opt: Any, flag: dict, step: int) -> float:
    """One optimizer step of ACCUMULATE micro-batches, each process on its data-parallel
    share; returns the gradient norm clip_grad_norm_ reported (before clipping)."""
    dp, rank = strategy.data_parallel_size, strategy.data_parallel_rank
    for micro in range(ACCUMULATE):
        x, y = (t.chunk(dp)[rank].to(strategy.device) for t in micro_batch(step, micro))
        flag["sync"] = micro == ACCUMULATE - 1
        block = contextlib.nullcontext() if flag["sync"] else strategy.no_sync(model)
        with block:
            loss = model(x, labels=y)["loss"] / ACCUMULATE
            strategy.backward(loss, strategy.precision.backward)
    norm = strategy.clip_grad_norm_(model.parameters(), CLIP)
    assert strategy.optimizer_step(opt, strategy.precision), "the step was skipped"
    strategy.zero_grad(opt)
    return float(norm)


def _state(strategy: Strategy, model: Any) -> dict[str, torch.Tensor]:
    return _cpu(strategy.model_state_dict(model))


def run_contract(name: str, info: ProcessInfo, folder: Path) -> dict[str, Any]:
    """The loop, the files, the reload and one more step from both (see the module docstring);
    the results this process saw."""
    import torch.distributed as dist

    def barrier() -> None:
        if dist.is_initialized():
            dist.barrier()

    strategy, model, opt, flag = _prepare(name, info, seed=0)
    norms = [_step(strategy, model, opt, flag, step) for step in range(STEPS)]
    state = _state(strategy, model)
    opt_state = strategy.optimizer_state_dict(opt, model)
    writer = info.process_index == 0
    strategy.save_model_files(model, folder, model_name(0), writer=writer, write_full=write_full)
    strategy.save_optimizer_files(opt, folder, optimizer_name(0), writer=writer, model=model)
    barrier()
    files = sorted(p.name for p in folder.iterdir())

    fresh, fresh_model, fresh_opt, fresh_flag = _prepare(name, info, seed=1)
    fresh.load_model_files(fresh_model, folder, model_name(0), read_full=read_full)
    fresh.load_optimizer_files(fresh_opt, folder, optimizer_name(0), model=fresh_model)
    loaded = _state(fresh, fresh_model)
    loaded_opt = fresh.optimizer_state_dict(fresh_opt, fresh_model)
    # one more step from the saved run and from the loaded one: momentum included, the same
    _step(strategy, model, opt, flag, STEPS)
    _step(fresh, fresh_model, fresh_opt, fresh_flag, STEPS)
    for done in (strategy, fresh):  # end_training's hook: what the engine started, stopped
        done.close()
        done.close()  # and a second end_training does nothing more
    return {
        "type": type(strategy).__name__,
        "norms": norms,
        "state": state,
        "files": files,
        "loaded_differs": _differences(loaded, state),
        "optimizer_state": bool(_tensors(opt_state)),
        "loaded_optimizer_differs": _differences(loaded_opt, opt_state),
        "continued_differs": _differences(_state(fresh, fresh_model), _state(strategy, model)),
    }


def _contract_worker(names: list[str], folder: str, toy: bool = False) -> dict[str, Any]:
    """Every case of `names` in turn, in one process of a spawned group."""
    import datetime
    import os

    import torch.distributed as dist

    if toy:  # this process is new: what the test registered there, register here too
        register_toy()
    # a peer that failed leaves this one waiting in a collective: give up after a minute
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    info = ProcessInfo(CPU, dist.get_world_size(), rank, int(os.environ["LOCAL_RANK"]))
    out: dict[str, Any] = {}
    for name in names:
        if name == "deepspeed":
            try:
                import deepspeed  # noqa: F401
            except ImportError as error:
                out[name] = {"skip": f"import deepspeed fails here: {error}"}
                continue
        case = Path(folder) / name
        case.mkdir(parents=True, exist_ok=True)
        try:
            out[name] = run_contract(name, info, case)
        except Exception as error:
            raise RuntimeError(
                f"strategy {name!r} failed the contract on rank {rank}:\n{traceback.format_exc()}"
            ) from error
        dist.barrier()
    return out


def _cpu(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where two nested states differ (tensors compared exactly): [] when equal."""
    if isinstance(want, torch.Tensor):
        same = isinstance(got, torch.Tensor) and got.shape == want.shape
        return [] if same and torch.equal(got.cpu(), want.cpu()) else [path or "."]
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return [f"{path}: keys {sorted(map(str, want))} != {sorted(map(str, got or {}))}"]
        return [d for k in want for d in _differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple) or len(got) != len(want):
            return [f"{path}: {len(want)} entries != {got!r}"]
        return [d for i, (a, b) in enumerate(zip(got, want)) for d in _differences(a, b, f"{path}[{i}]")]  # fmt: skip
    if type(want).__module__ != "builtins" and hasattr(want, "__dict__"):
        return _differences(vars(got), vars(want), f"{path}<{type(want).__name__}>")
    return [] if got == want else [f"{path}: {want!r} != {got!r}"]


# -- the tests ---------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per registered strategy, read when the tests are collected."""
    if "strategy_name" in metafunc.fixturenames:
        metafunc.parametrize("strategy_name", registered_strategies())


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    out = reference()
    assert min(out["norms"]) > CLIP, "the reference never clips: the clip is not checked"
    return out


@pytest.fixture(scope="module")
def contract_results(request: pytest.FixtureRequest, tmp_path_factory: Any) -> dict[str, Any]:
    """Every selected 2-process case, run in one spawn when the first of them asks."""
    selected = [
        item.callspec.params["strategy_name"]
        for item in request.session.items
        if getattr(item, "callspec", None) and "strategy_name" in item.callspec.params
    ]
    names = [n for n in dict.fromkeys(selected) if world_size(n) == 2 and not missing_library(n)]
    folder = tmp_path_factory.mktemp("contract")
    try:
        results = run_distributed(_contract_worker, names, str(folder), world_size=2, timeout=300)
    except Exception as error:  # every case of the spawn reports it
        return {"error": error}
    return {"ranks": results}


def check_contract(name: str, ranks: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    """What every strategy must satisfy, from each process's results."""
    skipped = ranks[0].get("skip")
    if skipped:
        pytest.skip(skipped)
    for rank, result in enumerate(ranks):
        where = f"{name} ({result['type']}) rank {rank}"
        assert not result["loaded_differs"], (where, "reloaded weights", result["loaded_differs"])
        diff = result["loaded_optimizer_differs"]
        assert not diff, (where, "reloaded optimizer state", diff[:5])
        diff = result["continued_differs"]
        assert not diff, (where, "a step after the reload", diff[:5])
        for got, want in zip(result["norms"], expected["norms"]):
            assert abs(got - want) <= BOUND * want, (where, "clip norm", got, want)
    main = ranks[0]  # sharded strategies gather the full state on the main process
    assert main["files"], f"{name}: save_model_files / save_optimizer_files wrote nothing"
    assert main["optimizer_state"], f"{name}: the optimizer state holds no tensor"
    # per tensor: how far apart the runs ended, of how far training moved it from make_net()'s
    found = training_drift(main["state"], expected["state"], make_net().state_dict())
    worst = max(found, key=found.__getitem__)
    assert found[worst] <= BOUND, (
        f"{name}: {worst} ended {found[worst]:.2e} of its training movement away from one "
        f"process of plain PyTorch (float32 allows {BOUND:.1e})"
    )


def test_strategy_contract(
    strategy_name: str, contract_results: dict[str, Any], expected: dict[str, Any], tmp_path: Path
) -> None:
    why = missing_library(strategy_name)
    if why:
        pytest.skip(why)
    if world_size(strategy_name) == 1:  # nothing to spawn: here, in this process
        ranks = [run_contract(strategy_name, ProcessInfo(CPU), tmp_path)]
    elif "error" in contract_results:
        raise contract_results["error"]
    else:
        ranks = [r[strategy_name] for r in contract_results["ranks"]]
    check_contract(strategy_name, ranks, expected)


# -- a new engine joins by registering -------------------------------------------------------------
class ToyStrategy(DDPStrategy):
    """A new engine, in a file of its own: here DDP under another name."""

    name = TOY


def register_toy() -> None:
    register_strategy(TOY, lambda request: ToyStrategy(request.info, request.ddp_kwargs))


def test_a_registered_strategy_joins_the_contract(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, expected: dict, tmp_path: Path
) -> None:
    # registered on a copy of the registry, which the monkeypatch puts back afterwards
    from accel_parallel import _registry

    monkeypatch.setattr(_registry, "_REGISTRY", dict(_registry._REGISTRY))
    register_toy()
    assert registered_strategies()[-1] == TOY
    assert isinstance(
        accel_parallel.build_strategy(TOY, StrategyRequest(info=ProcessInfo(CPU, 2))), ToyStrategy
    )
    # collecting this file again now gives the toy its own contract case
    items = pytester.inline_genitems(str(Path(__file__)))[0]
    cases = {i.callspec.params["strategy_name"] for i in items if hasattr(i, "callspec")}
    assert cases == set(registered_strategies())
    # and that case holds for it (run here: the spawned processes register it themselves)
    ranks = run_distributed(_contract_worker, [TOY], str(tmp_path), toy=True, timeout=180)
    assert ranks[0][TOY]["type"] == "ToyStrategy"
    check_contract(TOY, [r[TOY] for r in ranks], expected)
