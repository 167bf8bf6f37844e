// The direct vec4 matmul of `matmul_direct_vec4.wgsl` with A loaded once per subgroup,
// for adapters with subgroup operations whose every subgroup has at least 8 lanes
// (lavapipe on AVX2). On lavapipe every storage load runs as a loop over the SIMD lanes,
// and that loop, not arithmetic, bounds a matmul. A workgroup owns TM whole rows of C
// (TM = 1, 2 or 4, or a multiple of 8 up to 64), so every lane needs the same A values: in each group of
// 8 rows, lane l loads one vec4 (row l's 4 k-values, or for A stored [K, M] the 4 rows of
// quad l / 4 at k-offset l % 4) and every lane takes the rows with `subgroupShuffle`. A
// k-step then costs 4 load loops for B and one per 8 rows for A, where the kernel without
// subgroups spends one per row. Each of the LANES lanes owns 4 consecutive columns;
// K advances 4 at a time (K % 4 == 0).
// The 64 accumulators are named variables, not an array: the row code is unrolled by
// hand because lavapipe keeps a private array that a loop indexes in memory.
// (lavapipe, 1024^3 f32: about 3.5x the kernel without subgroups.)
// Every lane runs the same trip count and all loads are clamped, so each shuffle happens
// in uniform control flow with the whole subgroup active.

// One k-step of one row: acc += a.x B[k] + a.y B[k+1] + a.z B[k+2] + a.w B[k+3].
fn step(acc: vec4<f32>, a: vec4<f32>, b: array<vec4<f32>, 4>) -> vec4<f32> {
    var s = fma(vec4<f32>(a.x), b[0], acc);
    s = fma(vec4<f32>(a.y), b[1], s);
    s = fma(vec4<f32>(a.z), b[2], s);
    return fma(vec4<f32>(a.w), b[3], s);
}

// The 8 rows of a row group at this k-step (each a vec4 over k) from the lanes' loads.
fn rows8(av: vec4<f32>) -> array<vec4<f32>, 8> {
    var r: array<vec4<f32>, 8>;
    if (TRANS_A) {
        // Lane 4q + kk holds rows 4q .. 4q + 3 at k-offset kk.
        for (var q = 0u; q < 2u; q = q + 1u) {
            let t0 = subgroupShuffle(av, 4u * q);
            let t1 = subgroupShuffle(av, 4u * q + 1u);
            let t2 = subgroupShuffle(av, 4u * q + 2u);
            let t3 = subgroupShuffle(av, 4u * q + 3u);
            r[4u * q] = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
            r[4u * q + 1u] = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
            r[4u * q + 2u] = vec4<f32>(t0.z, t1.z, t2.z, t3.z);
            r[4u * q + 3u] = vec4<f32>(t0.w, t1.w, t2.w, t3.w);
        }
    } else {
        for (var i = 0u; i < 8u; i = i + 1u) {
            r[i] = subgroupShuffle(av, i);
        }
    }
    return r;
}

