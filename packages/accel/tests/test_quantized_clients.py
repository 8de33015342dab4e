"""transformers' quantized `from_pretrained` and PEFT's QLoRA on accel through the switch.

One fresh interpreter (`_quantized_flows.py`) runs every flow; the tests compare what it
wrote. The references are bitsandbytes' and torchao's own layers on the same weights, so a
quantized load must match them exactly (same kernels, same inputs); how far quantization may
move outputs from full precision is bounded layer by layer in accel-bigmodel's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.needs("transformers", "bitsandbytes", "torchao", "peft")
FLOWS = Path(__file__).parent / "_quantized_flows.py"


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    out = tmp_path_factory.mktemp("quantized")
    env = {k: v for k, v in os.environ.items() if k != "ACCEL_AS_ACCELERATE"}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(FLOWS), str(out)], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((out / "quantized.json").read_text())
    return result, torch.load(out / "quantized_logits.pt", weights_only=True)


def _skip_refused(result: dict[str, Any], kind: str) -> None:
    """The torchao cells skip where transformers takes no torchao quantization (the flows
    say why: torch 2.9's torchao is older than transformers' TorchAoConfig takes)."""
    if kind == "torchao" and result["torchao_refused"]:
        pytest.skip(result["torchao_refused"])


def test_the_flows_ran_on_accel(flows) -> None:
    result, _ = flows
    assert result["accelerate_file"].endswith(os.path.join("accel", "__init__.py"))


@pytest.mark.parametrize(
    ("kind", "layer", "weight"),
    [
        ("int8", "Linear8bitLt", "Int8Params"),
        ("nf4", "Linear4bit", "Params4bit"),
        ("torchao", "Linear", "Int8Tensor"),
    ],
)
def test_from_pretrained_quantized_device_map_auto_equals_the_library_own_layers(
    flows, kind: str, layer: str, weight: str
) -> None:
    result, logits = flows
    _skip_refused(result, kind)
    assert (result[f"{kind}_layer"], result[f"{kind}_weight"]) == (layer, weight)
    assert torch.equal(logits[f"{kind}_auto"], logits[f"{kind}_own"])
    assert not torch.equal(logits[f"{kind}_auto"], logits["full"])  # really quantized


@pytest.mark.parametrize("kind", ["int8", "nf4", "torchao"])
def test_a_saved_quantized_model_reloads_to_the_same_outputs(flows, kind: str) -> None:
    result, logits = flows
    _skip_refused(result, kind)
    assert torch.equal(logits[f"{kind}_reloaded"], logits[f"{kind}_auto"])


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_device_map_auto_spilling_to_disk_equals_the_library_own_layers(flows, kind: str) -> None:
    result, logits = flows
    assert "disk" in result[f"{kind}_auto_disk_map"].values()
    assert torch.equal(logits[f"{kind}_auto_disk"], logits[f"{kind}_own"])
    assert torch.equal(logits[f"{kind}_auto_disk_again"], logits[f"{kind}_own"])


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_a_hand_written_map_with_a_layer_on_disk_runs_through_the_offload_hooks(
    flows, kind: str
) -> None:
    result, logits = flows
    assert result[f"{kind}_disk_map"]["model.layers.1"] == "disk"
    assert result[f"{kind}_disk_layer"] == "Linear"  # transformers keeps offloaded modules fp32
    assert torch.equal(logits[f"{kind}_disk"], logits["full"])


def test_qlora_steps_on_the_4bit_model_reduce_the_loss(flows) -> None:
    qlora = flows[0]["qlora"]
    assert qlora["frozen_4bit_weights"] == 14  # 7 projections x 2 layers stay frozen in 4 bits
    assert qlora["trainable"] > 0
    losses = qlora["losses"]
    # 8 AdamW steps at lr 1e-2 on one batch: a working backward through the 4-bit layers
    # into the adapters lowers the loss every run here by ~0.5; a broken one leaves it flat.
    assert losses[-1] < losses[0] - 0.2
