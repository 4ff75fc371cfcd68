# A user C module for the qemu test target (firmware/qemu.py passes
# USER_C_MODULES=firmware/qemu_cmod): what the port lacks for littlefs and a RAM disk.
QEMU_BOARD_MOD_DIR := $(USERMOD_DIR)
SRC_USERMOD_C += $(QEMU_BOARD_MOD_DIR)/qemu_board.c
