"""Sensor and actuator drivers, one chip per file."""
