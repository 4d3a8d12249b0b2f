//! What a PyTorch snapshot's moment says about running out of memory.
//!
//! Before PyTorch raises an out-of-memory error it frees every cached
//! segment that holds no live block and retries; so of the free bytes it
//! holds, only those in segments that hold a live block are truly stranded.
//! At an `oom` entry (recorded after that retry) the request is told apart:
//! fragmentation (the free bytes were there, in pieces), exhaustion (the
//! program's own tensors took the room) or a reservation (the room was held
//! outside PyTorch's tensors).

use serde::Serialize;

use memcore::bytes::human;
use trace::snapshot::moments::OomEntry;
use trace::snapshot::state::State;

/// How the out-of-memory is told apart, said the same way in text, JSON and
/// HTML.
pub const OOM_RULE: &str = "Stranded: free bytes in segments that hold a live block; PyTorch's \
retry cannot return them. Freed by the retry: segments with no live block, which PyTorch frees \
(empty_cache) and retries before it raises out of memory. At an oom entry, with R requested, S \
stranded and F free on the device: fragmentation when R <= S + F (the bytes were free, in \
pieces); else exhaustion when the live tensors hold at least R (they took the room); else a \
reservation (the room was held outside PyTorch's tensors).";

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomKind {
    /// Enough bytes were free, in pieces too small.
    Fragmentation,
    /// The program's live tensors took the room.
    Exhaustion,
    /// The room was held outside PyTorch's tensors.
    Reservation,
}

impl OomKind {
    /// The fix, one sentence.
    pub const fn fix(self) -> &'static str {
        match self {
            Self::Fragmentation => {
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place \
                 and free pages go back, so free bytes are not stranded between live blocks), \
                 or install cudamem's allocator (cudamem_torch.install()), or free the listed \
                 holders sooner"
            }
            Self::Exhaustion => {
                "a smaller batch (or activation checkpointing, lower precision, fewer live \
                 tensors): the tensors themselves need the room, no allocator setting makes it"
            }
            Self::Reservation => {
                "find what holds the rest of the device (other processes, the CUDA context and \
                 libraries, a memory fraction): `cudamem run -- python PROGRAM` names every \
                 holder"
            }
        }
    }

    /// Its name in a sentence.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fragmentation => "fragmentation",
            Self::Exhaustion => "exhaustion",
            Self::Reservation => "a reservation",
        }
    }
}

/// The moment's memory as the out-of-memory question sees it. Bytes.
#[derive(Debug, Clone, Serialize)]
pub struct OomStory {
    /// Free bytes in segments holding a live block: truly stranded.
    pub stranded_bytes: u64,
    /// Free bytes of segments with no live block: what PyTorch's retry frees.
    pub retry_frees_bytes: u64,
    /// The largest free block of a segment holding live blocks: the largest
    /// request the segments serve after the retry.
    pub largest_stranded_block_bytes: u64,
    /// The `oom` entry, where the moment is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomEntry>,
    /// Why it failed, at an `oom` entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<OomKind>,
    /// The conclusion and the fix, one or two sentences.
    pub conclusion: String,
}

/// The story of `state`, at `oom` where the moment is an `oom` entry.
pub fn story(state: &State, oom: Option<&OomEntry>) -> OomStory {
    let stranded = state.pinned_free_bytes;
    let retry = state.free_bytes.saturating_sub(stranded);
    let largest = state
        .segments
        .iter()
        .filter(|segment| !segment.live_blocks.is_empty())
        .map(|segment| segment.largest_free_bytes)
        .max()
        .unwrap_or(0);
    let kind = oom.map(|oom| {
        let free = stranded.saturating_add(oom.device_free_bytes);
        if oom.requested_bytes <= free {
            OomKind::Fragmentation
        } else if state.allocated_bytes >= oom.requested_bytes {
            OomKind::Exhaustion
        } else {
            OomKind::Reservation
        }
    });
    let conclusion = match (oom, kind) {
        (Some(oom), Some(kind)) => format!(
            "conclusion: the request of {} failed by {}: {} stranded in segments holding live \
             blocks and {} free on the device, {} held by live tensors; fix: {}.",
            human(oom.requested_bytes),
            kind.name(),
            human(stranded),
            human(oom.device_free_bytes),
            human(state.allocated_bytes),
            kind.fix()
        ),
        _ if stranded == 0 => format!(
            "conclusion: nothing is stranded; {} of cached segments would be freed by \
             PyTorch's retry before any out-of-memory.",
            human(retry)
        ),
        // Under 1% of what PyTorch holds: not worth a change of allocator.
        _ if stranded.saturating_mul(100) < state.reserved_bytes => format!(
            "conclusion: only {} is truly stranded (under 1% of the {} reserved): fragmentation \
             costs nothing worth fixing here; {} is cached in segments with no live block, which \
             PyTorch frees and retries with before it raises out of memory, and \
             torch.cuda.empty_cache() gives back to the device at once.",
            human(stranded),
            human(state.reserved_bytes),
            human(retry),
        ),
        _ => format!(
            "conclusion: {} is truly stranded (free bytes in segments holding live blocks; a \
             request over {} cannot use them and PyTorch's retry cannot return them); {} more \
             is cached in segments with no live block, which PyTorch frees and retries with \
             before it raises out of memory; to get the stranded bytes back: {}.",
            human(stranded),
            human(largest),
            human(retry),
            OomKind::Fragmentation.fix()
        ),
    };
    OomStory {
        stranded_bytes: stranded,
        retry_frees_bytes: retry,
        largest_stranded_block_bytes: largest,
        oom: oom.copied(),
        kind,
        conclusion,
    }
}
