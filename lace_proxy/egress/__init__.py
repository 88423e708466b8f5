"""Pod egress by the node's routes (DESIGN.md §4).

Pod traffic leaving the cluster is source-NATed to the preferred source address of the route
the node selects for its destination. `routing` reads the node's routing table and works out,
per destination range, that address; `controller` follows the table's changes and hands the
ranges to the nftables side (`lace_proxy.dataplane.egress_snat`); `lace-proxy doctor egress`
explains one pod's path with the same reading.
"""
