"""charts/lace-proxy: lint, the DaemonSet, RBAC, the configuration lace-proxy loads, the schema."""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import logging
import re
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from lace_proxy.cli import build_parser
from lace_proxy.cli.run import cmd_run
from lace_proxy.config import ProxyConfig, add_config_flags, config_from_args, load_config
from lace_proxy.config.bgp import BgpPeer, LaceBgpAnnounceConfig, LaceBgpConfig
from lace_proxy.model import LACE_GROUP_VERSION
from lace_proxy.sources.kube import resources as watched_resources

from .conftest import (
    NAMESPACE,
    NETWORKS_CHART,
    PROXY_CHART,
    lint_findings,
    manifests,
    of_kind,
    one,
    refusal,
    render,
    render_text,
)

net = ipaddress.ip_network
CONFIGMAP_TEMPLATE = "lace-proxy/templates/configmap.yaml"
DASHBOARD = PROXY_CHART / "dashboards" / "lace-proxy.json"

IPVS = {"mode": "ipvs"}
BGP = {
    "lace": {
        "bgp": {
            "enabled": True,
            "asn": 4200000001,
            "peers": [
                {"address": "10.250.0.254", "asn": 65000},
                {
                    "address": "fd00:250::fe",
                    "asn": 65000,
                    "holdTime": "9s",
                    "password": "s3cret",
                    "nodeSelector": {"rack": "r2"},
                },
            ],
            "announce": {"clusterIPs": "aggregate"},
            "gracefulRestartTime": "30s",
        }
    }
}
HOST_LOCAL_READY = {"node": {"serviceCIDRs": ["10.96.0.0/12", "fd00:10:96::/112"]}}
SERVICE_MONITOR = {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"r": "p"}}}
EVERYTHING = {
    "mode": "ipvs",
    "clusterCIDR": "10.244.0.0/16,fd00:10:244::/56",
    "nodePortAddresses": ["10.250.0.0/24"],
    "syncPeriod": "1m",
    "minSyncPeriod": "500ms",
    "masqueradeAll": True,
    "detectLocalMode": "InterfaceNamePrefix",
    "detectLocal": {"interfaceNamePrefix": "veth"},
    "healthz": {"port": 11256},
    "metrics": {"bindAddress": "::", "port": 9100},
    "ipvs": {
        "scheduler": "mh",
        "strictARP": True,
        "excludeCIDRs": ["192.0.2.0/24"],
        "tcpTimeout": "15m",
        "tcpFinTimeout": "30s",
        "udpTimeout": "1m30s",
    },
    "conntrack": {"maxPerCore": 0, "tcpBeLiberal": True, "tcpEstablishedTimeout": "12h"},
    "node": {"serviceCIDRs": ["10.96.0.0/12"]},
    "lace": {
        "nftables": {"table": "lp"},
        "routing": {"table": 2000, "priority": 100},
        "ipvs": {"serviceAddresses": "localRoutes"},
        "egress": {
            "enabled": False,
            "table": "lp-egress",
            "nonMasqueradeCIDRs": ["172.16.0.0/12"],
            "routablePrefixes": ["198.51.100.0/24", "2001:db8::/32"],
        },
    },
    "extraConfig": {"nftables": {"masqueradeBit": 15}, "lace": {"nftables": {"family": "ip"}}},
    "nodeSelector": {"pool": "edge"},
    **SERVICE_MONITOR,
}

#: Value sets every test of "it works for any values" runs with.
VALUE_SETS = {
    "defaults": {},
    "ipvs": IPVS,
    "service-cidrs": HOST_LOCAL_READY,
    "service-monitor": SERVICE_MONITOR,
    "kube-proxy-cleanup": {"cleanupKubeProxy": True},
    "bgp": BGP,
    "everything": EVERYTHING,
}


def daemonset(values: dict[str, Any], chart: helm_python.Chart) -> dict[str, Any]:
    return one(render(chart, values), "DaemonSet")


