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
//! max-granted-pages = 4096
//!
//! [host]                      # host-wide page budgets, split fairly among guests
//! guests = 8                  # each domain may hold 1/guests of each budget
//! # granted-pages = 16384     # default: the platform's grant limit (gntalloc `limit`)
//! mapped-pages = 131072       # guest pages mapped (MRs), all guests together
//! maptrack-entries = 524288   # dom0's maptrack: gnttab_max_maptrack_frames × 512
//! ```

use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use xen_platform::xen::limits::{
    GrantLimits, DEFAULT_GNTALLOC_LIMIT, DEFAULT_MAPTRACK_FRAMES, MAPTRACK_ENTRIES_PER_FRAME,
    MAPTRACK_ENTRIES_PER_MAPPED_PAGE,
};
use xen_platform::Platform;

use crate::device::EngineConfig;
use crate::resources::budget::BudgetLimits;
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
    /// Host-wide page budgets.
    pub host: HostConfig,
}

/// The host-wide page budgets (`[host]`), split fairly among guest domains: one domain may
/// hold at most `1/guests` of each (see [`crate::resources::budget`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct HostConfig {
    /// Guest domains the budgets are split among.
    pub guests: u32,
    /// Pages the backend may grant to all guests together; default: the platform's grant
    /// limit (gntalloc's `limit`, the simulated dom0's grant limit).
    pub granted_pages: Option<u64>,
    /// Guest pages the backend may map (MR pages), all guests together.
    pub mapped_pages: u64,
    /// dom0's maptrack entries (`gnttab_max_maptrack_frames` × 512); Xen does not show it to
    /// dom0 without hypfs, so it is stated here.
    pub maptrack_entries: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        let maptrack_entries = DEFAULT_MAPTRACK_FRAMES * MAPTRACK_ENTRIES_PER_FRAME;
        HostConfig {
            guests: 8,
            granted_pages: None,
            // Half of what the default maptrack can hold: the other half is for blkback,
            // netback and the rest of dom0.
            mapped_pages: maptrack_entries / MAPTRACK_ENTRIES_PER_MAPPED_PAGE / 2,
            maptrack_entries,
        }
    }
}

impl HostConfig {
    /// The budgets on a host with these limits, or why the configuration oversubscribes them.
    pub fn budget(&self, limits: &GrantLimits) -> Result<BudgetLimits, String> {
        if self.guests == 0 {
            return Err("[host] guests must be at least 1".into());
        }
        let granted = match (&limits.grant_pages, self.granted_pages) {
            (Some(l), Some(g)) if g > l.value => {
                return Err(format!(
                    "[host] granted-pages = {g} oversubscribes the host: {} is {}; lower                      [host] granted-pages or raise the limit",
                    l.knob, l.value
                ))
            }
            (_, Some(g)) => g,
            (Some(l), None) => l.value,
            (None, None) => DEFAULT_GNTALLOC_LIMIT,
        };
        let maptrack_needed = self
            .mapped_pages
            .saturating_mul(MAPTRACK_ENTRIES_PER_MAPPED_PAGE);
        if maptrack_needed > self.maptrack_entries {
            return Err(format!(
                "[host] mapped-pages = {} oversubscribes dom0's maptrack: mapping them takes up                  to {maptrack_needed} entries ({MAPTRACK_ENTRIES_PER_MAPPED_PAGE} per page) and                  [host] maptrack-entries is {} (Xen's gnttab_max_maptrack_frames ×                  {MAPTRACK_ENTRIES_PER_FRAME}); lower [host] mapped-pages",
                self.mapped_pages, self.maptrack_entries
            ));
        }
        let budget = BudgetLimits {
            granted_pages: granted,
            mapped_pages: self.mapped_pages,
            guests: self.guests,
        };
        // A channel's Init grants a doorbell and an event-ring page.
        if budget.share(crate::resources::budget::Pool::Granted) < 2 {
            return Err(format!(
                "[host] granted-pages = {granted} split among [host] guests = {} leaves each                  guest fewer than the 2 pages one channel needs",
                self.guests
            ));
        }
        Ok(budget)
    }

    /// [`HostConfig::budget`] on `platform`'s limits; a configuration the host cannot honour
    /// is logged and leaves the host budgets unbounded (library embedders; the daemon refuses
    /// such a configuration at start instead).
    pub fn budget_or_unlimited(&self, platform: &Platform) -> BudgetLimits {
        self.budget(&platform.grant_limits()).unwrap_or_else(|e| {
            tracing::warn!("host page budgets not enforced: {e}");
            BudgetLimits::UNLIMITED
        })
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            log_level: "info".into(),
            engine_threads: 1,
            spin_before_sleep_us: 200,
            quotas: Quotas::default(),
            host: HostConfig::default(),
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
        // What can be checked without the host's limits (they are checked at start).
        let unknown_host = GrantLimits {
            grant_pages: Some(xen_platform::xen::limits::HostLimit {
                value: u64::MAX,
                knob: "the host's grant limit".into(),
            }),
        };
        self.host.budget(&unknown_host).map_err(|e| invalid(&e))?;
        Ok(())
    }

    /// The host page budgets on this host, or the configuration refused because it
    /// oversubscribes the host's limits (the daemon checks this at start).
    pub fn host_budget(
        &self,
        origin: &str,
        limits: &GrantLimits,
    ) -> Result<BudgetLimits, ConfigError> {
        self.host
            .budget(limits)
            .map_err(|what| ConfigError::Invalid {
                path: origin.to_owned(),
                what,
            })
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
    fn host_budgets_refuse_oversubscription_naming_both_knobs() {
        use xen_platform::xen::limits::HostLimit;
        let limits = GrantLimits {
            grant_pages: Some(HostLimit {
                value: 1000,
                knob: "gntalloc's limit (/sys/module/xen_gntalloc/parameters/limit)".into(),
            }),
        };
        let c = Config::parse("[host]\ngranted-pages = 1001\n", "f.toml").unwrap();
        let e = c.host_budget("f.toml", &limits).unwrap_err().to_string();
        assert!(
            e.contains("[host] granted-pages = 1001")
                && e.contains("xen_gntalloc/parameters/limit"),
            "{e}"
        );
        // the default is the host's limit, split among the guests
        let b = Config::default().host_budget("t", &limits).unwrap();
        assert_eq!((b.granted_pages, b.guests), (1000, 8));
        assert_eq!(b.share(crate::resources::budget::Pool::Granted), 125);
        let e = Config::parse("[host]\nmapped-pages = 300000\n", "f.toml").unwrap_err();
        assert!(e.to_string().contains("maptrack-entries"), "{e}");
        let e = Config::parse("[host]\nguests = 0\n", "f.toml").unwrap_err();
        assert!(e.to_string().contains("[host] guests"), "{e}");
    }

    #[test]
    fn mistakes_are_named() {
        let e = Config::parse("engine-thread = 2", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-thread"), "{e}");
        let e = Config::parse("engine-threads = 0", "f.toml").unwrap_err();
        assert!(e.to_string().contains("engine-threads"), "{e}");
    }
}
