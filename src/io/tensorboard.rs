//! Scalars as TensorBoard event files (`tensorboard --logdir runs` plots them): TFRecord
//! framing (length, masked CRC-32C, payload, masked CRC-32C) around hand-encoded
//! `Event` protocol buffers holding `Summary.Value.simple_value`.

use crate::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

fn masked(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn field_bytes(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(((field as u64) << 3) | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn event(wall_time: f64, step: i64, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut e = Vec::new();
    e.push(0x09); // field 1, fixed64: wall_time
    e.extend_from_slice(&wall_time.to_le_bytes());
    e.push(0x10); // field 2, varint: step
    varint(step as u64, &mut e);
    body(&mut e);
    e
}

/// Writes one `events.out.tfevents.*` file.
pub struct EventWriter {
    file: std::fs::File,
    path: PathBuf,
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl EventWriter {
    /// Create `dir` if needed and start a new event file in it.
    pub fn new(dir: impl AsRef<Path>) -> Result<EventWriter> {
        let dir = dir.as_ref();
        let io = |e: std::io::Error| Error::Io { path: dir.display().to_string(), message: e.to_string() };
        std::fs::create_dir_all(dir).map_err(io)?;
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "tessera".into());
        let path = dir.join(format!("events.out.tfevents.{}.{host}.{}", now() as u64, std::process::id()));
        let file = std::fs::File::create(&path).map_err(io)?;
        let mut w = EventWriter { file, path };
        let e = event(now(), 0, |e| field_bytes(3, b"brain.Event:2", e));
        w.record(&e)?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn record(&mut self, data: &[u8]) -> Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let mut buf = Vec::with_capacity(data.len() + 16);
        buf.extend_from_slice(&len);
        buf.extend_from_slice(&masked(&len).to_le_bytes());
        buf.extend_from_slice(data);
        buf.extend_from_slice(&masked(data).to_le_bytes());
        self.file
            .write_all(&buf)
            .map_err(|e| Error::Io { path: self.path.display().to_string(), message: e.to_string() })
    }

    /// Log `value` under `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, value: f64, step: u64) -> Result<()> {
        let mut v = Vec::new();
        field_bytes(1, tag.as_bytes(), &mut v); // Value.tag
        v.push(0x15); // Value.simple_value, field 2, fixed32
        v.extend_from_slice(&(value as f32).to_le_bytes());
        let mut summary = Vec::new();
        field_bytes(1, &v, &mut summary); // Summary.value
        let e = event(now(), step as i64, |e| field_bytes(5, &summary, e)); // Event.summary
        self.record(&e)
    }

    /// Flush to disk.
    pub fn flush(&mut self) -> Result<()> {
        self.file.flush().map_err(|e| Error::Io { path: self.path.display().to_string(), message: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(super::crc32c(b"123456789"), 0xE306_9283);
    }
}
