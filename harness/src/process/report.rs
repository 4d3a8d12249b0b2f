//! One process's log made into what `cudamem run` shows: the ledger of each
//! device at its peak ([`summarize`]), as text ([`ProcessReport::render`])
//! and as a minimal HTML page ([`html`]).
//!
//! The peak of a device is the reading of free memory that showed the most
//! in use (the interposer reads it at each new peak of live bytes, at out of
//! memory and at exit). The log is read twice: once to find that reading,
//! once to stop there and take the [`Snapshot`].

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use crate::report::escape;
use ctx::text::{LINE_WIDTH, wrap};
use memcore::bytes::human;

use ctx::driver::result::OUT_OF_MEMORY;
use trace::event::{Call, Event, MemInfoWhy};
use trace::event_log::{self, LogError, LogInfo};
use trace::process::accounting::{Accounting, Counts, Resolutions};
use trace::process::advice::{OutOfMemory, advice, explain, holders};
use trace::process::ledger::Snapshot;
use trace::process::libraries::file_name;
use trace::rmm_csv::write::{RmmStats, RmmWriter};

/// How many out-of-memory returns a report lists.
const OOM_SHOWN: usize = 8;

/// An out-of-memory return, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomSeen {
    /// Nanoseconds since the process started recording.
    pub time_ns: u64,
    /// The call.
    pub call: Call,
    /// Bytes asked for, where the call asks for a size.
    pub request: Option<u64>,
    /// What the terminal was told when it happened (the first
    /// [`OOM_EXPLAINED`] of a process), rebuilt from the log.
    pub explanation: Option<String>,
}

/// How many out-of-memory returns of a process a report explains in full.
const OOM_EXPLAINED: usize = 2;

/// The explanation the interposer printed for `oom`, from the state the
/// log has built so far (its last device, as the interposer's fallback).
fn explain_now(accounting: &Accounting, oom: &OutOfMemory) -> String {
    let last = accounting.devices().len().checked_sub(1);
    let snapshot = last.and_then(|index| Snapshot::of(accounting, index));
    explain(oom, snapshot.as_ref())
}

/// What one process's log says.
#[derive(Debug, Clone)]
pub struct ProcessReport {
    /// The process id.
    pub pid: u32,
    /// Its executable, as it named itself.
    pub exe: String,
    /// The log.
    pub log: PathBuf,
    /// How the log ended.
    pub info: LogInfo,
    /// Each device at its peak.
    pub peaks: Vec<Snapshot>,
    /// The most device bytes live at once in allocations and handles.
    pub peak_live_bytes: u64,
    /// Counts over the whole log.
    pub counts: Counts,
    /// How entry points were handed on.
    pub resolutions: Resolutions,
    /// The first out-of-memory returns.
    pub out_of_memory: Vec<OomSeen>,
    /// The RMM log written, and what it holds.
    pub rmm: Option<(PathBuf, RmmStats)>,
    /// Still running when the program `cudamem run` started had ended (a
    /// child left in the background): its log holds what it wrote until
    /// then.
    pub outlived: bool,
}

/// A log that could not be made into a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The log.
    #[error(transparent)]
    Log(#[from] LogError),
    /// Writing the RMM log.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The RMM log.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
}

