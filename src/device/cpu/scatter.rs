//! Row writes (`Op::ScatterRows`) on the CPU: each rewrites rows of its table in the
//! table's own buffer. The writes the scheduler grouped over the same rows
//! ([`group_row_writes`]) run as one pass: for each row, every write in turn. A sparse
//! Adam step (both moments, then the weights reading them) so visits each scattered
//! row of its three tables once, while the row is in cache, instead of once per write.
//!
//! [`group_row_writes`]: crate::graph::schedule::group_row_writes

use super::buffer::{CpuBuffer, HostBuffer};
use super::{buffer_of, memory, par};
use crate::device::Storage;
use crate::graph::schedule::buffer_source;
use crate::graph::{Op, RowRule};
use crate::{Error, Result, Tensor};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Where a write reads an operand.
enum Src<'a> {
    /// A buffer of its own: `[U, D]` read at the touched row's position, or a table
    /// read at the row.
    Buf(&'a [f32]),
    /// The table of the group's write `j` (earlier in the pass), at the row: its new
    /// values.
    Written(usize),
}

/// One write of a pass.
struct Write<'a> {
    rule: RowRule,
    /// The gate: false leaves every row as it is.
    open: bool,
    ops: Vec<Src<'a>>,
    h: [f32; 2],
}

impl Write<'_> {
    /// Rewrite `dst`, row `row` (touched as the `u`-th), `done` the group's earlier
    /// tables and `a` the row's offset in them.
    fn apply(&self, u: usize, row: usize, d: usize, dst: &mut [f32], done: &[&mut [f32]], a: usize) {
        let read = |k: usize| -> &[f32] {
            match self.ops[k] {
                Src::Buf(s) => {
                    let i = if self.rule.reads_at_row(k) { row } else { u };
                    &s[i * d..(i + 1) * d]
                }
                Src::Written(j) => &done[j][a..a + d],
            }
        };
        match self.rule {
            RowRule::Replace => dst.copy_from_slice(read(0)),
            RowRule::Accumulate { square } => {
                let [decay, scale] = self.h;
                for (t, &g) in dst.iter_mut().zip(read(0)) {
                    *t = decay * *t + scale * if square { g * g } else { g };
                }
            }
            RowRule::Step { .. } => {
                let [lr, eps] = self.h;
                for ((t, &n), &s) in dst.iter_mut().zip(read(0)).zip(read(1)) {
                    *t -= lr * n / (s.sqrt() + eps);
                }
            }
        }
    }
}

/// Run the row writes `roots` (a group of [`group_row_writes`]) in one pass when their
/// rows are strictly increasing, else one after another. Each write's table buffer is
/// taken from `produced` or its tensor, rewritten in place when nothing else holds it
/// (else a copy), and given back to both the table and the result in `produced`.
///
/// [`group_row_writes`]: crate::graph::schedule::group_row_writes
pub(super) fn run_group(
    roots: &[Tensor],
    materialised: &HashSet<u64>,
    produced: &mut HashMap<u64, Arc<CpuBuffer>>,
) -> Result<()> {
    let rows_buf = buffer_of(&roots[0].node().inputs[1], materialised, produced)?;
    let HostBuffer::I32(rows) = &**rows_buf else {
        return Err(Error::Unsupported("cpu: row writes take i32 rows".into()));
    };
    if roots.len() > 1 && !rows.windows(2).all(|w| w[0] < w[1]) {
        // A row written twice: each write must see the other's finished table.
        return roots.iter().try_for_each(|r| run_group(std::slice::from_ref(r), materialised, produced));
    }
    // Every operand's buffer is held before the tables are taken: one that is a table
    // then keeps its old values, and the rows go to a copy. An operand that is an
    // earlier write of the group is read from that write's table instead.
    let source = |t: &Tensor| buffer_source(t, materialised).unwrap_or_else(|| t.clone()).id();
    let mut held: Vec<Vec<Held>> = Vec::new();
    for root in roots {
        let mut ops = Vec::new();
        for t in &root.node().inputs[2..] {
            ops.push(match roots.iter().position(|r| r.id() == source(t)) {
                Some(j) => Held::Written(j),
                None => Held::Buf(buffer_of(t, materialised, produced)?),
            });
        }
        held.push(ops);
    }
    let mut writes: Vec<Write> = Vec::new();
    for (root, ops) in roots.iter().zip(&held) {
        let Op::ScatterRows { rule, gated } = *root.op() else { unreachable!("scatter kernels root a row write") };
        let srcs = ops[..rule.operands()].iter().map(Held::src).collect::<Result<Vec<_>>>()?;
        let h = match rule {
            RowRule::Replace => [0.0; 2],
            _ => match ops[rule.operands() - 1].src()? {
                Src::Buf(&[h0, h1, ..]) => [h0, h1],
                _ => return Err(Error::Unsupported("cpu: a row write's hyperparameters".into())),
            },
        };
        let open = !gated || matches!(ops[rule.operands()].src()?, Src::Buf(&[g, ..]) if g != 0.0);
        writes.push(Write { rule, open, ops: srcs, h });
    }
    // The tables' buffers, moved out of wherever they live so that they can be owned.
    let mut owned: Vec<(Tensor, CpuBuffer, bool)> = Vec::new();
    for root in roots {
        let table = &root.node().inputs[0];
        let table = buffer_source(table, materialised).unwrap_or_else(|| table.clone());
        let (buf, from_tensor) = match produced.remove(&table.id()) {
            Some(b) => (b, false),
            None => match table.take_storage() {
                Some(Storage::Cpu(b)) => (b, true),
                other => {
                    if let Some(s) = other {
                        table.set_storage(s);
                    }
                    owned.into_iter().for_each(|(t, b, from)| give_back(&t, Arc::new(b), from, produced));
                    return Err(Error::Unsupported(format!("cpu: tensor {} has no CPU buffer", table.id())));
                }
            },
        };
        owned.push((table, Arc::try_unwrap(buf).unwrap_or_else(|shared| shared.duplicate()), from_tensor));
    }
    let (r, d) = (roots[0].dims()[0], roots[0].dims()[1].max(1));
    let mut tables: Vec<&mut [f32]> = Vec::new();
    let mut all_f32 = true;
    for (_, b, _) in owned.iter_mut() {
        match b.data_mut() {
            HostBuffer::F32(t) if t.len() == r * d => tables.push(&mut t[..]),
            _ => all_f32 = false,
        }
    }
    if all_f32 && writes.iter().any(|w| w.open) {
        update_rows(&mut tables, 0, rows, d, r, &writes);
    }
    drop(tables);
    drop(writes);
    drop(held);
    for ((table, b, from_tensor), root) in owned.into_iter().zip(roots) {
        let out = Arc::new(b);
        give_back(&table, out.clone(), from_tensor, produced);
        produced.insert(root.id(), out);
    }
    match all_f32 {
        true => Ok(()),
        false => Err(Error::Unsupported(format!("cpu: row writes take f32 [{r}, {d}] tables"))),
    }
}

