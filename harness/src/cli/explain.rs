//! `cudamem explain`: the context ledger. Where a GPU's memory goes before
//! the program allocates anything: the driver and context, local memory for
//! every resident thread, module code, the malloc heap, a cm_malloc heap
//! (`--cm-heap`) and the printf FIFO.
//! Predicted from a built-in device profile, or measured on a GPU (feature
//! `cuda`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use ctx::{DeviceProfile, Ledger, LedgerItemKind, Limits, Workload};
use plotters::prelude::*;
use serde_json::{Map, Value, json};

use crate::cli::byte_size;
use crate::report::{Swatch, conclusion, escape, legend, page};
use ctx::text::{LINE_WIDTH, wrap};
use memcore::bytes::{exact, human};
use trace::snapshot::moments;

/// `--profile`'s help: the built-in models, from the profile table.
fn profile_help() -> String {
    let names: Vec<&str> = DeviceProfile::all().iter().map(|p| p.name).collect();
    format!(
        "GPU model to predict for, without a GPU: {}. A model, not a measurement: only the \
         h200's driver and context costs were measured; the others' are unknown (free is then \
         a bound)",
        names.join(", ")
    )
}

/// What `explain --help` says after the options: every column and line.
pub const COLUMNS_HELP: &str = "\
The ledger (every item of the GPU's memory) has four columns:
  item       what takes the memory
  predicted  what the model says from the GPU's profile and the limits: bytes, `at most`
             a bound, or `unknown` where nobody measured it on this model
  measured   what the GPU showed (--device N); `-` without one
  why        where the figure comes from
Its lines: total (the GPU's memory); driver + context (what creating a context takes);
local memory (stacks and spilled locals, reserved for every thread the GPU can hold at
once); module code; malloc heap (in-kernel malloc); cm_malloc heap (cudamem's in-kernel
allocator); printf FIFO; user allocations; fragmentation (free memory no single
allocation can get); free.

With --snapshot, one row per segment (memory PyTorch got from the driver in one piece):
  segment       its device address
  pool          small (requests up to 1 MiB) or large
  size          its bytes
  allocated     bytes in blocks handed to tensors
  active        allocated, or freed but waiting for its stream's work
  free          bytes in free blocks
  largest free  the largest free block: the largest request the segment serves
Stranded bytes are free bytes in segments holding a live block: PyTorch's retry before an
out-of-memory error cannot return them.";

/// Arguments of `cudamem explain`.
#[derive(Debug, clap::Args)]
#[command(after_help = COLUMNS_HELP)]
pub struct ExplainArgs {
    #[arg(long, default_value = "h200", conflicts_with = "device", help = profile_help())]
    profile: String,
    /// Measure CUDA device N instead, or `all`: every device's ledger, then
    /// which devices reach which (needs a build with the `cuda` feature).
    #[arg(long, value_parser = parse_device)]
    device: Option<DeviceChoice>,
    /// Stack limit per thread (CU_LIMIT_STACK_SIZE), e.g. 4KiB; default 1.00 KiB
    /// (1024 B). Sizes: K, KiB, M, MiB, G, GiB are binary (16K = 16384 B), KB,
    /// MB, GB decimal (16KB = 16000 B).
    #[arg(long, value_parser = byte_size::parse)]
    stack_size: Option<u64>,
    /// In-kernel malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE); default 8.00 MiB
    /// (8388608 B).
    #[arg(long, value_parser = byte_size::parse)]
    heap_size: Option<u64>,
    /// A cm_malloc heap (cudamem's in-kernel allocator) of this much, e.g. 256MiB: a line
    /// for the bytes it takes from the pool (descriptor and regions), beside
    /// CUDA's malloc heap; default none.
    #[arg(long, value_parser = byte_size::parse)]
    cm_heap: Option<u64>,
    /// printf FIFO (CU_LIMIT_PRINTF_FIFO_SIZE); default 8.25 MiB (8650752 B).
    #[arg(long, value_parser = byte_size::parse)]
    printf_fifo: Option<u64>,
    /// Local memory per thread of a loaded kernel (repeatable): the largest
    /// frame sets the reservation when it exceeds the stack limit.
    #[arg(long = "lmem", value_parser = byte_size::parse)]
    pub(crate) kernel_local_bytes: Vec<u64>,
    /// Explain a PyTorch memory snapshot instead
    /// (torch.cuda.memory._dump_snapshot, gzip or plain): per segment its
    /// size, allocated, active (allocated or freed but waiting on its
    /// stream), free and largest free block; what is stranded in segments
    /// holding live blocks and what PyTorch's retry before an out-of-memory
    /// would free; and the live blocks that hold segments, with their stacks.
    #[arg(
        long,
        conflicts_with_all = [
            "device", "profile", "stack_size", "heap_size", "cm_heap", "printf_fifo",
            "kernel_local_bytes",
        ]
    )]
    snapshot: Option<PathBuf>,
    /// Which moment of the snapshot: `dump` (default), `peak` (when the most
    /// was allocated), `oom` (each out-of-memory entry of its history)
    /// or N (right after history entry N). All but `dump` need the history
    /// (_record_memory_history before the dump); --report draws the first
    /// moment.
    #[arg(long, requires = "snapshot", value_parser = moments::parse_moment)]
    at: Option<moments::Moment>,
    /// Of a multi-device snapshot, only the device N it recorded (default:
    /// every device at the dump; the first device with a history for the
    /// other moments).
    #[arg(long, value_name = "N", requires = "snapshot", value_parser = parse_snapshot_device)]
    snapshot_device: Option<u32>,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write an HTML page to this file: the ledger as a stacked bar, or with
    /// --snapshot the picture of the segments and blocks.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// What `--device` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// One device, by ordinal.
    One(u32),
    /// Every device of the host.
    All,
}

