"""Loaded at start-up by every Python process the tests start (notebook kernels, commands),
because tests/conftest.py puts this folder on PYTHONPATH: such a process cannot open a network
connection beyond this machine, and it treats warnings as the test process does (the
``filterwarnings`` of pyproject.toml, passed in ``D2L_MULTI_TEST_WARNINGS``), so a deprecated
API used in a notebook fails its test."""
import sandbox_rules

sandbox_rules.block_network()
sandbox_rules.apply_warning_filters()
