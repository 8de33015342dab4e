import accel_bigmodel

EXPECTED = [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "AlignDevicesHook",
    "CheckpointReader",
    "CpuOffload",
    "CustomDtype",
    "LayerwiseCastingHook",
    "LoadResult",
    "ModelHook",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "align_module_device",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "attach_layerwise_casting_hooks",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_device_same",
    "check_tied_parameters_on_same_device",
    "checkpoint_files",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "extract_submodules_state_dict",
    "fallback_allocate",
    "find_device",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_module_leaves",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "get_state_dict_from_offload",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "id_tensor_storage",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "load_offload_index",
    "load_offloaded_weight",
    "load_state_dict",
    "load_weights_file",
    "named_module_tensors",
    "offload_state_dict",
    "offload_weight",
    "read_safetensors_header",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "resolve_device_map",
    "retie_parameters",
    "save_offload_index",
    "save_sharded_weights",
    "save_weights_file",
    "send_to_device",
    "set_module_tensor_to_device",
]


def test_all_is_the_declared_api():
    assert accel_bigmodel.__all__ == EXPECTED
    assert len(set(EXPECTED)) == len(EXPECTED)  # in ruff's order: constants, classes, functions


def test_every_name_resolves():
    for name in accel_bigmodel.__all__:
        assert getattr(accel_bigmodel, name) is not None, name


def test_import_does_not_touch_cuda_or_siblings():
    import subprocess
    import sys

    code = (
        "import sys, accel_bigmodel, torch\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert not any(m.startswith('accel_state') for m in sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
