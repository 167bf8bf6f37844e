// `norm_rows_vec4.wgsl`'s outputs and entry point with subgroups of 8 lanes (native CPU
// adapters): per 8 quads of the row, lane `own` loads quad `own` of the weight and bias,
// and `put` takes quad t from lane t. Lavapipe runs every storage load as a loop over
// the lanes, even where all lanes read one address, so this is one such loop per 8
// quads instead of 8. Every lane runs to the end: lanes past the last row shuffle and
// store nothing.

fn put(ok: bool, i: u32, m4: vec4<f32>, rstd: f32, wl: vec4<f32>, bl: vec4<f32>, t: u32) {
    let w = subgroupShuffle(wl, t);
    let b = subgroupShuffle(bl, t);
    if (ok) {
        out[i] = affine((ld0q(i) - m4) * rstd, w, b);
    }
}

fn store_row(ok: bool, base: u32, D4: u32, m4: vec4<f32>, rstd: f32, own: u32) {
    for (var c = 0u; c < D4; c = c + 8u) {
        let jj = min(c + own, D4 - 1u);
        var wl = vec4<f32>(1.0);
        var bl = vec4<f32>(0.0);
        if (HAS_W) {
            wl = ldwq(jj);
        }
        if (HAS_B) {
            bl = ldbq(jj);
        }
        if (c + 8u <= D4) {
            put(ok, base + c, m4, rstd, wl, bl, 0u); put(ok, base + c + 1u, m4, rstd, wl, bl, 1u);
            put(ok, base + c + 2u, m4, rstd, wl, bl, 2u); put(ok, base + c + 3u, m4, rstd, wl, bl, 3u);
            put(ok, base + c + 4u, m4, rstd, wl, bl, 4u); put(ok, base + c + 5u, m4, rstd, wl, bl, 5u);
            put(ok, base + c + 6u, m4, rstd, wl, bl, 6u); put(ok, base + c + 7u, m4, rstd, wl, bl, 7u);
        } else {
            for (var t = 0u; t < D4 - c; t = t + 1u) {
                put(ok, base + c + t, m4, rstd, wl, bl, t);
            }
        }
    }
}

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32) {
    norm_row(gid.x + gid.y * nwg.x * RW, sl % 8u);
}
