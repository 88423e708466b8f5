"""`lace-proxy table`, `explain`, `services` and `endpoints`: what the proxy computes.

Each computes this node's state with the proxy's own change tracker (`lace_proxy.app`),
never synced, or asks the running proxy over its state socket; the heavy modules are
imported by the handlers, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lace_proxy.cli.common import (
    Commands,
    add_api_flags,
    add_netns_flag,
    add_output_flag,
    print_rejection,
)
from lace_proxy.config import ProxyConfig, add_config_flags, config_from_args

if TYPE_CHECKING:
    from lace_proxy.dataplane.nftables.settings import NftablesSettings
    from lace_proxy.explain import Explanation, NodeFacts
    from lace_proxy.model import Node
    from lace_proxy.networks import NetworkView
    from lace_proxy.proxier import Proxier
    from lace_proxy.table import Backend


def register(commands: Commands) -> None:
    """Add `table`, `services`, `endpoints` and `explain`."""
    table = commands.add_parser(
        "table",
        help="print the computed service table",
        description="Compute this node's service table from a manifest folder and print each "
        "frontend with its backends (state: ready/terminating, local/remote).",
    )
    add_config_flags(table)
    add_output_flag(table, "table", "json")
    table.set_defaults(func=cmd_table)

    for what, summary, shows in (
        (
            "services",
            "list services: type, frontends, backends with state, bound network",
            "each service with its type, its Lace network, its frontends (ClusterIPs, "
            "NodePorts, ExternalIPs, LoadBalancer IPs) and the backends they forward to, "
            "with their state (ready, terminating, not-ready)",
        ),
        (
            "endpoints",
            "list endpoints: state, node, the traffic that uses each, or why none does",
            "every endpoint of every service port, as the EndpointSlices deliver it: its "
            "state, node, the traffic that uses it (cluster: ClusterIP; external: NodePort, "
            "ExternalIP, LoadBalancer) or why it is excluded (not ready, outside the "
            "service's network, another node's under a Local policy, topology hints, ...)",
        ),
    ):
        inv = commands.add_parser(
            what,
            help=summary,
            description=f"Show {shows}. By default the running proxy on this node answers, "
            "over its read-only state socket (lace.stateSocket; root only); with "
            "--kubeconfig/--master or --manifests the state is computed here instead, as "
            "the proxy would compute it for the node --hostname-override.",
        )
        inv.add_argument(
            "names", nargs="*", metavar="NAME", help="service NAME or NAMESPACE/NAME (default: all)"
        )
        inv.add_argument("-n", "--namespace", help="only services in this namespace")
        add_output_flag(inv, "table", "json", "yaml")
        add_api_flags(
            inv,
            kubeconfig_help="compute the state from this cluster's API",
            master_help="the API server's address",
        )
        inv.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="how long to wait for the API's complete lists (default 30)",
        )
        add_config_flags(inv)
        inv.set_defaults(func=cmd_inventory)

    explain_cmd = commands.add_parser(
        "explain",
        help="tell what happens to a new connection, and why",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Explain a new connection from SRC to DST under this node's table (computed from
--manifests, as `table` does, with the settings of --config: lace.serviceCIDRs,
nodePortAddresses, clusterCIDR) and the Lace network model:

  source       the source's network and why (host-local, a pod network by prefix, an
               external network by longest-prefix match, or no identity)
  destination  a ClusterIP/NodePort/ExternalIP/LoadBalancer frontend, a pod, or nothing
               of lace-proxy's
  bound to     the service's network, and why
  verdict/why  the policy that allows it, or what is missing (as an operator action)
  backends     the endpoints that may answer, or why none (excluded endpoints listed)
  condition    network-model conditions that bear on it; `rejected`: invalid objects
  kernel       whether the kernel's nftables sets agree (kernel agrees / kernel
               differs / not programmed)""",
        epilog="""examples:
  lace-proxy explain node 10.96.0.10:53/UDP --manifests DIR --config proxy.yaml
  lace-proxy explain 10.251.0.11 10.96.0.40:80 --manifests DIR --hostname-override node-a
  lace-proxy explain fd00:250::2 [fd00:250::1]:30080/TCP --manifests DIR -o json
  lace-proxy explain node 10.250.0.1:30080 --manifests DIR --node-address 10.250.0.1

exit codes:
  0  the connection goes through (allowed, or not lace-proxy's to decide)
  1  it would be refused, dropped, left unanswered or not proxied
  2  bad input (SRC, DST, options, configuration)""",
    )
    explain_cmd.add_argument(
        "source",
        metavar="SRC",
        help="where the connection comes from: an IP address (a pod, a client, another node), "
        "or `node` for traffic this node originates (hostNetwork pods included), e.g. "
        "10.251.0.11 or node",
    )
    explain_cmd.add_argument(
        "destination",
        metavar="DST",
        help="IP:PORT[/PROTO], PROTO one of TCP (default), UDP, SCTP; IPv6 in brackets, e.g. "
        "10.96.0.10:53/UDP or [fd00::1]:80/UDP",
    )
    add_config_flags(explain_cmd)
    add_output_flag(
        explain_cmd,
        "text",
        "json",
        help_text="text: aligned `label  value` lines (default); json: a stable document",
    )
    explain_cmd.add_argument(
        "--node-address",
        action="append",
        metavar="IP",
        help="an address of this node, where its NodePorts answer (repeatable; default: the "
        "addresses of the Node named --hostname-override in the manifests), e.g. 10.250.0.1",
    )
    explain_cmd.add_argument(
        "--kernel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare with the kernel's nftables table (default: on when run as root and the "
        "table exists); --no-kernel skips it",
    )
    add_netns_flag(
        explain_cmd,
        "read the kernel of this named network namespace (implies --kernel), e.g. for "
        "a sandbox node",
    )
    explain_cmd.set_defaults(func=cmd_explain)


