//! A non-moving allocator whose blocks live in a huge virtual arena and
//! whose physical memory is a set of handles mapped into it: GMLake's
//! stitching, without hardware.
//!
//! - **Virtual placement**: [`Tlsf::preferring_low_addresses`] over a
//!   2^47-byte arena, requests rounded up to [`STITCH_ALIGN`]: O(1) per
//!   request, close to best fit (smallest block among those it looks at,
//!   lowest address among equals), which keeps blocks dense at the arena's
//!   low end and so on few pages. Virtual
//!   space costs nothing, so the arena never grows; a hole is only
//!   physical memory where a page of it is still mapped.
//! - **Pages**: a [`PAGE_BYTES`](crate::PAGE_BYTES) page is backed while any live block
//!   touches it. The page holding the tail of one block and the head of the
//!   next is one physical page (a shared boundary page), so blocks waste no
//!   physical bytes beyond the pages they touch.
//! - **Handles**: the arena is cut into aligned chunks of `large_pages`
//!   pages ([`FULL_BANDWIDTH_HANDLE_BYTES`](crate::FULL_BANDWIDTH_HANDLE_BYTES)
//!   by default). The first live block to touch an unbacked chunk gets
//!   one large handle over the whole chunk, so the growth frontier and
//!   every densely used chunk sit in handles that copy at full bandwidth.
//!   Page-sized handles back a chunk's pages only where a large one may
//!   not be had: past the budget (below) while idle handles could serve
//!   instead, past the device's capacity, with `grow_in_large` off, or in
//!   a chunk already part-backed by pages: the stitched tail. A mapping is
//!   always one whole handle, as the driver demands.
//! - **The budget**: `(1 + slack_permille / 1000) x` the most bytes live so
//!   far (the request counted); a new large handle may pass it by
//!   `overshoot_permille / 1000` of its own bytes. While a new handle keeps
//!   the footprint within it, handles no live block touches stay mapped (idle): a
//!   training loop that allocates the same sizes again lands on mapped
//!   pages and makes no driver call.
//! - **Recycling and release**: past the budget, a page that needs a
//!   handle takes the idle handle of its size mapped highest (unmapped there,
//!   mapped here) once the cache holds more than `keep_idle_bytes`; a page
//!   with no idle page-sized handle releases an idle large one first. Idle
//!   handles beyond `max_idle_bytes` are released highest first, and
//!   [`Stitch::trim`] releases them all.
//!
//! - **Huge requests** (at least [`HUGE_REQUEST_BYTES`]) get one handle of
//!   their own over whole chunks, released at their free: their work does
//!   not grow with their size, and the page table (leaves made where pages
//!   are touched) holds none of their pages.
//!
//! Footprint is the bytes in created, not yet released handles; every
//! driver call is counted by kind and priced by [`StitchConfig::costs`].

mod backing;
pub mod driver;
mod pages;

use crate::vmm::{FULL_BANDWIDTH_HANDLE_BYTES, FULL_BANDWIDTH_HANDLE_PAGES, PAGE_BYTES};
use crate::{Allocation, Allocator, DriverCalls, Error, Extent, Result, Tlsf, align_up};
use alloc::vec::Vec;
use backing::Backing;
use driver::{DriverCosts, DriverOp, H200_DRIVER_COSTS};

/// Every block starts at a multiple of this and spans a multiple of it,
/// bytes: PyTorch's block size ([`crate::pytorch::MIN_BLOCK_BYTES`]), so a
/// PyTorch request takes the bytes PyTorch counts for it.
pub const STITCH_ALIGN: u64 = crate::pytorch::MIN_BLOCK_BYTES;

/// Bytes of the virtual arena (2^47 = 128 TiB).
pub const VIRTUAL_BYTES: u64 = 1 << 47;

/// The most pages a large handle may have (1 GiB, the largest alignment
/// the arena places at, [`crate::MAX_ALIGN`]): a chunk's pages are looked at
/// whenever one of them needs backing, so its size bounds that work, and
/// huge blocks and `align_large` place blocks at a chunk's start. A
/// configuration past it is [`Error::StepBudget`] at the first request.
pub const MAX_LARGE_PAGES: u64 = crate::MAX_ALIGN / PAGE_BYTES;

