//! The allocation history PyTorch's memory snapshots show (`_record_memory_history`):
//! a ring of trace entries, and the stacks ("contexts") they and the live blocks name.
//!
//! Stacks are gathered on the C++ side, where PyTorch's recorder runs, and named here by
//! a number. This module counts who holds each number (a live block, a trace entry);
//! a number nobody holds any more is "dead", and the C++ side drops its stack when it
//! takes the dead numbers ([`History::take_dead`]).

use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::pool_id::PoolId;

/// No stack: what a call passes when history is off.
pub const NO_CONTEXT: u64 = 0;

/// Which stacks PyTorch keeps (its `RecordContext`), least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum RecordContext {
    /// None.
    #[default]
    Never,
    /// The stack of every live block (shown in a snapshot's segments).
    State,
    /// Also the stacks of allocations in the trace.
    Alloc,
    /// Also the stacks of frees in the trace.
    All,
}

impl RecordContext {
    /// The level PyTorch's number names (0 to 3); `None` for any other.
    pub fn from_raw(raw: u32) -> Option<Self> {
        Some(match raw {
            0 => Self::Never,
            1 => Self::State,
            2 => Self::Alloc,
            3 => Self::All,
            _ => return None,
        })
    }

    /// PyTorch's number for the level.
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// What a trace entry records: memcore's statement of PyTorch's
/// `TraceEntry::Action`.
pub use memcore::pytorch::TraceAction;

/// `action`'s bit in a mask of skipped actions.
fn bit(action: TraceAction) -> u32 {
    1 << action.raw()
}

/// One entry of the trace, as a snapshot's `device_traces` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The block's or segment's device address; for [`TraceAction::Oom`], the
    /// device's free bytes.
    pub addr: u64,
    /// Bytes: what was requested (blocks), or the segment's size.
    pub size: u64,
    /// The stream (its handle as a number).
    pub stream: u64,
    /// The private pool, or [`PoolId::DEFAULT`].
    pub pool: PoolId,
    /// When, microseconds since the Unix epoch.
    pub time_us: i64,
    /// The stack, or [`NO_CONTEXT`].
    pub context: u64,
}

/// How history is recorded: what `_record_memory_history` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HistorySettings {
    /// Whether trace entries are recorded.
    pub enabled: bool,
    /// Which stacks are kept.
    pub when: RecordContext,
    /// The most entries kept; older ones are dropped first.
    pub max_entries: usize,
    /// Actions not recorded, one bit per [`TraceAction::raw`].
    pub skip: u32,
}

impl HistorySettings {
    /// `skip` from PyTorch's action names; an unknown name is `Err` with it.
    pub fn skip_mask<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<u32, String> {
        let mut mask = 0;
        for name in names {
            let action = TraceAction::from_name(name).ok_or_else(|| name.to_owned())?;
            mask |= bit(action);
        }
        Ok(mask)
    }
}

/// The ring of trace entries and the holders of every stack number.
#[derive(Debug, Default)]
pub struct History {
    settings: HistorySettings,
    entries: VecDeque<TraceEntry>,
    /// Holders of each stack number; a number at zero is dead.
    holders: HashMap<u64, u32>,
    dead: Vec<u64>,
}

impl History {
    /// The settings now.
    pub fn settings(&self) -> HistorySettings {
        self.settings
    }

    /// Applies `_record_memory_history`'s settings; `clear` (or turning it off) drops
    /// the entries recorded so far.
    pub fn configure(&mut self, settings: HistorySettings, clear: bool) {
        self.settings = HistorySettings {
            max_entries: settings.max_entries.max(1),
            ..settings
        };
        if clear || !settings.enabled {
            let dropped: Vec<u64> = self.entries.drain(..).map(|e| e.context).collect();
            dropped.into_iter().for_each(|c| self.release(c));
        }
        while self.entries.len() > self.settings.max_entries {
            if let Some(old) = self.entries.pop_front() {
                self.release(old.context);
            }
        }
    }

    /// Whether stacks of live blocks are kept.
    pub fn keeps_block_stacks(&self) -> bool {
        self.settings.when >= RecordContext::State
    }

