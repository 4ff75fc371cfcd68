"""What the bridge tells the world: Prometheus metrics and the event log."""
