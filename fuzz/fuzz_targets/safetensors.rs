//! Arbitrary bytes into the safetensors loader (`tessera::io::fuzz::safetensors`): any panic is a bug.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tessera::io::fuzz::safetensors(data);
});
