import accel_parallel

EXPECTED = [
    "DDPCommunicationHookType",
    "DDPStrategy",
    "DeepSpeedPlugin",
    "DeepSpeedStrategy",
    "DistributedDataParallelKwargs",
    "DummyOptim",
    "DummyScheduler",
    "FSDP2Strategy",
    "FullyShardedDataParallelPlugin",
    "HfDeepSpeedConfig",
    "MegatronLMPlugin",
    "MeshStrategy",
    "PP_SCHEDULES",
    "ParallelismConfig",
    "PipelineOutput",
    "PipelineStrategy",
    "PipelinedModel",
    "ProcessInfo",
    "ReplicateParallel",
    "SingleDeviceStrategy",
    "StagingBuffers",
    "Strategy",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "add_job",
    "apply_tensor_parallel",
    "deferred_fsync",
    "deferred_write",
    "fsync_dir",
    "fsync_enabled",
    "fsync_file",
    "megatron_settings",
    "merge_fsdp_weights",
    "mesh_local_rank",
    "no_sync_all",
    "parallel_writes",
    "register_comm_hook",
    "resolve_parallelism_config",
    "run_parallel",
    "save_object",
    "select_strategy",
    "staged_writes",
    "staging",
]


def test_all_is_declared_and_resolves() -> None:
    assert sorted(accel_parallel.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(accel_parallel, name) is not None
