"""The client matrix: the libraries built on accelerate, with their defaults, on accel.

Every cell runs the real library (transformers, PEFT, diffusers, TRL, lm-eval) on tiny models
built from configs, with `import accelerate` answered by accel. All cells run in one
interpreter (`_client_matrix_flows.py`), which writes a JSON of what each saw; the cheap
big-model cells run a second time on the real accelerate, as the reference they must equal.
The 2-process cells run under one `accel launch --as_accelerate` of 2 gloo processes, and
lm-eval's own command line under `accel launch --as_accelerate -m lm_eval` on 2 processes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from accel._as_accelerate import ENV_AS_ACCELERATE
from accel_testkit.launch import launch_command, worker_env

HERE = Path(__file__).parent
FLOWS = HERE / "_client_matrix_flows.py"
ACCEL_DIR = str(Path(importlib.util.find_spec("accel").origin).parent)
HAS = {
    name: importlib.util.find_spec(module) is not None
    for name, module in (
        ("transformers", "transformers"),
        ("peft", "peft"),
        ("diffusers", "diffusers"),
        ("trl", "trl"),
        ("lm_eval", "lm_eval"),
        ("accelerate", "accelerate"),  # the real one: the reference (peft and trl need it)
    )
}
GROUPS = {"bigmodel": "transformers", "trainer": "transformers", "peft": "peft",
          "diffusers": "diffusers", "trl": "trl", "lm_eval": "lm_eval"}  # fmt: skip
pytestmark = pytest.mark.skipif(not HAS["transformers"], reason="transformers not installed")


def _env() -> dict[str, str]:
    return worker_env(drop=[ENV_AS_ACCELERATE], PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1",
                      HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")  # fmt: skip


def _start(cmd: list[str], out: Path) -> tuple[subprocess.Popen, Path]:
    log = out / "log.txt"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=_env())
    return proc, log


def _wait(started: tuple[subprocess.Popen, Path], timeout: int = 600) -> None:
    proc, log = started
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-8000:]


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Any, Path]]]:
    """The three runs start together (one and two single-threaded processes: the machine's
    cores are used at once); each fixture below waits for its own."""
    runs: dict[str, tuple[Any, Path]] = {}
    out = tmp_path_factory.mktemp("matrix")
    groups = [g for g, lib in GROUPS.items() if HAS[lib]]
    runs["matrix"] = (_start([sys.executable, str(FLOWS), str(out), "accel", *groups], out), out)
    if HAS["accelerate"]:
        out = tmp_path_factory.mktemp("reference")
        cmd = [sys.executable, str(FLOWS), str(out), "accelerate", "bigmodel"]
        runs["reference"] = (_start(cmd, out), out)
    if HAS["trl"]:
        out = tmp_path_factory.mktemp("launched")
        trainer = "trainer:split_batches,dispatch_batches,dispatch_batches_false," + (
            "include_num_input_tokens_seen"
        )
        groups = ["trl:sft,dpo,utilities", trainer]
        cmd = launch_command("--as_accelerate", FLOWS, out, "accel", *groups)
        runs["launched"] = (_start(cmd, out), out)
    yield runs
    for proc, _ in (run for run, _ in runs.values()):
        if proc.poll() is None:
            proc.kill()


def _read(out: Path, group: str, impl: str, rank: int = 0) -> dict[str, Any]:
    result = json.loads((out / f"{group}_{impl}_rank{rank}.json").read_text())
    where = result.pop("_meta")["accelerate"]
    if where is not None:  # the group imported accelerate: it must be the one asked for
        assert where.startswith(ACCEL_DIR) == (impl == "accel"), where
    return result


@pytest.fixture(scope="module")
def matrix(started: dict, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    run, out = started["matrix"]
    _wait(run)
    if HAS["lm_eval"] and (out / "lm_eval_files_accel").is_dir():
        # lm-eval's command line on 2 processes, on the model and task the matrix scored
        files, cli_out = out / "lm_eval_files_accel", tmp_path_factory.mktemp("lm_eval_cli")
        cmd = launch_command("--as_accelerate", "-m", "lm_eval", "--model", "hf", "--model_args",
                             f"pretrained={files / 'lm'},dtype=float32", "--tasks", "accel_count",
                             "--include_path", files / "tasks", "--device", "cpu", "--batch_size",
                             "4", "--output_path", cli_out / "results", "--log_samples")  # fmt: skip
        started["lm_eval_cli"] = (_start(cmd, cli_out), cli_out)
    return {g: _read(out, g, "accel") for g, lib in GROUPS.items() if HAS[lib]}


@pytest.fixture(scope="module")
def reference(started: dict) -> dict[str, Any]:
    if "reference" not in started:
        pytest.skip("the real accelerate (the reference) is not installed")
    run, out = started["reference"]
    _wait(run)
    return _read(out, "bigmodel", "accelerate")


def _cell(results: dict[str, Any], name: str) -> dict[str, Any]:
    cell = results[name]
    assert cell["ok"], f"{name}: {cell['error']}\n{cell['traceback']}"
    return cell


def _same_outputs(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["generated"] == b["generated"]
    torch.testing.assert_close(torch.tensor(a["logits"]), torch.tensor(b["logits"]))


# transformers: from_pretrained with device_map, max_memory, dtype, offload ---------------------

STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
BIG_CELLS = [
    *STRATEGIES,
    *(f"{s}_max_memory_{kind}" for s in STRATEGIES for kind in ("int", "float", "str")),
    "hand_map", "hand_map_all_cpu", "auto_float16_disk", "auto_bfloat16_disk",
    "auto_torch_dtype_float16", "auto_offload_state_dict", "auto_low_cpu_mem_usage",
    "low_cpu_mem_usage_no_map", "tied_auto_disk", "tied_sequential",
]  # fmt: skip


def _plain_of(cell: str) -> str:
    if cell.startswith("tied"):
        return "plain_tied"
    return next((f"plain_{d}" for d in ("bfloat16", "float16") if d in cell), "plain")


@pytest.mark.parametrize("cell", BIG_CELLS)
def test_from_pretrained_cell_answers_as_the_plain_load(matrix: dict, cell: str) -> None:
    results = matrix["bigmodel"]
    got, plain = _cell(results, cell), _cell(results, _plain_of(cell))
    _same_outputs(got, plain)  # logits and 8 greedy tokens of generate
    assert got["dtypes"] == plain["dtypes"]
    if "max_memory" in cell or "disk" in cell or cell == "auto_offload_state_dict":
        assert {"cpu", "disk"} <= set(got["device_map"].values()), got["device_map"]
    if cell == "hand_map":
        assert got["device_map"]["model.layers.1"] == got["device_map"]["lm_head"] == "disk"
    if cell == "tied_auto_disk":  # tied weights are placed together
        assert got["device_map"]["lm_head"] == got["device_map"]["model.embed_tokens"]


@pytest.mark.parametrize("cell", ["plain", "plain_tied", "plain_float16", *BIG_CELLS])
def test_from_pretrained_cell_equals_accelerate(matrix: dict, reference: dict, cell: str) -> None:
    """The same call on the real accelerate: the same hf_device_map, dtypes and outputs."""
    got, expected = _cell(matrix["bigmodel"], cell), reference[cell]
    assert expected["ok"], expected["error"]
    assert got["device_map"] == expected["device_map"]
    assert got["dtypes"] == expected["dtypes"]
    _same_outputs(got, expected)


# PEFT: a LoRA model on a device_map with disk offload, merged ---------------------------------


@pytest.mark.skipif(not HAS["peft"], reason="peft not installed")
@pytest.mark.parametrize("cell", ["lora_auto", "lora_auto_disk"])
def test_peft_lora_on_a_device_map_then_merge_and_unload(matrix: dict, cell: str) -> None:
    results = matrix["peft"]
    got, plain = _cell(results, cell), _cell(results, "lora_plain")
    _same_outputs(got["lora"], plain["lora"])
    _same_outputs(got["merged"], plain["merged"])
    _same_outputs(got["merged"], got["lora"])  # merging changes nothing but the structure
    assert not got["merged_has_lora"]
    if cell == "lora_auto_disk":
        assert "disk" in got["device_map"].values()
    # (accelerate 1.15 itself fails lora_auto_disk: PEFT's dispatch_model moves meta tensors)


# diffusers --------------------------------------------------------------------------------------

needs_diffusers = pytest.mark.skipif(not HAS["diffusers"], reason="diffusers not installed")


@needs_diffusers
@pytest.mark.parametrize("cell", ["load_low_cpu_mem_usage", "load_no_low_cpu_mem_usage"])
def test_diffusers_pipeline_loads_from_its_folder(matrix: dict, cell: str) -> None:
    got = _cell(matrix["diffusers"], cell)
    assert got["same_images"] and got["meta_params"] == []


@needs_diffusers
@pytest.mark.parametrize("kind", ["model", "sequential"])
def test_diffusers_cpu_offload_gives_the_plain_images(matrix: dict, kind: str) -> None:
    """enable_model_cpu_offload (cpu_offload_with_hook) and enable_sequential_cpu_offload
    (cpu_offload), with the CPU named as the execution device: diffusers only allows that
    explicitly; the offload hooks run all the same."""
    got = _cell(matrix["diffusers"], f"{kind}_cpu_offload_cpu")
    assert got["same_images"] and got["same_again"]
    assert got["hooked"] == ["text_encoder", "unet", "vae"]
    # sequential offload keeps the weights off the module (meta) between calls
    assert (got["unet_meta_params"] > 0) == (kind == "sequential")


@needs_diffusers
@pytest.mark.parametrize("kind", ["model", "sequential"])
def test_diffusers_cpu_offload_with_its_default_device(matrix: dict, kind: str) -> None:
    cell = matrix["diffusers"][f"{kind}_cpu_offload_default"]
    if torch.cuda.is_available():
        assert cell["ok"] and cell["same_images"], cell.get("error")
    else:  # diffusers' own refusal: its default execution device is an accelerator
        assert not cell["ok"] and "requires accelerator, but not found" in cell["error"]


@needs_diffusers
def test_diffusers_training_loop_with_ema_and_state_hooks_resumes_exactly(matrix: dict) -> None:
    got = _cell(matrix["diffusers"], "train_resume")
    assert got["steps"] == 4
    assert {"unet", "unet_ema", "optimizer.bin"} <= set(got["checkpoint_files"])
    assert "model.safetensors" not in got["checkpoint_files"]  # the hook saved the model
    assert got["same_weights"] and got["same_ema"] and got["ema_differs_from_weights"]


# TRL --------------------------------------------------------------------------------------------

needs_trl = pytest.mark.skipif(not HAS["trl"], reason="trl not installed")


@needs_trl
@pytest.mark.parametrize("cell", ["sft", "dpo"])
def test_trl_trainer_runs_on_accel(matrix: dict, cell: str) -> None:
    got = _cell(matrix["trl"], cell)
    assert got["accelerator"] == "accel._accelerator"
    assert len(got["losses"]) == 4 and all(math.isfinite(x) for x in got["losses"])
    if cell == "dpo":  # the policy starts as its reference: loss ln 2, no margin
        assert got["losses"][0] == pytest.approx(math.log(2), abs=1e-5)
        assert got["margins"][0] == pytest.approx(0.0, abs=1e-6)
        assert any(m != 0 for m in got["margins"][1:])


@needs_trl
def test_trl_modules_that_use_accelerate_import(matrix: dict) -> None:
    got = _cell(matrix["trl"], "imports")
    assert len(got["imported"]) > 20
    assert not {m: e for m, e in got["failed"].items() if "accelerate" in e}, got["failed"]


@needs_trl
def test_trl_accelerate_utilities(matrix: dict) -> None:
    got = _cell(matrix["trl"], "utilities")
    assert got["gathered"] == [0] and got["gathered_tensor"] == [0]
    assert got["broadcast"] == {"rank": 0} and got["seeded"]
    assert got["peft"] and not got["not_peft"]
    assert got["deepspeed_available"] == (importlib.util.find_spec("deepspeed") is not None)


# lm-eval ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAS["lm_eval"], reason="lm-eval not installed")
def test_lm_eval_hflm_scores_a_local_task(matrix: dict) -> None:
    got = _cell(matrix["lm_eval"], "hflm")
    assert got["world_size"] == 1 and len(got["loglikelihoods"]) == 12
    assert 0 <= got["scores"]["acc,none"] <= 1
    # acc is the share of documents whose target choice has the higher log-likelihood
    targets = [i % 2 ^ 1 for i in range(12)]
    right = [max((0, 1), key=lambda c: got["loglikelihoods"][str(i)][c]) == t
             for i, t in enumerate(targets)]  # fmt: skip
    assert got["scores"]["acc,none"] == pytest.approx(sum(right) / 12)


# 2 processes: one `accel launch --as_accelerate` ------------------------------------------------


@pytest.fixture(scope="module")
def launched(started: dict) -> Path:
    if "launched" not in started:
        pytest.skip("trl is needed for the 2-process cells")
    run, out = started["launched"]
    _wait(run)
    return out


def test_accel_launch_m_lm_eval_on_two_processes_scores_as_one_process(
    matrix: dict, started: dict
) -> None:
    """`accel launch --num_processes 2 --as_accelerate -m lm_eval ...`: lm-eval's own command
    line runs on both processes and reports what one process's HFLM scored. (lm-eval splits
    the documents over processes only with more than one GPU: here each process scores all.)"""
    if "lm_eval_cli" not in started:
        pytest.skip("lm-eval not installed")
    run, out = started["lm_eval_cli"]
    _wait(run)
    one = _cell(matrix["lm_eval"], "hflm")
    results = sorted((out / "results").rglob("results_*.json"))
    samples = sorted((out / "results").rglob("samples_accel_count_*.jsonl"))
    assert results and samples, (out / "log.txt").read_text()[-4000:]
    for path in results:
        got = json.loads(path.read_text())["results"]["accel_count"]
        assert {k: v for k, v in got.items() if "," in k} == pytest.approx(one["scores"])
    for path in samples:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert sorted(str(r["doc_id"]) for r in rows) == sorted(one["loglikelihoods"])
        for row in rows:
            values = [float(r[0][0]) for r in row["resps"]]
            assert values == pytest.approx(one["loglikelihoods"][str(row["doc_id"])], abs=1e-5)


@pytest.mark.parametrize("cell", ["sft", "dpo"])
def test_two_processes_trl_trainer(launched: Path, cell: str) -> None:
    ranks = [_cell(_read(launched, "trl", "accel", r), cell) for r in (0, 1)]
    assert all(r["accelerator"] == "accel._accelerator" for r in ranks)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # logged losses are averaged over ranks
    assert len(ranks[0]["losses"]) == 4 and all(math.isfinite(x) for x in ranks[0]["losses"])


def test_two_processes_trl_utilities(launched: Path) -> None:
    ranks = [_cell(_read(launched, "trl", "accel", r), "utilities") for r in (0, 1)]
    for got in ranks:
        assert got["num_processes"] == 2
        assert got["gathered"] == [0, 1] and got["gathered_tensor"] == [0, 1]
        assert got["broadcast"] == {"rank": 0}  # rank 0's object on every rank


# transformers: Trainer options ------------------------------------------------------------------

SAME_AS_BASELINE = [
    "split_batches", "dispatch_batches", "dispatch_batches_false", "even_batches_false",
    "use_seedable_sampler_false", "non_blocking", "gradient_checkpointing",
    "auto_find_batch_size", "include_num_input_tokens_seen", "dataloader_num_workers",
    "save_only_model", "load_best_model_at_end", "eval_accumulation_steps",
]  # fmt: skip


@pytest.mark.parametrize("cell", SAME_AS_BASELINE)
def test_trainer_option_trains_as_the_baseline(matrix: dict, cell: str) -> None:
    """On 1 process these options change where and how batches travel, not what is learnt."""
    results = matrix["trainer"]
    got, base = _cell(results, cell), _cell(results, "baseline")
    assert got["losses"] == base["losses"] and got["batch_size"] == 4
    if cell == "include_num_input_tokens_seen":
        assert got["tokens_seen"] == 4 * 4 * 16
    if cell == "save_only_model":
        assert got["checkpoints"] == ["checkpoint-2", "checkpoint-4"]
        assert "model.safetensors" in got["checkpoint_files"]
        assert not {"optimizer.pt", "scheduler.pt", "rng_state.pth"} & set(got["checkpoint_files"])
    if cell == "load_best_model_at_end":  # the best checkpoint is kept beside the limit of 1
        assert got["best"].endswith(got["checkpoints"][0]) and len(got["checkpoints"]) == 1
    if cell == "eval_accumulation_steps":
        assert got["eval_loss"] == pytest.approx(base["eval_loss"], rel=1e-6)


@pytest.mark.parametrize("cell", ["gradient_accumulation", "gradient_accumulation_kwargs"])
def test_trainer_gradient_accumulation_options(matrix: dict, cell: str) -> None:
    """2 micro-batches of 2 per step (sync_each_batch too) learn what batches of 4 learn."""
    results = matrix["trainer"]
    got, base = _cell(results, cell), _cell(results, "baseline")
    assert got["losses"] == pytest.approx(base["losses"], rel=1e-5)
    assert got["weights"] == pytest.approx(base["weights"], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("cell", ["torch_compile_eager", "bf16_cpu"])
def test_trainer_compile_and_bf16_on_cpu(matrix: dict, cell: str) -> None:
    results = matrix["trainer"]
    got, base = _cell(results, cell), _cell(results, "baseline")
    tolerance = 1e-5 if cell == "torch_compile_eager" else 1e-2  # bf16 autocast rounds
    assert got["losses"] == pytest.approx(base["losses"], rel=tolerance)


def test_two_processes_trainer_split_batches_equals_one_process(
    matrix: dict, launched: Path
) -> None:
    """split_batches: the 4 samples of a step are shared by the 2 processes, so the run is
    the 1-process one."""
    ranks = [_cell(_read(launched, "trainer", "accel", r), "split_batches") for r in (0, 1)]
    base = _cell(matrix["trainer"], "baseline")
    assert ranks[0]["losses"] == pytest.approx(base["losses"], rel=1e-5)
    assert ranks[0]["weights"] == pytest.approx(base["weights"], rel=1e-4, abs=1e-4)
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_two_processes_trainer_dispatch_batches_and_tokens_seen(launched: Path) -> None:
    runs = {
        cell: [_cell(_read(launched, "trainer", "accel", r), cell) for r in (0, 1)]
        for cell in ("dispatch_batches", "dispatch_batches_false", "include_num_input_tokens_seen")
    }
    # rank 0 reading every batch and sending each its share == each rank reading its own
    assert runs["dispatch_batches"][0]["losses"] == pytest.approx(
        runs["dispatch_batches_false"][0]["losses"], rel=1e-5
    )
    assert all(r["tokens_seen"] == 4 * 8 * 16 for r in runs["include_num_input_tokens_seen"])
