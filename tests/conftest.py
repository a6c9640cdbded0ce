"""Every test process sees 8 simulated CPU devices (or the accelerators, where there are any)."""
import os

import jax

jax.config.update("jax_num_cpu_devices", 8)
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KERAS_BACKEND", "jax")
