"""The proxier's hook for BGP: after each successful sync, what this node announces is
worked out from the plans (announce.py) and handed to the speaker (speaker.py).

The speaker is looked at first: one found dead is started again (logged, counted). A
speaker that fails is logged and counted and never fails the sync: the kernel's programming
does not depend on BGP, and the next sync tries again. Nothing is announced before the
Node object gives this node's InternalIP (the routes' next hop); when the Node goes, or is
being deleted, everything is withdrawn.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from lace_proxy.bgp.announce import RouteCache, Routes
from lace_proxy.bgp.bird import BirdError, NodeFacts, peers_of, read_passwords
from lace_proxy.bgp.speaker import Speaker
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model import Node
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table import Plan

log = logging.getLogger(__name__)


class Announcer:
    """Keeps the speaker announcing what the plans say (see the module's docstring)."""

    def __init__(
        self,
        speaker: Speaker,
        service_cidrs: tuple[str, ...] = (),
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.speaker = speaker
        self.settings = speaker.settings
        self._service_cidrs = service_cidrs  # lace.serviceCIDRs, beside ServiceCIDR objects'
        self._metrics = metrics or ProxyMetrics()
        self._waiting = False  # logged once: no InternalIP yet
        self._no_aggregate = False  # logged once: clusterIPs aggregate, no service CIDR
        # The node as last announced from: with its Node gone (or being deleted), what it
        # announced is withdrawn from the same sessions.
        self._facts: NodeFacts | None = None
        self._routes = RouteCache(self.settings.announce)
        self._sent: tuple[Routes, NodeFacts, dict[str, str | None]] | None = None  # BIRD took
        self._keys: dict[str, str] = {}  # each peer's last good key
        self._key_problems: list[str] = []  # as last logged

    def sync(self, plans: Iterable[Plan], layout: NetworkLayout, node: Node | None) -> None:
        """Announce what `plans` say for this node (`node`: its Node object, if known). Never
        raises: a failure is logged and counted, and the next call tries again."""
        try:
            self._sync(plans, layout, node)
        except (BirdError, OSError) as exc:  # BIRD refused, or could not be run
            log.error("BGP: %s; the speaker keeps what it announced", exc)
            self._metrics.record_bgp_error("failed")
        except Exception:  # a bug of ours: told in full, and still never the sync's failure
            log.exception("BGP: announcing failed; the speaker keeps what it announced")
            self._metrics.record_bgp_error("failed")

    def _sync(self, plans: Iterable[Plan], layout: NetworkLayout, node: Node | None) -> None:
        internal = tuple(a for kind, a in node.addresses if kind == "InternalIP") if node else ()
        if node is not None and node.deleting:
            internal = ()  # the node is going: withdraw (as /healthz turns 503)
        facts = NodeFacts(internal, node.labels) if internal and node else self._facts
        if facts is None:
            if not self._waiting:
                log.warning("BGP: nothing announced until this node's InternalIP is known")
            self._waiting = True
            return
        self._waiting, self._facts = False, facts
        wanted: Routes = {}
        if internal:
            cidrs = (*self._service_cidrs, *layout.service_cidrs)
            self._tell_no_aggregate(not cidrs and self.settings.announce.cluster_ips == "aggregate")
            wanted = self._routes.routes(plans, layout, cidrs)
        restarts = self.speaker.restarts
        try:
            self.speaker.check()
            # The keys are read at every sync: a Secret's new key reaches BIRD at the next
            # full sync (syncPeriod) at the latest.
            passwords, problems = read_passwords(peers_of(self.settings, facts), self._keys)
            self._keys.update((a, k) for a, k in passwords.items() if k is not None)
            self._tell_key_problems(problems)
            sent = (wanted, facts, passwords)
            if sent != self._sent:  # RouteCache hands out the same routes again
                if self.speaker.sync(facts, wanted, passwords):
                    log.info("BGP: announcing %d routes", len(wanted))
                self._sent = sent  # only once BIRD took it: else asked again
        finally:
            for _ in range(self.speaker.restarts - restarts):
                self._metrics.record_bgp_error("restarted")
            peers = [p.state for p in self.speaker.peers()]
            self._metrics.record_bgp(peers, len(self.speaker.routes))

    def _tell_key_problems(self, problems: list[str]) -> None:
        """Count each sync's key problems; log them when they change (and their end)."""
        for _ in problems:
            self._metrics.record_bgp_error("failed")
        if problems != self._key_problems:
            for problem in problems:
                log.error("BGP: %s", problem)
            if not problems:
                log.info("BGP: every peer's key file is read again")
        self._key_problems = problems

    def _tell_no_aggregate(self, missing: bool) -> None:
        """Warn once (again after a fix) that clusterIPs: aggregate has nothing to announce."""
        if missing and not self._no_aggregate:
            log.warning(
                "BGP: lace.bgp.announce.clusterIPs is aggregate, but no service CIDR is known "
                "(lace.serviceCIDRs, ServiceCIDR objects): no ClusterIP range is announced"
            )
        self._no_aggregate = missing

    def stop(self) -> None:
        """Stop the speaker, the routers keeping this node's routes for the graceful restart
        time (lace-proxy is restarting, or the node is being drained by the operator)."""
        self.speaker.stop()
