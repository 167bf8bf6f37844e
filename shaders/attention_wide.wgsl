// Fused scaled-dot-product attention for CPU adapters with subgroups of 8 lanes
// (lavapipe): f16 q, k and v, or f32 with wide loads, whose head dim D is a multiple of 8,
// at most 128 (each load brings 8 values: `ld8_q` and co. are generated). The two
// products of attention run as the wide matmul runs one (`wide.wgsl`), with the online
// softmax between them, all in registers.
// A workgroup is one subgroup of 8 lanes and owns TM queries (TM / 8 groups of 8 rows) of
// one (batch, head). It walks the keys in blocks of 64, lane l owning keys 8l .. 8l + 7:
// 1. scores S[TM, 64] = q k^T, the wide matmul's B^T product: per k-step of 8, each group's
//    q rows loaded once (lane l loads row l) and shared by shuffles, and the lane's 8 key
//    rows transposed;
// 2. per row, the online softmax: scale and masks, the block's max across the lanes
//    (`subgroupMax`), the output and this lane's partial sum rescaled where it rose;
// 3. out[TM, D] += P V, where lane l owns the output columns 8l .. 8l + 7 (and, past 64,
//    64 + 8l .. 64 + 8l + 7): the k-step over lane t's 8 keys takes every row's weights
//    from lane t by shuffles and 8 rows of V.
// Lavapipe runs each storage load as a loop over the SIMD lanes; here each load brings 8
// values that feed 8 rows by 8 columns of FMAs, as in the wide matmul. The lanes' partial
// sums are added once, at the end (`subgroupAdd`).
// Masked scores are -1e30 (a fully masked row averages its values, as the composite does);
// keys past S score -inf and weigh 0.
// meta: as `attention.wgsl`. The header defines D, TM, CAUSAL, HAS_BIAS, BIAS_ROWS (the
// bias varies over queries), ld8_q/ld8_k/ld8_v(i) (the i-th 8 values), ld_bias(i),
// bias_head_offset and store4(base, c, values).

// Keys per block: 8 per lane.
const KB: u32 = 64u;
// Blocks of 8 output columns per lane: one, or two past 64.
const OCTS: u32 = (D + 63u) / 64u;

// The running max and this lane's partial sum of each row of a group of 8.
struct Stats8 {
    r0: vec2<f32>, r1: vec2<f32>, r2: vec2<f32>, r3: vec2<f32>,
    r4: vec2<f32>, r5: vec2<f32>, r6: vec2<f32>, r7: vec2<f32>,
}

// One row after its softmax step: its weights, its state, and the factor that rescales
// its output.
struct Soft {
    p: Oct,
    st: vec2<f32>,
    corr: f32,
}

var<private> T: u32;
var<private> S: u32;
// (batch, head), and this lane's first block of 8 output columns, 8 own .. 8 own + 7.
var<private> bh: u32;
var<private> own: u32;
// This lane's first key of the block.
var<private> key0: u32;
// The bias of this (batch, head), its strides over queries and keys, and the lane's 8
// bias values of the block when they do not vary over queries.
var<private> boff: u32;
var<private> bq: u32;
var<private> bs: u32;
var<private> bias_block: Oct;

fn fresh() -> Stats8 {
    let z = vec2<f32>(-3.0e38, 0.0);
    return Stats8(z, z, z, z, z, z, z, z);
}

// The bias of query i at the lane's 8 keys (clamped to S - 1: those past S are masked).
fn bias8(i: u32) -> Oct {
    let b = boff + i * bq;
    let l = S - 1u;
    return Oct(
        vec4<f32>(ld_bias(b + min(key0, l) * bs), ld_bias(b + min(key0 + 1u, l) * bs),
            ld_bias(b + min(key0 + 2u, l) * bs), ld_bias(b + min(key0 + 3u, l) * bs)),
        vec4<f32>(ld_bias(b + min(key0 + 4u, l) * bs), ld_bias(b + min(key0 + 5u, l) * bs),
            ld_bias(b + min(key0 + 6u, l) * bs), ld_bias(b + min(key0 + 7u, l) * bs)),
    );
}

// Four scores of query i at keys `k`: scaled, biased and masked.
fn masked(x: vec4<f32>, i: u32, k: vec4<u32>, b: vec4<f32>) -> vec4<f32> {
    var v = x * inverseSqrt(f32(D)) + b;
    if (CAUSAL) {
        // Keys a causal query may see: j <= i + S - T (queries aligned with the end).
        let last = i32(i) + i32(S) - i32(T);
        v = select(v, vec4<f32>(-1.0e30), vec4<i32>(k) > vec4<i32>(last));
    }
    // Keys past S weigh 0 even in a row whose every score is -inf (its running max is
    // still -3e38 there).
    var ninf = 0xff800000u;
    return select(v, vec4<f32>(bitcast<f32>(ninf)), k >= vec4<u32>(S));
}

