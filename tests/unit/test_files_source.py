"""The `files` source: what it delivers as a manifest folder changes, bad input included."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from lace_proxy.model import Rejections
from lace_proxy.sources.files import SOURCE_NAME, ManifestSource

from ..helpers import Recorder, api_service, api_service_cidr, api_slice


def put(folder: Path, name: str, *docs: dict[str, Any]) -> None:
    path = folder / name
    path.write_text(yaml.safe_dump_all(docs))
    # Edits within one mtime tick must still be seen: bump the mtime explicitly.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def test_delivers_the_folder_then_only_changes(folder: Path) -> None:
    put(folder, "a.yaml", api_service("a"), api_slice("a-1", "a"))
    put(folder, "b.yml", api_service("b"))
    (folder / "notes.txt").write_text("not a manifest")
    rec = Recorder()
    source = ManifestSource(folder, rec)
    assert source.poll()
    assert sorted(rec.take()) == [
        ("service+", "default/a"),
        ("service+", "default/b"),
        ("slice+", "default/a-1"),
    ]
    assert not source.poll()  # unchanged folder: nothing
    put(folder, "a.yaml", api_service("a"), api_slice("a-1", "a", ip="10.0.0.2"))
    assert source.poll()
    assert rec.take() == [("slice+", "default/a-1")]  # the service is unchanged
    (folder / "b.yml").unlink()
    assert source.poll()
    assert rec.take() == [("service-", "default/b")]


def test_an_invalid_object_keeps_its_last_good_version(folder: Path) -> None:
    put(folder, "a.yaml", api_service("a"))
    rec = Recorder()
    source = ManifestSource(folder, rec)
    source.poll()
    rec.take()
    put(folder, "a.yaml", api_service("a", port=70000), api_service("c"))
    source.poll()
    assert rec.take() == [("service+", "default/c")]  # no delete of a
    assert source.rejections.counts == {"invalid_port": 1}
    put(folder, "a.yaml", api_service("a", port=81), api_service("c"))
    source.poll()
    assert rec.take() == [("service+", "default/a")]
    assert rec.objects["default/a"].ports[0].port == 81


def test_an_unparsable_file_keeps_all_its_objects(folder: Path) -> None:
    put(folder, "a.yaml", api_service("a"), api_slice("a-1", "a"))
    rec = Recorder()
    source = ManifestSource(folder, rec)
    source.poll()
    rec.take()
    (folder / "a.yaml").write_text("kind: [unclosed\n")
    source.poll()
    assert rec.take() == []
    assert source.rejections.counts == {"syntax_error": 1}
    (folder / "a.yaml").unlink()  # deleting the file does delete its objects
    source.poll()
    assert sorted(rec.take()) == [("service-", "default/a"), ("slice-", "default/a-1")]


def test_a_missing_folder_is_not_synced_until_it_appears(folder: Path) -> None:
    rec = Recorder()
    path = folder / "later"
    source = ManifestSource(path, rec, interval=0.05)

    async def scenario() -> list[tuple[str, str]]:
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(stop))
        await asyncio.sleep(0.2)
        before = rec.take()
        path.mkdir()
        put(path, "a.yaml", api_service("a"))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        assert before == []
        return rec.take()

    assert asyncio.run(scenario()) == [("service+", "default/a"), ("synced", SOURCE_NAME)]


def test_lace_resources_are_delivered_too(folder: Path) -> None:
    internet = {
        "apiVersion": "lace-cni.io/v1alpha1",
        "kind": "Network",
        "metadata": {"name": "internet"},
        "spec": {"type": "external", "externalPrefixes": ["0.0.0.0/0", "::/0"]},
    }
    put(folder, "networks.yaml", internet, api_service("a"))
    rec = Recorder()
    source = ManifestSource(folder, rec)
    source.poll()
    assert rec.take() == [("Network+", "internet"), ("service+", "default/a")]
    assert rec.objects["Network/internet"].external_prefixes == ("0.0.0.0/0", "::/0")
    put(folder, "networks.yaml", api_service("a"))
    source.poll()
    assert rec.take() == [("Network-", "internet")]


def test_service_cidrs_are_delivered_and_a_bad_one_keeps_the_last_good_version(
    folder: Path,
) -> None:

    put(folder, "cidrs.yaml", api_service_cidr("10.96.0.0/16", "fd00:96::/112"))
    rec = Recorder()
    refused: list[tuple[str, str]] = []
    rejections = Rejections(on_reject=lambda e: refused.append((e.kind, e.code)))
    source = ManifestSource(folder, rec, rejections)
    source.poll()
    assert rec.take() == [("servicecidr+", "kubernetes")]
    assert rec.objects["ServiceCIDR/kubernetes"].cidrs == ("10.96.0.0/16", "fd00:96::/112")
    put(folder, "cidrs.yaml", api_service_cidr("10.96.0.1/16"))  # host bits: the API refuses it too
    source.poll()
    assert rec.take() == []
    assert refused == [("ServiceCIDR", "invalid_cidr")]
    assert rejections.counts == {"invalid_cidr": 1}
    put(folder, "cidrs.yaml")
    source.poll()
    assert rec.take() == [("servicecidr-", "kubernetes")]
