"""A loader's position, saved on one number of processes, continued on another.

The prepared loaders shard one global stream of batches. After `b` global batches of `G`
samples, `b * G` samples of the epoch are consumed. With the same global batch size the run
continues at batch `b`: exactly the same sample stream. With another global batch size `G'` it
continues at batch `b * G // G'`; when that does not divide evenly, the position is rounded
down and the remaining samples are seen again (the returned note says how many).
"""

from __future__ import annotations

from typing import Any


def continue_data_position(
    state: dict[str, Any],
    saved_total: int | None,
    now_total: int | None,
    num_processes: int,
) -> tuple[dict[str, Any], str | None]:
    """A data loader state saved on another number of processes, for this run.

    `saved_total` / `now_total`: samples per global batch then and now (None when batches
    vary in size). Returns the state to load and, when the position is not exact, a sentence
    saying what is approximate. Raises ValueError when no position can be computed.
    """
    yielded = int(state.get("batches_yielded") or 0)
    state = {**state, "num_processes": num_processes}
    if "loader" in state:  # the position is converted to this run's global batches
        state["loader"] = {**state["loader"], "total_batch_size": now_total}
    if yielded == 0 or saved_total == now_total:
        return state, None
    if saved_total is None or now_total is None:
        raise ValueError(
            f"the data loader was saved {yielded} batches into epoch {state.get('epoch')}, with "
            f"global batches of {saved_total or 'varying'} samples; this run's are of "
            f"{now_total or 'varying'} samples, so the position in the sample stream cannot be "
            f"computed. Resume on as many processes as saved, or save at the end of an epoch."
        )
    consumed = yielded * saved_total
    batches, again = divmod(consumed, now_total)
    state["batches_yielded"] = batches
    if again == 0:
        return state, None
    return state, (
        f"the data loader was {yielded} batches of {saved_total} samples into epoch "
        f"{state.get('epoch')} ({consumed} samples); with global batches of {now_total} "
        f"samples it continues at batch {batches}, so {again} samples of the epoch are seen "
        f"again (keep the global batch size, per-process batch x processes, for an exact resume)"
    )
