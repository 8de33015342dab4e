"""tools/lint/rule_strategies.py: no registered strategy class subclasses another one.

On a tiny fake tree (a registered class under another, directly and through a class between
them; a shared base that is not registered, which is allowed) and on the real tree (kept).
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _rule() -> ModuleType:
    path = ROOT / "tools" / "lint" / "rule_strategies.py"
    spec = importlib.util.spec_from_file_location("rule_strategies", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "packages" / "accel-parallel" / "src" / "accel_parallel"
    package.mkdir(parents=True)
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    return root


BASE = """
    class Strategy:
        name = "base"

    class Shared(Strategy):
        pass

    class Ddp(Shared):
        name = "ddp"

    register_strategy(Ddp.name, lambda request: Ddp())
"""


def test_a_tree_without_a_registered_parent_is_kept(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        {
            "_base.py": BASE,
            "_mesh.py": """
                class Mesh(Shared):  # a shared base that is not registered: allowed
                    pass

                def _build(request) -> Mesh:
                    return Mesh()

                register_strategy("mesh", _build)
            """,
        },
    )
    assert _rule().check(tree) == []


def test_a_registered_class_under_another_is_found(tmp_path: Path) -> None:
    tree = _tree(
        tmp_path,
        {
            "_base.py": BASE,
            "_ft.py": """
                class Between(Ddp):
                    pass

                class FaultTolerant(Between):
                    name = "fault_tolerant"

                def _build(request):
                    return FaultTolerant()

                register_strategy("fault_tolerant", _build)
            """,
            "_mesh.py": """
                def _build(request):
                    return Mesh()

                class Mesh(Ddp):
                    pass

                register_strategy("mesh", _build)
            """,
        },
    )
    found = _rule().check(tree)
    assert len(found) == 2, found
    assert found[0].startswith("packages/accel-parallel/src/accel_parallel/_ft.py:5: ")
    assert "strategy class FaultTolerant ('fault_tolerant') subclasses Ddp ('ddp')" in found[0]
    assert "_mesh.py:5: strategy class Mesh ('mesh') subclasses Ddp ('ddp')" in found[1]


def test_the_real_tree_is_kept() -> None:
    assert _rule().check(ROOT) == []
