"""The real kube-proxy (v1.37.2, built by `testkit.controlplane.build`) in a network namespace.

Why: lace-proxy replaces kube-proxy, so tests and benchmarks need the real one beside it: to
compare the two on the same apiserver, and to switch a node over from the rules kube-proxy
left in the kernel.

    with Netns() as ns, ApiLink(ns.name) as link:
        with ControlPlane(bind_address="0.0.0.0", sans=[link.host_address]) as cp:
            kubeconfig = cp.write_admin_kubeconfig(path, server=link.url(cp.port))
            create(node_object("node-a", link.netns_address))   # before kube-proxy starts
            with KubeProxy(ns.name, kubeconfig, "node-a") as proxy:
                ...                                  # ruleset(ns.name), proxy.logs()

Loopback is per namespace, so kube-proxy dials the apiserver through `ApiLink`, a veth pair
whose root side the apiserver (bound to 0.0.0.0) answers on. kube-proxy needs its Node, with
an InternalIP, before it starts: since 1.36 it exits if the Node is missing, is deleted or
changes its addresses. `conntrack` is left alone (`nf_conntrack_max` is read-only inside a
child namespace).

Processes die with the thread that started them (PR_SET_PDEATHSIG): start them from a thread
that outlives them. Names carry this process's pid, so a run that was SIGKILLed leaves
namespaces and veths that the next `Netns` or `ApiLink` removes (`remove_stale`).
"""

from __future__ import annotations

import fcntl
import ipaddress
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from testkit.controlplane.build import Binaries, binaries
from testkit.process import spawn, stop, tail

#: ApiLink's /30s come from here; nothing else on these machines uses it.
LINK_RANGE = ipaddress.ip_network("10.123.0.0/16")
_LOCK = Path("/run/lock/lace-proxy-apilink.lock")
#: Loaded here, not in a forked child: dlopen there could wait on a lock another thread held.
_NETNS_PATTERN = re.compile(r"lkp-([0-9a-f]+)-[0-9a-f]+")
_VETH_PATTERN = re.compile(r"lkp([0-9a-f]+)x[0-9a-f]+")
_names = itertools.count()


class KubeProxyError(RuntimeError):
    """kube-proxy exited, or a command around it failed; the message carries the output."""


