//! What to do about where the memory went: the biggest holders of a
//! [`Snapshot`], and advice that fits them, and the out-of-memory
//! explanation the interposer prints the moment a call fails.

use std::fmt::Write as _;

use ctx::text::{LINE_WIDTH, wrap};
use memcore::bytes::{exact, human};

use crate::event::{Call, LimitKind};
use crate::process::ledger::{Snapshot, signed_human};
use crate::process::libraries::{Framework, file_name};

/// A share of the device above which a holder is worth a word of advice.
const NOTABLE_SHARE: f64 = 0.25;

/// One holder of device memory, bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// What holds it.
    pub name: String,
    /// How much.
    pub bytes: u64,
}

/// The holders of a snapshot's device memory, largest first.
pub fn holders(snapshot: &Snapshot) -> Vec<Holder> {
    let mut holders = vec![Holder {
        name: format!("local memory ({})", snapshot.local_memory_cause()),
        bytes: snapshot.local_measured.unwrap_or(snapshot.local_predicted),
    }];
    if let Some(bytes) = snapshot.context_measured() {
        holders.push(Holder {
            name: "driver and context".into(),
            bytes,
        });
    }
    if snapshot.module_measured > 0 {
        holders.push(Holder {
            name: format!(
                "module code ({} loads, {} kernels launched)",
                snapshot.module_loads, snapshot.kernels_launched
            ),
            bytes: snapshot.module_measured,
        });
    }
    let heap = snapshot.heap_measured + snapshot.heap_fifo_measured;
    if heap > 0 {
        holders.push(Holder {
            name: format!(
                "the malloc heap{} (limit {}, taken at the first launch of a kernel calling \
                 malloc)",
                if snapshot.heap_fifo_measured > 0 {
                    " and printf FIFO"
                } else {
                    ""
                },
                human(snapshot.limits.malloc_heap_bytes)
            ),
            bytes: heap,
        });
    }
    for (path, bytes) in &snapshot.callers {
        if bytes.device_bytes > 0 {
            holders.push(Holder {
                name: format!(
                    "allocations by {} ({} block{})",
                    file_name(path),
                    bytes.blocks,
                    if bytes.blocks == 1 { "" } else { "s" }
                ),
                bytes: bytes.device_bytes,
            });
        }
    }
    if snapshot.objects_measured > 0 {
        holders.push(Holder {
            name: "the driver's streams, events and graphs".into(),
            bytes: snapshot.objects_measured,
        });
    }
    if let Some(held) = snapshot.pool_held().filter(|&held| held > 0) {
        holders.push(Holder {
            name: "held by the driver's async pool (freed memory it keeps)".into(),
            bytes: held,
        });
    }
    if let Some(rest) = snapshot.unexplained().filter(|&rest| rest > 0) {
        holders.push(Holder {
            name: "unexplained (no record names it)".into(),
            bytes: u64::try_from(rest).unwrap_or(u64::MAX),
        });
    }
    holders.sort_by_key(|holder| std::cmp::Reverse(holder.bytes));
    holders
}

/// What a framework's user can set, after `subject` (which library holds
/// or asked for what).
fn framework_advice(framework: Framework, subject: &str) -> String {
    match framework {
        Framework::Xla => format!(
            "{subject}: XLA (JAX) preallocates 75% of the device at start. Set \
             XLA_PYTHON_CLIENT_PREALLOCATE=false to allocate on demand, \
             XLA_PYTHON_CLIENT_MEM_FRACTION to take a smaller share, or \
             XLA_PYTHON_CLIENT_ALLOCATOR=platform to allocate and free exactly what is asked \
             (slower)."
        ),
        Framework::PyTorch => format!(
            "{subject}: PyTorch's caching allocator keeps freed blocks reserved \
             (torch.cuda.memory_reserved() against memory_allocated()). \
             torch.cuda.empty_cache() returns them; \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps reserved memory close to \
             what is allocated."
        ),
        Framework::CuPy => format!(
            "{subject}: CuPy's memory pool keeps freed blocks; \
             cupy.get_default_memory_pool().free_all_blocks() returns them, and \
             set_limit(size=...) caps what the pool may hold."
        ),
    }
}

