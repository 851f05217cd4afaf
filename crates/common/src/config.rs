//! Layered configuration, highest first: flag, env (both handled by clap),
//! `--config FILE.toml`, built-in default. Each service's flag struct has
//! all-optional fields and derives `Deserialize`, so the same struct reads
//! the TOML file.

use serde::de::DeserializeOwned;
use std::path::Path;

/// Reads a TOML config file into `T`, with errors that name the file.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> crate::Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::Error::invalid(format!("cannot read config file {}: {e}", path.display()))
    })?;
    toml::from_str(&text)
        .map_err(|e| crate::Error::invalid(format!("invalid config file {}: {e}", path.display())))
}

/// Fills every `None` field of `$dst` from `$src` (the config file).
#[macro_export]
macro_rules! merge_opts {
    ($dst:expr, $src:expr, [$($f:ident),* $(,)?]) => {
        $( if $dst.$f.is_none() { $dst.$f = $src.$f.take(); } )*
    };
}
