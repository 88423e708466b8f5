"""The service table: the compiled core when it is built, else its pure-Python twin.

`LACE_PROXY_NO_EXTENSIONS=1` forces the pure twin; `IMPLEMENTATION` says which is active.

For a type checker, `Plan` and `Backend` are the contract both twins meet (Protocols, in
`changeset.py`) and `ServiceTable` is the compiled core's as `_ctable.pyi` types it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lace_proxy.table.changeset import (
    CLUSTER_IP,
    EXTERNAL_IP,
    LOAD_BALANCER,
    NODE_PORT,
    Access,
    Changeset,
    Frontend,
)

if TYPE_CHECKING:
    from lace_proxy.table._ctable import IMPLEMENTATION, ServiceTable
    from lace_proxy.table.changeset import Backend, Plan
elif os.environ.get("LACE_PROXY_NO_EXTENSIONS"):
    from lace_proxy.table._pytable import IMPLEMENTATION, Backend, Plan, ServiceTable
else:
    try:
        from lace_proxy.table._ctable import IMPLEMENTATION, Backend, Plan, ServiceTable
    except ImportError:  # not built (no compiler, or LACE_PROXY_NO_EXTENSIONS at install)
        from lace_proxy.table._pytable import IMPLEMENTATION, Backend, Plan, ServiceTable

__all__ = [
    "CLUSTER_IP",
    "EXTERNAL_IP",
    "IMPLEMENTATION",
    "LOAD_BALANCER",
    "NODE_PORT",
    "Access",
    "Backend",
    "Changeset",
    "Frontend",
    "Plan",
    "ServiceTable",
]