// The softmax step of query i (clamped) whose lane's 8 scores are `s`.
fn soft_row(s: Oct, st: vec2<f32>, row: u32) -> Soft {
    let i = min(row, T - 1u);
    var b = bias_block;
    if (BIAS_ROWS) {
        b = bias8(i);
    }
    let k = vec4<u32>(key0) + vec4<u32>(0u, 1u, 2u, 3u);
    let lo = masked(s.lo, i, k, b.lo);
    let hi = masked(s.hi, i, k + vec4<u32>(4u), b.hi);
    let q = max(lo, hi);
    let nm = max(st.x, subgroupMax(max(max(q.x, q.y), max(q.z, q.w))));
    let corr = exp(st.x - nm);
    let p = Oct(exp(lo - vec4<f32>(nm)), exp(hi - vec4<f32>(nm)));
    let u = p.lo + p.hi;
    return Soft(p, vec2<f32>(nm, st.y * corr + (u.x + u.y) + (u.z + u.w)), corr);
}

// The softmax step of rows i0 .. i0 + 7: their scores in `s` become weights, and their
// outputs (`o`, and `o2` past 64 columns) are rescaled.
fn soft_group(s: ptr<function, Rows8>, o: ptr<function, Rows8>, o2: ptr<function, Rows8>, st: ptr<function, Stats8>, i0: u32) {
    var r: Soft;
    r = soft_row(Oct((*s).a0, (*s).d0), (*st).r0, i0);
    (*s).a0 = r.p.lo; (*s).d0 = r.p.hi; (*st).r0 = r.st; (*o).a0 *= r.corr; (*o).d0 *= r.corr;
    if (OCTS > 1u) { (*o2).a0 *= r.corr; (*o2).d0 *= r.corr; }
    r = soft_row(Oct((*s).a1, (*s).d1), (*st).r1, i0 + 1u);
    (*s).a1 = r.p.lo; (*s).d1 = r.p.hi; (*st).r1 = r.st; (*o).a1 *= r.corr; (*o).d1 *= r.corr;
    if (OCTS > 1u) { (*o2).a1 *= r.corr; (*o2).d1 *= r.corr; }
    r = soft_row(Oct((*s).a2, (*s).d2), (*st).r2, i0 + 2u);
    (*s).a2 = r.p.lo; (*s).d2 = r.p.hi; (*st).r2 = r.st; (*o).a2 *= r.corr; (*o).d2 *= r.corr;
    if (OCTS > 1u) { (*o2).a2 *= r.corr; (*o2).d2 *= r.corr; }
    r = soft_row(Oct((*s).a3, (*s).d3), (*st).r3, i0 + 3u);
    (*s).a3 = r.p.lo; (*s).d3 = r.p.hi; (*st).r3 = r.st; (*o).a3 *= r.corr; (*o).d3 *= r.corr;
    if (OCTS > 1u) { (*o2).a3 *= r.corr; (*o2).d3 *= r.corr; }
    r = soft_row(Oct((*s).a4, (*s).d4), (*st).r4, i0 + 4u);
    (*s).a4 = r.p.lo; (*s).d4 = r.p.hi; (*st).r4 = r.st; (*o).a4 *= r.corr; (*o).d4 *= r.corr;
    if (OCTS > 1u) { (*o2).a4 *= r.corr; (*o2).d4 *= r.corr; }
    r = soft_row(Oct((*s).a5, (*s).d5), (*st).r5, i0 + 5u);
    (*s).a5 = r.p.lo; (*s).d5 = r.p.hi; (*st).r5 = r.st; (*o).a5 *= r.corr; (*o).d5 *= r.corr;
    if (OCTS > 1u) { (*o2).a5 *= r.corr; (*o2).d5 *= r.corr; }
    r = soft_row(Oct((*s).a6, (*s).d6), (*st).r6, i0 + 6u);
    (*s).a6 = r.p.lo; (*s).d6 = r.p.hi; (*st).r6 = r.st; (*o).a6 *= r.corr; (*o).d6 *= r.corr;
    if (OCTS > 1u) { (*o2).a6 *= r.corr; (*o2).d6 *= r.corr; }
    r = soft_row(Oct((*s).a7, (*s).d7), (*st).r7, i0 + 7u);
    (*s).a7 = r.p.lo; (*s).d7 = r.p.hi; (*st).r7 = r.st; (*o).a7 *= r.corr; (*o).d7 *= r.corr;
    if (OCTS > 1u) { (*o2).a7 *= r.corr; (*o2).d7 *= r.corr; }
}

