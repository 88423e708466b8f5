"""Small builders for table tests: model objects with only the fields a test cares about."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from lace_proxy.model.endpointslice import Endpoint, EndpointPort, EndpointSlice
from lace_proxy.model.service import Service, ServicePort


def svc(
    name: str = "web",
    ips: tuple[str, ...] = ("10.96.0.10",),
    ports: tuple[ServicePort, ...] = (ServicePort("http", "TCP", 80, 8080),),
    namespace: str = "default",
    **kw: Any,
) -> Service:
    return Service(namespace, name, kw.pop("type", "ClusterIP"), ips, ports, **kw)


def ep(ip: str, node: str | None = "n1", **kw: Any) -> Endpoint:
    return Endpoint((ip,), node_name=node, **kw)


def eps(
    *endpoints: Endpoint,
    service: str = "web",
    name: str | None = None,
    ports: tuple[EndpointPort, ...] = (EndpointPort("http", "TCP", 8080),),
    address_type: str = "IPv4",
    namespace: str = "default",
) -> EndpointSlice:
    return EndpointSlice(
        namespace, name or f"{service}-abc", service, address_type, endpoints, ports
    )


def plan_view(plan: Any) -> tuple[Any, ...]:
    """A twin-neutral projection of a plan, for comparing the two implementations."""

    def b(backends: Any) -> tuple[Any, ...]:
        return tuple((x.ip, x.port, x.local, x.ready, x.serving, x.terminating) for x in backends)

    return (
        plan.id,
        plan.service,
        plan.port_name,
        plan.protocol,
        plan.family,
        plan.cluster_ip,
        plan.port,
        plan.node_port,
        plan.external_ips,
        plan.lb_ips,
        plan.lb_source_ranges,
        plan.affinity_timeout,
        plan.internal_local,
        plan.external_local,
        b(plan.cluster_backends),
        b(plan.local_backends),
        b(plan.standby_backends),
        plan.internal_verdict,
        plan.external_verdict,
        plan.health_check_node_port,
        plan.access,
        plan.bgp,
        plan.scheduler,
    )


def built(twin: ModuleType, *objs: Any, node: str = "n1", zone: str | None = None) -> Any:
    table = twin.ServiceTable(node, zone)
    for obj in objs:
        if hasattr(obj, "cluster_ips"):
            table.upsert_service(obj)
        else:
            table.upsert_slice(obj)
    table.build()
    table.commit()
    return table
