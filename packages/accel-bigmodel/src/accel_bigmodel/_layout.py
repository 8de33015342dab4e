"""Which files make up a checkpoint folder, and the shards an index names: one rule for a
local folder (`_checkpoint`) and for a prefix in an object store (`_store_load`)."""

from __future__ import annotations

import json
from collections.abc import Iterable

INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_NAMES = ("model.safetensors", "pytorch_model.bin")
EXTENSIONS = (".safetensors", ".bin", ".pt", ".pth")


def choose(where: str, names: Iterable[str]) -> tuple[bool, str]:
    """(whether it is an index, its name): what a folder `where` holding the files `names`
    loads. Raises ValueError, naming what was found, when that cannot be told."""
    names = sorted(names)
    for name in INDEX_NAMES:
        if name in names:
            return True, name
    indexes = [n for n in names if n.endswith(".index.json")]
    if len(indexes) == 1:
        return True, indexes[0]
    for name in SINGLE_NAMES:
        if name in names:
            return False, name
    files = [n for n in names if n.endswith(EXTENSIONS)]
    if len(files) == 1:
        return False, files[0]
    raise ValueError(
        f"Cannot tell which checkpoint to load in {where!r}: expected {INDEX_NAMES[0]}, "
        f"{INDEX_NAMES[1]}, or one weights file ({', '.join(EXTENSIONS)}); found {files}."
    )


def index_shards(text: str | bytes, index: str) -> list[str]:
    """The shard files (relative to the index's folder, sorted) that index `index` names:
    ``{"weight_map": {name: file}}`` or ``{name: file}``."""
    try:
        parsed = json.loads(text)
        weight_map = parsed.get("weight_map", parsed)
        if not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError("its values are not all file names")
    except (ValueError, AttributeError) as e:
        raise ValueError(
            f"Cannot read the checkpoint index {index}: {e!r}. It must be JSON with a "
            f'"weight_map" of tensor name -> shard file (or be that mapping itself).'
        ) from None
    return sorted(set(weight_map.values()))
