"""Keeps the egress SNAT table in step with the node's routing table.

A thread of its own (it waits on select and reads the kernel off the event loop) listens to
rtnetlink's route, address and link events, and is told the Lace pod networks' prefixes and
the node's podCIDRs by the proxier (`set_pod_networks`, `set_node_pod_cidrs`); after each burst
(`debounce`) it reads the routing table again, works out the source ranges
(`RoutingSnapshot.source_ranges`) and the pod interfaces (`RoutingSnapshot.pod_interfaces`,
so a new pod's interface counts once its route is there) and, when they differ from what is
programmed, rewrites the egress table. Every `resync` seconds it rewrites the
table anyway (someone may have deleted it). A refused transaction is logged and counted and
retried with backoff; what was programmed keeps working meanwhile.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import time
from typing import Any

from pyroute2.netlink.rtnl import (
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV4_ROUTE,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_IPV6_ROUTE,
    RTMGRP_LINK,
)

from lace_proxy.dataplane.egress_snat import EgressSnat, Ranges, nft_interface_name
from lace_proxy.dataplane.netlink import NetlinkSocket
from lace_proxy.dataplane.netns import enter_netns
from lace_proxy.dataplane.nftables.transaction import NftError
from lace_proxy.dataplane.rtnetlink import RtnlChannel
from lace_proxy.egress.routing import read_snapshot

log = logging.getLogger(__name__)

GROUPS = RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR
GROUPS |= RTMGRP_LINK
MAX_BACKOFF = 30.0


class EgressController:
    """Follows route changes into the egress table (see the module docstring)."""

    def __init__(
        self,
        snat: EgressSnat,
        *,
        netns: str | None = None,
        metrics: Any = None,
        resync: float = 30.0,
        debounce: float = 0.1,
    ) -> None:
        self.snat = snat
        self.netns = netns
        self.metrics = metrics
        self.resync = resync
        self.debounce = debounce
        self.programmed: Ranges | None = None  # what the table holds (None: not yet)
        self.pod_interfaces: tuple[str, ...] | None = None  # derived ones the table holds
        self.syncs = 0  # programmings so far (tests wait on it)
        self.errors = 0
        self.pod_networks: tuple[str, ...] = ()  # the Lace pod networks' prefixes
        self.node_pod_cidrs: tuple[str, ...] = ()  # this node's podCIDRs (its Node object)
        self._programmed_pods: tuple[str, ...] | None = None
        self._unusable: tuple[str, ...] = ()  # pod interfaces whose names nft cannot take
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._stop_w, self._wake_w, self._wake_r):
            os.set_blocking(fd, False)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = False
        self._dirty = self._force = True

    def set_pod_networks(self, prefixes: tuple[str, ...]) -> None:
        """The pod networks' prefixes changed (from the proxier's sync; any thread)."""
        prefixes = tuple(sorted(prefixes))
        if prefixes != self.pod_networks:
            self.pod_networks = prefixes
            self._poke(self._wake_w)

    def set_node_pod_cidrs(self, prefixes: tuple[str, ...]) -> None:
        """The node's podCIDRs changed (pod interfaces route them; any thread)."""
        prefixes = tuple(sorted(prefixes))
        if prefixes != self.node_pod_cidrs:
            self.node_pod_cidrs = prefixes
            self._poke(self._wake_w)

    def start(self) -> None:
        """Start following; returns once the first programming was attempted."""
        if self._closed or self._thread is not None:
            raise RuntimeError("the egress controller runs once")
        self._thread = threading.Thread(target=self._run, name="lace-egress", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        """Stop following (the table stays: connections keep their sources). Idempotent."""
        if self._closed:
            return
        self._poke(self._stop_w)
        thread = self._thread
        if thread is not None:
            thread.join(10)
        with self._lock:
            self._closed = True
            if thread is None or not thread.is_alive():  # else it may still select on them
                for fd in (self._stop_r, self._stop_w, self._wake_r, self._wake_w):
                    os.close(fd)

    def _poke(self, fd: int) -> None:
        """Wake the thread (never blocks: a full pipe already wakes it)."""
        with self._lock, contextlib.suppress(BlockingIOError):
            if not self._closed:
                os.write(fd, b"x")

    def sync(self, *, force: bool = False) -> bool:
        """Read the routes and program the table if its ranges changed (or `force`); on the
        caller's thread, in the caller's namespace. True when the table is as wanted."""
        try:
            with RtnlChannel() as rtnl:
                snapshot = read_snapshot(rtnl)
            ranges = {fam: snapshot.source_ranges(fam) for fam in (4, 6)}
            pods = self.pod_networks
            interfaces = self._pod_interfaces(snapshot.pod_interfaces(self._pod_prefixes()))
            same = (ranges, pods, interfaces) == (
                self.programmed,
                self._programmed_pods,
                self.pod_interfaces,
            )
            if same and not force:
                return True
            self.snat.apply(ranges, pods, interfaces)
        except Exception as exc:  # counted and retried: the thread must go on following
            self.errors += 1
            what = "refused" if isinstance(exc, NftError) else "failed"
            log.error("egress SNAT table %s (kept as it was; retrying): %s", what, exc)
            if self.metrics is not None:
                self.metrics.record_egress_sync(False, 0)
            return False
        if ranges != self.programmed:
            log.info("egress SNAT: %s", _describe(ranges))
        if interfaces != self.pod_interfaces:
            log.info("egress SNAT: %s", self._describe_interfaces(interfaces))
        self.programmed, self._programmed_pods, self.pod_interfaces = ranges, pods, interfaces
        self.syncs += 1
        if self.metrics is not None:
            self.metrics.record_egress_sync(True, sum(len(r) for r in ranges.values()))
        return True

    def _pod_prefixes(self) -> tuple[str, ...]:
        return (*self.snat.settings.pod_cidrs, *self.pod_networks, *self.node_pod_cidrs)

    def _pod_interfaces(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """`names` that nft can take; the others are logged (once) and their traffic is
        translated like any leaving the node."""
        unusable = tuple(n for n in names if not nft_interface_name(n))
        if unusable and unusable != self._unusable:
            log.warning(
                "egress SNAT: pod interfaces %s have names nftables rules cannot hold: their "
                "pods see the node's address (name them plainly or set "
                "detectLocal.interfaceNamePrefix)",
                ", ".join(repr(n) for n in unusable),
            )
        self._unusable = unusable
        return tuple(n for n in names if n not in unusable)

    def _describe_interfaces(self, names: tuple[str, ...]) -> str:
        prefix = self.snat.settings.pod_interface_prefix
        known = [f"{prefix}*"] if prefix else []
        known += names
        if not known:
            return (
                "no pod interface known (no detectLocal.interfaceNamePrefix, no on-link route "
                "into a pod prefix): traffic to local pods outside the pod prefixes is "
                "translated too"
            )
        return f"pod interfaces (untranslated): {', '.join(known)}"

    def _run(self) -> None:
        try:
            if self.netns is not None:
                enter_netns(self.netns)
        except OSError:
            log.exception("egress SNAT: cannot enter network namespace %s", self.netns)
            self._ready.set()
            return
        while True:
            try:
                with NetlinkSocket(socket.NETLINK_ROUTE, groups=GROUPS) as events:
                    if self._loop(events):
                        return
            except OSError as exc:
                log.warning("egress SNAT: route events lost (%s); listening anew", exc)
                self._dirty = True
                time.sleep(self.debounce)

    def _loop(self, events: NetlinkSocket) -> bool:
        """Follow until stopped (True) or the event socket fails (raises)."""
        backoff, retry_at = 1.0, 0.0
        next_full = time.monotonic() + self.resync
        while True:
            now = time.monotonic()
            if now >= next_full:
                self._dirty, self._force, next_full = True, True, now + self.resync
            if self._dirty and now >= retry_at:
                if self.sync(force=self._force):
                    self._dirty = self._force = False
                    backoff = 1.0
                else:
                    retry_at, backoff = now + backoff, min(backoff * 2, MAX_BACKOFF)
                self._ready.set()
            wake = next_full if not self._dirty else min(next_full, max(retry_at, now + 0.05))
            ready, _, _ = select.select(
                [events.fileno(), self._stop_r, self._wake_r],
                [],
                [],
                max(0.0, wake - time.monotonic()),
            )
            if self._stop_r in ready:
                return True
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 512)
                self._dirty = True
            if events.fileno() in ready:
                # Events are not parsed (in IPVS mode, each address the dummy interface gains
                # is two): they say that something changed, and the snapshot reads what.
                self._dirty = True
                events.discard()
                time.sleep(self.debounce)  # a route change comes as a burst of messages
                events.discard()


def _describe(ranges: Ranges) -> str:
    parts = [f"{a}-{b} -> {s}" for fam in (4, 6) for a, b, s in ranges.get(fam, [])]
    return "; ".join(parts) or "no route with a preferred source"
