"""The real control plane (testkit.controlplane) serves what the proxy's watcher relies on.

These run against kube-apiserver v1.37.2 and etcd v3.7, built from the Go module proxy: lists
and watches, ServiceCIDRs with the API's own validation, and RBAC
refusing a ServiceAccount what its ClusterRole does not grant.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from lace_proxy.sources.kube import ApiConnection, KubeSource
from testkit.controlplane.cluster import SERVICE_CIDRS, ControlPlane

from ..helpers import Recorder, eventually


def unique(prefix: str) -> str:
    """Names unique per test: the control plane is shared by the whole session."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def namespace(real_kube: client.ApiClient) -> Iterator[str]:
    name = unique("test")
    core = client.CoreV1Api(real_kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    # Nothing finalizes namespaces without kube-controller-manager: delete the contents.
    core.delete_collection_namespaced_service(name)


def test_version_and_service_cidrs_are_served(
    control_plane: ControlPlane, real_kube: client.ApiClient
) -> None:
    status, body = control_plane.get("/version")
    assert status == 200
    assert json.loads(body)["gitVersion"] == "v1.37.2"
    resources = client.NetworkingV1Api(real_kube).get_api_resources()
    assert "servicecidrs" in {r.name for r in resources.resources}
    # The apiserver itself made the default ServiceCIDR from --service-cluster-ip-range.
    status, body = control_plane.get("/apis/networking.k8s.io/v1/servicecidrs/kubernetes")
    assert status == 200
    assert json.loads(body)["spec"]["cidrs"] == list(SERVICE_CIDRS)


def test_list_then_watch_sees_a_created_service(
    real_kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(real_kube)
    listed = core.list_namespaced_service(namespace)
    assert listed.items == []
    name = unique("svc")
    created = core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1ServiceSpec(
                ip_family_policy="RequireDualStack",
                ports=[client.V1ServicePort(port=80, protocol="TCP")],
            ),
        ),
    )
    assert created.spec.cluster_ip.startswith("10.96.")
    assert created.spec.cluster_ips[1].startswith("fd00:10:96::")  # dual stack works
    # A watch from the list's resourceVersion replays what happened since: the ADDED event.
    stream = watch.Watch().stream(
        core.list_namespaced_service,
        namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    )
    events = []
    for event in stream:
        events.append((event["type"], event["object"].metadata.name))
        if event["type"] == "ADDED":
            break
    assert events == [("ADDED", name)]


def test_service_cidr_with_host_bits_is_refused(real_kube: client.ApiClient) -> None:
    networking = client.NetworkingV1Api(real_kube)

    def service_cidr(name: str, cidr: str) -> client.V1ServiceCIDR:
        return client.V1ServiceCIDR(
            metadata=client.V1ObjectMeta(name=name), spec=client.V1ServiceCIDRSpec(cidrs=[cidr])
        )

    with pytest.raises(ApiException) as refused:
        networking.create_service_cidr(service_cidr(unique("bad"), "10.97.0.1/16"))
    assert refused.value.status == 422
    status = json.loads(refused.value.body)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "10.97.0.1/16": '
            "must not have bits set beyond the prefix length",
            "field": "spec.cidrs[0]",
        }
    ]
    good = unique("extra")
    networking.create_service_cidr(service_cidr(good, "10.97.0.0/16"))
    try:
        assert networking.read_service_cidr(good).spec.cidrs == ["10.97.0.0/16"]
    finally:
        networking.delete_service_cidr(good)


def test_service_account_gets_only_what_its_cluster_role_grants(
    control_plane: ControlPlane, namespace: str
) -> None:
    kubeconfig: Path = control_plane.service_account_kubeconfig(
        unique("watcher"),
        unique("services-reader"),
        namespace=namespace,
        rules=[{"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]}],
    )
    api: Any = config.new_client_from_config(config_file=str(kubeconfig))
    with api:
        core = client.CoreV1Api(api)
        assert core.list_service_for_all_namespaces().kind == "ServiceList"
        with pytest.raises(ApiException) as refused:
            core.list_node()
        assert refused.value.status == 403
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_service(
                namespace, client.V1Service(metadata=client.V1ObjectMeta(name="nope"))
            )
        assert refused.value.status == 403


def test_the_kube_source_follows_the_servers_service_cidrs(
    control_plane: ControlPlane, real_kube: client.ApiClient, tmp_path: Path
) -> None:
    """The proxy's own watcher against the real server: the default ServiceCIDR the apiserver
    made from its flags arrives, and so do later ones (and their deletion)."""
    kubeconfig = control_plane.write_admin_kubeconfig(tmp_path / "admin.kubeconfig")
    recorder = Recorder()
    networking = client.NetworkingV1Api(real_kube)
    extra = unique("extra")

    async def scenario() -> None:
        source = KubeSource(ApiConnection(kubeconfig=str(kubeconfig)), recorder, "node-a")
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(stop))
        try:
            await eventually(lambda: ("servicecidr+", "kubernetes") in recorder.events)
            default = recorder.objects["ServiceCIDR/kubernetes"]
            assert default.cidrs == tuple(SERVICE_CIDRS)
            networking.create_service_cidr(
                client.V1ServiceCIDR(
                    metadata=client.V1ObjectMeta(name=extra),
                    spec=client.V1ServiceCIDRSpec(cidrs=["10.98.0.0/16"]),
                )
            )
            await eventually(lambda: ("servicecidr+", extra) in recorder.events)
            assert recorder.objects[f"ServiceCIDR/{extra}"].cidrs == ("10.98.0.0/16",)
            networking.delete_service_cidr(extra)
            await eventually(lambda: ("servicecidr-", extra) in recorder.events)
        finally:
            stop.set()
            await task

    asyncio.run(scenario())
