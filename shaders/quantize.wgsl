// Quantisation into GGUF's block formats, written in the GPU layout (all f16 scales,
// then all quants; see src/quant.rs): Q8_0 exactly as ggml's reference; Q4_0 by the
// host's scale search (`q4_0_block` in src/quant.rs: 41 candidate scales around
// max / -8, each refitted by least squares, the smallest squared error kept).
// An invocation quantises two neighbouring blocks, so it alone writes their scale word.
// meta: [0] blocks, [1] the word where the quants start. The header defines Q4 (the
// format), `quant_input(i)` (element i of the fused input, as f32) and `round_f16`.

var<private> x: array<f32, 32>;
var<private> q: array<u32, 32>;

// Rust's `f32::round`: halves away from zero (WGSL's round() goes to even).
fn round_away(v: f32) -> f32 {
    let t = trunc(v);
    return select(t, t + sign(v), abs(v - t) >= 0.5);
}

// Q8_0: d = amax / 127, codes round(x / d). Returns d (as f16 will store it).
fn q8_block() -> f32 {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j = j + 1u) {
        amax = max(amax, abs(x[j]));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    for (var j = 0u; j < 32u; j = j + 1u) {
        q[j] = u32(i32(clamp(round_away(x[j] * id), -128.0, 127.0))) & 255u;
    }
    return round_f16(d);
}

// Q4_0 codes for scale d into `c`, each in 0..16 (value d * (code - 8)).
fn q4_codes(d: f32, c: ptr<function, array<u32, 32>>) {
    let id = select(0.0, 1.0 / d, d != 0.0);
    for (var j = 0u; j < 32u; j = j + 1u) {
        (*c)[j] = u32(clamp(x[j] * id + 8.5, 0.0, 15.0));
    }
}

fn q4_sse(d: f32, c: ptr<function, array<u32, 32>>) -> f32 {
    var s = 0.0;
    for (var j = 0u; j < 32u; j = j + 1u) {
        let e = x[j] - d * (f32((*c)[j]) - 8.0);
        s = s + e * e;
    }
    return s;
}

fn q4_block() -> f32 {
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < 32u; j = j + 1u) {
        if (abs(x[j]) > amax) {
            amax = abs(x[j]);
            mx = x[j];
        }
    }
    var c: array<u32, 32>;
    var best_d = round_f16(mx / -8.0);
    q4_codes(best_d, &c);
    var best = q4_sse(best_d, &c);
    q = c;
    if (amax == 0.0) {
        return best_d;
    }
    for (var step = -20; step <= 20; step = step + 1) {
        let d0 = mx / -(8.0 + 0.05 * f32(step));
        q4_codes(d0, &c);
        var sxl = 0.0;
        var sll = 0.0;
        for (var j = 0u; j < 32u; j = j + 1u) {
            let l = f32(c[j]) - 8.0;
            sxl = sxl + x[j] * l;
            sll = sll + l * l;
        }
        if (sll == 0.0) {
            continue;
        }
        for (var t = 0u; t < 2u; t = t + 1u) {
            let d = round_f16(select(d0, sxl / sll, t == 1u));
            q4_codes(d, &c);
            let e = q4_sse(d, &c);
            if (e < best) {
                best = e;
                best_d = d;
                q = c;
            }
        }
    }
    return best_d;
}

// The f16 bits of x, which `round_f16` made exactly representable (subnormals
// included, which pack2x16float may flush).
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = abs(x);
    if (a < 6.103515625e-5) {
        return sign | u32(a * 16777216.0);
    }
    return sign | ((((b >> 23u) & 255u) - 112u) << 10u) | ((b >> 13u) & 1023u);
}

// Quantise block b into the layout; returns its scale.
fn quantize_block(b: u32) -> f32 {
    for (var j = 0u; j < 32u; j = j + 1u) {
        x[j] = quant_input(b * 32u + j);
    }
    let qoff = m(1u);
    if (Q4) {
        let d = q4_block();
        // Byte j holds element j (low nibble) and element j + 16 (high nibble).
        for (var w = 0u; w < 4u; w = w + 1u) {
            var word = 0u;
            for (var k = 0u; k < 4u; k = k + 1u) {
                let j = 4u * w + k;
                word = word | ((q[j] | (q[j + 16u] << 4u)) << (8u * k));
            }
            out[qoff + b * 4u + w] = word;
        }
        return d;
    }
    let d = q8_block();
    for (var w = 0u; w < 8u; w = w + 1u) {
        let j = 4u * w;
        out[qoff + b * 8u + w] = q[j] | (q[j + 1u] << 8u) | (q[j + 2u] << 16u) | (q[j + 3u] << 24u);
    }
    return d;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let p = gid.x + gid.y * nwg.x * 64u;
    let b = 2u * p;
    if (b >= m(0u)) {
        return;
    }
    let d0 = quantize_block(b);
    var d1 = 0.0;
    if (b + 1u < m(0u)) {
        d1 = quantize_block(b + 1u);
    }
    out[p] = f16_bits(d0) | (f16_bits(d1) << 16u);
}
