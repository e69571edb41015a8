#!/usr/bin/env python3
"""The front door as a new user meets it (issue 43 part 5), Python stdlib only:
  - decode --packed against bytes built by hand (low nibble = even element) and an
    e2m1 table written here; cast --packed's bytes; --cols for odd rows; the refusals;
  - sr-bias --tensor: the example of its own --help, run as written, and no --quantizer;
  - compare --title reaches the gnuplot script escaped (a stand-in gnuplot records it);
  - scripts/get_shakespeare.sh offline (where to put the file, its sha256), --from PATH
    (sha256-checked: a wrong file is refused and nothing is installed);
  - cmake --install: configs, recipes and data scripts under share/fp4lab, and the installed
    fp4lab trains a shipped config from another working directory (data under ./data);
  - scripts/run_main.sh --dry-run: build/ reused as configured (never reconfigured, no
    -DFP4LAB_CUDA=OFF), configured with defaults when missing; the smoke-test caveat and title.
Usage: test_frontdoor.py FP4LAB BUILD_DIR SOURCE_DIR"""
import json
import os
import random
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from npyio import read_f32, read_u8, write_npy  # noqa: E402

FP4LAB = os.path.abspath(sys.argv[1])
BUILD = os.path.abspath(sys.argv[2])
SRC = os.path.abspath(sys.argv[3])
SHAKESPEARE_SHA = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
fails = 0


def check(cond, msg):
    global fails
    if not cond:
        fails += 1
        print("FAIL: " + msg)
    return cond


def run(*args, exe=None, cwd=None, env=None):
    p = subprocess.run([exe or FP4LAB, *args], capture_output=True, text=True, cwd=cwd, env=env)
    return p.returncode, p.stdout, p.stderr


# e2m1 written here from the OCP MX spec: sign bit 3, then 2 exponent bits and 1 mantissa bit.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1(code):
    v = E2M1[code & 7]
    return -v if code & 8 else v


def test_decode_packed(t):
    # Bytes chosen by hand: 0x21 = elements (1, 2) -> (0.5, 1.0): the LOW nibble is element 0.
    packed = [0x21, 0xF3, 0x8A, 0x07, 0x5C, 0xE6]
    write_npy(os.path.join(t, 'p.npy'), '|u1', (2, 3), packed)
    out = os.path.join(t, 'v.npy')
    rc, _, err = run('decode', '--from', 'e2m1', '--packed', os.path.join(t, 'p.npy'), out)
    if check(rc == 0, f"decode --packed: exit {rc}: {err}"):
        header, shape, vals = read_f32(out)
        check(shape == (2, 6), f"decode --packed: shape {shape}, want (2, 6)")
        want = [0.5, 1.0, 1.5, -6.0, -1.0, -0.0, 6.0, 0.0, -2.0, 3.0, 4.0, -4.0]
        check(vals == want, f"decode --packed: {vals}, want {want}")
        check(struct.pack('<f', vals[5]) == struct.pack('<f', -0.0), "decode --packed: 0x8A's high nibble is -0")
        # The same values from the unpacked route: one code a byte, unpack written here.
        codes = [n for b in packed for n in (b & 15, b >> 4)]
        check([e2m1(c) for c in codes] == vals, "decode --packed disagrees with the table")
        write_npy(os.path.join(t, 'u.npy'), '|u1', (2, 6), codes)
        rc, _, err = run('decode', '--from', 'e2m1', os.path.join(t, 'u.npy'), os.path.join(t, 'u_v.npy'))
        check(rc == 0 and read_f32(os.path.join(t, 'u_v.npy'))[2] == vals, f"decode unpacked vs packed: {rc} {err}")
    # --cols 5: a last axis of 3 bytes holds 5 codes; the last high nibble is ignored.
    rc, _, err = run('decode', '--from', 'e2m1', '--packed', '--cols', '5', os.path.join(t, 'p.npy'), out)
    if check(rc == 0, f"decode --packed --cols 5: exit {rc}: {err}"):
        _, shape, vals = read_f32(out)
        check(shape == (2, 5) and vals == [0.5, 1.0, 1.5, -6.0, -1.0, 6.0, 0.0, -2.0, 3.0, 4.0],
              f"decode --packed --cols 5: {shape} {vals}")
    # Refusals: one line, exit 2, no output file.
    os.remove(out)
    for args, what in ((['--from', 'e4m3', '--packed'], '8-bit'), (['--from', 'e2m1', '--packed', '--cols', '7'], '--cols 7'),
                       (['--from', 'e2m1', '--cols', '6'], '--cols applies')):
        rc, _, err = run('decode', *args, os.path.join(t, 'p.npy'), out)
        check(rc == 2 and what in err and err.count('\n') == 1 and not os.path.exists(out),
              f"decode {args}: exit {rc}, {err!r}")
    # cast --packed: element 2k low, 2k+1 high; odd rows end in a zero high nibble.
    write_npy(os.path.join(t, 'x.npy'), '<f4', (2, 3), [0.5, 1.0, -6.0, 3.0, 0.25, 2.0])
    rc, _, err = run('cast', '--to', 'e2m1', '--packed', os.path.join(t, 'x.npy'), os.path.join(t, 'c.npy'))
    if check(rc == 0, f"cast --packed: exit {rc}: {err}"):
        check(read_u8(os.path.join(t, 'c.npy')) == [0x21, 0x0F, 0x05, 0x04],
              f"cast --packed bytes {read_u8(os.path.join(t, 'c.npy'))}, want [0x21, 0x0f, 0x05, 0x04]")
        rc, _, err = run('decode', '--from', 'e2m1', '--packed', '--cols', '3', os.path.join(t, 'c.npy'), out)
        check(rc == 0 and read_f32(out)[1:] == ((2, 3), [0.5, 1.0, -6.0, 3.0, 0.0, 2.0]),
              f"cast --packed | decode --packed: {rc} {err}")


