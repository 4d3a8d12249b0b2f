//! What a command concludes, in a sentence or two with the figures. A
//! replay: which setting or allocator the trace's program can actually
//! pick, and how much it saves against what the program ran, derived from
//! the rows alone. `explain --cm-heap`: what the cm_malloc heap takes and
//! how to size it, derived from the ledger's line.

use ctx::{Ledger, LedgerItemKind};
use kernels::cm_heap::{self, CHUNK_BYTES, DESCRIPTOR_BYTES};
use memcore::bytes::human;

use crate::replay::spec::Pick;
use crate::report::summary::{PolicySummary, TraceSummary};

/// A footprint to compare against: what it is called in a sentence, and
/// its bytes.
#[derive(Debug, Clone)]
struct Reference {
    said: String,
    bytes: u64,
}

/// The conclusion of `summary`: one or two sentences, none when no row
/// served every request.
pub fn conclude(summary: &TraceSummary) -> Vec<String> {
    if summary.peak_live_bytes == 0 {
        return vec!["The trace holds no live allocation: there is nothing to compare.".into()];
    }
    // A row that refused a request has no footprint to compare.
    let served: Vec<&PolicySummary> = summary
        .policies
        .iter()
        .filter(|policy| policy.failed_allocations == 0)
        .collect();
    let own = least(&served, |pick| pick.is_some_and(|pick| !pick.cudamem));
    let ours = least(&served, |pick| pick.is_some_and(|pick| pick.cudamem));
    let framework = summary.framework.name();
    let mut sentences = Vec::new();
    if let Some(recorded) = summary
        .pytorch_recorded
        .as_ref()
        .filter(|recorded| recorded.reserved_before_history_bytes > 0)
    {
        sentences.push(format!(
            "The history begins with {} already reserved (recording started after those \
             segments were made): {framework}'s reserved figures count them from the \
             segments the recording holds or frees, and are partial.",
            human(recorded.reserved_before_history_bytes)
        ));
    }

    let recorded = summary.pytorch_recorded.as_ref().map(|recorded| Reference {
        said: format!(
            "the {} {framework} reserved",
            human(recorded.peak_reserved_bytes)
        ),
        bytes: recorded.peak_reserved_bytes,
    });
    let mut reference = recorded.clone();
    let already = summary
        .pytorch_recorded
        .as_ref()
        .is_some_and(|recorded| recorded.expandable_segments);
    if let (true, Some(recorded)) = (already, &recorded) {
        // The program ran the framework's own setting already: nothing to set.
        sentences.push(format!(
            "{framework} reserved {} at its peak with expandable_segments:True already set.",
            human(recorded.bytes)
        ));
    } else if let Some(own) = own {
        let how = own.pick.map_or("", |pick| pick.how);
        let bytes = own.peak_footprint_bytes;
        sentences.push(match &recorded {
            Some(recorded) => format!(
                "{framework} reserved {} at its peak; {how} would reserve {} ({}).",
                human(recorded.bytes),
                human(bytes),
                change(bytes, recorded.bytes)
            ),
            None => format!(
                "{how} places blocks as the {} row does: it needs at least {} here ({:.3} x the \
                 peak live {}).",
                own.name,
                human(bytes),
                own.footprint_ratio,
                human(summary.peak_live_bytes)
            ),
        });
        if reference.as_ref().is_none_or(|r| bytes < r.bytes) {
            reference = Some(Reference {
                said: format!("the {} of {how}", human(bytes)),
                bytes,
            });
        }
    } else if let Some(recorded) = &recorded {
        sentences.push(format!(
            "{framework} reserved {} at its peak ({:.3} x the peak live {}).",
            human(recorded.bytes),
            summary
                .pytorch_recorded
                .as_ref()
                .map_or(0.0, |r| r.footprint_ratio),
            human(summary.peak_live_bytes)
        ));
    }

    match (ours, &reference) {
        (Some(ours), Some(reference)) => {
            let how = ours.pick.map_or("", |pick| pick.how);
            let bytes = ours.peak_footprint_bytes;
            let verdict = if bytes < reference.bytes {
                format!(
                    "{} than {}",
                    saving(reference.bytes - bytes, reference.bytes),
                    reference.said
                )
            } else {
                format!(
                    "no saving against {} ({})",
                    reference.said,
                    change(bytes, reference.bytes)
                )
            };
            sentences.push(format!(
                "cudamem's {framework} allocator ({how}) would map {}: {verdict}.",
                human(bytes)
            ));
        }
        (Some(ours), None) => {
            let how = ours.pick.map_or("", |pick| pick.how);
            sentences.push(format!(
                "cudamem's {framework} allocator ({how}) would map {} ({:.3} x the peak live {}).",
                human(ours.peak_footprint_bytes),
                ours.footprint_ratio,
                human(summary.peak_live_bytes)
            ));
        }
        (None, _) => {
            if let Some(floor) = least(&served, |_| true) {
                let moves = if floor.moves_blocks {
                    ", which moves blocks"
                } else {
                    ""
                };
                let bytes = floor.peak_footprint_bytes;
                sentences.push(match &reference {
                    Some(reference) if bytes < reference.bytes => format!(
                        "No policy replayed needs less than {} ({}{moves}): what gaps cost {} \
                         is {} at most.",
                        human(bytes),
                        floor.name,
                        own.map_or(framework, |own| own.name),
                        share(reference.bytes - bytes, reference.bytes)
                    ),
                    Some(_) => format!(
                        "No policy replayed needs less than {}: gaps cost it nothing here.",
                        own.map_or(framework, |own| own.name),
                    ),
                    None => format!(
                        "Of the policies replayed, {} needs the least: {} ({:.3} x the peak live \
                         {}){moves}.",
                        floor.name,
                        human(bytes),
                        floor.footprint_ratio,
                        human(summary.peak_live_bytes)
                    ),
                });
            }
        }
    }
    if let Some(sentence) = refusals(summary) {
        sentences.push(sentence);
    }
    sentences
}

