#!/usr/bin/env python3
"""What dominates a .wasm file: code bytes per crate, from the function-name section.

Usage: wasm_size.py MODULE.wasm [TOP]   (the module must keep its name section, as
cargo's output does; wasm-bindgen's --remove-name-section output does not).
"""
import re
import sys
from collections import Counter


def leb(data, i):
    result = shift = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return result, i


def sections(data):
    i = 8
    while i < len(data):
        sid = data[i]
        size, j = leb(data, i + 1)
        yield sid, data[j : j + size]
        i = j + size


def crate_of(name):
    """The crate a (legacy-mangled or plain) Rust symbol belongs to."""
    m = re.match(r"_ZN(\d+)(.*)", name)
    if m:
        n = int(m.group(1))
        seg = m.group(2)[:n]
        if seg.startswith("_$LT$"):
            seg = seg[5:]
        elif seg.startswith("$LT$"):
            seg = seg[4:]
        return re.split(r"\.\.|\$", seg)[0] or "?"
    if name.startswith("_R"):
        m = re.search(r"C[s\d_]*?(\d+)([A-Za-z_][A-Za-z0-9_]*)", name)
        return m.group(2)[: int(m.group(1))] if m else "?"
    if "::" in name:
        return name.lstrip("<").split("::")[0]
    return "(other: " + name.split("(")[0][:24] + ")" if name else "(unnamed)"


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    data = open(path, "rb").read()
    imported = 0
    bodies = []
    names = {}
    data_bytes = 0
    for sid, body in sections(data):
        if sid == 2:  # imports: count functions
            n, i = leb(body, 0)
            for _ in range(n):
                for _ in range(2):
                    ln, i = leb(body, i)
                    i += ln
                kind = body[i]
                i += 1
                if kind == 0:
                    _, i = leb(body, i)
                    imported += 1
                elif kind == 1:
                    i += 1
                    flags, i = leb(body, i)
                    _, i = leb(body, i)
                    if flags & 1:
                        _, i = leb(body, i)
                elif kind == 2:
                    flags, i = leb(body, i)
                    _, i = leb(body, i)
                    if flags & 1:
                        _, i = leb(body, i)
                elif kind == 3:
                    i += 2
                else:
                    _, i = leb(body, i)
        elif sid == 10:
            n, i = leb(body, 0)
            for _ in range(n):
                size, j = leb(body, i)
                bodies.append(size + (j - i))
                i = j + size
        elif sid == 11:
            data_bytes = len(body)
        elif sid == 0:
            ln, i = leb(body, 0)
            if body[i : i + ln] != b"name":
                continue
            i += ln
            while i < len(body):
                sub = body[i]
                size, j = leb(body, i + 1)
                if sub == 1:
                    n, k = leb(body, j)
                    for _ in range(n):
                        idx, k = leb(body, k)
                        ln2, k = leb(body, k)
                        names[idx] = body[k : k + ln2].decode("utf8", "replace")
                        k += ln2
                i = j + size
    per = Counter()
    for n, size in enumerate(bodies):
        name = names.get(n + imported, "")
        if name.startswith("__wbindgen_describe"):
            continue  # type descriptors that wasm-bindgen reads and removes
        per[crate_of(name)] += size
    code = sum(per.values())
    print(f"{path}: {len(data):,} bytes; code {code:,}, data {data_bytes:,}")
    if not names:
        print("  (no name section: cannot split code by crate)")
        return
    for crate, size in per.most_common(top):
        print(f"  {crate:<32} {size:>10,}  {100 * size / code:5.1f}% of code")


if __name__ == "__main__":
    main()