@compute @workgroup_size(LANES, 1, 1)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_invocation_id) sl: u32,
) {
    M = m(0u);
    N = m(1u);
    let K = m(2u);
    let nb = m(3u);
    let offs = batch_offsets(wid.z, nb);
    // Batch offsets and row strides are multiples of 4 (checked by the renderer).
    let off_a = offs.x / 4u;
    let off_b = offs.y / 4u;
    row0 = wid.y * BM;
    c0 = wid.x * BN + lid.x * 4u;
    off_c = wid.z * M * N;
    if (M == 0u || N == 0u) {
        return;
    }
    let K4 = K / 4u;
    let M4 = M / 4u;
    let N4 = N / 4u;

    // Where this lane's A loads start, one per row group g: row row0 + 8g + l, or (A
    // stored [K, M], rows in quads) quad (row0 + 8g) / 4 + l / 4 at k-offset l % 4.
    let own = sl % 8u;
    var ra: array<u32, 8>;
    for (var g = 0u; g < 8u; g = g + 1u) {
        if (TRANS_A) {
            ra[g] = off_a + min((row0 + 8u * g) / 4u + own / 4u, M4 - 1u) + (own % 4u) * M4;
        } else {
            ra[g] = off_a + min(row0 + 8u * g + own, M - 1u) * K4;
        }
    }
    var cb: array<u32, 4>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        if (TRANS_B) {
            cb[j] = off_b + min(c0 + j, N - 1u) * K4;
        } else {
            cb[j] = off_b + min(c0 / 4u, N4 - 1u);
        }
    }

    let z = vec4<f32>(0.0);
    var acc0 = z; var acc1 = z; var acc2 = z; var acc3 = z; var acc4 = z; var acc5 = z; var acc6 = z; var acc7 = z;
    var acc8 = z; var acc9 = z; var acc10 = z; var acc11 = z; var acc12 = z; var acc13 = z; var acc14 = z; var acc15 = z;
    var acc16 = z; var acc17 = z; var acc18 = z; var acc19 = z; var acc20 = z; var acc21 = z; var acc22 = z; var acc23 = z;
    var acc24 = z; var acc25 = z; var acc26 = z; var acc27 = z; var acc28 = z; var acc29 = z; var acc30 = z; var acc31 = z;
    var acc32 = z; var acc33 = z; var acc34 = z; var acc35 = z; var acc36 = z; var acc37 = z; var acc38 = z; var acc39 = z;
    var acc40 = z; var acc41 = z; var acc42 = z; var acc43 = z; var acc44 = z; var acc45 = z; var acc46 = z; var acc47 = z;
    var acc48 = z; var acc49 = z; var acc50 = z; var acc51 = z; var acc52 = z; var acc53 = z; var acc54 = z; var acc55 = z;
    var acc56 = z; var acc57 = z; var acc58 = z; var acc59 = z; var acc60 = z; var acc61 = z; var acc62 = z; var acc63 = z;
    for (var k4 = 0u; k4 < K4; k4 = k4 + 1u) {
        // b[kk] = B[4 k4 + kk, c0 .. c0 + 3]
        var b: array<vec4<f32>, 4>;
        if (TRANS_B) {
            let t0 = ld4_b(cb[0] + k4);
            let t1 = ld4_b(cb[1] + k4);
            let t2 = ld4_b(cb[2] + k4);
            let t3 = ld4_b(cb[3] + k4);
            b[0] = vec4<f32>(t0.x, t1.x, t2.x, t3.x);
            b[1] = vec4<f32>(t0.y, t1.y, t2.y, t3.y);
            b[2] = vec4<f32>(t0.z, t1.z, t2.z, t3.z);
            b[3] = vec4<f32>(t0.w, t1.w, t2.w, t3.w);
        } else {
            for (var kk = 0u; kk < 4u; kk = kk + 1u) {
                b[kk] = ld4_b(cb[0] + (4u * k4 + kk) * N4);
            }
        }
        // A at this k-step: vec4 k4 of a row, or k-row 4 k4 + l % 4 of a quad.
        let ka = select(k4, 4u * k4 * M4, TRANS_A);
        {
            let a = rows8(ld4_a(ra[0] + ka));
            acc0 = step(acc0, a[0], b);
            if (TM > 1u) { acc1 = step(acc1, a[1], b); }
            if (TM > 2u) { acc2 = step(acc2, a[2], b); acc3 = step(acc3, a[3], b); }
            if (TM > 4u) {
                acc4 = step(acc4, a[4], b); acc5 = step(acc5, a[5], b);
                acc6 = step(acc6, a[6], b); acc7 = step(acc7, a[7], b);
            }
        }
        if (TM > 8u) {
            let a = rows8(ld4_a(ra[1] + ka));
            acc8 = step(acc8, a[0], b); acc9 = step(acc9, a[1], b); acc10 = step(acc10, a[2], b); acc11 = step(acc11, a[3], b);
            acc12 = step(acc12, a[4], b); acc13 = step(acc13, a[5], b); acc14 = step(acc14, a[6], b); acc15 = step(acc15, a[7], b);
        }
        if (TM > 16u) {
            let a = rows8(ld4_a(ra[2] + ka));
            acc16 = step(acc16, a[0], b); acc17 = step(acc17, a[1], b); acc18 = step(acc18, a[2], b); acc19 = step(acc19, a[3], b);
            acc20 = step(acc20, a[4], b); acc21 = step(acc21, a[5], b); acc22 = step(acc22, a[6], b); acc23 = step(acc23, a[7], b);
        }
        if (TM > 24u) {
            let a = rows8(ld4_a(ra[3] + ka));
            acc24 = step(acc24, a[0], b); acc25 = step(acc25, a[1], b); acc26 = step(acc26, a[2], b); acc27 = step(acc27, a[3], b);
            acc28 = step(acc28, a[4], b); acc29 = step(acc29, a[5], b); acc30 = step(acc30, a[6], b); acc31 = step(acc31, a[7], b);
        }
        if (TM > 32u) {
            let a = rows8(ld4_a(ra[4] + ka));
            acc32 = step(acc32, a[0], b); acc33 = step(acc33, a[1], b); acc34 = step(acc34, a[2], b); acc35 = step(acc35, a[3], b);
            acc36 = step(acc36, a[4], b); acc37 = step(acc37, a[5], b); acc38 = step(acc38, a[6], b); acc39 = step(acc39, a[7], b);
        }
        if (TM > 40u) {
            let a = rows8(ld4_a(ra[5] + ka));
            acc40 = step(acc40, a[0], b); acc41 = step(acc41, a[1], b); acc42 = step(acc42, a[2], b); acc43 = step(acc43, a[3], b);
            acc44 = step(acc44, a[4], b); acc45 = step(acc45, a[5], b); acc46 = step(acc46, a[6], b); acc47 = step(acc47, a[7], b);
        }
        if (TM > 48u) {
            let a = rows8(ld4_a(ra[6] + ka));
            acc48 = step(acc48, a[0], b); acc49 = step(acc49, a[1], b); acc50 = step(acc50, a[2], b); acc51 = step(acc51, a[3], b);
            acc52 = step(acc52, a[4], b); acc53 = step(acc53, a[5], b); acc54 = step(acc54, a[6], b); acc55 = step(acc55, a[7], b);
        }
        if (TM > 56u) {
            let a = rows8(ld4_a(ra[7] + ka));
            acc56 = step(acc56, a[0], b); acc57 = step(acc57, a[1], b); acc58 = step(acc58, a[2], b); acc59 = step(acc59, a[3], b);
            acc60 = step(acc60, a[4], b); acc61 = step(acc61, a[5], b); acc62 = step(acc62, a[6], b); acc63 = step(acc63, a[7], b);
        }
    }

    store_row(0u, acc0); store_row(1u, acc1); store_row(2u, acc2); store_row(3u, acc3);
    store_row(4u, acc4); store_row(5u, acc5); store_row(6u, acc6); store_row(7u, acc7);
    if (TM > 8u) {
        store_row(8u, acc8); store_row(9u, acc9); store_row(10u, acc10); store_row(11u, acc11);
        store_row(12u, acc12); store_row(13u, acc13); store_row(14u, acc14); store_row(15u, acc15);
    }
    if (TM > 16u) {
        store_row(16u, acc16); store_row(17u, acc17); store_row(18u, acc18); store_row(19u, acc19);
        store_row(20u, acc20); store_row(21u, acc21); store_row(22u, acc22); store_row(23u, acc23);
    }
    if (TM > 24u) {
        store_row(24u, acc24); store_row(25u, acc25); store_row(26u, acc26); store_row(27u, acc27);
        store_row(28u, acc28); store_row(29u, acc29); store_row(30u, acc30); store_row(31u, acc31);
    }
    if (TM > 32u) {
        store_row(32u, acc32); store_row(33u, acc33); store_row(34u, acc34); store_row(35u, acc35);
        store_row(36u, acc36); store_row(37u, acc37); store_row(38u, acc38); store_row(39u, acc39);
    }
    if (TM > 40u) {
        store_row(40u, acc40); store_row(41u, acc41); store_row(42u, acc42); store_row(43u, acc43);
        store_row(44u, acc44); store_row(45u, acc45); store_row(46u, acc46); store_row(47u, acc47);
    }
    if (TM > 48u) {
        store_row(48u, acc48); store_row(49u, acc49); store_row(50u, acc50); store_row(51u, acc51);
        store_row(52u, acc52); store_row(53u, acc53); store_row(54u, acc54); store_row(55u, acc55);
    }
    if (TM > 56u) {
        store_row(56u, acc56); store_row(57u, acc57); store_row(58u, acc58); store_row(59u, acc59);
        store_row(60u, acc60); store_row(61u, acc61); store_row(62u, acc62); store_row(63u, acc63);
    }
    flush_rows();
}
