//! [`TraceBuilder`]: a trace built record by record, each checked against
//! the live set, with frees of blocks allocated before the recording taken
//! as live from the start.

use std::collections::{BTreeMap, HashSet};

use crate::{
    Event, Location, MAX_REQUEST_BYTES, Noted, Oddity, Problem, SkipReason, Skipped, Trace,
};

/// Builds a [`Trace`] record by record, checking each against the live set.
#[derive(Debug)]
pub struct TraceBuilder {
    name: String,
    /// Live allocations by pointer, in address order (for overlaps).
    live: BTreeMap<u64, (u32, u64)>,
    /// Pointers allocated at some point of the trace.
    seen: HashSet<u64>,
    /// Blocks freed but never allocated: (id, size, where the free was).
    assumed: Vec<(u32, u64, Location)>,
    /// Bytes of the assumed blocks, all live from the start.
    assumed_bytes: u64,
    events: Vec<Event>,
    locations: Vec<Location>,
    allocations: u32,
    live_bytes: u64,
    peak_live_bytes: u64,
    peak_live_event: usize,
    /// First and last time seen, nanoseconds.
    times: Option<(u64, u64)>,
    /// As [`Trace::clock`]: when each run of events was recorded.
    clock: Vec<(usize, u64)>,
    skipped: Vec<Skipped>,
    noted: Vec<Noted>,
}

impl TraceBuilder {
    /// An empty trace named `name`.
    pub fn new(name: String) -> Self {
        Self {
            name,
            live: BTreeMap::new(),
            seen: HashSet::new(),
            assumed: Vec::new(),
            assumed_bytes: 0,
            events: Vec::new(),
            locations: Vec::new(),
            allocations: 0,
            live_bytes: 0,
            peak_live_bytes: 0,
            peak_live_event: 0,
            times: None,
            clock: Vec::new(),
            skipped: Vec::new(),
            noted: Vec::new(),
        }
    }

    /// Count an odd record at `at` that is replayed as written.
    pub fn note(&mut self, oddity: Oddity, at: Location) {
        match self.noted.iter_mut().find(|kind| kind.oddity == oddity) {
            Some(kind) => kind.count += 1,
            None => self.noted.push(Noted {
                oddity,
                count: 1,
                first: at,
            }),
        }
    }

    /// Whether `[pointer, pointer + size)` overlaps a live allocation.
    fn overlaps_live(&self, pointer: u64, size: u64) -> bool {
        let before = self
            .live
            .range(..pointer)
            .next_back()
            .is_some_and(|(&start, &(_, bytes))| start.saturating_add(bytes) > pointer);
        let after = self
            .live
            .range(pointer..)
            .next()
            .is_some_and(|(&start, _)| start < pointer.saturating_add(size));
        before || after
    }

    /// Count a record at `at` passed over for `reason`.
    pub fn skip(&mut self, reason: SkipReason, at: Location) {
        match self.skipped.iter_mut().find(|kind| kind.reason == reason) {
            Some(kind) => kind.count += 1,
            None => self.skipped.push(Skipped {
                reason,
                count: 1,
                first: at,
            }),
        }
    }

    /// A record was made at `ns` nanoseconds (on any clock): the trace's
    /// duration runs from the earliest to the latest.
    pub fn observe_time(&mut self, ns: u64) {
        let (first, last) = self.times.get_or_insert((ns, ns));
        *first = (*first).min(ns);
        *last = (*last).max(ns);
        // The record's events come next: they were made at `ns`.
        let next = self.events.len();
        match self.clock.last_mut() {
            Some(sample) if sample.0 == next => sample.1 = ns,
            Some(&mut (_, at)) if at == ns => {}
            _ => self.clock.push((next, ns)),
        }
    }

