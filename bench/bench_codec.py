"""The nf_tables element codec: encode and parse rates of both twins.

    python bench/bench_codec.py [--elements 1000000] [--repeat 3] [--layouts endpoints-0-v4,...]

For each layout, N synthetic elements in the renderer's text (a cold start's worth: 30k
services with 10 endpoints each is about a million endpoint elements) are encoded into one
batch (`Batch.elements` + `finish`), and a dump of the same elements (the batch's messages
as GETSETELEM answers, 32 KiB a `recv`) is parsed back (`DumpParser.feed` + `result`).
Prints elements/s for the pure and the compiled twin and their ratio, the best of
`--repeat` runs (the pure twin runs once: it is the slow one). No kernel is needed.
Benchmarks are not tests: nothing here asserts.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lace_proxy.dataplane.nftables import _pycodec, codec
from testkit.nftdump import dump_answers


def _ip4(base: int, n: int) -> str:
    value = (base << 24) + n
    return f"{value >> 24 & 255}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"


def _ip6(prefix: str, n: int) -> str:
    return f"{prefix}{n >> 16 & 0xFFFF:x}:{n & 0xFFFF:x}"


def elements(container: str, count: int) -> list[str]:
    """`count` elements of a container, as the renderer writes them."""
    out = []
    for n in range(count):
        service, endpoint = divmod(n, 10)
        proto = ("tcp", "udp", "tcp", "sctp")[service % 4]
        port = 1 + service % 65000
        if container == "endpoints-0-v4":
            out.append(f"{_ip4(10, n)} . {proto} . {port} : {_ip4(100, n)} . {8000 + endpoint}")
        elif container == "endpoints-0-v6":
            out.append(
                f"{_ip6('fd00:10::', n)} . {proto} . {port}"
                f" : {_ip6('fd00:100::', n)} . {8000 + endpoint}"
            )
        elif container == "service-ips-v4":
            out.append(f"{_ip4(10, n)} . {proto} . {port} : goto svc-v4-{n:x}")
        elif container == "affinity-ids-v4":
            out.append(f"{_ip4(10, n)} . {proto} . {port} : {n:#010x}")
        elif container == "service-ports-v4":
            out.append(f"{_ip4(10, n)} . {proto} . {port}")
        elif container == "cluster-ips-v4":
            out.append(_ip4(10, n))
        elif container == "cluster-ips-v6":
            out.append(_ip6("fd00:10::", n))
        else:
            raise SystemExit(f"no synthetic elements for {container}")
    return out


LAYOUTS = (
    "endpoints-0-v4",
    "endpoints-0-v6",
    "service-ips-v4",
    "affinity-ids-v4",
    "service-ports-v4",
    "cluster-ips-v4",
    "cluster-ips-v6",
)


def _best(run: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure(
    module: ModuleType, container: str, items: list[str], repeat: int
) -> tuple[float, float]:
    """(encode, parse) in elements a second."""
    layout = codec.layout(container)
    assert layout is not None

    def encode() -> bytes:
        batch = module.Batch("lace-proxy", 1)
        batch.elements(False, container, layout.key, layout.data, layout.interval, items)
        return bytes(batch.finish())

    answers = dump_answers(encode())

    def parse() -> list[str]:
        parser = module.DumpParser(layout.key, layout.data, layout.interval)
        for answer in answers:
            parser.feed(answer)
        return list(parser.result())

    return len(items) / _best(encode, repeat), len(items) / _best(parse, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parser.parse_args()
    try:
        compiled: ModuleType | None = importlib.import_module(
            "lace_proxy.dataplane.nftables._ccodec"
        )
    except ImportError:
        compiled = None
        print("compiled codec not built: `python setup.py build_ext --inplace`")
    print(f"{args.elements:,} elements a layout; elements/s (best of {args.repeat} compiled)")
    header = f"{'layout':<18} {'encode pure':>12} {'compiled':>12} {'ratio':>7}"
    print(f"{header} {'parse pure':>12} {'compiled':>12} {'ratio':>7}")
    for container in args.layouts.split(","):
        items = elements(container, args.elements)
        pure = measure(_pycodec, container, items, 1)
        fast = measure(compiled, container, items, args.repeat) if compiled else (0.0, 0.0)
        cells = [container.ljust(18)]
        for p, c in zip(pure, fast, strict=True):
            ratio = f"{c / p:6.1f}x" if c else "     -"
            cells.append(f"{p:12,.0f} {c:12,.0f} {ratio:>7}")
        print(" ".join(cells))


if __name__ == "__main__":
    main()
