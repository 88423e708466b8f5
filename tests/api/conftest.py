"""Fixtures for the API emulator tests: a running emulator and real `kubernetes` clients.

* ``api``: an emulator per test (bookmarks every 0.2 s), its kubeconfig in ``tmp_path``;
  parametrize it indirectly with a dict of other ``ApiServer`` options.
* ``connect``: a real ``kubernetes.client.ApiClient`` for any emulator, from its kubeconfig.
* ``kube``: such a client for ``api``.
* ``control_plane``, ``real_kube``: a real etcd + kube-apiserver per session and an admin
  client for it (testkit/controlplane/pytest_plugin.py).
* ``when_watching``: runs a callable in a thread once a client's watch is open, so a test can
  write while its own thread is blocked reading the watch stream (returns the thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from lace_proxy.sandbox.apiserver import ApiServer
from testkit.controlplane.pytest_plugin import control_plane, real_kube  # noqa: F401 (fixtures)

BOOKMARK_INTERVAL = 0.2


@pytest.fixture
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ApiServer]:
    options = {"bookmark_interval": BOOKMARK_INTERVAL, **getattr(request, "param", {})}
    with ApiServer(directory=tmp_path, **options) as server:
        yield server


@pytest.fixture
def connect() -> Iterator[Callable[[ApiServer], client.ApiClient]]:
    opened: list[client.ApiClient] = []

    def make(server: ApiServer) -> client.ApiClient:
        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(server.kubeconfig_path), client_configuration=configuration
        )
        opened.append(client.ApiClient(configuration))
        return opened[-1]

    yield make
    for api_client in opened:
        api_client.close()


@pytest.fixture
def kube(api: ApiServer, connect: Callable[[ApiServer], client.ApiClient]) -> client.ApiClient:
    return connect(api)


@pytest.fixture
def when_watching(
    api: ApiServer,
) -> Iterator[Callable[[Callable[[], object]], threading.Thread]]:
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def run(action: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                api.wait_for_watches(1)
                action()
            except BaseException as exc:  # re-raised in the test's thread at teardown
                errors.append(exc)

        threads.append(threading.Thread(target=target, daemon=True))
        threads[-1].start()
        return threads[-1]

    yield run
    for thread in threads:
        thread.join(timeout=10)
    if errors:
        raise errors[0]
