"""The IPVS codec: compiled, else its pure twin (`LACE_PROXY_NO_EXTENSIONS=1` forces the pure
one, as for the service table and the nf_tables codec)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lace_proxy.twins import load

if TYPE_CHECKING:  # both twins have the pure one's API (a test holds them equal)
    import lace_proxy.dataplane.ipvs._pycodec as _twin
else:
    _twin = load("lace_proxy.dataplane.ipvs._ccodec", "lace_proxy.dataplane.ipvs._pycodec")

IMPLEMENTATION = _twin.IMPLEMENTATION
IPVS_CMD_NEW_SERVICE = _twin.IPVS_CMD_NEW_SERVICE
IPVS_CMD_SET_SERVICE = _twin.IPVS_CMD_SET_SERVICE
IPVS_CMD_DEL_SERVICE = _twin.IPVS_CMD_DEL_SERVICE
IPVS_CMD_NEW_DEST = _twin.IPVS_CMD_NEW_DEST
IPVS_CMD_SET_DEST = _twin.IPVS_CMD_SET_DEST
IPVS_CMD_DEL_DEST = _twin.IPVS_CMD_DEL_DEST
CodecError = _twin.CodecError
Requests = _twin.Requests
ServerDump = _twin.ServerDump
ServiceDump = _twin.ServiceDump
servers_request = _twin.servers_request
services_request = _twin.services_request

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