/// `--device`'s value: an ordinal, or `all`.
fn parse_device(text: &str) -> Result<DeviceChoice, String> {
    if text.trim().eq_ignore_ascii_case("all") {
        return Ok(DeviceChoice::All);
    }
    text.trim().parse().map(DeviceChoice::One).map_err(|_| {
        let shown: String = text.chars().take(80).collect();
        format!("{shown:?} is neither a device ordinal (0, 1, ...) nor `all`")
    })
}

/// `--snapshot-device`'s value: a CUDA device ordinal as PyTorch records
/// it (32 bits), never cut to fit.
fn parse_snapshot_device(text: &str) -> Result<u32, String> {
    let shown: String = text.chars().take(80).collect();
    let number: u64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{shown:?} is not a device ordinal (0, 1, ...)"))?;
    u32::try_from(number).map_err(|_| {
        format!(
            "device {number} is past the largest ordinal a snapshot can name ({})",
            u32::MAX
        )
    })
}

/// A ledger and where its figures came from.
pub(crate) struct Explained {
    pub(crate) profile: DeviceProfile,
    pub(crate) ledger: Ledger,
    /// Extra measured figures (name without the `measured_` prefix, bytes).
    measured_extra: Vec<(&'static str, u64)>,
}

/// Run `cudamem explain`, writing the ledger to `out`.
pub fn run(args: ExplainArgs, out: &mut dyn Write) -> Result<()> {
    if let Some(snapshot) = &args.snapshot {
        return crate::cli::explain_snapshot::run(
            snapshot,
            args.at.unwrap_or(moments::Moment::Dump),
            args.snapshot_device.map(|device| device as usize),
            args.json,
            args.report.as_deref(),
            out,
        );
    }
    let most = kernels::cm_heap::region_bytes(kernels::cm_heap::MAX_CHUNKS);
    if let Some(bytes) = args.cm_heap.filter(|&b| b > most) {
        return Err(anyhow!(
            "--cm-heap {}: a cm_malloc heap holds at most {} chunks, {} of regions",
            memcore::bytes::exact(bytes),
            kernels::cm_heap::MAX_CHUNKS,
            memcore::bytes::exact(most)
        ));
    }
    if args.device == Some(DeviceChoice::All) {
        if args.report.is_some() {
            return Err(anyhow!(
                "--report draws one ledger; with --device all, name one device (--device N)"
            ));
        }
        return crate::cli::explain_devices::run(&args, out);
    }
    let defaults = Limits::cuda_default();
    let limits = Limits {
        stack_bytes: args.stack_size.unwrap_or(defaults.stack_bytes),
        malloc_heap_bytes: args.heap_size.unwrap_or(defaults.malloc_heap_bytes),
        printf_fifo_bytes: args.printf_fifo.unwrap_or(defaults.printf_fifo_bytes),
    };
    let explained = match args.device {
        Some(DeviceChoice::One(ordinal)) => measure(ordinal, &args)?,
        Some(DeviceChoice::All) | None => {
            let profile = DeviceProfile::builtin(&args.profile).ok_or_else(|| {
                let known: Vec<&str> = DeviceProfile::all().iter().map(|p| p.name).collect();
                anyhow!(
                    "unknown profile {:?}; built-in profiles: {}",
                    args.profile,
                    known.join(", ")
                )
            })?;
            let ledger = predict(&profile, &limits, &args);
            Explained {
                profile,
                ledger,
                measured_extra: Vec::new(),
            }
        }
    };
    // A ledger no device could have is an error, not a table of saturated
    // figures.
    explained
        .ledger
        .check_fits()
        .with_context(|| format!("the {} ledger", explained.profile.full_name))?;
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string(&to_json(&explained, &args.kernel_local_bytes))?
        )?;
    } else {
        write!(out, "{}", text(&explained))?;
    }
    if let Some(path) = &args.report {
        std::fs::write(path, ledger_page(&explained)?)
            .with_context(|| format!("writing the report to {}", path.display()))?;
        if !args.json {
            writeln!(out, "report: {}", path.display())?;
        }
    }
    Ok(())
}