/// Read the log at `path` (at most `max_bytes`), writing its RMM log to
/// `rmm` when given.
pub fn summarize(
    path: &Path,
    max_bytes: u64,
    rmm: Option<&Path>,
) -> Result<ProcessReport, ReportError> {
    let write_error = |rmm: &Path, source| ReportError::Write {
        path: rmm.to_path_buf(),
        source,
    };
    let mut writer = match rmm {
        Some(out) => Some(
            File::create(out)
                .map(BufWriter::new)
                .and_then(RmmWriter::new)
                .map_err(|e| write_error(out, e))?,
        ),
        None => None,
    };
    // Pass 1: where each device's peak reading is, and the RMM rows.
    let mut accounting = Accounting::default();
    let mut best: Vec<(i32, u64, u64)> = Vec::new();
    let mut peak_live_bytes = 0;
    let mut out_of_memory: Vec<OomSeen> = Vec::new();
    // An out-of-memory return waiting for the reading of free memory the
    // interposer takes before it explains.
    let mut awaiting: Option<(OutOfMemory, usize)> = None;
    let mut write_failure = None;
    let info = event_log::read(path, max_bytes, |index, record| {
        accounting.apply(record);
        peak_live_bytes = peak_live_bytes.max(accounting.live_device_bytes());
        if let Some(writer) = writer.as_mut()
            && write_failure.is_none()
            && let Err(err) = writer.record(record)
        {
            write_failure = Some(err);
        }
        let reading = match &record.event {
            Event::MemInfo {
                device,
                free,
                total,
                ..
            } => Some((*device, total.saturating_sub(*free))),
            Event::Context {
                device,
                result: 0,
                free: Some(free),
                total: Some(total),
                ..
            } => Some((*device, total.saturating_sub(*free))),
            _ => None,
        };
        if let Some((device, used)) = reading {
            let device = accounting
                .devices()
                .iter()
                .find(|d| d.facts.ordinal == device || device < 0)
                .map_or(device, |d| d.facts.ordinal);
            match best.iter_mut().find(|(d, _, _)| *d == device) {
                Some(entry) if used > entry.2 => *entry = (device, index, used),
                Some(_) => {}
                None => best.push((device, index, used)),
            }
        }
        let oom = match &record.event {
            Event::Alloc {
                call,
                size,
                caller,
                result: OUT_OF_MEMORY,
                ..
            } => Some((*call, Some(*size), None, *caller)),
            Event::Create {
                size,
                caller,
                result: OUT_OF_MEMORY,
                ..
            } => Some((Call::MemCreate, Some(*size), None, *caller)),
            Event::Launch {
                call,
                result: OUT_OF_MEMORY,
                ..
            }
            | Event::Module {
                call,
                result: OUT_OF_MEMORY,
                ..
            } => Some((*call, None, None, 0)),
            Event::Limit {
                which,
                requested,
                result: OUT_OF_MEMORY,
                ..
            } => Some((Call::CtxSetLimit, Some(*requested), Some(*which), 0)),
            _ => None,
        };
        if let Some((call, request, limit, caller)) = oom
            && out_of_memory.len() < OOM_SHOWN
        {
            if let Some((oom, at)) = awaiting.take() {
                out_of_memory[at].explanation = Some(explain_now(&accounting, &oom));
            }
            if out_of_memory.len() < OOM_EXPLAINED {
                let oom = OutOfMemory {
                    call,
                    request,
                    limit,
                    caller: accounting.library(caller).unwrap_or_default().to_owned(),
                    ordinal: out_of_memory.len() as u64 + 1,
                };
                awaiting = Some((oom, out_of_memory.len()));
            }
            out_of_memory.push(OomSeen {
                time_ns: record.time_ns,
                call,
                request,
                explanation: None,
            });
        } else if let Event::MemInfo {
            why: MemInfoWhy::OutOfMemory,
            ..
        } = &record.event
            && let Some((oom, at)) = awaiting.take()
        {
            // The interposer explains once it has read free memory.
            out_of_memory[at].explanation = Some(explain_now(&accounting, &oom));
        }
    })?;
    if let Some((oom, at)) = awaiting.take() {
        out_of_memory[at].explanation = Some(explain_now(&accounting, &oom));
    }
    let rmm = match (writer, rmm) {
        (Some(writer), Some(out)) => {
            if let Some(err) = write_failure {
                return Err(write_error(out, err));
            }
            Some((
                out.to_path_buf(),
                writer.finish().map_err(|e| write_error(out, e))?,
            ))
        }
        _ => None,
    };
    let devices_at_end = accounting.devices().len();
    let counts = accounting.counts.clone();
    let resolutions = accounting.resolutions.clone();
    let (pid, exe) = (accounting.pid, accounting.exe.clone());

    // Pass 2: stop at each peak reading and take the snapshot there.
    let mut replay = Accounting::default();
    let mut peaks: Vec<(i32, Snapshot)> = Vec::new();
    event_log::read(path, max_bytes, |index, record| {
        replay.apply(record);
        for &(device, at, _) in &best {
            if at == index {
                let position = replay
                    .devices()
                    .iter()
                    .position(|d| d.facts.ordinal == device);
                if let Some(snapshot) = position.and_then(|i| Snapshot::of(&replay, i)) {
                    peaks.push((device, snapshot));
                }
            }
        }
    })?;
    // A device never read (no reading could be made): its state at the end.
    for index in 0..devices_at_end {
        let ordinal = accounting.devices()[index].facts.ordinal;
        if !peaks.iter().any(|(device, _)| *device == ordinal)
            && let Some(snapshot) = Snapshot::of(&accounting, index)
        {
            peaks.push((ordinal, snapshot));
        }
    }
    peaks.sort_by_key(|(device, _)| *device);
    Ok(ProcessReport {
        pid,
        exe,
        log: path.to_path_buf(),
        info,
        peaks: peaks.into_iter().map(|(_, snapshot)| snapshot).collect(),
        peak_live_bytes,
        counts,
        resolutions,
        out_of_memory,
        rmm,
        outlived: false,
    })
}

