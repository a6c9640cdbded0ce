"""Exercises that check themselves: ``check.NAME(answer)`` runs the student's function or
value on small cases with the simulated devices and prints ``PASS NAME: ...``, or fails
with one line that says what is wrong in the exercise's terms ("your update is 8x too large:
did you psum instead of pmean?") -- never the answer, never a traceback.

A failed check raises ``CheckFailed``, an ``AssertionError`` that Jupyter shows as that one line
(``_render_traceback_``). A check compares the answer with behaviour it finds out itself (JAX's
own collectives and optimizers, a ring or a schedule played step by step, the FLOPs of a traced
program, a search over every possible answer), never with a formula written in its code.
``CHECKS`` lists each notebook's checks; they live in the module named after the notebook
(``02_allreduce`` -> ``d2l_multi.exercises.allreduce``), which a notebook imports as ``check``:
``from d2l_multi.exercises import allreduce as check``.

These are the *public* cases. A teacher's grading (``python -m d2l_multi classroom grade``)
runs the same checks on hidden cases kept with the course, and judges them outside the
student's kernel (docs/classroom.md); nothing of that is in this package.

Every check takes only what the student wrote and builds its own small problem, so it runs in
seconds on a laptop CPU with 8 simulated devices.
"""
import importlib
from collections.abc import Callable

from ._common import CheckFailed

__all__ = ["CHECKS", "CheckFailed", "module_of", "check"]

CHECKS = {  # module (a notebook's name without its number): the checks of its exercises
    "devices": ["mesh_layout"],
    "lenet_from_scratch": ["cross_entropy", "sgd_update"],
    "allreduce": ["broadcast", "reduce_scatter", "all_gather", "ring_allreduce", "few_steps"],
    "data_parallel_from_scratch": ["split_batch", "pmean_step", "grad_accumulation"],
    "jit_and_shardings": ["jit_data_parallel"],
    "shard_map": ["shard_map_grad"],
    "flax": ["nnx_accumulation"],
    "batchnorm": ["batch_stats"],
    "resnet": ["flops_per_byte"],
    "keras": ["model_parallel"],
    "collectives": ["alpha_beta", "bus_bandwidth"],
    "predicting_steps": ["step_time"],
    "mixed_precision": ["master_weights", "lost_updates"],
    "low_precision_communication": ["ring_sum", "bf16_gather"],
    "ensembles": ["ensemble_average"],
    "memory": ["training_memory"],
    "remat": ["remat_memory"],
    "meshes_and_rules": ["logical_rules"],
    "fsdp_and_tensor_parallelism": ["fsdp_spec", "megatron_specs", "zero1_adam", "sp_mlp"],
    "pipeline_parallelism": ["balanced_stages", "interleaved"],
    "overlapping_communication": ["overlapped_step", "bucketed_allreduce"],
    "checkpoints": ["fsdp_restore"],
    "input_pipelines": ["exact_resume"],
    "multi_process": ["process_rows"],
    "failures": ["checkpoint_interval"],
    "capstone": ["rules_2d", "memory_prediction", "sharded_training"],
}


def module_of(notebook: str) -> str:
    """The module holding ``notebook``'s checks: ``'02_allreduce'`` -> ``'allreduce'``."""
    return notebook.split("_", 1)[-1]


def check(module: str, name: str) -> Callable[..., None]:
    """The check ``name`` of a notebook's exercises, e.g. ``check('allreduce', 'broadcast')``."""
    if name not in CHECKS.get(module, ()):
        raise AttributeError(f"d2l_multi.exercises.{module} has no exercise check {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
