"""How a model is cut into pipeline stages, and the stage modules that run the pieces.

A plan is one of:

- nothing, for a transformers decoder model (``model.<base>.embed_tokens / layers / norm``
  and ``lm_head``, as Llama, Mistral, Qwen2 and their kin have): the decoder layers are
  spread evenly over the stages, the embedding goes on the first and the norm and head on
  the last;
- a sequence of module-name patterns in the order the model runs them (``"*"`` is one name
  part; a ``ModuleList`` stands for its children): ``["embed", "blocks.*", "head"]``. The
  model must compute exactly ``head(blocks[n](...blocks[0](embed(x))))``; the modules are
  spread evenly over the stages in that order;
- a sequence of such sequences, one per stage: ``[["embed", "blocks.0"], ["blocks.1",
  "head"]]``.

Every parameter must belong to a module of the plan, and no stage may be empty: either
error names what is wrong and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from torch import nn

from accel_parallel._pipeline_hf import decoder_layer_count, decoder_stages

# torch's schedule name -> (several stages per rank, stage placement, default stages per rank)
PP_SCHEDULES: dict[str, tuple[bool, str, int]] = {
    "GPipe": (False, "loop", 1),
    "1F1B": (False, "loop", 1),
    "Interleaved1F1B": (True, "loop", 2),
    "LoopedBFS": (True, "loop", 2),
    "InterleavedZeroBubble": (True, "loop", 2),
    "ZBVZeroBubble": (True, "v", 2),
    "DualPipeV": (True, "v", 2),
}


def check_pipeline_options(config: Any) -> None:
    """Validate and fill the ``pp_*`` fields of a ParallelismConfig with ``pp_size > 1``."""
    names = {k.lower(): k for k in PP_SCHEDULES}
    given = config.pp_schedule or "1F1B"
    schedule = names.get(str(given).lower())
    if schedule is None:
        raise ValueError(
            f"ParallelismConfig(pp_schedule={given!r}): not a pipeline schedule; accepted: "
            f"{list(PP_SCHEDULES)}."
        )
    multi, style, default_virtual = PP_SCHEDULES[schedule]
    virtual = config.pp_virtual_stages or default_virtual
    for field, value in (("pp_virtual_stages", virtual), ("pp_microbatches",
                                                         config.pp_microbatches or 1)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ParallelismConfig.{field}={value!r}: expected a whole number >= 1.")
    if not multi and virtual != 1:
        raise ValueError(
            f"ParallelismConfig(pp_schedule={schedule!r}, pp_virtual_stages={virtual}): "
            f"{schedule} runs one stage per rank. Use pp_schedule='Interleaved1F1B' for "
            f"several stages per rank, or pp_virtual_stages=1."
        )
    if style == "v" and virtual != 2:
        raise ValueError(
            f"ParallelismConfig(pp_schedule={schedule!r}, pp_virtual_stages={virtual}): the "
            f"V-shaped schedules hold exactly 2 stages per rank; set pp_virtual_stages=2."
        )
    if config.cp_size > 1:
        raise ValueError(
            f"ParallelismConfig(pp_size={config.pp_size}, cp_size={config.cp_size}): context "
            f"parallel inside pipeline stages is not supported (the stages would see positions "
            f"and labels of a slice of the sequence). Set cp_size=1; beside a pipeline, split "
            f"with tp_size (and sequence parallel) or dp_shard_size."
        )
    if config.pp_loss_fn is not None and not callable(config.pp_loss_fn):
        raise ValueError(
            f"ParallelismConfig(pp_loss_fn={config.pp_loss_fn!r}): expected a function "
            f"(output, labels) -> scalar loss."
        )
    micro = config.pp_microbatches or config.pp_size
    object.__setattr__(config, "pp_schedule", schedule)
    object.__setattr__(config, "pp_virtual_stages", virtual)
    object.__setattr__(config, "pp_microbatches", micro)


def stage_to_rank(schedule: str, pp_size: int, num_stages: int) -> dict[int, int]:
    """Which pipeline rank holds each stage (round robin; V-shaped for the V schedules)."""
    if PP_SCHEDULES[schedule][1] == "loop":
        return {s: s % pp_size for s in range(num_stages)}
    return {s: s if s < pp_size else 2 * pp_size - 1 - s for s in range(num_stages)}


# -- the stage modules (a transformers decoder's: accel_parallel._pipeline_hf) --------------
class ChainStage(nn.Module):
    """Consecutive modules of a plan, applied one after the other."""

    def __init__(self, names: Sequence[str], modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)
        self.unit_names = {f"parts.{i}": n for i, n in enumerate(names)}

    def forward(self, x: Any) -> Any:
        for part in self.parts:
            x = part(x)
        return x


# -- plans ------------------------------------------------------------------------------------
def even_spans(count: int, parts: int) -> list[range]:
    sizes = [count // parts + (1 if i < count % parts else 0) for i in range(parts)]
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def build_stages(model: nn.Module, plan: Any, num_stages: int) -> list[nn.Module]:
    """One stage module per pipeline stage, over the modules of `model` (not copies)."""
    if plan is None:  # a transformers decoder model (accel_parallel._pipeline_hf)
        count = decoder_layer_count(model)
        if count < num_stages:
            raise ValueError(
                f"pipeline parallel: {type(model).__name__} has {count} decoder layers for "
                f"{num_stages} stages, which would leave a stage empty. Use at most {count} "
                f"stages (pp_size x pp_virtual_stages)."
            )
        return decoder_stages(model, even_spans(count, num_stages))
    if isinstance(plan, str) or not isinstance(plan, Sequence) or not plan:
        raise ValueError(
            f"ParallelismConfig(pp_plan={plan!r}): expected a list of module names in the "
            f"order they run, or a list of such lists (one per stage)."
        )
    explicit = all(not isinstance(p, str) for p in plan)
    if explicit:
        if len(plan) != num_stages:
            raise ValueError(
                f"ParallelismConfig(pp_plan=...) lists {len(plan)} stages, the run has "
                f"{num_stages} (pp_size x pp_virtual_stages); give one list per stage."
            )
        groups = [_expand(model, list(p)) for p in plan]
    else:
        chain = _expand(model, list(plan))
        if len(chain) < num_stages:
            raise ValueError(
                f"ParallelismConfig(pp_plan=...) names {len(chain)} modules ({chain}) for "
                f"{num_stages} stages, which leaves a stage empty. Name finer modules (e.g. "
                f"'blocks.*' rather than 'blocks'), or use fewer stages."
            )
        groups = [[chain[i] for i in span] for span in even_spans(len(chain), num_stages)]
    for i, group in enumerate(groups):
        if not group:
            raise ValueError(
                f"ParallelismConfig(pp_plan=...): stage {i} is empty; every stage needs at least "
                f"one module. Move a module into it, or use fewer stages."
            )
    _check_cover(model, [n for g in groups for n in g])
    return [ChainStage(g, [model.get_submodule(n) for n in g]) for g in groups]


def _matcher(pattern: str) -> re.Pattern[str]:
    parts = [r"[^.]+" if p == "*" else re.escape(p) for p in pattern.split(".")]
    return re.compile(r"\.".join(parts))


def _expand(model: nn.Module, patterns: list[Any]) -> list[str]:
    """Module names for the patterns, in order (a ModuleList stands for its children)."""
    names = [n for n, _ in model.named_modules() if n]
    out: list[str] = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(
                f"ParallelismConfig(pp_plan=...): {pattern!r} is not a module name; a plan is "
                f"a list of names, or one list of names per stage."
            )
        regex = _matcher(pattern)
        hits = [n for n in names if regex.fullmatch(n)]
        if not hits:
            shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "")
            raise ValueError(
                f"ParallelismConfig(pp_plan=...): {pattern!r} matches no module of "
                f"{type(model).__name__}; its modules are: {shown}."
            )
        for name in hits:
            module = model.get_submodule(name)
            if isinstance(module, nn.ModuleList):
                out += [f"{name}.{c}" for c, _ in module.named_children()]
            else:
                out.append(name)
    return out


def _check_cover(model: nn.Module, units: list[str]) -> None:
    """Each parameter and persistent buffer in exactly one module of the plan."""
    seen: dict[str, str] = {}
    for unit in units:
        for other in seen:
            if unit == other or unit.startswith(f"{other}.") or other.startswith(f"{unit}."):
                raise ValueError(
                    f"ParallelismConfig(pp_plan=...) names {other!r} and {unit!r}, and one holds "
                    f"the other: each module may be in one place only."
                )
        seen[unit] = unit
    keys = [n for n, _ in model.named_parameters()] + list(model.state_dict())
    missing = sorted({k for k in keys if not any(k.startswith(f"{u}.") for u in units)})
    if missing:
        raise ValueError(
            f"ParallelismConfig(pp_plan=...) does not cover the model: {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''} belong to no module of the plan. Add the "
            f"modules that hold them, in the order the model runs them."
        )


def full_name(stage: nn.Module, local: str) -> str:
    """The model's name of a parameter or buffer named `local` inside `stage`."""
    for prefix, original in stage.unit_names.items():
        if local.startswith(f"{prefix}."):
            return original + local[len(prefix) :]
    return local