def test_sr_bias_tensor(t):
    rc, out, err = run('sr-bias', '--help')
    ex = [ln.strip() for ln in out.splitlines() if 'sr-bias --tensor' in ln and 'fp4lab' in ln]
    if not check(rc == 0 and ex, f"sr-bias --help has no --tensor example: {out}"):
        return
    cmd = shlex.split(ex[0].split('(')[0].split('On a real tensor:')[-1])
    npys = [a for a in cmd if a.endswith('.npy')]
    check(cmd[:2] == ['fp4lab', 'sr-bias'] and len(npys) == 1, f"sr-bias example: {cmd}")
    rng = random.Random(3)
    write_npy(os.path.join(t, npys[0]), '<f4', (16, 64), [rng.gauss(0, 1e-3) for _ in range(16 * 64)])
    rc, out, err = run(*cmd[1:], cwd=t)
    check(rc == 0 and 'ptx_x4 (8 bits, exact)' in out, f"sr-bias help example {cmd}: exit {rc}: {err}")
    rc, out, err = run('sr-bias', '--tensor', npys[0], cwd=t)
    check(rc == 0 and ' rs ' in out and 'measured with round rs' in out, f"sr-bias --tensor (default quantizer): {rc} {out} {err}")
    rc, out, err = run('sr-bias', '--tensor', npys[0], '--quantizer', 'mxfp4', cwd=t)
    check(rc == 0 and 'mxfp4' in out, f"sr-bias --tensor --quantizer mxfp4: {rc} {err}")


def fake_gnuplot(t):
    """A gnuplot that copies its script to $FP4LAB_TEST_GP and draws a 1-byte 'image'."""
    d = os.path.join(t, 'fakebin')
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, 'gnuplot')
    with open(p, 'w') as f:
        f.write('#!/bin/sh\ncp "$1" "$FP4LAB_TEST_GP"\nprintf x > plot.png\n')
    os.chmod(p, 0o755)
    return d