def container(ds: dict[str, Any]) -> dict[str, Any]:
    [c] = ds["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "lace-proxy"
    return c


def config_text(objects: list[dict[str, Any]]) -> str:
    [cm] = [o for o in of_kind(objects, "ConfigMap") if "config.yaml" in o["data"]]
    return cm["data"]["config.yaml"]


def loaded_config(chart: helm_python.Chart, values: dict[str, Any], tmp_path: Path) -> ProxyConfig:
    """What lace-proxy makes of the chart's ConfigMap (with the node name the pod passes)."""
    path = tmp_path / "config.yaml"
    path.write_text(config_text(render(chart, values)), encoding="utf-8")
    return load_config(str(path), {"hostnameOverride": "node-a"})


def attr(obj: object, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


# --- lint ---------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_lints_clean(values: dict[str, Any]) -> None:
    assert lint_findings(PROXY_CHART, values) == []


def test_lint_reports_bad_values() -> None:
    """The lint check above can fail."""
    assert any("/mode" in finding for finding in lint_findings(PROXY_CHART, {"mode": "iptables"}))


# --- what is rendered -----------------------------------------------------------------------


def test_default_objects(proxy_chart: helm_python.Chart) -> None:
    objects = render(proxy_chart)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Service",
        "ServiceAccount",
    ]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "lace-proxy"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_daemonset_runs_on_every_node_in_the_host_network(proxy_chart: helm_python.Chart) -> None:
    ds = daemonset({}, proxy_chart)
    assert ds["apiVersion"] == "apps/v1"
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["terminationGracePeriodSeconds"] == 30
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    # The selector picks the pods, and only labels that never change between releases.
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= spec["template"]["metadata"]["labels"].items()
    assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector
    sa = one(render(proxy_chart), "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]


def test_daemonset_values(proxy_chart: helm_python.Chart) -> None:
    ds = daemonset(
        {
            "image": {"repository": "registry.example/lp", "tag": "v9", "pullPolicy": "Always"},
            "updateStrategy": {"maxUnavailable": "10%"},
            "nodeSelector": {"pool": "edge"},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        },
        proxy_chart,
    )
    c = container(ds)
    assert (c["image"], c["imagePullPolicy"]) == ("registry.example/lp:v9", "Always")
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "10%"}
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "edge"}
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }


def test_container_defaults(proxy_chart: helm_python.Chart) -> None:
    c = container(daemonset({}, proxy_chart))
    assert c["image"] == f"lace-proxy:{proxy_chart.metadata['appVersion']}"
    assert c["command"] == [
        "lace-proxy",
        "run",
        "--config",
        "/etc/lace-proxy/config.yaml",
        "--hostname-override",
        "$(NODE_NAME)",
    ]
    assert c["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    assert c["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }


@pytest.mark.parametrize(("healthz", "metrics"), [(10256, 10249), (11256, 9100)])
def test_probes_and_ports(proxy_chart: helm_python.Chart, healthz: int, metrics: int) -> None:
    values = {"healthz": {"port": healthz}, "metrics": {"port": metrics}}
    objects = render(proxy_chart, values)
    c = container(one(objects, "DaemonSet"))
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": healthz}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": healthz}
    assert "host" not in c["livenessProbe"]["httpGet"]  # the pod's IP: the node's, hostNetwork
    assert c["ports"] == [
        {"name": "healthz", "containerPort": healthz, "protocol": "TCP"},
        {"name": "metrics", "containerPort": metrics, "protocol": "TCP"},
    ]
    # The proxy serves where the probes and the Service look.
    doc = yaml.safe_load(config_text(objects))
    assert doc["healthzBindAddress"] == f"0.0.0.0:{healthz}"
    assert doc["metricsBindAddress"] == f"0.0.0.0:{metrics}"


def test_the_command_is_one_lace_proxy_runs(proxy_chart: helm_python.Chart, tmp_path: Path) -> None:
    """The container's arguments parse with lace-proxy's own flags and load the ConfigMap."""
    objects = render(proxy_chart, HOST_LOCAL_READY)
    c = container(one(objects, "DaemonSet"))
    (tmp_path / "config.yaml").write_text(config_text(objects), encoding="utf-8")
    node = {"NODE_NAME": "Node-B"}  # the kubelet expands $(NODE_NAME) from env
    argv = [
        str(tmp_path / "config.yaml")
        if arg == "/etc/lace-proxy/config.yaml"
        else re.sub(r"\$\((\w+)\)", lambda m: node[m[1]], arg)
        for arg in c["command"][2:]
    ]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_flags(parser)
    config = config_from_args(parser.parse_args(argv))
    assert config.hostname_override == "node-b"
    assert config.lace.service_cidrs == (net("10.96.0.0/12"), net("fd00:10:96::/112"))


