"""A real etcd + kube-apiserver for tests, with its own certificates and RBAC on.

Why real: the proxy's watcher must behave against the server operators run, not against our
idea of it (DESIGN.md §6). The binaries come from `testkit.controlplane.build`.

    with ControlPlane() as cp:                      # etcd + apiserver, /readyz ok
        api = cp.admin_client()                     # system:masters, via cp.admin_kubeconfig
        path = cp.service_account_kubeconfig("proxy", "view-services", rules=[...])
        cp.restart()                                # same ports, certificates and etcd data

Everything lives in one temporary directory (certificates, kubeconfigs, etcd's data, logs)
that `close()` removes, with the processes, also when starting fails. The processes get
SIGKILL if the process that started them dies (PR_SET_PDEATHSIG), so a killed test run leaves
no apiserver behind. Set LACE_PROXY_CONTROLPLANE_KEEP=1 to keep the directory for a post-mortem.

Network namespaces: loopback is per namespace, so a proxy inside one must dial an address on
the host side of its veth. Pass ``bind_address="0.0.0.0"`` (or that address) and the addresses
as ``sans``, and write its kubeconfig with ``server=`` that address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from testkit.controlplane.build import Binaries, binaries
from testkit.process import spawn, stop, tail

#: A /16, not envtest's /24: the benchmarks hold 30k Services. The /112 makes it dual stack.
SERVICE_CIDRS = ("10.96.0.0/16", "fd00:10:96::/112")
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
_PREFIX = "lace-controlplane-"

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {sans}
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class ControlPlaneError(RuntimeError):
    """A process did not start or become ready; the message carries its log's tail."""


