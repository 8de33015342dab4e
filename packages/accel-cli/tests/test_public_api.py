import accel_cli
import accel_cli.familiar


def test_all_is_pinned_and_resolves():
    assert accel_cli.__all__ == [
        "ENV_ACCEL_CONFIG",
        "ENV_CONFIG_FILE",
        "ConfigError",
        "ConfigFile",
        "LaunchConfig",
        "Resolution",
        "build_command",
        "build_env",
        "default_config_path",
        "default_file_values",
        "find_config_file",
        "free_port",
        "load_config_file",
        "resolve_launch_config",
        "with_rendezvous",
        "write_config_file",
    ]
    for name in accel_cli.__all__:
        assert getattr(accel_cli, name) is not None


def test_entry_point_is_callable():
    from accel_cli.main import main

    assert callable(main)


def test_familiar_all_is_pinned_and_resolves():
    """What the umbrella's familiar paths (accel.commands.*, accel.utils.launch, ...)
    re-export; the work lives in accel-cli's private modules."""
    assert accel_cli.familiar.__all__ == [
        "ARGUMENT_KEY_MAPPING",
        "ARGUMENT_VALUE_MAPPING",
        "DEEPSPEED_MULTINODE_LAUNCHERS",
        "DYNAMO_BACKENDS",
        "FSDP2_STATE_DICT_TYPE",
        "SAGEMAKER_PARALLEL_EC2_INSTANCES",
        "SAGEMAKER_PYTHON_VERSION",
        "SAGEMAKER_PYTORCH_VERSION",
        "SAGEMAKER_TRANSFORMERS_VERSION",
        "TORCH_DYNAMO_MODES",
        "BaseConfig",
        "BulletMenu",
        "ClusterConfig",
        "ComputeEnvironment",
        "ConversionStatus",
        "CustomArgumentGroup",
        "CustomArgumentParser",
        "CustomHelpFormatter",
        "SageMakerConfig",
        "SubcommandHelpFormatter",
        "add_timm_hub_prefix",
        "build_parser",
        "check_has_model",
        "clean_option",
        "config_default_command",
        "config_questionnaire_command",
        "config_update_command",
        "convert_config_to_fsdp2",
        "convert_nargs_to_dict",
        "create_ascii_table",
        "create_empty_model",
        "env_info",
        "estimate_memory_command",
        "estimate_training_usage",
        "execute_subprocess_async",
        "gather_data",
        "get_cluster_input",
        "get_config_parser",
        "get_sagemaker_input",
        "get_user_input",
        "launch_command",
        "launch_command_parser",
        "load_config",
        "load_config_from_file",
        "merge_weights_command",
        "path_in_accelerate_package",
        "prepare_multi_gpu_env",
        "prepare_simple_launcher_cmd_env",
        "prepare_tpu",
        "test_command",
        "to_fsdp2_command",
        "tpu_command_launcher",
        "tpu_command_parser",
        "tpu_launcher",
        "update_config",
        "validate_launch_command",
        "verify_on_hub",
    ]
    for name in accel_cli.familiar.__all__:
        value = getattr(accel_cli.familiar, name)
        assert value is not None
        module = getattr(value, "__module__", None)
        if module is not None and callable(value):  # defined in a private module, not here
            assert module.startswith("accel_cli._"), (name, module)
    public = {n for n in vars(accel_cli.familiar) if not n.startswith("_")}
    assert public == set(accel_cli.familiar.__all__)
