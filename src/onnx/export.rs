//! Export (in progress).
use crate::{Error, Result};

pub fn export() -> Result<()> {
    Err(Error::Unsupported("export".into()))
}

pub fn export_bytes() -> Result<Vec<u8>> {
    Err(Error::Unsupported("export".into()))
}
