// Fused scaled-dot-product attention, flash style: out = softmax(q k^T / sqrt(D) + bias,
// causal mask) v, without materialising the [T, S] scores. Each invocation owns one
// query row (q and the output row of D values live in registers) and walks the keys
// in tiles of BK with an online softmax: the running sum and output are rescaled only
// when a score raises the running max.
// Each K/V tile is loaded once per workgroup into workgroup memory and read by every
// query (broadcast reads). (CPU adapters run the unfused composition instead, which is
// faster there: see ops::nn.)
// Masked scores are -1e30 (a fully masked row averages its values, as the composite
// does).
// meta: [0] T, [1] S, [2] unused, [3] batch rank nb, per batch axis (outer first): size,
//       bias stride; then the bias strides over T and S (HAS_BIAS only).
// Inputs: q [.., T, D], k and v [.., S, D] (same batch axes, contiguous), bias
// broadcastable to [.., T, S] (additive, f32). The header defines D, BK, WQ, TILE,
// CAUSAL, HAS_BIAS, ld_q4/ld_k4/ld_v4/ld_bias and store4(base, c, values).

// Rows are held as DV = ceil(D / 4) vec4s (zero-padded); ld_q4/ld_k4/ld_v4(base, c) load
// the c-th vec4 of the row starting at element `base` (one vec4 load for 4-aligned f32).
const DV: u32 = (D + 3u) / 4u;

var<workgroup> tile_k: array<vec4<f32>, TILE>;
var<workgroup> tile_v: array<vec4<f32>, TILE>;

@compute @workgroup_size(WQ, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let T = m(0u);
    let S = m(1u);
    let nb = m(3u);
    let bh = wid.y + wid.z * nwg.y;
    let i = wid.x * WQ + lid.x;
    let iq = min(i, max(T, 1u) - 1u);
    let scale = inverseSqrt(f32(D));

    // Bias offset of this (batch, head, query) row.
    var boff = 0u;
    if (HAS_BIAS) {
        var rem = bh;
        for (var a = nb; a > 0u; a = a - 1u) {
            let base = 4u + (a - 1u) * 2u;
            let size = m(base);
            boff = boff + (rem % size) * m(base + 1u);
            rem = rem / size;
        }
        boff = boff + iq * m(4u + nb * 2u);
    }
    let bs = select(0u, m(5u + nb * 2u), HAS_BIAS);

    var q: array<vec4<f32>, DV>;
    var o: array<vec4<f32>, DV>;
    for (var c = 0u; c < DV; c = c + 1u) {
        q[c] = ld_q4((bh * T + iq) * D, c) * scale;
        o[c] = vec4<f32>(0.0);
    }
    var mx = -3.0e38;
    var l = 0.0;
    let kbase = bh * S * D;
    // Keys a causal query may see: j <= i + S - T (queries aligned with the end).
    let last = i32(iq) + i32(S) - i32(T);

    for (var j0 = 0u; j0 < S; j0 = j0 + BK) {
        // A runtime trip count: the key loop stays a loop (compile time on CPU drivers).
        let n = min(BK, S - j0);
        for (var e = lid.x; e < n * DV; e = e + WQ) {
            let row = kbase + (j0 + e / DV) * D;
            tile_k[e] = ld_k4(row, e % DV);
            tile_v[e] = ld_v4(row, e % DV);
        }
        workgroupBarrier();
        for (var jj = 0u; jj < n; jj = jj + 1u) {
            let gj = j0 + jj;
            var acc = 0.0;
            for (var c = 0u; c < DV; c = c + 1u) {
                acc = acc + dot(q[c], tile_k[jj * DV + c]);
            }
            if (HAS_BIAS) {
                acc = acc + ld_bias(boff + gj * bs);
            }
            if (CAUSAL && i32(gj) > last) {
                acc = -1.0e30;
            }
            // Online softmax: rescale only when the running max grows.
            if (acc > mx) {
                let corr = exp(mx - acc);
                l = l * corr;
                for (var c = 0u; c < DV; c = c + 1u) {
                    o[c] = o[c] * corr;
                }
                mx = acc;
            }
            let p = exp(acc - mx);
            l = l + p;
            for (var c = 0u; c < DV; c = c + 1u) {
                o[c] = fma(vec4<f32>(p), tile_v[jj * DV + c], o[c]);
            }
        }
        workgroupBarrier();
    }
    if (i < T) {
        for (var c = 0u; c < DV; c = c + 1u) {
            store4((bh * T + i) * D, c, o[c] * (1.0 / l));
        }
    }
}