    /// Records an entry (when enabled and not skipped); `context` is the stack to name,
    /// kept only when the settings keep stacks in the trace.
    pub fn record(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: u64,
        pool: PoolId,
        context: u64,
    ) {
        let settings = self.settings;
        if !settings.enabled || settings.skip & bit(action) != 0 {
            return;
        }
        let context = if settings.when >= RecordContext::Alloc {
            context
        } else {
            NO_CONTEXT
        };
        self.hold(context);
        if self.entries.len() >= settings.max_entries {
            if let Some(old) = self.entries.pop_front() {
                self.release(old.context);
            }
        }
        self.entries.push_back(TraceEntry {
            action,
            addr,
            size,
            stream,
            pool,
            time_us: now_us(),
            context,
        });
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &TraceEntry> {
        self.entries.iter()
    }

    /// One more holder of `context` (nothing for [`NO_CONTEXT`]).
    pub fn hold(&mut self, context: u64) {
        if context != NO_CONTEXT {
            *self.holders.entry(context).or_default() += 1;
        }
    }

    /// One holder fewer; at none, the number is dead.
    pub fn release(&mut self, context: u64) {
        if context == NO_CONTEXT {
            return;
        }
        match self.holders.get_mut(&context) {
            Some(count) if *count > 1 => *count -= 1,
            _ => {
                self.holders.remove(&context);
                self.dead.push(context);
            }
        }
    }

    /// A number the caller handed in for this call: held for the call by the caller's
    /// own [`hold`](Self::hold), given up by [`release`](Self::release) at its end, so a
    /// number nothing kept dies at once.
    pub fn received(&mut self, context: u64) {
        self.hold(context);
    }

    /// How many numbers died and were not taken yet.
    pub fn dead_count(&self) -> usize {
        self.dead.len()
    }

    /// Takes up to `max` dead numbers.
    pub fn take_dead(&mut self, max: usize) -> Vec<u64> {
        let keep = self.dead.len().saturating_sub(max);
        self.dead.split_off(keep)
    }

    /// How many numbers are held now.
    pub fn held_count(&self) -> usize {
        self.holders.len()
    }
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_newest_and_frees_the_stacks_it_drops() {
        let mut history = History::default();
        history.configure(
            HistorySettings {
                enabled: true,
                when: RecordContext::Alloc,
                max_entries: 2,
                skip: 0,
            },
            false,
        );
        for context in 1..=3 {
            history.received(context);
            history.record(
                TraceAction::Alloc,
                context,
                512,
                0,
                PoolId::DEFAULT,
                context,
            );
            history.release(context);
        }
        let kept: Vec<u64> = history.entries().map(|e| e.addr).collect();
        assert_eq!(kept, [2, 3]);
        assert_eq!(history.take_dead(10), [1]);
        assert_eq!(history.held_count(), 2);
        history.configure(HistorySettings::default(), false);
        assert_eq!(history.entries().count(), 0, "turning it off clears it");
        let mut dead = history.take_dead(10);
        dead.sort_unstable();
        assert_eq!(dead, [2, 3]);
    }

    #[test]
    fn stacks_are_kept_in_the_trace_only_from_alloc_on() {
        let mut history = History::default();
        let settings = HistorySettings {
            enabled: true,
            when: RecordContext::State,
            max_entries: 10,
            skip: HistorySettings::skip_mask(["free_requested"]).unwrap(),
        };
        history.configure(settings, false);
        history.received(7);
        history.record(TraceAction::Alloc, 1, 2, 3, PoolId::DEFAULT, 7);
        history.record(TraceAction::FreeRequested, 1, 2, 3, PoolId::DEFAULT, 7);
        history.release(7);
        let entries: Vec<TraceEntry> = history.entries().copied().collect();
        assert_eq!(entries.len(), 1, "free_requested is skipped");
        assert_eq!(entries[0].context, NO_CONTEXT);
        assert_eq!(history.take_dead(1), [7]);
        assert!(HistorySettings::skip_mask(["nonsense"]).is_err());
    }
}
