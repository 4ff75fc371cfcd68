// The qemu test target's board support (firmware/qemu.py builds it in).
//
// - mp_hal_time_ns(): littlefs (MICROPY_VFS_LFS2) stamps files with it and the qemu
//   port does not define it; it is the host's wall clock (semihosting), so time.time()
//   and time.time_ns() (qemu_time.h) work as on a board whose RTC was set.
// - os.urandom: the firmware draws its per-boot signing nonce from it (the stm32 and
//   rp2 ports have a hardware RNG). The build sets MICROPY_PY_OS_URANDOM=1, and the
//   port's mphalport.c already has a dummy (LCG) mp_hal_get_random: NOT random, for
//   tests only; qemu_board.h declares it for extmod/modos.c.
// - qemu_board.ramdisk(): a bytearray over a static buffer OUTSIDE the MicroPython
//   heap, the backing store of the littlefs that stands in for a board's flash
//   filesystem (config, secret key), so the filesystem costs no heap, as on a board.
// - the pystack (MICROPY_ENABLE_PYSTACK, set by firmware/qemu.py as on the stm32
//   boards): a static array of QEMU_PYSTACK_WORDS words that mp_init() hands to
//   mp_pystack_init() through MICROPY_PORT_INIT_FUNC (qemu_board.h), at every soft
//   reboot as ports/stm32/main.c does, so no patch of the port's main.c is needed.
//   qemu_board.pystack_peak() is its high-water mark in bytes: the array is zero from
//   load and never cleared, and every frame ends in its nonzero size word.

#include "py/mphal.h"
#include "py/obj.h"
#include "py/runtime.h"

#include <string.h>

#ifndef QEMU_RAMDISK_BYTES
#define QEMU_RAMDISK_BYTES (16 * 1024)
#endif

static uint8_t qemu_ramdisk[QEMU_RAMDISK_BYTES] __attribute__((aligned(4)));

#if MICROPY_ENABLE_PYSTACK
static mp_obj_t qemu_pystack[QEMU_PYSTACK_WORDS];

void qemu_pystack_init(void) {
    mp_pystack_init(qemu_pystack, &qemu_pystack[QEMU_PYSTACK_WORDS]);
}

static mp_obj_t qemu_board_pystack_peak(void) {
    size_t n = QEMU_PYSTACK_WORDS;
    while (n > 0 && qemu_pystack[n - 1] == MP_OBJ_NULL) {
        --n;
    }
    return MP_OBJ_NEW_SMALL_INT(n * sizeof(mp_obj_t));
}
static MP_DEFINE_CONST_FUN_OBJ_0(qemu_board_pystack_peak_obj, qemu_board_pystack_peak);
#endif

// The host's clock through semihosting (SYS_TIME: seconds since 1970), read once and
// carried on by the port's microsecond ticks; since 2000, the port's epoch.
static uint32_t qemu_semihosting_time(void) {
    register uint32_t r0 __asm__ ("r0") = 0x11; // SYS_TIME
    register uint32_t r1 __asm__ ("r1") = 0;
    __asm__ __volatile__ ("bkpt 0xAB" : "+r" (r0) : "r" (r1) : "memory");
    return r0;
}

uint64_t mp_hal_time_ns(void) {
    static uint64_t base_ns;
    static mp_uint_t base_us;
    static bool started;
    if (!started) {
        base_ns = ((uint64_t)qemu_semihosting_time() - 946684800u) * 1000000000u;
        base_us = mp_hal_ticks_us();
        started = true;
    }
    return base_ns + (uint64_t)(uint32_t)(mp_hal_ticks_us() - base_us) * 1000u;
}

static mp_obj_t qemu_board_ramdisk(void) {
    return mp_obj_new_bytearray_by_ref(sizeof(qemu_ramdisk), qemu_ramdisk);
}
static MP_DEFINE_CONST_FUN_OBJ_0(qemu_board_ramdisk_obj, qemu_board_ramdisk);

// qemu_board.copy(dst, dst_off, src, src_off, n): memmove between two buffers,
// bounds-checked, allocating nothing (the RAM disk's reads and writes: a slice would
// leave a block of garbage per read and skew every heap figure taken with a
// filesystem).
static mp_obj_t qemu_board_copy(size_t n_args, const mp_obj_t *args) {
    mp_buffer_info_t dst, src;
    mp_get_buffer_raise(args[0], &dst, MP_BUFFER_WRITE);
    mp_get_buffer_raise(args[2], &src, MP_BUFFER_READ);
    mp_int_t d = mp_obj_get_int(args[1]);
    mp_int_t s = mp_obj_get_int(args[3]);
    mp_int_t n = mp_obj_get_int(args[4]);
    if (d < 0 || s < 0 || n < 0 || (size_t)(d + n) > dst.len || (size_t)(s + n) > src.len) {
        mp_raise_ValueError(MP_ERROR_TEXT("copy out of range"));
    }
    memmove((uint8_t *)dst.buf + d, (const uint8_t *)src.buf + s, n);
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(qemu_board_copy_obj, 5, 5, qemu_board_copy);

static const mp_rom_map_elem_t qemu_board_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR_copy), MP_ROM_PTR(&qemu_board_copy_obj) },
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_qemu_board) },
    { MP_ROM_QSTR(MP_QSTR_ramdisk), MP_ROM_PTR(&qemu_board_ramdisk_obj) },
    #if MICROPY_ENABLE_PYSTACK
    { MP_ROM_QSTR(MP_QSTR_pystack_peak), MP_ROM_PTR(&qemu_board_pystack_peak_obj) },
    #endif
};
static MP_DEFINE_CONST_DICT(qemu_board_globals, qemu_board_globals_table);

const mp_obj_module_t qemu_board_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&qemu_board_globals,
};

MP_REGISTER_MODULE(MP_QSTR_qemu_board, qemu_board_module);
