//! `--wal`: how the write-ahead log makes a batch of records durable.

/// How a batch of records is made durable before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WalMode {
    /// No log.
    None = 0,
    /// `write()` only: survives a crash of the process.
    Buffered = 1,
    /// `write()` and `fdatasync()`: survives a crash of the machine.
    Fsync = 2,
}

impl WalMode {
    /// The mode a log segment's header names.
    pub fn from_byte(b: u8) -> Option<WalMode> {
        match b {
            0 => Some(WalMode::None),
            1 => Some(WalMode::Buffered),
            2 => Some(WalMode::Fsync),
            _ => None,
        }
    }
}

impl std::str::FromStr for WalMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(WalMode::None),
            "buffered" => Ok(WalMode::Buffered),
            "fsync" => Ok(WalMode::Fsync),
            other => Err(format!(
                "invalid value {other:?} for --wal: expected none, buffered or fsync"
            )),
        }
    }
}

impl std::fmt::Display for WalMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WalMode::None => "none",
            WalMode::Buffered => "buffered",
            WalMode::Fsync => "fsync",
        })
    }
}
