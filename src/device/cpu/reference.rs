//! The CPU executor: runs a graph on the reference implementation. It is the oracle the
//! GPU is tested against, and the backend of [`Device::cpu`](crate::Device::cpu).

use crate::device::Storage;
use crate::graph::schedule::topo_order;
use crate::graph::Op;
use crate::stats::Counter;
use crate::{Error, Result, Tensor};
use std::collections::HashMap;
use std::sync::Arc;

/// Compute `targets` (and everything unrealised under them) on the host.
pub(crate) fn run(targets: &[Tensor], exact: bool) -> Result<Vec<Vec<f64>>> {
    let order = topo_order(targets);
    let mut vals: HashMap<u64, Arc<Vec<f64>>> = HashMap::new();
    let value = |t: &Tensor, vals: &HashMap<u64, Arc<Vec<f64>>>| -> Result<Arc<Vec<f64>>> {
        if let Some(v) = vals.get(&t.id()) {
            return Ok(v.clone());
        }
        match t.storage() {
            Some(Storage::Host(v) | Storage::HostQuantized(v, _)) => Ok(v),
            _ => Err(Error::Unsupported(format!("tensor {} is not on the CPU device", t.id()))),
        }
    };
    // The same rule as the GPU: only quantisation may materialise a block format.
    let sched = crate::graph::schedule::schedule(targets, usize::MAX);
    if let Some(k) =
        sched.kernels.iter().find(|k| k.root.dtype().is_quantized() && !matches!(k.root.op(), Op::Quantize))
    {
        return Err(crate::kernels::quantized_output(&k.root));
    }
    // GGUF blocks of the quantisations computed here, for the targets among them.
    let mut blocks: HashMap<u64, Arc<Vec<u8>>> = HashMap::new();
    for t in &order {
        let inputs: Vec<Arc<Vec<f64>>> = t.node().inputs.iter().map(|i| value(i, &vals)).collect::<Result<_>>()?;
        let out = if matches!(t.op(), Op::Quantize) {
            let (values, b) = crate::reference::quantize(t.dtype(), &inputs[0]);
            blocks.insert(t.id(), Arc::new(b));
            values
        } else {
            let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
            crate::reference::eval_with(t, &refs, exact)?
        };
        vals.insert(t.id(), Arc::new(out));
    }
    if let Some(t) = targets.first() {
        t.device().0.counters.add(Counter::Realizations, 1);
    }
    let mut out = Vec::with_capacity(targets.len());
    for t in targets {
        let v = value(t, &vals)?;
        if !t.is_realized() {
            match blocks.get(&t.id()) {
                Some(b) => t.set_storage(Storage::HostQuantized(v.clone(), b.clone())),
                None => t.set_storage(Storage::Host(v.clone())),
            }
        }
        out.push(v.as_ref().clone());
    }
    Ok(out)
}
