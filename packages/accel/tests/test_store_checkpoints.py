"""Checkpoints in an object store: save_state / load_state / save_model with s3:// URLs,
against a real S3 server (moto's, on loopback) through accel's real client (s3fs).

A resumed run equals an uninterrupted one; a process killed mid-upload leaves the previous
checkpoint the newest complete one; total_limit deletes only after the new one is complete;
an asynchronous save uploads in the background and its failure is raised, naming the URL; a
bad project_dir fails at the Accelerator's init; a URL never becomes a local folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from accel import Accelerator, ProjectConfiguration
from accel.utils import set_seed
from accel_bigmodel import stores
from accel_parallel.checkpoint import DCP_INDEX
from accel_state.testing import run_distributed
from accel_testkit.models import RegressionData

pytestmark = pytest.mark.needs("s3fs", "moto")


def _run(project: str, stop_after: int | None, resume: bool) -> dict:
    """Two epochs (shuffle, dropout, accumulation 2, a decaying LR) with checkpoints named
    automatically under `project`; stop and save after micro-step `stop_after`, or resume
    from the newest complete checkpoint."""
    set_seed(0)
    acc = Accelerator(
        cpu=True,
        gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(
            project_dir=project, automatic_checkpoint_naming=True, total_limit=2
        ),
    )
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    loader = DataLoader(RegressionData(32), batch_size=4, shuffle=True)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    if resume:
        acc.load_state()
    seen: list[int] = []
    micro = acc.step
    for _epoch in range(2 - int(resume and micro >= len(loader))):
        for batch in loader:
            with acc.accumulate(model):
                loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
                acc.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            seen.extend(batch["index"].tolist())
            micro += 1
            if micro == stop_after:
                acc.save_state()  # checkpoint_0 .. _2 under total_limit=2: the last two stay
                acc.save_state()
                acc.save_state()
                return {"seen": seen}
    weights = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    return {"seen": seen, "weights": weights, "lr": sched.get_last_lr()}


def _parts(project: str, resume: bool) -> dict:
    return {"run": _run(project, None if resume else 3, resume)}


def _full(project: str) -> dict:
    return _run(project, None, False)


def test_two_processes_resume_from_the_store_equal_to_an_uninterrupted_run(s3: str) -> None:
    project = f"{s3}/run"
    first = run_distributed(_parts, project, False, world_size=2, timeout=240)
    root = f"{project}/checkpoints"
    assert stores.list_names(root) == ["checkpoint_1", "checkpoint_2"]  # total_limit=2
    marker = json.loads(stores.read_bytes(f"{root}/checkpoint_2/accel_checkpoint.json"))
    assert marker["num_processes"] == 2 and "random_states_1.pkl" in marker["files"]
    assert ".accel_incomplete" not in stores.list_names(f"{root}/checkpoint_2")
    second = run_distributed(_parts, project, True, world_size=2, timeout=240)
    full = run_distributed(_full, f"{s3}/full", world_size=2, timeout=240)
    for rank in range(2):
        assert first[rank]["run"]["seen"] + second[rank]["run"]["seen"] == full[rank]["seen"]
        for name, value in full[rank]["weights"].items():
            assert torch.equal(second[rank]["run"]["weights"][name], value), name
        assert second[rank]["run"]["lr"] == full[rank]["lr"]
    assert not list(Path.cwd().glob("s3:*"))  # a URL never became a local folder


KILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from accel import Accelerator, ProjectConfiguration
    from accel_bigmodel import stores

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=sys.argv[1], automatic_checkpoint_naming=True, total_limit=1))
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.save_state()  # checkpoint_0, complete
    with torch.no_grad():
        model.weight.add_(1.0)
    upload = stores.upload

    def upload_half_then_die(local, url, files=None):
        names = sorted(p.name for p in local.iterdir())
        upload(local, url, names[: len(names) // 2])
        os.kill(os.getpid(), signal.SIGKILL)  # every process dies mid-upload

    stores.upload = upload_half_then_die
    acc.save_state()  # checkpoint_1: killed half-way
    """
)


