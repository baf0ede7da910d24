//! The daemon's configuration file (TOML, every key optional):
//!
//! ```toml
//! log-level = "info"          # tracing filter (RUST_LOG, when set, wins)
//! engine-threads = 1          # software device engine threads
//! spin-before-sleep-us = 200  # how long an idle engine polls before it sleeps
//!
//! [quotas]                    # per guest device, when the backend node has no max-* key
//! max-channels = 16
//! max-pds = 64
//! max-mrs = 1024
//! max-mr-pages = 262144
//! max-cqs = 256
//! max-qps = 256
//! ```

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::device::EngineConfig;
use crate::resources::Quotas;

/// Where the configuration file is looked for when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/vrdma/backend.toml";

/// The daemon's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// A `tracing` filter: `info`, `debug`, `vrdma_backend=trace,info`, ...
    pub log_level: String,
    /// Engine threads of the software device (at least 1).
    pub engine_threads: usize,
    /// Microseconds an idle engine keeps polling doorbells before it sleeps.
    pub spin_before_sleep_us: u64,
    /// Default quotas of a guest device (the backend node's `max-*` keys override them).
    pub quotas: Quotas,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_level: "info".into(),
            engine_threads: 1,
            spin_before_sleep_us: 200,
            quotas: Quotas::default(),
        }
    }
}

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: String, what: String },
}

impl Config {
    /// Parses TOML text (`origin` names it in errors).
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: origin.to_owned(),
            source,
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// `path` if given (it must exist), else [`DEFAULT_CONFIG_PATH`] if it exists, else the
    /// defaults.
    pub fn load_or_default(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            Some(p) => Config::load(p),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                Config::load(Path::new(DEFAULT_CONFIG_PATH))
            }
            None => Ok(Config::default()),
        }
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |what: &str| ConfigError::Invalid {
            path: origin.to_owned(),
            what: what.to_owned(),
        };
        if self.engine_threads == 0 || self.engine_threads > 256 {
            return Err(invalid("engine-threads must be between 1 and 256"));
        }
        if self.spin_before_sleep_us > 10_000_000 {
            return Err(invalid(
                "spin-before-sleep-us must be at most 10000000 (10 s)",
            ));
        }
        Ok(())
    }

    /// The software device's engine settings.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            threads: self.engine_threads,
            spin: Duration::from_micros(self.spin_before_sleep_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_defaults() {
        assert_eq!(Config::parse("", "t").unwrap(), Config::default());
    }

    #[test]
    fn documented_example_parses() {
        let text = r#"
            log-level = "debug"
            engine-threads = 4
            spin-before-sleep-us = 50
            [quotas]
            max-qps = 8
        "#;
        let c = Config::parse(text, "t").unwrap();
        assert_eq!(c.log_level, "debug");
        assert_eq!(c.engine().threads, 4);
        assert_eq!(c.engine().spin, Duration::from_micros(50));
        assert_eq!(c.quotas.max_qps, 8);
        assert_eq!(c.quotas.max_cqs, Quotas::default().max_cqs);
    }

    #[test]
    fn mistakes_are_named() {
        let e = Config::parse("engine-thread = 2", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-thread"), "{e}");
        let e = Config::parse("engine-threads = 0", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-threads"), "{e}");
    }
}
