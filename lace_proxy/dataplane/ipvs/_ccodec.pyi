"""Types of the compiled IPVS codec (ext/ipvscodec.pyx): the same API as the pure twin.

Kept to the compiled module by tests/unit/test_table_stub.py (stubtest), and to the pure
twin (`_pycodec.py`) by the names and parameter names there.
"""

from collections.abc import Iterable
from typing import Final

IMPLEMENTATION: Final[str]

GENL_VERSION: Final[int]
IPVS_CMD_NEW_SERVICE: Final[int]
IPVS_CMD_SET_SERVICE: Final[int]
IPVS_CMD_DEL_SERVICE: Final[int]
IPVS_CMD_GET_SERVICE: Final[int]
IPVS_CMD_NEW_DEST: Final[int]
IPVS_CMD_SET_DEST: Final[int]
IPVS_CMD_DEL_DEST: Final[int]
IPVS_CMD_GET_DEST: Final[int]
IP_VS_SVC_F_PERSISTENT: Final[int]
IP_VS_CONN_F_MASQ: Final[int]
NLM_F_REQUEST: Final[int]
NLM_F_ACK: Final[int]
NLM_F_DUMP: Final[int]
NLMSG_ERROR: Final[int]
NLMSG_DONE: Final[int]
NLMSG_MIN_TYPE: Final[int]
AF_INET: Final[int]
AF_INET6: Final[int]

class CodecError(ValueError): ...

class Requests:
    def __init__(self, family: int, sequence: int) -> None: ...
    def service(
        self, command: int, protocol: int, address: str, port: int, scheduler: str, timeout: int
    ) -> int: ...
    def server(
        self,
        command: int,
        protocol: int,
        address: str,
        port: int,
        server: str,
        server_port: int,
        weight: int,
    ) -> int: ...
    def servers(
        self,
        command: int,
        protocol: int,
        address: str,
        port: int,
        servers: Iterable[tuple[str, int]],
        weight: int,
    ) -> tuple[int, list[tuple[str, int]]]: ...
    def __len__(self) -> int: ...
    def chunks(self, limit: int) -> list[tuple[bytes, int]]: ...

def services_request(family: int, sequence: int) -> bytes: ...
def servers_request(
    family: int, sequence: int, protocol: int, address: str, port: int
) -> bytes: ...

class ServiceDump:
    done: bool
    def feed(self, data: bytes) -> bool: ...
    def result(self) -> list[tuple[int, str, int, int, str, int, int]]: ...

class ServerDump:
    done: bool
    def __init__(self, version: int) -> None: ...
    def feed(self, data: bytes) -> bool: ...
    def result(self) -> list[tuple[str, int, int, int, int, int]]: ...
