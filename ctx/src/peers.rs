//! Peer access: which other devices of the host may read and write a pool's
//! memory ([`PeerSet`]), and which pairs of devices can reach each other at
//! all ([`PeerLinks`]). Every pool grants its mappings to its peers in one
//! place, the mapper (mapping.rs), so every kind of pool grants and counts
//! alike.

use crate::{Error, Result};

/// Devices by ordinal, 0 to 63: the peers a pool grants access to
/// ([`crate::PoolConfig::peers`]). The empty set, the default, grants
/// nothing.
///
/// ```
/// use ctx::PeerSet;
/// let peers = PeerSet::of(&[1, 3])?;
/// assert_eq!(peers.iter().collect::<Vec<_>>(), [1, 3]);
/// assert!(peers.contains(3) && !peers.contains(0));
/// assert_eq!(peers.without(3), PeerSet::of(&[1])?);
/// assert_eq!(PeerSet::first(3), PeerSet::of(&[0, 1, 2])?);
/// assert!(PeerSet::of(&[64]).is_err());
/// # Ok::<(), ctx::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PeerSet(u64);

impl PeerSet {
    /// No peers.
    pub const NONE: PeerSet = PeerSet(0);
    /// One past the highest ordinal a set holds.
    pub const MAX_DEVICES: u32 = 64;

    /// The devices `ordinals`; an ordinal of 64 or more is
    /// [`Error::InvalidConfig`].
    pub fn of(ordinals: &[u32]) -> Result<Self> {
        let mut bits = 0u64;
        for &ordinal in ordinals {
            if ordinal >= Self::MAX_DEVICES {
                return Err(Error::InvalidConfig(
                    "a peer device ordinal must be below 64",
                ));
            }
            bits |= 1 << ordinal;
        }
        Ok(PeerSet(bits))
    }

    /// Devices 0 to `count - 1` (all 64 for a count of 64 or more).
    pub const fn first(count: u32) -> Self {
        if count >= Self::MAX_DEVICES {
            PeerSet(u64::MAX)
        } else {
            PeerSet((1u64 << count) - 1)
        }
    }

    /// The set without `ordinal` (a pool's own device needs no grant).
    pub const fn without(self, ordinal: u32) -> Self {
        if ordinal >= Self::MAX_DEVICES {
            self
        } else {
            PeerSet(self.0 & !(1u64 << ordinal))
        }
    }

    /// The devices of both sets.
    pub const fn union(self, other: PeerSet) -> Self {
        PeerSet(self.0 | other.0)
    }

    /// Whether `ordinal` is in the set.
    pub const fn contains(self, ordinal: u32) -> bool {
        ordinal < Self::MAX_DEVICES && self.0 & (1u64 << ordinal) != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// How many devices the set holds.
    pub const fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// The ordinals, ascending.
    pub fn iter(self) -> impl Iterator<Item = u32> {
        (0..Self::MAX_DEVICES).filter(move |&i| self.contains(i))
    }
}

/// Which devices of a host can reach which others' memory: the answers of
/// `cuDeviceCanAccessPeer` for every ordered pair, or what a set of
/// [`SimDevice`](crate::SimDevice)s is told.
///
/// ```
/// use ctx::PeerLinks;
/// let links = PeerLinks::all(3).without(2, 0);
/// assert!(links.can_access(0, 2) && !links.can_access(2, 0));
/// assert!(links.can_access(1, 1), "a device reaches its own memory");
/// assert!(!links.can_access(0, 3), "no device 3");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLinks {
    /// Devices on the host.
    count: u32,
    /// Row `from`: the devices whose memory device `from` can access.
    reach: [PeerSet; PeerSet::MAX_DEVICES as usize],
}

impl PeerLinks {
    /// `count` devices (at most 64) of which none reaches another's memory.
    pub const fn none(count: u32) -> Self {
        let count = if count > PeerSet::MAX_DEVICES {
            PeerSet::MAX_DEVICES
        } else {
            count
        };
        let mut reach = [PeerSet::NONE; PeerSet::MAX_DEVICES as usize];
        let mut i = 0;
        while i < count {
            reach[i as usize] = PeerSet(1 << i);
            i += 1;
        }
        Self { count, reach }
    }

    /// `count` devices (at most 64), each reaching every other's memory.
    pub const fn all(count: u32) -> Self {
        let mut links = Self::none(count);
        let mut i = 0;
        while i < links.count {
            links.reach[i as usize] = PeerSet::first(links.count);
            i += 1;
        }
        links
    }

    /// As `self`, with device `from` able to access `to`'s memory too.
    pub const fn with(mut self, from: u32, to: u32) -> Self {
        if from < self.count && to < self.count {
            self.reach[from as usize] = self.reach[from as usize].union(PeerSet(1 << to));
        }
        self
    }

    /// As `self`, without device `from`'s access to `to`'s memory (a
    /// device's own memory stays its own).
    pub const fn without(mut self, from: u32, to: u32) -> Self {
        if from < self.count && from != to {
            self.reach[from as usize] = self.reach[from as usize].without(to);
        }
        self
    }

    /// Devices on the host.
    pub const fn device_count(&self) -> u32 {
        self.count
    }

    /// Whether device `from` can read and write memory of device `to`.
    pub const fn can_access(&self, from: u32, to: u32) -> bool {
        from < self.count && self.reach[from as usize].contains(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_hold_ordinals_below_64_only() {
        assert!(PeerSet::of(&[63]).unwrap().contains(63));
        assert!(PeerSet::of(&[64]).is_err());
        assert!(!PeerSet::NONE.contains(64));
        assert_eq!(PeerSet::first(64).len(), 64);
        assert_eq!(PeerSet::first(200).len(), 64);
        assert_eq!(PeerSet::first(0), PeerSet::NONE);
        assert_eq!(PeerSet::first(2).without(0), PeerSet::of(&[1]).unwrap());
        assert_eq!(PeerSet::first(2).without(99), PeerSet::first(2));
        assert!(PeerSet::default().is_empty());
    }

    #[test]
    fn links_are_directed_and_bounded() {
        let links = PeerLinks::none(2).with(1, 0);
        assert!(links.can_access(1, 0));
        assert!(!links.can_access(0, 1));
        assert!(links.can_access(0, 0) && links.can_access(1, 1));
        assert!(!links.can_access(2, 2), "past the count");
        assert_eq!(PeerLinks::all(100).device_count(), 64);
        assert!(PeerLinks::all(2).without(0, 0).can_access(0, 0));
    }
}