/// An operand of a write, held for the pass: a buffer of its own, or the table of the
/// group's write `j`.
enum Held {
    Buf(Arc<CpuBuffer>),
    Written(usize),
}

impl Held {
    /// Where the write reads it.
    fn src(&self) -> Result<Src<'_>> {
        match self {
            Held::Written(j) => Ok(Src::Written(*j)),
            Held::Buf(b) => match &***b {
                HostBuffer::F32(v) => Ok(Src::Buf(&v[..])),
                _ => Err(Error::Unsupported("cpu: row writes take f32 operands".into())),
            },
        }
    }
}

/// Give a table's buffer back to where it was taken from.
fn give_back(table: &Tensor, b: Arc<CpuBuffer>, from_tensor: bool, produced: &mut HashMap<u64, Arc<CpuBuffer>>) {
    if from_tensor {
        table.set_storage(Storage::Cpu(b));
    } else {
        produced.insert(table.id(), b);
    }
}

/// Apply `writes` to row `rows[u]` of their `tables` for every row in range (each
/// table holds rows `first..` of `d` values, `num` rows in the whole table; for one
/// write, a later duplicate wins). Each row is prefetched a few rows ahead in every
/// table and every operand read by row; rows in strictly increasing order (what sparse
/// optimisers write) are split across threads, each part of the rows writing its own
/// part of the tables.
fn update_rows(tables: &mut [&mut [f32]], first: usize, rows: &[i32], d: usize, num: usize, writes: &[Write]) {
    let increasing = rows.windows(2).all(|w| w[0] < w[1]);
    let parts =
        if increasing && par::worth(rows.len() * d * tables.len()) { par::threads().min(rows.len()) } else { 1 };
    update_rows_from(tables, first, rows, 0, parts, d, num, writes)
}

