"""Loaded at start-up by every Python process the tests start (notebook kernels, commands),
because tests/conftest.py puts this folder on PYTHONPATH: such a process cannot open a network
connection beyond this machine, and a deprecated API used by a notebook cell, the package or
the libraries the chapter teaches is an error there, so it fails its test."""
import sandbox_rules

sandbox_rules.block_network()
sandbox_rules.deprecations_are_errors()
