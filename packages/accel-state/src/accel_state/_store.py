"""The store under a process group that torchrun's elastic agent may restart.

torchrun (`--max-restarts N`) restarts every worker when one fails, and its agent keeps
serving the same TCPStore at MASTER_ADDR:MASTER_PORT across attempts. A group built on that
store as it is finds the keys the previous attempt left there (gloo's peer addresses, the
counters of store barriers): the new workers dial dead peers ("Gloo connectFullMesh failed
... Connection refused") or wait for a count that never adds up. Building each attempt's
group under its own key prefix gives it a clean namespace on the same server.
"""

from __future__ import annotations

import datetime

from torch.distributed import PrefixStore, Store, TCPStore

from accel_state._environment import DEFAULT_MASTER_PORT, LaunchInfo

RESTART_PREFIX = "accel_restart_{}/"


def restart_prefix(restart_count: int) -> str:
    """The key prefix of one restart attempt (0: the first start)."""
    return RESTART_PREFIX.format(restart_count)


def attempt_store(info: LaunchInfo, timeout: datetime.timedelta) -> Store:
    """A TCPStore at the launcher's rendezvous address, prefixed for this restart attempt.

    Where the agent serves the store (torchrun's default) every worker is a client; else
    rank 0 hosts it, as torch's own ``env://`` initialization does.
    """
    assert info.master_addr and info.restart_count is not None, "a torchrun worker only"
    port = info.master_port or DEFAULT_MASTER_PORT
    if info.agent_store:
        store = TCPStore(info.master_addr, port, info.world_size, is_master=False, timeout=timeout)
    else:
        store = TCPStore(
            info.master_addr,
            port,
            info.world_size,
            is_master=info.rank == 0,
            timeout=timeout,
            multi_tenant=True,
        )
    return PrefixStore(restart_prefix(info.restart_count), store)
