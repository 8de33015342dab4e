"""tools/lint/rule_import_cycles.py finds an import circle, lazy or under TYPE_CHECKING, and
the real tree has none."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rule():
    spec = importlib.util.spec_from_file_location(
        "rule_import_cycles", ROOT / "tools/lint/rule_import_cycles.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _package(tmp_path, name, files):
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for file, text in files.items():
        (pkg / file).write_text(text)
    return name


def test_a_lazy_circle_and_a_type_checking_circle_are_found(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = _package(tmp_path, "circles_pkg", {
        "a.py": "def f():\n    from circles_pkg import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circles_pkg import c\n",
        "c.py": "import circles_pkg.a\n",
        "d.py": "import circles_pkg.a\n",
    })  # fmt: skip
    found = _rule().check(tmp_path, packages=(name,))
    assert len(found) == 1, found
    assert "circles_pkg.a -> circles_pkg.b -> circles_pkg.c" in found[0]
    sys.modules.pop(name, None)


def test_a_tree_without_circles_is_kept(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = _package(tmp_path, "line_pkg", {"a.py": "import line_pkg.b\n", "b.py": "x = 1\n"})
    assert _rule().check(tmp_path, packages=(name,)) == []


def test_the_packages_have_no_import_circle():
    assert _rule().check(ROOT) == []
