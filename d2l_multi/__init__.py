"""d2l_multi: the support package of the chapter "Training on multiple devices with JAX".

Names follow d2l's, so ``import d2l_multi as d2l`` runs code written for ``d2l.jax``. Importing
the package loads nothing else: each name is imported from its module on first use, so JAX's
backend has not started (``simulate_devices`` still works) and Flax, Orbax, Grain and Keras
load only when a name that needs them is used.
"""
import importlib

__version__ = "0.1.0"

_MODULES = {  # module: the public names it holds, in the chapter's order
    "smoke_switch": ["SMOKE_ENV", "pick", "shrink", "smoke"],
    "hardware": ["choose_devices", "describe", "describe_machine", "device_mesh", "devices",
                 "num_gpus", "set_cpu_compiler_flags", "simulate_devices", "size_cpu_thread_pool",
                 "try_all_gpus", "try_gpu"],
    "utils": ["Accumulator", "Timer", "check_positive", "max_difference", "time_call",
              "validated"],
    "plot": ["Animator", "set_axes", "show_images", "use_svg_display"],
    "data": ["DATA_ENV", "DataError", "FashionMNIST", "MNIST", "cache_dir", "dataset_dir",
             "load_data_fashion_mnist", "load_dataset", "read_idx_gz"],
    # LeNet from scratch, allreduce, data parallelism by hand
    "models": ["avg_pool2d", "conv2d", "conv2d_im2col", "evaluate_accuracy",
               "init_lenet_params", "lenet", "loss_fn", "num_correct"],
    "collectives": ["allreduce", "replicate", "ring_allreduce", "unreplicate"],
    "parallel": ["check_divisible", "check_finite_loss", "check_labels", "pmap_sgd_step",
                 "split_batch", "train", "train_batch"],
    # jit + shardings, shard_map, Flax, Keras 3
    "concise": ["COLLECTIVES", "check_hlo_text", "check_spec", "check_step_optimizer",
                "count_collectives", "make_shard_map_step", "make_train_step", "shard",
                "shard_batch"],
    "flax_models": ["CNN", "LinenCNN", "LinenResNet", "LinenResNet18", "LinenResidual",
                    "Residual", "ResNet", "ResNet18", "apply_model", "check_arch",
                    "check_linen_layers", "cnn_from_linen", "create_train_state",
                    "cross_entropy_loss", "evaluate_nnx", "jit_train_step", "nnx_train_step",
                    "num_correct_nnx", "resnet18_budget", "train_nnx", "update_model"],
    "keras_models": ["keras_assign_state", "keras_convnet", "keras_train_state",
                     "make_keras_train_step"],
    # when do more devices help? a measured cost model
    "cost_model": ["bus_bandwidth", "check_alpha_beta_inputs", "check_collective_inputs",
                   "check_cost_analysis", "check_step_time_inputs", "collective_loop",
                   "cpu_time_call", "fit_alpha_beta", "measure_collectives", "measure_compute",
                   "predict_step_time", "step_cost", "time_collective"],
    # ensembles
    "ensemble": ["apply_ensemble", "check_ensemble_size", "create_ensemble_state",
                 "create_stacked_ensemble", "ensemble_num_correct", "evaluate_ensemble",
                 "evaluate_stacked", "map_members", "member_num_correct", "member_step",
                 "stacked_train_step", "train_ensemble", "train_stacked"],
    # memory and meshes
    "memory": ["OPTIMIZER_STATE_COPIES", "check_memory_inputs", "count_params",
               "saved_activation_bytes", "training_memory", "transformer_footprint"],
    "transformer": ["CausalSelfAttention", "MLP", "TransformerBlock", "TransformerLM",
                    "lm_loss", "logical_constraint", "logical_init", "logical_linear"],
    "sharding": ["abstract_state", "bytes_per_device", "check_layout", "check_rules",
                 "create_sharded", "use_sharding"],
    # FSDP, tensor and pipeline parallelism
    "text": ["TINY_TEXT", "CharCorpus"],
    "strategies": ["LOGICAL_AXES", "STRATEGIES", "bubble_fraction", "lm_train_step", "reshard",
                   "shard_tokens", "sharding_rules"],
    # checkpoints and input pipelines
    "checkpoint": ["CheckpointError", "abstract_like", "check_finite", "check_fits",
                   "check_layouts", "check_optimizer", "check_specs",
                   "checkpoint_manager", "lenet_specs", "restore_checkpoint", "save_checkpoint",
                   "saved_steps", "sharded_train_state", "state_specs", "train_steps"],
    "input_pipeline": ["ArraySource", "CheckedIterator", "CheckedPipeline", "check_loader_inputs",
                       "grain_loader"],
    # several processes
    "distributed": ["check_batch_inputs", "check_device_counts", "check_devices_per_process",
                    "check_mesh_and_arrays", "detect_cluster", "exit_worker", "global_batch",
                    "initialize_distributed", "launcher_settings", "process_batches"],
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
