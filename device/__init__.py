"""Module firmware, board-independent. See device/README.md."""

FW_VERSION = "0.1.0"