impl ProcessReport {
    /// Whether the log holds a driver call (a process that only asked the
    /// loader for a driver, and got none, made none).
    pub fn made_driver_calls(&self) -> bool {
        self.counts.driver_records > 0
    }

    /// How the process ended, as its log tells.
    pub fn ending(&self) -> String {
        if self.outlived {
            return "still running when the program ended (left in the background); the log \
                    holds what it wrote until then"
                .into();
        }
        match (self.counts.exited, self.counts.signal, self.info.unfinished) {
            (true, _, _) => "exited".into(),
            (false, Some(signal), _) => format!("ended by signal {signal}"),
            (false, None, true) => {
                "ended without an exit record (killed, or left through _exit); the log holds \
                 what was written until then"
                    .into()
            }
            (false, None, false) => "ended without an exit record".into(),
        }
    }

    /// The report as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== process {} ({}): {}",
            self.pid,
            if self.exe.is_empty() {
                "?"
            } else {
                file_name(&self.exe)
            },
            self.ending()
        );
        let c = &self.counts;
        let counted =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let _ = writeln!(
            out,
            "{}, {}, {}, {}; peak of live device bytes {}",
            counted(c.allocations, "allocation", "allocations"),
            counted(c.frees, "free", "frees"),
            counted(
                c.out_of_memory,
                "out-of-memory return",
                "out-of-memory returns"
            ),
            counted(c.other_failures, "other failure", "other failures"),
            human(self.peak_live_bytes)
        );
        if c.unknown_frees > 0 {
            let _ = writeln!(
                out,
                "{} frees of blocks the log never allocated (allocated before recording or \
                 through a path not recorded)",
                c.unknown_frees
            );
        }
        if c.dropped > 0 {
            let _ = writeln!(
                out,
                "warning: {} records were dropped at the log's size bound: figures after it are \
                 incomplete",
                c.dropped
            );
        }
        if self.info.cut_last_line {
            let _ = writeln!(out, "the log's last line was cut off and is left out");
        }
        let r = &self.resolutions;
        if r.unwrapped > 0 {
            let _ = writeln!(
                out,
                "warning: {} entry points handed out by cuGetProcAddress were not wrapped, so \
                 calls through them are not recorded: {}",
                r.unwrapped,
                r.unwrapped_names.join(", ")
            );
        }
        for oom in &self.out_of_memory {
            let request = oom
                .request
                .map_or_else(String::new, |bytes| format!(" of {}", human(bytes)));
            let _ = writeln!(
                out,
                "out of memory at {:.3} s: {}{request}",
                oom.time_ns as f64 / 1e9,
                oom.call.name()
            );
        }
        for snapshot in &self.peaks {
            let when = snapshot.reading.map_or_else(
                || "at the end of the log (free memory never read)".to_string(),
                |reading| {
                    format!(
                        "at its peak ({} in use at {:.3} s)",
                        human(reading.total.saturating_sub(reading.free)),
                        reading.time_ns as f64 / 1e9
                    )
                },
            );
            let _ = writeln!(out, "-- device {} {when}", snapshot.facts.ordinal);
            out.push_str(&snapshot.render());
            let top: Vec<String> = holders(snapshot)
                .iter()
                .take(4)
                .map(|holder| format!("{} {}", human(holder.bytes), holder.name))
                .collect();
            let _ = writeln!(
                out,
                "{}",
                wrap(&top.join("; "), LINE_WIDTH, "biggest holders: ", "  ")
            );
            for line in advice(snapshot, None, None) {
                let _ = writeln!(out, "{}", wrap(&line, LINE_WIDTH, "advice: ", "  "));
            }
        }
        if let Some((path, stats)) = &self.rmm {
            let _ = writeln!(
                out,
                "RMM log: {} ({} rows; `cudamem replay {}` replays it)",
                path.display(),
                stats.rows,
                path.display()
            );
        }
        out
    }
}

