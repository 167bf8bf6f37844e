// In-place row writes (`Op::ScatterRows`): `out` is the table's own buffer [R, D];
// rows[u] of it are rewritten by the rule, one invocation per element of the [U, D]
// rows. Rows out of range are skipped; nothing is written when the gate is closed.
// meta: [0] U * D, [1] D, [2] R. The header defines `row_of(u)`, `gate_open()` and
// `new_value(i, k)` (the new value of element k of `out`, from element i of the rows).

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= m(0u) || !gate_open()) {
        return;
    }
    let d = m(1u);
    let r = row_of(i / d);
    if (r < 0 || u32(r) >= m(2u)) {
        return;
    }
    let k = u32(r) * d + i % d;
    out[k] = new_value(i, k);
}
