//! `cudamem replay`: load traces, replay each through the chosen policies,
//! print a table or JSON lines, and write the HTML report.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::{byte_size, output};
use crate::replay::policy::{Arena, ArenaRefused, cannot_take};
use crate::replay::spec::{self, PolicyParser, PolicySpec, Settings};
use crate::replay::{self, Outcome, Placement};
use crate::report::summary::{SkippedPolicy, TraceSummary};
use crate::report::{self, TraceReport};
use trace;
use trace::Trace;

/// Where the report goes when `cudamem` runs on the built-in traces.
pub const DEFAULT_REPORT: &str = "cudamem-report.html";

/// The last line of a replay of the built-in traces: how to ask the same
/// about one's own program.
pub const ASK_ABOUT_YOURS: &str = "Your program: `cudamem run -- PROGRAM`, or `cudamem replay \
FILE` (a PyTorch snapshot, an RMM log).";

/// `--stitch-large`'s default: memcore's large handle (`human` reads back
/// exactly for it, which a test holds).
static DEFAULT_STITCH_LARGE: LazyLock<String> = LazyLock::new(|| {
    memcore::bytes::human(
        u64::from(memcore::StitchConfig::default().large_pages) * memcore::PAGE_BYTES,
    )
});

/// `--stitch-keep-idle`'s default: memcore's.
static DEFAULT_STITCH_KEEP_IDLE: LazyLock<String> =
    LazyLock::new(|| memcore::bytes::human(memcore::StitchConfig::default().keep_idle_bytes));

/// `--stitch-large`'s help, its default written as the output writes sizes.
static STITCH_LARGE_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "The stitch policies' large handles, in bytes (a multiple of 2 MiB; 0 or 2MiB: 2 MiB \
         handles only); default {}",
        default_size(&DEFAULT_STITCH_LARGE)
    )
});

/// `--stitch-keep-idle`'s help, likewise.
static STITCH_KEEP_IDLE_HELP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "Idle bytes the stitch policies keep mapped even past their budget (0: recycle whenever \
         the budget says so, least memory); default {}",
        default_size(&DEFAULT_STITCH_KEEP_IDLE)
    )
});

/// A default size in both forms, as every size is echoed.
fn default_size(text: &str) -> String {
    byte_size::parse(text).map_or_else(|_| text.to_owned(), memcore::bytes::exact)
}

/// A trace kept for the report, with what each policy did to it.
struct Replayed {
    trace: Trace,
    summary: TraceSummary,
    runs: Vec<(Outcome, Placement)>,
}

/// Arguments of `cudamem replay`. Their defaults are clap's, the one source
/// of them: a bare `cudamem` runs [`ReplayArgs::defaults`].
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Trace files: PyTorch memory snapshots (torch.cuda.memory._dump_snapshot)
    /// or RMM logging_resource_adaptor CSV logs (gzip or plain). None: the
    /// built-in ResNet-50 traces (a PyTorch snapshot, then an RMM log), with
    /// an HTML report.
    pub traces: Vec<PathBuf>,
    /// Replay through this policy only (repeatable); default: all of them
    /// but stitched-pool (with --gpu: stitched-pool).
    #[arg(long = "policy", value_parser = PolicyParser)]
    pub policies: Vec<&'static PolicySpec>,
    /// A fixed arena of this many bytes (e.g. 8GiB) instead of a growing one:
    /// report where each policy first fails. Sizes: K, KiB, M, MiB, G, GiB
    /// are binary (16K = 16384 B), KB, MB, GB decimal (16KB = 16000 B).
    #[arg(long, value_parser = byte_size::parse)]
    pub capacity: Option<u64>,
    /// One JSON object per trace per line, instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write an HTML report (memory maps, footprint curves) to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Of a multi-device PyTorch snapshot, replay only the device N it
    /// recorded (a device of the snapshot, not a GPU of this machine).
    #[arg(long, value_name = "N")]
    pub snapshot_device: Option<usize>,
    /// The old spelling of --snapshot-device: hidden, and warned about.
    #[arg(
        long = "device",
        value_name = "N",
        hide = true,
        conflicts_with = "snapshot_device"
    )]
    pub old_device: Option<usize>,
    /// Run the stitched-pool policy on CUDA device N, on the real driver (a
    /// cudamem built with the `cuda` feature): footprint by cuMemGetInfo,
    /// time per allocate and free, copy bandwidth at the peak against
    /// cuMemAlloc memory. Alone it replays through stitched-pool only.
    /// (`--snapshot-device` picks a snapshot's device.)
    #[arg(long, value_name = "N")]
    pub gpu: Option<u32>,
    /// The stitch policies' large handle, in bytes (help: `STITCH_LARGE_HELP`).
    #[arg(long, value_parser = byte_size::parse, default_value = DEFAULT_STITCH_LARGE.as_str(), hide_default_value = true, help = STITCH_LARGE_HELP.as_str(), help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)")]
    pub stitch_large: u64,
    /// Idle bytes kept mapped past the budget (help: `STITCH_KEEP_IDLE_HELP`).
    #[arg(long, value_parser = byte_size::parse, default_value = DEFAULT_STITCH_KEEP_IDLE.as_str(), hide_default_value = true, help = STITCH_KEEP_IDLE_HELP.as_str(), help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)")]
    pub stitch_keep_idle: u64,
    /// The stitch policies' footprint budget over the most bytes live so
    /// far, in parts per thousand: within it idle handles stay cached
    /// (fewer driver calls), past it they are recycled (less memory).
    #[arg(long, default_value_t = memcore::StitchConfig::default().slack_permille, help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)")]
    pub stitch_slack: u32,
    /// How far a new large handle of the stitch policies may take their
    /// footprint past the budget, in thousandths of the handle (1000: grow
    /// by whole large handles; 0: stitch the frontier from 2 MiB handles).
    #[arg(long, default_value_t = memcore::StitchConfig::default().overshoot_permille, help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)")]
    pub stitch_overshoot: u32,
    /// With nothing idle, let the stitch policies stitch growth past their
    /// budget from 2 MiB pages rather than take a whole large handle.
    #[arg(
        long,
        help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)"
    )]
    pub stitch_grow_pages: bool,
    /// Place the stitch policies' requests of at least a large handle at a
    /// multiple of it rather than at any 512-byte address.
    #[arg(
        long,
        help_heading = "Tuning the stitch model (research; the defaults are what cudamem ships)"
    )]
    pub stitch_align_large: bool,
}