    /// Record an allocation of `size` bytes at `pointer`.
    pub fn allocate(&mut self, pointer: u64, size: u64, at: Location) -> Result<(), Problem> {
        if size == 0 {
            return Err(Problem::BadSize {
                text: "0".into(),
                why: "is zero (an allocation needs at least one byte)",
            });
        }
        if size > MAX_REQUEST_BYTES {
            return Err(Problem::BadSize {
                text: size.to_string(),
                why: "exceeds 2^48 bytes (256 TiB), more than any GPU can address",
            });
        }
        if self.live.contains_key(&pointer) {
            return Err(Problem::LivePointer(pointer));
        }
        if self.overlaps_live(pointer, size) {
            self.note(Oddity::OverlapsLive, at);
        }
        let id = self.allocations;
        let overflow = Problem::LiveBytesOverflow {
            live_bytes: self.live_bytes.saturating_add(self.assumed_bytes),
            size,
        };
        let live_bytes = self.live_bytes.checked_add(size).ok_or(overflow.clone())?;
        // The assumed blocks are live beside it: the sum must hold too.
        live_bytes.checked_add(self.assumed_bytes).ok_or(overflow)?;
        self.allocations = id.checked_add(1).ok_or(Problem::TooManyAllocations)?;
        self.live.insert(pointer, (id, size));
        self.seen.insert(pointer);
        self.events.push(Event::Alloc { id, size });
        self.locations.push(at);
        self.live_bytes = live_bytes;
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_event = self.events.len() - 1;
        }
        Ok(())
    }

    /// Record the free of the live allocation at `pointer`, whose row
    /// says it is `size` bytes (noted when that is not the allocation's).
    pub fn free_sized(&mut self, pointer: u64, size: u64, at: Location) -> Result<(), Problem> {
        if self
            .live
            .get(&pointer)
            .is_some_and(|&(_, bytes)| bytes != size)
        {
            self.note(Oddity::FreeSizeDiffers, at);
        }
        self.free(pointer, at)
    }

    /// Record the free of the live allocation at `pointer`.
    pub fn free(&mut self, pointer: u64, at: Location) -> Result<(), Problem> {
        let (id, size) = self
            .live
            .remove(&pointer)
            .ok_or(Problem::UnknownPointer(pointer))?;
        self.live_bytes -= size;
        self.events.push(Event::Free { id });
        self.locations.push(at);
        Ok(())
    }

    /// Record the free of `size` bytes at `pointer`, where a free of a
    /// pointer the trace never allocated is a block allocated before the
    /// trace began (a late start, or a wrapped ring buffer). A second free
    /// of a pointer the trace did allocate is still an error.
    pub fn free_or_assume(&mut self, pointer: u64, size: u64, at: Location) -> Result<(), Problem> {
        if self.live.contains_key(&pointer) || self.seen.contains(&pointer) {
            return self.free_sized(pointer, size, at);
        }
        if size == 0 || size > MAX_REQUEST_BYTES {
            return Err(Problem::UnknownPointer(pointer));
        }
        // Live from the start, beside every peak of the others.
        let assumed_bytes = self
            .assumed_bytes
            .checked_add(size)
            .filter(|bytes| bytes.checked_add(self.peak_live_bytes).is_some())
            .ok_or(Problem::LiveBytesOverflow {
                live_bytes: self.assumed_bytes.saturating_add(self.peak_live_bytes),
                size,
            })?;
        let id = self.allocations;
        self.allocations = id.checked_add(1).ok_or(Problem::TooManyAllocations)?;
        self.assumed_bytes = assumed_bytes;
        self.seen.insert(pointer);
        self.assumed.push((id, size, at));
        self.events.push(Event::Free { id });
        self.locations.push(at);
        Ok(())
    }

    /// The finished trace.
    pub fn finish(self) -> Trace {
        let mut trace = Trace {
            name: self.name,
            events: self.events,
            locations: self.locations,
            allocations: self.allocations,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_event: self.peak_live_event,
            unknown_frees: self.assumed.len() as u64,
            device: None,
            recorded: None,
            duration_ns: self.times.map(|(first, last)| last - first),
            clock: self.clock,
            skipped: self.skipped,
            noted: self.noted,
            stacks: Vec::new(),
            alloc_stacks: Vec::new(),
        };
        if !self.assumed.is_empty() {
            trace.prepend_assumed(&self.assumed);
        }
        trace
    }
}

