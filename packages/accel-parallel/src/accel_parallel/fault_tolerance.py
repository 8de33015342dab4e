"""Per-step fault tolerance across replica groups (torchft), and its configuration.

A replica group is one ordinary data-parallel job (one `accel launch`); several groups train
one model together through torchft: a quorum per optimizer step (which groups are alive), the
gradients averaged over the groups in the quorum, a commit that every group agrees on before
the optimizer steps, and a group that (re)joins healed from a live peer's state. A group that
dies costs the others one refused step, not a restart. See `FaultTolerantStrategy`.

torchft is optional: `pip install "accel-parallel[ft]"`; it is imported when a strategy is
built, never when this module is.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = [
    "DEFAULT_HEARTBEAT_TIMEOUT_MS",
    "SEMI_SYNC_MODES",
    "TORCHFT_LIGHTHOUSE",
    "FaultTolerancePlugin",
    "ReplicaGroups",
    "import_torchft",
    "lighthouse_from",
    "serve_lighthouse",
    "timeout_refusal",
]

# The lighthouse's address when neither the plugin nor `accel launch --ft_lighthouse` gives
# one (torchft's own variable).
TORCHFT_LIGHTHOUSE = "TORCHFT_LIGHTHOUSE"
SEMI_SYNC_MODES = ("local_sgd", "diloco")
# The lighthouse drops a group silent this long (`accel lighthouse`'s and torchft's default).
DEFAULT_HEARTBEAT_TIMEOUT_MS = 5000
_INSTALL = 'pip install "accel-parallel[ft]"'


def import_torchft() -> Any:
    """torchft, or an ImportError naming the extra that installs it."""
    try:
        import torchft
    except ImportError as err:
        raise ImportError(
            f"Fault tolerance across replica groups needs torchft, which is not installed "
            f'({err}); install it with `{_INSTALL}` (or `pip install "accel[ft]"`).'
        ) from None
    return torchft


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultTolerancePlugin:
    """One replica group's place in a fault-tolerant run (torchft).

    `replica_group_id`: this group, 0 .. `num_replica_groups` - 1 (each group one
    `accel launch`); `min_replica_groups`: the fewest groups a step commits with;
    `lighthouse`: the lighthouse's address, ``http://HOST:PORT`` (`accel lighthouse` prints it;
    None: ``$TORCHFT_LIGHTHOUSE``); `timeout`: seconds for connecting, a quorum, a collective
    and a commit (a dead group costs the others about this much); `heartbeat_timeout_ms`: the
    lighthouse's (`accel lighthouse --heartbeat_timeout_ms`, default 5000 there and in
    torchft), which `timeout` must exceed (`timeout_refusal`). `semi_sync`: None (every
    step synchronous), ``"local_sgd"`` (weights averaged every `sync_every` steps) or
    ``"diloco"`` (pseudo-gradients averaged every `sync_every` steps and applied by
    `outer_optimizer(params)`, default SGD lr 0.7, Nesterov momentum 0.9).
    """

    replica_group_id: int
    num_replica_groups: int
    min_replica_groups: int = 1
    lighthouse: str | None = None
    timeout: float = 30.0
    heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS
    semi_sync: str | None = None
    sync_every: int = 1
    outer_optimizer: Callable[[Any], torch.optim.Optimizer] | None = None

    def __post_init__(self) -> None:
        n = self.num_replica_groups
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"num_replica_groups={n!r}: expected an integer of at least 1.")
        if not isinstance(self.replica_group_id, int) or not 0 <= self.replica_group_id < n:
            raise ValueError(
                f"replica_group_id={self.replica_group_id!r} with num_replica_groups={n}: "
                f"expected 0 <= replica_group_id < {n} (one id per `accel launch`)."
            )
        if not 1 <= self.min_replica_groups <= n:
            raise ValueError(
                f"min_replica_groups={self.min_replica_groups} with num_replica_groups={n}: "
                f"expected 1 <= min_replica_groups <= {n}; no step could ever commit with more "
                f"groups than the run has. Lower min_replica_groups or add groups."
            )
        if self.timeout <= 0:
            raise ValueError(f"timeout={self.timeout}: expected seconds > 0.")
        if (why := timeout_refusal(self.timeout, self.heartbeat_timeout_ms)) is not None:
            raise ValueError(why)
        if self.semi_sync not in (None, *SEMI_SYNC_MODES):
            raise ValueError(
                f"semi_sync={self.semi_sync!r}: expected None, 'local_sgd' or 'diloco'."
            )
        if self.sync_every < 1:
            raise ValueError(f"sync_every={self.sync_every}: expected at least 1.")
        if self.outer_optimizer is not None and self.semi_sync != "diloco":
            raise ValueError(
                f"outer_optimizer is DiLoCo's; semi_sync={self.semi_sync!r} has none. Pass "
                f"semi_sync='diloco' or leave outer_optimizer out."
            )
        if self.lighthouse is not None:
            _check_address(self.lighthouse, "lighthouse")

    @classmethod
    def from_launch(cls, section: Mapping[str, Any]) -> FaultTolerancePlugin:
        """The plugin that `accel launch --ft_*` flags describe (its `fault_tolerance_config`
        section)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"outer_optimizer"}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"fault_tolerance_config: unknown keys {unknown}; known: {known}.")
        return cls(**dict(section))


