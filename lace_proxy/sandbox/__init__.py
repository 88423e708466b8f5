"""A network-namespace sandbox: a node, pods with who-am-I servers, a client and a router.

The demo (`lace-proxy sandbox`) and the traffic tests share it, so what a newcomer sees is
what the tests assert on. Needs root; creates nothing outside its own namespaces.
"""
