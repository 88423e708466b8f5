"""The nftables backend: plans in, nf_tables objects out, one atomic transaction per sync.

- `settings`: what it takes from the configuration, validated.
- `transaction`: what is sent to nf_tables (`Transaction`, its `Elements`) and its refusal
  (`NftError`).
- `skeleton`: the table's fixed part (base chains, the maps and sets the plans fill).
- `render`: what plans and the network layout add, deterministically; the table's layout
  is described there. `shared`: the shared chains and the counts they dispatch on.
- `affinity`: ids of the service ports with ClientIP affinity.
- `backend`: `NftablesBackend`, the Dataplane (base.py): apply, full sync, adoption.
- `kernel`: the table read back from the kernel.
- `codec`: set elements as nfnetlink messages and back (compiled `_ccodec`, pure `_pycodec`),
  and each map's and set's layout; `netlink`: the channel that sends and reads them.

Transactions are applied by `lace_proxy.dataplane.nft`: elements over `netlink`, the rest
by the nft command. This module imports none of them: what a module below the backend
imports from the package (the runner, the UDP rescue: `transaction`, `netlink`) does not
bring the backend, which is built on them, nor does a command that only names an
`NftError` (the CLI's `main`).
"""
