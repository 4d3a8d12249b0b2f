//! What a user chooses through the environment: the pool policy, its growth step and
//! the peer devices its memory is granted to.

use ctx::{CompactionPolicy, Growth, PeerSet, PoolConfig, StitchConfig, StitchedConfig};

use crate::error::{Error, Result, cut};

/// The pool behind the allocator (`CUDAMEM_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `tlsf`, the default: ctx's VMM pool (TLSF over one reserved range, mapped from
    /// its start), never moving a block, so the pointers PyTorch holds stay valid.
    Tlsf,
    /// `stitch`: ctx's stitched pool, physical handles mapped wherever the blocks
    /// are; gives back every idle page.
    Stitch,
}

impl Policy {
    /// Every policy's name, for messages.
    pub const KNOWN: &'static str = "tlsf, stitch";

    /// The policy called `name`.
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim() {
            "tlsf" => Ok(Policy::Tlsf),
            "stitch" => Ok(Policy::Stitch),
            other => Err(Error::UnknownPolicy {
                value: cut(other),
                known: Self::KNOWN,
            }),
        }
    }
}

/// The devices a pool grants access to besides its own (`CUDAMEM_PEERS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peers {
    /// These devices, by ordinal (`0,1`; unset or empty: none).
    Devices(PeerSet),
    /// Every device the process sees (`all`).
    All,
}

impl Peers {
    /// The devices a pool on device `own` grants, of the `device_count` devices the
    /// process sees: never its own.
    ///
    /// ```
    /// use ctx::PeerSet;
    /// use cudamem_torch::Peers;
    /// assert_eq!(Peers::All.resolve(1, 3), PeerSet::of(&[0, 2])?);
    /// assert_eq!(Peers::parse("0,1")?.resolve(0, 2), PeerSet::of(&[1])?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resolve(self, own: u32, device_count: u32) -> PeerSet {
        match self {
            Peers::Devices(set) => set.without(own),
            Peers::All => PeerSet::first(device_count).without(own),
        }
    }

    /// `CUDAMEM_PEERS`'s value: `all`, or device ordinals (0 to 63) separated by
    /// commas; empty: none.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("all") {
            return Ok(Peers::All);
        }
        let mut ordinals = Vec::new();
        for part in text.split(',').map(str::trim) {
            if part.is_empty() && !text.is_empty() {
                return Err(Error::BadPeers {
                    value: cut(text),
                    part: String::new(),
                });
            }
            match part.parse::<u32>() {
                Ok(n) if n < PeerSet::MAX_DEVICES => ordinals.push(n),
                _ if part.is_empty() => {}
                _ => {
                    return Err(Error::BadPeers {
                        value: cut(text),
                        part: cut(part),
                    });
                }
            }
        }
        // Every ordinal is below 64, which is all `of` checks.
        Ok(Peers::Devices(PeerSet::of(&ordinals)?))
    }
}

/// The settings of every device's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Which pool.
    pub policy: Policy,
    /// The fewest bytes the TLSF pool maps at once (`CUDAMEM_MIN_GROWTH`), bytes;
    /// rounded up to whole device pages by the pool. The stitched pool sizes its
    /// handles itself.
    ///
    /// The default, one 2 MiB page, maps exactly what requests need: the smallest
    /// footprint. A larger step makes fewer driver calls (each growth is a
    /// `cuMemCreate` + `cuMemMap` + `cuMemSetAccess`, whatever its size) and so a
    /// faster warm-up, at the price of holding up to one step more than needed.
    pub min_growth_bytes: u64,
    /// The TLSF pool's [`PoolConfig::growth_divisor`] (`CUDAMEM_GROWTH_DIVISOR`).
    pub growth_divisor: u32,
    /// The devices each pool grants access to (`CUDAMEM_PEERS`), resolved per device by
    /// [`Peers::resolve`].
    pub peers: Peers,
}

impl Default for Settings {
    /// What an empty environment says: the TLSF pool, 2 MiB growth, no peers.
    fn default() -> Self {
        Self {
            policy: Policy::Tlsf,
            min_growth_bytes: Self::DEFAULT_MIN_GROWTH_BYTES,
            growth_divisor: Self::DEFAULT_GROWTH_DIVISOR,
            peers: Peers::Devices(PeerSet::NONE),
        }
    }
}

impl Settings {
    /// `CUDAMEM_GROWTH_DIVISOR` when unset: off. Growing by a share of the mapped bytes
    /// (e.g. 16: every growth of a pool past 512 MiB is a handle of 32 MiB, which copies
    /// at full bandwidth) leaves a free tail that small blocks carve up, which raised
    /// ResNet-50's peak (BENCHMARKS.md, "Two GPUs").
    pub const DEFAULT_GROWTH_DIVISOR: u32 = 0;

    /// `CUDAMEM_MIN_GROWTH` when unset: one VMM page, bytes.
    pub const DEFAULT_MIN_GROWTH_BYTES: u64 = memcore::PAGE_BYTES;

