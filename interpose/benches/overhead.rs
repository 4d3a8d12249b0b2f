//! What the interposer adds to an allocation call, against the fake driver:
//! `cuMemAlloc_v2` + `cuMemFree_v2` pairs of 256 B, timed inside the C
//! program (interpose/fixtures), bare, preloaded without a log, and preloaded
//! with a log; called directly (the caller named from the return address)
//! and through a shared runtime (named past the runtime's frames), on one,
//! eight and sixteen threads. Each thread's own time per pair is shown
//! twice: wall time (on a machine with fewer cores than threads it counts
//! the time the others ran) and the thread's CPU time (what the thread
//! itself spent, contention included: waiting for a lock, cache lines
//! moving between cores). Then the cheap calls one at a time (a launch
//! after the function's first, `cuMemGetInfo_v2`, a `cuMemAllocAsync` +
//! `cuMemFreeAsync` pair, a `cuModuleGetFunction` lookup seen before), the
//! same three ways. Each configuration runs several times, interleaved;
//! the fastest run counts (the others met a busy machine). The fake driver
//! keeps each thread's allocations apart (`FAKE_CUDA_PER_THREAD=1`, no lock
//! of its own), so what grows with threads is the interposer's cost.
//!
//! With `CUDAMEM_BENCH_AGAINST` naming another build of
//! `libcudamem_interpose.so` (an older one, copied aside), the pairs are
//! also run under it, interleaved with this build's runs, and both are
//! shown side by side.
//!
//! `cargo bench -p cudamem-interpose --bench overhead`

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs of each configuration.
const RUNS: usize = 7;
/// Pairs per run.
const PAIRS: &str = "300000";
/// Calls of each kind per run of the cheap calls.
const CALLS: &str = "1000000";

fn fixtures(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/build.sh");
    let status = Command::new("sh").arg(&script).arg(dir).status().unwrap();
    assert!(status.success(), "{} failed", script.display());
}

fn hook_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libcudamem_interpose.so"),
        deps.join("../libcudamem_interpose.so"),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .expect("libcudamem_interpose.so is built with this bench")
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Bare,
    Hook,
    Logged,
}

/// The figures (nanoseconds) the program prints, one line of them.
fn run(dir: &Path, hook: &Path, logs: &Path, mode: Mode, program: &str, args: &[&str]) -> Vec<f64> {
    let mut command = Command::new(dir.join(program));
    command.args(args);
    command
        .env("LD_LIBRARY_PATH", dir)
        .env("FAKE_CUDA_PER_THREAD", "1")
        .env_remove("LD_PRELOAD");
    if mode != Mode::Bare {
        command.env("LD_PRELOAD", hook);
    }
    if mode == Mode::Logged {
        let _ = std::fs::remove_dir_all(logs);
        std::fs::create_dir_all(logs).unwrap();
        command.env("CUDAMEM_HOOK_DIR", logs);
    }
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(|figure| figure.parse().unwrap())
        .collect()
}

/// Fastest wall and CPU time per pair: bare, then preloaded and logged for
/// each library.
struct Pairs {
    bare: [f64; 2],
    /// Per library: preloaded, logged; each [wall, cpu].
    hooked: Vec<[[f64; 2]; 2]>,
}

fn pairs(dir: &Path, libraries: &[PathBuf], logs: &Path, program: &str, args: &[&str]) -> Pairs {
    let mut best = Pairs {
        bare: [f64::MAX; 2],
        hooked: vec![[[f64::MAX; 2]; 2]; libraries.len()],
    };
    let keep = |slot: &mut [f64; 2], figures: Vec<f64>| {
        for (kept, figure) in slot.iter_mut().zip(figures) {
            *kept = kept.min(figure);
        }
    };
    for _ in 0..RUNS {
        let bare = run(dir, &libraries[0], logs, Mode::Bare, program, args);
        keep(&mut best.bare, bare);
        for (library, slots) in libraries.iter().zip(best.hooked.iter_mut()) {
            for (slot, mode) in slots.iter_mut().zip([Mode::Hook, Mode::Logged]) {
                keep(slot, run(dir, library, logs, mode, program, args));
            }
        }
    }
    best
}