def test_a_process_killed_mid_upload_leaves_the_previous_checkpoint(s3: str, tmp_path) -> None:
    project = f"{s3}/run"
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), project], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    half = f"{project}/checkpoints/checkpoint_1"
    names = stores.list_names(half)
    assert ".accel_incomplete" in names and "accel_checkpoint.json" not in names
    assert "model.safetensors" in names or "optimizer.bin" in names  # some files made it
    # total_limit=1 did not delete checkpoint_0: the new one never completed
    assert stores.list_names(f"{project}/checkpoints") == ["checkpoint_0", "checkpoint_1"]
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True))  # fmt: skip
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        model.weight.zero_()
    with pytest.warns(UserWarning, match=r"ignoring incomplete checkpoints.*checkpoint_1"):
        assert acc.load_state() == f"{project}/checkpoints/checkpoint_0"
    torch.manual_seed(0)
    assert torch.equal(model.weight, nn.Linear(3, 2).weight)
    with pytest.raises(
        FileNotFoundError,
        match=r"checkpoint_1 is not a complete checkpoint: a save into it was interrupted",
    ):
        acc.load_state(half)
    assert acc.save_state() == f"{project}/checkpoints/checkpoint_1"  # numbering goes on
    assert "accel_checkpoint.json" in stores.list_names(half)
    assert ".accel_incomplete" not in stores.list_names(half)


def _simple(
    project: str | None = None, **config
) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=project, **config))
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return acc, *acc.prepare(model, opt)


def _step(acc: Accelerator, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    acc.backward(model(torch.randn(4, 3)).pow(2).mean())
    opt.step()
    opt.zero_grad()


def test_async_save_uploads_in_the_background_the_state_of_its_moment(s3: str) -> None:
    acc, model, opt = _simple(f"{s3}/run", automatic_checkpoint_naming=True, async_save=True)
    _step(acc, model, opt)
    moment = {k: v.clone() for k, v in model.state_dict().items()}
    url = acc.save_state()
    _step(acc, model, opt)  # training goes on while the upload runs
    acc.wait_for_checkpoint()
    assert "accel_checkpoint.json" in stores.list_names(url)
    acc.load_state(url)
    for name, value in moment.items():
        assert torch.equal(model.state_dict()[name], value), name
    acc.end_training()


def test_a_failed_async_upload_is_raised_at_the_next_save_naming_the_url(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc, model, opt = _simple(async_save=True)
    url = f"{s3}/gone/step1"
    upload = stores.upload

    def bucket_gone_then_upload(*args, **kwargs):
        stores.remove(s3)  # the bucket disappears under the background upload
        return upload(*args, **kwargs)

    monkeypatch.setattr(stores, "upload", bucket_gone_then_upload)
    assert acc.save_state(url) == url  # returns at once: the upload fails in the background
    acc._checkpointer.pending.join()
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match=rf"asynchronous save_state into {url} failed"):
        acc.save_state(f"{s3}/gone/step2")
    with pytest.raises(
        FileNotFoundError, match=rf"the bucket .{s3[5:]}. of {s3}/gone/step3\S* does not exist"
    ):
        acc.save_state(f"{s3}/gone/step3")  # a synchronous failure names the URL too
    acc.end_training()


def test_explicit_urls_save_model_and_a_file_url_is_a_local_folder(s3: str, tmp_path) -> None:
    acc, model, opt = _simple()
    _step(acc, model, opt)
    url = f"{s3}/explicit/step1/"
    assert acc.save_state(url) == url.rstrip("/")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _step(acc, model, opt)
    acc.save_state(url)  # saved again over the same prefix: the new state wins, complete
    again = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    acc.load_state(url)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in again.items())
    assert not all(torch.equal(again[k], v) for k, v in saved.items())
    acc.save_model(model, f"{s3}/export")
    assert "model.safetensors" in stores.list_names(f"{s3}/export")
    local = tmp_path / "dl"
    stores.download(f"{s3}/export", local)
    from safetensors.torch import load_file

    exported = load_file(local / "model.safetensors")
    assert all(torch.equal(exported[k], v) for k, v in again.items())
    assert acc.save_state(f"file://{tmp_path}/ck") == f"{tmp_path}/ck"
    assert (tmp_path / "ck" / "accel_checkpoint.json").is_file()


