"""The device: learns the task, trains and evaluates on its own clips, records them, runs the global model.

Importing the package loads nothing else: a device that only listens imports the torch-free runtime
(the subpackage `runtime`) without the daemon.
The daemon's names below are imported on first use.
"""

import importlib
from typing import Any

_LAZY = {
    "ClientConfig": "daemon",
    "Refused": "credentials",
    "run_client": "daemon",
    "DataSource": "local_data",
    "measure_profile": "profile",
    "measure_rtt_ms": "profile",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    """One of the daemon's public names, imported from its module when first asked for."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