/// What a ledger with a cm_malloc heap concludes: what the heap takes from
/// the pool (its chunks and descriptor), its share of the device, and how
/// to size it; `None` for a ledger without one.
pub fn cm_heap(ledger: &Ledger) -> Option<String> {
    let taken = ledger
        .item(LedgerItemKind::CmHeap)
        .and_then(|item| item.figure().bytes())
        .filter(|&bytes| bytes > 0)?;
    let device = ledger
        .item(LedgerItemKind::Total)
        .and_then(|item| item.figure().bytes())
        .unwrap_or(0);
    let chunks = cm_heap::chunks_within(taken.saturating_sub(DESCRIPTOR_BYTES));
    Some(format!(
        "conclusion: the cm_malloc heap takes {} from the pool ({} of the device): {chunks} \
         chunks of {} with their block maps, and a {} descriptor. It grows between launches once \
         a launch's requests fail (those get NULL), so give --cm-heap what one launch holds at \
         once; kernels that call cm_malloc need none of CUDA's malloc heap (limit {}, taken only \
         by kernels that call malloc).",
        human(taken),
        percent(taken, device),
        human(CHUNK_BYTES),
        human(DESCRIPTOR_BYTES),
        human(ledger.limits().malloc_heap_bytes),
    ))
}

/// What a fixed arena refused, if it refused anything.
fn refusals(summary: &TraceSummary) -> Option<String> {
    let capacity = summary.capacity_bytes?;
    let refused: Vec<&str> = summary
        .policies
        .iter()
        .filter(|policy| policy.failed_allocations > 0)
        .map(|policy| policy.name)
        .collect();
    if refused.is_empty() {
        return None;
    }
    let arena = human(capacity);
    Some(if summary.peak_live_bytes > capacity {
        format!(
            "No allocator can run this trace in {arena}: it holds {} live at its peak.",
            human(summary.peak_live_bytes)
        )
    } else if refused.len() == summary.policies.len() {
        format!(
            "In {arena}, every policy replayed refuses a request though the live bytes would fit: gaps and rounding."
        )
    } else {
        format!(
            "In {arena}, {} refuse{} requests though the live bytes would fit (gaps and \
             rounding); the others run it.",
            refused.join(", "),
            if refused.len() == 1 { "s" } else { "" }
        )
    })
}

/// Of `rows`, the one with the smallest footprint whose pick `chosen`
/// accepts.
fn least<'a>(
    rows: &[&'a PolicySummary],
    chosen: impl Fn(Option<Pick>) -> bool,
) -> Option<&'a PolicySummary> {
    rows.iter()
        .copied()
        .filter(|row| chosen(row.pick))
        .min_by_key(|row| row.peak_footprint_bytes)
}

/// `bytes` against `from` as a signed size and percentage: "-2.23 GiB,
/// -42.9%".
fn change(bytes: u64, from: u64) -> String {
    let sign = if bytes < from { "-" } else { "+" };
    let delta = bytes.abs_diff(from);
    format!("{sign}{}, {sign}{}", human(delta), percent(delta, from))
}

/// A saving of `delta` bytes out of `from`: "2.23 GiB (42.9%) less".
fn saving(delta: u64, from: u64) -> String {
    format!("{} less", share(delta, from))
}

/// `delta` bytes out of `from`: "2.23 GiB (42.9%)".
fn share(delta: u64, from: u64) -> String {
    format!("{} ({})", human(delta), percent(delta, from))
}

/// `part` of `whole` in percent, one decimal.
fn percent(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cm_heap_says_what_it_takes_and_how_to_size_it() {
        let h200 = ctx::DeviceProfile::builtin("h200").unwrap();
        let workload = |cm_heap_bytes| ctx::Workload {
            kernels_local_bytes: &[],
            calls_printf: false,
            calls_malloc: false,
            user_bytes: 0,
            cm_heap_bytes,
        };
        let limits = ctx::Limits::cuda_default();
        let none = Ledger::predict_workload(&h200, &limits, &workload(0));
        assert_eq!(cm_heap(&none), None);
        let bytes = ctx::device_heap_bytes(256 << 20);
        let ledger = Ledger::predict_workload(&h200, &limits, &workload(bytes));
        let said = cm_heap(&ledger).unwrap();
        let chunks = cm_heap::chunks_within(256 << 20);
        for part in [
            format!("takes {} from the pool", human(bytes)),
            format!("({} of the device)", percent(bytes, h200.total_bytes)),
            format!("{chunks} chunks of 1.00 MiB"),
            format!("a {} descriptor", human(DESCRIPTOR_BYTES)),
            "give --cm-heap what one launch holds".to_string(),
            "limit 8.00 MiB".to_string(),
        ] {
            assert!(said.contains(&part), "{part:?} not in {said}");
        }
    }

    #[test]
    fn changes_and_savings_carry_sign_and_share() {
        assert_eq!(change(3 << 30, 4 << 30), "-1.00 GiB, -25.0%");
        assert_eq!(change(5 << 30, 4 << 30), "+1.00 GiB, +25.0%");
        assert_eq!(saving(1 << 30, 4 << 30), "1.00 GiB (25.0%) less");
    }
}
