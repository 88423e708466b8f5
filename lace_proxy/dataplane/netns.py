"""Named network namespaces: a command run in one, a thread moved into one.

The bottom of the dataplane: the nft and conntrack runners prefix their argv, and the
netlink sockets are opened by a thread that entered the namespace. It imports nothing of
lace_proxy, so every module that talks to a kernel can use it.
"""

from __future__ import annotations

import re

NETNS_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def netns_prefix(netns: str | None) -> list[str]:
    """argv prefix that runs a command in a named network namespace (validated), or nothing."""
    if netns is None:
        return []
    if not NETNS_NAME.match(netns):
        raise ValueError(f"invalid network namespace name {netns!r}")
    return ["ip", "netns", "exec", netns]


def enter_netns(name: str) -> None:
    """Move the calling thread into a named network namespace (never creating it: pyroute2's
    default would). Sockets it opens afterwards, and /proc/thread-self/net, are that one's."""
    from pyroute2 import netns

    netns.setns(name, flags=0)
