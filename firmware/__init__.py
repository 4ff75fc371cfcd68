"""Host-side firmware builds: the MicroPython source (``mpsource``), the qemu test
target (``qemu``) and the stm32 images. Runs under CPython only; nothing here is
deployed to a board."""
