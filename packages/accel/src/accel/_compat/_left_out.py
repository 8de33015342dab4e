"""The names of features accel leaves out, each defined once: importable, failing on use."""

from accel._compat._unsupported import (
    FP8_INTERNAL,
    FSDP_INTERNAL,
    LAUNCH_ENV,
    MEGATRON,
    MSAMP,
    SAGEMAKER,
    TPU_INSTALL,
    TPU_POD,
    unsupported,
)

AbstractTrainStep = unsupported("AbstractTrainStep", *MEGATRON)
BertTrainStep = unsupported("BertTrainStep", *MEGATRON)
GPTTrainStep = unsupported("GPTTrainStep", *MEGATRON)
MSAMPRecipeKwargs = unsupported("MSAMPRecipeKwargs", *MSAMP)
MegatronLMDummyDataLoader = unsupported("MegatronLMDummyDataLoader", *MEGATRON)
MegatronLMDummyScheduler = unsupported("MegatronLMDummyScheduler", *MEGATRON)
PrepareForLaunch = unsupported("PrepareForLaunch", *LAUNCH_ENV)
T5TrainStep = unsupported("T5TrainStep", *MEGATRON)
add_model_config_to_megatron_parser = unsupported("add_model_config_to_megatron_parser", *MEGATRON)
apply_fp8_autowrap = unsupported("apply_fp8_autowrap", *FP8_INTERNAL)
avg_losses_across_data_parallel_group = unsupported(
    "avg_losses_across_data_parallel_group", *MEGATRON
)
contextual_fp8_autocast = unsupported("contextual_fp8_autocast", *FP8_INTERNAL)
convert_model = unsupported("convert_model", *FP8_INTERNAL)
ensure_weights_retied = unsupported("ensure_weights_retied", *FSDP_INTERNAL)
fsdp2_apply_ac = unsupported("fsdp2_apply_ac", *FSDP_INTERNAL)
fsdp2_load_full_state_dict = unsupported("fsdp2_load_full_state_dict", *FSDP_INTERNAL)
fsdp2_prepare_model = unsupported("fsdp2_prepare_model", *FSDP_INTERNAL)
fsdp2_switch_optimizer_parameters = unsupported("fsdp2_switch_optimizer_parameters", *FSDP_INTERNAL)
install_xla = unsupported("install_xla", *TPU_INSTALL)
prepare_deepspeed_cmd_env = unsupported(
    "prepare_deepspeed_cmd_env",
    LAUNCH_ENV[0],
    "`accel launch --use_deepspeed` builds the DeepSpeed command (see `accel launch --dry-run`).",
)
prepare_sagemager_args_inputs = unsupported("prepare_sagemager_args_inputs", *SAGEMAKER)
sagemaker_launcher = unsupported("sagemaker_launcher", *SAGEMAKER)
tpu_pod_launcher = unsupported("tpu_pod_launcher", *TPU_POD)

# Megatron-LM's engine and its model-config parsers.
MegatronEngine = unsupported("MegatronEngine", *MEGATRON)
MegatronLMOptimizerWrapper = unsupported("MegatronLMOptimizerWrapper", *MEGATRON)
MegatronLMSchedulerWrapper = unsupported("MegatronLMSchedulerWrapper", *MEGATRON)
finish_mpu_init = unsupported("finish_mpu_init", *MEGATRON)
gather_across_data_parallel_groups = unsupported("gather_across_data_parallel_groups", *MEGATRON)
initialize = unsupported("initialize", *MEGATRON)
model_provider_func = unsupported("model_provider_func", *MEGATRON)
prepare_model_optimizer_scheduler = unsupported("prepare_model_optimizer_scheduler", *MEGATRON)
prepare_optimizer = unsupported("prepare_optimizer", *MEGATRON)
prepare_scheduler = unsupported("prepare_scheduler", *MEGATRON)
parse_bert_config = unsupported("parse_bert_config", *MEGATRON)
parse_gpt2_config = unsupported("parse_gpt2_config", *MEGATRON)
parse_t5_config = unsupported("parse_t5_config", *MEGATRON)
parse_llama_config = unsupported("parse_llama_config", *MEGATRON)
parse_glm4_moe_config = unsupported("parse_glm4_moe_config", *MEGATRON)
MODEL_CONFIGS_TO_MEGATRON_PARSERS = {
    "megatron-bert": parse_bert_config,
    "gpt2": parse_gpt2_config,
    "t5": parse_t5_config,
    "llama": parse_llama_config,
    "glm4_moe": parse_glm4_moe_config,
}
