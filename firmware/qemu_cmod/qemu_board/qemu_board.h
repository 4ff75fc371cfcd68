// Force-included into every file of the qemu test build (CFLAGS_EXTRA=-include ...):
// the declaration extmod/modos.c needs for os.urandom (MICROPY_PY_OS_URANDOM=1).
#include <stddef.h>
#include <stdint.h>
void mp_hal_get_random(size_t n, uint8_t *buf);
