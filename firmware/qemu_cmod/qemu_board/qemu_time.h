// time.time() and time.localtime() for the qemu test target (MICROPY_PY_TIME_INCLUDEFILE,
// included by extmod/modtime.c): the port's epoch (2000) from mp_hal_time_ns(), the
// host's wall clock (qemu_board.c).
#include "py/obj.h"
#include "py/mphal.h"
#include "shared/timeutils/timeutils.h"

static mp_obj_t mp_time_time_get(void) {
    return mp_obj_new_int_from_ull(mp_hal_time_ns() / 1000000000u);
}

static void mp_time_localtime_get(timeutils_struct_time_t *tm) {
    timeutils_seconds_since_epoch_to_struct_time(mp_hal_time_ns() / 1000000000u, tm);
}