impl ReplayArgs {
    /// The arguments of `cudamem replay` with nothing given: what a bare
    /// `cudamem` runs.
    pub fn defaults() -> Result<Self> {
        #[derive(Parser)]
        struct Bare {
            #[command(flatten)]
            args: ReplayArgs,
        }
        Ok(Bare::try_parse_from(["replay"])?.args)
    }

    /// The snapshot device to replay, and the warning to give when the old
    /// `--device` spelling named it.
    pub fn snapshot_device(&self) -> (Option<usize>, Option<String>) {
        match (self.snapshot_device, self.old_device) {
            (Some(device), _) => (Some(device), None),
            (None, Some(device)) => (
                Some(device),
                Some(format!(
                    "replay's --device {device} is now --snapshot-device {device} (--device names \
                     a GPU in explain and heap); the old spelling will go"
                )),
            ),
            (None, None) => (None, None),
        }
    }

    /// What the policies are built from.
    pub fn settings(&self) -> Result<Settings> {
        let arena = match self.capacity {
            Some(bytes) => Arena::fixed(bytes)?,
            None => Arena::Growable,
        };
        let page = memcore::PAGE_BYTES;
        if self.stitch_large % page != 0 || self.stitch_large / page > memcore::MAX_LARGE_PAGES {
            bail!(
                "--stitch-large {} is not a multiple of {page} bytes (2 MiB) of at most {} pages \
                 ({}, the largest handle the stitched model takes)",
                self.stitch_large,
                memcore::MAX_LARGE_PAGES,
                memcore::bytes::human(memcore::MAX_LARGE_PAGES * page)
            );
        }
        let stitch = memcore::StitchConfig {
            large_pages: (self.stitch_large / page) as u32,
            align_large: self.stitch_align_large,
            overshoot_permille: self.stitch_overshoot,
            grow_in_large: !self.stitch_grow_pages,
            keep_idle_bytes: self.stitch_keep_idle,
            slack_permille: self.stitch_slack,
            ..memcore::StitchConfig::default()
        };
        Ok(Settings {
            arena,
            stitch,
            gpu: self.gpu,
            ..Settings::default()
        })
    }

    /// The policies to run, each once, in the order given.
    fn chosen_policies(&self) -> Vec<&'static PolicySpec> {
        if self.policies.is_empty() {
            return spec::defaults(self.gpu.is_some());
        }
        let mut chosen: Vec<&'static PolicySpec> = Vec::new();
        for &spec in &self.policies {
            if !chosen.contains(&spec) {
                chosen.push(spec);
            }
        }
        chosen
    }
}

