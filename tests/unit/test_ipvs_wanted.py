"""IPVS mode's bookkeeping of which plans want which virtual service (`Wanted`), on plans the
service table builds (both twins). The kernel side is tested in the VM (tests/vm/inner)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from lace_proxy.dataplane.ipvs import Target, VirtualServer, Wanted
from lace_proxy.model.service import ServicePort

from .tablekit import ep, eps, svc

NODE = "192.0.2.10"


def plans(twin: ModuleType, *objs: Any) -> dict[str, Any]:
    """Each service's only plan, by service name."""
    table = twin.ServiceTable("n1")
    for obj in objs:
        (table.upsert_service if hasattr(obj, "cluster_ips") else table.upsert_slice)(obj)
    table.build()
    table.commit()
    return {p.service.split("/")[1]: p for p in table.plans()}


def servers(target: Target | None) -> set[str]:
    assert target is not None
    return {ip for ip, _ in target.servers}


def test_an_address_frontend_wins_over_a_node_port_and_hands_it_back(twin: ModuleType) -> None:
    """`web`'s NodePort 30080 on the node address, and `other`'s ExternalIP: the node address,
    port 30080. Both render TCP NODE:30080; the ExternalIP wins (as nftables' service-ips is
    looked up before service-nodeports), whichever came first, and when it goes the NodePort
    takes the virtual service back instead of leaving it to vanish."""
    ports = (ServicePort("http", "TCP", 80, 8080, node_port=30080),)
    web = svc("web", ("10.96.0.10",), ports, type="NodePort")
    other_ports = (ServicePort("http", "TCP", 30080, 8080),)
    other = svc("other", ("10.96.0.11",), other_ports, external_ips=(NODE,))
    built = plans(
        twin,
        web,
        other,
        eps(ep("10.0.0.1"), service="web"),
        eps(ep("10.0.0.2"), service="other"),
    )
    shared = VirtualServer("TCP", NODE, 30080)
    for order in (("web", "other"), ("other", "web")):
        wanted = Wanted((NODE,), "rr")
        for name in order:
            wanted.add(built[name])
        assert servers(wanted.target(shared)) == {"10.0.0.2"}, order
        assert wanted.plans(shared) == [built["other"].id, built["web"].id]
        assert servers(wanted.target(VirtualServer("TCP", "10.96.0.10", 80))) == {"10.0.0.1"}
    touched = wanted.remove(built["other"])
    assert shared in touched
    assert servers(wanted.target(shared)) == {"10.0.0.1"}
    assert VirtualServer("TCP", "10.96.0.11", 30080) not in wanted.desired()
    wanted.remove(built["web"])
    assert wanted.desired() == {}


def test_a_plan_is_removed_as_it_was_added(twin: ModuleType) -> None:
    """The node addresses may change between a plan's add and its removal: the removal takes
    back exactly what the add recorded."""
    ports = (ServicePort("http", "TCP", 80, 8080, node_port=30080),)
    web = plans(twin, svc("web", ("10.96.0.10",), ports, type="NodePort"))["web"]
    wanted = Wanted((NODE, "198.51.100.1"), "rr")
    added = wanted.add(web)
    assert set(added) == {
        VirtualServer("TCP", "10.96.0.10", 80),
        VirtualServer("TCP", NODE, 30080),
        VirtualServer("TCP", "198.51.100.1", 30080),
    }
    wanted.node_addresses = (NODE,)
    assert sorted(wanted.remove(web)) == sorted(added)
    assert wanted.desired() == {}


def test_update_holds_exactly_the_plans_it_is_given(twin: ModuleType) -> None:
    """A full sync updates the last sync's Wanted instead of building one: what it wants is
    then what a new one built from the same plans wants, and a plan handed out again as the
    same object is not rendered again (its recorded virtual services stay as they are)."""
    ports = (ServicePort("http", "TCP", 80, 8080, node_port=30080),)
    table = twin.ServiceTable("n1")
    for name, ip in (("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")):
        table.upsert_service(svc(name, (ip,), ports, type="NodePort"))
        table.upsert_slice(eps(ep(ip.replace("10.96", "10.1")), service=name))
    table.build()
    table.commit()
    wanted = Wanted((NODE,), "rr")
    wanted.update(table.plans())
    kept = {p.service: p for p in table.plans()}["default/a"]
    rendered_before = wanted._of_plan[kept.id]
    table.upsert_slice(eps(ep("10.1.0.9"), service="b"))  # b changes
    table.delete_service("default/c")  # c goes
    table.build()
    table.commit()
    wanted.update(table.plans())
    fresh = Wanted((NODE,), "rr")
    for plan in table.plans():
        fresh.add(plan)
    assert wanted.desired() == fresh.desired()
    assert servers(wanted.target(VirtualServer("TCP", "10.96.0.2", 80))) == {"10.1.0.9"}
    assert VirtualServer("TCP", "10.96.0.3", 80) not in wanted.desired()
    assert wanted._of_plan[kept.id] is rendered_before
