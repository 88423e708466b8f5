"""IPVS mode (`mode: ipvs`): IPVS load-balances, nftables does everything else.

- `model`: virtual services and what each should be, from plans (no kernel access).
- `codec`: IPVS requests and dump answers as netlink messages (compiled, or its pure twin).
- `netlink`: `IpvsChannel`, batches of requests to IPVS and dumps back; refusals named.
- `addresses`: `AddressChannel`, service addresses in batches (the dummy interface's, or
  local routes), read back in dumps.
- `local`: `ServiceAddresses`, the way lace.ipvs.serviceAddresses chooses, and the other way's
  leftovers removed.
- `kernel`: IPVS's table read back, its timeouts, the dummy interface and sysctls.
- `backend`: `IpvsBackend`, the Dataplane (base.py): sync by diff against the kernel.
- `report`: `lace-proxy kernel`'s report of what IPVS holds against the table.
"""

from lace_proxy.dataplane.ipvs.backend import IpvsBackend
from lace_proxy.dataplane.ipvs.kernel import virtual_services
from lace_proxy.dataplane.ipvs.model import (
    IpvsSettings,
    KernelView,
    RealServer,
    Target,
    VirtualServer,
    Wanted,
    addresses_of,
)

__all__ = [
    "IpvsBackend",
    "IpvsSettings",
    "KernelView",
    "RealServer",
    "Target",
    "VirtualServer",
    "Wanted",
    "addresses_of",
    "virtual_services",
]
