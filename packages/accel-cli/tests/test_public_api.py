import accel_cli


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
