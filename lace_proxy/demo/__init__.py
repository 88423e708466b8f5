"""`lace-proxy sandbox`: a node in network namespaces, for the demo (and the traffic tests).

- `testbed`: the one-node sandbox (a node, pods with who-am-I servers, a client and a router);
  `lace-proxy sandbox` and the traffic tests use it, so what a newcomer sees is what the tests
  assert on. Needs root; creates nothing outside its own namespaces. Built from `netns`
  (namespaces with a worker inside, and the requests made from them), `forkserver` (which
  starts the servers in their namespaces) and `addresses` (the address plan every testbed
  shares); `testbed` re-exports what tests import of them.
- `servers`: the who-am-I servers, forked into the pods' namespaces.
- `sandbox`: the demo itself; `manifests/`: its example services (package data).

The two-node and egress testbeds are test support only: testkit/.
"""
