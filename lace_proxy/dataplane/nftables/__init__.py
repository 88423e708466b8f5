"""The nftables backend: plans in, nf_tables objects out, one atomic transaction per sync.

- `settings`: what it takes from the configuration, validated.
- `skeleton`: the table's fixed part (base chains, the maps and sets the plans fill).
- `render`: what plans and the network layout add, deterministically; the table's layout
  is described there. `shared`: the shared chains and the counts they dispatch on.
- `affinity`: ids of the service ports with ClientIP affinity.
- `backend`: `NftablesBackend`, the Dataplane (base.py): apply, full sync, adoption.
- `kernel`: the table read back from the kernel.
- `codec`: set elements as nfnetlink messages and back (compiled `_ccodec`, pure `_pycodec`),
  and each map's and set's layout; `netlink`: the channel that sends and reads them.

Transactions are applied by `lace_proxy.dataplane.nft`: elements over `netlink`, the rest
by the nft command.
"""

from lace_proxy.dataplane.nftables.backend import NftablesBackend
from lace_proxy.dataplane.nftables.settings import NftablesSettings

__all__ = ["NftablesBackend", "NftablesSettings"]
