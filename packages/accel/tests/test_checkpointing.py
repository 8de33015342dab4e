"""save_state / load_state / save_model, for real, on CPU: exact resume, atomicity, limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed
from accel_state.testing import run_distributed


class IdData(Dataset):
    def __init__(self, length: int = 40) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(length, 6, generator=g)
        self.y = torch.randn(length, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "id": torch.tensor(i)}


class Progress:
    def __init__(self) -> None:
        self.epoch = 0
        self.micro = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "micro": self.micro}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.micro = state["epoch"], state["micro"]


EPOCHS = 2


def _run(project: str, stop_after: int | None, resume: bool) -> dict:
    """Train 2 epochs (shuffle, 2 workers, dropout, accumulation 2, a decaying LR); stop and
    save after micro-step `stop_after`, or resume from the newest checkpoint."""
    set_seed(0)
    acc = Accelerator(
        cpu=True,
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True),
    )
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    loader = DataLoader(IdData(), batch_size=4, shuffle=True, num_workers=2)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    progress = Progress()
    acc.register_for_checkpointing(progress)
    if resume:
        acc.load_state()
    seen: list[int] = []
    while progress.epoch < EPOCHS:
        for batch in loader:
            with acc.accumulate(model):
                loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            seen.extend(batch["id"].tolist())
            progress.micro += 1
            if progress.micro == stop_after:
                acc.save_state()
                return {"seen": seen}
        progress.epoch += 1
    weights = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    return {"seen": seen, "weights": weights, "lr": sched.get_last_lr()}


def _first_parts(root: str) -> dict:
    return {
        "full": _run(f"{root}/full", None, False),
        # 10 batches per rank over 2 epochs: stop mid-accumulation in epoch 0, and in epoch 1
        "a": _run(f"{root}/a", 3, False),
        "b": _run(f"{root}/b", 7, False),
    }


def _resumes(root: str) -> dict:
    return {"a": _run(f"{root}/a", None, True), "b": _run(f"{root}/b", None, True)}


def test_resume_equals_uninterrupted_run_bit_for_bit(tmp_path: Path) -> None:
    first = run_distributed(_first_parts, str(tmp_path), world_size=2, timeout=240)
    second = run_distributed(_resumes, str(tmp_path), world_size=2, timeout=240)
    for rank in range(2):
        full = first[rank]["full"]
        assert len(full["seen"]) == 40  # 2 epochs x 20 samples per rank
        for variant in ("a", "b"):
            resumed = second[rank][variant]
            assert first[rank][variant]["seen"] + resumed["seen"] == full["seen"], variant
            for name, value in full["weights"].items():
                assert torch.equal(resumed["weights"][name], value), (variant, name)
            assert resumed["lr"] == full["lr"]
    # both ranks together saw every sample once per epoch
    assert sorted(first[0]["full"]["seen"][:20] + first[1]["full"]["seen"][:20]) == list(range(40))


def _simple(tmp: Path, **config) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp), **config))
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    return acc, model, opt


def _step(acc: Accelerator, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    acc.backward(model(torch.randn(4, 3)).pow(2).mean())
    opt.step()
    opt.zero_grad()


def test_total_limit_keeps_the_newest_complete_checkpoints(tmp_path: Path) -> None:
    acc, model, opt = _simple(tmp_path, automatic_checkpoint_naming=True, total_limit=2)
    for _ in range(5):
        _step(acc, model, opt)
        acc.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_3", "checkpoint_4"]
    assert os.listdir(tmp_path) == ["checkpoints"]  # nothing else in the project folder
    assert (
        json.loads((tmp_path / "checkpoints/checkpoint_4/accel_checkpoint.json").read_text())[
            "models"
        ]
        == 1
    )


def test_resume_continues_numbering_and_restores_weights(tmp_path: Path) -> None:
    acc, model, opt = _simple(tmp_path, automatic_checkpoint_naming=True)
    for _ in range(3):
        _step(acc, model, opt)
        acc.save_state()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _step(acc, model, opt)  # moves past the checkpoint
    acc2, model2, opt2 = _simple(tmp_path, automatic_checkpoint_naming=True)
    assert acc2.load_state().endswith("checkpoint_2")
    for k, v in model2.state_dict().items():
        assert torch.equal(v, saved[k])
    assert acc2.save_state().endswith("checkpoint_3")


def test_mismatch_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    acc, model, opt = _simple(tmp_path)
    acc.save_state(tmp_path / "ck")
    acc2, *_ = _simple(tmp_path)
    acc2.prepare(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="models: saved 1, now 2"):
        acc2.load_state(tmp_path / "ck")
    (tmp_path / "ck/optimizer.bin").unlink()
    acc3, *_ = _simple(tmp_path)
    with pytest.raises(FileNotFoundError, match="optimizer.bin"):
        acc3.load_state(tmp_path / "ck")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        acc3.load_state(tmp_path / "nowhere")


def test_skip_first_batches_after_load_state_does_not_skip_twice(tmp_path: Path) -> None:
    def run(resume: bool):
        set_seed(0)
        acc = Accelerator(cpu=True)
        loader = acc.prepare(DataLoader(IdData(16), batch_size=2, shuffle=True))
        if resume:
            acc.load_state(tmp_path / "ck")
            with pytest.warns(UserWarning):
                loader = acc.skip_first_batches(loader, 3)
            return [b["id"].tolist() for b in loader]
        batches = []
        for i, b in enumerate(loader):
            batches.append(b["id"].tolist())
            if i == 2:
                acc.save_state(tmp_path / "ck")
        return batches

    full = run(False)
    assert run(True) == full[3:]


def test_load_state_into_a_loader_over_the_unseen_samples_starts_it_at_its_beginning(
    tmp_path: Path,
) -> None:
    # accelerate's manual recipe: after load_state, a loader over the samples not yet seen
    # (accelerate restores no position for plain loaders). The saved position belongs to
    # another loader: a warning names both, and nothing is skipped.
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(IdData(16), batch_size=2))
    for i, _ in enumerate(loader):
        if i == 5:
            acc.save_state(tmp_path / "ck")
            break
    acc2 = Accelerator(cpu=True)
    rest = acc2.prepare(
        DataLoader(torch.utils.data.Subset(IdData(16), range(12, 16)), batch_size=2)
    )
    with pytest.warns(UserWarning, match=r"batch 6 of epoch 0.*dataset_length 16 then, 4 now"):
        acc2.load_state(tmp_path / "ck")
    assert [b["id"].tolist() for b in rest] == [[12, 13], [14, 15]]
    # skip_first_batches after load_state keeps working on such a loader.
    with pytest.warns(UserWarning, match="another loader"):
        acc2.load_state(tmp_path / "ck")
    assert [b["id"].tolist() for b in acc2.skip_first_batches(rest, 1)] == [[14, 15]]


def test_save_hooks_see_models_and_can_be_removed(tmp_path: Path) -> None:
    acc, model, opt = _simple(tmp_path)
    calls = []
    handle = acc.register_save_state_pre_hook(
        lambda models, weights, d: calls.append((len(models), len(weights), d))
    )
    loads = []
    acc.register_load_state_pre_hook(lambda models, d: loads.append(len(models)))
    out = acc.save_state(tmp_path / "ck")
    acc.load_state(tmp_path / "ck")
    assert calls == [(1, 1, str(tmp_path / ".ck.incomplete"))] and loads == [1]
    assert Path(out, "model.safetensors").exists()
    handle.remove()
    acc.save_state(tmp_path / "ck")
    assert len(calls) == 1


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from accel import Accelerator, ProjectConfiguration

    class Bomb:
        def state_dict(self):
            os.kill(os.getpid(), signal.SIGKILL)  # dies in the middle of save_state
        def load_state_dict(self, state):
            pass

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=sys.argv[1], automatic_checkpoint_naming=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.save_state()  # checkpoint_0, complete
    with torch.no_grad():
        model.weight.add_(1.0)
    acc.register_for_checkpointing(Bomb())
    acc.save_state()  # checkpoint_1: killed half-way
    """
)


