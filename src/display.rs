//! `Display` for tensors, as PyTorch prints them: nested brackets, long axes truncated
//! to their first and last three entries, then the shape and dtype.

use crate::{DType, Tensor};
use std::fmt;

/// Axes longer than this are shown as their first and last `EDGE` entries.
const THRESHOLD: usize = 1000;
const EDGE: usize = 3;

fn fmt_value(v: f64, dt: DType) -> String {
    match dt {
        DType::Bool => if v != 0.0 { "True" } else { "False" }.into(),
        DType::I32 | DType::U32 => format!("{v}"),
        _ if v.is_nan() => "nan".into(),
        _ if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.into(),
        _ => format!("{v:.4}"),
    }
}

/// Render values of `dims` in PyTorch's layout (without the `tensor(` prefix).
pub(crate) fn render(values: &[f64], dims: &[usize], dt: DType) -> String {
    let summarize = values.len() > THRESHOLD;
    let cells: Vec<String> = values.iter().map(|&v| fmt_value(v, dt)).collect();
    let width = cells.iter().map(|c| c.len()).max().unwrap_or(1);
    fn rec(cells: &[String], dims: &[usize], offset: usize, indent: usize, width: usize, summarize: bool) -> String {
        if dims.is_empty() {
            return format!("{:>width$}", cells[offset]);
        }
        let n = dims[0];
        let stride: usize = dims[1..].iter().product();
        let idx: Vec<Option<usize>> = if summarize && n > 2 * EDGE {
            (0..EDGE).map(Some).chain([None]).chain((n - EDGE..n).map(Some)).collect()
        } else {
            (0..n).map(Some).collect()
        };
        let sep = if dims.len() == 1 {
            ", ".to_string()
        } else {
            format!(",{}{}", "\n".repeat(dims.len() - 1), " ".repeat(indent + 1))
        };
        let parts: Vec<String> = idx
            .iter()
            .map(|i| match i {
                Some(i) => rec(cells, &dims[1..], offset + i * stride, indent + 1, width, summarize),
                None => "...".to_string(),
            })
            .collect();
        format!("[{}]", parts.join(&sep))
    }
    if values.is_empty() {
        return "[]".into();
    }
    rec(&cells, dims, 0, 7, width, summarize)
}

impl Tensor {
    /// The tensor printed as PyTorch does (realising it); works on every target.
    pub async fn format(&self) -> String {
        let tail = format!("shape={:?}, dtype={}", self.dims(), self.dtype());
        match self.to_f64_vec().await {
            Ok(v) => format!("tensor({}, {tail})", render(&v, self.dims(), self.dtype())),
            Err(e) => format!("tensor(<error: {e}>, {tail})"),
        }
    }
}

/// Prints values on native targets (blocking on the readback). In a browser, where
/// nothing may block, use [`Tensor::format`] instead.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        #[cfg(not(target_arch = "wasm32"))]
        {
            f.write_str(&pollster::block_on(self.format()))
        }
        #[cfg(target_arch = "wasm32")]
        {
            write!(f, "tensor(<use format().await>, shape={:?}, dtype={})", self.dims(), self.dtype())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::render;
    use crate::DType;

    #[test]
    fn renders_like_pytorch() {
        assert_eq!(render(&[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32), "[[1.0000, 2.0000],\n        [3.0000, 4.0000]]");
        assert_eq!(render(&[1.0, 0.0], &[2], DType::Bool), "[ True, False]");
        assert_eq!(render(&[5.0], &[], DType::I32), "5");
        let long: Vec<f64> = (0..2000).map(|i| i as f64).collect();
        let s = render(&long, &[2000], DType::I32);
        assert!(s.starts_with("[   0,    1,    2, ..., 1997, 1998, 1999]"), "{s}");
    }
}
