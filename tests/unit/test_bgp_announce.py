"""What a node announces by BGP, from the table's plans (both twins) and the network layout."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from lace_proxy.bgp.announce import RouteCache, routes
from lace_proxy.config.bgp import LaceBgpAnnounceConfig
from lace_proxy.model.endpointslice import EndpointPort
from lace_proxy.model.service import BgpAnnotations, ServicePort
from lace_proxy.networks.graph import NetworkLayout
from lace_proxy.table.changeset import Access

from .tablekit import built, ep, eps, svc

DEFAULT = LaceBgpAnnounceConfig()
NO_MODEL = NetworkLayout()
LB, EXTERNAL, VIP = "192.0.2.10", "198.51.100.7", "10.96.0.10"


def lb(name: str = "web", policy: str = "Cluster", **kw: Any) -> Any:
    return svc(
        name,
        type="LoadBalancer",
        lb_ingress_ips=(LB,),
        external_ips=(EXTERNAL,),
        external_traffic_policy=policy,
        **kw,
    )


def test_external_addresses_by_default_and_cluster_ips_only_when_asked(twin: ModuleType) -> None:
    t = built(twin, lb(), eps(ep("10.0.0.1", node="n2")))
    assert routes(t.plans(), DEFAULT, NO_MODEL) == {f"{EXTERNAL}/32": (), f"{LB}/32": ()}
    per_service = LaceBgpAnnounceConfig(external_ips=False, cluster_ips="perService")
    assert routes(t.plans(), per_service, NO_MODEL) == {f"{LB}/32": (), f"{VIP}/32": ()}
    aggregate = LaceBgpAnnounceConfig(False, False, "aggregate")
    cidrs = ("10.96.0.0/12", "fd00:96::/112", "10.96.0.1/12")
    assert routes(t.plans(), aggregate, NO_MODEL, cidrs) == {
        "10.96.0.0/12": (),
        "fd00:96::/112": (),
    }


def test_local_policy_announces_only_where_a_ready_endpoint_is(twin: ModuleType) -> None:
    objs = (lb(policy="Local"), eps(ep("10.0.0.1", node="n2")))
    assert routes(built(twin, *objs, node="n1").plans(), DEFAULT, NO_MODEL) == {}
    assert set(routes(built(twin, *objs, node="n2").plans(), DEFAULT, NO_MODEL)) == {
        f"{EXTERNAL}/32",
        f"{LB}/32",
    }
    # The last local endpoint goes: withdrawn by the sync that sees it.
    t = built(twin, *objs, node="n2")
    t.upsert_slice(eps(ep("10.0.0.1", node="n1")))
    t.build()
    t.commit()
    assert routes(t.plans(), DEFAULT, NO_MODEL) == {}


def test_local_policy_with_only_a_terminating_local_endpoint_is_withdrawn(
    twin: ModuleType,
) -> None:
    """The plan still forwards to it (serving, terminating), but new connections should go
    elsewhere: the health check node port says 503, and the route goes."""
    terminating = ep("10.0.0.1", node="n1", ready=False, serving=True, terminating=True)
    t = built(twin, lb(policy="Local"), eps(terminating, ep("10.0.0.2", node="n2")))
    assert routes(t.plans(), DEFAULT, NO_MODEL) == {}


def test_nothing_for_a_service_without_ready_endpoints(twin: ModuleType) -> None:
    t = built(twin, lb(), eps(ep("10.0.0.1", ready=False, serving=False)))
    assert routes(t.plans(), DEFAULT, NO_MODEL) == {}


def test_the_annotation_opts_in_and_out_and_gives_communities(twin: ModuleType) -> None:
    dns = (ServicePort("dns", "UDP", 53, 53),)
    objs = (
        svc("plain", ips=("10.96.0.11",)),
        eps(ep("10.0.0.2"), service="plain"),
        svc("opted-in", ips=("fd00:96::12",), bgp=BgpAnnotations(True, ("65000:1",))),
        eps(ep("fd00::2"), service="opted-in", address_type="IPv6"),
        lb("opted-out", ips=("10.96.0.13",), bgp=BgpAnnotations(False)),
        eps(ep("10.0.0.3"), service="opted-out"),
        # Two services share an ExternalIP (on other ports): its route carries both's.
        svc(
            "a",
            ips=("10.96.0.14",),
            external_ips=("198.51.100.8",),
            bgp=BgpAnnotations(None, ("65000:3", "65000:2")),
        ),
        eps(ep("10.0.0.4"), service="a"),
        svc(
            "b",
            ips=("10.96.0.15",),
            external_ips=("198.51.100.8",),
            ports=dns,
            bgp=BgpAnnotations(None, ("65000:1",)),
        ),
        eps(ep("10.0.0.5"), service="b", ports=(EndpointPort("dns", "UDP", 53),)),
    )
    assert routes(built(twin, *objs).plans(), DEFAULT, NO_MODEL) == {
        "198.51.100.8/32": ("65000:1", "65000:2", "65000:3"),
        "fd00:96::12/128": ("65000:1",),
    }


def test_under_the_lace_model_only_what_an_external_network_may_reach(twin: ModuleType) -> None:
    layout = NetworkLayout(
        networks=("default", "internet", "host-local"),
        host_local="host-local",
        ranges=(
            (4, "0.0.0.0", "9.255.255.255", "internet"),
            (4, "10.0.0.0", "10.0.255.255", "default"),
            (4, "10.1.0.0", "255.255.255.255", "internet"),
        ),
        pod_prefixes=(("10.0.0.0/16", "default"),),
    )
    t = built(twin, lb(), eps(ep("10.0.0.1")))
    for access, announced in (
        (None, True),  # no network model for this service: anyone may reach it
        (Access("default", ("default", "internet")), True),
        (Access("default", ("default", "host-local")), False),  # nothing from outside
        (Access(None, ()), False),  # bound to no network: it carries nothing
    ):
        t.set_access("default/web", access)
        t.build()
        t.commit()
        assert bool(routes(t.plans(), DEFAULT, layout)) is announced, access


class CountingCache(RouteCache):
    """A RouteCache that counts the plans it works out."""

    worked = 0

    def _plan_routes(self, plan: Any, outside: frozenset[str]) -> Any:
        self.worked += 1
        return super()._plan_routes(plan, outside)


def test_the_cache_agrees_with_a_fresh_computation_and_works_out_only_changed_plans(
    twin: ModuleType,
) -> None:
    cache = CountingCache(DEFAULT)
    t = built(
        twin,
        lb(policy="Local"),
        eps(ep("10.0.0.1", node="n1")),
        svc("other", ips=("10.96.0.30",), external_ips=("198.51.100.30",)),
        eps(ep("10.0.0.3"), service="other"),
    )

    def step() -> None:
        t.build()
        t.commit()
        assert cache.routes(t.plans(), NO_MODEL) == routes(t.plans(), DEFAULT, NO_MODEL)

    step()
    assert cache.worked == 2
    cache.worked = 0
    step()  # nothing changed: nothing worked out again
    assert cache.worked == 0
    t.upsert_slice(eps(ep("10.0.0.1", node="n2")))  # web's endpoint leaves this node
    step()
    assert cache.worked == 1 and f"{LB}/32" not in cache.routes(t.plans(), NO_MODEL)
    t.upsert_service(lb(policy="Local", bgp=BgpAnnotations(None, ("65000:9",))))
    t.upsert_slice(eps(ep("10.0.0.1", node="n1")))
    step()
    assert cache.routes(t.plans(), NO_MODEL)[f"{LB}/32"] == ("65000:9",)
    t.delete_service("default/other")
    step()
    assert "198.51.100.30/32" not in cache.routes(t.plans(), NO_MODEL)
