"""Types of the compiled nf_tables codec (ext/nftcodec.pyx): the same API as the pure twin.

Kept to the compiled module by tests/unit/test_table_stub.py (stubtest), and to the pure
twin (`_pycodec.py`) by the names and parameter names there.
"""

from collections.abc import Sequence
from typing import Final

ADDR4: Final[int]
ADDR6: Final[int]
PROTO: Final[int]
PORT: Final[int]
MARK: Final[int]
VERDICT: Final[int]
IMPLEMENTATION: Final[str]

NFNL_SUBSYS_NFTABLES: Final[int]
NFNL_MSG_BATCH_BEGIN: Final[int]
NFNL_MSG_BATCH_END: Final[int]
NFT_MSG_NEWSETELEM: Final[int]
NFT_MSG_GETSETELEM: Final[int]
NFT_MSG_DELSETELEM: Final[int]
NFPROTO_INET: Final[int]
NLM_F_REQUEST: Final[int]
NLM_F_ACK: Final[int]
NLM_F_DUMP: Final[int]
NLM_F_CREATE: Final[int]
NLMSG_ERROR: Final[int]
NLMSG_DONE: Final[int]
NLA_F_NESTED: Final[int]
NLA_TYPE_MASK: Final[int]
NFT_SET_ELEM_INTERVAL_END: Final[int]
NFTA_SET_ELEM_KEY_END: Final[int]
ELEMENTS_LIMIT: Final[int]

class CodecError(ValueError): ...

class Batch:
    last_request: int
    def __init__(self, table: str, sequence: int) -> None: ...
    def elements(
        self,
        delete: bool,
        container: str,
        key: Sequence[int],
        data: Sequence[int],
        interval: bool,
        elements: Sequence[str],
    ) -> None: ...
    def __len__(self) -> int: ...
    def finish(self) -> bytearray: ...
    def element_at(self, sequence: int, offset: int) -> str | None: ...
    def elements_of(self, sequence: int) -> list[str]: ...

def dump_request(table: str, container: str, sequence: int) -> bytes: ...

class DumpParser:
    done: bool
    def __init__(self, key: Sequence[int], data: Sequence[int], interval: bool) -> None: ...
    def feed(self, data: bytes) -> bool: ...
    def result(self) -> list[str]: ...
