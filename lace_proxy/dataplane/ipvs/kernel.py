"""IPVS and what surrounds it, through netlink: requests (pyroute2's, or encoded for
`netlink.send_together`), IPVS's table read back (a netlink dump, /proc/net/ip_vs), the
dummy interface's addresses and the sysctls IPVS mode needs."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyroute2 import IPVS, IPVSDest, IPVSService
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST, genlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.generic import ipvs as genl_ipvs

from lace_proxy.dataplane.conntrack import Filter
from lace_proxy.dataplane.ipvs.model import (
    FORWARD_METHODS,
    MASQUERADE,
    PERSISTENT,
    PROTOCOLS,
    RealServer,
    Target,
    VirtualServer,
    address_family,
)

log = logging.getLogger(__name__)

#: The sysctls kube-proxy's IPVS mode sets: conntrack entries for IPVS connections (so that
#: nftables can masquerade them), and no new connections to a real server that is gone.
SYSCTLS = {
    "net/ipv4/vs/conntrack": 1,
    "net/ipv4/vs/expire_nodest_conn": 1,
    "net/ipv4/vs/expire_quiescent_template": 1,
    "net/ipv4/ip_forward": 1,
}
STRICT_ARP = {"net/ipv4/conf/all/arp_ignore": 1, "net/ipv4/conf/all/arp_announce": 2}
#: IPVS's table as text, in the reading thread's network namespace (the kernel thread enters
#: the node's namespace with setns; /proc/net would follow the process's).
PROC_IP_VS = "/proc/thread-self/net/ip_vs"


class _ConfigMsg(genlmsg):
    """IPVS_CMD_SET/GET_CONFIG with the timeouts as u32 (pyroute2's ipvsmsg has them as
    raw bytes and no call that sends them)."""

    prefix = "IPVS_CMD_ATTR_"
    nla_map = (
        ("IPVS_CMD_ATTR_UNSPEC", "none"),
        ("IPVS_CMD_ATTR_SERVICE", "none"),
        ("IPVS_CMD_ATTR_DEST", "none"),
        ("IPVS_CMD_ATTR_DAEMON", "none"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_TCP_FIN", "uint32"),
        ("IPVS_CMD_ATTR_TIMEOUT_UDP", "uint32"),
    )


TIMEOUT_ATTRS = (
    "IPVS_CMD_ATTR_TIMEOUT_TCP",
    "IPVS_CMD_ATTR_TIMEOUT_TCP_FIN",
    "IPVS_CMD_ATTR_TIMEOUT_UDP",
)


def _config_msg(cmd: int, attrs: list[tuple[str, int]]) -> _ConfigMsg:
    msg = _ConfigMsg()
    msg["cmd"] = cmd
    msg["version"] = genl_ipvs.GENL_VERSION
    msg["attrs"] = attrs
    return msg


def timeouts(ipvs: Any) -> tuple[int, int, int]:
    """IPVS's tcp, tcpfin and udp timeouts in seconds (`ipvsadm -L --timeout`)."""
    request = _config_msg(genl_ipvs.IPVS_CMD_GET_CONFIG, [])
    (reply,) = ipvs.nlm_request(request, msg_type=ipvs.prid, msg_flags=NLM_F_REQUEST)
    raw = dict(reply.get("attrs"))  # decoded as ipvsmsg: "84:03:00:00", host byte order
    values = [bytes.fromhex(str(raw[name]).replace(":", "")) for name in TIMEOUT_ATTRS]
    t = tuple(int.from_bytes(v, sys.byteorder) for v in values)
    return t[0], t[1], t[2]


def set_timeouts(ipvs: Any, wanted: tuple[int, int, int]) -> None:
    """Set the non-zero timeouts that differ (0 keeps the kernel's value, as kube-proxy)."""
    current = timeouts(ipvs)
    if all(w in (0, c) for w, c in zip(wanted, current, strict=True)):
        return
    attrs = [(name, w) for name, w in zip(TIMEOUT_ATTRS, wanted, strict=True) if w]
    request = _config_msg(genl_ipvs.IPVS_CMD_SET_CONFIG, attrs)
    flags = NLM_F_REQUEST | NLM_F_ACK
    tuple(ipvs.nlm_request(request, msg_type=ipvs.prid, msg_flags=flags))
    log.info("IPVS timeouts (tcp, tcpfin, udp) set to %s (were %s)", wanted, current)


def unicast(address: str) -> bool:
    """IPVS refuses multicast, unspecified and IPv6 link-local real servers."""
    ip = ipaddress.ip_address(address)
    return not (ip.is_multicast or ip.is_unspecified or (ip.version == 6 and ip.is_link_local))


def call(fn: Callable[..., Any], command: str, **kwargs: Any) -> None:
    try:
        fn(command, **kwargs)
    except NetlinkError as exc:
        what = ", ".join(f"{k}={dict(v)}" for k, v in kwargs.items())
        raise RuntimeError(f"IPVS {command} failed ({exc}): {what}") from exc