def test_a_bad_project_dir_fails_at_init_naming_the_url(s3: str) -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"bucket 'no-such-bucket' of s3://no-such-bucket/run does not exist",
    ):
        Accelerator(cpu=True, project_dir="s3://no-such-bucket/run")
    with pytest.raises(ImportError, match=r"no filesystem for gs:// URLs is installed"):
        Accelerator(cpu=True, project_dir="gs://bucket/run")
    with pytest.raises(FileNotFoundError, match=r"s3://.*/nothing is not a complete checkpoint"):
        _simple()[0].load_state(f"{s3}/nothing")
    with pytest.raises(
        ValueError, match=r"`jsonl` writes local files into logging_dir, which is a URL"
    ):
        Accelerator(cpu=True, project_dir=f"{s3}/run", log_with="jsonl")
    assert not list(Path.cwd().glob("s3:*"))


@pytest.mark.needs("tensorboard")
def test_tensorboard_logs_into_a_store_project_dir(s3: str) -> None:
    """TensorBoard's own file layer writes to store URLs, so a URL logging_dir (the default:
    project_dir) is accepted for it, as accelerate accepts it."""
    acc = Accelerator(cpu=True, project_dir=f"{s3}/run", log_with="tensorboard")
    acc.init_trackers("exp")
    acc.log({"loss": 1.5}, step=0)
    acc.end_training()
    assert any("events.out.tfevents" in f for f in stores.files_under(f"{s3}/run")), (
        stores.files_under(f"{s3}/run")
    )


def _fsdp_save(url: str) -> dict:
    from accel.utils import FullyShardedDataParallelPlugin

    acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, 64)).pow(2).mean())
    opt.step()
    opt.zero_grad()
    acc.save_state(url)
    full = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    return {"uploaded": acc._checkpointer.last_upload_bytes, "weights": full}


def test_fsdp2_ranks_upload_their_own_shards_and_a_single_process_resumes(s3: str) -> None:
    url = f"{s3}/fsdp/step1"
    out = run_distributed(_fsdp_save, url, world_size=2, timeout=240)
    files = stores.files_under(url)
    shards = [f for f in files if f.endswith(".distcp")]
    assert len(shards) >= 4, files  # model and optimizer: one file per rank each
    sizes = {f: stores.size(f"{url}/{f}") for f in files}

    # what each rank sent is its own files (its shards, its RNG and process files)
    def own(name: str, rank: int) -> bool:
        return f"/__{rank}_" in name or name.endswith((f"_{rank}.pkl", f"_{rank}.pt"))

    mine = [sum(size for f, size in sizes.items() if own(f, r)) for r in (0, 1)]
    assert out[1]["uploaded"] == mine[1], (out[1]["uploaded"], mine, sizes)
    # rank 0 adds DCP's metadata files and accel's chunk index beside each
    ends = ("/.metadata", f"/{DCP_INDEX}")
    metadata = sum(size for f, size in sizes.items() if f.endswith(ends))
    assert sum(f.endswith(f"/{DCP_INDEX}") for f in files) == 2  # model and optimizer
    assert out[0]["uploaded"] == mine[0] + metadata
    assert sum(sizes.values()) == mine[0] + mine[1] + metadata + sizes["accel_checkpoint.json"]
    acc = Accelerator(cpu=True)  # one process, another engine: resharded from the store
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import _fsspec_filesystem

    read_from: list[str] = []
    reader = getattr(dcp, "FsspecReader", None) or _fsspec_filesystem.FsspecReader  # torch 2.9

    class Recording(reader):
        def __init__(self, path: str, **kwargs) -> None:
            read_from.append(path)
            super().__init__(path, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dcp, "FsspecReader", Recording, raising=False)
        acc.load_state(url)
    # the DCP data files were read from the store (ranged reads), not fetched first
    assert read_from == [f"{url}/pytorch_model_fsdp_0", f"{url}/optimizer_0"], read_from
    for name, value in out[0]["weights"].items():
        assert torch.equal(model.state_dict()[name], value), name
    assert opt.state_dict()["state"], "the optimizer state came back"


