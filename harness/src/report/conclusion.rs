//! What a replay concludes, in a sentence or two with the figures: which
//! setting or allocator the trace's program can actually pick, and how much
//! it saves against what the program ran. Derived from the rows alone.

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
    fn changes_and_savings_carry_sign_and_share() {
        assert_eq!(change(3 << 30, 4 << 30), "-1.00 GiB, -25.0%");
        assert_eq!(change(5 << 30, 4 << 30), "+1.00 GiB, +25.0%");
        assert_eq!(saving(1 << 30, 4 << 30), "1.00 GiB (25.0%) less");
    }
}
