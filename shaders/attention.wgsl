// Fused scaled-dot-product attention, flash style: out = softmax(q k^T / sqrt(D) + bias,
// causal mask) v, without materialising the [T, S] scores.
// A workgroup owns QW queries of one (batch, head); each query is shared by SPLIT
// invocations (QW * SPLIT = 64), which take interleaved keys of every tile, so a short
// sequence still fills the GPU. An invocation keeps q and its partial output row in
// registers and walks its keys in blocks of KB with an online softmax: the block's
// scores first, then one rescale of the running sum and output per block (not per key).
// K/V tiles of BK keys are loaded once per workgroup into workgroup memory. At the end
// the SPLIT partial (max, sum, row) states of a query are merged through the same
// workgroup memory, one part per round.
// Masked scores are -1e30 (a fully masked row averages its values, as the composite
// does).
// meta: [0] T, [1] S, [2] unused, [3] batch rank nb, per batch axis (outer first): size,
//       bias stride; then the bias strides over T and S (HAS_BIAS only).
// Inputs: q [.., T, D], k and v [.., S, D] (same batch axes, contiguous), bias
// broadcastable to [.., T, S] (additive, f32). The header defines D, BK, QW, SPLIT, KB,
// TILE, CAUSAL, HAS_BIAS, ld_q4/ld_k4/ld_v4/ld_bias, bias_head_offset and
// store4(base, c, values).

// Rows are held as DV = ceil(D / 4) vec4s (zero-padded); ld_q4/ld_k4/ld_v4(base, c) load
// the c-th vec4 of the row starting at element `base` (one vec4 load for 4-aligned f32).
const DV: u32 = (D + 3u) / 4u;
const WG_SIZE: u32 = QW * SPLIT;

// K rows at [0, TILE), V rows at [TILE, 2 TILE); reused to merge the partial states.
var<workgroup> kv: array<vec4<f32>, 2u * TILE>;

@compute @workgroup_size(WG_SIZE, 1, 1)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let T = m(0u);
    let S = m(1u);
    let nb = m(3u);
    let bh = wid.y + wid.z * nwg.y;
    let slot = lid.x / SPLIT;
    let part = lid.x % SPLIT;
    let i = wid.x * QW + slot;
    let iq = min(i, max(T, 1u) - 1u);
    let scale = inverseSqrt(f32(D));

    // Bias offset of this (batch, head, query) row.
    var boff = 0u;
    if (HAS_BIAS) {
        boff = bias_head_offset(bh, nb) + iq * m(4u + nb * 2u);
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
        for (var e = lid.x; e < n * DV; e = e + WG_SIZE) {
            let row = kbase + (j0 + e / DV) * D;
            kv[e] = ld_k4(row, e % DV);
            kv[TILE + e] = ld_v4(row, e % DV);
        }
        workgroupBarrier();
        // This invocation's keys of the tile: part, part + SPLIT, ..., KB at a time.
        for (var jb = part; jb < n; jb = jb + KB * SPLIT) {
            var s: array<f32, KB>;
            var bmax = mx;
            for (var u = 0u; u < KB; u = u + 1u) {
                let jj = jb + u * SPLIT;
                var acc = -3.0e38;
                if (jj < n) {
                    acc = 0.0;
                    for (var c = 0u; c < DV; c = c + 1u) {
                        acc = acc + dot(q[c], kv[jj * DV + c]);
                    }
                    let gj = j0 + jj;
                    if (HAS_BIAS) {
                        acc = acc + ld_bias(boff + gj * bs);
                    }
                    if (CAUSAL && i32(gj) > last) {
                        acc = -1.0e30;
                    }
                }
                s[u] = acc;
                bmax = max(bmax, acc);
            }
            // One rescale per block, where the block raised the running max.
            if (bmax > mx) {
                let corr = exp(mx - bmax);
                l = l * corr;
                for (var c = 0u; c < DV; c = c + 1u) {
                    o[c] = o[c] * corr;
                }
                mx = bmax;
            }
            for (var u = 0u; u < KB; u = u + 1u) {
                let jj = jb + u * SPLIT;
                if (jj < n) {
                    let p = exp(s[u] - mx);
                    l = l + p;
                    for (var c = 0u; c < DV; c = c + 1u) {
                        o[c] = fma(vec4<f32>(p), kv[TILE + jj * DV + c], o[c]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    // Merge the SPLIT partial states of each query into part 0: part r publishes its
    // max, sum and row (QW * (DV + 1) vec4s); part 0 folds it in.
    for (var r = 1u; r < SPLIT; r = r + 1u) {
        let at = slot * (DV + 1u);
        if (part == r) {
            kv[at] = vec4<f32>(mx, l, 0.0, 0.0);
            for (var c = 0u; c < DV; c = c + 1u) {
                kv[at + 1u + c] = o[c];
            }
        }
        workgroupBarrier();
        if (part == 0u) {
            let st = kv[at];
            let m2 = max(mx, st.x);
            let c1 = exp(mx - m2);
            let c2 = exp(st.x - m2);
            l = l * c1 + st.y * c2;
            for (var c = 0u; c < DV; c = c + 1u) {
                o[c] = o[c] * c1 + kv[at + 1u + c] * c2;
            }
            mx = m2;
        }
        workgroupBarrier();
    }
    if (part == 0u && i < T) {
        for (var c = 0u; c < DV; c = c + 1u) {
            store4((bh * T + i) * D, c, o[c] * (1.0 / l));
        }
    }
}
