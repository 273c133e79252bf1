"""Reconciliation after partitions heal: vector clocks, CRDTs, anti-entropy. Pure, no IO."""