/// Advice that fits `snapshot`, for a request of `request` bytes that failed
/// (or none: advice at the peak), made by the library at `caller` (where
/// one call is explained).
pub fn advice(snapshot: &Snapshot, request: Option<u64>, caller: Option<&str>) -> Vec<String> {
    let total = snapshot
        .reading
        .map(|r| r.total)
        .or(snapshot.facts.total)
        .unwrap_or(0);
    let share = |bytes: u64| {
        if total == 0 {
            0.0
        } else {
            bytes as f64 / total as f64
        }
    };
    let mut advice = Vec::new();
    let local = snapshot.local_measured.unwrap_or(snapshot.local_predicted);
    if share(local) >= NOTABLE_SHARE {
        let what = match &snapshot.largest_frame {
            Some(kernel) if kernel.local_bytes >= snapshot.limits.stack_bytes => format!(
                "kernel {} needs {} of local memory per thread, and the driver reserves that \
                 for every thread the device can hold at once",
                kernel.name,
                exact(kernel.local_bytes)
            ),
            _ => format!(
                "the stack limit is {} per thread, and the driver reserves that for every \
                 thread the device can hold at once",
                exact(snapshot.limits.stack_bytes)
            ),
        };
        advice.push(format!(
            "local memory takes {} ({:.0}% of the device): {what}. Shrink the kernel's local \
             arrays or its register spills (`nvcc -Xptxas -v` prints each kernel's stack frame), \
             and keep cudaLimitStackSize / cuCtxSetLimit(CU_LIMIT_STACK_SIZE) at what the \
             kernels need; the limit is not lowered on its own once raised.",
            human(local),
            share(local) * 100.0
        ));
    }
    let mut advised = Vec::new();
    for (path, bytes) in &snapshot.callers {
        if share(bytes.device_bytes) < NOTABLE_SHARE {
            continue;
        }
        let name = file_name(path);
        let held = human(bytes.device_bytes);
        match Framework::of(path) {
            Some(framework) if !advised.contains(&framework) => {
                advised.push(framework);
                advice.push(framework_advice(framework, &format!("{name} holds {held}")));
            }
            Some(_) => {}
            None if share(bytes.largest) >= 0.5 => advice.push(format!(
                "{name} holds one block of {} ({:.0}% of the device): a framework or library \
                 preallocating?",
                human(bytes.largest),
                share(bytes.largest) * 100.0
            )),
            None => {}
        }
    }
    // The library that asked gets its framework's advice even when it holds
    // little itself: its allocator's settings decide how it asks.
    if let Some(caller) = caller
        && let Some(framework) = Framework::of(caller)
        && !advised.contains(&framework)
    {
        let subject = format!("the request came from {}", file_name(caller));
        advice.push(framework_advice(framework, &subject));
    }
    if let Some(held) = snapshot.pool_held().filter(|&held| share(held) >= 0.1) {
        advice.push(format!(
            "the stream-ordered pool (cudaMallocAsync) keeps {} of freed memory: lower its \
             release threshold (cudaMemPoolAttrReleaseThreshold) or trim it \
             (cudaMemPoolTrimTo).",
            human(held)
        ));
    }
    if let (Some(rest), Some(used)) = (snapshot.unexplained(), snapshot.used_measured())
        && used > 0
        && rest as f64 >= 0.1 * used as f64
    {
        advice.push(format!(
            "{} of the memory in use is named by no record: another process on this GPU \
             (nvidia-smi lists them), or allocations through paths that are not recorded.",
            signed_human(rest)
        ));
    }
    if let (Some(request), Some(reading)) = (request, snapshot.reading) {
        if request > reading.total {
            advice.push(format!(
                "the request of {} is larger than the whole device ({}): no freeing makes it \
                 fit; split it.",
                human(request),
                human(reading.total)
            ));
        } else if request > reading.free {
            advice.push(format!(
                "the request of {} is larger than all free memory ({}): the holders above \
                 must give back at least {}.",
                human(request),
                human(reading.free),
                human(request - reading.free)
            ));
        } else {
            advice.push(format!(
                "{} were free, more than the {} asked for: free memory is split into pieces \
                 smaller than the request, or another thread or process took it meanwhile.",
                human(reading.free),
                human(request)
            ));
        }
    }
    advice
}

/// A call that returned `CUDA_ERROR_OUT_OF_MEMORY`, as the interposer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The driver call.
    pub call: Call,
    /// Bytes requested, where the call asks for a size (for a limit, the
    /// value asked for: per thread for the stack).
    pub request: Option<u64>,
    /// The limit a `cuCtxSetLimit` set, whose device cost is not its value.
    pub limit: Option<LimitKind>,
    /// The calling library's path.
    pub caller: String,
    /// How many out-of-memory returns the process has seen, this one
    /// included.
    pub ordinal: u64,
}

