"""`lace-proxy bgp`: this node's BGP peers with their state, and what it announces.

Read from the speaker itself (BIRD's control socket in lace.bgp.directory) and the route
files lace-proxy wrote for it, so it answers whether or not lace-proxy runs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lace_proxy.cli.common import Commands, add_output_flag
from lace_proxy.config import ConfigError, add_config_flags, config_from_args


def register(commands: Commands) -> None:
    """Add `bgp`."""
    bgp = commands.add_parser(
        "bgp",
        help="this node's BGP peers with their state, and the routes it announces",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Show this node's BGP peers (lace.bgp.peers that select it) with the state of their
session as the speaker (BIRD) reports it, and the routes it announces with their
communities. A peer's state is Established when routes flow; Active or Connect while
the router does not answer or refuses the session; Down when the speaker does not run.
Needs lace.bgp.enabled in --config, and root (BIRD's control socket).""",
        epilog="""examples:
  lace-proxy bgp --config /etc/lace-proxy/config.yaml
  lace-proxy bgp --config proxy.yaml -o json

exit codes:
  0  every peer's session is Established
  1  some peer's is not, or the speaker does not run
  2  lace.bgp is not enabled, or a configuration error""",
    )
    add_config_flags(bgp)
    add_output_flag(bgp, "table", "json")
    bgp.set_defaults(func=_bgp)


def _bgp(args: argparse.Namespace) -> int:
    from lace_proxy.bgp.bird import CONTROL, configured_peers, protocol_name, read_routes
    from lace_proxy.bgp.speaker import answers, sessions

    cfg = config_from_args(args)
    settings = cfg.lace.bgp
    if not settings.enabled:
        where = args.config or "the configuration (no --config)"
        raise ConfigError(where, "lace.bgp.enabled", "is false: BGP is off on this node")
    directory = Path(settings.directory)
    states = sessions(directory / CONTROL)
    names = {protocol_name(p): p for p in settings.peers}
    # This node's peers: those BIRD has, else those of the configuration lace-proxy last
    # wrote for it; with neither, those that select no nodes by label.
    configured = configured_peers(directory)
    peers = [
        {"address": names[n].address, "asn": names[n].asn, "state": states.get(n, "Down")}
        for n in names
        if n in states
        or (n in configured if configured is not None else not names[n].node_selector)
    ]
    routes = read_routes(directory)
    running = answers(directory / CONTROL)
    if args.output == "json":
        out = {
            "speaker": "running" if running else "not running",
            "peers": peers,
            "routes": [{"prefix": p, "communities": list(c)} for p, c in routes.items()],
        }
        print(json.dumps(out, indent=2))
    else:
        if not running:
            print(f"speaker: not running (no answer on {directory / CONTROL})")
        print(f"{'PEER':<40} {'ASN':>10}  STATE")
        for peer in peers:
            print(f"{peer['address']:<40} {peer['asn']:>10}  {peer['state']}")
        print()
        print(f"{'ROUTE':<44} COMMUNITIES")
        for prefix, communities in routes.items():
            print(f"{prefix:<44} {' '.join(communities) or '-'}")
    return 0 if running and all(p["state"] == "Established" for p in peers) else 1
