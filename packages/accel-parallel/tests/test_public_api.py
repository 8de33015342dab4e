import accel_parallel

EXPECTED = [
    "DDPCommunicationHookType",
    "DDPStrategy",
    "DistributedDataParallelKwargs",
    "FSDP2Strategy",
    "FullyShardedDataParallelPlugin",
    "ProcessInfo",
    "SingleDeviceStrategy",
    "Strategy",
    "add_job",
    "deferred_fsync",
    "deferred_write",
    "fsync_dir",
    "fsync_file",
    "no_sync_all",
    "register_comm_hook",
    "save_object",
    "select_strategy",
    "staged_writes",
    "staging",
]


def test_all_is_declared_and_resolves() -> None:
    assert sorted(accel_parallel.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(accel_parallel, name) is not None
