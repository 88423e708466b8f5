"""Which twin of a compiled module runs: the compiled one when it is built, else its
pure-Python twin with the same API. `LACE_PROXY_NO_EXTENSIONS=1` forces the pure twins."""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def load(compiled: str, pure: str) -> ModuleType:
    """The compiled module unless it is not built or the pure twins are asked for."""
    if not os.environ.get("LACE_PROXY_NO_EXTENSIONS"):
        try:
            return importlib.import_module(compiled)
        except ImportError:  # not built (no compiler, or LACE_PROXY_NO_EXTENSIONS at install)
            pass
    return importlib.import_module(pure)
