"""The coordinator: pure decision logic in ``coordinator.core`` plus thin adapters."""