def test_install_and_title(t):
    prefix = os.path.join(t, 'prefix')
    p = subprocess.run(['cmake', '--install', BUILD, '--prefix', prefix], capture_output=True, text=True)
    if not check(p.returncode == 0, f"cmake --install: {p.stdout} {p.stderr}"):
        return
    share = os.path.join(prefix, 'share', 'fp4lab')
    exe = os.path.join(prefix, 'bin', 'fp4lab')
    for rel in ('configs/vit_mnist_quick.json', 'configs/gpt_baby.json', 'configs/recipes/nvfp4_ptx_x4.json',
                'configs/recipes/nvfp4_ablation/nvfp4_no_rht.json', 'scripts/get_mnist.sh',
                'scripts/get_shakespeare.sh', 'scripts/bench_pytorch_gpt.py'):
        check(os.path.isfile(os.path.join(share, rel)), f"install: no share/fp4lab/{rel}")
    for rel in ('scripts/get_mnist.sh', 'scripts/get_shakespeare.sh'):
        f = os.path.join(share, rel)
        check(os.path.isfile(f) and os.stat(f).st_mode & stat.S_IXUSR, f"install: {rel} not executable")
    check(os.path.isfile(exe), "install: no bin/fp4lab")
    if fails:
        return
    rc, out, err = run('recipes', 'show', os.path.join(share, 'configs/recipes/nvfp4_ablation/nvfp4_no_rht.json'), exe=exe)
    check(rc == 0, f"installed recipes show: {rc} {err}")
    # Another working directory, data in its ./data (as the configs say), synthetic text.
    work = os.path.join(t, 'work')
    os.makedirs(os.path.join(work, 'data'))
    rng = random.Random(5)
    with open(os.path.join(work, 'data', 'tinyshakespeare.txt'), 'w') as f:
        f.write(''.join(rng.choice('abcdefgh \n') for _ in range(40000)))
    sets = ['training.steps=2', 'training.warmup_steps=0', 'training.decay_steps=2', 'training.eval_interval=1',
            'training.eval_iters=1', 'training.batch_size=2', 'model.layers=1', 'model.width=32', 'model.heads=2',
            'model.context=16']
    args = ['train', os.path.join(share, 'configs', 'gpt_baby.json'), '--quiet']
    for s in sets:
        args += ['--set', s]
    rc, out, err = run(*args, exe=exe, cwd=work)
    run_dir = os.path.join(work, 'runs', 'gpt_baby-fp32-s1')
    if not check(rc == 0 and os.path.isfile(os.path.join(run_dir, 'summary.json')),
                 f"installed fp4lab train share/fp4lab/configs/gpt_baby.json: exit {rc}: {err[-400:]}"):
        return
    # compare --title: the title reaches gnuplot as one escaped literal.
    env = dict(os.environ, PATH=fake_gnuplot(t) + os.pathsep + os.environ.get('PATH', ''),
               FP4LAB_TEST_GP=os.path.join(t, 'captured.gp'))
    title = "gpt_baby: 2 steps, seed 1 'x' $(touch pwned) \\ \"q\""
    rc, out, err = run('compare', run_dir, '--plot', os.path.join(t, 'c.png'), '--title', title, exe=exe, env=env, cwd=t)
    if check(rc == 0 and os.path.isfile(os.path.join(t, 'captured.gp')), f"compare --title: {rc} {err}"):
        gp = open(os.path.join(t, 'captured.gp')).read()
        want = "set multiplot layout 1,2 title 'gpt_baby: 2 steps, seed 1 ?x? ?(touch pwned) ? ?q?'"
        check(want in gp, f"compare --title: script has no {want!r}:\n{gp[:300]}")
        check(not os.path.exists(os.path.join(t, 'pwned')), "compare --title ran a command")
    rc, out, err = run('compare', run_dir, '--plot', os.path.join(t, 'd.png'), exe=exe, env=env, cwd=t)
    check(rc == 0 and 'multiplot layout 1,2\n' in open(os.path.join(t, 'captured.gp')).read(),
          f"compare without --title: {rc} {err}")


