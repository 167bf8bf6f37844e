//! safetensors and GGUF: every dtype loads, files written here read back exactly, and
//! bad files are errors that name what is wrong.

mod common;
use common::data;
use std::collections::BTreeMap;
use tessera::io::gguf::{self, GgufFile, TensorData, Value};
use tessera::io::safetensors as st;
use tessera::{DType, Device, Error, Tensor};

fn dev() -> Device {
    common::first_device()
}

#[test]
fn safetensors_every_dtype_loads() {
    // Build a file by hand with the reference crate's serialiser.
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let f32s: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16s: Vec<u8> = [0.5f32, 3.0].iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect();
    let bf16s: Vec<u8> =
        [1.0f32, -0.25].iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect();
    let f64s: Vec<u8> = [2.5f64, 1e-3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let i64s: Vec<u8> = [7i64, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
    let i8s: Vec<u8> = vec![0xff, 5];
    let u8s: Vec<u8> = vec![200, 1];
    let i16s: Vec<u8> = [-300i16, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    let u32s: Vec<u8> = [4_000_000_000u32, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bools: Vec<u8> = vec![1, 0];
    let views = vec![
        ("a_f32", TensorView::new(Dtype::F32, vec![2], &f32s).unwrap()),
        ("b_f16", TensorView::new(Dtype::F16, vec![2], &f16s).unwrap()),
        ("c_bf16", TensorView::new(Dtype::BF16, vec![2], &bf16s).unwrap()),
        ("d_f64", TensorView::new(Dtype::F64, vec![2], &f64s).unwrap()),
        ("e_i64", TensorView::new(Dtype::I64, vec![1, 2], &i64s).unwrap()),
        ("f_i8", TensorView::new(Dtype::I8, vec![2], &i8s).unwrap()),
        ("g_u8", TensorView::new(Dtype::U8, vec![2], &u8s).unwrap()),
        ("h_i16", TensorView::new(Dtype::I16, vec![2], &i16s).unwrap()),
        ("i_u32", TensorView::new(Dtype::U32, vec![2], &u32s).unwrap()),
        ("j_bool", TensorView::new(Dtype::BOOL, vec![2], &bools).unwrap()),
    ];
    let meta = Some(std::collections::HashMap::from([("format".to_string(), "pt".to_string())]));
    let bytes = safetensors::serialize(views, meta).unwrap();
    for d in [dev(), Device::reference()] {
        let f = st::load_bytes(&bytes, &d).unwrap();
        assert_eq!(f.metadata.get("format").map(String::as_str), Some("pt"));
        let get = |n: &str| f.tensors[n].to_f64_vec_blocking().unwrap();
        assert_eq!(get("a_f32"), vec![1.5, -2.0]);
        assert_eq!((f.tensors["b_f16"].dtype(), get("b_f16")), (DType::F16, vec![0.5, 3.0]));
        assert_eq!((f.tensors["c_bf16"].dtype(), get("c_bf16")), (DType::F32, vec![1.0, -0.25]));
        assert_eq!(get("d_f64"), vec![2.5, 1e-3f32 as f64]);
        assert_eq!(
            (f.tensors["e_i64"].dtype(), f.tensors["e_i64"].dims().to_vec(), get("e_i64")),
            (DType::I32, vec![1, 2], vec![7.0, -9.0])
        );
        assert_eq!(get("f_i8"), vec![-1.0, 5.0]);
        assert_eq!(get("g_u8"), vec![200.0, 1.0]);
        assert_eq!(get("h_i16"), vec![-300.0, 2.0]);
        assert_eq!((f.tensors["i_u32"].dtype(), get("i_u32")), (DType::U32, vec![4e9, 3.0]));
        assert_eq!((f.tensors["j_bool"].dtype(), get("j_bool")), (DType::Bool, vec![1.0, 0.0]));
    }
    // An I64 that does not fit is an error naming the tensor.
    let big: Vec<u8> = [1i64 << 40].iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes =
        safetensors::serialize(vec![("ids", TensorView::new(Dtype::I64, vec![1], &big).unwrap())], None).unwrap();
    let e = st::load_bytes(&bytes, &Device::reference()).err().unwrap();
    assert!(e.to_string().contains("\"ids\""), "{e}");
}

#[test]
fn safetensors_values_load_bit_exact() {
    // The file's bits on every device (loaded with no f64 in between on the GPU and
    // the CPU backend): a quiet NaN with a payload, -0, subnormals, infinities, extremes;
    // an odd count of f16 (padded on the GPU).
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    let f32_bits = [0x7fc0_1234u32, 0x8000_0000, 0x0000_0001, 0x7f80_0000, 0xff80_0000, 0x7f7f_ffff, 0x3fc0_0000];
    let f16_bits = [0x7e01u16, 0x8000, 0x0001, 0x7c00, 0x3c00];
    let i32s = [i32::MIN, -1, 0, i32::MAX];
    let u32s = [u32::MAX, 0, 1 << 31];
    let le = |v: &[u32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (fb, hb): (Vec<u8>, Vec<u8>) = (le(&f32_bits), f16_bits.iter().flat_map(|x| x.to_le_bytes()).collect());
    let (ib, ub): (Vec<u8>, Vec<u8>) = (i32s.iter().flat_map(|x| x.to_le_bytes()).collect(), le(&u32s));
    let views = vec![
        ("f", TensorView::new(Dtype::F32, vec![7], &fb).unwrap()),
        ("h", TensorView::new(Dtype::F16, vec![5], &hb).unwrap()),
        ("i", TensorView::new(Dtype::I32, vec![2, 2], &ib).unwrap()),
        ("u", TensorView::new(Dtype::U32, vec![3], &ub).unwrap()),
    ];
    let bytes = safetensors::serialize(views, None).unwrap();
    for d in common::devices() {
        let f = st::load_bytes(&bytes, &d).unwrap();
        let got: Vec<u32> = f.tensors["f"].to_vec_blocking::<f32>().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, f32_bits, "f32 on {d}");
        let got: Vec<u16> =
            f.tensors["h"].to_vec_blocking::<tessera::f16>().unwrap().iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, f16_bits, "f16 on {d}");
        assert_eq!(f.tensors["i"].to_vec_blocking::<i32>().unwrap(), i32s, "i32 on {d}");
        assert_eq!(f.tensors["u"].to_vec_blocking::<u32>().unwrap(), u32s, "u32 on {d}");
        // And they compute: the f32 tensor's finite values doubled.
        let doubled = (f.tensors["f"].narrow(0, 5, 2) * 2.0).to_vec_blocking::<f32>().unwrap();
        assert_eq!(doubled, vec![f32::INFINITY, 3.0], "{d}");
    }
}

#[test]
fn from_slice_uploads_bit_exact() {
    // Host values on every device (natively with no f64 in between on the GPU and the
    // CPU backend): the same bits as the file test above, bools, and an odd count of f16.
    let f32s: Vec<f32> =
        [0x7fc0_1234u32, 0x8000_0000, 0x0000_0001, 0x7f80_0000, 0x7f7f_ffff].map(f32::from_bits).to_vec();
    let f16s: Vec<tessera::f16> = [0x7e01u16, 0x8000, 0x0001].map(tessera::f16::from_bits).to_vec();
    let bits32 = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let bits16 = |v: &[tessera::f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for d in common::devices() {
        let f = Tensor::from_slice(&f32s, [5], &d);
        assert_eq!(bits32(&f.to_vec_blocking::<f32>().unwrap()), bits32(&f32s), "f32 on {d}");
        let h = Tensor::from_slice(&f16s, [3], &d);
        assert_eq!(bits16(&h.to_vec_blocking::<tessera::f16>().unwrap()), bits16(&f16s), "f16 on {d}");
        let i = Tensor::from_slice(&[i32::MIN, -1, 0, i32::MAX], [2, 2], &d);
        assert_eq!(i.to_vec_blocking::<i32>().unwrap(), [i32::MIN, -1, 0, i32::MAX], "i32 on {d}");
        let u = Tensor::from_slice(&[u32::MAX, 0, 1 << 31], [3], &d);
        assert_eq!(u.to_vec_blocking::<u32>().unwrap(), [u32::MAX, 0, 1 << 31], "u32 on {d}");
        let b = Tensor::from_slice(&[true, false, true], [3], &d);
        assert_eq!(b.to_vec_blocking::<bool>().unwrap(), [true, false, true], "bool on {d}");
        // They compute, and a count that does not match the shape is still an error.
        let doubled = (Tensor::from_slice(&[1.5f32, -2.0], [2], &d) * 2.0).to_vec_blocking::<f32>().unwrap();
        assert_eq!(doubled, [3.0, -4.0], "{d}");
        let ints = Tensor::from_slice(&[3i32, -4, 7], [3], &d).cast(DType::F32).sum_all();
        assert_eq!(ints.to_vec_blocking::<f32>().unwrap(), [6.0], "{d}");
        assert!(Tensor::from_slice(&[1.0f32, 2.0, 3.0], [2, 2], &d).to_vec_blocking::<f32>().is_err(), "{d}");
    }
}

#[test]
fn tensor_data_with_too_few_bytes_is_an_error() {
    // A GGUF tensor built by hand with fewer bytes than its shape: an error on every
    // device, never a read past the end.
    for d in common::devices() {
        for (dtype, bytes) in [(DType::F32, 11), (DType::F16, 5)] {
            let t = TensorData { name: "w".into(), shape: vec![3], dtype, data: vec![0; bytes] };
            let e = t.to_tensor(&d).to_f64_vec_blocking().unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{dtype} on {d}: {e}");
            assert!(e.to_string().contains(&format!("{bytes} bytes")), "{e}");
        }
        let ok = TensorData { name: "w".into(), shape: vec![3], dtype: DType::F16, data: vec![0; 6] };
        assert_eq!(ok.to_tensor(&d).to_f64_vec_blocking().unwrap(), [0.0; 3], "{d}");
    }
}

#[test]
fn safetensors_save_and_reload() {
    let d = dev();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let w = Tensor::from_slice(&data(6, 1, -1.0, 1.0), [2, 3], &d);
    let tensors = vec![
        ("layer.weight".to_string(), w.clone()),
        ("layer.half".to_string(), w.cast(DType::F16)),
        ("ids".to_string(), Tensor::arange(0.0, 5.0, 1.0, DType::I32, &d)),
        ("mask".to_string(), w.gt_scalar(0.0)),
    ];
    let meta = BTreeMap::from([("step".to_string(), "7".to_string())]);
    st::save(&path, &tensors, &meta).unwrap();
    let mut f = st::load(&path, &d).unwrap();
    assert_eq!(f.metadata, meta);
    for (name, t) in &tensors {
        let back = f.take(name).unwrap();
        assert_eq!(back.dtype(), t.dtype());
        assert_eq!(back.to_f64_vec_blocking().unwrap(), t.to_f64_vec_blocking().unwrap(), "{name}");
    }
    assert!(f.take("nope").is_err());
    assert!(matches!(st::load(dir.path().join("missing"), &d), Err(Error::Io { .. })));
    assert!(matches!(st::load_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad", &d), Err(Error::Format { .. })));
}

fn sample_file(d: &Device) -> GgufFile {
    let vals = data(4 * 64, 3, -2.0, 2.0);
    let f = Tensor::from_slice(&vals, [4, 64], d);
    let data = pollster::block_on(gguf::tensors_to_data(&[
        ("w.f32".to_string(), f.clone()),
        ("w.f16".to_string(), f.cast(DType::F16)),
        ("w.q8".to_string(), tessera::quant::quantize_tensor_blocking(&f, DType::Q8_0).unwrap()),
        ("w.q4".to_string(), tessera::quant::quantize_tensor_blocking(&f, DType::Q4_0).unwrap()),
    ]))
    .unwrap();
    GgufFile {
        version: 3,
        metadata: vec![
            ("general.architecture".into(), Value::String("bert".into())),
            ("general.alignment".into(), Value::U32(32)),
            ("bert.block_count".into(), Value::U32(6)),
            ("scale".into(), Value::F32(0.125)),
            ("flags".into(), Value::Array(7, vec![Value::Bool(true), Value::Bool(false)])),
            ("empty".into(), Value::Array(8, vec![])),
            ("big".into(), Value::I64(-5)),
        ],
        tensors: data,
    }
}

#[test]
fn gguf_round_trips_exactly() {
    for d in [dev(), Device::reference()] {
        let file = sample_file(&d);
        let bytes = gguf::to_bytes(&file).unwrap();
        let back = gguf::parse(&bytes).unwrap();
        assert_eq!(back, file);
        assert_eq!(gguf::to_bytes(&back).unwrap(), bytes, "write(read(x)) == x");
        // On disk too, and into device tensors with the right dtypes.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf");
        gguf::write(&p, &file).unwrap();
        let f2 = gguf::read(&p).unwrap();
        let ts = f2.to_tensors(&d).unwrap();
        assert_eq!(ts["w.q4"].dtype(), DType::Q4_0);
        assert_eq!(ts["w.q8"].dims(), &[4, 64]);
        assert_eq!(ts["w.q8"].quantized_blocks_blocking().unwrap(), file.tensors[2].data);
        assert_eq!(ts["w.f16"].dtype(), DType::F16);
    }
}

#[test]
fn gguf_rejects_bad_files_clearly() {
    let bytes = gguf::to_bytes(&sample_file(&Device::reference())).unwrap();
    assert!(gguf::parse(b"GGML\x03\x00\x00\x00").unwrap_err().to_string().contains("magic"));
    // Every truncation is an error, never a panic.
    for cut in (0..bytes.len()).step_by(7) {
        assert!(gguf::parse(&bytes[..cut]).is_err(), "prefix of {cut} bytes parsed");
    }
    // An unsupported tensor type names the type and the tensor.
    let mut f = GgufFile { version: 3, metadata: vec![], tensors: vec![] };
    f.tensors.push(TensorData { name: "blk.0.ffn".into(), shape: vec![32], dtype: DType::F32, data: vec![0; 128] });
    let mut b = gguf::to_bytes(&f).unwrap();
    let type_at = 4 + 4 + 8 + 8 + 8 + "blk.0.ffn".len() + 4 + 8;
    b[type_at..type_at + 4].copy_from_slice(&12u32.to_le_bytes()); // Q4_K
    let e = gguf::parse(&b).unwrap_err().to_string();
    assert!(e.contains("unsupported tensor type Q4_K in tensor \"blk.0.ffn\""), "{e}");
    // A count that could never fit in the file is refused before allocating.
    let mut huge = b"GGUF".to_vec();
    huge.extend(3u32.to_le_bytes());
    huge.extend(u64::MAX.to_le_bytes());
    huge.extend(0u64.to_le_bytes());
    assert!(gguf::parse(&huge).unwrap_err().to_string().contains("tensor count"));
}
