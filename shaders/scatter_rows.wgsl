// In-place row writes (`Op::ScatterRows`): `out` is the table's own buffer [R, D];
// rows[u] of it become src[u], one invocation per element of src. Rows out of range
// are skipped. meta: [0] U * D, [1] D, [2] R. The header defines `src_value(i)` and
// `row_of(u)`.

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= m(0u)) {
        return;
    }
    let d = m(1u);
    let r = row_of(i / d);
    if (r < 0 || u32(r) >= m(2u)) {
        return;
    }
    out[u32(r) * d + i % d] = src_value(i);
}