def copy_script(t, name, rel_scripts):
    d = os.path.join(t, *rel_scripts)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(SRC, 'scripts', name), d)
    return os.path.join(d, name)


def test_get_shakespeare(t):
    # A copy outside any source tree (as installed): DEST defaults to ./data of the working directory.
    script = copy_script(t, 'get_shakespeare.sh', ['inst', 'share', 'fp4lab', 'scripts'])
    work = os.path.join(t, 'gs')
    os.makedirs(work)
    dest = os.path.join(work, 'data', 'tinyshakespeare.txt')
    env = dict(os.environ, GET_SHAKESPEARE_URL='http://127.0.0.1:9/input.txt')
    p = subprocess.run([script], capture_output=True, text=True, cwd=work, env=env)
    check(p.returncode == 1 and SHAKESPEARE_SHA in p.stderr and '--from PATH' in p.stderr and dest in p.stderr,
          f"get_shakespeare offline: exit {p.returncode}, {p.stderr!r}")
    check(not os.path.exists(dest), "get_shakespeare offline installed a file")
    bad = os.path.join(t, 'bad.txt')
    with open(bad, 'w') as f:
        f.write('First Citizen:\n')
    p = subprocess.run([script, '--from', bad], capture_output=True, text=True, cwd=work, env=env)
    check(p.returncode == 2 and 'expected ' + SHAKESPEARE_SHA in p.stderr and not os.path.exists(dest),
          f"get_shakespeare --from (wrong file): exit {p.returncode}, {p.stderr!r}")
    p = subprocess.run([script, '--from', os.path.join(t, 'missing.txt')], capture_output=True, text=True, cwd=work)
    check(p.returncode == 2 and 'no such file' in p.stderr, f"get_shakespeare --from missing: {p.returncode} {p.stderr!r}")
    real = [c for c in (os.environ.get('FP4LAB_SHAKESPEARE', ''), os.path.join(SRC, 'data', 'tinyshakespeare.txt'),
                        os.path.join(SRC, '..', 'shared', 'data', 'tinyshakespeare.txt'),
                        '/work/shared/data/tinyshakespeare.txt') if c and os.path.isfile(c)]
    if not real:
        print("note: no copy of tinyshakespeare.txt here; --from with the right file not tried")
        return
    p = subprocess.run([script, '--from', real[0]], capture_output=True, text=True, cwd=work, env=env)
    check(p.returncode == 0 and os.path.isfile(dest), f"get_shakespeare --from {real[0]}: {p.returncode} {p.stderr!r}")
    p = subprocess.run([script], capture_output=True, text=True, cwd=work, env=env)
    check(p.returncode == 0 and 'present and verified' in p.stdout, f"get_shakespeare again: {p.returncode} {p.stderr!r}")


