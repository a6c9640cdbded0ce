"""d2l_multi: the support package of the chapter "Training on multiple devices with JAX".

Importing it never starts JAX's backend, so ``simulate_devices`` still works afterwards.
Names follow d2l's, so ``import d2l_multi as d2l`` runs code written for ``d2l.jax``.
"""
from .config import SMOKE_ENV, pick, smoke
from .data import (DATA_ENV, DataError, FashionMNIST, MNIST, cache_dir, dataset_dir,
                   load_data_fashion_mnist, load_dataset, read_idx_gz)
from .devices import devices, describe, num_gpus, simulate_devices, try_all_gpus, try_gpu
from .plot import Animator, set_axes, show_images, use_svg_display
from .utils import Accumulator, Timer

__version__ = "0.1.0"
from .models import avg_pool2d, conv2d, init_lenet_params, lenet, loss_fn
from .parallel import (allreduce, check_divisible, pmap_sgd_step, replicate, ring_allreduce,
                       split_batch, train_batch, unreplicate)
