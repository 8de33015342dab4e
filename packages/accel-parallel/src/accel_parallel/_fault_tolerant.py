"""Data parallel over replica groups that survive each other's failures (torchft).

Inside a group (one `accel launch`) gradients are averaged by plain DDP; across groups by
torchft's Manager, per optimizer step: the step's quorum is asked for at its first training
forward (or at `optimizer.step()` if none came first) and answered while the forward and
backward run (torchft's asynchronous quorum: the lighthouse's round trip is off the step's
path); the gradients are averaged over the groups in the quorum when the optimizer steps; the
optimizer steps only if every rank of the group commits (a refused commit skips the step, as
an fp16 overflow does). A dead group costs the others one refused step and a quorum without
it.

A process's first quorum is waited for before its first forward, so that a group that starts
or rejoins is healed from a live peer before it computes anything (every group starts from
the first group's state). A group that is behind its peers at a quorum (it rejoined, or its
own commit was refused while theirs passed) does not take part in that step: torchft counts
only the groups at the newest step, so the average is theirs (its gradients are zeroed, not
diluted into it), and it loads a peer's state before its optimizer steps with that average.
A group alone in its quorum skips the cross-group average (there is nothing to average).
The semi-synchronous modes keep torchft's synchronous quorum, which its DiLoCo requires.
"""

from __future__ import annotations

import contextlib
import copy
import ipaddress
import os
import socket
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import torch
from torch import nn

from accel_parallel._ddp import DDPStrategy
from accel_parallel._registry import StrategyRequest, register_strategy
from accel_parallel._strategy import ProcessInfo, Strategy
from accel_parallel.fault_tolerance import (
    FaultTolerancePlugin,
    environ,
    import_torchft,
    lighthouse_from,
)
from accel_state.hosts import (
    ENV_GLOO_SOCKET_IFNAME,
    address_toward,
    interface_of,
    socket_interface_env,
)

_REPLICA_PREFIX = "accel_replica_group_"


