"""SHA-256 (FIPS 180-4) in pure Python that allocates nothing on MicroPython.

Written for the module's signature check (:mod:`protocol.sign`), which runs inside the
receive path of the control loop. The same file runs unchanged on CPython (where the
host uses it in tests; ``hashlib`` is faster there) and on MicroPython.

Why it looks the way it does: on a 32-bit MCU a MicroPython small int holds 31 bits
(+-2**30); a 32-bit word would silently become a heap-allocated big int. So every
32-bit word is kept as two 16-bit halves (``hi``, ``lo``) and every intermediate stays
below 2**20:

- the state (8 words) lives in an ``array('H')`` allocated once in ``__init__``, the
  message schedule's window (16 words) in two shared module-level ones; the round
  constants are bytes in flash;
- a right rotation by ``n`` of ``(hi, lo)`` is ``lo' = (lo >> n) | ((hi & (2**n-1))
  << (16-n))`` (and the same with hi/lo swapped): the mask comes BEFORE the left
  shift, so nothing grows past 16 bits; a rotation by 16 + n swaps the halves;
- additions are done on the halves, the low sum's carry added to the high sum, then
  both masked to 16 bits;
- no slicing, no ``bytes()``, no tuples, no floats, no generators on the hot path:
  ``update_from`` reads whole 64-byte blocks straight from the caller's buffer and
  copies only a partial block into a preallocated 64-byte buffer.

>>> h = Sha256()
>>> h.update_from(b"abc", 0, 3)
>>> out = bytearray(32)
>>> h.digest_into(out, 0)
>>> bytes(out).hex()[:16]
'ba7816bf8f01cfea'
"""

if __import__("sys").implementation.name != "micropython":
    # CPython's stand-in; MicroPython's compiler folds ``NAME = const(value)`` itself
    # (neither ``const`` nor ``array`` is imported at module level: no slots in this
    # module's dict on the MCU).

    def const(x):
        return x


DIGEST_LEN = 32
BLOCK_LEN = 64

# Round constants K[0..63] as big-endian (hi, lo) 16-bit halves, 4 bytes a round:
# K[t] = bytes 4t..4t+3. Constant bytes stay in flash when frozen (an array: 272
# bytes of RAM); const(): not a slot in the module's dict either.
_K = const(
    b"\x42\x8a\x2f\x98\x71\x37\x44\x91\xb5\xc0\xfb\xcf\xe9\xb5\xdb\xa5"
    b"\x39\x56\xc2\x5b\x59\xf1\x11\xf1\x92\x3f\x82\xa4\xab\x1c\x5e\xd5"
    b"\xd8\x07\xaa\x98\x12\x83\x5b\x01\x24\x31\x85\xbe\x55\x0c\x7d\xc3"
    b"\x72\xbe\x5d\x74\x80\xde\xb1\xfe\x9b\xdc\x06\xa7\xc1\x9b\xf1\x74"
    b"\xe4\x9b\x69\xc1\xef\xbe\x47\x86\x0f\xc1\x9d\xc6\x24\x0c\xa1\xcc"
    b"\x2d\xe9\x2c\x6f\x4a\x74\x84\xaa\x5c\xb0\xa9\xdc\x76\xf9\x88\xda"
    b"\x98\x3e\x51\x52\xa8\x31\xc6\x6d\xb0\x03\x27\xc8\xbf\x59\x7f\xc7"
    b"\xc6\xe0\x0b\xf3\xd5\xa7\x91\x47\x06\xca\x63\x51\x14\x29\x29\x67"
    b"\x27\xb7\x0a\x85\x2e\x1b\x21\x38\x4d\x2c\x6d\xfc\x53\x38\x0d\x13"
    b"\x65\x0a\x73\x54\x76\x6a\x0a\xbb\x81\xc2\xc9\x2e\x92\x72\x2c\x85"
    b"\xa2\xbf\xe8\xa1\xa8\x1a\x66\x4b\xc2\x4b\x8b\x70\xc7\x6c\x51\xa3"
    b"\xd1\x92\xe8\x19\xd6\x99\x06\x24\xf4\x0e\x35\x85\x10\x6a\xa0\x70"
    b"\x19\xa4\xc1\x16\x1e\x37\x6c\x08\x27\x48\x77\x4c\x34\xb0\xbc\xb5"
    b"\x39\x1c\x0c\xb3\x4e\xd8\xaa\x4a\x5b\x9c\xca\x4f\x68\x2e\x6f\xf3"
    b"\x74\x8f\x82\xee\x78\xa5\x63\x6f\x84\xc8\x78\x14\x8c\xc7\x02\x08"
    b"\x90\xbe\xff\xfa\xa4\x50\x6c\xeb\xbe\xf9\xa3\xf7\xc6\x71\x78\xf2"
)

