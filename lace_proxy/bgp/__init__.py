"""Announcing service addresses to the cluster host network's routers by BGP (lace.bgp).

`announce.py` decides what this node announces, from the plans (the table's, as every
dataplane gets them) and the network layout; `bird.py` has BIRD, the speaker, say it.
"""

#: A peer's session states (RFC 4271's), and "Down": the speaker does not run, or has no
#: session with that peer (yet).
PEER_STATES = ("Idle", "Connect", "Active", "OpenSent", "OpenConfirm", "Established", "Down")
