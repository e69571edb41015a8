"""Minimal .npy writing and reading for the CLI tests (Python stdlib only: no NumPy needed)."""
import struct

_FORMATS = {'<f4': 'f', '|u1': 'B', '<u4': 'I'}


def write_npy(path, descr, shape, vals):
    """A version-1.0 .npy of dtype descr ('<f4', '|u1', '<u4'), C order, as NumPy writes it."""
    fmt = _FORMATS[descr]
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    n = 10 + len(d) + 1
    d += ' ' * ((64 - n % 64) % 64) + '\n'
    data = b''.join(struct.pack('<' + fmt, v) for v in vals)
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(d)) + d.encode() + data)


def read_u8(path):
    """The data bytes of a version-1.0 uint8 .npy, as a list of ints."""
    with open(path, 'rb') as f:
        b = f.read()
    hl = struct.unpack('<H', b[8:10])[0]
    return list(b[10 + hl:])
