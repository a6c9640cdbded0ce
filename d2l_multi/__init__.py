"""d2l_multi: the support package of the chapter "Training on multiple devices with JAX".

Importing it never starts JAX's backend, so ``simulate_devices`` still works afterwards.
Names follow d2l's, so ``import d2l_multi as d2l`` runs code written for ``d2l.jax``.
"""
__version__ = "0.1.0"

from .config import SMOKE_ENV, pick, smoke
from .data import (DATA_ENV, DataError, FashionMNIST, MNIST, cache_dir, dataset_dir,
                   load_data_fashion_mnist, load_dataset, read_idx_gz)
from .devices import devices, describe, num_gpus, simulate_devices, try_all_gpus, try_gpu
from .plot import Animator, set_axes, show_images, use_svg_display
from .utils import Accumulator, Timer
# 01-03: LeNet from scratch, allreduce, data parallelism by hand
from .models import (avg_pool2d, best_conv, conv2d, conv2d_im2col, init_lenet_params, lenet,
                     loss_fn)
from .parallel import (allreduce, check_divisible, pmap_sgd_step, replicate, ring_allreduce,
                       split_batch, train_batch, unreplicate)
from .train import evaluate_accuracy, num_correct, train
# 04-06: jit + shardings, shard_map, Flax, Keras 3
from .concise import (check_spec, data_mesh, make_shard_map_step, make_train_step, shard,
                      shard_batch, throttle)
from .flax_models import (CNN, CNNBatchNorm, Residual, ResNet, ResNet18, TrainState,
                          apply_model, bn_train_step, create_bn_train_state, create_train_state,
                          cross_entropy_loss, evaluate_flax, jit_train_step, num_correct_flax,
                          train_sharded, update_model)
from .keras_models import (keras_assign_state, keras_convnet, keras_throttle, keras_train_state,
                           make_keras_train_step)
# 07-09: ensembles; sharding beyond data parallelism; checkpoints and input pipelines.
# Each module lists its public names in __all__.
from .ensemble import *  # noqa: F401,F403
from .sharding import *  # noqa: F401,F403
from .checkpoint import *  # noqa: F401,F403
from .pipeline import *  # noqa: F401,F403
# 10: multi-process training
from .distributed import (check_device_counts, detect_cluster, global_batch,
                          initialize_distributed, launcher_settings, process_batches)
