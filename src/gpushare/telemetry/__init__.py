"""What the components' Prometheus metrics share."""