def _sweep_stale() -> None:
    """Remove directories left by runs that were SIGKILLed (their processes died with them,
    by PR_SET_PDEATHSIG, but nothing could remove the directory)."""
    for directory in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            os.kill(int((directory / "owner.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(directory, ignore_errors=True)
        except (OSError, ValueError):
            continue  # still being set up, or not ours to judge


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now on `host` (the kernel's pick; a small race is accepted)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)}: {result.stderr.strip()}")


class _Process:
    """One long-running program with its log file; stop() is idempotent."""

    def __init__(self, name: str, argv: Sequence[str], log: Path) -> None:
        self.name, self.argv, self.log = name, list(argv), log
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.popen = spawn(self.argv, self.log)

    def check_alive(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            code = None if self.popen is None else self.popen.returncode
            raise ControlPlaneError(f"{self.name} exited ({code}):\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)

    def stop(self, timeout: float = 15.0) -> None:
        popen, self.popen = self.popen, None
        if popen is not None:
            stop(popen, timeout)


class ControlPlane:
    """etcd and kube-apiserver on free loopback ports, in a temporary directory of its own."""

    def __init__(
        self,
        *,
        bins: Binaries | None = None,
        bind_address: str = "127.0.0.1",
        advertise_address: str | None = None,
        sans: Sequence[str] = (),
        service_cidrs: Sequence[str] = SERVICE_CIDRS,
        apiserver_args: Sequence[str] = (),
        startup_timeout: float = 90.0,
    ) -> None:
        self.bins = bins or binaries()
        self.bind_address = bind_address
        unspecified = ipaddress.ip_address(bind_address).is_unspecified
        #: Required without a default route; it is also the `kubernetes` Service's endpoint.
        self.advertise_address = advertise_address or ("127.0.0.1" if unspecified else bind_address)
        self.host = "127.0.0.1" if unspecified else bind_address
        self.service_cidrs = list(service_cidrs)
        self.startup_timeout = startup_timeout
        _sweep_stale()
        self.directory = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.directory / "owner.pid").write_text(f"{os.getpid()}\n")
        self.pki = self.directory / "pki"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port(self.host)
        self.url = f"https://{_url_host(self.host)}:{self.port}"
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.admin_kubeconfig = self.directory / "admin.kubeconfig"
        #: Seconds from starting kube-apiserver to /readyz ok, at the last (re)start.
        self.apiserver_startup_seconds: float | None = None
        self._sans = [
            "127.0.0.1",
            "::1",
            self.advertise_address,
            *(str(next(ipaddress.ip_network(c).hosts())) for c in self.service_cidrs),
            *sans,
        ]
        self._etcd = _Process("etcd", self._etcd_argv(), self.directory / "etcd.log")
        self._apiserver = _Process(
            "kube-apiserver",
            self._apiserver_argv(list(apiserver_args)),
            self.directory / "kube-apiserver.log",
        )
        self._closed = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        """Make certificates (once), start etcd then the apiserver, wait until ready."""
        try:
            if not (self.pki / "ca.crt").exists():
                self._make_pki()
                self._write_kubeconfig(self.admin_kubeconfig, self._admin_user())
            self.start_etcd()
            self.start_apiserver()
        except BaseException:
            self.close()
            raise
        return self

    def start_etcd(self) -> None:
        self._etcd.start()
        self._wait("etcd", self._etcd, self._etcd_healthy)

    def start_apiserver(self) -> None:
        started = time.monotonic()
        self._apiserver.start()
        self._wait("kube-apiserver", self._apiserver, self._apiserver_ready)
        self.apiserver_startup_seconds = time.monotonic() - started

    def stop_apiserver(self) -> None:
        """An API outage: clients see refused connections; etcd keeps the state."""
        self._apiserver.stop()

    def stop_etcd(self) -> None:
        self._etcd.stop()

    def stop(self) -> None:
        self._apiserver.stop()
        self._etcd.stop()

    def restart(self) -> None:
        """Both processes again, on the same ports with the same data and certificates."""
        self.stop()
        self.start_etcd()
        self.start_apiserver()

    def close(self) -> None:
        """Stop everything and remove the directory (kept with LACE_PROXY_CONTROLPLANE_KEEP=1)."""
        if self._closed:
            return
        self._closed = True
        self.stop()
        if os.environ.get("LACE_PROXY_CONTROLPLANE_KEEP") == "1":
            print(f"control plane kept in {self.directory}")
        else:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def logs(self, lines: int = 30) -> str:
        """The tails of both logs, for a failing test's message."""
        etcd, apiserver = self._etcd.tail(lines), self._apiserver.tail(lines)
        return f"--- etcd\n{etcd}\n--- kube-apiserver\n{apiserver}"

    # -- clients --------------------------------------------------------------------------

    def admin_client(self) -> Any:
        """A `kubernetes.client.ApiClient` in group system:masters; close it after use."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.admin_kubeconfig))

    def write_admin_kubeconfig(self, path: Path, server: str | None = None) -> Path:
        """The admin kubeconfig again, dialling `server` (e.g. from inside a namespace)."""
        self._write_kubeconfig(path, self._admin_user(), server)
        return path

    def service_account_kubeconfig(
        self,
        name: str,
        cluster_role: str,
        *,
        namespace: str = "default",
        rules: Sequence[Mapping[str, Any]] | None = None,
        server: str | None = None,
        expiration_seconds: int = 24 * 3600,
    ) -> Path:
        """A ServiceAccount bound to `cluster_role` (made from `rules` if given), and a
        kubeconfig holding a token for it (TokenRequest API). Returns once RBAC grants it."""
        from kubernetes import client

        with self.admin_client() as api:
            core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
            _created(
                lambda: core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
                )
            )
            _created(
                lambda: core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
                )
            )
            if rules is not None:
                role = client.V1ClusterRole(
                    metadata=client.V1ObjectMeta(name=cluster_role),
                    rules=[client.V1PolicyRule.from_dict(dict(rule)) for rule in rules],
                )
                if not _created(lambda: rbac.create_cluster_role(role)):
                    rbac.replace_cluster_role(cluster_role, role)
            binding = f"{cluster_role}:{namespace}:{name}"
            _created(
                lambda: rbac.create_cluster_role_binding(
                    client.V1ClusterRoleBinding(
                        metadata=client.V1ObjectMeta(name=binding),
                        role_ref=client.V1RoleRef(
                            api_group="rbac.authorization.k8s.io",
                            kind="ClusterRole",
                            name=cluster_role,
                        ),
                        subjects=[
                            client.RbacV1Subject(
                                kind="ServiceAccount", name=name, namespace=namespace
                            )
                        ],
                    )
                )
            )
            token = core.create_namespaced_service_account_token(
                name,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(expiration_seconds=expiration_seconds)
                ),
            ).status.token
            self._wait_granted(api, f"system:serviceaccount:{namespace}:{name}", cluster_role)
        path = self.directory / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, {"token": token}, server)
        return path

    def _wait_granted(self, api: Any, user: str, cluster_role: str) -> None:
        """RBAC reads bindings from an informer: wait until the role's first rule applies,
        so a test's first request is not refused by propagation delay."""
        from kubernetes import client

        role = client.RbacAuthorizationV1Api(api).read_cluster_role(cluster_role)
        rule = next((r for r in role.rules or [] if r.resources and r.verbs), None)
        if rule is None:
            return
        review = client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(
                user=user,
                groups=["system:serviceaccounts", "system:authenticated"],
                resource_attributes=client.V1ResourceAttributes(
                    group=(rule.api_groups or [""])[0],
                    resource=rule.resources[0],
                    verb=rule.verbs[0],
                ),
            )
        )
        authz = client.AuthorizationV1Api(api)
        deadline = time.monotonic() + 30
        while not authz.create_subject_access_review(review).status.allowed:
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{user} never granted {cluster_role}")
            time.sleep(0.05)

    # -- internals ------------------------------------------------------------------------

    def _etcd_argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            str(self.bins.etcd),
            "--name=lace-test",
            f"--data-dir={self.directory / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lace-test={peer}",
            "--unsafe-no-fsync",  # tests do not survive power loss; fsync only costs time
            "--log-level=warn",
        ]

    def _apiserver_argv(self, extra: list[str]) -> list[str]:
        pki = self.pki
        return [
            str(self.bins.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.bind_address}",
            f"--secure-port={self.port}",
            f"--advertise-address={self.advertise_address}",
            f"--cert-dir={pki}",  # never the default /var/run/kubernetes
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={','.join(self.service_cidrs)}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--profiling=false",
            # 1.37 refuses a loopback advertise address with the endpoint reconciler (an
            # EndpointSlice may not point at loopback): then the `kubernetes` Service gets no
            # endpoints. Pass a real advertise_address to have them.
            *(
                ["--endpoint-reconciler-type=none"]
                if ipaddress.ip_address(self.advertise_address).is_loopback
                else []
            ),
            *extra,
        ]

    def _make_pki(self) -> None:
        pki = self.pki
        pki.mkdir(mode=0o700)
        sans = ",".join(
            [f"IP:{ip}" for ip in dict.fromkeys(self._sans)] + [f"DNS:{d}" for d in DNS_NAMES]
        )
        (pki / "openssl.cnf").write_text(_OPENSSL_CONFIG.format(sans=sans))
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", *ec,
                 "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
                 "-subj", "/CN=lace-proxy-test-ca", cwd=pki)  # fmt: skip
        for name, subject, section in (
            ("apiserver", "/CN=kube-apiserver", "server"),
            ("admin", "/O=system:masters/CN=lace-proxy-test-admin", "client"),
        ):
            _openssl("req", "-new", "-config", "openssl.cnf", *ec, "-keyout", f"{name}.key",
                     "-out", f"{name}.csr", "-subj", subject, cwd=pki)  # fmt: skip
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                     "-set_serial", f"0x{secrets.token_hex(16)}", "-days", "30",
                     "-extfile", "openssl.cnf", "-extensions", section,
                     "-out", f"{name}.crt", cwd=pki)  # fmt: skip
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", "sa.key", cwd=pki)  # fmt: skip
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)

    def _admin_user(self) -> dict[str, str]:
        return {
            "client-certificate": str(self.pki / "admin.crt"),
            "client-key": str(self.pki / "admin.key"),
        }

    def _write_kubeconfig(
        self, path: Path, user: dict[str, str], server: str | None = None
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "lace-test",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority": str(self.pki / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {"name": "lace-test", "context": {"cluster": "lace-test", "user": "user"}}
            ],
            "current-context": "lace-test",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def admin_ssl_context(self) -> ssl.SSLContext:
        """TLS as the admin: trusts the test CA, presents the admin's client certificate."""
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return context

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """A raw GET as admin (status, body): for what the typed client hides."""
        request = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(
                request, timeout=timeout, context=self.admin_ssl_context()
            ) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as reply:
            return bool(json.loads(reply.read()).get("health") == "true")

    def _apiserver_ready(self) -> bool:
        """/readyz, then what tests assume exists: the default namespace and (1.33+) the
        default ServiceCIDR, ready, without which no Service gets a ClusterIP."""
        if self.get("/readyz")[0] != 200 or self.get("/api/v1/namespaces/default")[0] != 200:
            return False
        status, body = self.get("/apis/networking.k8s.io/v1/servicecidrs/kubernetes")
        if status == 404 and b"servicecidrs" not in body:
            return True  # not served by this version
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _wait(self, what: str, process: _Process, ready: Any) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.05
        while True:
            process.check_alive()
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            if time.monotonic() > deadline:
                process.stop()
                raise ControlPlaneError(
                    f"{what} not ready after {self.startup_timeout:.0f} s:\n{process.tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)


def _created(create: Any) -> bool:
    """Create, treating 409 AlreadyExists as done (helpers are called once per test)."""
    from kubernetes.client.exceptions import ApiException

    try:
        create()
    except ApiException as error:
        if error.status != 409:
            raise
        return False
    return True


@contextlib.contextmanager
def control_plane(**options: Any) -> Iterator[ControlPlane]:
    """`with control_plane() as cp:` — the same as `with ControlPlane(**options) as cp:`."""
    with ControlPlane(**options) as plane:
        yield plane