def test_bgp_is_in_the_configuration_and_may_bind_its_port(
    proxy_chart: helm_python.Chart, tmp_path: Path
) -> None:
    bgp = loaded_config(proxy_chart, BGP, tmp_path).lace.bgp
    assert bgp == LaceBgpConfig(
        enabled=True,
        asn=4200000001,
        peers=(
            BgpPeer("10.250.0.254", 65000),
            BgpPeer("fd00:250::fe", 65000, 179, "s3cret", 9.0, (("rack", "r2"),)),
        ),
        announce=LaceBgpAnnounceConfig(cluster_ips="aggregate"),
        graceful_restart_time=30.0,
    )
    added = container(daemonset(BGP, proxy_chart))["securityContext"]["capabilities"]["add"]
    assert added == ["NET_ADMIN", "NET_BIND_SERVICE"]
    assert "bgp" not in config_text(render(proxy_chart, {}))  # off: not written at all
    assert "bgp-keys" not in json.dumps(daemonset(BGP, proxy_chart))  # no Secret named


def test_bgp_keys_come_from_a_secret_mounted_for_the_peers_password_files(
    proxy_chart: helm_python.Chart, tmp_path: Path
) -> None:
    key = "/var/run/secrets/lace-proxy/bgp/router-1"
    values = {
        "lace": {
            "bgp": {
                **BGP["lace"]["bgp"],
                "peers": [{"address": "10.250.0.254", "asn": 65000, "passwordFile": key}],
                "passwordSecret": "bgp-keys-of-rack-1",
            }
        }
    }
    (peer,) = loaded_config(proxy_chart, values, tmp_path).lace.bgp.peers
    assert (peer.password, peer.password_file) == ("", key)
    ds = daemonset(values, proxy_chart)
    [volume] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "bgp-keys"]
    assert volume["secret"] == {"secretName": "bgp-keys-of-rack-1", "defaultMode": 0o400}
    [mount] = [m for m in container(ds)["volumeMounts"] if m["name"] == "bgp-keys"]
    assert mount == {"name": "bgp-keys", "mountPath": key.rsplit("/", 1)[0], "readOnly": True}


def test_nftables_mode_is_unprivileged(proxy_chart: helm_python.Chart) -> None:
    ds = daemonset({}, proxy_chart)
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is False
    assert sc["runAsUser"] == 0
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert not any(v.get("hostPath", {}).get("path") == "/lib/modules" for v in volumes.values())