/// What a model of a GPU says it is, in a header line.
pub(crate) fn model_header(profile: &DeviceProfile) -> String {
    format!(
        "model for {} (not measured: run `cudamem explain --device N` on the GPU, or `cudamem \
         run -- PROGRAM`)",
        profile.full_name
    )
}

/// The ledger for people: a model says so first; then the table; what the
/// model cannot say; and, when local memory is big, how to find and lower it.
pub(crate) fn text(explained: &Explained) -> String {
    let ledger = &explained.ledger;
    let mut out = String::new();
    let mut say = |text: &str| {
        out += &wrap(text, LINE_WIDTH, "", "  ");
        out.push('\n');
    };
    if !ledger.is_measured() {
        say(&model_header(&explained.profile));
    }
    let unknown: Vec<&str> = ledger.unknown_items().map(|item| item.name()).collect();
    let unknown = (!unknown.is_empty()).then(|| {
        format!(
            "unknown for this model: {}; so free is at most {}",
            unknown.join(", "),
            human(
                ledger
                    .item(LedgerItemKind::Free)
                    .and_then(|item| item.predicted.most())
                    .unwrap_or(0)
            )
        )
    });
    out += &ledger.to_string();
    if let Some(unknown) = unknown {
        out += &wrap(&unknown, LINE_WIDTH, "", "  ");
        out.push('\n');
    }
    if let Some(advice) = ledger.local_memory_advice() {
        out += &advice.to_string();
    }
    if let Some(conclusion) = conclusion::cm_heap(ledger) {
        out += &wrap(&conclusion, LINE_WIDTH, "", "  ");
        out.push('\n');
    }
    out
}

