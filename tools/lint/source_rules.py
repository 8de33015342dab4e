"""Source rules that import-linter cannot express, checked over every package's ``src/``.

Each rule is a module ``tools/lint/rule_<name>.py`` with a docstring that states the rule and
a function ``check(root: pathlib.Path) -> list[str]`` that returns one line per violation
(``path:line: what is wrong and the fix``). This runner imports every such module and exits
1 when any of them finds something. ``.ci/run`` runs it beside ruff and lint-imports:

    uv run python tools/lint/source_rules.py
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def load_rules() -> dict[str, object]:
    rules = {}
    for path in sorted(HERE.glob("rule_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rules[path.stem.removeprefix("rule_")] = module
    return rules


def main(root: Path = ROOT) -> int:
    failed = 0
    for name, rule in load_rules().items():
        found = rule.check(root)  # type: ignore[attr-defined]
        print(f"{name}: {'kept' if not found else f'{len(found)} broken'}")
        for line in found:
            print(f"  {line}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
