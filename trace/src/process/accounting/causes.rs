//! What the driver takes besides the program's allocations, and to which
//! cause each measured drop of free memory goes: the context and its local
//! memory (stack limit changes, kernels that raise the stack), the malloc
//! heap (taken whole at the first launch of a kernel of an image that calls
//! `malloc`, after any change of the heap limit), module code (bounded by
//! the images loaded, where their sizes are known), the limits' buffers.
//! A drop that fits none is kept as an [`UnexplainedDrop`], and handed to
//! the interposer at once ([`Accounting::take_unexplained`]).

use std::fmt;

use ctx::Limits;
use memcore::bytes::human;

use super::{Accounting, DeviceState, Kernel, Reading, StackSource};
use crate::event::{Call, Event, LimitKind, MemInfoWhy, Record, Window};
use crate::image::Answer;

/// Drops smaller than this are left to the unexplained rest silently
/// (allocation rounding and other processes move free memory by as much).
pub const SAID_DROP_BYTES: u64 = 2 << 20;

/// The most module code an image of `bytes` is taken to hold, bytes: its
/// bytes twice over (code, constants and their relocation), rounded up to
/// the 2 MiB pages the driver maps, and one page more.
pub fn code_bound_bytes(bytes: u64) -> u64 {
    const PAGE: u64 = 2 << 20;
    bytes
        .saturating_mul(2)
        .div_ceil(PAGE)
        .saturating_add(1)
        .saturating_mul(PAGE)
}

/// Free memory a call took that no cause fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnexplainedDrop {
    /// The call.
    pub call: Call,
    /// The kernel whose first launch it was, if one.
    pub kernel: Option<String>,
    /// Bytes no cause fits.
    pub bytes: u64,
    /// Why no cause fits, for people.
    pub why: String,
}

impl fmt::Display for UnexplainedDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call.name())?;
        if let Some(kernel) = &self.kernel {
            write!(f, " (first launch of {kernel})")?;
        }
        write!(
            f,
            " took {} that no cause explains: {}",
            human(self.bytes),
            self.why
        )
    }
}

impl Accounting {
    /// The drop no cause fitted at the last record, once: the interposer
    /// says it at once, with the call that made it.
    pub fn take_unexplained(&mut self) -> Option<UnexplainedDrop> {
        self.last_unexplained.take()
    }

    pub(super) fn context(&mut self, record: &Record<'_>) {
        let Event::Context {
            device,
            result,
            sm_count,
            threads_per_sm,
            total,
            free,
            stack,
            heap,
            fifo,
            ..
        } = &record.event
        else {
            return;
        };
        if *result != 0 {
            self.failed(*result);
            return;
        }
        let state = self.device_mut(*device);
        state.contexts += 1;
        if state.contexts == 1 || state.facts.total.is_none() {
            state.facts.sm_count = *sm_count;
            state.facts.threads_per_sm = *threads_per_sm;
            state.facts.total = *total;
            state.facts.used_at_context = total.zip(*free).map(|(t, f)| t.saturating_sub(f));
            state.facts.stack_at_context = *stack;
            state.stack = *stack;
            state.heap = *heap;
            state.fifo = *fifo;
            if let (Some(free), Some(total)) = (free, total) {
                state.last_reading = Some(Reading {
                    why: MemInfoWhy::Context,
                    free: *free,
                    total: *total,
                    pool_reserved: None,
                    time_ns: record.time_ns,
                });
            }
        }
    }

    /// A `limit` record's `which`, `result`, `value` and `window`.
    pub(super) fn limit(
        &mut self,
        which: LimitKind,
        result: i32,
        value: Option<u64>,
        window: Window,
    ) {
        if result != 0 {
            self.failed(result);
            return;
        }
        let state = self.current_device_mut();
        match which {
            LimitKind::Stack => {
                state.stack = value.or(state.stack);
                state.stack_source = StackSource::SetLimit;
                if let (Some(before), Some(after)) = (window.free_before, window.free_after) {
                    let change =
                        i128::from(before) - i128::from(after) - i128::from(window.live_change);
                    state.local_change_measured = state
                        .local_change_measured
                        .saturating_add(i64::try_from(change).unwrap_or(0));
                } else {
                    state.local_change_unmeasured = true;
                }
            }
            LimitKind::MallocHeap | LimitKind::PrintfFifo => {
                if which == LimitKind::MallocHeap {
                    state.heap = value.or(state.heap);
                } else {
                    state.fifo = value.or(state.fifo);
                }
                state.heap_fifo_measured += window.taken_bytes().unwrap_or(0);
            }
            LimitKind::Other(_) => {}
        }
    }

    pub(super) fn image(&mut self, event: &Event<'_>) {
        let Event::Image {
            call,
            bytes,
            malloc,
            printf,
            note,
            ..
        } = event
        else {
            return;
        };
        let state = self.current_device_mut();
        state.images_call_malloc = state.images_call_malloc.and(*malloc);
        state.images_call_printf = state.images_call_printf.and(*printf);
        if !note.is_empty() && state.image_notes.len() < 8 {
            state.image_notes.push(note.to_string());
        }
        state.pending_image = Some((*call, *bytes));
    }

