from typing import Any

from lace_proxy.model.endpointslice import Endpoint

IMPLEMENTATION: str

def plain_endpoint(value: Any, version: int | None) -> Endpoint | None: ...