/// The ledger the arguments describe, before anything is measured.
fn predict(profile: &DeviceProfile, limits: &Limits, args: &ExplainArgs) -> Ledger {
    let workload = Workload {
        kernels_local_bytes: &args.kernel_local_bytes,
        calls_printf: false,
        calls_malloc: false,
        user_bytes: 0,
        cm_heap_bytes: args.cm_heap.map_or(0, ctx::device_heap_bytes),
    };
    Ledger::predict_workload(profile, limits, &workload)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn measure(ordinal: u32, _args: &ExplainArgs) -> Result<Explained> {
    Err(anyhow!(
        "--device {ordinal}: cudamem was built without the cuda feature; \
         rebuild with `--features cuda` to measure a GPU, or use --profile"
    ))
}

/// Probes of the fragmentation search: a binary search over free memory at
/// 2 MiB steps needs log2(free / 2 MiB), 17 for 141 GB.
#[cfg(feature = "cuda")]
const FRAGMENTATION_PROBES: u32 = 24;

#[cfg(feature = "cuda")]
pub(crate) fn measure(ordinal: u32, args: &ExplainArgs) -> Result<Explained> {
    use ctx::{CudaContext, Limit};

    let context = CudaContext::new(ordinal)?;
    let mut measured_extra = Vec::new();
    if let Some(stack) = args.stack_size {
        let delta = context.measure_stack_limit(stack)?;
        measured_extra.push(("stack_limit_cost_bytes", delta.cost_bytes()));
    }
    if let Some(heap) = args.heap_size {
        context.set_limit(Limit::MallocHeapBytes, heap)?;
    }
    if let Some(fifo) = args.printf_fifo {
        context.set_limit(Limit::PrintfFifoBytes, fifo)?;
    }
    let profile = context.profile()?;
    let limits = context.limits()?;
    let mut ledger = predict(&profile, &limits, args);
    context.fill_measured(&mut ledger, FRAGMENTATION_PROBES)?;
    Ok(Explained {
        profile,
        ledger,
        measured_extra,
    })
}

pub(crate) fn to_json(explained: &Explained, kernel_local_bytes: &[u64]) -> Value {
    let Explained {
        profile,
        ledger,
        measured_extra,
    } = explained;
    let mut object = Map::new();
    let fields = json!({
        "device": ledger.device(),
        "full_name": profile.full_name,
        "sm_count": ledger.sm_count(),
        "max_threads_per_sm": ledger.max_threads_per_sm(),
        "total_bytes": profile.total_bytes,
        "stack_size_bytes": ledger.limits().stack_bytes,
        "kernel_local_bytes": kernel_local_bytes,
        "per_thread_local_bytes": ledger.per_thread_local_bytes(),
        "local_memory_per_sm_bytes": ledger.local_memory_per_sm_bytes(),
        "local_memory_reservation_bytes": ledger.local_memory_reservation_bytes(),
        "malloc_heap_bytes": ledger.limits().malloc_heap_bytes,
        "cm_heap_bytes": ledger
            .item(LedgerItemKind::CmHeap)
            .map_or(0, |item| item.predicted.known_or_zero()),
        "printf_fifo_bytes": ledger.limits().printf_fifo_bytes,
        "items": ledger.items(),
    });
    if let Value::Object(fields) = fields {
        object.extend(fields);
    }
    let mut measured = false;
    for item in ledger.items() {
        if let Some(bytes) = item.measured {
            measured = true;
            object.insert(
                format!("measured_{}_bytes", kind_key(item.kind)),
                bytes.into(),
            );
        }
    }
    for &(name, bytes) in measured_extra {
        measured = true;
        object.insert(format!("measured_{name}"), bytes.into());
    }
    object.insert("measured".into(), measured.into());
    object.insert("model".into(), (!ledger.is_measured()).into());
    object.insert(
        "unknown".into(),
        ledger
            .unknown_items()
            .map(|item| kind_key(item.kind))
            .collect::<Vec<_>>()
            .into(),
    );
    if let Some(conclusion) = conclusion::cm_heap(ledger) {
        object.insert("cm_heap_conclusion".into(), conclusion.into());
    }
    if let Some(advice) = ledger.local_memory_advice() {
        object.insert(
            "local_memory_advice".into(),
            json!({
                "find": ctx::FIND_LOCAL_MEMORY,
                "fixes": ctx::REDUCE_LOCAL_MEMORY,
                "saving_bytes": advice.saving_bytes(),
                "conclusion": advice.conclusion(),
            }),
        );
    }
    Value::Object(object)
}

/// The snake_case name of a ledger line, as serde writes it.
fn kind_key(kind: LedgerItemKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| kind.name().replace(' ', "_"))
}

/// Segment colors of the stacked bar, one per ledger line after the total.
const ITEM_COLORS: [RGBColor; 8] = [
    RGBColor(120, 120, 120),
    RGBColor(213, 94, 0),
    RGBColor(230, 159, 0),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(0, 114, 178),
    RGBColor(200, 40, 40),
    RGBColor(210, 235, 210),
];

/// The longest bar of the chart, bytes.
fn rows_span(parts: &[&ctx::LedgerItem], has_measured: bool) -> u64 {
    let predicted: u64 = parts
        .iter()
        .map(|item| item.predicted.known_or_zero())
        .sum();
    let measured: u64 = parts.iter().filter_map(|item| item.measured).sum();
    if has_measured {
        predicted.max(measured)
    } else {
        predicted
    }
}

/// A bar of the ledger chart.
#[derive(Debug, Clone, Copy)]
enum Column {
    Predicted,
    Measured,
}