# Initial hash value H(0), as big-endian (hi, lo) 16-bit halves (in flash too).
_H0 = const(
    b"\x6a\x09\xe6\x67\xbb\x67\xae\x85\x3c\x6e\xf3\x72\xa5\x4f\xf5\x3a"
    b"\x51\x0e\x52\x7f\x9b\x05\x68\x8c\x1f\x83\xd9\xab\x5b\xe0\xcd\x19"
)


# The message schedule, a window of 16 words (high and low halves): scratch of one
# compression, shared by every Sha256, instead of all 64 words (64 B of RAM, not 256).
# Rounds 16t..16t+15 read W[16t..16t+15] at indexes 0..15; before them the next 16
# words are made in place, each W[i] over W[i-16] (the window holds W[i-16..i-1],
# all a word is made of). Not for hashes running in several threads at once (the
# firmware has one; the host hashes with hashlib).
_WH = __import__("array").array("H", bytes(32))
_WL = __import__("array").array("H", bytes(32))


class Sha256:
    """Incremental SHA-256 over caller-owned buffers; no allocation after ``__init__``.

    ``update_from(buf, start, end)`` hashes ``buf[start:end]`` (bytes, bytearray or
    memoryview, any length); ``digest_into(out, off)`` writes the 32-byte digest into
    ``out[off:off+32]`` and finalises the object (``reset()`` or ``copy_from()``
    before the next message). ``copy_from(other)`` copies another hash's state, e.g.
    an HMAC key's precomputed inner and outer states. The total message length is
    limited to 2**26 bytes (its bit count must stay a small int on the MCU).
    """

    def __init__(self):
        from array import array

        self._h = array("H", bytes(32))  # state: 8 words as hi, lo halves (H0: reset)
        self._block = bytearray(BLOCK_LEN)  # a partial block waiting for more bytes
        self._n = 0  # bytes in _block
        self._count = 0  # message bytes hashed so far
        self._done = False
        self.reset()

    def reset(self):
        """Start a new message."""
        h = self._h
        h0 = _H0
        i = 0
        while i < 16:
            h[i] = (h0[2 * i] << 8) | h0[2 * i + 1]
            i += 1
        self._n = 0
        self._count = 0
        self._done = False

    def load_state(self, src, off, count):
        """Start from a saved state: the 8 words (16 halves) at ``src[off:off+16]`` (an
        ``array('H')``, e.g. a copy of another hash's ``_h`` taken at a block boundary)
        after ``count`` bytes (a multiple of 64) were hashed. No allocation. HMAC keeps
        its key's inner and outer states this way instead of two whole hashes."""
        h = self._h
        i = 0
        while i < 16:
            h[i] = src[off + i]
            i += 1
        self._n = 0
        self._count = count
        self._done = False

    def copy_from(self, other):
        """Make this hash a copy of ``other``'s state (no allocation)."""
        h = self._h
        oh = other._h
        i = 0
        while i < 16:
            h[i] = oh[i]
            i += 1
        n = other._n
        blk = self._block
        ob = other._block
        i = 0
        while i < n:
            blk[i] = ob[i]
            i += 1
        self._n = n
        self._count = other._count
        self._done = other._done

    def update_from(self, buf, start, end):
        """Hash ``buf[start:end]``; whole blocks are read in place, never copied."""
        if self._done:
            raise ValueError("digest_into() finalised this hash: reset() it first")
        if end <= start:
            return
        self._count += end - start
        if self._count > 0x3FFFFFF:
            raise ValueError("message longer than 2**26 bytes")
        i = start
        n = self._n
        blk = self._block
        if n:
            while n < BLOCK_LEN and i < end:
                blk[n] = buf[i]
                n += 1
                i += 1
            if n < BLOCK_LEN:
                self._n = n
                return
            self._compress(blk, 0)
            n = 0
        while end - i >= BLOCK_LEN:
            self._compress(buf, i)
            i += BLOCK_LEN
        while i < end:
            blk[n] = buf[i]
            n += 1
            i += 1
        self._n = n

    def digest_into(self, out, off):
        """Pad, finish, and write the 32-byte digest at ``out[off]``; finalises."""
        if self._done:
            raise ValueError("digest_into() finalised this hash: reset() it first")
        blk = self._block
        n = self._n
        blk[n] = 0x80
        n += 1
        if n > 56:
            while n < BLOCK_LEN:
                blk[n] = 0
                n += 1
            self._compress(blk, 0)
            n = 0
        while n < 56:
            blk[n] = 0
            n += 1
        # the message length in bits, u64 big-endian; count < 2**26 so bits < 2**29
        c = self._count
        blk[56] = 0
        blk[57] = 0
        blk[58] = 0
        blk[59] = 0
        blk[60] = (c >> 21) & 0xFF
        blk[61] = (c >> 13) & 0xFF
        blk[62] = (c >> 5) & 0xFF
        blk[63] = (c << 3) & 0xFF
        self._compress(blk, 0)
        h = self._h
        i = 0
        while i < 16:
            v = h[i]
            out[off] = v >> 8
            out[off + 1] = v & 0xFF
            off += 2
            i += 1
        self._n = 0
        self._done = True

    def _compress(self, buf, off):
        """One 64-byte block ``buf[off:off+64]`` into the state."""
        wh = _WH
        wl = _WL
        j = 0
        while j < 16:
            wh[j] = (buf[off] << 8) | buf[off + 1]
            wl[j] = (buf[off + 2] << 8) | buf[off + 3]
            off += 4
            j += 1

        hs = self._h
        ah = hs[0]
        al = hs[1]
        bh = hs[2]
        bl = hs[3]
        ch = hs[4]
        cl = hs[5]
        dh = hs[6]
        dl = hs[7]
        eh = hs[8]
        el = hs[9]
        fh = hs[10]
        fl = hs[11]
        gh = hs[12]
        gl = hs[13]
        hh = hs[14]
        hl = hs[15]
        k = _K
        q = 0  # 4 * t: K[t]'s bytes
        t = 0
        while t < 64:
            if t:
                # W[t..t+15] in place: W[i] = s1(W[i-2]) + W[i-7] + s0(W[i-15]) + W[i-16]
                # (W[i-16] at index j, W[i-15] at j + 1, W[i-7] at j + 9, W[i-2] at j + 14,
                # modulo 16)
                j = 0
                while j < 16:
                    # s0 = rotr7(x) ^ rotr18(x) ^ shr3(x), x = W[i-15]
                    i = (j + 1) & 15
                    xh = wh[i]
                    xl = wl[i]
                    s0h = (
                        ((xh >> 7) | ((xl & 0x7F) << 9))
                        ^ ((xl >> 2) | ((xh & 0x3) << 14))
                        ^ (xh >> 3)
                    )
                    s0l = (
                        ((xl >> 7) | ((xh & 0x7F) << 9))
                        ^ ((xh >> 2) | ((xl & 0x3) << 14))
                        ^ ((xl >> 3) | ((xh & 0x7) << 13))
                    )
                    # s1 = rotr17(x) ^ rotr19(x) ^ shr10(x), x = W[i-2]
                    i = (j + 14) & 15
                    xh = wh[i]
                    xl = wl[i]
                    s1h = (
                        ((xl >> 1) | ((xh & 0x1) << 15))
                        ^ ((xl >> 3) | ((xh & 0x7) << 13))
                        ^ (xh >> 10)
                    )
                    s1l = (
                        ((xh >> 1) | ((xl & 0x1) << 15))
                        ^ ((xh >> 3) | ((xl & 0x7) << 13))
                        ^ ((xl >> 10) | ((xh & 0x3FF) << 6))
                    )
                    i = (j + 9) & 15  # W[i-7]
                    lo = s1l + wl[i] + s0l + wl[j]
                    wh[j] = (s1h + wh[i] + s0h + wh[j] + (lo >> 16)) & 0xFFFF
                    wl[j] = lo & 0xFFFF
                    j += 1
            j = 0
            while j < 16:
                # S1 = rotr6(e) ^ rotr11(e) ^ rotr25(e)
                s1h = (
                    ((eh >> 6) | ((el & 0x3F) << 10))
                    ^ ((eh >> 11) | ((el & 0x7FF) << 5))
                    ^ ((el >> 9) | ((eh & 0x1FF) << 7))
                )
                s1l = (
                    ((el >> 6) | ((eh & 0x3F) << 10))
                    ^ ((el >> 11) | ((eh & 0x7FF) << 5))
                    ^ ((eh >> 9) | ((el & 0x1FF) << 7))
                )
                # T1 = h + S1 + Ch(e, f, g) + K[t] + W[t], halves not yet carried/masked
                t1l = hl + s1l + (gl ^ (el & (fl ^ gl))) + ((k[q + 2] << 8) | k[q + 3]) + wl[j]
                t1h = hh + s1h + (gh ^ (eh & (fh ^ gh))) + ((k[q] << 8) | k[q + 1]) + wh[j]
                q += 4
                # S0 = rotr2(a) ^ rotr13(a) ^ rotr22(a)
                s0h = (
                    ((ah >> 2) | ((al & 0x3) << 14))
                    ^ ((ah >> 13) | ((al & 0x1FFF) << 3))
                    ^ ((al >> 6) | ((ah & 0x3F) << 10))
                )
                s0l = (
                    ((al >> 2) | ((ah & 0x3) << 14))
                    ^ ((al >> 13) | ((ah & 0x1FFF) << 3))
                    ^ ((ah >> 6) | ((al & 0x3F) << 10))
                )
                # T2 = S0 + Maj(a, b, c)
                t2l = s0l + ((al & bl) | (cl & (al | bl)))
                t2h = s0h + ((ah & bh) | (ch & (ah | bh)))
                hh = gh
                hl = gl
                gh = fh
                gl = fl
                fh = eh
                fl = el
                lo = dl + t1l
                eh = (dh + t1h + (lo >> 16)) & 0xFFFF
                el = lo & 0xFFFF
                dh = ch
                dl = cl
                ch = bh
                cl = bl
                bh = ah
                bl = al
                lo = t1l + t2l
                ah = (t1h + t2h + (lo >> 16)) & 0xFFFF
                al = lo & 0xFFFF
                j += 1
            t += 16

        lo = hs[1] + al
        hs[0] = (hs[0] + ah + (lo >> 16)) & 0xFFFF
        hs[1] = lo & 0xFFFF
        lo = hs[3] + bl
        hs[2] = (hs[2] + bh + (lo >> 16)) & 0xFFFF
        hs[3] = lo & 0xFFFF
        lo = hs[5] + cl
        hs[4] = (hs[4] + ch + (lo >> 16)) & 0xFFFF
        hs[5] = lo & 0xFFFF
        lo = hs[7] + dl
        hs[6] = (hs[6] + dh + (lo >> 16)) & 0xFFFF
        hs[7] = lo & 0xFFFF
        lo = hs[9] + el
        hs[8] = (hs[8] + eh + (lo >> 16)) & 0xFFFF
        hs[9] = lo & 0xFFFF
        lo = hs[11] + fl
        hs[10] = (hs[10] + fh + (lo >> 16)) & 0xFFFF
        hs[11] = lo & 0xFFFF
        lo = hs[13] + gl
        hs[12] = (hs[12] + gh + (lo >> 16)) & 0xFFFF
        hs[13] = lo & 0xFFFF
        lo = hs[15] + hl
        hs[14] = (hs[14] + hh + (lo >> 16)) & 0xFFFF
        hs[15] = lo & 0xFFFF


def sha256(data):
    """Digest of ``data`` as bytes (allocates; for tests and tools)."""
    h = Sha256()
    h.update_from(data, 0, len(data))
    out = bytearray(DIGEST_LEN)
    h.digest_into(out, 0)
    return bytes(out)
