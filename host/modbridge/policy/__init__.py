"""The policy: module and GPU state in, a power-limit level out (pure)."""
