"""The two rules of the test sandbox for every Python process the tests start, notebook kernels
included (sitecustomize.py); the test process itself blocks the network the same way
(tests/conftest.py) and turns every deprecation into an error (pyproject.toml)."""
import ipaddress
import socket
import warnings

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


def block_network():
    """Make every connection to anything but this machine fail with an OSError."""
    socket.socket.connect = _guarded_connect


def allow_network():
    socket.socket.connect = _connect


DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
# Where a warning may come from to fail a run: a notebook cell or script (__main__), the
# package, and the libraries the chapter teaches. Not the machinery that runs a kernel
# (tornado, ipykernel, zmq, ...), whose own deprecations are no concern of the chapter.
CHAPTER_CODE = r"(__main__|d2l_multi|jax|jaxlib|flax|optax|orbax|grain|keras|numpy|chex)(\.|$)"


def deprecations_are_errors():
    """A deprecation warning raised in, or on behalf of, the chapter's code is an error."""
    for category in DEPRECATIONS:
        warnings.filterwarnings("error", category=category, module=CHAPTER_CODE)
