// The 8 floats of a `vec4<u64>` (`ShaderCaps::wide_loads`), native builds.
fn oct(w: vec4<u64>) -> Oct {
    let l = vec4<u32>(w & vec4<u64>(0xfffffffflu));
    let h = vec4<u32>(w >> vec4<u32>(32u));
    return Oct(bitcast<vec4<f32>>(vec4<u32>(l.x, h.x, l.y, h.y)), bitcast<vec4<f32>>(vec4<u32>(l.z, h.z, l.w, h.w)));
}
