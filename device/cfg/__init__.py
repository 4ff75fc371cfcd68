"""device.config's parts (device/config.py: the API and what it guarantees), imported
one by one, each where a command needs it; device.app._release forgets them."""
