// n / d for a divisor fixed when the kernel is built, by multiplying: `magic` and
// `shifts` come from `udiv_magic` (src/kernels/codegen.rs; Granlund and Montgomery's
// round-up method, exact for every u32 n and d >= 1). A u32 division by a value the
// compiler cannot see runs one lane at a time on CPU adapters (lavapipe, SwiftShader):
// an im2col's five index divisions took 35 ns an element on lavapipe.
fn udiv(n: u32, magic: u32, shifts: u32) -> u32 {
    // The high word of magic * n, from 16-bit halves.
    let al = magic & 0xffffu;
    let ah = magic >> 16u;
    let bl = n & 0xffffu;
    let bh = n >> 16u;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = ((al * bl) >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    let t = ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
    return (t + ((n - t) >> (shifts & 1u))) >> (shifts >> 1u);
}
