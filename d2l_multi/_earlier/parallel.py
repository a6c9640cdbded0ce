"""What the ``#@save`` code of ``d2l_multi.parallel`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..collectives import replicate, unreplicate
from ..data import FashionMNIST
from ..hardware import describe, devices
from ..models import evaluate_accuracy, init_lenet_params, loss_fn
from ..plot import Animator
from ..utils import Timer

__all__ = ["Animator", "FashionMNIST", "Timer", "describe", "devices", "evaluate_accuracy", "init_lenet_params", "loss_fn", "replicate", "unreplicate"]
