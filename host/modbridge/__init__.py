"""modbridge: host bridge between GPU servers and their cooling modules.

The firmware's packages (``device``, ``boards``, ``protocol``) keep their own
top-level names, which the MCU needs and the host imports (``from protocol import
catalog``); with the image build tooling (``firmware``) and ``examples`` they are
not installed as top-level names. Importing modbridge puts the directory that holds
them first on ``sys.path``: :data:`FIRMWARE_ROOT`, ``modbridge/_fw/`` in an installed
wheel (setup.py copies the trees there) and the repository root in a checkout (an
editable install, the tests).
"""

import sys

__version__ = "0.1.0"

if sys.implementation.name != "micropython":  # the DUAL tests import modbridge there
    import os as _os

    _here = _os.path.dirname(_os.path.abspath(__file__))
    #: Where device/, boards/, protocol/, firmware/ and examples/ are.
    FIRMWARE_ROOT = _os.path.join(_here, "_fw")
    #: True in an installed wheel, False in a checkout.
    INSTALLED = _os.path.isdir(FIRMWARE_ROOT)
    if not INSTALLED:
        FIRMWARE_ROOT = _os.path.dirname(_os.path.dirname(_here))  # host/modbridge/ -> root
    if FIRMWARE_ROOT not in sys.path:
        sys.path.insert(0, FIRMWARE_ROOT)
