"""Tools around the bridge: flashing, the MicroPython interpreter, the wire demo, the pty relay."""
