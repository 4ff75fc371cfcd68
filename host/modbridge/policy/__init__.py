"""The policy: module and GPU state in, a power-limit level out (pure).

One module per concern; :mod:`modbridge.policy.engine` lists them and re-exports
the public names.
"""
