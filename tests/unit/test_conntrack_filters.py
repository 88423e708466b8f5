"""Which UDP conntrack entries a sync deletes: those of endpoints that stopped serving.

A terminating endpoint that still serves keeps its flows (as kube-proxy's reconciler), on
every frontend, through both paths: a changeset (incremental syncs) and a verified full
sync's element diff (after a restart, what was programmed is read from the kernel).
"""

from __future__ import annotations

from types import ModuleType

from lace_proxy.dataplane.conntrack import (
    StaleFlows,
    stale_udp_filters,
    stale_udp_filters_by_elements,
)
from lace_proxy.model.endpointslice import EndpointPort
from lace_proxy.model.service import ServicePort

from .tablekit import ep, eps, svc

DNS = svc(
    "dns",
    type="LoadBalancer",
    ports=(ServicePort("dns", "UDP", 53, 8080, node_port=30053),),
    external_ips=("192.0.2.7",),
    lb_ingress_ips=("192.0.2.8",),
)
PORTS = (EndpointPort("dns", "UDP", 8080),)
OLD, NEW = "10.0.0.1", "10.0.0.2"
TERMINATING = {"ready": False, "serving": True, "terminating": True}


def deleted(stale: StaleFlows) -> set[tuple[str, ...]]:
    """The flows moved off an endpoint (none here is untranslated: the service had some)."""
    assert stale.untranslated == []
    return set(stale.moved)


def to(endpoint: str) -> set[tuple[str, ...]]:
    """The deletions of every flow to `endpoint`: by each address, and by the NodePort."""
    reply = ("--reply-src", endpoint, "--reply-port-src", "8080")
    by_address = {
        ("--orig-dst", address, "--orig-port-dst", "53", *reply)
        for address in ("10.96.0.10", "192.0.2.7", "192.0.2.8")
    }
    return by_address | {("--orig-port-dst", "30053", *reply)}


def test_flows_stay_while_the_endpoint_serves_and_go_when_it_is_removed(
    twin: ModuleType,
) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(DNS)
    table.upsert_slice(eps(ep(OLD), service="dns", ports=PORTS))
    table.build()
    table.commit()
    steps = [
        (ep(OLD), ep(NEW)),  # the new pod is ready
        (ep(OLD, **TERMINATING), ep(NEW)),  # the old one terminates, still serving
        (ep(NEW),),  # it is removed
    ]
    found = []
    for endpoints in steps:
        table.upsert_slice(eps(*endpoints, service="dns", ports=PORTS))
        found.append(deleted(stale_udp_filters(table.build())))
        table.commit()
    assert found == [set(), set(), to(OLD)]


def test_not_serving_is_stale(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(DNS)
    table.upsert_slice(eps(ep(OLD), ep(NEW), service="dns", ports=PORTS))
    table.build()
    table.commit()
    gone = ep(OLD, ready=False, serving=False, terminating=True)
    table.upsert_slice(eps(gone, ep(NEW), service="dns", ports=PORTS))
    assert deleted(stale_udp_filters(table.build())) == to(OLD)


def test_a_full_sync_after_a_restart_spares_standby_endpoints(twin: ModuleType) -> None:
    """The kernel's maps held OLD; now it is terminating (on standby), or gone."""
    programmed = {
        "endpoints-0-v4": {
            f"{a} . udp . 53 : {OLD} . 8080" for a in ("10.96.0.10", "192.0.2.7", "192.0.2.8")
        },
        "nodeport-endpoints-0-v4": {f"udp . 30053 : {OLD} . 8080"},
    }
    wanted = {
        "endpoints-0-v4": {
            f"{a} . udp . 53 : {NEW} . 8080" for a in ("10.96.0.10", "192.0.2.7", "192.0.2.8")
        },
        "nodeport-endpoints-0-v4": {f"udp . 30053 : {NEW} . 8080"},
    }
    diff = {name: (programmed[name], wanted[name]) for name in programmed}
    for endpoints, expected in (((ep(OLD, **TERMINATING), ep(NEW)), set()), ((ep(NEW),), to(OLD))):
        table = twin.ServiceTable("n1")
        table.upsert_service(DNS)
        table.upsert_slice(eps(*endpoints, service="dns", ports=PORTS))
        table.build()
        table.commit()
        assert deleted(stale_udp_filters_by_elements(diff, table.plans())) == expected
    # An endpoint now at another index (another endpoint left) is still the frontend's.
    element = f"10.96.0.10 . udp . 53 : {OLD} . 8080"
    shifted = {"endpoints-1-v4": ({element}, set()), "endpoints-0-v4": (set(), {element})}
    assert stale_udp_filters_by_elements(shifted).moved == []


UNTRANSLATED = {
    *(
        ("--orig-dst", a, "--orig-port-dst", "53", "--reply-src", a)
        for a in ("10.96.0.10", "192.0.2.7", "192.0.2.8")
    ),
    ("--orig-port-dst", "30053", "--reply-port-src", "30053"),
}


def test_a_frontend_just_served_drops_only_its_untranslated_flows(twin: ModuleType) -> None:
    """Flows rejected while the service had no endpoints were never translated (their reply
    comes from the frontend): they go. Translated ones stay on their endpoint: kube-proxy's,
    at a switch-over, included."""
    table = twin.ServiceTable("n1")
    table.upsert_service(DNS)
    table.build()
    table.commit()
    table.upsert_slice(eps(ep(NEW), service="dns", ports=PORTS))
    stale = stale_udp_filters(table.build())
    assert (stale.moved, set(stale.untranslated)) == ([], UNTRANSLATED)
    table.commit()
    # The same after a restart: the kernel's count sets lacked the frontends.
    served = {
        "endpoints-count-1-v4": {
            f"{a} . udp . 53" for a in ("10.96.0.10", "192.0.2.7", "192.0.2.8")
        },
        "nodeport-endpoints-count-1-v4": {"udp . 30053"},
    }
    diff = {name: (set(), elements) for name, elements in served.items()}
    stale = stale_udp_filters_by_elements(diff, table.plans())
    assert (stale.moved, set(stale.untranslated)) == ([], UNTRANSLATED)
    # A frontend whose count changed was served before; a frontend in its kind's set is
    # there for a service without endpoints too: neither is just served.
    unserved = {
        "endpoints-count-1-v4": ({"10.96.0.10 . udp . 53"}, set()),
        "endpoints-count-2-v4": (set(), {"10.96.0.10 . udp . 53"}),
        "frontends-ext-v4": (set(), {"192.0.2.9 . udp . 53"}),
    }
    assert stale_udp_filters_by_elements(unserved).untranslated == []
