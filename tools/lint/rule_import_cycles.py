"""No import circles: no module of a package reaches itself again through the modules it
imports, counting lazy imports inside functions and imports under ``TYPE_CHECKING`` (grimp
reads every import statement). A circle is a group of modules none of which can be read,
tested or moved without the others; break it by moving what both need below both, or by
typing against a protocol.

Checked over the import graph of the installed packages (`uv run` has them all).
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGES = (
    "accel", "accel_state", "accel_data", "accel_precision", "accel_parallel",
    "accel_bigmodel", "accel_tracking", "accel_cli",
)  # fmt: skip


def circles(graph: object) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):  # type: ignore[attr-defined]
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]  # type: ignore[attr-defined]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))  # type: ignore[attr-defined]
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return sorted(found)


def check(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    import grimp

    graph = grimp.build_graph(*packages, cache_dir=None)
    return [
        f"import circle of {len(group)} modules: {' -> '.join(group)}; move what they share "
        f"below them, or type against a protocol"
        for group in circles(graph)
    ]


if __name__ == "__main__":
    problems = check(Path(__file__).resolve().parents[2])
    print("\n".join(problems) or "no import circles")
    sys.exit(1 if problems else 0)