def _zero2(url: str, resume: bool) -> dict[str, torch.Tensor]:
    """ZeRO-2 on 2 processes, 4 steps: saving into the store after step 2 (and going on), or
    resuming there from the store; returns the final full weights."""
    sys.modules["transformers"] = None  # type: ignore[assignment]  # DeepSpeed's optional imports
    sys.modules["mlflow"] = None  # type: ignore[assignment]
    from accel.utils import DeepSpeedPlugin

    acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt, loader = acc.prepare(model, opt, DataLoader(RegressionData(32), batch_size=4))
    if resume:
        acc.load_state(url)
    for step, batch in enumerate(loader, start=2 if resume else 0):
        acc.backward(nn.functional.mse_loss(model(batch["x"]), batch["y"]))
        opt.step()
        opt.zero_grad()
        if step == 1 and not resume:
            acc.save_state(url)
        if step == 3:
            break
    weights = {k: v.detach().float().clone() for k, v in acc.get_state_dict(model).items()}
    acc.wait_for_everyone()
    return weights


@pytest.mark.needs("deepspeed")
def test_deepspeed_zero2_saves_its_own_files_to_the_store_and_resumes_equal(s3: str) -> None:
    url = f"{s3}/zero2/step2"
    full = run_distributed(_zero2, url, False, world_size=2, timeout=300)
    files = stores.files_under(url)
    assert "accel_checkpoint.json" in files and ".accel_incomplete" not in files
    assert any(f.startswith("pytorch_model/") and "optim_states" in f for f in files), files
    resumed = run_distributed(_zero2, url, True, world_size=2, timeout=300)
    for name, value in full[0].items():
        assert torch.equal(resumed[0][name], value), name


def _mesh_and_pipeline(url: str) -> dict:
    """Tensor parallel (tp 2) and a pipeline (pp 2) on 2 processes, each saving into the store
    after its first of 3 steps and going on, then resumed from the store for the last two."""
    from accel import AcceleratorState, ParallelismConfig
    from accel_testkit.models import Stack

    class Net(Stack):
        _tp_plan = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}
        _no_split_modules = None

    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)) for _ in range(3)]
    configs = {
        "tp": lambda: ParallelismConfig(tp_size=2),
        "pp": lambda: ParallelismConfig(
            pp_size=2, pp_plan=["inp", "blocks", "out"], pp_microbatches=2,
            pp_loss_fn=nn.functional.mse_loss,
        ),
    }  # fmt: skip

    def run(kind: str, resume: bool) -> dict[str, torch.Tensor]:
        AcceleratorState._reset_state()  # the process group stays; the next one adopts it
        acc = Accelerator(cpu=True, parallelism_config=configs[kind]())
        torch.manual_seed(0)
        model = Net(width=16, depth=2, hidden=32)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        model, opt = acc.prepare(model, opt)
        if resume:
            acc.load_state(f"{url}/{kind}")
        for step in range(1 if resume else 0, 3):
            x, y = data[step]
            pipeline = kind == "pp"  # its loss is computed by the last stage
            acc.backward(
                model(x, labels=y).loss if pipeline else nn.functional.mse_loss(model(x), y)
            )
            opt.step()
            opt.zero_grad()
            if step == 0 and not resume:
                acc.save_state(f"{url}/{kind}")
        return {k: v.detach().clone() for k, v in acc.get_state_dict(model).items()}

    return {(kind, resume): run(kind, resume) for kind in configs for resume in (False, True)}