/// Requests of at least this many bytes (32 GiB, past any request a real
/// program on a device of today makes) are huge: placed at a chunk's start
/// over whole chunks and backed by one handle of their own, created for
/// them and released when they are freed, so their cost is a few calls
/// and tree steps whatever their size, and no page of theirs is in the
/// table. Every other request touches at most `HUGE_REQUEST_BYTES / 2 MiB
/// + 1` pages. Only with a power-of-two chunk (the default): with another
/// chunk size a huge request is [`Error::StepBudget`].
pub const HUGE_REQUEST_BYTES: u64 = 32 << 30;

/// How a [`Stitch`] backs and recycles physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StitchConfig {
    /// Pages in a large handle (by default
    /// [`FULL_BANDWIDTH_HANDLE_PAGES`](crate::FULL_BANDWIDTH_HANDLE_PAGES):
    /// [`FULL_BANDWIDTH_HANDLE_BYTES`](crate::FULL_BANDWIDTH_HANDLE_BYTES));
    /// 0 or 1: page-sized handles only.
    pub large_pages: u32,
    /// Place requests of at least a large handle's bytes at a virtual
    /// address that is a multiple of them (when that is a power of two), so
    /// large handles cover as much of them as possible.
    pub align_large: bool,
    /// The footprint budget over the most bytes live so far, in parts per
    /// thousand: within it new handles are created and idle ones stay
    /// cached; past it idle ones are recycled. 0: recycle as soon as the
    /// footprint passes the live bytes (least memory).
    pub slack_permille: u32,
    /// How far a new large handle may take the footprint past the budget,
    /// in thousandths of the handle's bytes: 1000 lets the frontier grow
    /// by whole large handles (most bytes in them, fewest calls), 0 keeps
    /// the footprint within the budget and stitches the frontier from
    /// page-sized handles.
    pub overshoot_permille: u32,
    /// With no idle handle at all, back an unbacked chunk with a large
    /// handle whatever the budget: the footprint grows either way, and one
    /// large handle is one call and full bandwidth where pages would be up
    /// to sixteen calls. Off: such growth is stitched from pages past the
    /// budget (less memory at the frontier).
    pub grow_in_large: bool,
    /// Idle bytes the cache keeps mapped even past the budget, in bytes:
    /// 0 recycles whenever the budget says so, `u64::MAX` never (fewest
    /// driver calls).
    pub keep_idle_bytes: u64,
    /// Physical bytes the device can give, in bytes: no handle is created
    /// past them (large ones fall back to pages, idle ones are released
    /// first), and a request that would need more is
    /// [`Error::OutOfMemory`]. `u64::MAX`: no limit.
    pub capacity_bytes: u64,
    /// Idle bytes beyond which the highest-mapped idle handles are released, in
    /// bytes; `u64::MAX`: idle handles stay until [`Stitch::trim`].
    pub max_idle_bytes: u64,
    /// What each driver call costs.
    pub costs: DriverCosts,
    /// Keep every driver operation for [`Stitch::take_ops`]: what a backend
    /// on a real device needs; a model that only counts leaves it off.
    pub log_ops: bool,
    /// The most page steps all requests together may take (each page a
    /// request covers counts twice: touched, and let go at its free); a
    /// request past them is [`Error::StepBudget`] and changes nothing.
    /// `u64::MAX`: no bound (a pool on a device); a model sets
    /// [`model_steps`](crate::model_steps) of its input.
    pub page_steps: u64,
}

impl Default for StitchConfig {
    /// Large handles of [`FULL_BANDWIDTH_HANDLE_BYTES`](crate::FULL_BANDWIDTH_HANDLE_BYTES),
    /// every request at any 512-byte address (the
    /// densest packing), a 2% budget that a whole large handle may
    /// overshoot, growth in large handles when nothing is idle, nothing
    /// released until [`Stitch::trim`], the H200's costs.
    fn default() -> Self {
        Self {
            large_pages: FULL_BANDWIDTH_HANDLE_PAGES,
            align_large: false,
            slack_permille: 20,
            overshoot_permille: 1000,
            grow_in_large: true,
            keep_idle_bytes: 0,
            capacity_bytes: u64::MAX,
            max_idle_bytes: u64::MAX,
            costs: H200_DRIVER_COSTS,
            log_ops: false,
            page_steps: u64::MAX,
        }
    }
}