/// The one line for an out-of-memory return past the first `explained`,
/// which got the whole explanation.
pub fn explain_again(oom: &OutOfMemory, explained: u64) -> String {
    let request = oom
        .request
        .map_or_else(String::new, |bytes| format!(" of {}", human(bytes)));
    format!(
        "cudamem: {}{request} (called by {}) returned CUDA_ERROR_OUT_OF_MEMORY again \
         (out-of-memory #{}; the first {explained} are explained in full)\n",
        oom.call.name(),
        file_name(&oom.caller),
        oom.ordinal
    )
}

/// How many holders an explanation lists.
const HOLDERS_SHOWN: usize = 6;

/// The explanation printed on stderr when a call returns out of memory.
///
/// ```
/// use trace::process::advice::{OutOfMemory, explain};
/// use trace::event::Call;
///
/// let text = explain(
///     &OutOfMemory {
///         call: Call::MemAlloc,
///         request: Some(1 << 20),
///         limit: None,
///         caller: "/app".into(),
///         ordinal: 1,
///     },
///     None,
/// );
/// assert!(text.contains("cuMemAlloc of 1.00 MiB"));
/// assert!(text.contains("returned CUDA_ERROR_OUT_OF_MEMORY"));
/// ```
pub fn explain(oom: &OutOfMemory, snapshot: Option<&Snapshot>) -> String {
    let mut out = String::new();
    let say = |out: &mut String, text: &str, first: &str| {
        let _ = writeln!(out, "{}", wrap(text, LINE_WIDTH, first, "cudamem:     "));
    };
    let request = oom
        .request
        .map_or_else(String::new, |bytes| format!(" of {}", human(bytes)));
    say(
        &mut out,
        &format!(
            "{}{request} (called by {}) returned CUDA_ERROR_OUT_OF_MEMORY (out-of-memory #{} of \
             this process; the program gets the driver's answer unchanged)",
            oom.call.name(),
            file_name(&oom.caller),
            oom.ordinal
        ),
        "cudamem: ",
    );
    let Some(snapshot) = snapshot else {
        say(
            &mut out,
            "no context was recorded; nothing more is known",
            "cudamem: ",
        );
        return out;
    };
    let reading = match snapshot.reading {
        Some(reading) => format!(
            "device {}: {} free of {} (the largest block that can still be had is not probed: \
             that would allocate)",
            snapshot.facts.ordinal,
            human(reading.free),
            human(reading.total)
        ),
        None => format!(
            "device {}: free memory could not be read",
            snapshot.facts.ordinal
        ),
    };
    say(&mut out, &reading, "cudamem: ");
    // A limit's value is not what it takes: the stack limit is per thread.
    let cost = oom
        .limit
        .zip(oom.request)
        .and_then(|(which, value)| snapshot.limit_cost(which, value));
    let mut limit_advice = None;
    if let Some(cost) = &cost {
        say(
            &mut out,
            &format!(
                "that limit takes {} ({}), in place of the {} the current one holds",
                human(cost.bytes),
                cost.how,
                human(cost.held)
            ),
            "cudamem: ",
        );
        if let Some(reading) = snapshot.reading {
            let room = reading.free.saturating_add(cost.held);
            if cost.bytes > room {
                let fit = cost.largest_fitting(room);
                limit_advice = Some(format!(
                    "{} are free and the current limit holds {}: at most {} fits{}; lower the \
                     limit to that or less, or free memory before raising it.",
                    human(reading.free),
                    human(cost.held),
                    exact(fit),
                    if cost.threads > 1 { " per thread" } else { "" }
                ));
            }
        }
    }
    let _ = writeln!(out, "cudamem: the biggest holders:");
    for holder in holders(snapshot).iter().take(HOLDERS_SHOWN) {
        say(
            &mut out,
            &holder.name,
            &format!("cudamem:   {:>10}  ", human(holder.bytes)),
        );
    }
    let request = match &cost {
        Some(cost) => Some(cost.bytes.saturating_sub(cost.held)),
        None => oom.request,
    };
    let advice = match limit_advice {
        Some(line) => vec![line],
        None => advice(snapshot, request, Some(&oom.caller)),
    };
    for line in advice {
        say(&mut out, &line, "cudamem: advice: ");
    }
    let _ = writeln!(out, "cudamem: the ledger at this moment:");
    for line in snapshot.render().lines() {
        let _ = writeln!(out, "cudamem: | {line}");
    }
    out
}
