//! What a user chooses through the environment: the pool policy and its growth step.

use ctx::{CompactionPolicy, Growth, PoolConfig};

use crate::error::{Error, Result, cut};

/// The pool behind the allocator (`CUDAMEM_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `tlsf`, the default: ctx's VMM pool (TLSF over one reserved range), never
    /// moving a block, so the pointers PyTorch holds stay valid.
    Tlsf,
}

impl Policy {
    /// Every policy's name, for messages.
    pub const KNOWN: &'static str = "tlsf";

    /// The policy called `name`.
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim() {
            "tlsf" => Ok(Policy::Tlsf),
            other => Err(Error::UnknownPolicy {
                value: cut(other),
                known: Self::KNOWN,
            }),
        }
    }
}

/// The settings of every device's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Which pool.
    pub policy: Policy,
    /// The fewest bytes the pool maps at once (`CUDAMEM_MIN_GROWTH`), bytes; rounded up
    /// to whole device pages by the pool.
    ///
    /// The default, one 2 MiB page, maps exactly what requests need: the smallest
    /// footprint. A larger step makes fewer driver calls (each growth is a
    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, whatever its size) and so a
    /// faster warm-up, at the price of holding up to one step more than needed.
    pub min_growth_bytes: u64,
}

impl Settings {
    /// `CUDAMEM_MIN_GROWTH` when unset: one H200 VMM page, bytes.
    pub const DEFAULT_MIN_GROWTH_BYTES: u64 = 2 << 20;

    /// The settings from `CUDAMEM_POLICY` and `CUDAMEM_MIN_GROWTH`.
    pub fn from_env() -> Result<Self> {
        let policy = std::env::var("CUDAMEM_POLICY").ok();
        let growth = std::env::var("CUDAMEM_MIN_GROWTH").ok();
        Self::parse(policy.as_deref(), growth.as_deref())
    }

    /// The settings from the two variables' values (`None`: unset).
    ///
    /// ```
    /// use cudamem_torch::{Policy, Settings};
    /// let s = Settings::parse(None, Some("64M"))?;
    /// assert_eq!((s.policy, s.min_growth_bytes), (Policy::Tlsf, 64 << 20));
    /// assert!(Settings::parse(Some("stitch"), None).is_err());
    /// # Ok::<(), cudamem_torch::Error>(())
    /// ```
    pub fn parse(policy: Option<&str>, min_growth: Option<&str>) -> Result<Self> {
        let policy = match policy {
            None => Policy::Tlsf,
            Some(name) if name.trim().is_empty() => Policy::Tlsf,
            Some(name) => Policy::parse(name)?,
        };
        let min_growth_bytes = match min_growth {
            None => Self::DEFAULT_MIN_GROWTH_BYTES,
            Some(text) => {
                parse_bytes(text).ok_or_else(|| Error::BadMinGrowth { value: cut(text) })?
            }
        };
        Ok(Settings {
            policy,
            min_growth_bytes,
        })
    }

    /// The pool configuration for a device whose reservation is `reserve_bytes`.
    pub fn pool_config(&self, reserve_bytes: u64) -> PoolConfig {
        match self.policy {
            Policy::Tlsf => PoolConfig {
                growth: Growth::Vmm,
                compaction: CompactionPolicy::Never,
                reserve_bytes,
                max_bytes: u64::MAX,
                min_growth_bytes: self.min_growth_bytes,
            },
        }
    }
}

/// `"2097152"`, `"2M"`, `"2MiB"`, `"1g"` as bytes (binary multiples).
fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    number.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("2097152"), Some(2 << 20));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("1 GiB"), Some(1 << 30));
        assert_eq!(parse_bytes("3k"), Some(3 << 10));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-2M"), None);
        assert_eq!(parse_bytes("99999999999999999999G"), None);
    }

    #[test]
    fn bad_values_are_named_and_cut() {
        let long = "x".repeat(200);
        let err = Settings::parse(Some(&long), None).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("CUDAMEM_POLICY"), "{text}");
        assert!(text.contains("known: tlsf"), "{text}");
        assert!(text.len() < 150, "{text}");
        let err = Settings::parse(None, Some("big")).unwrap_err();
        assert!(
            err.to_string().contains("CUDAMEM_MIN_GROWTH=\"big\""),
            "{err}"
        );
    }

    #[test]
    fn the_pool_never_moves_blocks() {
        let s = Settings::parse(Some("tlsf"), None).unwrap();
        let config = s.pool_config(1 << 30);
        assert_eq!(config.compaction, CompactionPolicy::Never);
        assert_eq!(config.growth, Growth::Vmm);
        assert_eq!(config.min_growth_bytes, 2 << 20);
    }
}