def service(vs: VirtualServer, target: Target) -> Any:
    persistent = PERSISTENT if target.persistence else 0
    fields: dict[str, Any] = {
        "addr": vs.address,
        "port": vs.port,
        "protocol": PROTOCOLS[vs.protocol],
        "sched_name": target.scheduler,
        "flags": {"flags": persistent, "mask": 0xFFFFFFFF},
        "timeout": target.persistence,
    }
    if address_family(vs.address) == 6:
        fields["netmask"] = "128.0.0.0"  # the prefix length 128, as a host-order u32
    return IPVSService(**fields)


def flows_to(vs: VirtualServer | None, server: tuple[str, int]) -> Filter:
    """The conntrack filter of a virtual service's flows to one real server, or of all its
    flows (`vs` None). IPVS mode keeps conntrack entries, their reply tuple the real
    server's (net.ipv4.vs.conntrack)."""
    family = ("-f", "ipv6") if ":" in server[0] else ()
    frontend = () if vs is None else ("--orig-dst", vs.address, "--orig-port-dst", str(vs.port))
    return (*family, *frontend, "--reply-src", server[0], "--reply-port-src", str(server[1]))


def dest_requests(
    family: int, command: int, servers: list[tuple[VirtualServer, tuple[str, int]]]
) -> bytes:
    """One IPVS request per real server (weight 0, for IPVS_CMD_SET_DEST), numbered from 1
    in the order given, each acknowledged."""
    out = []
    for sequence, (vs, server) in enumerate(servers, 1):
        msg = genl_ipvs.ipvsmsg()
        msg["cmd"] = command
        msg["version"] = genl_ipvs.GENL_VERSION
        msg["attrs"] = [
            ("IPVS_CMD_ATTR_SERVICE", key(vs).dump_key()),
            ("IPVS_CMD_ATTR_DEST", dest(server, 0).dump_nla()),
        ]
        msg["header"]["type"] = family
        msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
        msg["header"]["sequence_number"] = sequence
        msg.encode()
        out.append(bytes(msg.data))
    return b"".join(out)


def refusals(
    servers: list[tuple[VirtualServer, tuple[str, int]]], answers: dict[int, int]
) -> list[tuple[tuple[VirtualServer, tuple[str, int]], str]]:
    """The requests of `dest_requests` the kernel refused, or did not answer, with why."""
    out = []
    for sequence, pair in enumerate(servers, 1):
        code = answers.get(sequence)
        if code != 0:
            why = "no answer" if code is None else f"{errno.errorcode.get(code, code)}"
            out.append((pair, why))
    return out


def dest(server: tuple[str, int], weight: int) -> Any:
    return IPVSDest(addr=server[0], port=server[1], fwd_method=MASQUERADE, weight=weight)


def key(vs: VirtualServer) -> Any:
    """The fields that name a virtual service (for its real servers' commands)."""
    return IPVSService(addr=vs.address, port=vs.port, protocol=PROTOCOLS[vs.protocol])


def dests(ipvs: Any, vs: VirtualServer) -> list[dict[str, Any]]:
    return [dict(m.get("IPVS_CMD_ATTR_DEST")["attrs"]) for m in ipvs.dest("dump", service=key(vs))]


def persistence(msg: Any) -> int:
    """A dumped service's persistence timeout (0: not persistent), from its raw attributes."""
    attrs = dict(msg.get("IPVS_CMD_ATTR_SERVICE")["attrs"])
    flags = attrs.get("IPVS_SVC_ATTR_FLAGS", {})
    flags = flags.get("flags", 0) if isinstance(flags, dict) else int(flags)
    return int(attrs.get("IPVS_SVC_ATTR_TIMEOUT", 0)) if flags & PERSISTENT else 0


def real_server(d: dict[str, Any]) -> RealServer:
    fwd = int(d.get("IPVS_DEST_ATTR_FWD_METHOD", MASQUERADE)) & 0x7
    return RealServer(
        str(d["IPVS_DEST_ATTR_ADDR"]),
        int(d["IPVS_DEST_ATTR_PORT"]),
        FORWARD_METHODS.get(fwd, str(fwd)),
        int(d.get("IPVS_DEST_ATTR_WEIGHT", 1)),
        int(d.get("IPVS_DEST_ATTR_ACTIVE_CONNS", 0)),
        int(d.get("IPVS_DEST_ATTR_INACT_CONNS", 0)),
    )


def connections(ipvs: Any, vs: VirtualServer) -> dict[tuple[str, int], int]:
    """Each real server's connections (active and inactive) under a virtual service."""
    return {(r.address, r.port): r.active + r.inactive for r in map(real_server, dests(ipvs, vs))}


