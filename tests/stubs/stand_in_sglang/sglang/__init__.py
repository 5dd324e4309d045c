"""A stand-in for the ``sglang`` package in eaglepatch's tests (standard library only; see launch_server.py)."""

from sglang.version import __version__  # noqa: F401
