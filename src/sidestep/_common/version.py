"""The installed distribution's version (``0+unknown`` in a source tree not installed)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("sidestep")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"
