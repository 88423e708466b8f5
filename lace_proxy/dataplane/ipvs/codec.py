"""The IPVS codec: compiled, else its pure twin (`LACE_PROXY_NO_EXTENSIONS=1` forces the pure
one, as for the service table and the nf_tables codec)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING or os.environ.get("LACE_PROXY_NO_EXTENSIONS"):
    from lace_proxy.dataplane.ipvs._pycodec import (
        IMPLEMENTATION,
        IPVS_CMD_DEL_DEST,
        IPVS_CMD_DEL_SERVICE,
        IPVS_CMD_NEW_DEST,
        IPVS_CMD_NEW_SERVICE,
        IPVS_CMD_SET_DEST,
        IPVS_CMD_SET_SERVICE,
        CodecError,
        Requests,
        ServerDump,
        ServiceDump,
        servers_request,
        services_request,
    )
else:
    try:
        from lace_proxy.dataplane.ipvs._ccodec import (
            IMPLEMENTATION,
            IPVS_CMD_DEL_DEST,
            IPVS_CMD_DEL_SERVICE,
            IPVS_CMD_NEW_DEST,
            IPVS_CMD_NEW_SERVICE,
            IPVS_CMD_SET_DEST,
            IPVS_CMD_SET_SERVICE,
            CodecError,
            Requests,
            ServerDump,
            ServiceDump,
            servers_request,
            services_request,
        )
    except ImportError:  # not built
        from lace_proxy.dataplane.ipvs._pycodec import (
            IMPLEMENTATION,
            IPVS_CMD_DEL_DEST,
            IPVS_CMD_DEL_SERVICE,
            IPVS_CMD_NEW_DEST,
            IPVS_CMD_NEW_SERVICE,
            IPVS_CMD_SET_DEST,
            IPVS_CMD_SET_SERVICE,
            CodecError,
            Requests,
            ServerDump,
            ServiceDump,
            servers_request,
            services_request,
        )

__all__ = [
    "IMPLEMENTATION",
    "IPVS_CMD_DEL_DEST",
    "IPVS_CMD_DEL_SERVICE",
    "IPVS_CMD_NEW_DEST",
    "IPVS_CMD_NEW_SERVICE",
    "IPVS_CMD_SET_DEST",
    "IPVS_CMD_SET_SERVICE",
    "CodecError",
    "Requests",
    "ServerDump",
    "ServiceDump",
    "servers_request",
    "services_request",
]
