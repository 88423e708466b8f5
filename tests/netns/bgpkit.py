"""A real BGP router for tests: FRR's bgpd in a network namespace (no zebra, nothing
installed in the kernel), queried through vtysh's JSON."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

BGPD = "/usr/lib/frr/bgpd"


class FrrRouter:
    """bgpd peering passively with `neighbors` ({address: ASN}) from `namespace`, with a TCP
    MD5 key for those in `passwords`."""

    def __init__(
        self,
        namespace: str,
        folder: Path,
        asn: int,
        router_id: str,
        neighbors: dict[str, int],
        passwords: dict[str, str] | None = None,
    ) -> None:
        self.folder = folder
        self.asn = asn
        folder.mkdir(parents=True, exist_ok=True)
        lines = [
            f"router bgp {asn}",
            f" bgp router-id {router_id}",
            " no bgp ebgp-requires-policy",
            " no bgp default ipv4-unicast",
            " bgp graceful-restart stalepath-time 360",
        ]
        for address, remote in neighbors.items():
            lines += [
                f" neighbor {address} remote-as {remote}",
                f" neighbor {address} passive",
                f" neighbor {address} timers 3 9",
            ]
            if address in (passwords or {}):
                lines.append(f" neighbor {address} password {(passwords or {})[address]}")
        for family in ("ipv4", "ipv6"):
            lines.append(f" address-family {family} unicast")
            lines += [f"  neighbor {address} activate" for address in neighbors]
            lines.append(" exit-address-family")
        (folder / "bgpd.conf").write_text("\n".join(lines) + "\n")
        argv = ["ip", "netns", "exec", namespace, BGPD, "-Z", "-n", "-S", "-P", "0"]
        argv += ["-f", str(folder / "bgpd.conf"), "-i", str(folder / "bgpd.pid")]
        argv += ["--vty_socket", str(folder), "--log", f"file:{folder / 'bgpd.log'}"]
        (folder / "bgpd.vty").unlink(missing_ok=True)  # a previous bgpd's, in this folder
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not (folder / "bgpd.vty").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bgpd did not start: {(folder / 'bgpd.log').read_text()}")
            time.sleep(0.05)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def set_password(self, address: str, password: str) -> None:
        """Give a neighbor a new TCP MD5 key (bgpd resets its session)."""
        commands = ["configure terminal", f"router bgp {self.asn}"]
        commands.append(f"neighbor {address} password {password}")
        argv = ["vtysh", "--vty_socket", str(self.folder)]
        for c in commands:
            argv += ["-c", c]
        subprocess.run(argv, check=True, capture_output=True, timeout=30)

    def show(self, command: str) -> Any:
        """A vtysh command's JSON answer."""
        out = subprocess.run(
            ["vtysh", "--vty_socket", str(self.folder), "-c", command],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return json.loads(out)

    def routes(self, family: int) -> dict[str, tuple[str, tuple[str, ...], bool]]:
        """Each route learned: (next hop, communities standard and large, stale)."""
        af = "ipv6" if family == 6 else "ipv4"
        out = {}
        shown = self.show(f"show bgp {af} unicast json detail")
        for prefix, entries in shown.get("routes", {}).items():
            for path in entries[1:] if entries and "prefix" in entries[0] else entries:
                hop = path["nexthops"][0]["ip"]
                communities = (
                    *path.get("community", {}).get("list", ()),
                    *path.get("largeCommunity", {}).get("list", ()),
                )
                out[prefix] = (hop, tuple(sorted(communities)), bool(path.get("stale")))
        return out

    def next_hops(self, family: int) -> dict[str, set[str]]:
        """Each prefix learned with the next hops of all its paths (one per announcing node)."""
        af = "ipv6" if family == 6 else "ipv4"
        shown = self.show(f"show bgp {af} unicast json")
        return {
            prefix: {hop["ip"] for path in paths for hop in path["nexthops"][:1]}
            for prefix, paths in shown.get("routes", {}).items()
        }

    def peer(self, address: str) -> dict[str, Any]:
        """The neighbor as `show bgp summary` has it (state, connectionsEstablished, ...)."""
        summary = self.show("show bgp summary json")
        return dict(summary.get("ipv4Unicast", {}).get("peers", {}).get(address, {}))

    def wait_for(self, what: str, check: Any, timeout: float = 30.0) -> Any:
        """Poll until `check()` is truthy (BGP converges asynchronously); its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"router: no {what} within {timeout:.0f} s")
            time.sleep(0.1)