def test_a_process_killed_mid_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    root = tmp_path / "checkpoints"
    staged = tmp_path / ".accel_incomplete_checkpoints" / "checkpoint_1"
    # half written (writer threads were still at their files), and outside checkpoints/
    assert staged.is_dir()
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_0"]
    acc, model, opt = _simple(tmp_path, automatic_checkpoint_naming=True)
    with torch.no_grad():
        model.weight.zero_()
    with pytest.warns(UserWarning, match="ignoring incomplete checkpoints"):
        assert acc.load_state().endswith("checkpoint_0")
    torch.manual_seed(0)
    assert torch.equal(model.weight, nn.Linear(3, 2).weight)
    assert acc.save_state().endswith("checkpoint_1")  # numbering goes on; the debris is replaced
    assert not staged.exists()


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


def test_save_model_shards_reload_through_load_checkpoint_and_dispatch(tmp_path: Path) -> None:
    from accel import init_empty_weights, load_checkpoint_and_dispatch

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = acc.prepare(Tied())
    acc.save_model(model, tmp_path / "export", max_shard_size="2KB")
    index = json.loads((tmp_path / "export/model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((tmp_path / "export" / f).exists() for f in files)
    assert "head.weight" not in index["weight_map"]  # the tied weight is stored once
    with init_empty_weights():
        empty = Tied()
    loaded = load_checkpoint_and_dispatch(empty, str(tmp_path / "export"), device_map={"": "cpu"})
    ids = torch.randint(0, 50, (3, 5))
    assert torch.equal(loaded(ids), model(ids))
    assert loaded.head.weight is loaded.embed.weight
    acc.save_model(model, tmp_path / "export", safe_serialization=True)  # one file now
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["model.safetensors"]


def test_async_save_writes_the_state_of_its_moment_and_completes_in_the_background(
    tmp_path: Path,
) -> None:
    from accel._io import read_weights

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True, async_save=True))  # fmt: skip
    torch.manual_seed(0)
    model = nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    x = torch.randn(8, 256)
    acc.backward(model(x).pow(2).mean())
    opt.step()
    opt.zero_grad()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    first = Path(acc.save_state())
    for _ in range(3):  # training goes on while the files are written
        acc.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
    acc.wait_for_checkpoint()
    assert (first / "accel_checkpoint.json").exists() and first.name == "checkpoint_0"
    saved = read_weights(first / "model")
    assert all(torch.equal(saved[k], v) for k, v in expected.items())  # not the later weights
    now = {k: v.clone() for k, v in model.state_dict().items()}
    second = Path(acc.save_state())  # the next save and load wait for the one in flight
    with torch.no_grad():
        model.weight.zero_()
    assert acc.load_state() == str(second) and second.name == "checkpoint_1"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in now.items())