/// A live block of a [`Stitch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StitchBlock {
    /// Virtual address of the first byte, bytes from the arena's start.
    pub offset: u64,
    /// Bytes requested.
    pub size: u64,
    /// The virtual range as the arena holds it (size rounded up).
    allocation: Allocation,
}

/// A created, not yet released handle and where it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleInfo {
    /// The handle's number; numbers of released handles are reused.
    pub handle: u32,
    /// Its physical bytes.
    pub bytes: u64,
    /// The virtual range it is mapped over (`bytes` long), if mapped.
    pub mapped_at: Option<Extent>,
    /// Whether a live block touches one of its pages (else it is idle).
    pub in_use: bool,
}

/// What a [`Stitch`] holds now and has held. Sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StitchStats {
    /// Requested bytes of live blocks.
    pub live_bytes: u64,
    /// Live blocks.
    pub live_blocks: u64,
    /// The most requested bytes live at once.
    pub peak_live_bytes: u64,
    /// Of the live bytes when they first peaked, those in handles of at
    /// least [`FULL_BANDWIDTH_HANDLE_BYTES`].
    pub peak_live_in_full_bandwidth_handles: u64,
    /// Bytes in created, not yet released handles: the footprint now.
    pub physical_bytes: u64,
    /// The most physical bytes held at once: the footprint.
    pub peak_physical_bytes: u64,
    /// Physical bytes in idle handles: mapped but unused, or unmapped.
    pub idle_bytes: u64,
    /// Page-sized handles held now.
    pub small_handles: u64,
    /// Large handles held now.
    pub large_handles: u64,
    /// Driver calls made so far.
    pub calls: DriverCalls,
}

/// The stitching allocator; see the [module documentation](self).
///
/// ```
/// use memcore::{Stitch, StitchConfig};
///
/// let mut pool = Stitch::new(StitchConfig::default());
/// let a = pool.allocate(3 << 20)?; // the first chunk gets one 32 MiB handle
/// let b = pool.allocate(1 << 20)?; // right after a, in the same handle
/// assert_eq!(pool.stats().physical_bytes, 32 << 20);
/// pool.free(a)?;
/// let again = pool.allocate(3 << 20)?; // a's place, still mapped: no driver call
/// let calls = pool.stats().calls;
/// assert_eq!((calls.create.calls, calls.map.calls), (1, 1));
/// pool.free(again)?;
/// pool.free(b)?;
/// pool.trim();
/// assert_eq!(pool.stats().physical_bytes, 0);
/// # Ok::<(), memcore::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Stitch {
    config: StitchConfig,
    arena: Tlsf,
    backing: Backing,
    live_bytes: u64,
    live_blocks: u64,
    peak_live_bytes: u64,
    live_in_full_bandwidth: u64,
    peak_live_in_full_bandwidth: u64,
    /// Page steps taken so far, at most `config.page_steps`.
    page_steps: u64,
}

