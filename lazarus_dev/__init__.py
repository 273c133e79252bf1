"""Lazarus development tooling: not imported by the servers, the SDK or the client.

- ``devcluster``, ``localservers``: a local cluster of real processes (etcd,
  Redis, coordinators, node agents) for tests, demos and benchmarks;
- ``drill``, ``drill_invariants``, ``drill_remote``, ``chaos``, ``netns``:
  failure drills (kills, partitions in network namespaces, randomized faults)
  and the checks that read the tasks' own side effects;
- ``demo``, ``fleetdemo``: ``make demo`` and ``lazarus demo``;
- ``fleetsim``, ``fleetsim_sweep``: the fleet simulator (the real agent and
  coordinator cores against models of etcd, Redis, the network and clocks);
- ``protogen``: generation of the wire stubs from ``proto/``.

The product (``coordinator``, ``node_agent``, ``reconcile``, ``lazarus``) never
imports this package; ``tests/unit/test_product_imports.py`` checks it.
"""