fn main() {
    // Removed when dropped, on a panic too.
    let base = tempfile::Builder::new()
        .prefix("cudamem-interpose-bench-")
        .tempdir()
        .unwrap();
    let dir = base.path().join("fixtures");
    let logs = base.path().join("logs");
    fixtures(&dir);
    let mut libraries = vec![hook_library()];
    let mut names = vec!["this build".to_string()];
    if let Some(other) = std::env::var_os("CUDAMEM_BENCH_AGAINST") {
        let other = PathBuf::from(other);
        assert!(other.is_file(), "{} is not a file", other.display());
        names.push(other.display().to_string());
        libraries.push(other);
    }
    println!(
        "pairs of cuMemAlloc_v2 + cuMemFree_v2 (256 B) on the fake driver, fastest of {RUNS} runs; \
         each thread's wall time / CPU time per pair"
    );
    for (index, name) in names.iter().enumerate() {
        println!("library {}: {name}", index + 1);
    }
    println!(
        "{:<34} {:>3} {:>15} {:>15} {:>15} {:>15} {:>15}",
        "path", "lib", "bare ns", "hook ns", "logged ns", "+ns/call hook", "+ns/call log"
    );
    let both = |[wall, cpu]: [f64; 2]| format!("{wall:.1} / {cpu:.1}");
    for (name, program, args) in [
        ("linked, 1 thread", "cuda_linked", &["bench", PAIRS][..]),
        (
            "via a shared runtime, 1 thread",
            "cuda_runtime",
            &["bench", PAIRS, "1"],
        ),
        (
            "via a shared runtime, 8 threads",
            "cuda_runtime",
            &["bench", PAIRS, "8"],
        ),
        (
            "via a shared runtime, 16 threads",
            "cuda_runtime",
            &["bench", PAIRS, "16"],
        ),
    ] {
        let best = pairs(&dir, &libraries, &logs, program, args);
        for (index, [hooked, logged]) in best.hooked.iter().enumerate() {
            // A pair is two calls.
            let added = |with: [f64; 2]| [0, 1].map(|at| (with[at] - best.bare[at]) / 2.0);
            println!(
                "{name:<34} {:>3} {:>15} {:>15} {:>15} {:>15} {:>15}",
                index + 1,
                both(best.bare),
                both(*hooked),
                both(*logged),
                both(added(*hooked)),
                both(added(*logged)),
            );
        }
    }
    println!("\ncheap calls on the fake driver, linked, 1 thread, fastest of {RUNS} runs");
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "call", "bare ns", "hook ns", "logged ns", "+ns/call hook", "+ns/call log"
    );
    let names = [
        "cuLaunchKernel (not the first)",
        "cuMemGetInfo_v2",
        "cuMemAllocAsync + cuMemFreeAsync",
        "cuModuleGetFunction (seen before)",
    ];
    let mut best = [[f64::MAX; 3]; 4];
    for _ in 0..RUNS {
        for (slot, mode) in [Mode::Bare, Mode::Hook, Mode::Logged]
            .into_iter()
            .enumerate()
        {
            let figures = run(
                &dir,
                &libraries[0],
                &logs,
                mode,
                "cuda_linked",
                &["calls", CALLS],
            );
            for (call, figure) in figures.into_iter().enumerate() {
                best[call][slot] = best[call][slot].min(figure);
            }
        }
    }
    for (name, [bare, hooked, logged]) in names.iter().zip(best) {
        // The pair is two calls.
        let per = if name.contains('+') { 2.0 } else { 1.0 };
        println!(
            "{name:<34} {bare:>10.1} {hooked:>10.1} {logged:>10.1} {:>14.1} {:>14.1}",
            (hooked - bare) / per,
            (logged - bare) / per
        );
    }
}
