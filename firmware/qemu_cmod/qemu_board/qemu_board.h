// Force-included into every file of the qemu test build (CFLAGS_EXTRA=-include ...):
// the declaration extmod/modos.c needs for os.urandom (MICROPY_PY_OS_URANDOM=1).
#include <stddef.h>
#include <stdint.h>
void mp_hal_get_random(size_t n, uint8_t *buf);

// The pystack (MICROPY_ENABLE_PYSTACK=1 and QEMU_PYSTACK_WORDS from firmware/qemu.py):
// mp_init() calls the port's init hook, which hands the static array to mp_pystack_init
// (qemu_board.c), before any Python code runs.
#if defined(MICROPY_ENABLE_PYSTACK) && MICROPY_ENABLE_PYSTACK
#ifndef QEMU_PYSTACK_WORDS
#error QEMU_PYSTACK_WORDS must be set with MICROPY_ENABLE_PYSTACK
#endif
void qemu_pystack_init(void);
#define MICROPY_PORT_INIT_FUNC qemu_pystack_init()
#endif