impl Stitch {
    /// An empty pool: no handle, the whole virtual arena free.
    pub fn new(config: StitchConfig) -> Self {
        let mut arena = Tlsf::preferring_low_addresses();
        arena
            .add_region(0, VIRTUAL_BYTES)
            .expect("a fresh TLSF takes one non-empty region");
        Self {
            config,
            arena,
            backing: Backing::new(config),
            live_bytes: 0,
            live_blocks: 0,
            peak_live_bytes: 0,
            live_in_full_bandwidth: 0,
            peak_live_in_full_bandwidth: 0,
            page_steps: 0,
        }
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &StitchConfig {
        &self.config
    }

    /// `size` bytes at a multiple of [`STITCH_ALIGN`], backed by physical
    /// handles before it returns. [`Error::ZeroSize`], [`Error::Overflow`]
    /// past the address space, [`Error::OutOfMemory`] when the virtual
    /// arena is full or the handles would pass
    /// [`StitchConfig::capacity_bytes`]; a failed request leaves no block
    /// (pages it had backed stay mapped, idle).
    pub fn allocate(&mut self, size: u64) -> Result<StitchBlock> {
        if size == 0 {
            return Err(Error::ZeroSize);
        }
        let rounded = align_up(size, STITCH_ALIGN).ok_or(Error::Overflow { offset: 0, size })?;
        let large_bytes = u64::from(self.config.large_pages) * PAGE_BYTES;
        let align = if self.config.align_large
            && self.config.large_pages > 1
            && large_bytes.is_power_of_two()
            && rounded >= large_bytes
        {
            large_bytes
        } else {
            STITCH_ALIGN
        };
        if u64::from(self.config.large_pages) > MAX_LARGE_PAGES {
            return Err(Error::StepBudget {
                steps: u64::from(self.config.large_pages),
                limit: MAX_LARGE_PAGES,
            });
        }
        if rounded >= HUGE_REQUEST_BYTES {
            return match self.huge_span(rounded) {
                Some(span) => self.allocate_huge(size, span),
                // Not placed on chunks: its pages would be the work.
                None => Err(Error::StepBudget {
                    steps: rounded.div_ceil(PAGE_BYTES),
                    limit: HUGE_REQUEST_BYTES / PAGE_BYTES,
                }),
            };
        }
        let allocation = self.arena.allocate(rounded, align)?;
        let steps = Backing::pages_covered(allocation.offset, rounded).saturating_mul(2);
        if let Err(err) = self.take_steps(steps) {
            self.arena.free(allocation)?;
            return Err(err);
        }
        self.set_budget_for(size);
        if let Err(err) = self.backing.touch(allocation.offset, rounded) {
            self.backing.untouch_failed(allocation.offset, rounded)?;
            self.arena.free(allocation)?;
            return Err(err);
        }
        let full_bandwidth =
            self.backing
                .bytes_in_handles_of(allocation.offset, size, FULL_BANDWIDTH_HANDLE_BYTES);
        self.count_live(size, full_bandwidth);
        Ok(StitchBlock {
            offset: allocation.offset,
            size,
            allocation,
        })
    }

    /// The bytes a huge block of `rounded` bytes spans (whole chunks), or
    /// `None` for a request that is not huge.
    #[inline]
    fn huge_span(&self, rounded: u64) -> Option<u64> {
        if rounded < HUGE_REQUEST_BYTES {
            return None;
        }
        let chunk = self.chunk_bytes();
        if !chunk.is_power_of_two() {
            return None;
        }
        align_up(rounded, chunk)
    }

    /// Bytes of a chunk: a large handle's, or a page's without them.
    #[inline]
    fn chunk_bytes(&self) -> u64 {
        u64::from(self.config.large_pages.max(1)) * PAGE_BYTES
    }

    /// Count `steps` page steps, or refuse them past the budget.
    #[inline]
    fn take_steps(&mut self, steps: u64) -> Result<()> {
        let taken = self.page_steps.saturating_add(steps);
        if taken > self.config.page_steps {
            return Err(Error::StepBudget {
                steps: taken,
                limit: self.config.page_steps,
            });
        }
        self.page_steps = taken;
        Ok(())
    }

    /// Raise the budget for a request of `size` bytes: the slack over the
    /// most bytes live so far, this request counted.
    #[inline]
    fn set_budget_for(&mut self, size: u64) {
        let basis = self.peak_live_bytes.max(self.live_bytes + size);
        self.backing
            .set_budget(basis.saturating_add(permille_of(basis, self.config.slack_permille)));
    }

    /// A block of `size` is live, `full_bandwidth` of its bytes in large
    /// handles.
    #[inline]
    fn count_live(&mut self, size: u64, full_bandwidth: u64) {
        self.live_bytes += size;
        self.live_blocks += 1;
        self.live_in_full_bandwidth += full_bandwidth;
        if self.live_bytes > self.peak_live_bytes {
            self.peak_live_bytes = self.live_bytes;
            self.peak_live_in_full_bandwidth = self.live_in_full_bandwidth;
        }
    }

    /// A huge request: `span` bytes at a chunk's start, one handle.
    #[cold]
    #[inline(never)]
    fn allocate_huge(&mut self, size: u64, span: u64) -> Result<StitchBlock> {
        let allocation = self.arena.allocate(span, self.chunk_bytes())?;
        if let Err(err) = self.take_steps(2) {
            self.arena.free(allocation)?;
            return Err(err);
        }
        self.set_budget_for(size);
        if let Err(err) = self.backing.back_huge(allocation.offset, span) {
            self.arena.free(allocation)?;
            return Err(err);
        }
        // Its handle is at least HUGE_REQUEST_BYTES: full bandwidth.
        self.count_live(size, size);
        Ok(StitchBlock {
            offset: allocation.offset,
            size,
            allocation,
        })
    }

    /// Give a live block back; its pages no other block touches stay
    /// mapped, idle, for the next request. A block that is not live here
    /// is [`Error::UnknownAllocation`] and changes nothing.
    pub fn free(&mut self, block: StitchBlock) -> Result<()> {
        let allocation = block.allocation;
        let rounded = align_up(block.size, STITCH_ALIGN);
        let huge = rounded.and_then(|rounded| self.huge_span(rounded));
        if block.offset != allocation.offset || huge.or(rounded) != Some(allocation.size) {
            return Err(Error::UnknownAllocation {
                offset: block.offset,
            });
        }
        self.arena.free(allocation)?;
        if huge.is_some() {
            self.live_in_full_bandwidth -= block.size;
            self.live_bytes -= block.size;
            self.live_blocks -= 1;
            return self.backing.free_huge(allocation.offset);
        }
        self.live_in_full_bandwidth -= self.backing.bytes_in_handles_of(
            allocation.offset,
            block.size,
            FULL_BANDWIDTH_HANDLE_BYTES,
        );
        self.live_bytes -= block.size;
        self.live_blocks -= 1;
        self.backing.untouch(allocation.offset, allocation.size)
    }

    /// The driver operations made since the last call, oldest first, when
    /// [`StitchConfig::log_ops`] is on (else none): a backend carries them
    /// out in this order after each [`Stitch::allocate`], [`Stitch::free`]
    /// or [`Stitch::trim`].
    pub fn take_ops(&mut self) -> Vec<DriverOp> {
        self.backing.take_ops()
    }

    /// Unmap and release every idle handle (PyTorch's `empty_cache`).
    pub fn trim(&mut self) {
        self.backing.trim();
    }

    /// Current figures.
    pub fn stats(&self) -> StitchStats {
        let (small_handles, large_handles) = self.backing.handles();
        StitchStats {
            live_bytes: self.live_bytes,
            live_blocks: self.live_blocks,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_in_full_bandwidth_handles: self.peak_live_in_full_bandwidth,
            physical_bytes: self.backing.physical_bytes(),
            peak_physical_bytes: self.backing.peak_physical_bytes(),
            idle_bytes: self.backing.idle_bytes(),
            small_handles,
            large_handles,
            calls: self.backing.calls(),
        }
    }

    /// Every created, not yet released handle and where it is mapped.
    pub fn handles(&self) -> impl Iterator<Item = HandleInfo> + '_ {
        self.backing.handles_held()
    }

    /// The handle that backs the virtual byte at `offset` and the byte's
    /// offset inside it, or `None` where nothing is mapped.
    pub fn physical(&self, offset: u64) -> Option<(u32, u64)> {
        self.backing.physical(offset)
    }

    /// Walk the page table and the handles and report the first
    /// inconsistency as [`Error::Corrupt`].
    pub fn check(&self) -> Result<()> {
        self.backing.check()
    }
}

/// `permille / 1000` of `bytes`, rounded down, saturating at `u64::MAX`;
/// in 64-bit arithmetic when the product fits (every request's budget).
#[inline]
fn permille_of(bytes: u64, permille: u32) -> u64 {
    match bytes.checked_mul(u64::from(permille)) {
        Some(product) => product / 1000,
        None => {
            let share = u128::from(bytes) * u128::from(permille) / 1000;
            u64::try_from(share).unwrap_or(u64::MAX)
        }
    }
}

#[cfg(test)]
mod tests;
