"""The address plan every testbed shares (private ranges only; each testbed has its own
namespaces), and the ICMP error by which a sink says a packet left the node untranslated."""

from __future__ import annotations

# Address plan: private ranges only, the same in every testbed (each has its own namespaces).
UPLINK_NODE4, UPLINK_NODE6 = "10.250.0.1", "fd00:250::1"
CLIENT4, CLIENT6 = "10.250.0.2", "fd00:250::2"
GWLINK_NODE4, GWLINK_NODE6 = "10.250.1.1", "fd00:250:1::1"
GW4, GW6 = "10.250.1.2", "fd00:250:1::2"
POD_CIDR4, POD_CIDR6 = "10.251.0.0/24", "fd00:251::/64"
POD_GATEWAY4, POD_GATEWAY6 = "10.251.0.1", "fd00:251::1"
SERVICE_CIDR4, SERVICE_CIDR6 = "10.96.0.0/16", "fd00:96::/112"
EXTERNAL_CIDR4, EXTERNAL_CIDR6 = "10.252.0.0/24", "fd00:252::/64"  # LoadBalancer / external IPs
FABRIC4 = "10.250.0.254"  # the two-node testbed's router and sink (cluster.py)

# (ICMP type, code) that gw uses for "left the node untouched".
ESCAPE_ICMP4 = (3, 9)  # destination unreachable, network administratively prohibited
ESCAPE_ICMP6 = (1, 6)  # destination unreachable, reject route to destination
# Every sink's ICMP sender and the (type, code) it rejects with: an error from one of these,
# and only with that type and code, means "escaped". No other host uses these addresses.
SINK_ICMP: dict[str, tuple[int, int]] = {
    GW4: ESCAPE_ICMP4,
    GW6: ESCAPE_ICMP6,
    FABRIC4: ESCAPE_ICMP4,
}
