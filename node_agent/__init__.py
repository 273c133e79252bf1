"""The node agent: durable checkpoint store, task runtime, session, replication."""
