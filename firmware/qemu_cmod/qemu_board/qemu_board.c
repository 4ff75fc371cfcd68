// The qemu test target's board support (firmware/qemu.py builds it in).
//
// - mp_hal_time_ns(): littlefs (MICROPY_VFS_LFS2) stamps files with it and the qemu
//   port does not define it; the port's microsecond ticks are enough for that.
// - os.urandom: the firmware draws its per-boot signing nonce from it (the stm32 and
//   rp2 ports have a hardware RNG). The build sets MICROPY_PY_OS_URANDOM=1, and the
//   port's mphalport.c already has a dummy (LCG) mp_hal_get_random: NOT random, for
//   tests only; qemu_board.h declares it for extmod/modos.c.
// - qemu_board.ramdisk(): a bytearray over a static buffer OUTSIDE the MicroPython
//   heap, the backing store of the littlefs that stands in for a board's flash
//   filesystem (config, secret key), so the filesystem costs no heap, as on a board.

#include "py/mphal.h"
#include "py/obj.h"
#include "py/runtime.h"

#ifndef QEMU_RAMDISK_BYTES
#define QEMU_RAMDISK_BYTES (16 * 1024)
#endif

static uint8_t qemu_ramdisk[QEMU_RAMDISK_BYTES] __attribute__((aligned(4)));

uint64_t mp_hal_time_ns(void) {
    return (uint64_t)mp_hal_ticks_us() * 1000;
}

static mp_obj_t qemu_board_ramdisk(void) {
    return mp_obj_new_bytearray_by_ref(sizeof(qemu_ramdisk), qemu_ramdisk);
}
static MP_DEFINE_CONST_FUN_OBJ_0(qemu_board_ramdisk_obj, qemu_board_ramdisk);

static const mp_rom_map_elem_t qemu_board_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_qemu_board) },
    { MP_ROM_QSTR(MP_QSTR_ramdisk), MP_ROM_PTR(&qemu_board_ramdisk_obj) },
};
static MP_DEFINE_CONST_DICT(qemu_board_globals, qemu_board_globals_table);

const mp_obj_module_t qemu_board_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&qemu_board_globals,
};

MP_REGISTER_MODULE(MP_QSTR_qemu_board, qemu_board_module);