def test_run_main(t):
    # A copy of the tree's shape: scripts/run_main.sh, CMakeLists.txt, configs/.
    root = os.path.join(t, 'tree')
    script = copy_script(t, 'run_main.sh', ['tree', 'scripts'])
    shutil.copytree(os.path.join(SRC, 'configs'), os.path.join(root, 'configs'))
    open(os.path.join(root, 'CMakeLists.txt'), 'w').close()
    p = subprocess.run([script, '--dry-run'], capture_output=True, text=True)
    out = p.stdout
    check(p.returncode == 0, f"run_main --dry-run: exit {p.returncode}: {p.stderr}")
    lines = [ln for ln in out.splitlines() if ln.startswith('+ ')]
    cfg = [ln for ln in lines if ln.startswith('+ cmake -S')]
    check(len(cfg) == 1 and '-B build' in cfg[0] and 'FP4LAB_CUDA' not in cfg[0] and 'build-main' not in out,
          f"run_main --dry-run without build/: configure {cfg}")
    check(any(ln.startswith('+ cmake --build build --target fp4lab') for ln in lines), f"run_main builds build/: {lines}")
    sweep = [shlex.split(ln[2:]) for ln in lines if ' sweep ' in ln]
    title = sweep[0][sweep[0].index('--title') + 1] if len(sweep) == 1 and '--title' in sweep[0] else ''
    check(len(sweep) == 1 and sweep[0][:3] == ['build/apps/fp4lab', 'sweep', 'configs/vit_mnist_quick.json']
          and title.startswith('vit_mnist_quick: 1 epoch, seed 1') and 'smoke test' in title,
          f"run_main sweep line: {sweep}")
    check(any('get_mnist.sh' in ln for ln in lines), "run_main: MNIST not fetched")
    check(out.count('ONE-SEED SMOKE TEST') == 2 and 'noise' in out and '--seeds' in out,
          f"run_main: the smoke-test caveat before and after the table:\n{out}")
    # An existing build/ is reused as configured: no cmake -S (a reconfigure could flip CUDA or the build type).
    os.makedirs(os.path.join(root, 'build'))
    with open(os.path.join(root, 'build', 'CMakeCache.txt'), 'w') as f:
        f.write('FP4LAB_CUDA:STRING=ON\n')
    p = subprocess.run([script, '--dry-run', '--seeds', '1,2,3'], capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('+ ')]
    check(p.returncode == 0 and not any(ln.startswith('+ cmake -S') for ln in lines)
          and any(ln.startswith('+ cmake --build build') for ln in lines), f"run_main reuses build/: {lines}")
    sweep = [shlex.split(ln[2:]) for ln in lines if ' sweep ' in ln]
    check('ONE-SEED' not in p.stdout and len(sweep) == 1 and '1,2,3' in sweep[0]
          and any('3 seeds' in a for a in sweep[0]),
          f"run_main --seeds 1,2,3: {p.stdout}")
    # A GPT config fetches tiny Shakespeare instead.
    p = subprocess.run([script, '--dry-run', '--config', 'configs/gpt_baby.json'], capture_output=True, text=True)
    check(p.returncode == 0 and 'get_shakespeare.sh' in p.stdout and 'get_mnist' not in p.stdout
          and '2000 steps' in p.stdout, f"run_main --config gpt_baby: {p.stdout} {p.stderr}")


def test_bench_mfu(t):
    """bench train's TFLOP/s and MFU: the flops a token are nanoGPT's 6N + 12LCT, N counted here from the
    model's shape (wte, per layer 12C^2 + 2C without biases, ln_f; no position embedding)."""
    V, C, L, T = 65, 32, 1, 64
    rc, out, err = run('bench', 'train', '--config', os.path.join(SRC, 'configs', 'gpt_baby.json'), '--set',
                       f'model.layers={L}', '--set', f'model.width={C}', '--steps', '1', '--repeats', '1',
                       '--recipes', 'fp32', '--pytorch', 'off', '--peak-tflops', '0.0005')
    if not check(rc == 0, f"bench train: exit {rc}: {err}"):
        return
    n = V * C + L * (12 * C * C + 2 * C) + C
    want = 6 * n + 12 * L * C * T
    m = re.search(r"TFLOP/s: (\S+) flops a token .*MFU against 0.0005 TFLOP/s \(--peak-tflops\)", out)
    check(m is not None and abs(float(m.group(1)) - want) <= 1e-3 * want,
          f"bench train: flops a token {m.group(1) if m else None}, want {want}: {out}")
    row = [l for l in out.splitlines() if l.startswith('fp32 ')]
    if check(len(row) == 1, f"bench train: no fp32 row: {out}"):
        f = row[0].split()
        tokens_s, tflops, mfu = float(f[4]), float(f[6]), float(f[7].rstrip('%'))
        check(abs(tflops - want * tokens_s * 1e-12) <= 1e-3 * tflops + 1e-6, f"bench train: TFLOP/s {tflops}: {row}")
        check(abs(mfu - 100 * tflops / 0.0005) <= 0.01 * mfu + 0.1, f"bench train: MFU {mfu}: {row}")