def _backend_rows(backends: Sequence[Backend]) -> str:
    """A frontend's backends on one line: address (state,where) each, or "-"."""
    if not backends:
        return "-"
    parts = []
    for b in backends:
        state = "ready" if b.ready else ("terminating" if b.terminating else "not-ready")
        where = "local" if b.local else "remote"
        host = f"[{b.ip}]" if ":" in b.ip else b.ip
        parts.append(f"{host}:{b.port} ({state},{where})")
    return " ".join(parts)


def cmd_table(args: argparse.Namespace) -> int:
    """Each frontend of this node's table with its backends, computed from --manifests."""
    cfg = config_from_args(args)
    from lace_proxy import app
    from lace_proxy.table.changeset import backend_state

    # The proxy's own change tracker computes the table (network model included); it is
    # never synced, so nothing reaches the kernel.
    proxier = app.computed_proxier(cfg, on_reject=print_rejection)
    networks = proxier.networks
    rows: list[dict[str, Any]] = []
    for plan in sorted(proxier.table.plans(), key=lambda p: p.id):
        for f in plan.frontends():
            address = f.address if f.address is not None else "*"
            if ":" in address:
                address = f"[{address}]"
            rows.append(
                {
                    "service": plan.service,
                    "port": plan.port_name,
                    "kind": f.kind,
                    "family": f"IPv{f.family}",
                    "frontend": f"{address}:{f.port}/{f.protocol}",
                    "action": f.verdict or "forward",
                    "affinity": f.affinity_timeout,
                    "masquerade": f.masquerade,
                    "network": _network_of(networks, plan.service),
                    # The source networks that may reach it (None: no network model).
                    "reachableFrom": None if plan.access is None else list(plan.access.sources),
                    "backends": [backend_state(b) for b in f.backends],
                    "_text": _backend_rows(f.backends),
                }
            )
    excluded = {
        key: [{"address": a, "reason": r} for a, r in binding.excluded]
        for key, binding in sorted(networks.bindings.items())
        if binding.excluded
    }
    if args.output == "json":
        for row in rows:
            del row["_text"]
        doc = {"node": cfg.hostname_override, "frontends": rows, "excluded": excluded}
        json.dump(doc, sys.stdout, indent=2)
        print()
        return 0
    headers: tuple[str, ...] = ("SERVICE", "PORT", "KIND", "FRONTEND", "ACTION", "BACKENDS")
    lines: list[tuple[str, ...]] = [
        (r["service"], r["port"] or "-", r["kind"], r["frontend"], r["action"], r["_text"])
        for r in rows
    ]
    if networks.enabled:
        headers = ("NETWORK", "FROM", *headers)
        lines = [
            (r["network"] or "-", ",".join(r["reachableFrom"] or ()) or "-", *line)
            for r, line in zip(rows, lines, strict=True)
        ]
    _print_columns(headers, lines)
    for key, items in excluded.items():
        for item in items:
            print(f"excluded: {key} endpoint {item['address']}: {item['reason']}")
    return 0


