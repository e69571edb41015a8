"""Minimal .npy writing and reading for the CLI tests (Python stdlib only: no NumPy needed)."""
import ast
import struct

_FORMATS = {'<f4': 'f', '|u1': 'B', '<u4': 'I', '<i8': 'q'}


def write_raw(path, descr, shape, data):
    """A version-1.0 .npy of dtype descr, C order, as NumPy writes it, from its raw little-endian bytes."""
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, repr(tuple(shape)))
    n = 10 + len(d) + 1
    d += ' ' * ((64 - n % 64) % 64) + '\n'
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(d)) + d.encode() + data)


def write_npy(path, descr, shape, vals):
    """write_raw of the values vals of dtype descr ('<f4', '|u1', '<u4', '<i8')."""
    fmt = _FORMATS[descr]
    write_raw(path, descr, shape, b''.join(struct.pack('<' + fmt, v) for v in vals))


def read_npy(path):
    """(descr, shape, raw data bytes) of a version-1.0 or 2.0 .npy."""
    with open(path, 'rb') as f:
        b = f.read()
    assert b[:6] == b'\x93NUMPY', path + ': bad magic'
    if b[6] == 1:
        hl, at = struct.unpack('<H', b[8:10])[0], 10
    else:
        hl, at = struct.unpack('<I', b[8:12])[0], 12
    h = ast.literal_eval(b[at:at + hl].decode())
    return h['descr'], tuple(h['shape']), b[at + hl:]


def read_u8(path):
    """The data bytes of a uint8 .npy, as a list of ints."""
    return list(read_npy(path)[2])


def read_f32(path):
    """(descr, shape, values) of a float32 .npy."""
    descr, shape, data = read_npy(path)
    return descr, shape, list(struct.unpack('<%df' % (len(data) // 4), data))
