"""The nftables backend: plans in, nf_tables objects out, one atomic transaction per sync.

- `settings`: what it takes from the configuration, validated.
- `skeleton`: the table's fixed part (base chains, the maps and sets the plans fill).
- `render`: what plans and the network layout add, deterministically; the table's layout
  is described there.
- `affinity`: ids of the service ports with ClientIP affinity.
- `backend`: `NftablesBackend`, the Dataplane (base.py): apply, full sync, adoption.
- `kernel`: the table read back from the kernel.

The nft command itself runs in `lace_proxy.dataplane.nft`.
"""

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings

__all__ = ["NftablesBackend", "NftablesSettings"]