    /// The settings from `CUDAMEM_POLICY`, `CUDAMEM_MIN_GROWTH`, `CUDAMEM_GROWTH_DIVISOR`
    /// and `CUDAMEM_PEERS`.
    pub fn from_env() -> Result<Self> {
        let policy = std::env::var("CUDAMEM_POLICY").ok();
        let growth = std::env::var("CUDAMEM_MIN_GROWTH").ok();
        let mut settings = Self::parse(policy.as_deref(), growth.as_deref())?;
        if let Ok(divisor) = std::env::var("CUDAMEM_GROWTH_DIVISOR") {
            settings.growth_divisor =
                divisor
                    .trim()
                    .parse()
                    .map_err(|_| Error::BadGrowthDivisor {
                        value: cut(&divisor),
                    })?;
        }
        if let Ok(peers) = std::env::var("CUDAMEM_PEERS") {
            settings.peers = Peers::parse(&peers)?;
        }
        Ok(settings)
    }

    /// The settings from the two variables' values (`None`: unset), with no peers.
    ///
    /// ```
    /// use cudamem_torch::{Policy, Settings};
    /// let s = Settings::parse(None, Some("64M"))?;
    /// assert_eq!((s.policy, s.min_growth_bytes), (Policy::Tlsf, 64 << 20));
    /// assert_eq!(Settings::parse(Some("stitch"), None)?.policy, Policy::Stitch);
    /// assert!(Settings::parse(Some("buddy"), None).is_err());
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
                memcore::bytes::parse(text).map_err(|_| Error::BadMinGrowth { value: cut(text) })?
            }
        };
        Ok(Settings {
            policy,
            min_growth_bytes,
            ..Settings::default()
        })
    }

    /// The TLSF pool's configuration for a device whose reservation is
    /// `reserve_bytes` and whose memory `peers` may read and write too.
    pub fn pool_config(&self, reserve_bytes: u64, peers: PeerSet) -> PoolConfig {
        PoolConfig {
            growth: Growth::Vmm,
            compaction: CompactionPolicy::Never,
            reserve_bytes,
            max_bytes: u64::MAX,
            min_growth_bytes: self.min_growth_bytes,
            growth_divisor: self.growth_divisor,
            peers,
        }
    }

    /// The stitched pool's configuration for a device with `capacity_bytes` free for
    /// it and whose memory `peers` may read and write too: ctx's default reservation
    /// and memcore's default policy, creating no handle past the capacity (large
    /// handles fall back to pages near it).
    pub fn stitched_config(&self, capacity_bytes: u64, peers: PeerSet) -> StitchedConfig {
        let stitch = StitchConfig {
            capacity_bytes,
            ..StitchConfig::default()
        };
        StitchedConfig {
            peers,
            stitch,
            ..StitchedConfig::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_named_and_cut() {
        let long = "x".repeat(200);
        let err = Settings::parse(Some(&long), None).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("CUDAMEM_POLICY"), "{text}");
        assert!(text.contains("known: tlsf, stitch"), "{text}");
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
        let config = s.pool_config(1 << 30, PeerSet::NONE);
        assert_eq!(config.compaction, CompactionPolicy::Never);
        assert_eq!(config.growth, Growth::Vmm);
        assert_eq!(config.min_growth_bytes, 2 << 20);
        assert_eq!(s.peers, Peers::Devices(PeerSet::NONE));
    }

    #[test]
    fn peers_parse_and_never_include_the_own_device() {
        let set = |o: &[u32]| PeerSet::of(o).unwrap();
        assert_eq!(Peers::parse("all").unwrap(), Peers::All);
        assert_eq!(Peers::parse(" ALL ").unwrap(), Peers::All);
        assert_eq!(Peers::parse("0, 1").unwrap(), Peers::Devices(set(&[0, 1])));
        assert_eq!(Peers::parse("").unwrap(), Peers::Devices(PeerSet::NONE));
        assert_eq!(Peers::All.resolve(0, 2), set(&[1]));
        assert_eq!(Peers::All.resolve(0, 1), PeerSet::NONE);
        assert_eq!(Peers::parse("0,1,3").unwrap().resolve(1, 8), set(&[0, 3]));
        for (bad, part) in [
            ("0,x", "\"x\""),
            ("64", "\"64\""),
            ("-1", "\"-1\""),
            ("1;2", "\"1;2\""),
            ("0,,1", "\"\""),
        ] {
            let err = Peers::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("CUDAMEM_PEERS={bad:?}")), "{err}");
            assert!(err.ends_with(&format!("the bad part: {part}")), "{err}");
        }
        let long = "7,".repeat(100) + "y";
        let err = Peers::parse(&long).unwrap_err().to_string();
        assert!(err.len() < 300, "{err}");
        assert!(err.ends_with("the bad part: \"y\""), "{err}");
    }
}
