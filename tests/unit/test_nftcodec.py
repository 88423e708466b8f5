"""The nf_tables element codec's pure twin: bad element text is the codec's own error."""

from __future__ import annotations

import pytest

from lace_proxy.dataplane.nftables import _pycodec, codec

BAD = [
    ("endpoints-v4", "10.96.0.300 . tcp . 80 . 0 : 10.128.0.5 . 8080", "does not appear"),
    ("endpoints-v6", "fd00::1::2 . tcp . 80 . 0 : fd00::5 . 8080", "does not appear"),
    ("cluster-cidrs-v4", "10.0.0.0/33", "does not appear"),
    ("cluster-cidrs-v6", "fd00::/64-", "does not appear"),
    ("firewall-allow-v4", "10.0.0.1 . tcp . 80 . 10.0.0.0/40", "does not appear"),
    ("cluster-ips-v4", "", "does not appear"),
]


@pytest.mark.parametrize(("container", "element", "message"), BAD)
def test_an_unreadable_address_is_a_codec_error(container: str, element: str, message: str) -> None:
    """Not ipaddress's bare ValueError: a caller catching CodecError names the element."""
    layout = codec.layout(container)
    assert layout is not None
    batch = _pycodec.Batch("t", 1)
    with pytest.raises(_pycodec.CodecError, match=message):
        batch.elements(False, container, layout.key, layout.data, layout.interval, [element])
