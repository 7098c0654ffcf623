"""pytest-jupyter's server fixtures, for this folder only (they bring an autouse loop)."""

from pytest_jupyter.jupyter_server import *  # noqa: F403
