"""Devices and strategies are asked, not named.

In ``packages/*/src``, no comparison of a ``.type`` with a string literal (``device.type ==
"cuda"``, ``t.device.type in ("cpu", "xla")``; ``"meta"`` excepted: meta is torch's shape-only
placeholder, not a device kind), and no comparison of a strategy's ``.name`` with a literal
(``self.strategy.name == "fsdp"``: the expression before ``.name`` mentions a strategy). Ask the
device's entry instead (``accel_state.device_entry(device).is_host``, ``.async_copies``,
``.default_backend()``, ...) or the strategy's method or capability.

Allowed where the answer is owned:
- accel-state's registry (``_devices.py``, ``_device_kinds.py``): it is where kinds are named;
- ``accel_parallel/_xla.py``: the engine about that very device (XLA);
- each standalone leaf's one device module (``accel_data/_device_kinds.py``,
  ``accel_bigmodel/_device_kinds.py``, ``accel_precision/_device_kinds.py``): those packages
  import no sibling (see [tool.importlinter] in pyproject.toml), so they cannot ask
  accel-state's registry, and keep their few device questions in one place instead.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ALLOWED = frozenset(
    {
        "packages/accel-state/src/accel_state/_devices.py",
        "packages/accel-state/src/accel_state/_device_kinds.py",
        "packages/accel-parallel/src/accel_parallel/_xla.py",
        "packages/accel-data/src/accel_data/_device_kinds.py",
        "packages/accel-bigmodel/src/accel_bigmodel/_device_kinds.py",
        "packages/accel-precision/src/accel_precision/_device_kinds.py",
    }
)
_EXEMPT_LITERALS = frozenset({"meta"})


def _literals(node: ast.expr) -> list[str]:
    """The string literals ``node`` is (one constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
    return []


def _named(node: ast.expr) -> str | None:
    """What ``node`` asks by name: "device" for ``<x>.type``, "strategy" for a strategy's
    ``.name``, else None."""
    if not isinstance(node, ast.Attribute):
        return None
    if node.attr == "type":
        return "device"
    if node.attr == "name" and "strategy" in ast.unparse(node.value).lower():
        return "strategy"
    return None


def violations_in(source: str, label: str) -> list[str]:
    """The rule's findings in one module's source (``label`` names it in each line)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, right in itertools.pairwise(operands):
            for named, other in ((left, right), (right, left)):
                kind = _named(named)
                names = [n for n in _literals(other) if n not in _EXEMPT_LITERALS]
                if kind is None or not names:
                    continue
                fix = (
                    "ask accel_state.device_entry(device) (or the package's _device_kinds module)"
                    if kind == "device"
                    else "call the strategy's method or capability instead"
                )
                found.append(
                    f"{label}:{node.lineno}: `{ast.unparse(node)}` compares a {kind} with "
                    f"{names}; {fix}"
                )
    return found


def check(root: Path) -> list[str]:
    """Every violation under ``root/packages/*/src``, outside the allowed modules."""
    found = []
    for path in sorted(root.glob("packages/*/src/**/*.py")):
        label = path.relative_to(root).as_posix()
        if label in ALLOWED:
            continue
        found += violations_in(path.read_text(encoding="utf-8"), label)
    return found
