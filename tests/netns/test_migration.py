"""`lace-proxy cleanup --kube-proxy` on a node holding kube-proxy's state, created the way
kube-proxy creates it: iptables rules loaded with iptables-restore (its iptables mode, in the
nft and legacy flavours; a ClusterIP really DNATed by them), the ipsets and kube-ipvs0 of its
IPVS mode, and the tables of its nftables mode. What is not kube-proxy's stays: kubelet's
chains, a user's chain, kube-router's ipset, lace-proxy's own table. (The IPVS virtual
services themselves are covered in the IPVS VM: tests/vm/inner/test_kube_proxy_cleanup.py.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

from lace_proxy.demo.testbed import Testbed, request_tcp

pytestmark = pytest.mark.netns

VIP = "10.96.0.50"

# kube-proxy's iptables mode for one ClusterIP (10.96.0.50:80 -> pod1:8080), as
# `iptables-save` shows it, plus kubelet's chains and a user's rule, which must stay.
IPTABLES = """\
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-QRSTUVWXYZ012345 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" \
-j MASQUERADE --random-fully
-A KUBE-SEP-ABCDEFGHIJKLMNOP -s {pod}/32 -m comment --comment "default/web:p" -j KUBE-MARK-MASQ
-A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -m comment --comment "default/web:p" -m tcp \
-j DNAT --to-destination {pod}:8080
-A KUBE-SERVICES -d {vip}/32 -p tcp -m comment --comment "default/web:p cluster IP" \
-m tcp --dport 80 -j KUBE-SVC-QRSTUVWXYZ012345
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype \
--dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-QRSTUVWXYZ012345 -m comment --comment "default/web:p -> {pod}:8080" \
-j KUBE-SEP-ABCDEFGHIJKLMNOP
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-CANARY - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
:USER-ALLOW - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" \
-j KUBE-PROXY-FIREWALL
-A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible \
service portals" -j KUBE-EXTERNAL-SERVICES
-A INPUT -j KUBE-FIREWALL
-A INPUT -p tcp -m tcp --dport 2222 -j USER-ALLOW
-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" \
-j KUBE-SERVICES
-A OUTPUT -j KUBE-FIREWALL
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming \
localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark \
0x4000/0x4000 -j ACCEPT
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A USER-ALLOW -j ACCEPT
COMMIT
"""

# kube-proxy's nftables mode (a part of it) and lace-proxy's own table, which stays.
NFT = """\
table ip kube-proxy {
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
  chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }
  chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }
}
table ip6 kube-proxy {
  chain nat-output { type nat hook output priority -100; policy accept; }
}
table inet lace-proxy {
  chain services { }
}
"""


def _answer(tb: Testbed) -> str:
    result = request_tcp(tb.client, VIP, 80, timeout=1.0)
    return result.reply.name if result.reply else result.outcome


def _chains(saved: str) -> set[str]:
    return {line[1:].split()[0] for line in saved.splitlines() if line.startswith(":")}


def _cleanup(tb: Testbed) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "lace_proxy", "cleanup", "--kube-proxy"]
    return tb.exec(tb.node, argv, check=False)


@pytest.mark.parametrize("flavour", ["nft", "legacy"])
def test_cleanup_kube_proxy_removes_its_leftovers_and_nothing_else(
    make_testbed: Callable[..., Testbed], flavour: str
) -> None:
    tb = make_testbed(pods=1)
    pod = tb.pods[0].ipv4
    sh = tb.exec
    sh(tb.node, ["ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"])
    sh(tb.node, ["ipset", "create", "KUBE-LOOP-BACK", "hash:ip,port,ip"])
    sh(tb.node, ["ipset", "create", "KUBE-6-CLUSTER-IP", "hash:ip,port", "family", "inet6"])
    sh(tb.node, ["ipset", "create", "KUBE-SRC-ROUTER", "hash:ip"])  # kube-router's: stays
    sh(tb.node, [f"iptables-{flavour}-restore"], input=IPTABLES.format(pod=pod, vip=VIP))
    sh(
        tb.node,
        [f"ip6tables-{flavour}-restore"],
        input="*nat\n:KUBE-SERVICES - [0:0]\n-A OUTPUT -j KUBE-SERVICES\nCOMMIT\n",
    )
    sh(tb.node, ["nft", "-f", "-"], input=NFT)
    sh(tb.node, ["ip", "link", "add", "kube-ipvs0", "type", "veth", "peer", "name", "kipvs-peer"])
    sh(tb.node, ["ip", "addr", "add", f"{VIP}/32", "dev", "kube-ipvs0"])
    # kube-proxy's rules are live: the ClusterIP reaches the pod through its DNAT.
    assert _answer(tb) == "pod1"

    done = _cleanup(tb)
    assert done.returncode == 0, done.stderr
    assert f"removed  iptables-{flavour}: " in done.stdout
    assert "removed  ipsets: 3 of kube-proxy's" in done.stdout
    assert "removed  kube-ipvs0" in done.stdout
    assert "removed  nftables table ip kube-proxy" in done.stdout

    # Gone: the service stops being DNATed (the router rejects what leaves untranslated).
    assert _answer(tb) == "escaped"
    saved = sh(tb.node, [f"iptables-{flavour}-save"]).stdout
    assert _chains(saved) & {"KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-FORWARD"} == set()
    assert not any(c.startswith(("KUBE-SVC-", "KUBE-SEP-")) for c in _chains(saved))
    # Kept: kubelet's chains and the jumps to them, the user's chain and rule.
    assert {"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "USER-ALLOW"} <= _chains(saved)
    assert "-A INPUT -j KUBE-FIREWALL" in saved
    assert "-A INPUT -p tcp -m tcp --dport 2222 -j USER-ALLOW" in saved
    assert "KUBE-SERVICES" not in sh(tb.node, [f"ip6tables-{flavour}-save"]).stdout
    sets = sh(tb.node, ["ipset", "list", "-n"]).stdout.split()
    assert sets == ["KUBE-SRC-ROUTER"]
    tables = sh(tb.node, ["nft", "list", "tables"]).stdout
    assert "kube-proxy" not in tables and "table inet lace-proxy" in tables
    assert "kube-ipvs0" not in sh(tb.node, ["ip", "-o", "link"]).stdout

    # Again: nothing left to remove, and that is not an error.
    again = _cleanup(tb)
    assert again.returncode == 0, again.stderr
    assert "removed" not in again.stdout
    assert "skipped  nftables table ip kube-proxy: not present" in again.stdout
