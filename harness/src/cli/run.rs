//! `cudamem run [--trace FILE] [--report FILE.html] [--pool] -- PROGRAM ARGS...`:
//! run an unmodified CUDA program with the driver interposer preloaded,
//! then print the ledger of each of its processes at its peak (on
//! stderr, after the program's own output) and exit with the program's
//! status (a signal `n` as `128 + n`, as shells do). The work is
//! `crate::process::run`'s; this is the command line.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::process::driver_search::{self, DRIVER_NAME};
use crate::process::report::{ProcessReport, html};
use crate::process::run::{
    HOOK_LIB_VAR, RunError, RunPlan, exit_code, find_hook, not_entered, prepare,
};
use trace::event_log::DEFAULT_MAX_LOG_BYTES;
use trace::process::libraries::file_name;

// `--max-log-bytes`'s default is written in the help as the output writes
// sizes: it must stay the log's own default.
const _: () = assert!(DEFAULT_MAX_LOG_BYTES == 1 << 30);

use crate::cli::pause::{self, CONTROL_DIR_VAR, POOL_VAR};
use crate::cli::{byte_size, output, torch_adoption};

/// The exit status for a program that cannot be found, as shells use.
const NOT_FOUND_STATUS: u8 = 127;
/// The exit status for a program that is not executable, as shells use.
const NOT_EXECUTABLE_STATUS: u8 = 126;

/// Arguments of `cudamem run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Write the started process's device allocations as an RMM log
    /// (`cudamem replay FILE` replays it); other processes' go beside it as
    /// STEM.<pid>.EXT, and every process's event log to FILE.events/.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Overwrite the --trace file if it exists.
    #[arg(long)]
    force: bool,
    /// Write an HTML report of the ledgers.
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
    /// The most bytes each process's event log may take; records past it
    /// are counted and dropped; default 1.00 GiB (1073741824 B). Sizes: K,
    /// KiB, M, MiB, G, GiB are binary (16K = 16384 B), KB, MB, GB decimal
    /// (16KB = 16000 B).
    #[arg(
        long,
        value_name = "BYTES",
        value_parser = byte_size::parse,
        default_value = "1GiB",
        hide_default_value = true
    )]
    max_log_bytes: u64,
    /// Run a PyTorch program on cudamem's backend with this pool, unmodified
    /// (installed when it imports torch; see python/adopt/sitecustomize.py).
    #[arg(long, value_name = "POLICY")]
    torch: Option<torch_adoption::TorchPolicy>,
    /// Serve the program's cuMemAlloc/cuMemFree from cudamem's pool in its
    /// own process (POLICY: stitch, the one there is), so that `cudamem
    /// pause PID` can give its memory back and `cudamem resume PID` bring
    /// it back at the same addresses.
    #[arg(long, value_name = "POLICY", num_args = 0..=1, default_missing_value = "stitch",
          value_parser = ["stitch"])]
    pool: Option<String>,
    /// The program to run and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<OsString>,
}

/// Run the program; the exit status is the program's (what cannot start it
/// is told on stderr, with the status a shell would give).
pub fn run(args: RunArgs) -> u8 {
    if let Err(err) = refuse_inputs(&args) {
        eprintln!("cudamem run: {err}");
        return 1;
    }
    match run_program(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("cudamem run: {err}");
            match err {
                RunError::ProgramNotFound { .. } => NOT_FOUND_STATUS,
                RunError::NotExecutable { .. } => NOT_EXECUTABLE_STATUS,
                _ => 1,
            }
        }
    }
}

/// Neither output may be the program, nor the report the trace.
fn refuse_inputs(args: &RunArgs) -> Result<(), output::SameFile> {
    let program = args.command.first().map(Path::new);
    let inputs: Vec<&Path> = program.into_iter().collect();
    if let Some(trace) = &args.trace {
        output::refuse_input("--trace", trace, &inputs)?;
    }
    if let Some(report) = &args.report {
        let mut inputs = inputs.clone();
        inputs.extend(args.trace.as_deref());
        output::refuse_input("--report", report, &inputs)?;
    }
    Ok(())
}