    /// A `module` record's `call`, `result` and `window`.
    pub(super) fn module(&mut self, call: Call, result: i32, window: Window) {
        if result != 0 {
            self.failed(result);
        }
        let state = self.current_device_mut();
        let taken = window.taken_bytes().unwrap_or(0);
        if call.is_object() {
            state.objects_measured += taken;
            state.object_calls += 1;
            return;
        }
        if call.is_load() {
            state.module_loads += 1;
            match state.pending_image.take() {
                Some((image_call, Some(bytes))) if image_call == call && result == 0 => {
                    state.code_bound = state.code_bound.saturating_add(code_bound_bytes(bytes));
                }
                _ if result == 0 => state.code_unbounded = true,
                _ => {}
            }
        }
        let drop = state.code(call, None, taken);
        self.last_unexplained = drop;
    }

    pub(super) fn launch(&mut self, event: &Event<'_>) {
        let Event::Launch {
            call,
            local_bytes,
            stack_before,
            stack_after,
            window,
            result,
            name,
            ..
        } = event
        else {
            return;
        };
        if *result == ctx::driver::result::OUT_OF_MEMORY {
            self.counts.out_of_memory += 1;
        }
        let state = self.current_device_mut();
        if let Some(local_bytes) = local_bytes {
            state.kernels.push(Kernel {
                name: name.to_string(),
                local_bytes: *local_bytes,
            });
        }
        let raised = matches!((stack_before, stack_after), (Some(b), Some(a)) if a > b);
        // What a raised stack takes: the new bytes per thread for every
        // resident thread (ctx's rule rounds further; the heap test below
        // has slack for it).
        let local = match (stack_before, stack_after) {
            (Some(before), Some(after)) if raised => state
                .facts
                .sm_count
                .zip(state.facts.threads_per_sm)
                .map_or(u64::MAX, |(sms, threads)| {
                    sms.saturating_mul(threads).saturating_mul(after - before)
                }),
            _ => 0,
        };
        let rest = window.taken_bytes().map(|taken| {
            let heap = state.heap_at_launch(taken.saturating_sub(local));
            taken - heap
        });
        if raised {
            state.stack = *stack_after;
            state.stack_source = StackSource::Kernel(name.to_string());
            match rest {
                Some(rest) => {
                    state.local_change_measured =
                        state.local_change_measured.saturating_add(rest as i64);
                }
                None => state.local_change_unmeasured = true,
            }
        } else {
            let drop = state.code(*call, Some(name.to_string()), rest.unwrap_or(0));
            self.last_unexplained = drop;
        }
    }

    pub(super) fn mem_info(&mut self, record: &Record<'_>) {
        let &Event::MemInfo {
            why,
            device,
            free,
            total,
            pool_reserved,
        } = &record.event
        else {
            return;
        };
        let state = self.device_mut(device);
        state.facts.total.get_or_insert(total);
        // A reading without the pool's (the program's own) keeps the last
        // one read: the reserve changes only as the pool grows or is
        // trimmed, which the next peak reading sees.
        let pool_reserved =
            pool_reserved.or_else(|| state.last_reading.and_then(|last| last.pool_reserved));
        state.last_reading = Some(Reading {
            why,
            free,
            total,
            pool_reserved,
            time_ns: record.time_ns,
        });
    }
}

impl DeviceState {
    /// The malloc heap limit now, bytes.
    pub fn heap_limit(&self) -> u64 {
        self.heap
            .unwrap_or(Limits::cuda_default().malloc_heap_bytes)
    }

    /// The part of `taken` (at a first launch) that is the malloc heap:
    /// the whole heap, where it is yet to be taken, a loaded image calls
    /// `malloc` (or one could not be read) and the drop holds it.
    fn heap_at_launch(&mut self, taken: u64) -> u64 {
        let heap = self.heap_limit();
        let fits = match self.images_call_malloc {
            // The driver takes it whole; a sixteenth of slack for what other
            // threads freed meanwhile.
            Answer::Yes => taken >= heap - heap / 16,
            Answer::Unknown => taken >= heap,
            Answer::No => false,
        };
        if !self.heap_pending || heap == 0 || !fits {
            return 0;
        }
        self.heap_pending = false;
        let part = taken.min(heap);
        self.heap_measured += part;
        part
    }

    /// `bytes` taken by `call` that can only be module code (a load, or the
    /// lazy loading of a function's code): module code up to the bound of
    /// the images loaded, the rest an unexplained drop.
    fn code(&mut self, call: Call, kernel: Option<String>, bytes: u64) -> Option<UnexplainedDrop> {
        let room = if self.code_unbounded || self.module_loads == 0 && self.code_bound == 0 {
            u64::MAX
        } else {
            self.code_bound.saturating_sub(self.module_measured)
        };
        let code = bytes.min(room);
        self.module_measured += code;
        let rest = bytes - code;
        if rest < SAID_DROP_BYTES {
            return None;
        }
        let mut why = format!(
            "more than the {} of code the {} loaded image{} can hold",
            human(self.code_bound),
            self.module_loads,
            if self.module_loads == 1 { "" } else { "s" }
        );
        if self.heap_pending && self.images_call_malloc == Answer::No {
            why.push_str(&format!(
                "; not the {} malloc heap: no loaded image calls malloc",
                human(self.heap_limit())
            ));
        } else if !self.heap_pending {
            why.push_str("; the malloc heap was taken already");
        }
        let drop = UnexplainedDrop {
            call,
            kernel,
            bytes: rest,
            why,
        };
        if self.unexplained_drops.len() < 16 {
            self.unexplained_drops.push(drop.clone());
        }
        Some(drop)
    }
}
