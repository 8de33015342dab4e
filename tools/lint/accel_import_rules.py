"""An import-linter contract for accel's package boundaries (``lint-imports`` runs it).

``cross_package_private``: a module may import another package's modules only where their
names are public. Any name part after the package's own that starts with ``_`` is private to
that package (``accel_cli._config``, ``accel_parallel.checkpoint._dcp``); the package serves
what others need through public modules with ``__all__`` (``accel_cli.familiar``,
``accel_parallel.checkpoint``). Imports inside a package are its own business. Lazy imports
inside functions count too (grimp reads every import statement).

import-linter finds the contract type through `contract_types` in pyproject.toml, with this
folder on the import path (``.ci/run`` sets PYTHONPATH=tools/lint).
"""

from __future__ import annotations

from typing import Any

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _private_across(importer: str, imported: str) -> bool:
    top = imported.split(".", 1)[0]
    if importer.split(".", 1)[0] == top:
        return False
    return any(
        part.startswith("_") and not part.startswith("__") for part in imported.split(".")[1:]
    )


class CrossPackagePrivateContract(Contract):
    """No package imports another package's private modules."""

    type_name = "cross_package_private"
    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        packages = set(self.packages)  # type: ignore[arg-type]
        found: list[dict[str, Any]] = []
        for imported in sorted(graph.modules):
            if imported.split(".", 1)[0] not in packages:
                continue
            for importer in sorted(graph.find_modules_that_directly_import(imported)):
                if not _private_across(importer, imported):
                    continue
                details = graph.get_import_details(importer=importer, imported=imported)
                lines = sorted({d["line_number"] for d in details})
                found.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not found, metadata={"imports": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error(
            "These modules import another package's private modules; import what the package "
            "declares public instead (its __init__ or a public module with __all__):",
            bold=False,
        )
        output.new_line()
        for link in check.metadata["imports"]:
            lines = ", ".join(map(str, link["lines"]))
            output.print_error(
                f"- {link['importer']} -> {link['imported']} (l.{lines})", bold=False
            )
        output.new_line()
