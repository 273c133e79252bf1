"""Storage layout: every Redis key, Lua script, record error and wire codec in one place.

- :mod:`lazarus.storage.keys`: the builder of every Redis key Lazarus uses.
- :mod:`lazarus.storage.replica`: the replicated task layout, its fenced Lua
  script and the client (:class:`~lazarus.storage.replica.RedisCheckpointReplica`).
- :mod:`lazarus.storage.errors`: typed record errors, each with its gRPC status.
- :mod:`lazarus.storage.codecs`: the shared-document wire codecs (protobuf <-> CRDT deltas).

Both the node agent and the coordinator import from here; neither imports the
other (a unit test checks it).
"""
