"""IPVS mode's local routes of service addresses (lace.ipvs.serviceAddresses localRoutes)
against this host's kernel, which has policy routing but no IPVS and no dummy interface:
the routes added and deleted in batches, read back by the kernel's filtered dumps, making
an address local as an address of an interface does; and a switch between the two ways
(`ServiceAddresses`), with a veth standing in for lace-ipvs0. IPVS on top of them is
tests/vm's (the ipvs tests run in both settings).

`ip route` is the witness throughout.
"""

from __future__ import annotations

import ipaddress
import json
import sys

import pytest

from lace_proxy.dataplane.ipvs.addresses import PER_SEND, RTM_NEWROUTE, AddressChannel
from lace_proxy.dataplane.ipvs.local import ServiceAddresses
from lace_proxy.dataplane.ipvs.model import ROUTE_PROTOCOL, IpvsSettings
from lace_proxy.demo.testbed import Testbed, request_tcp

pytestmark = pytest.mark.netns

V4 = [f"10.96.{i // 250}.{i % 250 + 1}" for i in range(PER_SEND * 5 // 2)]  # three sends
V6 = [f"fd00:96::{i:x}" for i in range(1, 11)]
STAND_IN = "lace-ipvs0"  # a veth here, named as the dummy interface


def ours(tb: Testbed) -> dict[str, dict[str, object]]:
    """lace-proxy's routes as `ip route` shows them: {destination: route}."""
    out = {}
    for family in ("-4", "-6"):
        shown = tb.exec(
            tb.node, ["ip", "-j", family, "route", "show", "table", "local", "proto", "145"]
        ).stdout
        for route in json.loads(shown or "[]"):
            out[str(ipaddress.ip_address(route["dst"]))] = route
    return out


def local_type(tb: Testbed, address: str) -> str:
    """The type of the route the node picks to `address` (local: delivered to the node)."""
    shown = tb.exec(tb.node, ["ip", "-j", "route", "get", address]).stdout
    return str(json.loads(shown)[0].get("type", "unicast"))


def test_local_routes_go_in_batches_and_are_read_back_by_protocol(testbed: Testbed) -> None:
    def program() -> tuple[object, ...]:
        with AddressChannel() as channel:
            added = channel.add_routes(ROUTE_PROTOCOL, V4 + V6)
            read = channel.local_routes(ROUTE_PROTOCOL)
            again = channel.add_routes(ROUTE_PROTOCOL, V4[:3])  # EEXIST: no refusal
            other = channel.local_routes(ROUTE_PROTOCOL + 1)
            return added, read, again, other

    added, read, again, other = testbed.node.ns.call(program)
    assert added == (len(V4) + len(V6), [])
    assert read == set(V4 + V6)
    assert again == (0, [])
    assert other == set()  # the kernel filters by protocol
    shown = ours(testbed)
    assert set(shown) == set(V4 + V6)
    for route in shown.values():
        assert (route["type"], route["dev"]) == ("local", "lo"), route
        assert route.get("scope", "host") == "host", route  # IPv6 routes show none
    assert local_type(testbed, V4[0]) == local_type(testbed, V6[0]) == "local"

    def delete() -> tuple[object, ...]:
        with AddressChannel() as channel:
            absent = ["10.97.0.1", "fd00:97::1"]  # ESRCH: no refusal, not counted
            deleted = channel.delete_routes(ROUTE_PROTOCOL, V4 + V6 + absent)
            return deleted, channel.local_routes(ROUTE_PROTOCOL)

    assert testbed.node.ns.call(delete) == ((len(V4) + len(V6), []), set())
    assert ours(testbed) == {}


def test_a_route_the_kernel_refuses_is_named_and_the_rest_of_its_batch_lands(
    testbed: Testbed,
) -> None:
    """IPv6 off on lo: the kernel refuses an IPv6 route on it (EACCES), and adds the IPv4
    ones of the same batch."""
    sysctl = "net.ipv6.conf.lo.disable_ipv6"
    testbed.exec(testbed.node, ["sysctl", "-qw", f"{sysctl}=1"])
    try:

        def program() -> tuple[int, list[object]]:
            with AddressChannel() as channel:
                done, refused = channel.add_routes(ROUTE_PROTOCOL, [*V4[:5], V6[0]])
                return done, [(r.command, r.address, r.errno, str(r)) for r in refused]

        done, refused = testbed.node.ns.call(program)
    finally:
        testbed.exec(testbed.node, ["sysctl", "-qw", f"{sysctl}=0"])
    assert done == 5
    [(command, address, code, text)] = refused
    assert (command, address, code) == (RTM_NEWROUTE, V6[0], 13)
    assert text.startswith(f"adding the local route of {V6[0]} refused: EACCES")
    assert set(ours(testbed)) == set(V4[:5])


def test_a_local_route_makes_the_address_the_nodes_own(testbed: Testbed) -> None:
    """A client's connection to a ClusterIP with a local route reaches the node's own
    server (IPVS would take it there); without the route it leaves by the node's default
    route (escaped)."""
    vips = ["10.96.0.50", "fd00:96::50"]
    for vip in vips:
        assert request_tcp(testbed.client, vip, 8080).outcome == "escaped", vip

    def change(add: bool) -> tuple[int, list[object]]:
        with AddressChannel() as channel:
            change = channel.add_routes if add else channel.delete_routes
            done, refused = change(ROUTE_PROTOCOL, vips)
            return done, list(refused)

    assert testbed.node.ns.call(change, True) == (2, [])
    for vip in vips:
        answer = request_tcp(testbed.client, vip, 8080)
        assert answer.reply is not None and answer.reply.name == "node", (vip, answer)
        assert answer.reply.ip == vip
    assert testbed.node.ns.call(change, False) == (2, [])
    for vip in vips:
        assert request_tcp(testbed.client, vip, 8080).outcome == "escaped", vip


def add_stand_in(tb: Testbed) -> None:
    """A veth named as the dummy interface, up, without DAD or a link-local address, so that
    its addresses are local at once and only those it is given, as a dummy's."""
    tb.exec(tb.node, ["ip", "link", "add", STAND_IN, "type", "veth", "peer", "name", "lace-peer"])
    for option in ("accept_dad=0", "addr_gen_mode=1"):
        tb.exec(tb.node, ["sysctl", "-qw", f"net.ipv6.conf.{STAND_IN}.{option}"])
    for link in (STAND_IN, "lace-peer"):
        tb.exec(tb.node, ["ip", "link", "set", link, "up"])


@pytest.fixture
def stand_in(testbed: Testbed) -> Testbed:
    """The node with a veth standing in for the dummy interface (add_stand_in); gone with
    the testbed's namespaces."""
    add_stand_in(testbed)
    return testbed


def on_stand_in(tb: Testbed) -> set[str]:
    out = tb.exec(tb.node, ["ip", "-j", "addr", "show", "dev", STAND_IN], check=False).stdout
    shown = json.loads(out or "[]")
    return {str(ipaddress.ip_address(a["local"])) for link in shown for a in link["addr_info"]}


def switch(tb: Testbed, local_routes: bool, wanted: set[str]) -> tuple[int, list[str], set[str]]:
    """One sync's part for the service addresses, as backend._sync_ipvs runs it: read both
    ways, make the wanted addresses local this way, delete the rest, leave the other way;
    (changes, refusals, what this way held before)."""

    def run() -> tuple[int, list[str], set[str]]:
        local = ServiceAddresses(IpvsSettings(interface=STAND_IN, local_routes=local_routes))
        failed: list[str] = []
        with AddressChannel() as channel:
            held = local.read(channel)
            count = local.change(channel, held.dummy, wanted - held.mine, failed, add=True)
            count += local.change(channel, held.dummy, held.mine - wanted, failed, add=False)
            count += local.leave_the_other_way(channel, held, failed)
        return count, failed, held.mine

    return tb.node.ns.call(run)


def test_switching_ways_keeps_every_address_local_and_leaves_nothing_of_the_other(
    stand_in: Testbed,
) -> None:
    tb = stand_in
    wanted = {"10.96.0.60", "10.96.0.61", "fd00:96::60"}
    # The interface way, as a process with the default setting leaves it.
    assert switch(tb, False, wanted) == (3, [], set())
    assert on_stand_in(tb) == wanted and ours(tb) == {}
    # Local routes: added beside the interface's addresses, then the interface goes.
    count, failed, before = switch(tb, True, wanted - {"10.96.0.61"})
    assert (failed, before) == ([], set())
    assert count == 2 + 1 + 3  # two routes, the interface, its three addresses
    assert set(ours(tb)) == wanted - {"10.96.0.61"}
    assert STAND_IN not in tb.exec(tb.node, ["ip", "-o", "link"]).stdout
    assert all(local_type(tb, a) == "local" for a in wanted - {"10.96.0.61"})
    assert local_type(tb, "10.96.0.61") != "local"
    # Back to the interface (made again, as the dummy would be): the addresses go on it
    # beside our routes, which are then deleted; the kernel's routes of the addresses stay.
    add_stand_in(tb)
    assert switch(tb, False, wanted) == (3 + 2, [], set())
    assert on_stand_in(tb) == wanted and ours(tb) == {}
    assert all(local_type(tb, a) == "local" for a in wanted)


def test_the_other_way_stays_while_this_way_is_refused_an_address(stand_in: Testbed) -> None:
    """IPv6 off on lo: the IPv6 address's route is refused, so the interface that still
    makes it local stays (the sync fails, and a later one switches over)."""
    tb = stand_in
    wanted = {"10.96.0.62", "fd00:96::62"}
    assert switch(tb, False, wanted)[:2] == (2, [])
    tb.exec(tb.node, ["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=1"])
    try:
        count, failed, _ = switch(tb, True, wanted)
    finally:
        tb.exec(tb.node, ["sysctl", "-qw", "net.ipv6.conf.lo.disable_ipv6=0"])
    assert count == 1 and len(failed) == 1 and "fd00:96::62" in failed[0]
    assert on_stand_in(tb) == wanted  # still local by the interface
    assert switch(tb, True, wanted)[:2] == (1 + 1 + 2, [])
    assert set(ours(tb)) == wanted and on_stand_in(tb) == set()


def test_cleanup_removes_the_service_addresses_either_way_and_nothing_else(
    stand_in: Testbed,
) -> None:
    """`lace-proxy cleanup` removes lace-ipvs0 and every local route of lace-proxy's, whatever
    the setting that made them; another protocol's route stays. The addresses go before the
    virtual services on them, so even without IPVS in the kernel (this host's)."""
    tb = stand_in
    tb.exec(tb.node, ["ip", "addr", "add", "10.96.0.70/32", "dev", STAND_IN])
    where = ["dev", "lo", "table", "local"]
    for address, protocol in (("10.96.0.71/32", "145"), ("10.96.0.72/32", "146")):
        tb.exec(tb.node, ["ip", "route", "add", "local", address, *where, "proto", protocol])
    tb.exec(
        tb.node, ["ip", "-6", "route", "add", "local", "fd00:96::71/128", *where, "proto", "145"]
    )
    tb.exec(tb.node, [sys.executable, "-m", "lace_proxy", "cleanup"])
    assert ours(tb) == {}
    assert STAND_IN not in tb.exec(tb.node, ["ip", "-o", "link"]).stdout
    kept = tb.exec(tb.node, ["ip", "route", "show", "table", "local", "proto", "146"]).stdout
    assert "10.96.0.72" in kept
