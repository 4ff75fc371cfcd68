"""Control laws: pure integer math, no I/O."""
