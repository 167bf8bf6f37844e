//! Arbitrary bytes into the onnx loader (`tessera::io::fuzz::onnx`): any panic is a bug.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tessera::io::fuzz::onnx(data);
});