def _network_of(networks: NetworkView, service_key: str) -> str | None:
    """The Lace network the service is bound to (None: unbound, or no network model)."""
    binding = networks.bindings.get(service_key)
    return binding.network if binding else None


def _print_columns(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> None:
    """Aligned columns; the last one runs free (lists of backends, reasons)."""
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(headers[:-1])]
    for line in [headers, *lines]:
        print("  ".join([*(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)), line[-1]]))


class _InputError(Exception):
    """A problem with what the user asked for; the message says which."""


_INVENTORY_COLUMNS = {
    "services": ("NAMESPACE", "NAME", "TYPE", "NETWORK", "FRONTENDS", "BACKENDS"),
    "endpoints": ("NAMESPACE", "SERVICE", "PORT", "ENDPOINT", "STATE", "NODE", "USED-BY", "WHY"),
}


def _service_line(doc: dict[str, Any]) -> tuple[str, ...]:
    frontends = list(dict.fromkeys(f"{f['frontend']}({f['kind']})" for f in doc["frontends"]))
    backends: dict[str, str] = {}
    for f in doc["frontends"]:
        for b in f["backends"]:
            backends.setdefault(b["endpoint"], b["state"])
    verdicts = sorted({f["action"] for f in doc["frontends"]} - {"forward"})
    if doc["skipped"]:
        shown = f"({doc['skipped']})"
    elif not doc["frontends"]:
        shown = "(no frontends: " + ("; ".join(doc["conflicts"]) or "nothing programmed") + ")"
    else:
        shown = " ".join(f"{e}({state})" for e, state in backends.items())
        if verdicts:  # some frontends reject or drop: all, or those left without backends
            shown += (
                f" ({','.join(verdicts)} where none)" if shown else f"none ({','.join(verdicts)})"
            )
    return (
        doc["namespace"],
        doc["name"],
        doc["type"],
        doc["network"] or "-",
        ",".join(frontends) or "-",
        shown,
    )


def _endpoint_line(doc: dict[str, Any]) -> tuple[str, ...]:
    return (
        doc["namespace"],
        doc["service"],
        f"{doc['port'] or '-'}/{doc['protocol']}",
        doc["endpoint"],
        doc["state"],
        doc["node"] or "-",
        ",".join(doc["usedBy"]) or "-",
        doc["excluded"] or "-",
    )


def _computed_proxier(args: argparse.Namespace, cfg: ProxyConfig) -> Proxier:
    """A proxier fed from the manifest folder, or from one complete list of the API, with its
    table built and committed; it is never synced, so nothing reaches the kernel."""
    from lace_proxy import app

    if cfg.lace.manifests:
        return app.computed_proxier(cfg, on_reject=print_rejection)
    try:
        return app.listed_proxier(
            cfg, args.kubeconfig, args.master, args.timeout, on_reject=print_rejection
        )
    except app.SourceError as exc:
        raise _InputError(str(exc)) from exc


def cmd_inventory(args: argparse.Namespace) -> int:
    """`services` and `endpoints`: the running proxy's view, or one computed here."""
    from lace_proxy import inventory, state_socket

    what = args.command
    try:
        cfg = config_from_args(args)
        computed = bool(cfg.lace.manifests or args.kubeconfig or args.master)
        if computed:
            proxier = _computed_proxier(args, cfg)
            compute = state_socket.DOCUMENTS[what]
            doc: dict[str, Any] = {
                "node": cfg.hostname_override,
                "ready": True,
                what: compute(proxier),
            }
        else:
            if not cfg.lace.state_socket:
                raise _InputError(
                    "no state socket configured (lace.stateSocket is empty): give "
                    "--state-socket PATH, or --kubeconfig/--manifests to compute the state"
                )
            try:
                doc = state_socket.fetch(cfg.lace.state_socket, what)
            except state_socket.StateUnavailable as exc:
                raise _InputError(
                    f"{exc}; give --kubeconfig FILE (or --manifests DIR) to compute it instead"
                ) from exc
    except _InputError as exc:
        print(f"lace-proxy {what}: {exc}", file=sys.stderr)
        return 2
    name_key = "name" if what == "services" else "service"
    doc[what] = inventory.select(doc[what], args.namespace, args.names, name_key)
    if args.output == "json":
        json.dump(doc, sys.stdout, indent=2)
        print()
    elif args.output == "yaml":
        import yaml

        yaml.safe_dump(doc, sys.stdout, sort_keys=False)
    else:
        if not doc["ready"]:
            print("note: the proxy has not yet received every initial list", file=sys.stderr)
        line = _service_line if what == "services" else _endpoint_line
        _print_columns(_INVENTORY_COLUMNS[what], [line(d) for d in doc[what]])
    return 0