def stage_units(stage: nn.Module) -> list[nn.Module]:
    """The modules a stage owns (those whose weights live on its rank)."""
    return [stage.get_submodule(p) for p in stage.unit_names]


# -- a split by size (prepare_pippy's) -------------------------------------------------------
def _pieces(model: nn.Module, no_split: set[str]) -> list[tuple[str, int]]:
    """The model's modules in order, down to leaves or unsplittable classes, with sizes."""
    out: list[tuple[str, int]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        children = list(module.named_children())
        if prefix and (not children or type(module).__name__ in no_split):
            out.append((prefix, sum(p.numel() for p in module.parameters())))
            return
        for name, child in children:
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return out


def balanced_stage_map(
    model: nn.Module, num_stages: int, no_split_module_classes: Sequence[str] = ()
) -> dict[str, int]:
    """{module name: stage} splitting the model's parameters evenly over `num_stages` stages,
    in the order the modules are registered (never inside a class of
    `no_split_module_classes`), every stage non-empty."""
    pieces = _pieces(model, set(no_split_module_classes))
    if len(pieces) < num_stages:
        raise ValueError(
            f"{type(model).__name__} has {len(pieces)} splittable modules, fewer than the "
            f"{num_stages} stages asked for; use fewer stages or name the split points."
        )
    sizes = [max(size, 1) for _, size in pieces]
    total = sum(sizes)
    stages: dict[str, int] = {}
    done, stage = 0, 0
    for i, ((name, _), size) in enumerate(zip(pieces, sizes)):
        # The stage whose share holds this piece's middle; never skipping a stage, and
        # leaving a piece for each stage after it.
        share = int((done + size / 2) * num_stages / total)
        stage = max(min(share, stage + 1, num_stages - 1), num_stages - (len(pieces) - i))
        stages[name] = stage
        done += size
    return stages
