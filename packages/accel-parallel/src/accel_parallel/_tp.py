"""Tensor parallel: a plan (module-name pattern -> style) applied on the ``tp`` sub-mesh.

The plan is the one passed (``ParallelismConfig(tp_plan=...)``), else the one the model
declares as transformers models do (``model._tp_plan``, else ``config.base_model_tp_plan``
under ``base_model_prefix``). A pattern's ``*`` stands for one part of a module name
(``layers.*.mlp.up_proj``). Styles: transformers' names (``colwise``, ``rowwise``,
``colwise_rep`` / ``colwise_gather_output``, ``rowwise_rep`` / ``rowwise_split_input``,
``embedding_rowwise``, ``embedding_colwise``, ``sequence_parallel``, ``replicate``) or any
torch ``ParallelStyle``. A weight tied between modules that the plan splits is refused (split,
the two would train apart): untie it (``tie_word_embeddings=False``) or leave it out of the plan.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from accel_parallel._tp_sequence import sequence_parallel_plan

_STYLE_NAMES = (
    "colwise",
    "rowwise",
    "colwise_rep",
    "colwise_gather_output",
    "rowwise_rep",
    "rowwise_split_input",
    "embedding_rowwise",
    "embedding_colwise",
    "sequence_parallel",
    "replicate",
)


def model_tp_plan(model: nn.Module) -> dict[str, Any]:
    """The plan a transformers-style model declares ({} when it declares none)."""
    plan = dict(getattr(model, "_tp_plan", None) or {})
    if plan:
        return plan
    config = getattr(model, "config", None)
    base = dict(getattr(config, "base_model_tp_plan", None) or {})
    if not base:
        return {}
    prefix = getattr(model, "base_model_prefix", "")
    if prefix and isinstance(getattr(model, prefix, None), nn.Module):
        return {f"{prefix}.{k}": v for k, v in base.items()}
    return base


def _style(name: Any, pattern: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
    )

    if isinstance(name, ParallelStyle):
        return name
    gathered = lambda: ColwiseParallel(output_layouts=Replicate())  # noqa: E731
    split_input = lambda: RowwiseParallel(input_layouts=Replicate())  # noqa: E731
    styles = {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": gathered,
        "colwise_gather_output": gathered,
        "rowwise_rep": split_input,
        "rowwise_split_input": split_input,
        "embedding_rowwise": split_input,  # the vocabulary split, lookups summed
        "embedding_colwise": gathered,  # the embedding width split, gathered
        "sequence_parallel": lambda: SequenceParallel(use_local_output=True),
        "replicate": ReplicateParallel,
    }
    make = styles.get(str(name))
    if make is None:
        raise ValueError(
            f"tensor-parallel plan: {pattern!r} -> {name!r} is not a style accel applies; "
            f"accepted: {list(_STYLE_NAMES)} or a torch.distributed.tensor.parallel.ParallelStyle."
        )
    return make()


def _matcher(pattern: str) -> re.Pattern[str]:
    parts = [r"[^.]+" if p == "*" else re.escape(p) for p in pattern.split(".")]
    return re.compile(r"\.".join(parts))


def resolve_plan(
    model: nn.Module, plan: Mapping[str, Any] | None, sequence_parallel: bool = False
) -> dict[str, Any]:
    """{module name: ParallelStyle} for every module the plan names, with the
    sequence-parallel regions laid out when asked (`accel_parallel._tp_sequence`); errors
    name what is wrong."""
    plan = dict(plan) if plan else model_tp_plan(model)
    if not plan:
        raise ValueError(
            f"tensor parallel (tp_size > 1) needs a plan, and {type(model).__name__} declares "
            f"none (no _tp_plan / config.base_model_tp_plan). Pass one: ParallelismConfig("
            f"tp_size=..., tp_plan={{'layers.*.up': 'colwise', 'layers.*.down': 'rowwise'}})."
        )
    names = [n for n, _ in model.named_modules() if n]
    out: dict[str, Any] = {}
    for pattern, style in plan.items():
        regex = _matcher(pattern)
        hits = [n for n in names if regex.fullmatch(n)]
        if not hits:
            shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
            raise ValueError(
                f"tensor-parallel plan: {pattern!r} matches no module of "
                f"{type(model).__name__}; its modules are: {shown}. Fix the pattern "
                f"('*' stands for one name part)."
            )
        for name in hits:
            out[name] = _style(style, pattern)
    return sequence_parallel_plan(model, out) if sequence_parallel else out


def apply_tensor_parallel(
    model: nn.Module,
    tp_mesh: Any,
    plan: Mapping[str, Any] | None = None,
    enable_async_tp: bool = False,
    sequence_parallel: bool = False,
    only: Callable[[str], bool] | None = None,
) -> nn.Module:
    """Split `model`'s weights over `tp_mesh` in place, as the plan says (see the module
    docstring). Modules already holding DTensors (a model loaded with transformers'
    ``tp_plan``) are left as they are. `only(name)`: split just the planned modules it
    accepts (a pipeline rank splits the modules of its own stages)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    if any(isinstance(p, DTensor) for p in model.parameters()):
        return model
    resolved = resolve_plan(model, plan, sequence_parallel)
    _refuse_split_ties(model, resolved)
    if enable_async_tp:
        _enable_async_tp(tp_mesh)
    for name, style in resolved.items():
        if only is None or only(name):
            parallelize_module(model.get_submodule(name), tp_mesh, style)
    return model


def _refuse_split_ties(model: nn.Module, resolved: Mapping[str, Any]) -> None:
    """Tensor parallel replaces each planned module's weights by its own DTensor, so a weight
    tied between modules would silently become two that train apart: refuse that."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    for names in owners.values():
        if len(names) < 2:
            continue
        planned = [n for n in names if any(n == m or n.startswith(f"{m}.") for m in resolved)]
        if planned:
            raise ValueError(
                f"tensor-parallel plan: {names} are one tied weight and the plan splits "
                f"{planned}; splitting would untie them (they would train apart). Untie them "
                f"(e.g. tie_word_embeddings=False) or leave every one of them out of the plan."
            )


def _enable_async_tp(tp_mesh: Any) -> None:
    if tp_mesh.device_type != "cuda":
        raise ValueError(
            f"TorchTensorParallelConfig(enable_async_tp=True) needs CUDA (symmetric memory); "
            f"this mesh is on {tp_mesh.device_type!r}. Set enable_async_tp=False."
        )
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def _replicate_inputs(module: nn.Module, inputs: Any, mesh: Any) -> Any:
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        else x
        for x in inputs
    )


def _local_outputs(module: nn.Module, outputs: Any, mesh: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(outputs, DTensor):
        return outputs.to_local()
    if isinstance(outputs, tuple):
        return tuple(o.to_local() if isinstance(o, DTensor) else o for o in outputs)
    return outputs


@functools.cache
def _make_replicate_style() -> type:
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import ParallelStyle

    class _ReplicateParallel(ParallelStyle):
        """Every weight whole on each tensor-parallel rank (a DTensor replicated over the
        ``tp`` mesh), inputs and outputs plain tensors: for small layers (norms, biases)
        beside split ones."""

        def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
            return distribute_module(
                module, device_mesh, input_fn=_replicate_inputs, output_fn=_local_outputs
            )

    return _ReplicateParallel


def ReplicateParallel() -> Any:
    """A ParallelStyle that replicates a module's weights over the ``tp`` mesh."""
    return _make_replicate_style()()