def test_mesh_and_pipeline_engines_save_to_the_store_and_resume_equal(s3: str) -> None:
    out = run_distributed(_mesh_and_pipeline, f"{s3}/engines", world_size=2, timeout=300)
    for kind in ("tp", "pp"):
        files = stores.files_under(f"{s3}/engines/{kind}")
        assert "accel_checkpoint.json" in files and any(f.endswith(".distcp") for f in files)
        went_on, resumed = out[0][(kind, False)], out[0][(kind, True)]
        assert went_on.keys() == resumed.keys() and went_on
        for name, value in went_on.items():
            assert torch.equal(resumed[name], value), (kind, name)


def test_uploads_are_staged_in_memory_when_the_last_save_fits_there_twice(
    s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accel._checkpoint import _destination

    monkeypatch.delenv("TMPDIR", raising=False)
    staged: list[str] = []
    upload = stores.upload
    monkeypatch.setattr(stores, "upload", lambda local, url, files=None: (
        staged.append(str(local)), upload(local, url, files))[1])  # fmt: skip
    acc, model, opt = _simple()
    acc.save_state(f"{s3}/first")  # nothing known yet of its size: the temp directory
    acc.save_state(f"{s3}/second")
    assert not staged[0].startswith("/dev/shm/") and staged[1].startswith("/dev/shm/"), staged
    assert acc._checkpointer.last_upload_bytes == sum(
        stores.size(f"{s3}/second/{f}") for f in stores.files_under(f"{s3}/second")
        if f != "accel_checkpoint.json"
    )  # fmt: skip
    assert _destination.staging_root(2**60, 1) is None  # never more than memory holds
    monkeypatch.setenv("TMPDIR", "/tmp")
    assert _destination.staging_root(1, 1) is None  # the user's temp directory wins


def test_accelerator_save_writes_one_object_into_the_store(s3: str, tmp_path) -> None:
    from safetensors.torch import load as load_safetensors

    acc = Accelerator(cpu=True)
    weights = {"w": torch.randn(3, 2), "b": torch.arange(4)}
    acc.save(weights, f"{s3}/one/weights.pt")
    acc.save(weights, f"{s3}/one/weights.safetensors", safe_serialization=True)
    acc.save(weights, f"file://{tmp_path}/local.pt")
    import io

    loaded = torch.load(io.BytesIO(stores.read_bytes(f"{s3}/one/weights.pt")), weights_only=True)
    safe = load_safetensors(stores.read_bytes(f"{s3}/one/weights.safetensors"))
    local = torch.load(tmp_path / "local.pt", weights_only=True)
    for got in (loaded, safe, local):
        assert all(torch.equal(got[k], v) for k, v in weights.items())
    assert not list(Path.cwd().glob("s3:*"))


def _save_into(url: str) -> str:
    acc, model, opt = _simple()
    try:
        acc.save_state(url)
    except Exception as err:  # every process learns of the failure: none waits at a barrier
        return f"{type(err).__name__}: {err}"
    return "saved"


def test_a_store_failure_on_the_owning_process_fails_every_process_without_a_hang(
    s3: str,
) -> None:
    out = run_distributed(_save_into, "s3://no-such-bucket-anywhere/run", world_size=2, timeout=120)
    assert out[0].startswith("FileNotFoundError: the bucket 'no-such-bucket-anywhere'"), out
    assert out[1].startswith(
        "RuntimeError: save_state into s3://no-such-bucket-anywhere/run failed on another process"
    ), out