def test_kube_proxy_cleanup_follows_the_first_sync_only_when_asked(
    proxy_chart: helm_python.Chart,
) -> None:
    """The proxy itself removes kube-proxy's leftovers once it serves (no init container that
    would remove them before): the flag its CLI parses, NET_RAW and the xtables lock."""
    plain = daemonset({}, proxy_chart)
    assert "--cleanup-kube-proxy" not in container(plain)["command"]
    ds = daemonset({"cleanupKubeProxy": True}, proxy_chart)
    pod = ds["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    c = container(ds)
    assert c["command"][0] == "lace-proxy"
    args = build_parser().parse_args(c["command"][1:])
    assert args.func is cmd_run and args.cleanup_kube_proxy is True
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/run/xtables.lock"]
    assert volumes[mount["name"]]["hostPath"] == {
        "path": "/run/xtables.lock",
        "type": "FileOrCreate",
    }


def test_ipvs_mode_is_privileged_with_the_modules(proxy_chart: helm_python.Chart) -> None:
    text = render_text(proxy_chart, IPVS)["lace-proxy/templates/daemonset.yaml"]
    assert "/proc/sys" in text  # the comment saying why
    [ds] = of_kind(manifests({"ds": text}), "DaemonSet")
    c = container(ds)
    sc = c["securityContext"]
    assert sc["privileged"] is True
    assert sc["runAsUser"] == 0
    assert "capabilities" not in sc
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    modules = mounts["/lib/modules"]
    assert modules["readOnly"] is True
    assert volumes[modules["name"]]["hostPath"]["path"] == "/lib/modules"


@pytest.mark.parametrize("values", [{}, IPVS], ids=["nftables", "ipvs"])
def test_volumes(proxy_chart: helm_python.Chart, values: dict[str, Any], tmp_path: Path) -> None:
    objects = render(proxy_chart, values)
    ds = one(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}

    config = mounts["/etc/lace-proxy"]
    assert config["readOnly"] is True
    [cm] = of_kind(objects, "ConfigMap")
    assert volumes[config["name"]]["configMap"]["name"] == cm["metadata"]["name"]

    run = volumes[mounts["/run/lace-proxy"]["name"]]
    assert run["hostPath"] == {"path": "/run/lace-proxy", "type": "DirectoryOrCreate"}
    assert volumes[mounts["/tmp"]["name"]] == {"name": "tmp", "emptyDir": {}}

    # The state socket lace-proxy serves by default lies in the mounted folder, and the chart
    # does not write the field itself (lace.stateSocket: lace-proxy's default).
    assert "stateSocket" not in yaml.safe_load(config_text(objects))["lace"]
    loaded = loaded_config(proxy_chart, values, tmp_path)
    socket = getattr(loaded.lace, "state_socket", "/run/lace-proxy/state.sock")
    assert Path(socket).parent == Path("/run/lace-proxy")


# --- RBAC -----------------------------------------------------------------------------------

READ = ("get", "list", "watch")
LACE_RESOURCES = (
    "networks",
    "networkbindingpolicies",
    "networkroutingpolicies",
    "serviceroutingpolicies",
)
EXPECTED_RBAC = {
    *(("", resource, verb) for resource in ("services", "nodes") for verb in READ),
    *(("discovery.k8s.io", "endpointslices", verb) for verb in READ),
    *(("networking.k8s.io", "servicecidrs", verb) for verb in READ),
    *(("lace-cni.io", resource, verb) for resource in LACE_RESOURCES for verb in READ),
    *((group, "events", verb) for group in ("", "events.k8s.io") for verb in ("create", "patch")),
}


def rbac_triples(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_is_least_privilege(proxy_chart: helm_python.Chart) -> None:
    objects = render(proxy_chart)
    role = one(objects, "ClusterRole")
    assert rbac_triples(role) == EXPECTED_RBAC
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert "*" not in json.dumps(role)

    binding = one(objects, "ClusterRoleBinding")
    sa = one(objects, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_rbac_covers_what_the_proxy_watches(proxy_chart: helm_python.Chart) -> None:
    """Every resource the kube source lists and watches, and every Lace CRD, is granted."""
    triples = rbac_triples(one(render(proxy_chart), "ClusterRole"))
    for resource in watched_resources("node-a"):
        parts = resource.path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        assert {(group, parts[-1], "list"), (group, parts[-1], "watch")} <= triples, resource.path
    group = LACE_GROUP_VERSION.split("/")[0]
    for path in (NETWORKS_CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert crd["spec"]["group"] == group
        assert (group, crd["spec"]["names"]["plural"], "watch") in triples


def test_rbac_and_service_account_can_be_left_out(proxy_chart: helm_python.Chart) -> None:
    values = {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "mine"}}
    objects = render(proxy_chart, values)
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ServiceAccount")
    assert one(objects, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


# --- the configuration ------------------------------------------------------------------------

CONFIG_CASES = {
    "defaults": (
        {},
        {
            "mode": "nftables",
            "bind_address": "0.0.0.0",
            "healthz_bind_address": "0.0.0.0:10256",
            "metrics_bind_address": "0.0.0.0:10249",
            "cluster_cidr": (),
            "node_port_addresses": (),
            "detect_local_mode": "ClusterCIDR",
            "sync_period": 30.0,
            "min_sync_period": 1.0,
            "masquerade_all": False,
            "ipvs.scheduler": "rr",
            "ipvs.strict_arp": False,
            "lace.service_cidrs": (),
            "lace.nftables.table": "lace-proxy",
            "lace.routing.table": 1450,
            "lace.routing.priority": 1450,
            "lace.ipvs.service_addresses": "interface",
            "lace.egress.enabled": True,
            "lace.egress.table": "lace-proxy-egress",
            "lace.egress.non_masquerade_cidrs": (),
            "lace.egress.routable_prefixes": (),
        },
    ),
    "service-cidrs": (
        HOST_LOCAL_READY,
        {"lace.service_cidrs": (net("10.96.0.0/12"), net("fd00:10:96::/112"))},
    ),
    "ipvs": (
        {"mode": "ipvs", "ipvs": {"scheduler": "wlc", "strictARP": True}},
        {"mode": "ipvs", "ipvs.scheduler": "wlc", "ipvs.strict_arp": True},
    ),
    "metrics-local": (
        {"metrics": {"bindAddress": "127.0.0.1"}},
        {"metrics_bind_address": "127.0.0.1:10249"},
    ),
    "ipv6": (
        {"bindAddress": "::", "healthz": {"bindAddress": "::"}, "metrics": {"bindAddress": "::1"}},
        {
            "bind_address": "::",
            "healthz_bind_address": "[::]:10256",
            "metrics_bind_address": "[::1]:10249",
        },
    ),
    "primary-node-ports": ({"nodePortAddresses": ["primary"]}, {"node_port_addresses": "primary"}),
    "bridge": (
        {"detectLocalMode": "BridgeInterface", "detectLocal": {"bridgeInterface": "cni0"}},
        {"detect_local_mode": "BridgeInterface", "detect_local.bridge_interface": "cni0"},
    ),
    "everything": (
        EVERYTHING,
        {
            "mode": "ipvs",
            "cluster_cidr": (net("10.244.0.0/16"), net("fd00:10:244::/56")),
            "node_port_addresses": (net("10.250.0.0/24"),),
            "sync_period": 60.0,
            "min_sync_period": 0.5,
            "masquerade_all": True,
            "detect_local_mode": "InterfaceNamePrefix",
            "detect_local.interface_name_prefix": "veth",
            "healthz_bind_address": "0.0.0.0:11256",
            "metrics_bind_address": "[::]:9100",
            "ipvs.scheduler": "mh",
            "ipvs.strict_arp": True,
            "ipvs.exclude_cidrs": (net("192.0.2.0/24"),),
            "ipvs.tcp_timeout": 900.0,
            "ipvs.tcp_fin_timeout": 30.0,
            "ipvs.udp_timeout": 90.0,
            "ipvs.sync_period": 60.0,
            "nftables.masquerade_bit": 15,  # from extraConfig
            "conntrack.max_per_core": 0,
            "conntrack.tcp_be_liberal": True,
            "conntrack.tcp_established_timeout": 43200.0,
            "conntrack.min": 131072,  # not set: lace-proxy's default
            "lace.service_cidrs": (net("10.96.0.0/12"),),
            "lace.nftables.table": "lp",
            "lace.nftables.family": "ip",  # from extraConfig
            "lace.routing.table": 2000,
            "lace.routing.priority": 100,
            "lace.ipvs.service_addresses": "localRoutes",
            "lace.egress.enabled": False,
            "lace.egress.table": "lp-egress",
            "lace.egress.non_masquerade_cidrs": (net("172.16.0.0/12"),),
            "lace.egress.routable_prefixes": (net("198.51.100.0/24"), net("2001:db8::/32")),
        },
    ),
    "extra-config-wins": (
        {"extraConfig": {"syncPeriod": "2m", "lace": {"egress": {"enabled": False}}}},
        {
            "sync_period": 120.0,
            "lace.egress.enabled": False,
            "lace.egress.table": "lace-proxy-egress",
        },
    ),
}


@pytest.mark.parametrize(("values", "expected"), CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_lace_proxy_loads_the_configmap(
    proxy_chart: helm_python.Chart,
    values: dict[str, Any],
    expected: dict[str, Any],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="lace_proxy.config"):
        config = loaded_config(proxy_chart, values, tmp_path)
    assert caplog.records == []  # no ignored (upstream, inapplicable) fields
    assert config.hostname_override == "node-a"
    assert {key: attr(config, key) for key in expected} == expected


def test_configmap_is_a_kube_proxy_configuration(proxy_chart: helm_python.Chart) -> None:
    doc = yaml.safe_load(config_text(render(proxy_chart)))
    assert (doc["apiVersion"], doc["kind"]) == (
        "kubeproxy.config.k8s.io/v1alpha1",
        "KubeProxyConfiguration",
    )
    # Empty values are left out (lace-proxy's defaults), not written as "" or [].
    assert "clusterCIDR" not in doc and "nodePortAddresses" not in doc
    assert "serviceCIDRs" not in doc["lace"] and "conntrack" not in doc
    assert doc["syncPeriod"] == "30s" and doc["minSyncPeriod"] == "1s"


def test_config_change_rolls_the_daemonset(proxy_chart: helm_python.Chart) -> None:
    def checksum(values: dict[str, Any]) -> str:
        rendered = render_text(proxy_chart, values)
        ds = one(manifests(rendered), "DaemonSet")
        value = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert value == hashlib.sha256(rendered[CONFIGMAP_TEMPLATE].encode()).hexdigest()
        return value

    base = checksum({})
    assert checksum({"podLabels": {"x": "y"}, "priorityClassName": "other"}) == base
    changed = [
        checksum(values)
        for values in (
            IPVS,
            HOST_LOCAL_READY,
            {"lace": {"egress": {"enabled": False}}},
            {"syncPeriod": "1m"},
            {"extraConfig": {"nftables": {"masqueradeBit": 15}}},
        )
    ]
    assert base not in changed and len(set(changed)) == len(changed)


# --- metrics -----------------------------------------------------------------------------------


def test_metrics_service(proxy_chart: helm_python.Chart) -> None:
    objects = render(proxy_chart, {"metrics": {"port": 9100}})
    service = one(objects, "Service")
    ds = one(objects, "DaemonSet")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert {"name": "metrics", "containerPort": 9100, "protocol": "TCP"} in container(ds)["ports"]


def test_service_monitor_only_when_enabled(proxy_chart: helm_python.Chart) -> None:
    assert not of_kind(render(proxy_chart), "ServiceMonitor")
    objects = render(proxy_chart, SERVICE_MONITOR)
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["r"] == "p"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= (
        service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics",
        "/metrics",
        "15s",
    )


def test_service_monitor_needs_the_service(proxy_chart: helm_python.Chart) -> None:
    values = {**SERVICE_MONITOR, "metricsService": {"enabled": False}}
    with pytest.raises(helm_python.HelmRenderError, match=r"needs metricsService\.enabled"):
        render(proxy_chart, values)


@pytest.mark.skipif(not DASHBOARD.exists(), reason="charts/lace-proxy/dashboards/lace-proxy.json")
def test_grafana_dashboard(proxy_chart: helm_python.Chart) -> None:
    assert not [
        o for o in of_kind(render(proxy_chart), "ConfigMap") if "config.yaml" not in o["data"]
    ]
    values = {"grafanaDashboard": {"enabled": True}}
    assert lint_findings(PROXY_CHART, values) == []
    objects = render(proxy_chart, values)
    [dashboard] = [o for o in of_kind(objects, "ConfigMap") if "config.yaml" not in o["data"]]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    [text] = dashboard["data"].values()
    assert "panels" in json.loads(text)

    custom = {"grafanaDashboard": {"enabled": True, "label": "dash", "labelValue": "yes"}}
    [dashboard] = [
        o
        for o in of_kind(render(proxy_chart, custom), "ConfigMap")
        if "dash" in o["metadata"]["labels"]
    ]
    assert dashboard["metadata"]["labels"]["dash"] == "yes"
    assert "grafana_dashboard" not in dashboard["metadata"]["labels"]


def test_notes(proxy_chart: helm_python.Chart) -> None:
    notes = render_text(proxy_chart)["lace-proxy/templates/NOTES.txt"]
    assert f"kubectl -n {NAMESPACE} exec ds/lace-lace-proxy -- lace-proxy services" in notes
    assert "http://NODE_IP:10249/metrics" in notes


# --- the values schema -----------------------------------------------------------------------

BAD_VALUES = {
    "mode-iptables": ({"mode": "iptables"}, "/mode"),
    "healthz-port": ({"healthz": {"port": 70000}}, "/healthz/port"),
    "metrics-port-0": ({"metrics": {"port": 0}}, "/metrics/port"),
    "unknown-key": ({"replicas": 3}, "replicas"),
    "unknown-nested-key": ({"lace": {"egress": {"enable": True}}}, "enable"),
    "cidr-without-length": ({"node": {"serviceCIDRs": ["10.96.0.0"]}}, "/node/serviceCIDRs/0"),
    "duration-number": ({"syncPeriod": 30}, "/syncPeriod"),
    "duration-unitless": ({"minSyncPeriod": "30"}, "/minSyncPeriod"),
    "scheduler": ({"ipvs": {"scheduler": "random"}}, "/ipvs/scheduler"),
    "kernel-table": ({"lace": {"routing": {"table": 254}}}, "/lace/routing/table"),
    "service-addresses": (
        {"lace": {"ipvs": {"serviceAddresses": "routes"}}},
        "/lace/ipvs/serviceAddresses",
    ),
    "bridge-without-name": ({"detectLocalMode": "BridgeInterface"}, "bridgeInterface"),
    "extra-kind": ({"extraConfig": {"kind": "Other"}}, "kind"),
    "extra-mode": ({"extraConfig": {"mode": "ipvs"}}, "mode"),
    "primary-and-cidrs": ({"nodePortAddresses": ["primary", "10.0.0.0/8"]}, "/nodePortAddresses"),
    "bgp-without-peers": ({"lace": {"bgp": {"enabled": True, "asn": 1}}}, "/lace/bgp/peers"),
    "bgp-without-asn": (
        {"lace": {"bgp": {"enabled": True, "peers": [{"address": "10.0.0.1", "asn": 1}]}}},
        "/lace/bgp/asn",
    ),
    "bgp-peer-without-asn": ({"lace": {"bgp": {"peers": [{"address": "10.0.0.1"}]}}}, "asn"),
    "bgp-peer-quote": (
        {"lace": {"bgp": {"peers": [{"address": "10.0.0.1", "asn": 1, "password": 'a"b'}]}}},
        "/lace/bgp/peers/0/password",
    ),
    "bgp-password-and-file": (
        {
            "lace": {
                "bgp": {
                    "peers": [
                        {"address": "10.0.0.1", "asn": 1, "password": "a", "passwordFile": "/k"}
                    ]
                }
            }
        },
        "/lace/bgp/peers/0",
    ),
    "bgp-relative-password-file": (
        {"lace": {"bgp": {"peers": [{"address": "10.0.0.1", "asn": 1, "passwordFile": "k"}]}}},
        "/lace/bgp/peers/0/passwordFile",
    ),
    "bgp-cluster-ips": ({"lace": {"bgp": {"announce": {"clusterIPs": "all"}}}}, "clusterIPs"),
}


@pytest.mark.parametrize(("values", "where"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_bad_values_are_refused(
    proxy_chart: helm_python.Chart, values: dict[str, Any], where: str
) -> None:
    assert where in refusal(proxy_chart, values)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_good_values_pass_the_schema(
    proxy_chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    proxy_chart.validate_schema(values)


def _objects_without_closed_properties(node: Any, path: str = "#") -> list[str]:
    found = []
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            found.append(path)
        for key, child in node.items():
            found += _objects_without_closed_properties(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += _objects_without_closed_properties(child, f"{path}/{i}")
    return found


@pytest.mark.parametrize("chart", [PROXY_CHART, NETWORKS_CHART], ids=lambda p: p.name)
def test_schema_is_strict(chart: Path) -> None:
    schema = json.loads((chart / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    # Every object the schema defines is closed (the junctors' partial schemas excepted).
    open_objects = [
        p
        for p in _objects_without_closed_properties(schema)
        if not re.search(r"/(allOf|anyOf|oneOf|not|if|then)(/|$)", p)
    ]
    assert open_objects == []
    # Every default value is described by the schema.
    defaults = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    assert set(defaults) <= set(schema["properties"])


@pytest.mark.parametrize("chart", [PROXY_CHART, NETWORKS_CHART], ids=lambda p: p.name)
def test_every_value_has_a_comment(chart: Path) -> None:
    """Each scalar (or empty) value in values.yaml has a comment line right above it."""
    lines = (chart / "values.yaml").read_text(encoding="utf-8").splitlines()
    bare = []
    for i, line in enumerate(lines):
        match = re.match(r"^\s*([A-Za-z][\w.-]*):\s*(\S.*)?$", line)
        if match is None or match[2] is None:  # not a key, or a key opening a block
            continue
        if i == 0 or not lines[i - 1].lstrip().startswith("#"):
            bare.append(line.strip())
    assert bare == []
