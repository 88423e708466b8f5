"""Service table semantics, run against both twins (the `twin` fixture)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import ModuleType
from typing import Any

from lace_proxy.model.endpointslice import EndpointPort
from lace_proxy.model.service import BgpAnnotations, ServicePort
from lace_proxy.table.changeset import CLUSTER_IP, EXTERNAL_IP, LOAD_BALANCER, NODE_PORT, Access

from .tablekit import built, ep, eps, plan_view, svc


def only_plan(table: Any) -> Any:
    plans = list(table.plans())
    assert len(plans) == 1, [p.id for p in plans]
    return plans[0]


def ips(backends: Any) -> list[str]:
    return sorted(b.ip for b in backends)


def test_twin_reports_its_implementation(twin: ModuleType) -> None:
    assert twin.ServiceTable("n1").implementation == twin.IMPLEMENTATION
    assert twin.IMPLEMENTATION in ("compiled", "pure")


def test_cluster_ip_gets_all_ready_endpoints(twin: ModuleType) -> None:
    table = built(
        twin, svc(), eps(ep("10.0.0.1"), ep("10.0.0.2", "n2"), ep("10.0.0.3", ready=False))
    )
    plan = only_plan(table)
    assert plan.id == "default/web:http/TCP/v4"
    assert (plan.cluster_ip, plan.port, plan.protocol, plan.family) == ("10.96.0.10", 80, "TCP", 4)
    assert ips(plan.cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    assert {b.port for b in plan.cluster_backends} == {8080}
    assert [b.local for b in sorted(plan.cluster_backends, key=lambda b: b.ip)] == [True, False]
    assert plan.internal_verdict is None and plan.external_verdict is None


def test_dual_stack_makes_one_plan_per_family_with_matching_endpoints(twin: ModuleType) -> None:
    table = built(
        twin,
        svc(ips=("10.96.0.10", "fd00:96::10")),
        eps(ep("10.0.0.1"), name="web-v4"),
        eps(ep("fd00::1"), ep("fd00::2"), name="web-v6", address_type="IPv6"),
    )
    plans = {p.family: p for p in table.plans()}
    assert set(plans) == {4, 6}
    assert ips(plans[4].cluster_backends) == ["10.0.0.1"]
    assert ips(plans[6].cluster_backends) == ["fd00::1", "fd00::2"]
    assert plans[6].cluster_ip == "fd00:96::10"


def test_endpoints_merge_across_slices_by_port_name_and_protocol(twin: ModuleType) -> None:
    ports = (ServicePort("http", "TCP", 80, 8080), ServicePort("dns", "UDP", 53, 5353))
    table = built(
        twin,
        svc(ports=ports),
        eps(ep("10.0.0.1"), name="web-a"),
        eps(
            ep("10.0.0.2"),
            name="web-b",
            ports=(EndpointPort("http", "TCP", 8080), EndpointPort("dns", "UDP", 5353)),
        ),
    )
    plans = {p.port_name: p for p in table.plans()}
    assert ips(plans["http"].cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    assert [(b.ip, b.port) for b in plans["dns"].cluster_backends] == [("10.0.0.2", 5353)]
    assert plans["dns"].protocol == "UDP"


def test_duplicate_endpoint_keeps_the_non_terminating_copy(twin: ModuleType) -> None:
    for names in (("a", "b"), ("b", "a")):
        table = built(
            twin,
            svc(),
            eps(ep("10.0.0.1", ready=False, terminating=True), name=names[0]),
            eps(ep("10.0.0.1"), name=names[1]),
        )
        (backend,) = only_plan(table).cluster_backends
        assert (backend.ip, backend.ready, backend.terminating) == ("10.0.0.1", True, False)


def test_same_ip_on_different_ports_is_not_a_duplicate(twin: ModuleType) -> None:
    table = built(
        twin,
        svc(),
        eps(ep("10.0.0.1"), name="a"),
        eps(ep("10.0.0.1"), name="b", ports=(EndpointPort("http", "TCP", 9090),)),
    )
    assert sorted(b.port for b in only_plan(table).cluster_backends) == [8080, 9090]


def test_terminating_serving_endpoints_are_used_only_without_ready_ones(twin: ModuleType) -> None:
    term = ep("10.0.0.2", ready=False, serving=True, terminating=True)
    gone = ep("10.0.0.3", ready=False, serving=False, terminating=True)
    table = built(twin, svc(), eps(ep("10.0.0.1"), term, gone))
    assert ips(only_plan(table).cluster_backends) == ["10.0.0.1"]
    table = built(twin, svc(), eps(term, gone))
    plan = only_plan(table)
    assert ips(plan.cluster_backends) == ["10.0.0.2"]
    assert plan.cluster_backends[0].terminating
    assert plan.internal_verdict is None


def test_serving_endpoints_left_unused_are_on_standby(twin: ModuleType) -> None:
    """Their existing flows stay (UDP conntrack cleanup spares them); not serving: no."""
    term = ep("10.0.0.2", ready=False, serving=True, terminating=True)
    gone = ep("10.0.0.3", ready=False, serving=False, terminating=True)
    remote = ep("10.0.0.4", node="n2")
    plan = only_plan(built(twin, svc(), eps(ep("10.0.0.1"), term, gone, remote)))
    assert ips(plan.standby_backends) == ["10.0.0.2"]
    assert plan.standby_backends[0].terminating
    # Used as the fallback: not on standby.
    assert only_plan(built(twin, svc(), eps(term, gone))).standby_backends == ()
    # Left out by internalTrafficPolicy Local: on standby, ready or not.
    local = svc(internal_traffic_policy="Local")
    plan = only_plan(built(twin, local, eps(ep("10.0.0.1"), term, gone, remote)))
    assert ips(plan.local_backends) == ["10.0.0.1"]
    assert ips(plan.standby_backends) == ["10.0.0.2", "10.0.0.4"]


def test_service_without_usable_endpoints_rejects_everywhere(twin: ModuleType) -> None:
    not_serving = ep("10.0.0.3", ready=False, serving=False, terminating=True)
    for slices in ((), (eps(not_serving),)):
        plan = only_plan(built(twin, svc(type="NodePort", ports=(np_port(),)), *slices))
        assert plan.cluster_backends == ()
        assert (plan.internal_verdict, plan.external_verdict) == ("reject", "reject")


def test_slice_ports_must_match_the_service_port_name(twin: ModuleType) -> None:
    table = built(twin, svc(), eps(ep("10.0.0.1"), ports=(EndpointPort("other", "TCP", 1),)))
    assert only_plan(table).internal_verdict == "reject"


def np_port(node_port: int = 30080) -> ServicePort:
    return ServicePort("http", "TCP", 80, 8080, node_port)


def test_internal_traffic_policy_local_uses_only_this_nodes_endpoints(twin: ModuleType) -> None:
    local_svc = svc(internal_traffic_policy="Local")
    plan = only_plan(built(twin, local_svc, eps(ep("10.0.0.1"), ep("10.0.0.2", "n2"))))
    assert plan.internal_local
    assert ips(plan.internal_backends) == ["10.0.0.1"]
    assert plan.internal_verdict is None
    plan = only_plan(built(twin, local_svc, eps(ep("10.0.0.2", "n2"))))
    assert plan.internal_backends == ()
    assert plan.internal_verdict == "drop"


def test_external_traffic_policy_local(twin: ModuleType) -> None:
    lb = svc(
        type="LoadBalancer",
        ports=(np_port(),),
        lb_ingress_ips=("192.0.2.10",),
        external_traffic_policy="Local",
        health_check_node_port=32000,
    )
    plan = only_plan(built(twin, lb, eps(ep("10.0.0.1"), ep("10.0.0.2", "n2"))))
    assert plan.external_local and not plan.internal_local
    assert ips(plan.external_backends) == ["10.0.0.1"]
    assert ips(plan.cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    assert plan.health_check_node_port == 32000
    plan = only_plan(built(twin, lb, eps(ep("10.0.0.2", "n2"))))
    assert plan.external_verdict == "drop"
    assert plan.internal_verdict is None
    assert ips(plan.internal_backends) == ["10.0.0.2"]


def test_external_local_prefers_local_terminating_over_nothing(twin: ModuleType) -> None:
    lb = svc(type="NodePort", ports=(np_port(),), external_traffic_policy="Local")
    local_term = ep("10.0.0.1", ready=False, serving=True, terminating=True)
    plan = only_plan(built(twin, lb, eps(local_term, ep("10.0.0.2", "n2"))))
    assert ips(plan.external_backends) == ["10.0.0.1"]
    assert plan.external_verdict is None
    assert ips(plan.cluster_backends) == ["10.0.0.2"]


def test_external_policy_local_is_ignored_for_cluster_ip_only_services(twin: ModuleType) -> None:
    plan = only_plan(built(twin, svc(external_traffic_policy="Local"), eps(ep("10.0.0.2", "n2"))))
    assert not plan.external_local
    assert plan.node_port == 0
    assert [f.kind for f in plan.frontends()] == [CLUSTER_IP]


def test_zone_hints_restrict_to_this_zone_only_when_all_ready_endpoints_have_them(
    twin: ModuleType,
) -> None:
    a = ep("10.0.0.1", hint_zones=("za",))
    b = ep("10.0.0.2", "n2", hint_zones=("zb",))
    plan = only_plan(built(twin, svc(), eps(a, b), zone="za"))
    assert ips(plan.cluster_backends) == ["10.0.0.1"]
    # One ready endpoint without hints: hints are ignored.
    plan = only_plan(built(twin, svc(), eps(a, b, ep("10.0.0.3")), zone="za"))
    assert ips(plan.cluster_backends) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    # No hint for our zone: all endpoints.
    plan = only_plan(built(twin, svc(), eps(a, b), zone="zc"))
    assert ips(plan.cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    # Unready endpoints do not count against hints.
    plan = only_plan(built(twin, svc(), eps(a, b, ep("10.0.0.4", ready=False)), zone="zb"))
    assert ips(plan.cluster_backends) == ["10.0.0.2"]


def test_node_hints_pick_this_nodes_endpoints(twin: ModuleType) -> None:
    a = ep("10.0.0.1", hint_nodes=("n1",), hint_zones=("za",))
    b = ep("10.0.0.2", "n2", hint_nodes=("n2",), hint_zones=("za",))
    plan = only_plan(built(twin, svc(traffic_distribution="PreferSameNode"), eps(a, b), zone="za"))
    assert ips(plan.cluster_backends) == ["10.0.0.1"]


def test_frontends_cover_every_kind_in_the_plans_family(twin: ModuleType) -> None:
    lb = svc(
        type="LoadBalancer",
        ips=("10.96.0.10", "fd00:96::10"),
        ports=(np_port(),),
        external_ips=("198.51.100.7", "2001:db8::7"),
        lb_ingress_ips=("192.0.2.10",),
        lb_source_ranges=("203.0.113.0/24", "2001:db8:1::/48"),
        session_affinity=True,
        affinity_timeout=600,
    )
    table = built(twin, lb, eps(ep("10.0.0.1")))
    plans = {p.family: p for p in table.plans()}
    v4 = {(f.kind, f.address, f.port) for f in plans[4].frontends()}
    assert v4 == {
        (CLUSTER_IP, "10.96.0.10", 80),
        (NODE_PORT, None, 30080),
        (EXTERNAL_IP, "198.51.100.7", 80),
        (LOAD_BALANCER, "192.0.2.10", 80),
    }
    assert plans[4].lb_source_ranges == ("203.0.113.0/24",)
    assert plans[6].lb_source_ranges == ("2001:db8:1::/48",)
    assert plans[6].lb_ips == ()
    assert all(f.affinity_timeout == 600 for f in plans[4].frontends())
    masq = {f.kind: f.masquerade for f in plans[4].frontends()}
    assert masq == {
        CLUSTER_IP: "off-cluster",
        NODE_PORT: "always",
        EXTERNAL_IP: "always",
        LOAD_BALANCER: "always",
    }
    # No v6 endpoints: the v6 plan rejects.
    assert plans[6].internal_verdict == "reject"


def test_node_port_only_for_node_port_and_load_balancer_types(twin: ModuleType) -> None:
    plan = only_plan(built(twin, svc(ports=(np_port(),)), eps(ep("10.0.0.1"))))
    assert plan.node_port == 0
    plan = only_plan(built(twin, svc(type="NodePort", ports=(np_port(),)), eps(ep("10.0.0.1"))))
    assert plan.node_port == 30080


def test_affinity_timeout_only_with_client_ip_affinity(twin: ModuleType) -> None:
    assert only_plan(built(twin, svc(affinity_timeout=60))).affinity_timeout == 0
    plan = only_plan(built(twin, svc(session_affinity=True, affinity_timeout=60)))
    assert plan.affinity_timeout == 60


def test_services_kube_proxy_skips_have_no_plans(twin: ModuleType) -> None:
    for skipped in (
        svc(ips=(), headless=True),
        svc(type="ExternalName", ips=()),
        svc(proxy_name="other-proxy"),
    ):
        assert list(built(twin, skipped, eps(ep("10.0.0.1"))).plans()) == []


def test_changesets_add_update_remove_and_nothing_when_unchanged(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(svc())
    table.upsert_slice(eps(ep("10.0.0.1")))
    change = table.build()
    assert [p.id for p in change.added] == ["default/web:http/TCP/v4"]
    assert not change.removed and not change.updated
    table.commit()
    assert table.pending == 0

    table.upsert_slice(eps(ep("10.0.0.1")))  # same content
    change = table.build()
    assert not change
    table.commit()

    table.upsert_slice(eps(ep("10.0.0.1"), ep("10.0.0.2")))
    change = table.build()
    ((old, new),) = change.updated
    assert ips(old.cluster_backends) == ["10.0.0.1"]
    assert ips(new.cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    table.commit()

    table.delete_service("default/web")
    change = table.build()
    assert [p.id for p in change.removed] == ["default/web:http/TCP/v4"]
    table.commit()
    assert list(table.plans()) == []


def test_uncommitted_build_is_recomputed_and_later_changes_stay_pending(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(svc())
    first = table.build()
    again = table.build()  # the dataplane failed: nothing was committed
    assert [p.id for p in again.added] == [p.id for p in first.added]
    table.upsert_slice(eps(ep("10.0.0.1")))  # arrives between build and commit
    table.commit()
    assert table.pending == 1
    ((old, new),) = table.build().updated
    assert old.internal_verdict == "reject" and ips(new.cluster_backends) == ["10.0.0.1"]


def test_one_slice_update_rebuilds_only_its_service(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    for i in range(50):
        table.upsert_service(svc(f"s{i}", ips=(f"10.96.1.{i}",)))
        table.upsert_slice(eps(ep(f"10.0.1.{i}"), service=f"s{i}"))
    table.build()
    table.commit()
    table.upsert_slice(eps(ep("10.0.2.1"), service="s7"))
    assert table.pending == 1
    change = table.build()
    assert [new.service for _, new in change.updated] == ["default/s7"]
    assert len(change) == 1


def test_moving_a_slice_to_another_service_updates_both(twin: ModuleType) -> None:
    table = built(twin, svc("a", ips=("10.96.0.1",)), svc("b", ips=("10.96.0.2",)))
    table.upsert_slice(eps(ep("10.0.0.1"), service="a", name="s"))
    table.build()
    table.commit()
    table.upsert_slice(eps(ep("10.0.0.1"), service="b", name="s"))
    change = table.build()
    verdicts = {new.service: new.internal_verdict for _, new in change.updated}
    assert verdicts == {"default/a": "reject", "default/b": None}


def test_node_change_recomputes_locality(twin: ModuleType) -> None:
    table = built(twin, svc(internal_traffic_policy="Local"), eps(ep("10.0.0.1", "n2")))
    assert only_plan(table).internal_verdict == "drop"
    table.set_node("n2", None)
    ((_, new),) = table.build().updated
    assert ips(new.internal_backends) == ["10.0.0.1"]


def random_cluster(seed: int) -> list[Any]:
    """A cluster with random policies, duplicates, conditions, hints and families."""
    rng = random.Random(seed)
    objs: list[Any] = []
    for i in range(40):
        dual = rng.random() < 0.3
        cluster_ips = (f"10.96.{i // 250}.{i % 250}",) + ((f"fd00:96::{i:x}",) if dual else ())
        kind = rng.choice(["ClusterIP", "NodePort", "LoadBalancer"])
        names = rng.sample([("a", "TCP"), ("b", "UDP"), ("", "TCP")], 2)
        ports = tuple(
            ServicePort(name, proto, 80 + j, 8080 + j, 30000 + i * 4 + j)
            for j, (name, proto) in enumerate(names)
        )
        objs.append(
            svc(
                f"s{i}",
                ips=cluster_ips,
                ports=ports,
                type=kind,
                external_ips=rng.choice([(), ("198.51.100.1", "2001:db8::1")]),
                lb_ingress_ips=("192.0.2.1",) if kind == "LoadBalancer" else (),
                external_traffic_policy=rng.choice(["Cluster", "Local"]),
                internal_traffic_policy=rng.choice(["Cluster", "Local"]),
                session_affinity=rng.random() < 0.3,
                # From i, not rng: the random stream (and so the cases) stays as it was.
                ipvs_scheduler=(None, "rr", "mh")[i % 3],
                bgp=(None, BgpAnnotations(True, ("65000:1",)), BgpAnnotations(False))[i % 3],
            )
        )
        for fam in (4, 6) if dual else (4,):
            for k in range(rng.randint(0, 3)):
                endpoints = []
                for _ in range(rng.randint(0, 6)):
                    n = rng.randint(1, 9)
                    ip = f"10.1.{i}.{n}" if fam == 4 else f"fd00:1::{i:x}:{n}"
                    ready = rng.random() < 0.6
                    hinted = rng.random() < 0.8
                    endpoints.append(
                        ep(
                            ip,
                            rng.choice(["n1", "n2", None]),
                            ready=ready,
                            serving=ready or rng.random() < 0.5,
                            terminating=not ready and rng.random() < 0.7,
                            hint_zones=(rng.choice(["za", "zb"]),) if hinted else None,
                            hint_nodes=(rng.choice(["n1", "n2"]),) if hinted else None,
                        )
                    )
                ep_ports = tuple(
                    EndpointPort(p.name, p.protocol, rng.choice([p.target_port, 9999]))
                    for p in ports
                )
                objs.append(
                    eps(
                        *endpoints,
                        service=f"s{i}",
                        name=f"s{i}-{fam}-{k}",
                        ports=ep_ports,
                        address_type="IPv4" if fam == 4 else "IPv6",
                    )
                )
    rng.shuffle(objs)
    return objs


def test_twins_agree_on_random_clusters() -> None:
    import pytest

    try:
        from lace_proxy.table import _ctable
    except ImportError:
        pytest.skip("compiled table not built in this environment")
    from lace_proxy.table import _pytable

    for seed in range(30):
        objs = random_cluster(seed)
        views = []
        for module in (_ctable, _pytable):
            table = built(module, *objs, zone="za")
            views.append(sorted(plan_view(p) for p in table.plans()))
        assert views[0] == views[1], f"seed {seed}"
        assert views[0], f"seed {seed} made no plans"


def test_duplicate_ip_within_one_slice_keeps_the_better_copy(twin: ModuleType) -> None:
    for first_terminating in (True, False):
        term = ep("10.0.0.1", ready=False, terminating=True)
        ready = ep("10.0.0.1", "n2")
        endpoints = (term, ready) if first_terminating else (ready, term)
        (backend,) = only_plan(built(twin, svc(), eps(*endpoints))).cluster_backends
        assert (backend.ready, backend.terminating, backend.local) == (True, False, False)
    # Same IP twice, both ready: the local copy wins, wherever it is in the slice.
    for endpoints in (
        (ep("10.0.0.1", "n2"), ep("10.0.0.1")),
        (ep("10.0.0.1"), ep("10.0.0.1", "n2")),
    ):
        (backend,) = only_plan(built(twin, svc(), eps(*endpoints))).cluster_backends
        assert backend.local


def test_large_slices_dedupe_too(twin: ModuleType) -> None:
    endpoints = [ep(f"10.0.{i // 250}.{i % 250}", "n2") for i in range(300)]
    endpoints.append(ep("10.0.0.7"))  # a local duplicate of a remote endpoint
    plan = only_plan(built(twin, svc(), eps(*endpoints)))
    assert len(plan.cluster_backends) == 300
    assert [b.local for b in plan.cluster_backends if b.ip == "10.0.0.7"] == [True]


def test_slice_count_changes_keep_the_merge_right(twin: ModuleType) -> None:
    """One slice, two, back to one, none: the service's endpoints follow every step."""
    table = built(twin, svc(), eps(ep("10.0.0.1"), name="a"))
    table.upsert_slice(eps(ep("10.0.0.2"), name="b"))
    table.build()
    table.commit()
    assert ips(only_plan(table).cluster_backends) == ["10.0.0.1", "10.0.0.2"]
    assert [s.name for s in table.slices_of("default/web")] == ["a", "b"]
    table.delete_slice("default/a")
    table.build()
    table.commit()
    assert ips(only_plan(table).cluster_backends) == ["10.0.0.2"]
    assert [s.name for s in table.slices_of("default/web")] == ["b"]
    table.upsert_slice(eps(ep("10.0.0.3"), name="b"))
    table.build()
    table.commit()
    assert ips(only_plan(table).cluster_backends) == ["10.0.0.3"]
    table.delete_slice("default/b")
    table.build()
    table.commit()
    assert table.slices_of("default/web") == []
    assert only_plan(table).internal_verdict == "reject"


