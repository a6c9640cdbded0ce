"""d2l_multi: the code of the chapter "Training on multiple devices with JAX".

``import d2l_multi as d2l`` gives the functions and classes the chapter's ``#@save`` cells
define, under the names the notebooks call them by (``d2l.train``, ``d2l.split_batch``), and
the part of d2l's API the chapter uses (``FashionMNIST``, ``load_data_fashion_mnist``,
``Animator``, ``Timer``, ``Accumulator``, ``show_images``, ``set_axes``, ``use_svg_display``,
``try_gpu``, ``try_all_gpus``, ``num_gpus``, ``split_batch`` and ``train``). d2l's class
framework (``Module``, ``Trainer``, ``DataModule``, ``HyperParameters``) is not offered: the
chapter writes its models and loops as functions and Flax modules.

Importing the package starts no JAX backend, so ``simulate_devices`` still works afterwards:
the names below the ``TYPE_CHECKING`` line are imported on first use (they load JAX, Flax,
Orbax, Grain or Keras); IDEs and ``help`` read them from that block. The command-line programs
live in ``d2l_multi.commands`` and the exercise checks in ``d2l_multi.exercises``; the library
imports neither.
"""
import importlib
from typing import TYPE_CHECKING

from .errors import CheckpointError, DataError, InputError
from .hardware import (
    describe, device_mesh, devices, num_gpus, simulate_devices, try_all_gpus, try_gpu,
)
from .utils import Accumulator, max_difference, time_call, Timer
from .plot import Animator, set_axes, show_images, use_svg_display
from .data import FashionMNIST, load_data_fashion_mnist

if TYPE_CHECKING:
    from .checkpoint import (
        abstract_like, checkpoint_manager, lenet_specs, restore_checkpoint, save_checkpoint,
        saved_steps, sharded_train_state, state_specs, wait_for_saves,
    )
    from .collectives import allreduce, replicate, ring_allreduce, unreplicate
    from .concise import count_collectives, make_shard_map_step, make_train_step, shard, shard_batch
    from .cost_model import (
        bus_bandwidth, collective_loop, cpu_time_call, fit_alpha_beta, H100_MODELS,
        measure_collectives, predict_step_time, ring_per_hop, step_cost, time_collective,
    )
    from .distributed import (
        assert_device_counts, exit_worker, initialize_distributed, process_batches,
    )
    from .ensemble import create_ensemble_state, ensemble_step, member_step, train_ensemble
    from .flax_models import (
        apply_model, CNN, create_train_state, cross_entropy_loss, evaluate_nnx, jit_train_step,
        LinenCNN, nnx_train_step, num_correct_nnx, Residual, ResNet, ResNet18, train_nnx,
        update_model,
    )
    from .hlo import collective_ops, CollectiveOp, COLLECTIVES, HLO_BYTES
    from .input_pipeline import ArraySource, CheckedIterator, CheckedPipeline, grain_loader
    from .keras_models import (
        keras_assign_state, keras_convnet, keras_train_state, make_keras_train_step,
    )
    from .matmul import ring_bytes, run_sharded
    from .memory import (
        block_bytes, count_params, gpt_block, gpt_block_params, lm_footprint,
        saved_activation_bytes, training_memory,
    )
    from .mixed_precision import (
        allreduce_bytes, lost_updates, make_mixed_precision_step, mixed_loss_fn,
        partitioned_hlo, train_sharded,
    )
    from .models import (
        avg_pool2d, conv2d, conv2d_im2col, evaluate_accuracy, init_lenet_params, lenet,
        loss_fn, num_correct,
    )
    from .parallel import device_sgd_step, split_batch, train, train_batch
    from .pipeline_parallel import (
        bubble_fraction, gpipe_order, in_flight, init_residual_mlp, mse, one_f_one_b_order,
        pipeline_schedule, pipeline_step, residual_mlp, show_schedule, stage_pass,
        stage_program,
    )
    from .resume import train_steps
    from .schedule import async_pairs, collective_slack, hlo_schedule, plot_schedule, PLUMBING
    from .sharding import abstract_state, bytes_per_device, create_sharded, use_sharding
    from .stacked_ensemble import create_stacked_ensemble, map_members, stacked_train_step
    from .strategies import lm_train_step, reshard, shard_tokens, sharding_rules
    from .text import CharCorpus
    from .transformer import (
        CausalSelfAttention, lm_loss, logical_constraint, logical_init, logical_linear, MLP,
        TransformerBlock, TransformerLM,
    )

__version__ = "0.1.0"


def _lazy_names() -> dict[str, str]:
    """{name: module} of the imports under ``if TYPE_CHECKING`` above, read from this file."""
    import ast
    import pathlib
    tree = ast.parse(pathlib.Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body
                 if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: node.module for node in block.body for alias in node.names}


_LAZY = _lazy_names()
__all__ = sorted({name for name, value in globals().items()
                  if not name.startswith("_") and getattr(value, "__module__", "").startswith(
                      __name__ + ".")} | set(_LAZY))


def __getattr__(name: str) -> object:
    """Import ``name`` from its module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
