"""The GPU side of a decision: power-limit writes, their journal, one owner per GPU."""