/// [`update_rows`] over `rows` (the rows `u0..` of the whole write, increasing when
/// `parts` > 1) in `parts` stretches, one per thread, each prefetching its own rows.
#[allow(clippy::too_many_arguments)]
fn update_rows_from(
    tables: &mut [&mut [f32]],
    first: usize,
    rows: &[i32],
    u0: usize,
    parts: usize,
    d: usize,
    num: usize,
    writes: &[Write],
) {
    #[cfg(not(target_arch = "wasm32"))]
    if parts > 1 && rows.len() >= 2 {
        let lo_parts = parts / 2;
        let half = rows.len() * lo_parts / parts;
        let held = tables.first().map_or(0, |t| t.len() / d);
        // Rows from `rows[half]` on lie at or past this table row.
        let split = (rows[half].max(0) as usize).clamp(first, first + held);
        let (mut lo, mut hi): (Vec<&mut [f32]>, Vec<&mut [f32]>) =
            tables.iter_mut().map(|t| t.split_at_mut((split - first) * d)).unzip();
        rayon::join(
            || update_rows_from(&mut lo, first, &rows[..half], u0, lo_parts, d, num, writes),
            || update_rows_from(&mut hi, split, &rows[half..], u0 + half, parts - lo_parts, d, num, writes),
        );
        return;
    }
    let _ = parts;
    let adam = FusedAdam::of(writes, d);
    const AHEAD: usize = 16;
    let len = tables.first().map_or(0, |t| t.len());
    let row_of = |row: i32| usize::try_from(row).ok().filter(|&r| r < num);
    let at = |row: usize| -> Option<usize> { Some((row.checked_sub(first)?) * d).filter(|&a| a + d <= len) };
    for (u, &row) in rows.iter().enumerate() {
        if let Some(next) = rows.get(u + AHEAD).and_then(|&r| row_of(r)) {
            if let Some(a) = at(next) {
                tables.iter().for_each(|t| memory::prefetch_run(t, a, d));
            }
            for w in writes.iter().filter(|w| w.open) {
                for (k, src) in w.ops.iter().enumerate() {
                    if let (Src::Buf(s), true) = (src, w.rule.reads_at_row(k)) {
                        memory::prefetch_run(s, next * d, d);
                    }
                }
            }
        }
        if let Some((row, a)) = row_of(row).and_then(|r| Some((r, at(r)?))) {
            if let Some(adam) = &adam {
                adam.apply(tables, u0 + u, a, d);
                continue;
            }
            for (i, w) in writes.iter().enumerate().filter(|(_, w)| w.open) {
                let (done, rest) = tables.split_at_mut(i);
                w.apply(u0 + u, row, d, &mut rest[0][a..a + d], done, a);
            }
        }
    }
}

/// A sparse Adam step as the scheduler groups it (both moments accumulate the
/// gradient's rows, then the weights step by the new moments at the row), applied to
/// each row [`update_rows_from`] visits as one loop over all three tables. The generic
/// pass matches every write's rule and operands per row and walks the row once per
/// write; this one loads each element of the gradient, m, v and w once. The same float operations in the same order as
/// [`Write::apply`], so the same bits.
struct FusedAdam<'a> {
    /// The gradient's rows for m and for v (`[U, D]`, read at the touched row's position).
    g: [&'a [f32]; 2],
    /// (decay, scale) of m and of v, (lr, eps) of the step.
    h: [[f32; 2]; 3],
}

impl<'a> FusedAdam<'a> {
    /// The group's writes when they are exactly that step, all open.
    fn of(writes: &[Write<'a>], d: usize) -> Option<FusedAdam<'a>> {
        let [m, v, w] = writes else { return None };
        let rows_of = |src: &Src<'a>| match *src {
            Src::Buf(s) if s.len() % d.max(1) == 0 => Some(s),
            _ => None,
        };
        let plain = |x: &Write, square: bool| x.open && x.rule == RowRule::Accumulate { square };
        let step_reads_moments = w.open
            && w.rule == RowRule::Step { num_rows: true }
            && matches!(w.ops.get(..2), Some([Src::Written(0), Src::Written(1)]));
        if !plain(m, false) || !plain(v, true) || !step_reads_moments {
            return None;
        }
        Some(FusedAdam { g: [rows_of(&m.ops[0])?, rows_of(&v.ops[0])?], h: [m.h, v.h, w.h] })
    }

    /// Rewrite one row (at `a` in each table, touched as the `u`-th) of `tables`, which
    /// are m, v and w.
    fn apply(&self, tables: &mut [&mut [f32]], u: usize, a: usize, d: usize) {
        let [m, v, w] = tables else { return };
        let k = u * d;
        let (Some(g0), Some(g1)) = (self.g[0].get(k..k + d), self.g[1].get(k..k + d)) else { return };
        let (mr, vr, wr) = (&mut m[a..a + d], &mut v[a..a + d], &mut w[a..a + d]);
        super::math::vectorised(|| adam_row(mr, vr, wr, g0, g1, self.h));
    }
}

/// One row of [`FusedAdam`]: a loop the compiler vectorises (its square roots and
/// divisions are most of its time in cache), run `math::vectorised`. Separate
/// multiplies and adds (Rust never fuses them), so the same bits at every width.
#[inline(always)]
fn adam_row(m: &mut [f32], v: &mut [f32], w: &mut [f32], g0: &[f32], g1: &[f32], h: [[f32; 2]; 3]) {
    let [[md, ms], [vd, vs], [lr, eps]] = h;
    for ((((m, v), w), &g), &x) in m.iter_mut().zip(v.iter_mut()).zip(w.iter_mut()).zip(g0).zip(g1) {
        let mj = md * *m + ms * g;
        let vj = vd * *v + vs * (x * x);
        *m = mj;
        *v = vj;
        *w -= lr * mj / (vj.sqrt() + eps);
    }
}
