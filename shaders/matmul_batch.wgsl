// Shared by matmul.wgsl and matmul_direct.wgsl: where batch `z` of a product starts in
// A and B. meta [3] holds the batch rank nb, then per batch axis (outer first) its size,
// A stride and B stride (stride 0 where that operand broadcasts).
fn batch_offsets(z: u32, nb: u32) -> vec2<u32> {
    var rem = z;
    var off = vec2<u32>(0u, 0u);
    for (var d = nb; d > 0u; d = d - 1u) {
        let base = 4u + (d - 1u) * 3u;
        let size = m(base);
        let c = rem % size;
        rem = rem / size;
        off = off + c * vec2<u32>(m(base + 1u), m(base + 2u));
    }
    return off;
}
