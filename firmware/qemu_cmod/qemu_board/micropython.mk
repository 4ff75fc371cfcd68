# A user C module for the qemu test target (firmware/qemu.py passes
# USER_C_MODULES=firmware/qemu_cmod): what the port lacks for littlefs and a RAM disk.
QEMU_BOARD_MOD_DIR := $(USERMOD_DIR)
SRC_USERMOD_C += $(QEMU_BOARD_MOD_DIR)/qemu_board.c
# time.gmtime()/localtime()/mktime() (MICROPY_PY_TIME_GMTIME_LOCALTIME_MKTIME, set by
# firmware/qemu.py as on the stm32 boards): the port does not link timeutils itself.
SRC_USERMOD_C += $(TOP)/shared/timeutils/timeutils.c
