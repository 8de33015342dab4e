"""Engines compose, they do not inherit: no class registered as a strategy subclasses another
registered strategy class, directly or through classes between them.

A strategy that needs another engine's behaviour holds it (the fault-tolerant strategy holds
its DDPStrategy, the mesh strategy an FSDP2Sharder) or shares a base that is not registered
itself (DTensorStrategy). Read with `ast` over packages/accel-parallel/src: a registered class
is the one a ``register_strategy(...)`` call names, by ``Cls.name``, by the class whose
``name = "..."`` matches a string name, or by what the build function returns (its return
annotation, else the class its ``return Cls(...)`` makes).
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path("packages/accel-parallel/src")


class _Module:
    """One source file's classes (name -> node) and functions (name -> node)."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and _called(n) == "register_strategy"
        ]


def _called(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _name_of(cls: ast.ClassDef) -> str | None:
    """The class attribute ``name = "..."`` of `cls`, where it has one."""
    for stmt in cls.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "name" for t in targets) and (
            isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)
        ):
            return stmt.value.value
    return None


def _class_named(module: _Module, value: str) -> str | None:
    """The class of `module` whose class attribute ``name`` is `value`."""
    for cls in module.classes.values():
        if _name_of(cls) == value:
            return cls.name
    return None


def _built_class(module: _Module, build: ast.expr) -> str | None:
    """The class the build function `build` (a function of `module`) returns."""
    if not isinstance(build, ast.Name) or build.id not in module.functions:
        return None
    func = module.functions[build.id]
    if isinstance(func.returns, ast.Name):
        return func.returns.id
    if isinstance(func.returns, ast.Constant) and isinstance(func.returns.value, str):
        return func.returns.value
    for node in ast.walk(func):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call):
            made = _called(node.value)
            if made is not None and made[:1].isupper():
                return made
    return None


def _registered(module: _Module, call: ast.Call) -> tuple[str, str] | None:
    """(registered name, class name) of one ``register_strategy`` call, where readable."""
    if not call.args:
        return None
    first = call.args[0]
    build = call.args[1] if len(call.args) > 1 else None
    if isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name):
        cls = first.value.id  # Cls.name: the class itself
        node = module.classes.get(cls)
        return (node and _name_of(node)) or cls, cls
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        cls = _class_named(module, first.value)
        if cls is None and build is not None:
            cls = _built_class(module, build)
        return (first.value, cls) if cls is not None else None
    return None


def check(root: Path) -> list[str]:
    """One line per registered strategy class that has a registered strategy among its
    ancestors."""
    modules = []
    for path in sorted((root / SOURCE).rglob("*.py")):
        modules.append(_Module(path, ast.parse(path.read_text(), filename=str(path))))
    classes: dict[str, tuple[_Module, ast.ClassDef]] = {}
    for module in modules:
        for name, node in module.classes.items():
            classes.setdefault(name, (module, node))
    registered: dict[str, str] = {}  # class name -> the strategy name it is registered as
    for module in modules:
        for call in module.calls:
            found = _registered(module, call)
            if found is not None:
                label, cls = found
                registered.setdefault(cls, label)
    found_lines = []
    for cls, label in sorted(registered.items()):
        if cls not in classes:
            continue
        module, node = classes[cls]
        for ancestor in _ancestors(cls, classes):
            if ancestor in registered:
                where = module.path.relative_to(root)
                found_lines.append(
                    f"{where}:{node.lineno}: strategy class {cls} ({label!r}) subclasses "
                    f"{ancestor} ({registered[ancestor]!r}), another registered strategy; "
                    f"hold {ancestor}'s engine (or a plain function both call) or share a "
                    f"base that is not registered."
                )
    return found_lines


def _ancestors(cls: str, classes: dict[str, tuple[_Module, ast.ClassDef]]) -> list[str]:
    """Every class above `cls` that the source defines, nearest first (each once)."""
    seen: list[str] = []
    todo = list(_base_names(classes[cls][1]))
    while todo:
        name = todo.pop(0)
        if name in seen or name == cls:
            continue
        seen.append(name)
        if name in classes:
            todo.extend(_base_names(classes[name][1]))
    return seen
