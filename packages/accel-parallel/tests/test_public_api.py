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
    "FaultTolerantStrategy",
    "FullyShardedDataParallelPlugin",
    "HfDeepSpeedConfig",
    "JoinsUnevenInputs",
    "MegatronLMPlugin",
    "MeshStrategy",
    "PP_SCHEDULES",
    "ParallelismConfig",
    "PipelineOutput",
    "PipelineStrategy",
    "PipelinedModel",
    "ProcessInfo",
    "ReplicateParallel",
    "ResolvedEngine",
    "SingleDeviceStrategy",
    "StagingBuffers",
    "Strategy",
    "StrategyRequest",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
    "XLASpmdStrategy",
    "XLAStrategy",
    "XLATopology",
    "add_job",
    "apply_tensor_parallel",
    "balanced_stage_map",
    "build_strategy",
    "deferred_fsync",
    "deferred_write",
    "fsync_dir",
    "fsync_enabled",
    "fsync_file",
    "megatron_settings",
    "mend_pipeline_stage",
    "merge_fsdp_weights",
    "mesh_local_rank",
    "no_sync_all",
    "parallel_writes",
    "process_placement",
    "register_comm_hook",
    "register_strategy",
    "registered_strategies",
    "resolve_parallelism_config",
    "resolve_strategy",
    "run_parallel",
    "save_object",
    "staged_writes",
    "staging",
    "unwrap_parallel",
    "xla_requested",
    "xla_topology",
]


def test_all_is_declared_and_resolves() -> None:
    assert sorted(accel_parallel.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(accel_parallel, name) is not None


def test_the_familiar_module_declares_what_accelerates_paths_take() -> None:
    from accel_parallel import checkpoint, familiar

    assert sorted(familiar.__all__) == [
        "DeepSpeedSequenceParallelConfig",
        "GatheredParameters",
        "ParallelismConfig",
        "TorchContextParallelConfig",
        "map_pytorch_optim_to_deepspeed",
        "refuse_recurrent_layers",
    ]
    public = {n for n in vars(familiar) if not n.startswith("_")}
    assert public == set(familiar.__all__)
    assert issubclass(familiar.ParallelismConfig, accel_parallel.ParallelismConfig)
    for name in checkpoint.__all__:
        assert getattr(checkpoint, name) is not None