fn run_program(args: RunArgs) -> Result<u8, RunError> {
    let mut command = args.command.into_iter();
    let mut program = command.next().unwrap_or_default();
    let exe = std::env::current_exe().unwrap_or_default();
    let mut rest: Vec<OsString> = command.collect();
    let hook = find_hook(std::env::var_os(HOOK_LIB_VAR), &exe)?;
    let shown = std::iter::once(program.clone())
        .chain(rest.iter().cloned())
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(policy) = args.torch {
        let var = |name| std::env::var_os(name);
        let wrapped = torch_adoption::wrap(
            policy,
            program,
            rest,
            &exe,
            var("CUDAMEM_TORCH_PY"),
            var("CUDAMEM_TORCH_LIB"),
            var("PYTHONPATH"),
        );
        match wrapped {
            Ok(command) => (program, rest) = command,
            Err(problem) => {
                eprintln!("cudamem run: {problem}");
                return Ok(1);
            }
        }
    }
    let control = match &args.pool {
        Some(_) => Some(
            pause::ControlDir::make().map_err(|source| RunError::LogDir {
                path: std::env::temp_dir(),
                source,
            })?,
        ),
        None => None,
    };
    let mut env = Vec::new();
    if let (Some(policy), Some(control)) = (&args.pool, &control) {
        env.push((POOL_VAR.to_string(), OsString::from(policy)));
        env.push((
            CONTROL_DIR_VAR.to_string(),
            control.path().as_os_str().to_os_string(),
        ));
    }
    let plan = RunPlan {
        program,
        args: rest,
        hook,
        trace: args.trace,
        report: args.report.clone(),
        max_log_bytes: args.max_log_bytes,
        env,
        force: args.force,
    };
    let prepared = prepare(plan, std::env::var_os("PATH").as_deref())?;
    let program_path = prepared.program().to_path_buf();
    let finished = prepared.run()?;
    drop(control);
    let code = exit_code(finished.status);
    // The program's own output comes first; from here on nothing changes
    // the program's status: a failure is told, and the status returned.
    let mut err = std::io::stderr().lock();
    let reports = match finished.reports {
        Ok(reports) => reports,
        Err(problem) => {
            let _ = writeln!(err, "cudamem run: {shown}: exit status {code}; {problem}");
            return Ok(code);
        }
    };
    let (recorded, asked): (Vec<ProcessReport>, Vec<ProcessReport>) = reports
        .into_iter()
        .partition(ProcessReport::made_driver_calls);
    let mut notes = vec![format!(
        "{shown}: exit status {code}; {} process{} recorded",
        recorded.len(),
        if recorded.len() == 1 { "" } else { "es" }
    )];
    notes.extend(unseen(&recorded, &asked, &program_path));
    if let Some(trace) = &finished.trace_removed {
        notes.push(format!(
            "no trace written: {} would hold no allocation, so it and {}.events/ are not kept",
            trace.display(),
            trace.display()
        ));
    }
    let _ = writeln!(err);
    for note in &notes {
        let _ = writeln!(err, "cudamem run: {note}");
    }
    for report in &recorded {
        let _ = write!(err, "{}", report.render());
    }
    if let Some(path) = &args.report {
        match std::fs::write(path, html(&shown, &notes, &recorded)) {
            Ok(()) => {
                let _ = writeln!(err, "cudamem run: report written to {}", path.display());
            }
            Err(problem) => {
                let _ = writeln!(err, "cudamem run: writing {}: {problem}", path.display());
            }
        }
    }
    Ok(code)
}

/// What cudamem could not see, said when it matters: each process that
/// asked the loader for the driver and got none, and, when no process made
/// a driver call, why (the program could not be entered; no driver library
/// where the loader looks; or the program made no call).
fn unseen(recorded: &[ProcessReport], asked: &[ProcessReport], program: &Path) -> Vec<String> {
    let mut notes: Vec<String> = asked
        .iter()
        .filter_map(|report| {
            let name = report.counts.driver_missing.as_ref()?;
            Some(format!(
                "process {} ({}) asked the loader for {name} (dlopen), and no driver library was \
                 loaded by its exit",
                report.pid,
                file_name(&report.exe)
            ))
        })
        .collect();
    if !recorded.is_empty() {
        return notes;
    }
    if let Some(why) = not_entered(program) {
        notes.push(format!(
            "cudamem could not enter {}: {why}; what it did on the GPU is not known",
            program.display()
        ));
        return notes;
    }
    let search = driver_search::search(std::env::var_os("LD_LIBRARY_PATH").as_deref());
    notes.push(match &search.found {
        None => format!(
            "no {DRIVER_NAME} could be loaded: the loader looked in {search}, and found none; \
             the program made no CUDA driver call, so there is no GPU memory to explain (install \
             the NVIDIA driver, or add the folder that holds {DRIVER_NAME} to LD_LIBRARY_PATH)"
        ),
        Some(found) => format!(
            "the program made no CUDA driver call that cudamem saw (no CUDA context was created), \
             so there is no GPU memory to explain; the loader finds {DRIVER_NAME} at {}",
            found.display()
        ),
    });
    notes
}
