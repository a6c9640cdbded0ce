"""Every test process sees 8 simulated CPU devices (or the accelerators, where there are any)."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KERAS_BACKEND", "jax")

import d2l_multi  # noqa: E402

d2l_multi.simulate_devices(8)