def _node_facts(node: Node | None, name: str, extra: Sequence[str] = ()) -> NodeFacts:
    """A node's addresses for explain: its Node object's, plus those given on the command line."""
    from lace_proxy.explain import NodeFacts

    addresses = [a for _, a in node.addresses] if node else []
    internal = [a for kind, a in node.addresses if kind == "InternalIP"] if node else []
    return NodeFacts(
        name,
        tuple(dict.fromkeys([*addresses, *extra])),
        tuple(dict.fromkeys([*internal, *extra])),
    )


def _explain_kernel(
    args: argparse.Namespace, settings: NftablesSettings, result: Explanation
) -> Explanation:
    """Ask the kernel (this one, or --netns's) whether it agrees with the table's verdict.

    On by default for root when the table exists; --kernel or --netns insist (a missing table
    is then "not programmed"), --no-kernel skips it.
    """
    from lace_proxy.dataplane.nft import Nft
    from lace_proxy.dataplane.nftables.backend import NftablesBackend
    from lace_proxy.dataplane.nftables.transaction import NftError
    from lace_proxy.explain import KernelCheck, check_kernel

    if args.kernel is False:
        return dataclasses.replace(result, kernel=KernelCheck("not checked", "--no-kernel"))
    insisted = args.kernel is True or args.netns is not None
    if not insisted and os.geteuid() != 0:
        detail = "not root (run as root, or give --kernel)"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    try:
        kernel = NftablesBackend(settings, Nft(args.netns)).read_back()
    except (NftError, OSError) as exc:
        detail = f"cannot read table inet {settings.table}: {exc}"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    if kernel is None and not insisted:
        detail = f"no table inet {settings.table} here (is lace-proxy running on this node?)"
        return dataclasses.replace(result, kernel=KernelCheck("not checked", detail))
    return check_kernel(result, kernel, settings.table)


def cmd_explain(args: argparse.Namespace) -> int:
    """What happens to one new connection: exit code 0 through, 1 not, 2 bad input."""
    from lace_proxy.dataplane.netns import netns_prefix
    from lace_proxy.explain import QueryError, State, explain, parse_query

    def bad(message: object) -> int:
        print(f"lace-proxy: explain: {message}", file=sys.stderr)
        return 2

    try:
        query = parse_query(args.source, args.destination)
        extra = [str(ipaddress.ip_address(a)) for a in args.node_address or ()]
        netns_prefix(args.netns)  # validates the name
    except QueryError as exc:
        return bad(exc)
    except ValueError as exc:  # --node-address, --netns
        return bad(exc)
    cfg = config_from_args(args)  # a ConfigError is exit code 2 (main)
    if not cfg.lace.manifests:
        return bad(
            "give --manifests DIR (a folder of Service, EndpointSlice, Node and Lace manifests)"
        )
    if not Path(cfg.lace.manifests).exists():
        return bad(f"manifests: no such file or folder: {cfg.lace.manifests}")
    if not args.verbose:  # what the proxy would log is in the answer (rejected, conditions)
        logging.getLogger("lace_proxy").setLevel(logging.ERROR)
    from lace_proxy import app
    from lace_proxy.dataplane.nftables.backend import NftablesBackend

    settings = app.nftables_settings(cfg)
    # As `table`: the proxy's own change tracker computes the state; nothing is synced.
    nodes: dict[str, Node] = {}
    rejected: list[str] = []
    proxier = app.computed_proxier(
        cfg,
        NftablesBackend(settings),
        on_reject=lambda e: rejected.append(str(e)),
        nodes=nodes,
    )
    name = cfg.hostname_override
    state = State(
        proxier,
        settings,
        _node_facts(nodes.get(name), name, extra),
        tuple(_node_facts(n, n.name) for n in nodes.values() if n.name != name),
        tuple(dict.fromkeys(rejected)),
    )
    result = _explain_kernel(args, settings, explain(state, query))
    if args.output == "json":
        json.dump(result.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(result.to_text())
    return result.exit_code