def test_subclassed_model_objects_behave_like_the_model(twin: ModuleType) -> None:
    """Objects of other types than the model's own take the generic attribute path."""
    from dataclasses import dataclass

    from lace_proxy.model.endpointslice import Endpoint, EndpointSlice
    from lace_proxy.model.service import Service

    @dataclass(frozen=True, slots=True)
    class MyEndpoint(Endpoint):
        pass

    @dataclass(frozen=True, slots=True)
    class MySlice(EndpointSlice):
        pass

    @dataclass(frozen=True, slots=True)
    class MyService(Service):
        pass

    base_svc = svc(type="NodePort", ports=(np_port(),), external_traffic_policy="Local")
    base_slice = eps(ep("10.0.0.1"), ep("10.0.0.2", "n2", hint_zones=("za",)))
    my_svc = MyService(**{f: getattr(base_svc, f) for f in Service.__dataclass_fields__})
    my_eps = tuple(
        MyEndpoint(**{f: getattr(e, f) for f in Endpoint.__dataclass_fields__})
        for e in base_slice.endpoints
    )
    fields = {f: getattr(base_slice, f) for f in EndpointSlice.__dataclass_fields__}
    my_slice = MySlice(**{**fields, "endpoints": my_eps})
    expected = plan_view(only_plan(built(twin, base_svc, base_slice, zone="za")))
    assert plan_view(only_plan(built(twin, my_svc, my_slice, zone="za"))) == expected


