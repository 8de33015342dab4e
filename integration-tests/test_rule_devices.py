"""tools/lint/rule_devices.py: device kinds and strategies are asked, not named."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _rule() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rule_devices", ROOT / "tools/lint/rule_devices.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


BAD = """
def f(device, t, self):
    a = device.type == "cuda"
    b = t.device.type not in ("cpu", "xla")
    c = "xpu" != device.type
    d = self.strategy.name == "fsdp"
    return a, b, c, d
"""

GOOD = """
import os

def f(device, path, precision, entry):
    a = device.type == "meta"  # meta is a placeholder, not a device kind
    b = device.type == other.type
    c = os.name == "nt" or path.name == "checkpoints"
    d = precision.name in ("fp16", "bf16")
    return entry.is_host, a, b, c, d
"""


def test_a_tree_with_named_devices_and_strategies_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"packages/accel-x/src/accel_x/_m.py": BAD})
    found = _rule().check(root)
    assert len(found) == 4, found
    assert found[0].startswith("packages/accel-x/src/accel_x/_m.py:3: `device.type == 'cuda'`")
    assert "compares a strategy with ['fsdp']" in found[3]
    assert "['cpu', 'xla']" in found[1] and "device_entry" in found[1]


def test_a_tree_that_asks_is_kept(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"packages/accel-x/src/accel_x/_m.py": GOOD})
    assert _rule().check(root) == []


def test_the_allowed_modules_may_name_devices(tmp_path: Path) -> None:
    rule = _rule()
    root = _tree(
        tmp_path, dict.fromkeys(rule.ALLOWED, BAD.replace('self.strategy.name == "fsdp"', "0"))
    )
    assert rule.check(root) == []
    tests = {"packages/accel-x/tests/test_m.py": BAD}  # only src/ is checked
    assert rule.check(_tree(tmp_path, tests)) == []


def test_the_repository_keeps_the_rule() -> None:
    assert _rule().check(ROOT) == []
