"""Every test process sees 8 simulated CPU devices (or the accelerators, where there are at
least two) and cannot open a network connection beyond this machine.

The test processes, the notebook kernels and the programs the tests start share one JAX
persistent compilation cache for the run (a temporary directory, removed at the end, unless
``JAX_COMPILATION_CACHE_DIR`` is set): a program that several notebooks and tests compile alike,
such as LeNet's data-parallel step, is compiled once.
"""
import atexit
import ipaddress
import os
import shutil
import socket
import tempfile

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KERAS_BACKEND", "jax")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # set before JAX starts; workers inherit it
    _cache = tempfile.mkdtemp(prefix="d2l_multi_jax_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

import d2l_multi  # noqa: E402

d2l_multi.simulate_devices(8)

_connect = socket.socket.connect


def _local(address):
    host = address[0] if isinstance(address, tuple) else address
    if not isinstance(host, str):
        return True                                   # AF_UNIX paths as bytes
    if host == "localhost" or host.startswith("/"):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False                                  # a host name: would need DNS


def _guarded_connect(sock, address):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address):
        raise OSError(f"tests must not use the network (tried to connect to {address!r})")
    return _connect(sock, address)


@pytest.fixture(autouse=True, scope="session")
def no_network():
    """A test that tries to reach the network fails with an OSError instead."""
    socket.socket.connect = _guarded_connect
    yield
    socket.socket.connect = _connect


def _local_fashion_mnist():
    from d2l_multi import data
    return data.find_dataset("fashion-mnist") is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_data: the test reads Fashion-MNIST from a local "
                                       "copy; skipped when there is none")


def pytest_collection_modifyitems(config, items):
    """Tests and notebooks that read Fashion-MNIST skip, saying how to provide it, when no
    local copy exists (the tests never download)."""
    if _local_fashion_mnist():
        return
    skip = pytest.mark.skip(reason="no local copy of Fashion-MNIST: set D2L_MULTI_DATA to a "
                                   "folder holding fashion-mnist/ (and mnist/), or "
                                   "apt install dataset-fashion-mnist")
    for item in items:
        if item.path.suffix == ".ipynb" or item.get_closest_marker("needs_data"):
            item.add_marker(skip)