def random_operations(seed: int) -> list[tuple[str, Any]]:
    """A random stream of upserts, deletes, slice moves and node changes over a small cluster."""
    rng = random.Random(seed)
    cluster = random_cluster(seed)
    services = [o for o in cluster if hasattr(o, "cluster_ips")]
    slices = [o for o in cluster if not hasattr(o, "cluster_ips")]
    ops: list[tuple[str, Any]] = [("upsert", o) for o in cluster]
    ops.append(("build", True))
    for _ in range(150):
        roll = rng.random()
        if roll < 0.35 and slices:
            base = rng.choice(slices)
            endpoints = list(base.endpoints)
            if endpoints and rng.random() < 0.5:
                endpoints.pop(rng.randrange(len(endpoints)))
            if endpoints and rng.random() < 0.5:
                endpoints.append(endpoints[rng.randrange(len(endpoints))])  # a duplicate IP
            if rng.random() < 0.4:
                endpoints.append(ep(f"10.1.{rng.randint(0, 39)}.{rng.randint(1, 9)}", "n1"))
            service = base.service_name
            if rng.random() < 0.1:  # move the slice to another service
                service = rng.choice(services).name
            ops.append(
                (
                    "upsert",
                    eps(
                        *endpoints,
                        service=service,
                        name=rng.choice([base.name, f"{base.name}-extra"]),
                        ports=base.ports,
                        address_type=base.address_type,
                    ),
                )
            )
        elif roll < 0.45 and slices:
            ops.append(("delete_slice", rng.choice(slices).key))
        elif roll < 0.55:
            service = rng.choice(services)
            if len(ops) % 3 == 0:  # a scheduler change alone (chosen without the rng)
                service = replace(service, ipvs_scheduler=("sh", None, "wlc")[len(ops) % 9 // 3])
            ops.append(("upsert", service))
        elif roll < 0.6:
            ops.append(("delete_service", rng.choice(services).key))
        elif roll < 0.63:
            ops.append(("set_node", (rng.choice(["n1", "n2"]), rng.choice(["za", "zb", None]))))
        else:
            ops.append(("build", rng.random() < 0.8))  # sometimes the dataplane fails
    ops.append(("build", True))
    return ops


def test_twins_agree_through_random_updates() -> None:
    """Incremental operation (not just full builds): every changeset and state must match."""
    import pytest

    try:
        from lace_proxy.table import _ctable
    except ImportError:
        pytest.skip("compiled table not built in this environment")
    from lace_proxy.table import _pytable

    def changeset_view(change: Any) -> tuple[Any, ...]:
        return (
            sorted(plan_view(p) for p in change.added),
            sorted(plan_view(p) for p in change.removed),
            sorted((plan_view(a), plan_view(b)) for a, b in change.updated),
        )

    for seed in range(20):
        tables = [module.ServiceTable("n1", "za") for module in (_ctable, _pytable)]
        for step, (op, arg) in enumerate(random_operations(seed)):
            views = []
            for table in tables:
                if op == "upsert":
                    if hasattr(arg, "cluster_ips"):
                        table.upsert_service(arg)
                    else:
                        table.upsert_slice(arg)
                elif op == "delete_slice":
                    table.delete_slice(arg)
                elif op == "delete_service":
                    table.delete_service(arg)
                elif op == "set_node":
                    table.set_node(*arg)
                else:
                    change = table.build()
                    if arg:
                        table.commit()
                    views.append(
                        (
                            changeset_view(change),
                            sorted(plan_view(p) for p in table.plans()),
                            table.pending,
                        )
                    )
            if views:
                assert views[0] == views[1], f"seed {seed}, step {step}"


def test_access_is_part_of_every_plan_and_a_change_of_it_alone_is_an_update(
    twin: ModuleType,
) -> None:
    table = built(twin, svc(ips=("10.96.0.10", "fd00::10")), eps(ep("10.0.0.1")))
    assert all(p.access is None for p in table.plans())
    web = Access("default", ("default",))
    table.set_access("default/web", web)
    assert table.pending == 1
    changes = table.build()
    assert len(changes.updated) == 2 and not changes.added and not changes.removed
    assert {new.access for _, new in changes.updated} == {web}
    table.commit()
    table.set_access("default/web", web)  # the same again: nothing to recompute
    assert table.pending == 0
    table.set_access("default/web", Access("default", ("default", "internet")))
    ((_, new), _) = table.build().updated
    assert new.access.sources == ("default", "internet")
    table.commit()
    table.set_access("default/web", None)
    assert all(new.access is None for _, new in table.build().updated)
    table.commit()
    # Deleting the service forgets its access: a new service of that name starts open.
    table.set_access("default/web", web)
    table.delete_service("default/web")
    table.upsert_service(svc())
    table.build()
    table.commit()
    assert only_plan(table).access is None


def test_plan_carries_the_services_ipvs_scheduler(twin: ModuleType) -> None:
    table = built(
        twin, svc(ips=("10.96.0.10", "fd00::10"), ipvs_scheduler="mh"), eps(ep("10.0.0.1"))
    )
    assert sorted(p.scheduler for p in table.plans()) == ["mh", "mh"]


def test_no_scheduler_is_the_empty_string(twin: ModuleType) -> None:
    assert only_plan(built(twin, svc(), eps(ep("10.0.0.1")))).scheduler == ""


def test_a_scheduler_change_alone_is_an_update(twin: ModuleType) -> None:
    table = built(twin, svc(), eps(ep("10.0.0.1")))
    table.upsert_service(svc(ipvs_scheduler="sh"))
    change = table.build()
    assert not change.added and not change.removed
    ((old, new),) = change.updated
    assert (old.scheduler, new.scheduler) == ("", "sh")
    assert plan_view(old)[:-1] == plan_view(new)[:-1]  # nothing else changed
    table.commit()
    table.upsert_service(svc(ipvs_scheduler="sh"))  # the same again: no change
    assert not table.build()
    table.commit()
    table.upsert_service(svc())
    ((old, new),) = table.build().updated
    assert (old.scheduler, new.scheduler) == ("sh", "")


def test_plan_carries_the_services_bgp_annotations_and_a_change_of_them_alone_updates(
    twin: ModuleType,
) -> None:
    table = built(twin, svc(ips=("10.96.0.10", "fd00::10")), eps(ep("10.0.0.1")))
    assert {p.bgp for p in table.plans()} == {None}
    annotated = BgpAnnotations(True, ("65000:100",))
    table.upsert_service(svc(ips=("10.96.0.10", "fd00::10"), bgp=annotated))
    change = table.build()
    assert not change.added and not change.removed and len(change.updated) == 2
    for old, new in change.updated:
        assert (old.bgp, new.bgp) == (None, annotated)
        assert plan_view(old)[:-2] == plan_view(new)[:-2]  # nothing else changed
    table.commit()
    table.upsert_service(
        svc(ips=("10.96.0.10", "fd00::10"), bgp=BgpAnnotations(True, ("65000:100",)))
    )
    assert not table.build()  # an equal value is no change


def test_scheduler_survives_a_frontend_conflict(twin: ModuleType) -> None:
    """A service that lost some frontends to another keeps its scheduler on what remains."""
    first = svc("a", external_ips=("198.51.100.1",))
    second = svc("b", ips=("10.96.0.11",), external_ips=("198.51.100.1",), ipvs_scheduler="lc")
    table = built(twin, first, second)
    plan = next(p for p in table.plans() if p.service == "default/b")
    assert plan.external_ips == () and plan.scheduler == "lc"
