//! Plan signatures: the structure of a graph (ops without their scalar fields, shapes,
//! dtypes, which nodes are realised, and the wiring) as one hash, with the graph's nodes
//! in a fixed order. Two graphs with the same signature schedule into the same kernels,
//! so a backend may cache what it derived from one and replay it for the other with
//! the new nodes' scalars (see `device/wgpu/plan.rs`).

use super::schedule::topo_order;
use crate::Tensor;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// The graph under `targets` in a fixed order (leaves and unrealised nodes) and the hash
/// of its structure.
pub struct Signature {
    pub hash: u64,
    pub nodes: Vec<Tensor>,
    pos: HashMap<u64, usize>,
}

impl Signature {
    /// The position of node `id` in [`Signature::nodes`], if it is part of the graph.
    pub fn position(&self, id: &u64) -> Option<usize> {
        self.pos.get(id).copied()
    }

    pub fn of(targets: &[Tensor]) -> Signature {
        let order = topo_order(targets);
        let mut h = DefaultHasher::new();
        let mut nodes = Vec::with_capacity(order.len() + 8);
        let mut pos: HashMap<u64, usize> = HashMap::with_capacity(order.len() + 8);
        let leaf = |t: &Tensor, nodes: &mut Vec<Tensor>, pos: &mut HashMap<u64, usize>, h: &mut DefaultHasher| {
            let next = nodes.len();
            let p = *pos.entry(t.id()).or_insert(next);
            if p == next {
                nodes.push(t.clone());
                (0xfeed_u32, t.dims(), t.dtype()).hash(h);
            }
            p
        };
        for t in &order {
            let mut ins = Vec::with_capacity(t.node().inputs.len());
            for i in &t.node().inputs {
                ins.push(if i.is_realized() { leaf(i, &mut nodes, &mut pos, &mut h) } else { pos[&i.id()] });
            }
            pos.insert(t.id(), nodes.len());
            nodes.push(t.clone());
            t.op().hash_structure(&mut h);
            (t.dims(), t.dtype(), &ins).hash(&mut h);
        }
        for t in targets {
            let p = if t.is_realized() { leaf(t, &mut nodes, &mut pos, &mut h) } else { pos[&t.id()] };
            (0x7a6_u32, p).hash(&mut h);
        }
        Signature { hash: h.finish(), nodes, pos }
    }
}