/// Run `cudamem replay`, writing the tables (or JSON lines) to `out`.
pub fn run(args: ReplayArgs, out: &mut dyn Write) -> Result<()> {
    let settings = args.settings()?;
    let policies = args.chosen_policies();
    let report_path = if args.traces.is_empty() {
        Some(
            args.report
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_REPORT)),
        )
    } else {
        args.report.clone()
    };
    // Before any replay: a report that cannot be written fails now, not
    // after minutes of work.
    let report_file = report_path
        .map(|path| ReportFile::open(path, &args.traces))
        .transpose()?;
    let traces = load_traces(&args)?;
    // A trace with no allocation has nothing to replay: one line says so
    // rather than a table of zeros.
    if let Some(empty) = traces
        .iter()
        .find(|trace| trace.events.is_empty() && trace.skipped.is_empty())
    {
        bail!(
            "{}: the trace holds no allocation or free (nothing was recorded: a log with its \
             header only, as `cudamem run --trace` leaves when the program made no CUDA \
             allocation); nothing to replay",
            empty.name
        );
    }

    let record = report_file.is_some();
    let mut replayed: Vec<Replayed> = Vec::new();
    for trace in traces {
        let progress = progress_bar(&trace, policies.len());
        let mut outcomes = Vec::new();
        let mut placements = Vec::new();
        let mut skipped = Vec::new();
        for &spec in &policies {
            progress.set_message(spec.name);
            match replay::run(spec, &trace, &settings, &progress, record) {
                Ok((outcome, placement)) => {
                    outcomes.push(outcome);
                    placements.extend(placement);
                }
                Err(err) => match err.downcast_ref::<ArenaRefused>() {
                    Some(refused) => skipped.push(SkippedPolicy {
                        name: spec.name,
                        reason: format!("{} {refused}", spec.name),
                    }),
                    None if cannot_take(&err) => skipped.push(SkippedPolicy {
                        name: spec.name,
                        // The chain below the "replaying X through P" context.
                        reason: format!(
                            "{} cannot take this trace: {}",
                            spec.name,
                            err.chain()
                                .skip(1)
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(": ")
                        ),
                    }),
                    None => return Err(err),
                },
            }
        }
        progress.finish_and_clear();
        if outcomes.is_empty() && !skipped.is_empty() {
            bail!(
                "no chosen policy can take the arena: {}",
                skipped
                    .iter()
                    .map(|policy| policy.reason.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        let summary = TraceSummary::new(&trace, args.capacity, &outcomes, skipped);
        if args.json {
            writeln!(out, "{}", serde_json::to_string(&summary)?)?;
        } else {
            writeln!(out, "{}", summary.table())?;
        }
        out.flush()?;
        if record {
            replayed.push(Replayed {
                trace,
                summary,
                runs: outcomes.into_iter().zip(placements).collect(),
            });
        }
    }

    if let Some(file) = report_file {
        let reports: Vec<TraceReport<'_>> = replayed
            .iter()
            .map(|replayed| TraceReport {
                trace: &replayed.trace,
                summary: &replayed.summary,
                policies: replayed
                    .runs
                    .iter()
                    .map(|(outcome, placement)| (outcome, placement))
                    .collect(),
                extra_curves: replayed
                    .trace
                    .recorded
                    .iter()
                    .map(|recorded| report::FootprintCurve {
                        name: crate::report::summary::RECORDED_ROW,
                        mapped: &recorded.reserved,
                    })
                    .collect(),
            })
            .collect();
        let html = report::replay_page(&reports, &settings)?;
        let path = file.write(html.as_bytes())?;
        if !args.json {
            writeln!(out, "report: {}", path.display())?;
        }
    }
    if args.traces.is_empty() && !args.json {
        writeln!(out, "{ASK_ABOUT_YOURS}")?;
    }
    Ok(())
}

/// Tell, on stderr, once per kind with a count, the odd records the
/// readers accepted (a closed stderr loses the warning, nothing more).
fn warn_oddities(traces: &[Trace]) {
    let mut err = std::io::stderr().lock();
    for trace in traces {
        for noted in &trace.noted {
            let _ = writeln!(
                err,
                "cudamem: warning: {}: {} {} (first at {})",
                trace.name,
                noted.count,
                noted.oddity.describe(),
                noted.first
            );
        }
    }
}

/// The traces `args` names (the built-in ones if none), of the snapshot
/// device it picks.
fn load_traces(args: &ReplayArgs) -> Result<Vec<Trace>> {
    if args.traces.is_empty() {
        return Ok(trace::file::load_embedded()?);
    }
    let (snapshot_device, warning) = args.snapshot_device();
    if let Some(warning) = warning {
        eprintln!("cudamem: warning: {warning}");
    }
    let mut traces = Vec::new();
    for path in &args.traces {
        let spinner = reading_spinner(path);
        let device = snapshot_device.map(|device| u32::try_from(device).unwrap_or(u32::MAX));
        let loaded = trace::file::load_device(path, device);
        spinner.finish_and_clear();
        let loaded = loaded?;
        warn_oddities(&loaded);
        traces.extend(loaded);
    }
    Ok(traces)
}

/// The report file, opened before the replay. Dropped unwritten (the
/// replay failed), a file it created is removed again; an existing one is
/// left as it was.
struct ReportFile {
    path: PathBuf,
    file: Option<File>,
    created: bool,
}

impl ReportFile {
    /// Open `path` for the report, refusing a path that is one of `inputs`.
    fn open(path: PathBuf, inputs: &[PathBuf]) -> Result<Self> {
        let inputs: Vec<&Path> = inputs.iter().map(PathBuf::as_path).collect();
        output::refuse_input("--report", &path, &inputs)?;
        let context = || format!("cannot write the report to {}", path.display());
        let (file, created) = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => (file, true),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => (
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .with_context(context)?,
                false,
            ),
            Err(err) => return Err(err).with_context(context),
        };
        Ok(Self {
            path,
            file: Some(file),
            created,
        })
    }

    /// Replace the file's contents with `bytes`; the path written.
    fn write(mut self, bytes: &[u8]) -> Result<PathBuf> {
        let context = || format!("writing the report to {}", self.path.display());
        if let Some(mut file) = self.file.take() {
            if file.metadata().with_context(context)?.is_file() {
                file.set_len(0).with_context(context)?;
            }
            file.write_all(bytes).with_context(context)?;
            file.flush().with_context(context)?;
        }
        Ok(std::mem::take(&mut self.path))
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        if self.file.take().is_some() && self.created {
            let _ = std::fs::remove_file(Path::new(&self.path));
        }
    }
}

/// Work that shows no progress for this long gets a bar on stderr.
const QUIET_FOR: Duration = Duration::from_secs(1);

/// A bar over every event of every policy's replay of `trace`, drawn once
/// the replay has taken over [`QUIET_FOR`] (hidden until then, and for good
/// when stderr is no terminal: pipes, CI logs, tests).
fn progress_bar(trace: &Trace, policies: usize) -> ProgressBar {
    let total = (trace.events.len() * policies) as u64;
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template("{prefix} {msg:>18} [{bar:40}] {percent:>3}% {eta}")
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(trace.name.clone());
    show_if_slow(&bar, std::io::stderr().is_terminal());
    bar
}

/// A spinner while `path` is read, drawn as [`progress_bar`]'s is.
fn reading_spinner(path: &Path) -> ProgressBar {
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template("{spinner} reading {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    spinner.set_style(style);
    spinner.set_message(path.display().to_string());
    spinner.enable_steady_tick(Duration::from_millis(120));
    show_if_slow(&spinner, std::io::stderr().is_terminal());
    spinner
}

/// Draw `bar` on stderr once it has run [`QUIET_FOR`] unfinished, if
/// stderr is a `terminal`.
fn show_if_slow(bar: &ProgressBar, terminal: bool) {
    if !terminal {
        return;
    }
    let bar = bar.clone();
    std::thread::spawn(move || {
        std::thread::sleep(QUIET_FOR);
        if !bar.is_finished() {
            bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_defaults_are_the_librarys() {
        let defaults = ReplayArgs::defaults().unwrap();
        assert_eq!(defaults.settings().unwrap(), Settings::default());
        assert!(defaults.traces.is_empty() && defaults.policies.is_empty());
        assert_eq!(defaults.chosen_policies(), spec::defaults(false));
    }

    #[test]
    fn progress_stays_hidden_off_a_terminal() {
        let bar = ProgressBar::with_draw_target(Some(10), ProgressDrawTarget::hidden());
        show_if_slow(&bar, false);
        bar.inc(5);
        assert!(bar.is_hidden());
        let spinner = reading_spinner(Path::new("trace.csv"));
        spinner.finish_and_clear();
        assert!(spinner.is_hidden() || std::io::stderr().is_terminal());
    }

    #[test]
    fn policies_are_named_once_in_the_order_given() {
        #[derive(Debug, Parser)]
        struct Replay {
            #[command(flatten)]
            args: ReplayArgs,
        }
        let args = Replay::try_parse_from([
            "replay", "--policy", "stitch", "--policy", "tlsf", "--policy", "stitch",
        ])
        .unwrap()
        .args;
        let names: Vec<&str> = args.chosen_policies().iter().map(|s| s.name).collect();
        assert_eq!(names, ["stitch", "tlsf"]);
        let err = Replay::try_parse_from(["replay", "--policy", "fastest"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let said = err.to_string();
        assert!(
            said.contains("fastest") && said.contains("pytorch-expandable"),
            "{said}"
        );
        let gpu = Replay::try_parse_from(["replay", "--gpu", "0"])
            .unwrap()
            .args;
        assert_eq!(gpu.chosen_policies(), spec::defaults(true));
    }
}