class FaultTolerantStrategy(Strategy):
    """DDP inside a replica group, torchft's quorum, average and commit across groups.

    It holds the group's data-parallel engine (`inner`, a `DDPStrategy`), which wraps the
    model and owns `no_sync` and `join` inside the group; the manager it starts, `close`
    (`end_training`, or interpreter exit) stops."""

    name = "fault_tolerant"
    supports_no_sync = True
    reshardable = True  # full (replicated) states: they load on any number of processes

    def __init__(
        self,
        info: ProcessInfo,
        plugin: FaultTolerancePlugin,
        *,
        lighthouse: str,
        ddp_kwargs: Any = None,
        clip_norm: float | None = None,
    ) -> None:
        import_torchft()  # the missing extra is named when the strategy is chosen
        super().__init__(info, clip_norm=clip_norm)
        self.inner = DDPStrategy(info, ddp_kwargs, clip_norm=clip_norm)
        self.plugin = plugin
        self.lighthouse = lighthouse
        self.manager: Any = None
        self._closed = False
        self._models: list[nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._schedulers: list[Any] = []
        self._objects: list[Any] = []
        self._quorum_open = False
        self._started = False
        self._semi_sync: Any = None
        self._store: Any = None

    # -- data: every group reads its own shard (groups x ranks) ----------------------------
    @property
    def data_parallel_size(self) -> int:
        return self.plugin.num_replica_groups * self.info.num_processes

    @property
    def data_parallel_rank(self) -> int:
        return self.plugin.replica_group_id * self.info.num_processes + self.info.process_index

    # -- preparing -------------------------------------------------------------------------
    def begin_prepare(self, objects: Any, **kwargs: Any) -> None:
        self._schedulers += [
            o for o in objects if isinstance(o, torch.optim.lr_scheduler.LRScheduler)
        ]

    def prepare(
        self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]
    ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
        if len(self._models) + len(models) > 1 or len(self._optimizers) + len(optimizers) > 1:
            raise ValueError(
                f"fault tolerance across replica groups trains one model with one optimizer "
                f"(one quorum and one commit per optimizer step); this run prepares "
                f"{len(self._models) + len(models)} models and "
                f"{len(self._optimizers) + len(optimizers)} optimizers."
            )
        wrapped = [self.wrap_model(m) for m in models]
        for model in wrapped:
            model.register_forward_pre_hook(self._before_forward)
        self._models += wrapped
        self._optimizers += optimizers
        if models and self.manager is None:
            self.manager = self._make_manager()
            self.close_at_exit()
        return wrapped, optimizers

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """DDP inside the group (the inner engine's), the model only moved in a group of one."""
        if self.info.num_processes > 1:
            return self.inner.wrap_model(model)
        return self.move_model(model)

    @contextlib.contextmanager
    def keeping_placement(self) -> Iterator[None]:
        with super().keeping_placement(), self.inner.keeping_placement():
            yield

    def memory_engine(self) -> tuple[str, dict[str, Any]]:
        return self.inner.memory_engine()

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.inner.no_sync(model)

    def sync_in_backward(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.inner.sync_in_backward(model)

    def join(
        self, joinables: list[Any], *, enable: bool
    ) -> contextlib.AbstractContextManager[None]:
        """The inner engine's `Join` over the group's DDP models and optimizers."""
        return self.inner.join(joinables, enable=enable)

    def register_for_healing(self, *objects: Any) -> None:
        """A (re)joining group loads these objects' state from a live peer."""
        self._objects += objects

    @property
    def writes_checkpoints(self) -> bool:
        """Whether this group writes `save_state`'s folders: the lowest group id of the last
        quorum (group 0 before any quorum), so one group writes while any lives."""
        ranks = getattr(getattr(self.manager, "_pg", None), "_global_ranks", None)
        if not ranks:
            return self.plugin.replica_group_id == 0
        lowest = min(ranks) // self.info.num_processes
        return lowest == self.plugin.replica_group_id

    @property
    def current_step(self) -> int:
        """The run's step: optimizer steps committed by the groups (a healed group's first
        is its peers'). Schedulers, metrics and checkpoints follow it."""
        return 0 if self.manager is None else int(self.manager.current_step())

    def run_state(self) -> dict[str, int]:
        """The manager's step and committed batches, for a checkpoint ({} before prepare)."""
        return {} if self.manager is None else dict(self.manager.state_dict())

    def load_run_state(self, state: Mapping[str, int]) -> None:
        """Continue counting from a checkpoint's step (a run restarted whole: every group
        loads it before its first quorum, so none is healed for being behind)."""
        if state and self.manager is not None:
            self.manager.load_state_dict(
                {"step": int(state["step"]), "batches_committed": int(state["batches_committed"])}
            )

    # -- the manager -------------------------------------------------------------------------
    def _make_manager(self) -> Any:
        torchft = import_torchft()
        from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

        timeout = timedelta(seconds=self.plugin.timeout)
        env = environ()
        addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        if addr is None or port is None:  # one process, started without torchrun: our store
            self._store = torch.distributed.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False
            )
            addr, port = "127.0.0.1", str(self._store.port)
        # the other groups reach this one's store, manager and checkpoint server by the
        # address that faces the lighthouse (a group of one machine has a loopback store, and
        # the host name may resolve to 127.0.0.1); gloo's connections across groups too
        host = _address_toward(self.lighthouse)
        if host is not None:
            _gloo_interface(host, env)
            addr = host if ipaddress.ip_address(_resolve(addr)).is_loopback else addr
        from accel_state import device_entry  # torchft's groups: NCCL or Gloo

        nccl = device_entry(self.device).default_backend() == "nccl"
        pg = ProcessGroupNCCL(timeout) if nccl else ProcessGroupGloo(timeout)
        try:
            manager = torchft.Manager(
                pg=pg,
                load_state_dict=self._load_healed,
                state_dict=self._healing_state,
                min_replica_size=self.plugin.min_replica_groups,
                use_async_quorum=self.plugin.semi_sync is None,
                timeout=timeout,
                quorum_timeout=timeout,
                connect_timeout=timeout,
                rank=self.info.process_index,
                world_size=self.info.num_processes,
                store_addr=addr,
                store_port=int(port),
                lighthouse_addr=self.lighthouse,
                hostname=host or socket.gethostname(),
                checkpoint_transport=_checkpoint_transport(timeout, host),
                replica_id=f"{_REPLICA_PREFIX}{self.plugin.replica_group_id}",
                init_sync=self.plugin.semi_sync is None,
            )
        except Exception as err:
            raise RuntimeError(
                f"replica group {self.plugin.replica_group_id} could not reach the lighthouse "
                f"at {self.lighthouse} within timeout={self.plugin.timeout} s ({err}). Start one "
                f"with `accel lighthouse --min_replicas N` and pass the address it prints."
            ) from err
        manager._max_retries = None
        return manager

    def _healing_state(self) -> dict[str, Any]:
        # a snapshot: the peer that heals reads it while this group trains on
        state = {
            "models": [self.unwrap_model(m).state_dict() for m in self._models],
            "optimizers": [o.state_dict() for o in self._optimizers],
            "schedulers": [s.state_dict() for s in self._schedulers],
            "objects": [o.state_dict() for o in self._objects],
        }
        return copy.deepcopy(state)

    def _load_healed(self, state: Mapping[str, Any]) -> None:
        for model, s in zip(self._models, state["models"]):
            self.unwrap_model(model).load_state_dict(s)
        for optimizer, s in zip(self._optimizers, state["optimizers"]):
            optimizer.load_state_dict(s)
        for scheduler, s in zip(self._schedulers, state["schedulers"]):
            scheduler.load_state_dict(s)
        for obj, s in zip(self._objects, state["objects"]):
            obj.load_state_dict(s)

    # -- the step ----------------------------------------------------------------------------
    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if module.training and torch.is_grad_enabled():
            self._start()
            if self.plugin.semi_sync is None:
                self._open_quorum()

    def _start(self) -> None:
        """The first quorum, waited for and its healing applied before anything is computed
        (every group from one state: torchft heals the others from the first group at step
        0, or a rejoining group from a peer); semi-synchronous: the wrapper, whose first sync
        takes the first quorum."""
        if self._started:
            return
        self._started = True
        if self.plugin.semi_sync is None:
            self._open_quorum()
            self._wait_quorum(heal=True)
        else:  # groups start from one seed; its first sync heals only a rejoining group
            self._semi_sync = self._make_semi_sync()

    def _open_quorum(self) -> None:
        """Ask for this step's quorum; torchft answers it on its own thread."""
        if self._quorum_open:
            return
        self.manager.start_quorum()
        self._quorum_open = True

    def _wait_quorum(self, *, heal: bool = False) -> None:
        """Wait for the step's quorum. `heal`: load a peer's state now if the quorum heals
        this group (what torchft's synchronous quorum does; otherwise its commit does)."""
        manager = self.manager
        manager.wait_quorum()
        if heal and manager._healing:
            manager._apply_pending_state_dict()
            manager._healing = False
        self._check_quorum()

    def _quorum_ranks(self) -> list[int]:
        """The global ranks of this rank's peers in the last quorum (one per group)."""
        return list(getattr(self.manager._pg, "_global_ranks", None) or [])

    def _check_quorum(self) -> None:
        ranks = self._quorum_ranks()
        if len(set(ranks)) != len(ranks):
            twice = sorted({r // self.info.num_processes for r in ranks if ranks.count(r) > 1})
            raise ValueError(
                f"two replica groups run with replica_group_id={twice[0]}: each `accel launch` "
                f"needs its own id, 0 .. {self.plugin.num_replica_groups - 1} "
                f"(--ft_replica_group_id)."
            )

    def _make_semi_sync(self) -> Any:
        from torchft.local_sgd import DiLoCo, LocalSGD

        model, optimizer = self.unwrap_model(self._models[0]), self._optimizers[0]
        every = self.plugin.sync_every
        if self.plugin.semi_sync == "local_sgd":
            wrapper = LocalSGD(self.manager, model, optimizer, sync_every=every)
        else:
            make = self.plugin.outer_optimizer or _default_outer_optimizer
            wrapper = DiLoCo(
                self.manager, [model], optimizer, make(model.parameters()), sync_every=every,
                pin_memory=False,
            )  # fmt: skip
        return wrapper.__enter__()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, precision: Any) -> bool:
        self._start()
        if self.plugin.semi_sync is not None:  # torchft's hooks on `optimizer` sync every k
            return super().optimizer_step(optimizer, precision)
        self._open_quorum()
        self._wait_quorum()
        self._average_gradients(optimizer)
        self._quorum_open = False
        if not self.manager.should_commit():
            return False
        return super().optimizer_step(optimizer, precision)

    def _average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients over the groups in the quorum (one flat all-reduce per
        dtype). A group alone in its quorum (a run of one group, a survivor) skips it: its
        gradients are the average already, and the flat buffer's copies in and out are two
        passes over every gradient before the commit. Alone means no other group in the
        quorum's process group, not one participant: a healing peer takes part in the
        all-reduce without being counted."""
        if self.manager.errored() is None and len(self._quorum_ranks()) == 1:
            return
        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.manager.allreduce(flat).wait()
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def close(self) -> None:
        """Stop what this strategy started: the semi-synchronous wrapper's hooks, then
        torchft's manager (its manager server, lighthouse client, checkpoint server and
        threads). `end_training` calls it, and interpreter exit does; once."""
        if self._closed:
            return
        self._closed = True
        self.forget_close_at_exit()
        if self._semi_sync is not None:
            self._semi_sync.__exit__(None, None, None)
        if self.manager is not None:
            self.manager.shutdown(wait=False)

    shutdown = close  # the name scripts used before end_training stopped it


def _resolve(host: str) -> str:
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]


def _address_toward(lighthouse: str) -> str | None:
    """This host's address on the route to the lighthouse; None when the lighthouse is on
    loopback, or cannot be reached (the manager's connect then says so)."""
    local = address_toward(urlsplit(lighthouse).hostname or "")
    return None if local is None or ipaddress.ip_address(local).is_loopback else local


def _gloo_interface(address: str, env: Mapping[str, str]) -> None:
    """Point gloo at the interface holding `address` (accel_state.hosts' rule) unless the user
    or the launcher chose one already: os.environ is written only then."""
    os.environ.update(socket_interface_env(interface_of(address), env, (ENV_GLOO_SOCKET_IFNAME,)))


def _checkpoint_transport(timeout: timedelta, host: str | None) -> Any:
    """torchft's HTTP checkpoint server, advertised at `host` (torchft's own advertises the
    host name, which other machines may not resolve to this one)."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Transport(HTTPTransport):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{host}:{port}/checkpoint/"

    return HTTPTransport(timeout, num_chunks=0) if host is None else Transport(timeout, 0)


def _default_outer_optimizer(params: Any) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer from its paper: SGD, lr 0.7, Nesterov momentum 0.9."""
    return torch.optim.SGD(params, lr=0.7, momentum=0.9, nesterov=True)


def _plugin_of(request: StrategyRequest) -> FaultTolerancePlugin | None:
    if request.fault_tolerance is not None:
        return request.fault_tolerance
    section = request.launch_section("fault_tolerance_config")
    return FaultTolerancePlugin.from_launch(section) if section else None


def _build(request: StrategyRequest) -> FaultTolerantStrategy:
    plugin = _plugin_of(request)
    if plugin is None:
        raise ValueError(
            "strategy 'fault_tolerant' needs a FaultTolerancePlugin: "
            "Accelerator(fault_tolerance=FaultTolerancePlugin(replica_group_id=..., "
            "num_replica_groups=...)) or `accel launch --ft_replica_group_id I "
            "--ft_num_replica_groups N --ft_lighthouse ADDR`."
        )
    for given in ("fsdp_plugin", "deepspeed_plugin", "parallelism_config"):
        if getattr(request, given) is not None:
            raise ValueError(
                f"fault tolerance across replica groups runs DDP inside each group; this run "
                f"also asks for {given} ({getattr(request, given)!r}), which it does not "
                f"compose with yet. Drop one of them."
            )
    return FaultTolerantStrategy(
        request.info,
        plugin,
        lighthouse=lighthouse_from(plugin, environ()),
        ddp_kwargs=request.ddp_kwargs,
        clip_norm=request.clip_norm,
    )


register_strategy(
    FaultTolerantStrategy.name,
    _build,
    claims=lambda request: 70 if _plugin_of(request) is not None else None,
)
