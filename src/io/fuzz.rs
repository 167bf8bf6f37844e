//! Entry points shared by the cargo-fuzz targets in `fuzz/` and the corpus replay in
//! `tests/hostile_files.rs`: each feeds arbitrary bytes to one loader on the CPU
//! reference device and, when the bytes load, uses the result the way a program would.
//! None may panic; a bad file must come back as an `Err`.

use crate::{Device, Result};

/// `io::safetensors::load_bytes`, then read every tensor.
pub fn safetensors(bytes: &[u8]) -> Result<usize> {
    let dev = Device::cpu();
    let file = super::safetensors::load_bytes(bytes, &dev)?;
    let mut n = 0;
    for t in file.tensors.values() {
        n += t.to_f64_vec_blocking()?.len();
    }
    Ok(n)
}

/// `io::gguf::parse`, every tensor uploaded and read, and the file written back out.
pub fn gguf(bytes: &[u8]) -> Result<usize> {
    let dev = Device::cpu();
    let file = super::gguf::parse(bytes)?;
    let mut n = 0;
    for t in file.to_tensors(&dev)?.values() {
        n += t.to_f64_vec_blocking()?.len();
    }
    let again = super::gguf::parse(&super::gguf::to_bytes(&file)?)?;
    if again.tensors != file.tensors {
        return Err(crate::Error::Format { format: "gguf", detail: "round trip changed the tensors".into() });
    }
    Ok(n)
}

/// `io::checkpoint::from_bytes` into a small MLP and Adam, as a training loop resumes.
pub fn checkpoint(bytes: &[u8]) -> Result<usize> {
    use crate::nn::{Activation, Linear, Sequential};
    let dev = Device::cpu();
    let mut model = Sequential::new()
        .add(Linear::new(4, 3, true, 1, &dev))
        .add(Activation::Relu)
        .add(Linear::new(3, 2, true, 2, &dev));
    let mut opt = crate::optim::Adam::new(1e-3);
    let meta = super::checkpoint::from_bytes(bytes, &mut model, &mut opt, &dev)?;
    Ok(meta.len())
}

/// `onnx::OnnxModel::from_bytes`, then, when every input has a small fixed shape, a run
/// on zeros with the outputs read.
pub fn onnx(bytes: &[u8]) -> Result<usize> {
    use crate::onnx::{Dim, HostTensor, LoadOptions, OnnxModel, Value};
    let dev = Device::cpu();
    let m = OnnxModel::from_bytes(bytes, &dev, LoadOptions::default())?;
    let mut inputs = Vec::new();
    for i in m.inputs() {
        let (Some(elem), Some(dims)) = (i.elem, &i.dims) else { return Ok(0) };
        let mut d = Vec::new();
        for x in dims {
            match x {
                Dim::Fixed(n) if *n <= 64 => d.push(*n as usize),
                _ => return Ok(0),
            }
        }
        let n: usize = d.iter().product();
        // Small inputs only: run-time memory then follows the model, not the harness.
        if n > 4096 {
            return Ok(0);
        }
        inputs.push((i.name.clone(), Value::host(HostTensor::from_f64(elem, d, &vec![0.0; n])?)));
    }
    let outs = m.run_values(inputs)?;
    let ts: Vec<crate::Tensor> = outs.iter().map(|o| o.tensor.clone()).collect();
    Ok(crate::read_all_blocking(&ts)?.len())
}
