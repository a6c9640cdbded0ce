"""d2l_multi: the support package of the chapter "Training on multiple devices with JAX".

With ``import d2l_multi as d2l``, code written for d2l's JAX edition runs unchanged where it
uses the names the chapter needs, with d2l's arguments: ``FashionMNIST`` (``get_dataloader``),
``load_data_fashion_mnist``, ``Animator``, ``Timer``, ``Accumulator``, ``show_images``,
``set_axes``, ``use_svg_display``, ``try_gpu``, ``try_all_gpus``, ``num_gpus``, ``split_batch``
and ``train``. d2l's class framework (``Module``, ``Trainer``, ``DataModule``,
``HyperParameters``) is not offered: the chapter writes its models and loops as functions and
Flax modules. Importing the package loads nothing else: each name is imported from its module
on first use, so JAX's backend has not started (``simulate_devices`` still works) and Flax,
Orbax, Grain and Keras load only when a name that needs them is used.
"""
import importlib

__version__ = "0.1.0"

_MODULES = {  # module: the public names it holds, in the chapter's order
    "smoke_switch": ["SMOKE_ENV", "pick", "shrink", "smoke"],
    "hardware": ["choose_devices", "describe", "describe_machine", "device_mesh", "devices",
                 "cpu_threads", "num_gpus", "set_cpu_compiler_flags", "simulate_devices", "size_cpu_thread_pool",
                 "try_all_gpus", "try_gpu"],
    "utils": ["Accumulator", "Timer", "check_positive", "max_difference", "time_call",
              "validated"],
    "plot": ["Animator", "set_axes", "show_images", "use_svg_display"],
    "data": ["DATA_ENV", "DataError", "FashionMNIST", "MNIST", "cache_dir", "dataset_dir",
             "load_data_fashion_mnist", "load_dataset", "read_idx_gz"],
    # LeNet from scratch, allreduce, data parallelism by hand
    "models": ["avg_pool2d", "conv2d", "conv2d_im2col", "evaluate_accuracy",
               "init_lenet_params", "lenet", "loss_fn", "num_correct"],
    "collectives": ["allreduce", "check_allreduce", "check_replicate", "replicate",
                    "ring_allreduce", "unreplicate"],
    "parallel": ["check_divisible", "check_finite_loss", "check_labels", "check_split_batch",
                 "check_train", "device_sgd_step", "pmap_sgd_step", "split_batch", "train",
                 "train_batch"],
    # jit + shardings, shard_map, Flax, Keras 3
    "hlo": ["COLLECTIVE_OP", "CollectiveOp", "HLO_BYTES", "collective_ops"],
    "concise": ["COLLECTIVES", "check_hlo_text", "check_shard_map_step", "check_spec",
                "check_step_optimizer", "check_train_step", "count_collectives",
                "make_shard_map_step", "make_train_step", "shard", "shard_batch"],
    "flax_models": ["CNN", "LinenCNN", "LinenResNet", "LinenResNet18", "LinenResidual",
                    "Residual", "ResNet", "ResNet18", "apply_model", "check_arch",
                    "check_cnn_from_linen", "check_linen_layers", "check_train_nnx",
                    "cnn_from_linen", "create_train_state",
                    "cross_entropy_loss", "evaluate_nnx", "jit_train_step", "nnx_train_step",
                    "num_correct_nnx", "train_nnx", "update_model"],
    "keras_models": ["keras_assign_state", "keras_convnet", "keras_train_state",
                     "make_keras_train_step"],
    # collectives and the alpha-beta model; predicting the data-parallel step
    "cost_model": ["COLLECTIVE_NAMES", "H100_MODELS", "bus_bandwidth",
                   "check_alpha_beta_inputs", "check_bus_bandwidth",
                   "check_collective_inputs", "check_cost_analysis", "check_ring_per_hop",
                   "check_step_time_inputs", "check_time_collective", "collective_loop",
                   "cpu_time_call", "fit_alpha_beta", "measure_collectives", "measure_compute",
                   "predict_step_time", "ring_per_hop", "step_cost", "time_collective"],
    # mixed precision
    "mixed_precision": ["allreduce_bytes", "check_allreduce_bytes",
                        "check_float_dtype", "check_lost_updates", "check_mixed_step",
                        "check_train_sharded", "lost_updates", "make_mixed_precision_step",
                        "mixed_loss_fn", "partitioned_hlo", "train_sharded"],
    # ensembles
    "ensemble": ["check_ensemble_size", "create_ensemble_state", "create_stacked_ensemble",
                 "ensemble_step", "map_members", "member_step", "stacked_train_step",
                 "train_ensemble"],
    # sharded matrix products
    "matmul": ["ring_bytes", "run_sharded"],
    # memory and meshes
    "memory": ["OPTIMIZER_STATE_COPIES", "check_training_memory",
               "check_transformer_footprint", "count_params",
               "saved_activation_bytes", "training_memory", "transformer_footprint"],
    "transformer": ["CausalSelfAttention", "MLP", "TransformerBlock", "TransformerLM",
                    "lm_loss", "logical_constraint", "logical_init", "logical_linear"],
    "sharding": ["abstract_state", "bytes_per_device", "check_layout",
                 "check_model_layout", "check_rules",
                 "create_sharded", "use_sharding"],
    # FSDP and tensor parallelism
    "text": ["TINY_TEXT", "CharCorpus"],
    "strategies": ["LOGICAL_AXES", "STRATEGIES", "lm_train_step", "reshard", "shard_tokens",
                   "sharding_rules"],
    # pipeline parallelism
    "pipeline_parallel": ["BACKWARD", "FORWARD", "IDLE", "KIND", "bubble_fraction",
                          "check_kinds", "check_orders", "check_pipeline_step", "check_table",
                          "gpipe_order", "in_flight", "init_residual_mlp", "mse",
                          "one_f_one_b_order", "pipeline_schedule", "pipeline_step",
                          "residual_mlp", "show_schedule", "stage_pass", "stage_program"],
    # overlapping communication with computation
    "schedule": ["PLUMBING", "async_pairs", "check_hlo_entry", "collective_slack",
                 "hlo_schedule", "operand_names", "plot_schedule"],
    # checkpoints and input pipelines
    "checkpoint": ["CheckpointError", "abstract_like", "check_finite", "check_fits",
                   "check_layouts", "check_optimizer", "check_specs",
                   "checkpoint_manager", "lenet_specs", "restore_checkpoint", "save_checkpoint",
                   "saved_steps", "sharded_train_state", "state_specs", "train_steps",
                   "wait_for_saves"],
    "input_pipeline": ["ArraySource", "CheckedIterator", "CheckedPipeline", "check_loader_inputs",
                       "grain_loader"],
    # several processes
    "distributed": ["check_batch_inputs", "check_device_counts", "check_devices_per_process",
                    "check_mesh_and_arrays", "detect_cluster", "exit_worker", "global_batch",
                    "initialize_distributed", "launcher_settings", "process_batches"],
    # exercises that check themselves (docs/classroom.md)
    "exercises": ["CHECKS", "CheckFailed", "verify_1f1b", "verify_all_gather",
                  "verify_alpha_beta", "verify_batch_stats", "verify_broadcast",
                  "verify_bus_bandwidth", "verify_checkpoint_interval", "verify_cross_entropy",
                  "verify_ensemble_average", "verify_exact_resume", "verify_flops_per_byte",
                  "verify_fsdp_spec", "verify_gpipe_bubble", "verify_grad_accumulation",
                  "verify_jit_data_parallel", "verify_keras_step", "verify_logical_rules",
                  "verify_master_weights", "verify_megatron_specs", "verify_mesh_layout",
                  "verify_nnx_step", "verify_overlapped_step", "verify_pmean_step",
                  "verify_process_rows", "verify_reduce_scatter", "verify_remat_memory",
                  "verify_restore_target", "verify_ring_allreduce", "verify_ring_bytes",
                  "verify_sgd_update", "verify_shard_map_grad", "verify_split_batch",
                  "verify_step_time", "verify_training_memory"],
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name):
    """Import ``name``'s module on first use and bind all of that module's public names."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'd2l_multi' has no attribute {name!r}")
    loaded = importlib.import_module(f".{module}", __name__)
    for other in _MODULES[module]:
        globals()[other] = getattr(loaded, other)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(__all__))
