"""Stand-ins for the world around a node, shared by the demo and the tests.

- `testbed`: a network-namespace sandbox (a node, pods with who-am-I servers, a client and a
  router); `lace-proxy sandbox` and the traffic tests use it, so what a newcomer sees is
  what the tests assert on. Needs root; creates nothing outside its own namespaces.
"""