ASYNC_KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import torch
    from accel import Accelerator, ProjectConfiguration

    returned = threading.Event()  # set by the loop once save_state has returned

    class Boom:
        def __reduce__(self):  # pickled by the background writer: the process dies there,
            returned.wait(30)  # after the loop went on (a blocking save never sets it)
            os.kill(os.getpid(), signal.SIGKILL)

    class Holder:
        def state_dict(self):
            return {"x": Boom()}
        def load_state_dict(self, state):
            pass

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=sys.argv[1], automatic_checkpoint_naming=True, async_save=True))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.save_state()  # checkpoint_0
    acc.wait_for_checkpoint()
    with torch.no_grad():
        model.weight.add_(1.0)
    acc.register_for_checkpointing(Holder())
    acc.save_state()  # checkpoint_1: returns at once, then the writer kills the process
    print("save_state returned", flush=True)
    returned.set()
    time.sleep(60)
    """
)


def test_a_process_killed_during_an_async_save_leaves_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    script = tmp_path / "kill_async.py"
    script.write_text(ASYNC_KILL_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr
    assert "save_state returned" in proc.stdout  # the save did not block the loop
    staged = tmp_path / ".accel_incomplete_checkpoints" / "checkpoint_1"
    assert staged.exists() and not (staged / "accel_checkpoint.json").exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_0"]
    acc, model, opt = _simple(tmp_path, automatic_checkpoint_naming=True)
    with pytest.warns(UserWarning, match="ignoring incomplete checkpoints"):
        assert acc.load_state().endswith("checkpoint_0")
    torch.manual_seed(0)
    assert torch.equal(model.weight, nn.Linear(3, 2).weight)


def test_save_model_of_an_offloaded_model_and_the_plain_torch_format(tmp_path: Path) -> None:
    """Offloaded weights (meta in the model) are read from their offload; a .bin is a plain
    state dict, as accelerate writes and reads it."""
    from accel import load_checkpoint_and_dispatch

    acc = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    x = torch.randn(2, 3)
    expected = model(x)
    acc.save_model(model, tmp_path / "a", safe_serialization=False)
    plain = torch.load(tmp_path / "a" / "pytorch_model.bin", weights_only=True)
    assert sorted(plain) == sorted(model.state_dict())
    load_checkpoint_and_dispatch(
        model, tmp_path / "a", device_map={"0": "cpu", "1": "disk"}, offload_folder=tmp_path / "o"
    )
    acc.save_model(model, tmp_path / "b")
    fresh = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    load_checkpoint_and_dispatch(fresh, tmp_path / "b")
    torch.testing.assert_close(fresh(x), expected)


def test_registering_objects_without_state_names_each_by_index() -> None:
    acc = Accelerator(cpu=True)
    net = nn.Linear(2, 2)
    with pytest.raises(ValueError) as err:
        acc.register_for_checkpointing(torch.zeros(1), torch.ones(1), net, torch.optim.SGD(
            net.parameters(), lr=0.1))  # fmt: skip
    message = str(err.value)
    assert "Item at index 0 (Tensor)" in message and "Item at index 1 (Tensor)" in message
    assert "index 2" not in message and "index 3" not in message


def _own_folders(base: str, asynchronous: bool) -> list[list[int]]:
    import tempfile

    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(IdData(16), batch_size=2, shuffle=True))
    with tempfile.TemporaryDirectory(dir=base) as mine:  # a folder of this process's own
        seen, rest = [], []
        for i, batch in enumerate(loader):
            seen.append(batch["id"].tolist())
            if i == 1:
                acc.save_state(mine, async_save=asynchronous)
                acc.wait_for_checkpoint()
        acc.load_state(mine)
        rest = [b["id"].tolist() for b in loader]
    return [seen[2:], rest]


def test_each_process_saving_into_its_own_folder_resumes(tmp_path: Path) -> None:
    # accelerate's test_distributed_data_loop gives each rank a TemporaryDirectory of its own:
    # each process completes its own folder, and resumes from it.
    for asynchronous in (False, True):
        results = run_distributed(_own_folders, str(tmp_path), asynchronous, world_size=2)
        for unseen, resumed in results:
            assert resumed == unseen and len(resumed) == 2
