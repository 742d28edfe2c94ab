"""Whether NVML answers on this machine: what ``devicePlugin.provider: nvml`` needs, checked when
the cluster YAML is read (a device watch that cannot read its devices is refused there, not found
blind mid-run). Imports NVIDIA's binding only when asked."""

from __future__ import annotations

import importlib
from types import ModuleType


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here; the message says what is missing."""


def load_nvml(module: str = "pynvml") -> ModuleType:
    """NVML's Python binding, initialised; :class:`NvmlUnavailable` naming what is missing."""
    try:
        nvml = importlib.import_module(module)
    except ImportError as exc:
        raise NvmlUnavailable(
            f"the nvml provider needs NVIDIA's NVML binding: {exc} "
            "(pip install 'unbroken[nvml]', which installs nvidia-ml-py)"
        ) from None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...
        raise NvmlUnavailable(f"NVML cannot start on this machine: {exc}") from None
    return nvml
