"""threeproxy's benchmark harness (see bench/README.md)."""