impl Column {
    /// The item's bytes in this bar, if known.
    fn bytes(self, item: &ctx::LedgerItem) -> Option<u64> {
        match self {
            Column::Predicted => item.predicted.bytes(),
            Column::Measured => item.measured,
        }
    }
}

/// The ledger as an HTML page: a stacked bar of predicted (and measured)
/// bytes, and the table.
fn ledger_page(explained: &Explained) -> Result<String> {
    let ledger = &explained.ledger;
    let parts: Vec<_> = ledger
        .items()
        .iter()
        .filter(|item| !matches!(item.kind, LedgerItemKind::Total | LedgerItemKind::Free))
        .collect();
    let has_measured = parts.iter().any(|item| item.measured.is_some());
    // Free memory is left out: beside it, the items that matter would not show.
    let span = rows_span(&parts, has_measured).max(1) as f64 / f64::from(1 << 30);
    let rows: &[Column] = if has_measured {
        &[Column::Predicted, Column::Measured]
    } else {
        &[Column::Predicted]
    };
    let mut entries = Vec::new();
    let mut svg = String::new();
    {
        let height = 140 + 60 * rows.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (960, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(90)
            .caption(
                format!(
                    "{}: memory taken before the program's own ({} total; {})",
                    explained.profile.full_name,
                    human(explained.profile.total_bytes),
                    if has_measured {
                        "lower bar predicted, upper bar measured"
                    } else {
                        "predicted"
                    }
                ),
                ("sans-serif", 16),
            )
            .build_cartesian_2d(0f64..span * 1.05, 0f64..rows.len() as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 14))
            .x_desc("GiB")
            .y_labels(0)
            .draw()?;
        for (index, item) in parts.iter().enumerate() {
            let color = ITEM_COLORS[index % ITEM_COLORS.len()];
            let mut bars = Vec::new();
            for (row, column) in rows.iter().enumerate() {
                let start: u64 = parts[..index]
                    .iter()
                    .filter_map(|earlier| column.bytes(earlier))
                    .sum();
                if let Some(bytes) = column.bytes(item) {
                    let x0 = start as f64 / f64::from(1 << 30);
                    let x1 = (start + bytes) as f64 / f64::from(1 << 30);
                    let y = row as f64;
                    bars.push(Rectangle::new(
                        [(x0, y + 0.15), (x1, y + 0.85)],
                        color.filled(),
                    ));
                }
            }
            chart.draw_series(bars)?;
            entries.push((
                format!("{} ({})", item.name(), item.predicted),
                color,
                Swatch::Box,
            ));
        }
        root.present()?;
    }
    let mut body = String::new();
    if !ledger.is_measured() {
        body += &format!(
            "<p><b>{}</b></p>\n",
            escape(&model_header(&explained.profile))
        );
    }
    if let Some(advice) = ledger.local_memory_advice() {
        let list = |lines: &[&str]| {
            lines
                .iter()
                .map(|line| format!("<li>{}</li>", escape(line)))
                .collect::<String>()
        };
        body += &format!(
            "<p><b>{}</b></p>\n<p>How to find a kernel's local memory:</p><ul>{}</ul>\n\
             <p>What lowers it:</p><ul>{}</ul>\n",
            escape(&advice.conclusion()),
            list(&ctx::FIND_LOCAL_MEMORY),
            list(&ctx::REDUCE_LOCAL_MEMORY)
        );
    }
    if let Some(conclusion) = conclusion::cm_heap(ledger) {
        body += &format!("<p><b>{}</b></p>\n", escape(&conclusion));
    }
    body += &svg;
    body += &legend(&entries);
    body += "<table><tr><th>item</th><th>predicted</th><th>measured</th><th>why</th></tr>\n";
    for item in ledger.items() {
        body += &format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>\n",
            escape(item.name()),
            match item.predicted {
                ctx::Prediction::Bytes(bytes) => exact(bytes),
                ctx::Prediction::AtMost(bytes) => format!("at most {}", exact(bytes)),
                ctx::Prediction::Unknown => item.predicted.to_string(),
            },
            item.measured.map_or_else(|| "-".into(), exact),
            escape(&item.explanation)
        );
    }
    body += "</table>\n";
    Ok(page(
        &format!("cudamem explain: {}", explained.profile.full_name),
        &body,
    ))
}
