"""mcplive's installed version, read once from the package metadata."""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def installed_version() -> str | None:
    """The installed distribution's version, or None when mcplive runs uninstalled (from a
    source tree on ``PYTHONPATH``)."""
    try:
        return metadata.version("mcplive")
    except metadata.PackageNotFoundError:
        return None
