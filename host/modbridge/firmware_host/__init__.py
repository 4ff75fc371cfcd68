"""The host-side halves of the firmware's packages: pure Python that imports
``protocol`` and ``device`` but never runs on a board (so nothing here is frozen or
deployed: the firmware is what firmware/allowlist.py names).

- :mod:`.sign_host`: signing, keys, timestamps (the module only verifies);
- :mod:`.calib_fit`: fitting NTC calibrations from reference points;
- :mod:`.catalog_doc`: what each message and field means (SPEC.md, the console);
- :mod:`.specgen`: writes SPEC.md's generated regions
  (``python -m modbridge.firmware_host.specgen [--check]``);
- :mod:`.fuzz`: the protocol decoders' fuzzing harness.

They run under MicroPython too (the DUAL tests, the firmware benchmark), so this
package imports nothing.
"""
