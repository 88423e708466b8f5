"""How IPVS mode makes service addresses the node's own (lace.ipvs.serviceAddresses): as
addresses of the dummy interface (kube-proxy's way) or as `local` routes of ours in the local
table (`IpvsSettings.local_routes`), and how a switch from one way to the other, between
restarts, leaves nothing of the first behind.

What each way holds is read back at every verified sync (`read`): the namespace's addresses
(one dump; the dummy's and the node's) and our local routes (one dump per family, the kernel
filtering by protocol), so the other way's leftovers are found, counted as ours for
ownership, and removed once this way holds every address (`leave_the_other_way`). Changes go
in batches (addresses.AddressChannel); each refusal is logged by its address and fails the
sync, as the virtual services' refusals do.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from pyroute2 import IPRoute

from lace_proxy.dataplane.ipvs import kernel
from lace_proxy.dataplane.ipvs.addresses import AddressChannel, AddressRefusal
from lace_proxy.dataplane.ipvs.model import IpvsSettings

log = logging.getLogger(__name__)
#: Refusals of one batch logged one by one; the rest are counted.
LOGGED = 50


class Held(NamedTuple):
    """The service addresses the kernel holds, as a sync reads them."""

    dummy: int  # the dummy interface's index (-1: there is none)
    every: list[tuple[int, str]]  # the namespace's addresses, by interface index
    mine: set[str]  # made local the configured way
    other: set[str]  # made local the other way (left by a process with the other setting)


class ServiceAddresses:
    """The service addresses of one IPVS backend, the way its settings say."""

    def __init__(self, settings: IpvsSettings) -> None:
        self.settings = settings

    def read(self, channel: AddressChannel, *, make: bool = False) -> Held:
        """What the kernel holds of service addresses, either way; `make`: the dummy
        interface is made first if missing, in the interface way (a sync's read)."""
        if make and not self.settings.local_routes:
            index = self.index()
        else:
            links = channel.links()
            name = self.settings.interface
            index = next((link.ifindex for link in links if link.name == name), -1)
        every = channel.addresses()
        on_dummy = {address for i, address in every if i == index}
        protocol = self.settings.route_protocol
        routed = set() if protocol is None else channel.local_routes(protocol)
        if self.settings.local_routes:
            return Held(index, every, routed, on_dummy)
        return Held(index, every, on_dummy, routed)

    def index(self) -> int:
        """The dummy interface's index for changes the configured way: made if missing in
        the interface way; -1 with local routes, which need none."""
        if self.settings.local_routes:
            return -1
        with IPRoute() as ipr:
            return kernel.dummy(ipr, self.settings.interface)

    def change(
        self,
        channel: AddressChannel,
        index: int,
        addresses: set[str],
        failed: list[str],
        *,
        add: bool,
    ) -> int:
        """Add or delete service addresses the configured way, in one batch: addresses of
        the dummy interface (`index`) or our local routes. How many were carried out; each
        refusal is logged, naming its address, and added to `failed` (the others are carried
        out; the sync then counts as failed and is retried)."""
        if self.settings.local_routes:
            return self._routes(channel, addresses, failed, add=add)
        if not addresses:
            return 0
        change = channel.add if add else channel.delete
        return _logged(change(index, addresses), failed)

    def leave_the_other_way(self, channel: AddressChannel, held: Held, failed: list[str]) -> int:
        """Remove what the way not configured holds once this way holds every address (no
        refusal in `failed`; else at a later sync), so that none stops being local: with
        local routes the dummy interface goes (and its addresses with it), with the
        interface our local routes do."""
        if failed:
            return 0
        if not self.settings.local_routes:
            return self._routes(channel, held.other, failed, add=False)
        if held.dummy < 0:
            return 0
        with IPRoute() as ipr:
            ipr.link("del", index=held.dummy)
        log.info(
            "IPVS: %s deleted with its %d addresses (service addresses are local routes)",
            self.settings.interface,
            len(held.other),
        )
        return 1 + len(held.other)

    def remove(self, channel: AddressChannel, held: Held, failed: list[str]) -> None:
        """Remove both ways' (`lace-proxy cleanup`): the dummy interface and our routes."""
        if held.dummy >= 0:
            with IPRoute() as ipr:
                ipr.link("del", index=held.dummy)
        routed = held.mine if self.settings.local_routes else held.other
        self._routes(channel, routed, failed, add=False)

    def _routes(
        self, channel: AddressChannel, addresses: set[str], failed: list[str], *, add: bool
    ) -> int:
        protocol = self.settings.route_protocol
        if not addresses or protocol is None:
            return 0
        change = channel.add_routes if add else channel.delete_routes
        return _logged(change(protocol, addresses), failed)


def _logged(result: tuple[int, list[AddressRefusal]], failed: list[str]) -> int:
    """A channel's count of changes carried out, its refusals logged and added to `failed`."""
    done, refused = result
    for refusal in refused[:LOGGED]:
        log.error("%s", refusal)
    if len(refused) > LOGGED:
        log.error("IPVS: %d more address requests refused", len(refused) - LOGGED)
    failed += map(str, refused)
    return done