def timeout_refusal(timeout: float, heartbeat_timeout_ms: int) -> str | None:
    """Why a group's `timeout` (seconds) cannot work with the lighthouse's heartbeat timeout
    (None: it can). After a group dies, the lighthouse counts it alive until its last
    heartbeat is `heartbeat_timeout_ms` old, so the survivors' next quorum waits about that
    long: a quorum timeout at or below it fails the survivors instead of leaving them alone.
    Refused rather than raised to fit, because `timeout` also bounds every collective and
    commit, which the user chose."""
    if heartbeat_timeout_ms <= 0:
        return f"heartbeat_timeout_ms={heartbeat_timeout_ms}: expected milliseconds > 0."
    heartbeat = heartbeat_timeout_ms / 1000
    if timeout > heartbeat:
        return None
    return (
        f"timeout={timeout:g} s is at or below the lighthouse's heartbeat timeout "
        f"(heartbeat_timeout_ms={heartbeat_timeout_ms}, {heartbeat:g} s): after a group dies, "
        f"the others' next quorum waits that long for the lighthouse to drop it, so their "
        f"quorum would time out and they would fail instead of training on. The timeout must "
        f"exceed the heartbeat timeout: pass timeout={2 * heartbeat:g} (--ft_timeout; twice "
        f"the heartbeat leaves room for a loaded machine), or start the lighthouse with a "
        f"shorter --heartbeat_timeout_ms and give the groups the same value "
        f"(--ft_heartbeat_timeout_ms)."
    )


def lighthouse_from(plugin: FaultTolerancePlugin, environ: Mapping[str, str]) -> str:
    """The lighthouse address: the plugin's, else $TORCHFT_LIGHTHOUSE, else a clear error."""
    address = plugin.lighthouse or environ.get(TORCHFT_LIGHTHOUSE)
    if not address:
        raise ValueError(
            f"FaultTolerancePlugin(replica_group_id={plugin.replica_group_id}) has no lighthouse: "
            f"pass lighthouse='http://HOST:PORT', `accel launch --ft_lighthouse ADDR`, or set "
            f"{TORCHFT_LIGHTHOUSE}; start one with `accel lighthouse --min_replicas N`."
        )
    return _check_address(address, "lighthouse")


def _check_address(address: str, what: str) -> str:
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{what}={address!r}: expected http://HOST:PORT.")
    return address if "://" in address else f"http://{address}"


@runtime_checkable
class ReplicaGroups(Protocol):
    """A strategy whose process group is one of several replica groups: the Accelerator
    registers its checkpointed objects for healing, lets one group write checkpoints, and
    keeps the groups' step (`run_state`) in each checkpoint, so that a run restarted whole
    from one continues counting."""

    def register_for_healing(self, *objects: Any) -> None: ...

    @property
    def writes_checkpoints(self) -> bool: ...

    def run_state(self) -> dict[str, int]: ...

    def load_run_state(self, state: Mapping[str, int]) -> None: ...


def serve_lighthouse(
    min_replicas: int,
    bind: str = "0.0.0.0:0",
    *,
    join_timeout_ms: int = 1000,
    heartbeat_timeout_ms: int = DEFAULT_HEARTBEAT_TIMEOUT_MS,
    quorum_tick_ms: int = 100,
) -> Any:
    """Start torchft's lighthouse on `bind` (HOST:PORT; port 0 picks one) and return it
    (`.address()` is what every group is given, `.shutdown()` stops it). A quorum forms once
    `min_replicas` groups ask and `join_timeout_ms` has passed without a newcomer (at once
    when every member of the last quorum is back); a group silent for
    `heartbeat_timeout_ms` is dropped."""
    if min_replicas < 1:
        raise ValueError(f"min_replicas={min_replicas}: expected at least 1.")
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bind={bind!r}: expected HOST:PORT (port 0 picks a free one).")
    coordination = _coordination()
    return coordination.LighthouseServer(
        bind=bind,
        min_replicas=min_replicas,
        join_timeout_ms=join_timeout_ms,
        quorum_tick_ms=quorum_tick_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms,
    )


def _coordination() -> Any:
    import_torchft()
    from torchft import coordination

    return coordination


def environ() -> Mapping[str, str]:
    """The process environment (read here only, for TORCHFT_LIGHTHOUSE and torchrun's
    MASTER_ADDR / MASTER_PORT)."""
    return os.environ
