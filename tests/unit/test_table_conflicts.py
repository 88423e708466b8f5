"""Services that claim the same frontend: the first keeps it, the next inherits it (both twins)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from lace_proxy.model.service import ServicePort

from .tablekit import ep, eps, svc


def lb(
    name: str, cluster_ip: str, ext: tuple[str, ...] = ("192.0.2.7",), node_port: int = 0
) -> Any:
    return svc(
        name,
        ips=(cluster_ip,),
        type="NodePort" if node_port else "ClusterIP",
        ports=(ServicePort("http", "TCP", 80, 8080, node_port),),
        external_ips=ext,
    )


def plans_by_service(table: Any) -> dict[str, Any]:
    return {p.service: p for p in table.plans()}


def sync(table: Any) -> Any:
    change = table.build()
    table.commit()
    return change


def test_first_claimant_keeps_a_shared_external_ip(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(lb("a", "10.96.0.1"))
    table.upsert_slice(eps(ep("10.0.0.1"), service="a"))
    sync(table)
    table.upsert_service(lb("b", "10.96.0.2"))
    table.upsert_slice(eps(ep("10.0.0.2"), service="b"))
    change = sync(table)
    # The newcomer does not take the address; the first service is untouched.
    assert [p.service for p in change.added] == ["default/b"] and not change.updated
    plans = plans_by_service(table)
    assert plans["default/a"].external_ips == ("192.0.2.7",)
    assert plans["default/b"].external_ips == ()
    assert table.conflicts == {"default/b": ("192.0.2.7:80/TCP",)}


def test_the_next_claimant_inherits_when_the_owner_goes(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(lb("a", "10.96.0.1"))
    sync(table)
    table.upsert_service(lb("b", "10.96.0.2"))
    sync(table)
    table.delete_service("default/a")
    change = sync(table)
    assert [p.service for p in change.removed] == ["default/a"]
    ((old, new),) = change.updated
    assert (old.external_ips, new.external_ips) == ((), ("192.0.2.7",))
    assert table.conflicts == {}
    assert table.pending == 0


def test_inheritance_survives_an_uncommitted_build(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(lb("a", "10.96.0.1"))
    table.upsert_service(lb("b", "10.96.0.2"))
    sync(table)
    table.delete_service("default/a")
    table.build()  # the dataplane failed: nothing committed
    change = table.build()
    assert {p.service for p in change.removed} == {"default/a"}
    assert [new.external_ips for _, new in change.updated] == [("192.0.2.7",)]


def test_node_port_and_cluster_ip_conflicts(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(lb("a", "10.96.0.1", ext=(), node_port=30080))
    table.upsert_service(lb("b", "10.96.0.2", ext=(), node_port=30080))
    table.upsert_service(lb("c", "10.96.0.1", ext=()))  # the same ClusterIP and port as a
    sync(table)
    plans = plans_by_service(table)
    assert plans["default/a"].node_port == 30080
    assert plans["default/b"].node_port == 0
    assert "default/c" not in plans  # without its ClusterIP a service port has no plan
    assert table.conflicts == {
        "default/b": ("*:30080/TCP",),
        "default/c": ("10.96.0.1:80/TCP",),
    }


def test_a_service_that_stops_conflicting_gets_its_frontend(twin: ModuleType) -> None:
    table = twin.ServiceTable("n1")
    table.upsert_service(lb("a", "10.96.0.1"))
    table.upsert_service(lb("b", "10.96.0.2"))
    sync(table)
    table.upsert_service(lb("a", "10.96.0.1", ext=("192.0.2.8",)))  # a moves away
    change = sync(table)
    updated = {new.service: new.external_ips for _, new in change.updated}
    assert updated == {"default/a": ("192.0.2.8",), "default/b": ("192.0.2.7",)}
