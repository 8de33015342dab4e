"""The headline example, run the way a user runs it.

`accel launch --num_processes 2 --cpu examples/train_lm.py` for real (torchrun, two gloo
processes), then `--resume` from its mid-epoch checkpoint, which must reproduce the logged
losses of the unbroken run exactly; and `python examples/train_lm.py` on one process.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from accel_testkit.launch import LAUNCHER_VARS, launch_command, worker_env
from accel_tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lm.py"
# Small and fast: 40 steps of 2 x 32 facts (mid-epoch 0); checkpoints at steps 20 and 40.
SMALL = ["--max_steps", "40", "--checkpoint_every", "20", "--log_every", "10"]
TIMEOUT = 300


def _env(config_home: Path) -> dict[str, str]:
    """The current environment without launcher or accel settings, and no user config file
    (XDG_CONFIG_HOME: an empty folder, no default_config.yaml)."""
    return worker_env(drop=["ACCEL_*", *LAUNCHER_VARS], XDG_CONFIG_HOME=str(config_home))


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _launch(project_dir: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """`accel launch --cpu --num_processes 2 examples/train_lm.py` (the `accel` command of this
    interpreter's environment) with the small settings."""
    args = [EXAMPLE, "--project_dir", project_dir, *SMALL, *extra]
    return _start(launch_command(*args, entry_point=True), env)


def _finish(proc: subprocess.Popen[str]) -> str:
    try:
        output, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"{proc.args} did not finish in {TIMEOUT} s:\n{output}")
    assert proc.returncode == 0, f"{proc.args} exited with {proc.returncode}:\n{output}"
    return output


def _log(project_dir: Path) -> list[dict]:
    return read_jsonl(project_dir / "train_lm" / "metrics.jsonl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Both first runs at once (2 processes, and 1 without a launcher), then the resume."""
    base = tmp_path_factory.mktemp("train_lm")
    env = _env(base / "config")
    two, one = base / "two", base / "one"
    plain_args = ["--project_dir", str(one), "--max_steps", "5", "--log_every", "5"]
    procs = [_launch(two, env), _start([sys.executable, str(EXAMPLE), *plain_args], env)]
    try:
        out = {"two_output": _finish(procs[0]), "one_output": _finish(procs[1])}
        out["two_log"], out["one_log"], out["one_dir"] = _log(two), _log(one), one
        out["two_checkpoints"] = sorted(p.name for p in (two / "checkpoints").iterdir())

        # As if the run had stopped right after the checkpoint of step 20 (mid-epoch): drop
        # the newer one, resume, and train steps 21-40 again.
        shutil.rmtree(two / "checkpoints" / "checkpoint_1")
        procs.append(_launch(two, env, "--resume"))
        out["resume_output"] = _finish(procs[-1])
    finally:
        for proc in procs:  # a failed run must not leave the other one running
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    out["resume_log"] = _log(two)
    out["resume_checkpoints"] = sorted(p.name for p in (two / "checkpoints").iterdir())
    return out


def _values(log: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: r["values"][key] for r in log if key in r["values"]}


def test_two_process_launch_trains_and_logs(runs: dict) -> None:
    output, log = runs["two_output"], runs["two_log"]
    assert "1000 eval facts, 2 process(es), 40 steps" in output
    evals = _values(log, "eval/loss")
    assert sorted(evals) == [0, 40]  # the baseline, and the end of the run (mid-epoch 0)
    assert evals[40] < evals[0] - 0.3, f"the eval loss did not fall clearly: {evals}"
    assert f"eval loss {evals[40]:.4f}" in output  # the printed value is the logged one
    assert sorted(_values(log, "train/loss")) == [10, 20, 30, 40]
    lrs = _values(log, "train/lr")
    assert lrs[10] < lrs[20] > lrs[30] > lrs[40]  # warmup to the peak, then cosine decay
    assert [r["step"] for r in log] == sorted(r["step"] for r in log)
    # Accuracy is the share of the 1000 held-out sums answered exactly (evaluate() also
    # asserts it gathered one value per fact): a whole number out of 1000.
    hits = _values(log, "eval/accuracy")[40] * 1000
    assert 0 <= hits <= 1000 and abs(hits - round(hits)) < 1e-3, hits
    assert runs["two_checkpoints"] == ["checkpoint_0", "checkpoint_1"]


def test_resume_continues_from_the_checkpoint_and_matches_the_unbroken_run(runs: dict) -> None:
    assert "Resumed at step 20, epoch 0" in runs["resume_output"]
    assert "before training" not in runs["resume_output"]
    first, resumed = runs["two_log"], runs["resume_log"]
    for key in ("train/loss", "train/lr", "eval/loss", "eval/accuracy"):
        assert _values(resumed, key) == pytest.approx(_values(first, key), rel=1e-6, abs=1e-7), key
    # The log keeps the lines up to the checkpoint and has each later step once.
    assert [r["step"] for r in resumed] == [r["step"] for r in first]
    assert runs["resume_checkpoints"] == ["checkpoint_0", "checkpoint_1"]


def test_one_process_without_a_launcher(runs: dict) -> None:
    output, log = runs["one_output"], runs["one_log"]
    assert "1 process(es), 5 steps" in output
    assert sorted(_values(log, "train/loss")) == [5]
    evals = _values(log, "eval/loss")
    assert sorted(evals) == [0, 5]
    assert evals[5] < evals[0]


def test_saved_model_reproduces_the_logged_eval_loss(runs: dict) -> None:
    example = runpy.run_path(str(EXAMPLE))  # its definitions, without running main()
    model = example["TinyLM"](len(example["VOCAB"]), example["ANSWER"].stop, 64, 2, 4)
    state = load_file(runs["one_dir"] / "model" / "model.safetensors")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert (missing, unexpected) == (["head.weight"], [])  # tied to tok.weight, stored once
    assert model.head.weight is model.tok.weight
    _, eval_set = example["make_datasets"]()
    inputs = torch.stack([eval_set[i][0] for i in range(len(eval_set))])
    targets = torch.stack([eval_set[i][1] for i in range(len(eval_set))])
    with torch.no_grad():
        logits = model.eval()(inputs)
    # the loss per answer digit (the other positions are ignored: -100), one value per fact
    answer = targets != -100
    per_token = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    per_fact = (per_token * answer).sum(dim=1) / answer.sum(dim=1)
    assert per_fact.mean().item() == pytest.approx(
        _values(runs["one_log"], "eval/loss")[5], rel=1e-5
    )
