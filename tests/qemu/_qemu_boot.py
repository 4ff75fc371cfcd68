"""Runs first on the qemu test target (firmware/qemu.py sends ``import _qemu_boot``).

Makes the target look like a board with a filesystem: a littlefs on a RAM disk
outside the MicroPython heap (``qemu_board.ramdisk()``, firmware/qemu_cmod) mounted
at ``/``, with ``/tmp`` for tests/mpcompat.py's ``tmpdir()``. Vector files the DUAL
tests read come frozen in ``_repo_files`` (mpcompat.read_repo_file looks there).
"""

import os

import qemu_board
import vfs


class RAMBlockDev:
    """The extended block protocol littlefs uses (offset reads and writes), allocating
    nothing: a board's flash block device reads into the caller's buffer."""

    def __init__(self, buf):
        self.buf = buf
        self.block = 512 if len(buf) >= 256 * 1024 else 256
        self.blocks = len(buf) // self.block

    def readblocks(self, n, out, off=0):
        # copied in C: a slice would leave len(out) bytes of garbage per read
        qemu_board.copy(out, 0, self.buf, n * self.block + off, len(out))

    def writeblocks(self, n, data, off=None):
        qemu_board.copy(self.buf, n * self.block + (off or 0), data, 0, len(data))

    def ioctl(self, op, arg):
        if op == 4:  # block count
            return self.blocks
        if op == 5:  # block size
            return self.block
        if op == 6:  # erase
            return 0
        return None


def mount():
    bdev = RAMBlockDev(qemu_board.ramdisk())
    vfs.VfsLfs2.mkfs(bdev)
    vfs.mount(vfs.VfsLfs2(bdev), "/")
    os.chdir("/")
    os.mkdir("/tmp")


mount()
