// Eight values per storage load (native CPU adapters): what the wide matmul
// (`matmul_direct_wide.wgsl`) and the wide attention (`attention_wide.wgsl`) share. `Oct`
// holds the 8 values of one load as two vec4s: `oct` (`oct.wgsl`) unpacks f32 operands
// bound as `array<vec4<u64>>` (`ShaderCaps::wide_loads`); the attention's f16 operands are
// `vec4<u32>` words of packed pairs. A lane owns 8 consecutive columns of a product, and a
// group of 8 rows keeps its accumulators in a struct of named vectors (a private array
// indexed by a loop would live in memory on lavapipe).

struct Oct {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// One group of 8 rows: row i's columns c0 .. c0 + 3 in a{i}, c0 + 4 .. c0 + 7 in d{i}.
struct Rows8 {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
    d0: vec4<f32>, d1: vec4<f32>, d2: vec4<f32>, d3: vec4<f32>,
    d4: vec4<f32>, d5: vec4<f32>, d6: vec4<f32>, d7: vec4<f32>,
}

// B at one k-step of 8: row kk's 8 columns in b{kk} (low 4) and e{kk} (high 4).
struct Step {
    b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>,
    b4: vec4<f32>, b5: vec4<f32>, b6: vec4<f32>, b7: vec4<f32>,
    e0: vec4<f32>, e1: vec4<f32>, e2: vec4<f32>, e3: vec4<f32>,
    e4: vec4<f32>, e5: vec4<f32>, e6: vec4<f32>, e7: vec4<f32>,
}

// acc += sum over kk of a[kk] * B[kk] for one row: `x` holds the row's 8 k-values. The
// eight products are summed as a tree and added to `acc` once: lavapipe has no fused
// multiply-add, so a chain of eight `fma`s is eight dependent adds per accumulator and
// k-step, and that latency, not the adds' count, bounded the product (kernel lab,
// MiniLM's FFN-up on a 2-core Zen 3: the tree won 16 of 19 alternating rounds).
fn row_lo(acc: vec4<f32>, x: Oct, s: Step) -> vec4<f32> {
    let p01 = fma(vec4<f32>(x.lo.y), s.b1, vec4<f32>(x.lo.x) * s.b0);
    let p23 = fma(vec4<f32>(x.lo.w), s.b3, vec4<f32>(x.lo.z) * s.b2);
    let p45 = fma(vec4<f32>(x.hi.y), s.b5, vec4<f32>(x.hi.x) * s.b4);
    let p67 = fma(vec4<f32>(x.hi.w), s.b7, vec4<f32>(x.hi.z) * s.b6);
    return acc + ((p01 + p23) + (p45 + p67));
}

fn row_hi(acc: vec4<f32>, x: Oct, s: Step) -> vec4<f32> {
    let p01 = fma(vec4<f32>(x.lo.y), s.e1, vec4<f32>(x.lo.x) * s.e0);
    let p23 = fma(vec4<f32>(x.lo.w), s.e3, vec4<f32>(x.lo.z) * s.e2);
    let p45 = fma(vec4<f32>(x.hi.y), s.e5, vec4<f32>(x.hi.x) * s.e4);
    let p67 = fma(vec4<f32>(x.hi.w), s.e7, vec4<f32>(x.hi.z) * s.e6);
    return acc + ((p01 + p23) + (p45 + p67));
}

// Row l of the group from lane l's load.
fn lane_row(x: Oct, l: u32) -> Oct {
    return Oct(subgroupShuffle(x.lo, l), subgroupShuffle(x.hi, l));
}

// One k-step for a group of 8 rows whose A values lane l loaded (row l) in `x`.
fn group_step(g: ptr<function, Rows8>, x: Oct, s: Step) {
    var r = lane_row(x, 0u);
    (*g).a0 = row_lo((*g).a0, r, s); (*g).d0 = row_hi((*g).d0, r, s);
    r = lane_row(x, 1u);
    (*g).a1 = row_lo((*g).a1, r, s); (*g).d1 = row_hi((*g).d1, r, s);
    r = lane_row(x, 2u);
    (*g).a2 = row_lo((*g).a2, r, s); (*g).d2 = row_hi((*g).d2, r, s);
    r = lane_row(x, 3u);
    (*g).a3 = row_lo((*g).a3, r, s); (*g).d3 = row_hi((*g).d3, r, s);
    r = lane_row(x, 4u);
    (*g).a4 = row_lo((*g).a4, r, s); (*g).d4 = row_hi((*g).d4, r, s);
    r = lane_row(x, 5u);
    (*g).a5 = row_lo((*g).a5, r, s); (*g).d5 = row_hi((*g).d5, r, s);
    r = lane_row(x, 6u);
    (*g).a6 = row_lo((*g).a6, r, s); (*g).d6 = row_hi((*g).d6, r, s);
    r = lane_row(x, 7u);
    (*g).a7 = row_lo((*g).a7, r, s); (*g).d7 = row_hi((*g).d7, r, s);
}

// The k-step of a B given as rows of 8 columns: t{kk} holds row kk.
fn step_of_rows(t0: Oct, t1: Oct, t2: Oct, t3: Oct, t4: Oct, t5: Oct, t6: Oct, t7: Oct) -> Step {
    return Step(t0.lo, t1.lo, t2.lo, t3.lo, t4.lo, t5.lo, t6.lo, t7.lo,
        t0.hi, t1.hi, t2.hi, t3.hi, t4.hi, t5.hi, t6.hi, t7.hi);
}

// The k-step of a B given as B^T (rows of 8 k-values, one per column): t{j} holds
// column j's 8 k-values; row kk of the step is their kk-th values.
fn transposed(t0: Oct, t1: Oct, t2: Oct, t3: Oct, t4: Oct, t5: Oct, t6: Oct, t7: Oct) -> Step {
    var s: Step;
    s.b0 = vec4<f32>(t0.lo.x, t1.lo.x, t2.lo.x, t3.lo.x); s.e0 = vec4<f32>(t4.lo.x, t5.lo.x, t6.lo.x, t7.lo.x);
    s.b1 = vec4<f32>(t0.lo.y, t1.lo.y, t2.lo.y, t3.lo.y); s.e1 = vec4<f32>(t4.lo.y, t5.lo.y, t6.lo.y, t7.lo.y);
    s.b2 = vec4<f32>(t0.lo.z, t1.lo.z, t2.lo.z, t3.lo.z); s.e2 = vec4<f32>(t4.lo.z, t5.lo.z, t6.lo.z, t7.lo.z);
    s.b3 = vec4<f32>(t0.lo.w, t1.lo.w, t2.lo.w, t3.lo.w); s.e3 = vec4<f32>(t4.lo.w, t5.lo.w, t6.lo.w, t7.lo.w);
    s.b4 = vec4<f32>(t0.hi.x, t1.hi.x, t2.hi.x, t3.hi.x); s.e4 = vec4<f32>(t4.hi.x, t5.hi.x, t6.hi.x, t7.hi.x);
    s.b5 = vec4<f32>(t0.hi.y, t1.hi.y, t2.hi.y, t3.hi.y); s.e5 = vec4<f32>(t4.hi.y, t5.hi.y, t6.hi.y, t7.hi.y);
    s.b6 = vec4<f32>(t0.hi.z, t1.hi.z, t2.hi.z, t3.hi.z); s.e6 = vec4<f32>(t4.hi.z, t5.hi.z, t6.hi.z, t7.hi.z);
    s.b7 = vec4<f32>(t0.hi.w, t1.hi.w, t2.hi.w, t3.hi.w); s.e7 = vec4<f32>(t4.hi.w, t5.hi.w, t6.hi.w, t7.hi.w);
    return s;
}
