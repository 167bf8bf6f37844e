//! Arbitrary bytes into the gguf loader (`tessera::io::fuzz::gguf`): any panic is a bug.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tessera::io::fuzz::gguf(data);
});
