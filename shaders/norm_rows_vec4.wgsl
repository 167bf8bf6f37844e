// `norm_rows.wgsl` for rows whose length is a multiple of 4, read and written a quad
// (vec4) at a time: lavapipe pays for a storage access per lane, almost as much for a
// scalar as for a vec4, so quads cost about a quarter as much per value. Two passes
// over the row: the sums of `x - k` and of its squares, `k` the row's first value (so
// that E[c²] - E[c]² keeps its accuracy when the mean is large against the spread;
// RMS norm takes k = 0), then the outputs. meta: [0] D, [1] rows, [2] eps (f32 bits).
// The header defines RW, RMS, HAS_W, HAS_B and the quad loads `ld0q`, `ldwq` and
// `ldbq`; `out` holds vec4s. The outputs (`store_row`) and the entry point come after
// this file: `norm_store.wgsl`, or with subgroups of 8 lanes `norm_store_subgroup.wgsl`.

fn affine(y: vec4<f32>, w: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    var r = y;
    if (HAS_W) {
        r = r * w;
    }
    if (HAS_B) {
        r = r + b;
    }
    return r;
}

// Normalise row `row` (clamped to the last; only rows below m(1) are stored), as lane
// `own` of its subgroup.
fn norm_row(row: u32, own: u32) {
    let D = m(0u);
    let D4 = D / 4u;
    let rows = m(1u);
    let eps = bitcast<f32>(m(2u));
    let base = min(row, max(rows, 1u) - 1u) * D4;
    var k = 0.0;
    if (!RMS && D4 > 0u) {
        k = ld0q(base).x;
    }
    let k4 = vec4<f32>(k);
    var s = vec4<f32>(0.0);
    var q = vec4<f32>(0.0);
    for (var j = 0u; j < D4; j = j + 1u) {
        let c = ld0q(base + j) - k4;
        s = s + c;
        q = q + c * c;
    }
    let n = f32(D);
    let mc = ((s.x + s.y) + (s.z + s.w)) / n;
    let ms = ((q.x + q.y) + (q.z + q.w)) / n;
    var mean = 0.0;
    var v = ms;
    if (!RMS) {
        mean = k + mc;
        v = max(ms - mc * mc, 0.0);
    }
    store_row(row < rows, base, D4, vec4<f32>(mean), inverseSqrt(v + eps), own);
}
