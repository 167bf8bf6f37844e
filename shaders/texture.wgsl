// Write a realised f32 tensor [H, W] or [H, W, C] (C = 1, 3 or 4) into an application's
// storage texture of the same size, one invocation per texel. One channel goes through
// the colormap (0: grayscale, 1: viridis) after clamping to [0, 1]; three or four
// channels are written as RGB(A), clamped, with alpha 1 for three. The header declares
// `dst` with the texture's format.

struct Params {
    h: u32,
    w: u32,
    c: u32,
    colormap: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;

// Viridis at five anchors, linear between them (`interop::Colormap::rgba` on the host).
fn viridis(t: f32) -> vec3<f32> {
    var anchors = array<vec3<f32>, 5>(
        vec3<f32>(0.267, 0.005, 0.329),
        vec3<f32>(0.230, 0.322, 0.546),
        vec3<f32>(0.128, 0.567, 0.551),
        vec3<f32>(0.369, 0.789, 0.383),
        vec3<f32>(0.993, 0.906, 0.144),
    );
    let s = clamp(t, 0.0, 1.0) * 4.0;
    let i = min(u32(s), 3u);
    return mix(anchors[i], anchors[i + 1u], s - f32(i));
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x >= params.w || id.y >= params.h) {
        return;
    }
    let base = (id.y * params.w + id.x) * params.c;
    var rgba = vec4<f32>(0.0, 0.0, 0.0, 1.0);
    if (params.c == 1u) {
        let v = clamp(src[base], 0.0, 1.0);
        if (params.colormap == 1u) {
            rgba = vec4<f32>(viridis(v), 1.0);
        } else {
            rgba = vec4<f32>(v, v, v, 1.0);
        }
    } else {
        rgba = vec4<f32>(clamp(src[base], 0.0, 1.0), clamp(src[base + 1u], 0.0, 1.0), clamp(src[base + 2u], 0.0, 1.0), 1.0);
        if (params.c == 4u) {
            rgba.w = clamp(src[base + 3u], 0.0, 1.0);
        }
    }
    textureStore(dst, vec2<i32>(i32(id.x), i32(id.y)), rgba);
}
