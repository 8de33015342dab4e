"""Write the public names and module paths of an installed HuggingFace Accelerate as JSON.

The umbrella keeps each `accelerate.X.Y` path as `accel.X.Y`; the committed output is what
`packages/accel/tests/test_familiar_paths.py` checks, so that test needs no accelerate.

    uv run --group bench python tools/compat/list_accelerate_api.py \
        > packages/accel/tests/data/accelerate_public_api.json

What counts as public:
- `accelerate` and `accelerate.utils`: every public name in the namespace (both modules
  are re-export hubs).
- the top-level modules (`accelerate.accelerator`, `.hooks`, ...): the public names the
  module itself defines (not what it merely imports).
- the submodules of `accelerate.utils`: the names `accelerate.utils` exports, at the
  submodule that defines them (`accelerate.utils.modeling.dtype_byte_size`).
- `accelerate.commands.*`: the module paths and their command entry points (`main`,
  `*_command`, `*_command_parser`).
- in every module, also what users import from it although it is defined elsewhere: any
  class or function of accelerate's bound there (`DataLoaderConfiguration` from
  `accelerate.accelerator`), and its upper-case constants.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import sys
import types
import warnings

SKIP = ("accelerate.test_utils", "accelerate.commands.menu", "accelerate.utils.rich")
CONSTANT_TYPES = (str, int, float, bool, tuple, list, dict, set, frozenset)
COMMAND_ENTRY = re.compile(r"^(main|.*_command|.*_command_parser|write_basic_config)$")


def _public(module: types.ModuleType) -> dict[str, object]:
    return {
        k: v
        for k, v in vars(module).items()
        if not k.startswith("_") and not isinstance(v, types.ModuleType)
    }


def _defined_here(module: types.ModuleType) -> list[str]:
    return sorted(
        k for k, v in _public(module).items() if getattr(v, "__module__", None) == module.__name__
    )


def collect() -> dict[str, object]:
    import accelerate
    import accelerate.utils

    utils_names = set(_public(accelerate.utils))
    modules: dict[str, list[str]] = {
        "accelerate": sorted(_public(accelerate)),
        "accelerate.utils": sorted(utils_names),
    }
    for info in pkgutil.walk_packages(accelerate.__path__, "accelerate."):
        name = info.name
        if name.startswith(SKIP) or name in modules:
            continue
        module = importlib.import_module(name)
        if name.startswith("accelerate.utils."):
            # constants and aliases have no __module__: count them where they are bound
            here = {
                k
                for k, v in _public(module).items()
                if getattr(v, "__module__", None) == name or not callable(v)
            }
            modules[name] = sorted(
                k for k in here & utils_names if k not in _elsewhere(k, name, module)
            )
        elif name.startswith("accelerate.commands"):
            modules[name] = [k for k in _defined_here(module) if COMMAND_ENTRY.match(k)]
        else:
            modules[name] = _defined_here(module)
        modules[name] = sorted(set(modules[name]) | _importable(module))
    modules["accelerate"] = sorted(set(modules["accelerate"]) | _importable(accelerate))
    modules["accelerate.utils"] = sorted(
        set(modules["accelerate.utils"]) | _importable(accelerate.utils)
    )
    return {"accelerate_version": accelerate.__version__, "modules": modules}


def _importable(module: types.ModuleType) -> set[str]:
    """accelerate's own classes and functions bound in the module, and its constants."""
    names = set()
    for k, v in _public(module).items():
        owner = getattr(v, "__module__", None) or ""
        if (isinstance(v, (type, types.FunctionType)) and owner.startswith("accelerate")) or (
            k.isupper() and k != "TYPE_CHECKING" and isinstance(v, CONSTANT_TYPES)
        ):
            names.add(k)
    return names


def _elsewhere(key: str, name: str, module: types.ModuleType) -> set[str]:
    """A non-function value imported from a sibling module (e.g. a typing alias) is not its own."""
    value = getattr(module, key)
    owner = getattr(value, "__module__", None)
    if owner and owner != name and owner.startswith("accelerate"):
        return {key}
    return set()


def main() -> None:
    warnings.simplefilter("ignore")
    json.dump(collect(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