def test_bench_vs_config(t):
    """bench train --vs-config: both models timed in the same rounds; each recipe's ratio is the quotient of its two
    rows' medians (as printed), and a second config of another kind is refused with one line naming it."""
    base = os.path.join(SRC, 'configs', 'gpt_baby.json')
    wide = os.path.join(t, 'wide.json')
    with open(base) as f:
        cfg = json.load(f)
    cfg.setdefault('model', {})['width'] = 64
    with open(wide, 'w') as f:
        json.dump(cfg, f)
    rc, out, err = run('bench', 'train', '--config', wide, '--vs-config', base, '--set', 'model.layers=1', '--steps',
                       '1', '--repeats', '1', '--recipes', 'fp32,bf16', '--pytorch', 'off')
    if not check(rc == 0, f"bench train --vs-config: exit {rc}: {err}"):
        return
    rows = {l.split()[0] + (' ' + l.split()[1] if l.split()[1].startswith('@') else ''): float(
        l.split()[2] if l.split()[1].startswith('@') else l.split()[1])
            for l in out.splitlines() if l.startswith(('fp32 ', 'bf16 '))}
    check(set(rows) == {'fp32', 'fp32 @gpt_baby', 'bf16', 'bf16 @gpt_baby'}, f"bench train --vs-config rows: {out}")
    for r in ('fp32', 'bf16'):
        m = re.search(r"^  " + r + r"\s+(\S+)x\s+max/median (\S+) and (\S+)$", out, re.M)
        if check(m is not None and r in rows and r + ' @gpt_baby' in rows, f"bench train --vs-config ratio {r}: {out}"):
            want = rows[r] / rows[r + ' @gpt_baby']
            check(abs(float(m.group(1)) - want) <= 0.01 * want + 0.01, f"ratio {m.group(1)}, rows say {want}: {out}")
    # --config-set changes --config's model only: a key the dense --vs-config lacks is accepted, and the first
    # model's flops a token follow its width while the second's stay the base's.
    moe = os.path.join(SRC, 'configs', 'gpt_moe_baby.json')
    rc, out, err = run('bench', 'train', '--config', moe, '--vs-config', base, '--config-set',
                       'model.moe.dispatch=capacity', '--config-set', 'model.width=64', '--set', 'model.layers=1',
                       '--steps', '1', '--repeats', '1', '--recipes', 'fp32', '--pytorch', 'off')
    if check(rc == 0, f"bench train --config-set: exit {rc}: {err}"):
        first = re.search(r"^TFLOP/s: (\S+) flops a token", out, re.M)
        second = re.search(r"^" + re.escape(base) + r": (\S+) flops a token", out, re.M)
        check(first is not None and second is not None and float(first.group(1)) != float(second.group(1)),
              f"bench train --config-set: flops lines: {out}")
    rc, out, err = run('bench', 'train', '--config', moe, '--vs-config', base, '--set', 'model.moe.dispatch=capacity',
                       '--steps', '1', '--repeats', '1', '--recipes', 'fp32', '--pytorch', 'off')
    check(rc != 0 and 'moe' in err, f"bench train --set of a key only --config has: {rc} {err}")
    vit = os.path.join(SRC, 'configs', 'vit_mnist_quick.json')
    if os.path.exists(vit):
        rc, out, err = run('bench', 'train', '--config', base, '--vs-config', vit, '--steps', '1', '--repeats', '1',
                           '--recipes', 'fp32', '--pytorch', 'off')
        check(rc != 0 and 'vs-config' in err and 'vit' in err, f"bench train --vs-config with a ViT: {rc} {err}")


def main():
    tests = [test_bench_mfu, test_bench_vs_config, test_decode_packed, test_sr_bias_tensor, test_get_shakespeare, test_run_main, test_install_and_title]
    for fn in tests:
        before = fails
        with tempfile.TemporaryDirectory(prefix='fp4lab_frontdoor_') as t:
            fn(t)
        print(("FAIL " if fails > before else "ok   ") + fn.__name__)
    print(f"test_frontdoor: {fails} failure(s)")
    return 1 if fails else 0


if __name__ == '__main__':
    sys.exit(main())