// Row r's weights of lane t's 8 keys.
fn from_lane(lo: vec4<f32>, hi: vec4<f32>, t: u32) -> Oct {
    return Oct(subgroupShuffle(lo, t), subgroupShuffle(hi, t));
}

// out += P V for a group of 8 rows over lane t's 8 keys, whose rows of V are in `s`.
fn pv_group(o: ptr<function, Rows8>, p: ptr<function, Rows8>, t: u32, s: Step) {
    var x = from_lane((*p).a0, (*p).d0, t);
    (*o).a0 = row_lo((*o).a0, x, s); (*o).d0 = row_hi((*o).d0, x, s);
    x = from_lane((*p).a1, (*p).d1, t);
    (*o).a1 = row_lo((*o).a1, x, s); (*o).d1 = row_hi((*o).d1, x, s);
    x = from_lane((*p).a2, (*p).d2, t);
    (*o).a2 = row_lo((*o).a2, x, s); (*o).d2 = row_hi((*o).d2, x, s);
    x = from_lane((*p).a3, (*p).d3, t);
    (*o).a3 = row_lo((*o).a3, x, s); (*o).d3 = row_hi((*o).d3, x, s);
    x = from_lane((*p).a4, (*p).d4, t);
    (*o).a4 = row_lo((*o).a4, x, s); (*o).d4 = row_hi((*o).d4, x, s);
    x = from_lane((*p).a5, (*p).d5, t);
    (*o).a5 = row_lo((*o).a5, x, s); (*o).d5 = row_hi((*o).d5, x, s);
    x = from_lane((*p).a6, (*p).d6, t);
    (*o).a6 = row_lo((*o).a6, x, s); (*o).d6 = row_hi((*o).d6, x, s);
    x = from_lane((*p).a7, (*p).d7, t);
    (*o).a7 = row_lo((*o).a7, x, s); (*o).d7 = row_hi((*o).d7, x, s);
}

// Query i's output: this lane's 8 columns of block c over the sum of every lane's weights.
fn store_row8(i: u32, lo: vec4<f32>, hi: vec4<f32>, st: vec2<f32>, c: u32) {
    // No keys: zeros, as the composition gives, not 0 / 0. (A row whose every score is
    // -inf sums to 0 too, and is NaN, as in the composition and the reference.)
    let l = subgroupAdd(st.y);
    let r = select(0.0, 1.0 / l, l > 0.0 || S > 0u);
    if (i < T && c < D / 8u) {
        let base = (bh * T + i) * D;
        store4(base, 2u * c, lo * r);
        store4(base, 2u * c + 1u, hi * r);
    }
}

fn store_group(i0: u32, o: Rows8, st: Stats8, c: u32) {
    store_row8(i0, o.a0, o.d0, st.r0, c); store_row8(i0 + 1u, o.a1, o.d1, st.r1, c);
    store_row8(i0 + 2u, o.a2, o.d2, st.r2, c); store_row8(i0 + 3u, o.a3, o.d3, st.r3, c);
    store_row8(i0 + 4u, o.a4, o.d4, st.r4, c); store_row8(i0 + 5u, o.a5, o.d5, st.r5, c);
    store_row8(i0 + 6u, o.a6, o.d6, st.r6, c); store_row8(i0 + 7u, o.a7, o.d7, st.r7, c);
}

// The 8 rows of V from key j (clamped) at this lane's columns block `col`.
fn v_step(kb: u32, j: u32, col: u32) -> Step {
    let l = S - 1u;
    let D8 = D / 8u;
    return step_of_rows(ld8_v(kb + j * D8 + col), ld8_v(kb + min(j + 1u, l) * D8 + col), ld8_v(kb + min(j + 2u, l) * D8 + col),
        ld8_v(kb + min(j + 3u, l) * D8 + col), ld8_v(kb + min(j + 4u, l) * D8 + col),
        ld8_v(kb + min(j + 5u, l) * D8 + col), ld8_v(kb + min(j + 6u, l) * D8 + col),
        ld8_v(kb + min(j + 7u, l) * D8 + col));
}

