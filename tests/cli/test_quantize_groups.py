#!/usr/bin/env python3
"""`fp4lab quantize --groups SIZES.npy` against the same command without
--groups on each group's rows alone: the grouped outputs (dequant, codes,
scales, global scale, swizzled scales) must be the per-slice outputs
concatenated, bit for bit, with group g's random stream --stream + g (and
with --rbits, the words of its own rows). Then the errors of a bad sizes file:
one line naming the file and the fault, a non-zero exit, no output written.
Python stdlib only. Usage: test_quantize_groups.py FP4LAB"""
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

from npyio import read_npy, write_npy, write_raw

FP4LAB = os.path.abspath(sys.argv[1])
fails = 0


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print("FAIL: " + msg)


def run(*args):
    p = subprocess.run([FP4LAB, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def write_i8(path, vals, shape=None):
    write_npy(path, '<i8', shape if shape is not None else (len(vals),), vals)


SIZES = [0, 3, 17, 0, 12]
ROWS, COLS = sum(SIZES), 40
OUTS = ['dequant', 'codes', 'scales', 'global-scale', 'swizzled-scales']

tmp = tempfile.mkdtemp(prefix='fp4lab_groups_')
try:
    def p(name):
        return os.path.join(tmp, name)

    rng = random.Random(7)
    x = []
    for r in range(ROWS):  # rows of very different magnitude: a shared global scale would show
        sigma = 2.0 ** rng.randint(-6, 6)
        x.append([rng.gauss(0, 1) * sigma for _ in range(COLS)])
    x[5][7] = float('nan')  # group 2 only
    write_npy(p('x.npy'), '<f4', (ROWS, COLS), [v for row in x for v in row])
    write_i8(p('sizes.npy'), SIZES)
    words_per_row = (COLS + 3) // 4  # ptx_x4
    words = [rng.getrandbits(32) for _ in range(ROWS * words_per_row)]
    write_npy(p('words.npy'), '<u4', (ROWS, words_per_row), words)

    cases = [  # (label, quantizer, extra args, writes swizzled scales)
        ('nvfp4', 'nvfp4', [], True),
        ('nvfp4_2d', 'nvfp4_2d', [], True),
        ('nvfp4_col', 'nvfp4_col', [], False),
        ('mxfp4', 'mxfp4', [], True),
        ('mxfp8_e4m3', 'mxfp8_e4m3', [], False),
        ('nvfp4 rs', '{"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv",'
         '"global_scale":"tensor_amax","round":"rs"}', ['--seed', '5', '--stream', '9'], True),
        ('nvfp4 rs ptx_x4 --rbits', '{"element":"e2m1","scale":"ue4m3","block":[1,16],"scale_rule":"nv",'
         '"global_scale":"tensor_amax","round":"rs","sr_bits":"ptx_x4"}', ['--rbits', 'WORDS'], True),
        ('nvfp4_col rht rs', '{"element":"e2m1","scale":"ue4m3","block":[16,1],"scale_rule":"nv",'
         '"global_scale":"tensor_amax","round":"rs","rht":true,"rht_seed":3}', ['--seed', '1', '--stream', '0'],
         False),
    ]
    for label, quantizer, extra, swz in cases:
        outs = OUTS if swz else OUTS[:-1]

        def outputs(prefix):
            args = []
            for o in outs:
                args += ['--' + o, p('%s_%s.npy' % (prefix, o))]
            return args

        # With --groups on the whole tensor.
        args = [a if a != 'WORDS' else p('words.npy') for a in extra]
        rc, _, err = run('quantize', '--quantizer', quantizer, p('x.npy'), '--groups', p('sizes.npy'),
                         *args, *outputs('g'))
        check(rc == 0, '%s: --groups exited %d: %s' % (label, rc, err.strip()))
        if rc != 0:
            continue
        # Without --groups on each group's rows alone, group g on stream --stream + g / its own words.
        per = {o: [] for o in outs}
        shapes = {o: [] for o in outs}
        row, ok = 0, True
        for g, n in enumerate(SIZES):
            write_npy(p('slice.npy'), '<f4', (n, COLS), [v for r in x[row:row + n] for v in r])
            args = list(extra)
            if '--stream' in args:
                i = args.index('--stream') + 1
                args[i] = str(int(args[i]) + g)
            if 'WORDS' in args:
                write_npy(p('slice_words.npy'), '<u4', (n, words_per_row),
                          words[row * words_per_row:(row + n) * words_per_row])
                args[args.index('WORDS')] = p('slice_words.npy')
            rc, _, err = run('quantize', '--quantizer', quantizer, p('slice.npy'), *args, *outputs('s'))
            check(rc == 0, '%s: group %d alone exited %d: %s' % (label, g, rc, err.strip()))
            if rc != 0:
                ok = False
                break
            for o in outs:
                descr, shape, data = read_npy(p('s_%s.npy' % o))
                per[o].append(data)
                shapes[o].append((descr, shape))
            row += n
        if not ok:
            continue
        for o in outs:
            descr, shape, data = read_npy(p('g_%s.npy' % o))
            want = b''.join(per[o])
            check(data == want, '%s: --%s: grouped bytes differ from the per-group outputs concatenated '
                  '(%d vs %d bytes)' % (label, o, len(data), len(want)))
            check(descr == shapes[o][0][0], '%s: --%s dtype %s, per group %s' % (label, o, descr, shapes[o][0][0]))
            if o == 'global-scale':
                want_shape = (len(SIZES),)
            elif o == 'swizzled-scales':
                want_shape = (len(want),)
            else:  # stacked rows
                want_shape = (sum(s[1][0] for s in shapes[o]), shapes[o][0][1][1])
            check(shape == want_shape, '%s: --%s shape %s, expected %s' % (label, o, shape, want_shape))
        # An empty group's global scale is 1; the swizzled layout pads each group to 128 rows.
        _, _, gl = read_npy(p('g_global-scale.npy'))
        vals = struct.unpack('<%df' % len(SIZES), gl)
        check(vals[0] == 1.0 and vals[3] == 1.0, '%s: empty groups\' global scales %s' % (label, vals))
        if swz:
            _, shape, _ = read_npy(p('g_swizzled-scales.npy'))
            blocks = -(-COLS // (32 if label.startswith('mx') else 16))  # scale columns C
            c4 = -(-blocks // 4) * 4
            want_bytes = sum(-(-n // 128) * 128 * c4 for n in SIZES)
            check(shape == (want_bytes,), '%s: swizzled scales %s bytes, expected %d' % (label, shape, want_bytes))
        # Group 2 (the NaN) is all NaN under the per-group global scale of nvfp4; group 1 and 4 have none.
        if label == 'nvfp4':
            _, _, dq = read_npy(p('g_dequant.npy'))
            v = struct.unpack('<%df' % (ROWS * COLS), dq)
            check(all(f != f for f in v[3 * COLS:20 * COLS]), 'nvfp4: group 2 not all NaN')
            check(not any(f != f for f in v[:3 * COLS] + v[20 * COLS:]), 'nvfp4: NaN outside group 2')

    # --stats prints one block per group.
    rc, out, err = run('quantize', '--quantizer', 'nvfp4', p('x.npy'), '--groups', p('sizes.npy'),
                       '--dequant', p('d.npy'), '--stats')
    check(rc == 0 and out.count('group ') == len(SIZES) and 'group 4 of 5: rows [20, 32)' in out,
          '--stats with --groups: %d %s %s' % (rc, out, err))

    # Errors: one line naming the file and the fault, exit 2, nothing written, old outputs kept.
    write_i8(p('neg.npy'), [0, 3, -1, 18, 12])
    write_i8(p('sum.npy'), [0, 3, 17, 0, 11])
    write_i8(p('empty.npy'), [])
    write_i8(p('two_d.npy'), [0, 3, 17, 12], (2, 2))
    write_raw(p('f4.npy'), '<f4', (5,), b''.join(struct.pack('<f', v) for v in SIZES))
    write_raw(p('u4.npy'), '<u4', (5,), b''.join(struct.pack('<I', v) for v in SIZES))
    write_raw(p('short.npy'), '<i8', (5,), struct.pack('<q', 3))
    errors = [
        ('negative', 'neg.npy', 'nvfp4', ['group 2 has -1 rows', 'must be >= 0']),
        ('wrong sum', 'sum.npy', 'nvfp4', ['sum to 31', 'has 32 rows']),
        ('no groups', 'empty.npy', 'nvfp4', ['sum to 0', 'has 32 rows']),
        ('not 1-D', 'two_d.npy', 'nvfp4', ['1-D', 'shape [2, 2]']),
        ('float32', 'f4.npy', 'nvfp4', ['int64', 'float32']),
        ('uint32', 'u4.npy', 'nvfp4', ['int64', 'uint32']),
        ('truncated', 'short.npy', 'nvfp4', ['truncated']),
        ('missing', 'nope.npy', 'nvfp4', ['cannot open']),
        ('per-tensor', 'sizes.npy', 'fp8_e4m3_tensor', ['--groups', 'block [0,0]']),
    ]
    for label, f, quantizer, pats in errors:
        with open(p('old.npy'), 'wb') as fh:
            fh.write(b'old')
        for stale in ('new_codes.npy',):
            if os.path.exists(p(stale)):
                os.remove(p(stale))
        rc, out, err = run('quantize', '--quantizer', quantizer, p('x.npy'), '--groups', p(f),
                           '--dequant', p('old.npy'), '--codes', p('new_codes.npy'))
        lines = err.strip().splitlines()
        check(rc == 2, '%s: exit %d, expected 2 (%s)' % (label, rc, err.strip()))
        check(len(lines) == 1, '%s: %d stderr lines: %r' % (label, len(lines), err))
        if f != 'sizes.npy':
            check(f in err, '%s: the message does not name %s: %s' % (label, f, err.strip()))
        for pat in pats:
            check(pat in err, '%s: stderr lacks %r: %s' % (label, pat, err.strip()))
        with open(p('old.npy'), 'rb') as fh:
            check(fh.read() == b'old', '%s: overwrote an output' % label)
        check(not os.path.exists(p('new_codes.npy')), '%s: wrote an output' % label)
        check(not any('.tmp.' in n for n in os.listdir(tmp)), '%s: left a temporary file' % label)
    rc, _, err = run('quantize', '--quantizer', 'nvfp4_col', p('x.npy'), '--groups', p('sizes.npy'),
                     '--dequant', p('d.npy'), '--swizzled-scales', p('sw.npy'))
    check(rc == 2 and '--swizzled-scales' in err and '[16,1]' in err, 'swizzle of [16,1]: %d %s' % (rc, err))
    rc, _, err = run('quantize', '--quantizer', 'mxfp8_e4m3', p('x.npy'), '--swizzled-scales', p('sw.npy'),
                     '--dequant', p('d.npy'))
    check(rc == 2 and '4-bit' in err, 'swizzle of e4m3: %d %s' % (rc, err))
finally:
    shutil.rmtree(tmp)

if fails:
    print('%d grouped-quantize check(s) failed' % fails)
    sys.exit(1)
print('grouped quantize: all checks passed')
