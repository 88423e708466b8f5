"""A rolling update of every endpoint of a service under load loses nothing, in both modes.

The EndpointSlice controller's sequence (tests/netns/rollout.py) replaces both endpoints of
three services (TCP web, TCP echo, UDP dns) while the client opens new TCP connections at
250 a second, sends a fresh-source-port DNS-style query every 10 ms (over ClusterIP, NodePort,
ExternalIP and LB IP in turn), holds long TCP connections to the pods being replaced, and keeps
a fixed-source-port UDP stream on each of those frontends. No new connection or query fails;
none is answered by a pod that was not a usable endpoint when it was sent (not yet ready, or
already terminating or removed); every held connection works until its pod, stopped after the
sync that removed it, closes it; each stream stays on its pod until the sync that removed it
(IPVS mode, as kube-proxy's: made it terminating) and has moved when that sync ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lace_proxy.demo.testbed import Testbed

from ..conftest import MODES
from .proxykit import Harness
from .rollout import (
    ECHO_PORT,
    TARGET,
    Load,
    Rollout,
    hold_on_each,
    judge_held,
    judge_probes,
    judge_streams,
    stream_on_each,
)

pytestmark = pytest.mark.netns


@pytest.fixture(params=MODES)
def proxy(
    request: pytest.FixtureRequest, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> Iterator[Harness]:
    """Four pods (two to replace, two replacing them), each serving TARGET and an echo port;
    nothing else listens on the node's NodePorts."""
    tb = make_testbed(pods=4, ports=(TARGET,))
    for pod in tb.pods:
        tb.serve(pod, (), echo_ports=(ECHO_PORT,))
    harness = Harness(tb, tmp_path / "manifests", mode=request.param)
    yield harness
    harness.close()


def test_rolling_update_under_load_loses_nothing(proxy: Harness) -> None:
    tb = proxy.tb
    old, new = tb.pods[:2], tb.pods[2:]
    load = Load(tb.client)
    rollout = Rollout(tb, proxy, load)
    rollout.begin(old)
    load.start()
    try:
        held = hold_on_each(load, old)
        streams = stream_on_each(load, old)
        rollout.settle(time.monotonic())
        rollout.roll(old, new)
    finally:
        load.stop()

    verdicts = judge_probes(load.probes, rollout.steps, [p.name for p in old])
    verdicts["held"] = judge_held(load.flows, rollout.stops)
    # A UDP flow leaves its pod when the pod is removed; in IPVS mode, as kube-proxy's, when
    # it stops being used (terminating): its UDP real server is deleted at once.
    leaves_at = "terminating" if mode_of(proxy) == "ipvs" else "gone"
    verdicts["stream"] = judge_streams(load.flows, rollout.steps, [p.name for p in old], leaves_at)
    report = "\n".join(v.line() for v in verdicts.values())
    report += "".join(f"\n{s}" for s in rollout.steps)
    for verdict in verdicts.values():
        assert not verdict.failed, "\n".join([report, *verdict.failed[:10]])
    # Each old pod held connections, and each was closed by its pod (judge_held).
    assert {f.first for f in held} == {p.name for p in old}, held
    assert {f.first for f in streams} == {p.name for p in old}, streams
    # Every sync was crossed by traffic: probes answered after it and before the next change.
    edges = [s.ended for s in rollout.steps] + [load.stopped]
    for step, following in zip(rollout.steps, edges[1:], strict=True):
        between = [p for p in load.probes if step.ended <= p.sent < following]
        kinds = {p.kind for p in between if p.outcome == "reply"}
        assert kinds == {"tcp", "udp"}, (step, report)
    # The rollout happened: the old pods answered before, only the new ones at the end.
    first, last = rollout.steps[0].started, rollout.steps[-1].ended
    assert {p.name for p in load.probes if p.sent < first} == {p.name for p in old}
    assert {p.name for p in load.probes if p.sent > last} == {p.name for p in new}
    seconds = load.stopped - load.started
    rates = ", ".join(f"{k} {verdicts[k].total / seconds:.0f}/s" for k in ("tcp", "udp"))
    # Probes judged on an interval a sync started in (rollout.Probe: either side is right).
    across = sum(any(p.sent < s.started < p.done for s in rollout.steps) for p in load.probes)
    lines = "; ".join(v.line() for v in verdicts.values())
    print(f"{mode_of(proxy)}: {lines}; {rates}; {across} probes across a sync's start")


def mode_of(proxy: Harness) -> str:
    return "nftables" if proxy.backend is proxy.nft else "ipvs"