@compute @workgroup_size(8, 1, 1)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    T = m(0u);
    S = m(1u);
    let nb = m(3u);
    bh = wid.y + wid.z * nwg.y;
    own = sl % 8u;
    let row0 = wid.x * TM;
    if (HAS_BIAS) {
        boff = bias_head_offset(bh, nb);
        bq = m(4u + nb * 2u);
        bs = m(5u + nb * 2u);
    }
    // Rows and positions in units of 8 values (D % 8 == 0).
    let D8 = D / 8u;
    // This lane's q loads: row row0 + 8 g + own of each group g (clamped).
    var rq: array<u32, 8>;
    for (var g = 0u; g < 8u; g = g + 1u) {
        rq[g] = (bh * T + min(row0 + 8u * g + own, max(T, 1u) - 1u)) * D8;
    }
    let kb = bh * S * D8;
    let col = min(own, D8 - 1u);
    let col2 = min(own + 8u, D8 - 1u);
    var o0: Rows8; var o1: Rows8; var o2: Rows8; var o3: Rows8;
    var w0: Rows8; var w1: Rows8; var w2: Rows8; var w3: Rows8;
    var st0 = fresh(); var st1 = fresh(); var st2 = fresh(); var st3 = fresh();
    // A runtime trip count: the key loop stays a loop (compile time on CPU drivers).
    for (var j0 = 0u; j0 < S; j0 = j0 + KB) {
        key0 = j0 + 8u * own;
        // This lane's 8 key rows (clamped).
        var kr: array<u32, 8>;
        for (var u = 0u; u < 8u; u = u + 1u) {
            kr[u] = kb + min(key0 + u, S - 1u) * D8;
        }
        var s0: Rows8; var s1: Rows8; var s2: Rows8; var s3: Rows8;
        for (var k8 = 0u; k8 < D8; k8 = k8 + 1u) {
            let s = transposed(ld8_k(kr[0] + k8), ld8_k(kr[1] + k8), ld8_k(kr[2] + k8), ld8_k(kr[3] + k8),
                ld8_k(kr[4] + k8), ld8_k(kr[5] + k8), ld8_k(kr[6] + k8), ld8_k(kr[7] + k8));
            group_step(&s0, ld8_q(rq[0] + k8), s);
            if (TM > 8u) { group_step(&s1, ld8_q(rq[1] + k8), s); }
            if (TM > 16u) { group_step(&s2, ld8_q(rq[2] + k8), s); }
            if (TM > 24u) { group_step(&s3, ld8_q(rq[3] + k8), s); }
        }
        if (HAS_BIAS && !BIAS_ROWS) {
            bias_block = bias8(0u);
        }
        soft_group(&s0, &o0, &w0, &st0, row0);
        if (TM > 8u) { soft_group(&s1, &o1, &w1, &st1, row0 + 8u); }
        if (TM > 16u) { soft_group(&s2, &o2, &w2, &st2, row0 + 16u); }
        if (TM > 24u) { soft_group(&s3, &o3, &w3, &st3, row0 + 24u); }
        // Lane t's keys j0 + 8 t ..: the same for every lane, so the branch is uniform.
        for (var t = 0u; t < 8u && j0 + 8u * t < S; t = t + 1u) {
            let vs = v_step(kb, j0 + 8u * t, col);
            pv_group(&o0, &s0, t, vs);
            if (TM > 8u) { pv_group(&o1, &s1, t, vs); }
            if (TM > 16u) { pv_group(&o2, &s2, t, vs); }
            if (TM > 24u) { pv_group(&o3, &s3, t, vs); }
            if (OCTS > 1u) {
                let vs2 = v_step(kb, j0 + 8u * t, col2);
                pv_group(&w0, &s0, t, vs2);
                if (TM > 8u) { pv_group(&w1, &s1, t, vs2); }
                if (TM > 16u) { pv_group(&w2, &s2, t, vs2); }
                if (TM > 24u) { pv_group(&w3, &s3, t, vs2); }
            }
        }
    }
    store_group(row0, o0, st0, own);
    if (TM > 8u) { store_group(row0 + 8u, o1, st1, own); }
    if (TM > 16u) { store_group(row0 + 16u, o2, st2, own); }
    if (TM > 24u) { store_group(row0 + 24u, o3, st3, own); }
    if (OCTS > 1u) {
        store_group(row0, w0, st0, own + 8u);
        if (TM > 8u) { store_group(row0 + 8u, w1, st1, own + 8u); }
        if (TM > 16u) { store_group(row0 + 16u, w2, st2, own + 8u); }
        if (TM > 24u) { store_group(row0 + 24u, w3, st3, own + 8u); }
    }
}