/// A minimal HTML page of the reports: each device's ledger at its peak,
/// its holders and the advice. `notes` are what `cudamem run` said before
/// the reports (the program's status, what it could not see), a paragraph each.
pub fn html(command: &str, notes: &[String], reports: &[ProcessReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>cudamem run</title>\n\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;text-align:left}}\
         td.n{{text-align:right;font-family:monospace}}pre{{background:#f6f6f6;padding:1em}}</style>\n\
         </head><body>\n<h1>cudamem run</h1>\n<p><code>{}</code></p>",
        escape(command)
    );
    for note in notes {
        let _ = writeln!(out, "<p>{}</p>", escape(note));
    }
    for report in reports {
        let _ = writeln!(
            out,
            "<h2>process {} ({})</h2>\n<p>{}</p>",
            report.pid,
            escape(file_name(&report.exe)),
            escape(&report.ending())
        );
        for snapshot in &report.peaks {
            let _ = writeln!(
                out,
                "<h3>device {}</h3>\n<table><tr><th>item</th><th>predicted</th><th>measured</th><th>why</th></tr>",
                snapshot.facts.ordinal
            );
            for row in snapshot.ledger_rows() {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td>{}</td></tr>",
                    escape(&row.item),
                    row.predicted.map_or_else(|| "-".into(), |p| p.to_string()),
                    row.measured.map_or_else(|| "-".into(), human),
                    escape(&row.why)
                );
            }
            for line in snapshot.extra_lines() {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td class=n>{}</td><td class=n>-</td><td>{}</td></tr>",
                    escape(line.name.trim()),
                    human(line.bytes),
                    escape(&line.why)
                );
            }
            let unexplained = snapshot
                .unexplained()
                .map_or_else(|| "-".into(), trace::process::ledger::signed_human);
            let _ = writeln!(
                out,
                "<tr><td>unexplained</td><td class=n>-</td><td class=n>{}</td><td>in use, named by no record</td></tr>\n</table>",
                escape(&unexplained)
            );
            let _ = writeln!(
                out,
                "<p>local memory: {}</p>",
                escape(&snapshot.local_memory_cause())
            );
            let _ = writeln!(out, "<ul>");
            for line in advice(snapshot, None, None) {
                let _ = writeln!(out, "<li>{}</li>", escape(&line));
            }
            let _ = writeln!(out, "</ul>");
        }
        for oom in &report.out_of_memory {
            if let Some(text) = &oom.explanation {
                let _ = writeln!(
                    out,
                    "<h3>out of memory at {:.3} s: {}</h3>\n<p>What cudamem said on the terminal \
                     when it happened:</p>\n<pre>{}</pre>",
                    oom.time_ns as f64 / 1e9,
                    escape(oom.call.name()),
                    escape(text)
                );
            }
        }
        let _ = writeln!(out, "<pre>{}</pre>", escape(&report.render()));
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use trace::event::{ContextHow, Line, MemInfoWhy, Record};

    fn log_of(events: &[Event<'_>]) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "cudamem-run-report-{}-{}.events",
            std::process::id(),
            events.len()
        ));
        let mut bytes = Vec::new();
        let mut line = Line::default();
        for (index, event) in events.iter().enumerate() {
            line.encode(&Record {
                time_ns: index as u64 * 1000,
                thread: 5,
                event: event.clone(),
            });
            bytes.extend_from_slice(line.as_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn the_peak_is_the_reading_with_the_most_in_use_and_its_state_is_the_ledger() {
        let total = 1u64 << 30;
        let alloc = |ptr, size| Event::Alloc {
            call: Call::MemAlloc,
            ptr,
            size,
            stream: 0,
            caller: 0,
            result: 0,
        };
        let reading = |free| Event::MemInfo {
            why: MemInfoWhy::Peak,
            device: 0,
            free,
            total,
            pool_reserved: None,
        };
        let path = log_of(&[
            Event::Context {
                how: ContextHow::Primary,
                device: 0,
                ctx: 1,
                result: 0,
                sm_count: Some(4),
                threads_per_sm: Some(2048),
                total: Some(total),
                free: Some(total - (40 << 20)),
                stack: Some(1024),
                heap: None,
                fifo: None,
            },
            alloc(0x1000, 100 << 20),
            reading(total - (140 << 20)),
            alloc(0x9000_0000, 300 << 20),
            reading(total - (440 << 20)),
            Event::Free {
                call: Call::MemFree,
                ptr: 0x9000_0000,
                stream: 0,
                caller: 0,
            },
            reading(total - (140 << 20)),
            Event::Exit { dropped: 0 },
        ]);
        let rmm = path.with_extension("csv");
        let report = summarize(&path, 1 << 20, Some(&rmm)).unwrap();
        assert_eq!(report.peaks.len(), 1);
        let peak = &report.peaks[0];
        assert_eq!(peak.live_device_bytes, 400 << 20);
        assert_eq!(peak.used_measured(), Some(440 << 20));
        assert_eq!(peak.unexplained(), Some(0));
        assert_eq!(report.peak_live_bytes, 400 << 20);
        assert_eq!(report.ending(), "exited");
        let (_, stats) = report.rmm.as_ref().unwrap();
        assert_eq!(stats.rows, 3);
        let text = report.render();
        assert!(text.contains("at its peak (440 MiB in use"), "{text}");
        let page = html("app", &["said first".into()], std::slice::from_ref(&report));
        assert!(page.contains("<p>said first</p>"), "{page}");
        assert!(page.contains("<td>local memory</td>"), "{page}");
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&rmm).unwrap();
    }
}
