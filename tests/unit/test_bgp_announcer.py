"""The announcer never fails a sync: a speaker that cannot run is logged and counted as a
failure (not as a restart), and every sync tries again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lace_proxy.bgp.announcer import Announcer
from lace_proxy.bgp.speaker import Speaker
from lace_proxy.config.bgp import BgpPeer, LaceBgpAnnounceConfig, LaceBgpConfig
from lace_proxy.metrics import ProxyMetrics
from lace_proxy.model import Node
from lace_proxy.networks.graph import NetworkLayout


def sample(metrics: ProxyMetrics, kind: str) -> float:
    text = metrics.exposition()[0].decode()
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(f'lace_proxy_bgp_errors_total{{kind="{kind}"}}')
    )
    return float(line.split()[-1])


def test_a_speaker_that_cannot_run_is_a_counted_failure_not_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = LaceBgpConfig(
        enabled=True, asn=65001, peers=(BgpPeer("10.0.0.1", 65000),), directory=str(tmp_path / "b")
    )
    metrics = ProxyMetrics()
    announcer = Announcer(Speaker(settings, binary=str(tmp_path / "no-bird")), metrics=metrics)
    node = Node("n1", addresses=(("InternalIP", "10.0.0.2"),))
    for attempt in (1, 2):
        announcer.sync([], NetworkLayout(), node)  # raises nothing
        assert sample(metrics, "failed") == attempt
        assert sample(metrics, "restarted") == 0
    assert "no-bird" in caplog.text
    assert 'lace_proxy_bgp_peers{state="Down"} 1.0' in metrics.exposition()[0].decode()


def test_nothing_is_announced_before_the_nodes_internal_ip(tmp_path: Path) -> None:
    settings = LaceBgpConfig(
        enabled=True, asn=65001, peers=(BgpPeer("10.0.0.1", 65000),), directory=str(tmp_path / "b")
    )
    announcer = Announcer(Speaker(settings, binary=str(tmp_path / "no-bird")))
    announcer.sync([], NetworkLayout(), None)
    announcer.sync([], NetworkLayout(), Node("n1"))
    assert not (tmp_path / "b").exists()  # nothing written, nothing started


def test_aggregates_without_a_service_cidr_are_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lace_proxy.bgp")  # whatever earlier tests set
    settings = LaceBgpConfig(
        enabled=True,
        asn=65001,
        peers=(BgpPeer("10.0.0.1", 65000),),
        announce=LaceBgpAnnounceConfig(cluster_ips="aggregate"),
        directory=str(tmp_path / "b"),
    )
    node = Node("n1", addresses=(("InternalIP", "10.0.0.2"),))
    speaker = Speaker(settings, binary=str(tmp_path / "no-bird"))
    for _ in range(3):
        Announcer(speaker, ("10.96.0.0/12",)).sync([], NetworkLayout(), node)
    assert "no service CIDR is known" not in caplog.text
    announcer = Announcer(speaker)
    for _ in range(3):
        announcer.sync([], NetworkLayout(), node)
    assert caplog.text.count("no service CIDR is known") == 1