def _run(argv: Sequence[str], timeout: float = 60.0) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise KubeProxyError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _alive(pid_hex: str) -> bool:
    try:
        os.kill(int(pid_hex, 16), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, not ours to signal
    return True


def remove_stale() -> None:
    """Delete namespaces and veths of runs whose process is gone (killed before teardown)."""
    for line in _run(["ip", "netns", "list"]).splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _NETNS_PATTERN.fullmatch(name)
        if match and not _alive(match[1]):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    for link in json.loads(_run(["ip", "-j", "link", "show", "type", "veth"]) or "[]"):
        match = _VETH_PATTERN.fullmatch(link.get("ifname", ""))
        if match and not _alive(match[1]):
            subprocess.run(["ip", "link", "del", match[0]], capture_output=True, check=False)


def _unique(pattern: str) -> str:
    return pattern.format(pid=os.getpid(), n=next(_names))


class Netns:
    """A fresh named network namespace with loopback up; deleted on close."""

    def __init__(self) -> None:
        remove_stale()
        self.name = _unique("lkp-{pid:x}-{n:x}")
        _run(["ip", "netns", "add", self.name])
        self._closed = False
        try:
            _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)

    def __enter__(self) -> Netns:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _used_addresses() -> set[ipaddress.IPv4Address]:
    """IPv4 addresses of the root namespace's interfaces."""
    used = set()
    for link in json.loads(_run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for info in link.get("addr_info", []):
            used.add(ipaddress.IPv4Address(info["local"]))
    return used


class ApiLink:
    """A veth pair from the root namespace into `netns`, on the first /30 of LINK_RANGE not in
    use in the root namespace: the root side is `host_address` (dial the apiserver there),
    the namespace side `netns_address`.

    Only the addresses are added (their /30 is the only route); the namespace's other routes,
    its default route included, are left alone. Removed on close (both ends go with either).
    """

    def __init__(self, netns: str) -> None:
        remove_stale()
        self.netns = netns
        self.name = _unique("lkp{pid:x}x{n:x}")
        self._closed = False
        with open(_LOCK, "a") as lock:  # two runs must not pick the same /30
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = _used_addresses()
            network = next(
                (n for n in LINK_RANGE.subnets(new_prefix=30) if not any(a in n for a in used)),
                None,
            )
            if network is None:
                raise KubeProxyError(f"no free /30 left in {LINK_RANGE}")
            self.host_address, self.netns_address = (str(a) for a in network.hosts())
            _run(["ip", "link", "add", self.name, "type", "veth",
                  "peer", "name", self.name, "netns", netns])  # fmt: skip
        try:
            _run(["ip", "addr", "add", f"{self.host_address}/30", "dev", self.name])
            _run(["ip", "link", "set", self.name, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{self.netns_address}/30", "dev", self.name])
            _run(["ip", "-n", netns, "link", "set", self.name, "up"])
        except BaseException:
            self.close()
            raise

    def url(self, port: int) -> str:
        """The apiserver's URL as seen from inside the namespace."""
        return f"https://{self.host_address}:{port}"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            subprocess.run(["ip", "link", "del", self.name], capture_output=True, check=False)

    def __enter__(self) -> ApiLink:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def node_object(name: str, internal_ip: str) -> dict[str, Any]:
    """The Node kube-proxy waits for (create it through the API before starting the proxy);
    kubelet registers its Node with these addresses in the same way."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ]
        },
    }


def ruleset(netns: str) -> list[dict[str, Any]]:
    """`nft -j list ruleset` inside `netns`: its objects (tables, chains, rules, sets...)."""
    out = _run(["ip", "netns", "exec", netns, "nft", "-j", "list", "ruleset"], timeout=600)
    return [obj for obj in json.loads(out)["nftables"] if "metainfo" not in obj]


def _merged(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra` laid over it, nested mappings merged field by field."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def kube_proxy_config(
    kubeconfig: Path,
    node_name: str,
    *,
    mode: str = "nftables",
    cluster_cidr: str | None = None,
    detect_local_mode: str | None = None,
    extra: Mapping[str, Any] | None = None,
    metrics_port: int = 10249,
    healthz_port: int = 10256,
) -> dict[str, Any]:
    """KubeProxy's KubeProxyConfiguration (v1alpha1): also lace-proxy's `--config`, so the
    two can be run from the same file. `extra` is laid over it, nested mappings merged."""
    config: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": mode,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "conntrack": {"maxPerCore": 0, "min": 0},  # nf_conntrack_max: read-only in a netns
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
    }
    if cluster_cidr is not None:
        config["clusterCIDR"] = cluster_cidr
    if detect_local_mode is not None:
        config["detectLocalMode"] = detect_local_mode
    return _merged(config, extra or {})


class KubeProxy:
    """kube-proxy run as `ip netns exec NETNS kube-proxy --config FILE`.

    The KubeProxyConfiguration (v1alpha1) is written to a temporary directory beside its log:
    `mode` (nftables or iptables), the kubeconfig, the node name, conntrack left alone,
    metrics and healthz on the namespace's loopback, optional `cluster_cidr` and
    `detect_local_mode`, and `extra` fields laid over it (nested ones merged). Leaving the
    context stops it and removes the directory; its rules stay in the kernel, as when the real
    one stops (`cleanup()` removes them, upstream's way).
    """

    def __init__(
        self,
        netns: str,
        kubeconfig: Path,
        node_name: str,
        *,
        mode: str = "nftables",
        cluster_cidr: str | None = None,
        detect_local_mode: str | None = None,
        extra: Mapping[str, Any] | None = None,
        metrics_port: int = 10249,
        healthz_port: int = 10256,
        verbosity: int = 2,
        cgroups: Sequence[Path] = (),
        bins: Binaries | None = None,
    ) -> None:
        if mode not in ("nftables", "iptables"):
            raise ValueError(f"mode {mode!r}: nftables or iptables")
        self.netns, self.mode, self.verbosity = netns, mode, verbosity
        self.cgroups = list(cgroups)
        self.binary = (bins or binaries()).kube_proxy
        self.directory = Path(tempfile.mkdtemp(prefix="lace-kube-proxy-"))
        self.log = self.directory / "kube-proxy.log"
        self.config_path = self.directory / "config.yaml"
        self.config = kube_proxy_config(
            kubeconfig,
            node_name,
            mode=mode,
            cluster_cidr=cluster_cidr,
            detect_local_mode=detect_local_mode,
            extra=extra,
            metrics_port=metrics_port,
            healthz_port=healthz_port,
        )
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """kube-proxy's own pid (`ip netns exec` execs it: no process in between)."""
        if self.popen is None:
            raise KubeProxyError("kube-proxy is not running")
        return self.popen.pid

    def start(self) -> KubeProxy:
        argv = ["ip", "netns", "exec", self.netns, str(self.binary),
                f"--config={self.config_path}", f"--v={self.verbosity}"]  # fmt: skip
        self.popen = spawn(argv, self.log, self.cgroups)
        return self

    def check_alive(self) -> None:
        """Raise with the log's tail if kube-proxy has exited."""
        if self.popen is None or self.popen.poll() is not None:
            code = None if self.popen is None else self.popen.returncode
            raise KubeProxyError(f"kube-proxy exited ({code}):\n{self.logs()}")

    def logs(self, lines: int = 40) -> str:
        return tail(self.log, lines)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after `timeout`); the exit status, None if not running."""
        popen, self.popen = self.popen, None
        return None if popen is None else stop(popen, timeout)

    def cleanup(self) -> str:
        """`kube-proxy --cleanup` in the namespace: removes its iptables, IPVS and nftables
        rules, as upstream documents for leaving a mode. Returns its output."""
        argv = ["ip", "netns", "exec", self.netns, str(self.binary), "--cleanup", "--v=2"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise KubeProxyError(f"kube-proxy --cleanup failed ({proc.returncode}):\n{proc.stderr}")
        return proc.stderr

    def close(self) -> None:
        """Stop it and remove its directory (config and log)."""
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> KubeProxy:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
