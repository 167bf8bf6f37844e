//! Batched matmul with broadcast batch axes (operands of equal rank ≥ 2).

use crate::shape::{ravel, unravel};

/// `[.., m, k] @ [.., k, n]`, accumulating in f64.
pub fn matmul(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize], od: &[usize]) -> Vec<f64> {
    let r = od.len();
    let (m, n, k) = (od[r - 2], od[r - 1], ad[r - 1]);
    let batch_dims = &od[..r - 2];
    let batches: usize = batch_dims.iter().product();
    let mut out = Vec::with_capacity(batches * m * n);
    let mut bc = vec![0; r - 2];
    for bi in 0..batches {
        unravel(bi, batch_dims, &mut bc);
        let pick = |dims: &[usize]| -> usize {
            let c: Vec<usize> = bc.iter().zip(dims).map(|(&c, &d)| if d == 1 { 0 } else { c }).collect();
            ravel(&c, &dims[..r - 2])
        };
        let (oa, ob) = (pick(ad) * m * k, pick(bd) * k * n);
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    s += a[oa + i * k + p] * b[ob + p * n + j];
                }
                out.push(s);
            }
        }
    }
    out
}
