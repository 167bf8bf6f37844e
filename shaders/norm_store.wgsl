// `norm_rows_vec4.wgsl`'s outputs and entry point where subgroups are not used: each
// lane loads the weight's and bias's quads itself.

fn store_row(ok: bool, base: u32, D4: u32, m4: vec4<f32>, rstd: f32, own: u32) {
    if (!ok) {
        return;
    }
    for (var j = 0u; j < D4; j = j + 1u) {
        var w = vec4<f32>(1.0);
        var b = vec4<f32>(0.0);
        if (HAS_W) {
            w = ldwq(j);
        }
        if (HAS_B) {
            b = ldbq(j);
        }
        out[base + j] = affine((ld0q(base + j) - m4) * rstd, w, b);
    }
}

@compute @workgroup_size(RW, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    norm_row(gid.x + gid.y * nwg.x * RW, 0u);
}