impl Trace {
    /// Put an allocation of each assumed block before the first event,
    /// renumber ids so they stay in order of first appearance, and find the
    /// peak again (the assumed blocks are live from the start).
    fn prepend_assumed(&mut self, assumed: &[(u32, u64, Location)]) {
        let count = assumed.len() as u32;
        for sample in &mut self.clock {
            sample.0 += assumed.len();
        }
        let mut new_id = vec![u32::MAX; self.allocations as usize];
        for (rank, &(id, _, _)) in assumed.iter().enumerate() {
            new_id[id as usize] = rank as u32;
        }
        for (next, id) in (count..).zip(new_id.iter_mut().filter(|id| **id == u32::MAX)) {
            *id = next;
        }
        let mut events = Vec::with_capacity(self.events.len() + assumed.len());
        let mut locations = Vec::with_capacity(events.capacity());
        for (rank, &(_, size, at)) in assumed.iter().enumerate() {
            events.push(Event::Alloc {
                id: rank as u32,
                size,
            });
            locations.push(at);
        }
        events.extend(self.events.iter().map(|event| match *event {
            Event::Alloc { id, size } => Event::Alloc {
                id: new_id[id as usize],
                size,
            },
            Event::Free { id } => Event::Free {
                id: new_id[id as usize],
            },
        }));
        locations.extend_from_slice(&self.locations);
        self.events = events;
        self.locations = locations;
        let (mut peak, mut peak_event) = (0, 0);
        for (index, live) in self.live_bytes_curve().into_iter().enumerate() {
            if live > peak {
                peak = live;
                peak_event = index;
            }
        }
        self.peak_live_bytes = peak;
        self.peak_live_event = peak_event;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_of_blocks_never_allocated_are_live_from_the_start() {
        let mut trace = TraceBuilder::new("t".into());
        trace.allocate(0x100, 10, Location::Line(2)).unwrap();
        trace.free_or_assume(0x900, 50, Location::Line(3)).unwrap();
        trace.allocate(0x200, 30, Location::Line(4)).unwrap();
        trace.free_or_assume(0x100, 10, Location::Line(5)).unwrap();
        assert_eq!(
            trace.free_or_assume(0x100, 10, Location::Line(6)),
            Err(Problem::UnknownPointer(0x100)),
            "a second free of a block the trace allocated"
        );
        let trace = trace.finish();
        assert_eq!(trace.unknown_frees, 1);
        assert_eq!(
            trace.events,
            vec![
                Event::Alloc { id: 0, size: 50 },
                Event::Alloc { id: 1, size: 10 },
                Event::Free { id: 0 },
                Event::Alloc { id: 2, size: 30 },
                Event::Free { id: 1 },
            ]
        );
        assert_eq!(trace.locations[0], Location::Line(3));
        assert_eq!(trace.live_bytes_curve(), vec![50, 60, 10, 40, 30]);
        assert_eq!((trace.peak_live_bytes, trace.peak_live_event), (60, 1));
    }

    #[test]
    fn live_bytes_past_64_bits_are_an_error_not_a_wrapped_peak() {
        let mut trace = TraceBuilder::new("t".into());
        // 65,536 allocations of 2^48 bytes make exactly 2^64: one too many.
        for pointer in 0..65_535u64 {
            trace
                .allocate(pointer, MAX_REQUEST_BYTES, Location::Line(pointer + 2))
                .unwrap();
        }
        assert_eq!(
            trace.allocate(1 << 40, MAX_REQUEST_BYTES, Location::Line(65_537)),
            Err(Problem::LiveBytesOverflow {
                live_bytes: u64::MAX - MAX_REQUEST_BYTES + 1,
                size: MAX_REQUEST_BYTES,
            })
        );
        let trace = trace.finish();
        assert_eq!(trace.peak_live_bytes, 65_535 * MAX_REQUEST_BYTES);
        assert_eq!(trace.events.len(), 65_535);
    }

    #[test]
    fn builder_tracks_peak_and_rejects_inconsistent_records() {
        let mut trace = TraceBuilder::new("t".into());
        trace.allocate(0x100, 10, Location::Line(2)).unwrap();
        trace.allocate(0x200, 30, Location::Line(3)).unwrap();
        assert_eq!(
            trace.allocate(0x200, 5, Location::Line(4)),
            Err(Problem::LivePointer(0x200))
        );
        trace.free(0x100, Location::Line(5)).unwrap();
        assert_eq!(
            trace.free(0x100, Location::Line(6)),
            Err(Problem::UnknownPointer(0x100))
        );
        trace.allocate(0x100, 5, Location::Line(7)).unwrap();
        trace.observe_time(40);
        trace.observe_time(10);
        trace.observe_time(25);
        let trace = trace.finish();
        assert_eq!(trace.duration_ns, Some(30));
        assert_eq!(trace.clock.last().map(|&(_, ns)| ns), Some(25));
        assert_eq!(trace.peak_live_bytes, 40);
        assert_eq!(trace.peak_live_event, 1);
        assert_eq!(trace.allocations, 3);
        assert_eq!(trace.live_bytes_curve(), vec![10, 40, 30, 35]);
        assert_eq!(trace.lifetimes(), vec![(0, 2), (1, 4), (3, 4)]);
    }
}
