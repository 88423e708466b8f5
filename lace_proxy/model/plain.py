"""Endpoints of the EndpointSlice controller's shape, parsed by a shortcut: the compiled twin
(ext/plain.pyx) when it is built, else the pure one (`_pyplain`), which is its reference.

`LACE_PROXY_NO_EXTENSIONS=1` forces the pure twin; `IMPLEMENTATION` says which is active.
The checked parse (parse.py) judges every endpoint the shortcut leaves (None).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING or os.environ.get("LACE_PROXY_NO_EXTENSIONS"):
    from lace_proxy.model._pyplain import IMPLEMENTATION, plain_endpoint
else:
    try:
        from lace_proxy.model._cplain import IMPLEMENTATION, plain_endpoint
    except ImportError:  # not built (no compiler, or LACE_PROXY_NO_EXTENSIONS at install)
        from lace_proxy.model._pyplain import IMPLEMENTATION, plain_endpoint

__all__ = ["IMPLEMENTATION", "plain_endpoint"]
