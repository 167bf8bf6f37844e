//! Reference scaled-dot-product attention (`Op::Attention`), straight from the formula.

/// The masked score, rounded to f32 as the kernel and the composition hold it.
const MASKED: f64 = crate::ops::nn::MASKED as f32 as f64;

/// `softmax(q k^T / sqrt(D) + bias, causal) v` for q `[.., T, D]`, k and v `[.., S, D]`
/// (same batch axes) and an optional `bias` of shape `bias_dims` broadcastable to
/// `[.., T, S]`. Masked scores are -1e30, as in the fused kernel and the composite.
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    bias: Option<(&[f64], &[usize])>,
    causal: bool,
    out_dims: &[usize],
    s: usize,
) -> Vec<f64> {
    let r = out_dims.len();
    let (t, d) = (out_dims[r - 2], out_dims[r - 1]);
    let lead = &out_dims[..r - 2];
    let bh: usize = lead.iter().product();
    let scale = 1.0 / (d as f64).sqrt();
    // Bias element strides over [.., T, S] (0 where it broadcasts).
    let strides: Vec<usize> = match bias {
        Some((_, bd)) => {
            let mut st = vec![0; r];
            let mut acc = 1;
            for a in (0..r).rev() {
                st[a] = if bd[a] == 1 { 0 } else { acc };
                acc *= bd[a];
            }
            st
        }
        None => vec![0; r],
    };
    let mut out = vec![0.0; bh * t * d];
    let mut scores = vec![0.0; s];
    for b in 0..bh {
        // This batch index's bias offset.
        let (mut rem, mut boff) = (b, 0);
        for a in (0..lead.len()).rev() {
            boff += (rem % lead[a]) * strides[a];
            rem /= lead[a];
        }
        for i in 0..t {
            for (j, sc) in scores.iter_mut().enumerate() {
                let mut acc: f64 = (0..d).map(|c| q[(b * t + i) * d + c] * k[(b * s + j) * d + c]).sum::<f64>() * scale;
                if let Some((bv, _)) = bias {
                    acc += bv[boff + i * strides[r - 2] + j * strides[r - 1]];
                }
                if causal && (j as i64) > i as i64 + s as i64 - t as i64 {
                    acc = MASKED;
                }
                *sc = acc;
            }
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
            let l: f64 = w.iter().sum();
            for c in 0..d {
                out[(b * t + i) * d + c] = (0..s).map(|j| w[j] * v[(b * s + j) * d + c]).sum::<f64>() / l;
            }
        }
    }
    out
}
