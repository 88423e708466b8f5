"""Pausing the cyclic collector (lace_proxy.gcpause) from tasks and threads that overlap."""

from __future__ import annotations

import gc
import threading

import pytest

from lace_proxy.gcpause import collection_paused


def test_overlapping_pauses_resume_when_the_last_ends_in_any_order() -> None:
    """Two reflectors' lists interleave on the event loop: the first may end first."""
    assert gc.isenabled()
    first, second = collection_paused(), collection_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_ends_with_an_error_too() -> None:
    with pytest.raises(RuntimeError), collection_paused():
        raise RuntimeError("the API went away mid-list")
    assert gc.isenabled()


def test_a_pause_in_another_thread_holds_until_it_ends() -> None:
    entered, release = threading.Event(), threading.Event()

    def sync() -> None:
        with collection_paused():
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=sync)
    worker.start()
    entered.wait(10)
    with collection_paused():
        pass
    assert not gc.isenabled()  # the worker's full sync is still under way
    release.set()
    worker.join(10)
    assert gc.isenabled()


def test_a_collector_its_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
