"""The two rules of the test sandbox, shared by the test process (tests/conftest.py) and every
Python process it starts, notebook kernels included (sitecustomize.py)."""
import builtins
import ipaddress
import json
import os
import re
import socket
import warnings

WARNINGS_ENV = "D2L_MULTI_TEST_WARNINGS"
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


def _category(name):
    if not name:
        return Warning
    module, _, attr = name.rpartition(".")
    if not module:
        return getattr(builtins, attr)
    return getattr(__import__(module, fromlist=[attr]), attr)


def apply_warning_filters(filters=None):
    """Install pytest-style filters ("action:message:category:module", message and module as
    regular expressions), the last one taking precedence, as pytest does."""
    if filters is None:
        filters = json.loads(os.environ.get(WARNINGS_ENV, "[]"))
    for spec in filters:
        action, message, category, module, *_ = [*spec.split(":", 4), "", "", "", ""][:5]
        warnings.filterwarnings(action.strip(), message, _category(category.strip()),
                                module.strip())
