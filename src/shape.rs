//! Shapes, contiguous strides and numpy broadcasting.

/// A tensor's dimensions, outermost first. A scalar has an empty shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub(crate) Vec<usize>);

impl Shape {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar). Saturates rather than overflowing; callers
    /// that build shapes check with [`Shape::checked_numel`].
    pub fn numel(&self) -> usize {
        self.checked_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when the product overflows.
    pub fn checked_numel(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
    }

    /// Row-major (contiguous) strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1usize; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1].saturating_mul(self.0[i + 1]);
        }
        s
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}
impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Self {
        Shape(d.clone())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(Vec::new())
    }
}
impl From<usize> for Shape {
    fn from(d: usize) -> Self {
        Shape(vec![d])
    }
}
impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

/// The numpy broadcast of two shapes, or `None` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for i in 0..r {
        let da = if i + a.len() >= r { a[i + a.len() - r] } else { 1 };
        let db = if i + b.len() >= r { b[i + b.len() - r] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// Whether `from` can be broadcast to `to` (numpy rules, one direction).
pub fn can_broadcast_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == t || f == 1)
}

/// Resolve a possibly negative axis against `rank`.
pub(crate) fn normalize_axis(axis: isize, rank: usize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        None
    } else {
        Some(a as usize)
    }
}

/// Split a linear index into row-major coordinates of `dims`.
pub(crate) fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        let n = dims[d].max(1);
        out[d] = i % n;
        i /= n;
    }
}

/// Join row-major coordinates of `dims` into a linear index.
pub(crate) fn ravel(coords: &[usize], dims: &[usize]) -> usize {
    coords.iter().zip(dims).fold(0, |acc, (&c, &d)| acc * d + c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[3, 1], &[4]), Some(vec![3, 4]));
        assert_eq!(broadcast_shapes(&[], &[2, 2]), Some(vec![2, 2]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 5]), Some(vec![0, 5]));
        assert!(can_broadcast_to(&[1, 3], &[2, 4, 3]));
        assert!(!can_broadcast_to(&[2, 3], &[3]));
    }

    #[test]
    fn ravel_and_unravel_invert() {
        let dims = [3, 1, 4];
        let mut c = [0; 3];
        for i in 0..12 {
            unravel(i, &dims, &mut c);
            assert_eq!(ravel(&c, &dims), i);
        }
        assert_eq!(Shape::from([2, 3, 4]).strides(), vec![12, 4, 1]);
    }
}