def services(ipvs: Any) -> Iterator[tuple[VirtualServer, str, int]]:
    """Every address virtual service IPVS holds (one netlink dump), with its scheduler and
    persistence read from the raw attributes; fwmark services are left out."""
    names = {number: name for name, number in PROTOCOLS.items()}
    for msg in ipvs.service("dump"):
        attrs = dict(msg.get("IPVS_CMD_ATTR_SERVICE")["attrs"])
        protocol = names.get(attrs.get("IPVS_SVC_ATTR_PROTOCOL", 0))
        if attrs.get("IPVS_SVC_ATTR_FWMARK") or protocol is None:
            continue
        vs = VirtualServer(
            protocol, str(attrs["IPVS_SVC_ATTR_ADDR"]), int(attrs["IPVS_SVC_ATTR_PORT"])
        )
        yield vs, str(attrs.get("IPVS_SVC_ATTR_SCHED_NAME", "")), persistence(msg)


def virtual_services() -> list[VirtualServer]:
    """Every address virtual service IPVS holds here (the calling thread's namespace)."""
    with IPVS() as ipvs:
        return [vs for vs, _, _ in services(ipvs)]


def real_servers(path: str = PROC_IP_VS) -> dict[VirtualServer, list[RealServer]]:
    """Every virtual service's real servers, from one read of /proc/net/ip_vs (of the
    calling thread's namespace): a dump per virtual service would cost a netlink round trip
    each. Its lines: "TCP  0A600001:0050 rr ..." (IPv6: "[fd00:0000:...]:0050"), then
    "  -> 0A010001:1F90      Masq    1      0          0" (forward, weight, conns)."""
    out: dict[VirtualServer, list[RealServer]] = {}
    current: list[RealServer] | None = None
    with open(path, encoding="ascii") as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] in PROTOCOLS and len(words) >= 2:
                address, port = proc_address(words[1])
                current = out.setdefault(VirtualServer(words[0], address, port), [])
            elif words[0] == "->" and current is not None and words[1][0] in "0123456789ABCDEF[":
                address, port = proc_address(words[1])
                weight, active, inactive = (int(w) for w in words[3:6])
                current.append(RealServer(address, port, words[2], weight, active, inactive))
            elif words[0] == "FWM":
                current = None  # a fwmark service's real servers: not ours to read
    return out


def proc_address(text: str) -> tuple[str, int]:
    """ "0A600001:0050" or "[fd00:0000:...:0001]:01BB" -> ("10.96.0.1", 80) / ("fd00::1", 443)."""
    host, _, port = text.rpartition(":")
    ip = (
        ipaddress.ip_address(host[1:-1])
        if host.startswith("[")
        else ipaddress.IPv4Address(int(host, 16))
    )
    return str(ip), int(port, 16)


Held = tuple[str, int, tuple[RealServer, ...]]  # scheduler, persistence, real servers


def read(ipvs: Any) -> dict[VirtualServer, Held]:
    """Every address virtual service IPVS holds, with its real servers."""
    servers = real_servers()
    return {
        vs: (sched, persist, tuple(servers.get(vs, ()))) for vs, sched, persist in services(ipvs)
    }


def target(held: Held) -> Target:
    """A held virtual service as a sync sees it: its serving real servers (weight > 0)."""
    scheduler, persistence, servers = held
    return Target(
        scheduler, persistence, frozenset((r.address, r.port) for r in servers if r.weight > 0)
    )


def dump(ipvs: Any) -> dict[VirtualServer, tuple[Target, frozenset[tuple[str, int]]]]:
    """What IPVS holds: each virtual service with its serving real servers, and those of
    weight 0 (draining) apart."""
    return {
        vs: (target(h), frozenset((r.address, r.port) for r in h[2] if r.weight == 0))
        for vs, h in read(ipvs).items()
    }


def dummy(ipr: Any, name: str) -> int:
    """The dummy interface's index, made (and left down, as kube-ipvs0) if missing."""
    links = ipr.link_lookup(ifname=name)
    if not links:
        ipr.link("add", ifname=name, kind="dummy")
        links = ipr.link_lookup(ifname=name)
    return int(links[0])


def held_addresses(ipr: Any, index: int) -> set[str]:
    return {str(ipaddress.ip_address(m.get("address"))) for m in ipr.get_addr(index=index)}


def add_addresses(ipr: Any, index: int, addresses: set[str]) -> int:
    """Add addresses to the dummy (one there already is fine: no dump of them all)."""
    count = 0
    for address in sorted(addresses):
        length = 32 if address_family(address) == 4 else 128
        try:
            ipr.addr("add", index=index, address=address, prefixlen=length)
            count += 1
        except NetlinkError as exc:
            if exc.code != errno.EEXIST:
                raise
    return count


def del_addresses(ipr: Any, index: int, addresses: set[str]) -> int:
    count = 0
    for address in sorted(addresses):
        length = 32 if address_family(address) == 4 else 128
        try:
            ipr.addr("del", index=index, address=address, prefixlen=length)
            count += 1
        except NetlinkError:
            pass  # not there
    return count


def write_sysctls(values: dict[str, int]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys", key)
        if path.exists() and os.access(path, os.W_OK):
            path.write_text(f"{value}\n")
        else:
            log.warning("sysctl %s: not available here", key.replace("/", "."))
