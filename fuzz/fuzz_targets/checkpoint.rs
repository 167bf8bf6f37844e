//! Arbitrary bytes into the checkpoint loader (`tessera::io::fuzz::checkpoint`): any panic is a bug.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tessera::io::fuzz::checkpoint(data);
});
