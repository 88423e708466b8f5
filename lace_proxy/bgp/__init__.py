"""Announcing service addresses to the cluster host network's routers by BGP (lace.bgp).

`announce.py` decides what this node announces, from the plans (the table's, as every
dataplane gets them) and the network layout; `bird.py` has BIRD, the speaker, say it.
"""
