"""`doctor egress` on a routing snapshot given as data (the kernel-read path is tested in
tests/netns/test_egress.py against the traffic's own answer)."""

from __future__ import annotations

from dataclasses import replace

from lace_proxy.doctor import (
    EgressSettingsView,
    NodeFacts,
    NodeReport,
    NodeSettingsView,
    diagnose_egress,
    diagnose_node,
)
from lace_proxy.egress.routing import Address, Route, RoutingSnapshot

SNAPSHOT = RoutingSnapshot(
    routes=(
        Route("10.250.0.0/24", None, "eth0", "10.250.0.11"),
        Route("198.18.0.0/24", "192.0.2.1", "eth1", None),
        Route("10.251.1.11/32", None, "va1", None),
    ),
    addresses=(Address("eth0", "10.250.0.11", 24), Address("eth1", "192.0.2.11", 24)),
    mtus=(("eth0", 1500), ("eth1", 1500), ("va1", 1500)),
)
ON = EgressSettingsView(pod_cidrs=("10.251.0.0/16",))
POD = "10.251.1.11"


def test_no_route_is_a_problem_with_an_action() -> None:
    report = diagnose_egress(SNAPSHOT, ON, POD, "8.8.8.8")
    assert report.exit_code == 1 and report.source is None
    (finding,) = report.findings
    assert finding.code == "no_route" and "default route" in finding.action
    assert "no_route: this node has no route to 8.8.8.8" in report.to_text()


def test_what_is_not_translated_and_why() -> None:
    report = diagnose_egress(SNAPSHOT, ON, POD, "198.18.0.9")
    assert (report.translated, report.source, report.exit_code) == (True, "192.0.2.11", 0)
    assert report.why == "source-NATed to the route's preferred source (eth1's address)"
    off = EgressSettingsView(enabled=False, pod_cidrs=ON.pod_cidrs)
    report = diagnose_egress(SNAPSHOT, off, POD, "198.18.0.9")
    assert (report.translated, report.source) == (False, POD)
    assert "unless the CNI masquerades" in report.why
    kept = EgressSettingsView(pod_cidrs=ON.pod_cidrs, non_masquerade_cidrs=("198.18.0.0/16",))
    assert diagnose_egress(SNAPSHOT, kept, POD, "198.18.0.9").source == POD
    other = diagnose_egress(SNAPSHOT, ON, "10.99.0.1", "198.18.0.9")
    assert [f.code for f in other.findings] == ["not_a_pod_address"]
    assert other.exit_code == 0  # a note, not a problem
    assert diagnose_egress(SNAPSHOT, ON, POD, "198.18.0.9").to_dict()["ok"] is True


def test_a_pod_of_this_node_outside_the_pod_prefixes_is_not_translated() -> None:
    """Routed to a pod interface (by detectLocal.interfaceNamePrefix, or because it routes a
    pod prefix, here the node's podCIDR, on-link), the connection keeps the pod's source."""
    local = replace(
        SNAPSHOT,
        routes=(*SNAPSHOT.routes, Route("10.253.1.11/32", None, "vax", None)),
        addresses=(*SNAPSHOT.addresses, Address("vax", "10.253.1.1", 32)),
    )
    assert diagnose_egress(local, ON, POD, "10.253.1.11").source == "10.253.1.1"
    for settings in (
        replace(ON, pod_interface_prefix="v"),
        replace(ON, node_pod_cidrs=("10.253.1.0/24",)),
    ):
        report = diagnose_egress(local, settings, POD, "10.253.1.11")
        assert (report.translated, report.source) == (False, POD)
        assert report.why == "routed to vax, a pod interface (a pod of this node): untranslated"


FINE = NodeFacts(
    sysctls={
        "net.ipv4.ip_forward": 1,
        "net.netfilter.nf_conntrack_max": 1000,
        "net.netfilter.nf_conntrack_count": 10,
    },
    ipvs=True,
    modules=frozenset({"ip_vs", "ip_vs_rr"}),
    interfaces=(("eth0", 1500),),
    uplink="eth0",
)


def statuses(report: NodeReport) -> dict[str, str]:
    return {c.check: c.status for c in report.checks}


def test_doctor_node_on_facts_given_as_data() -> None:
    ipvs = NodeSettingsView(mode="ipvs")
    report = diagnose_node(FINE, ipvs)
    assert report.exit_code == 0 and set(statuses(report).values()) == {"ok"}
    full = replace(FINE, sysctls={**FINE.sysctls, "net.netfilter.nf_conntrack_count": 950})
    assert statuses(diagnose_node(full, ipvs))["conntrack"] == "problem"
    gone = replace(FINE, sysctls={"net.ipv4.ip_forward": 1})
    assert "modprobe nf_conntrack" in diagnose_node(gone, ipvs).checks[1].action
    no_ipvs = diagnose_node(replace(FINE, ipvs=False), ipvs)
    assert statuses(no_ipvs)["ipvs"] == "problem" and no_ipvs.exit_code == 1
    assert "ipvs" not in statuses(diagnose_node(replace(FINE, ipvs=False), NodeSettingsView()))
    mh = diagnose_node(FINE, NodeSettingsView(mode="ipvs", scheduler="mh"))
    assert statuses(mh)["ipvs_scheduler"] == "note" and mh.exit_code == 0
    strict = replace(FINE, sysctls={**FINE.sysctls, "net.ipv4.conf.all.rp_filter": 1})
    assert statuses(diagnose_node(strict, ipvs))["rp_filter"] == "note"
    broken = diagnose_node(replace(FINE, nft_error="nft: not found"), ipvs)
    assert statuses(broken)["nftables"] == "problem"
    assert statuses(diagnose_node(replace(FINE, uplink=None), ipvs))["mtu"] == "note"
    text = diagnose_node(replace(FINE, tables=(("ip", "kube-proxy"),)), ipvs).to_text()
    assert "problem      kube_proxy_nftables: kube-proxy's nftables tables are here" in text


def test_a_dropping_route_is_where_the_packet_ends() -> None:
    dropping = RoutingSnapshot(
        routes=(*SNAPSHOT.routes, Route("198.18.0.128/25", None, "", None, kind="blackhole")),
        addresses=SNAPSHOT.addresses,
        mtus=SNAPSHOT.mtus,
    )
    report = diagnose_egress(dropping, ON, POD, "198.18.0.200")
    assert [f.code for f in report.findings] == ["dropped_by_route"]
    assert report.exit_code == 1 and report.source is None
    assert "route        blackhole 198.18.0.128/25" in report.to_text()
    assert diagnose_egress(dropping, ON, POD, "198.18.0.9").source == "192.0.2.11"
    # No SNAT element for it either (the kernel drops it before postrouting anyway).
    assert [a for a, _, _ in dropping.source_ranges(4)].count("198.18.0.128") == 0
