"""The names of features accel leaves out, each defined once: importable, failing on use."""

from accel._compat._unsupported import (
    BNB,
    DEEPSPEED,
    FP8_INTERNAL,
    FSDP_INTERNAL,
    LAUNCH_ENV,
    MEGATRON,
    MSAMP,
    SAGEMAKER,
    TPU,
    unsupported,
)

AbstractTrainStep = unsupported("AbstractTrainStep", *MEGATRON)
BertTrainStep = unsupported("BertTrainStep", *MEGATRON)
BnbQuantizationConfig = unsupported("BnbQuantizationConfig", *BNB)
DeepSpeedSequenceParallelConfig = unsupported("DeepSpeedSequenceParallelConfig", *DEEPSPEED)
GPTTrainStep = unsupported("GPTTrainStep", *MEGATRON)
GatheredParameters = unsupported("GatheredParameters", *DEEPSPEED)
MSAMPRecipeKwargs = unsupported("MSAMPRecipeKwargs", *MSAMP)
MegatronLMDummyDataLoader = unsupported("MegatronLMDummyDataLoader", *MEGATRON)
MegatronLMDummyScheduler = unsupported("MegatronLMDummyScheduler", *MEGATRON)
MegatronLMPlugin = unsupported("MegatronLMPlugin", *MEGATRON)
PrepareForLaunch = unsupported("PrepareForLaunch", *LAUNCH_ENV)
SageMakerDistributedType = unsupported("SageMakerDistributedType", *SAGEMAKER)
T5TrainStep = unsupported("T5TrainStep", *MEGATRON)
add_model_config_to_megatron_parser = unsupported("add_model_config_to_megatron_parser", *MEGATRON)
apply_fp8_autowrap = unsupported("apply_fp8_autowrap", *FP8_INTERNAL)
avg_losses_across_data_parallel_group = unsupported(
    "avg_losses_across_data_parallel_group", *MEGATRON
)
compile_regions_deepspeed = unsupported("compile_regions_deepspeed", *DEEPSPEED)
compile_regions_fsdp2 = unsupported("compile_regions_fsdp2", *FSDP_INTERNAL)
contextual_fp8_autocast = unsupported("contextual_fp8_autocast", *FP8_INTERNAL)
convert_model = unsupported("convert_model", *FP8_INTERNAL)
disable_fsdp_ram_efficient_loading = unsupported(
    "disable_fsdp_ram_efficient_loading", *FSDP_INTERNAL
)
enable_fsdp_ram_efficient_loading = unsupported("enable_fsdp_ram_efficient_loading", *FSDP_INTERNAL)
ensure_weights_retied = unsupported("ensure_weights_retied", *FSDP_INTERNAL)
filter_first_and_last_linear_layers = unsupported(
    "filter_first_and_last_linear_layers", *FP8_INTERNAL
)
fsdp2_apply_ac = unsupported("fsdp2_apply_ac", *FSDP_INTERNAL)
fsdp2_canonicalize_names = unsupported("fsdp2_canonicalize_names", *FSDP_INTERNAL)
fsdp2_load_full_state_dict = unsupported("fsdp2_load_full_state_dict", *FSDP_INTERNAL)
fsdp2_prepare_model = unsupported("fsdp2_prepare_model", *FSDP_INTERNAL)
fsdp2_switch_optimizer_parameters = unsupported("fsdp2_switch_optimizer_parameters", *FSDP_INTERNAL)
get_fsdp2_grad_scaler = unsupported("get_fsdp2_grad_scaler", *FSDP_INTERNAL)
has_4bit_bnb_layers = unsupported("has_4bit_bnb_layers", *BNB)
install_xla = unsupported("install_xla", *TPU)
load_and_quantize_model = unsupported("load_and_quantize_model", *BNB)
prepare_deepspeed_cmd_env = unsupported("prepare_deepspeed_cmd_env", *DEEPSPEED)
prepare_multi_gpu_env = unsupported("prepare_multi_gpu_env", *LAUNCH_ENV)
prepare_sagemager_args_inputs = unsupported("prepare_sagemager_args_inputs", *SAGEMAKER)
prepare_simple_launcher_cmd_env = unsupported("prepare_simple_launcher_cmd_env", *LAUNCH_ENV)
prepare_tpu = unsupported("prepare_tpu", *TPU)
tpu_command_parser = unsupported("tpu_command_parser", *TPU)
