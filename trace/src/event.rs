//! The event log: one line per driver call the interposer saw, in the order
//! it saw them, written by `libcudamem_interpose.so` and read back by `cudamem run`.
//!
//! # Format
//!
//! A UTF-8 text file, one record per line, fields separated by one tab:
//!
//! ```text
//! KIND <tab> TIME_NS <tab> THREAD <tab> FIELD...
//! ```
//!
//! `TIME_NS` is nanoseconds since the process (image) started recording,
//! `THREAD` the kernel thread id. Numbers are decimal; pointers and handles
//! are hexadecimal with `0x`; a `-` is a value the interposer could not read
//! (no current context, say). Strings escape `\`, tab and line end as `\\`,
//! `\t`, `\n` and are cut to [`MAX_NAME_BYTES`]. A log that ends in a run of
//! zero bytes was left by a process that did not exit (killed, or it
//! called `_exit`): the zeros are not records. A line that does not end in
//! a line end was cut by such an end too.
//!
//! | kind | fields | what |
//! | --- | --- | --- |
//! | `process` | version pid ppid exe | a process image starts recording (again after `exec`) |
//! | `library` | id path | the library that caller id names |
//! | `alloc` | call ptr size stream caller result | an allocation returned (`result` 0: it succeeded) |
//! | `free` | call ptr stream caller | a free is about to be made (recorded before the driver frees, so no later allocation at `ptr` can come first) |
//! | `free-failed` | call ptr size caller result | that free failed: `ptr` stays allocated |
//! | `reserve` | ptr size result | `cuMemAddressReserve` returned |
//! | `address-free` | ptr size | `cuMemAddressFree` is about to be made |
//! | `create` | handle size device caller result | `cuMemCreate` returned (device -1: host memory) |
//! | `release` | handle | `cuMemRelease` is about to be made |
//! | `map` | ptr size offset handle result | `cuMemMap` returned |
//! | `unmap` | ptr size | `cuMemUnmap` is about to be made |
//! | `context` | how device ctx result sms threads_per_sm total free stack heap fifo | a context was created (`create`) or a primary context retained (`primary`), with the device's facts and the context's limits read right after |
//! | `limit` | which requested result value free_before free_after live_change | `cuCtxSetLimit`, the limit read back, and free memory around it |
//! | `module` | call result free_before free_after live_change | a module or library load, or the first lookup, attribute query or explicit load of a function (lazy loading loads its code then; later ones of the same function are not recorded), or the making of a stream, event, executable graph or pool and a graph's first upload or launch (the driver's own objects, `Call::is_object`), and free memory around it |
//! | `launch` | call handle local_bytes stack_before stack_after free_before free_after live_change result name | the first launch of a function: its local bytes per thread, the stack limit and free memory around it |
//! | `meminfo` | why device free total pool_reserved | free and total memory: what the program itself read (`program`), or what the interposer read at a chosen moment (`peak`, `exit`, `oom`) |
//! | `resolve` | name version flags how | a driver entry point handed out through `cuGetProcAddress` (each distinct answer once) |
//! | `signal` | number | a fatal signal reached the process |
//! | `exit` | dropped | the process exits; `dropped` records did not fit the size bound |
//!
//! `live_change` is how much the interposer's count of live bytes moved
//! while free memory was measured (other threads allocating), so a delta of
//! free memory can be told from those allocations.

use std::borrow::Cow;
use std::fmt;

/// The version written in `process` records.
pub const FORMAT_VERSION: u32 = 1;

/// The longest string field kept, bytes (longer ones are cut on a character
/// boundary).
pub const MAX_NAME_BYTES: usize = 1024;

/// The longest line the interposer writes, bytes: the fixed fields and one
/// escaped string of [`MAX_NAME_BYTES`].
pub const MAX_LINE_BYTES: usize = 512 + 2 * MAX_NAME_BYTES;

/// `CUDA_ERROR_OUT_OF_MEMORY`.
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;

/// The driver functions the interposer records, by the exported name of
/// the ABI it wrapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Call {
    MemAlloc,
    MemAllocPitch,
    MemAllocManaged,
    MemAllocAsync,
    MemAllocFromPoolAsync,
    MemFree,
    MemFreeAsync,
    MemHostAlloc,
    MemAllocHost,
    MemFreeHost,
    MemGetInfo,
    MemCreate,
    MemRelease,
    MemMap,
    MemUnmap,
    MemAddressReserve,
    MemAddressFree,
    CtxCreate,
    DevicePrimaryCtxRetain,
    CtxSetLimit,
    ModuleLoad,
    ModuleLoadData,
    ModuleLoadDataEx,
    ModuleLoadFatBinary,
    LibraryLoadData,
    LibraryLoadFromFile,
    ModuleGetFunction,
    LibraryGetKernel,
    KernelGetFunction,
    LaunchKernel,
    LaunchKernelEx,
    LaunchCooperativeKernel,
    FuncGetAttribute,
    FuncSetAttribute,
    KernelGetAttribute,
    KernelSetAttribute,
    FuncLoad,
    OccupancyMaxActiveBlocksPerMultiprocessor,
    StreamCreate,
    StreamCreateWithPriority,
    EventCreate,
    GraphInstantiateWithFlags,
    GraphInstantiateWithParams,
    GraphUpload,
    GraphLaunch,
    MemPoolCreate,
}

impl Call {
    /// Every call, for parsing.
    pub const ALL: [Call; 46] = [
        Call::MemAlloc,
        Call::MemAllocPitch,
        Call::MemAllocManaged,
        Call::MemAllocAsync,
        Call::MemAllocFromPoolAsync,
        Call::MemFree,
        Call::MemFreeAsync,
        Call::MemHostAlloc,
        Call::MemAllocHost,
        Call::MemFreeHost,
        Call::MemGetInfo,
        Call::MemCreate,
        Call::MemRelease,
        Call::MemMap,
        Call::MemUnmap,
        Call::MemAddressReserve,
        Call::MemAddressFree,
        Call::CtxCreate,
        Call::DevicePrimaryCtxRetain,
        Call::CtxSetLimit,
        Call::ModuleLoad,
        Call::ModuleLoadData,
        Call::ModuleLoadDataEx,
        Call::ModuleLoadFatBinary,
        Call::LibraryLoadData,
        Call::LibraryLoadFromFile,
        Call::ModuleGetFunction,
        Call::LibraryGetKernel,
        Call::KernelGetFunction,
        Call::LaunchKernel,
        Call::LaunchKernelEx,
        Call::LaunchCooperativeKernel,
        Call::FuncGetAttribute,
        Call::FuncSetAttribute,
        Call::KernelGetAttribute,
        Call::KernelSetAttribute,
        Call::FuncLoad,
        Call::OccupancyMaxActiveBlocksPerMultiprocessor,
        Call::StreamCreate,
        Call::StreamCreateWithPriority,
        Call::EventCreate,
        Call::GraphInstantiateWithFlags,
        Call::GraphInstantiateWithParams,
        Call::GraphUpload,
        Call::GraphLaunch,
        Call::MemPoolCreate,
    ];

    /// The driver's name of the function (the ABI's base name: the
    /// `_v2`/`_ptsz` variants of one function share it).
    pub const fn name(self) -> &'static str {
        match self {
            Call::MemAlloc => "cuMemAlloc",
            Call::MemAllocPitch => "cuMemAllocPitch",
            Call::MemAllocManaged => "cuMemAllocManaged",
            Call::MemAllocAsync => "cuMemAllocAsync",
            Call::MemAllocFromPoolAsync => "cuMemAllocFromPoolAsync",
            Call::MemFree => "cuMemFree",
            Call::MemFreeAsync => "cuMemFreeAsync",
            Call::MemHostAlloc => "cuMemHostAlloc",
            Call::MemAllocHost => "cuMemAllocHost",
            Call::MemFreeHost => "cuMemFreeHost",
            Call::MemGetInfo => "cuMemGetInfo",
            Call::MemCreate => "cuMemCreate",
            Call::MemRelease => "cuMemRelease",
            Call::MemMap => "cuMemMap",
            Call::MemUnmap => "cuMemUnmap",
            Call::MemAddressReserve => "cuMemAddressReserve",
            Call::MemAddressFree => "cuMemAddressFree",
            Call::CtxCreate => "cuCtxCreate",
            Call::DevicePrimaryCtxRetain => "cuDevicePrimaryCtxRetain",
            Call::CtxSetLimit => "cuCtxSetLimit",
            Call::ModuleLoad => "cuModuleLoad",
            Call::ModuleLoadData => "cuModuleLoadData",
            Call::ModuleLoadDataEx => "cuModuleLoadDataEx",
            Call::ModuleLoadFatBinary => "cuModuleLoadFatBinary",
            Call::LibraryLoadData => "cuLibraryLoadData",
            Call::LibraryLoadFromFile => "cuLibraryLoadFromFile",
            Call::ModuleGetFunction => "cuModuleGetFunction",
            Call::LibraryGetKernel => "cuLibraryGetKernel",
            Call::KernelGetFunction => "cuKernelGetFunction",
            Call::LaunchKernel => "cuLaunchKernel",
            Call::LaunchKernelEx => "cuLaunchKernelEx",
            Call::LaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            Call::FuncGetAttribute => "cuFuncGetAttribute",
            Call::FuncSetAttribute => "cuFuncSetAttribute",
            Call::KernelGetAttribute => "cuKernelGetAttribute",
            Call::KernelSetAttribute => "cuKernelSetAttribute",
            Call::FuncLoad => "cuFuncLoad",
            Call::OccupancyMaxActiveBlocksPerMultiprocessor => {
                "cuOccupancyMaxActiveBlocksPerMultiprocessor"
            }
            Call::StreamCreate => "cuStreamCreate",
            Call::StreamCreateWithPriority => "cuStreamCreateWithPriority",
            Call::EventCreate => "cuEventCreate",
            Call::GraphInstantiateWithFlags => "cuGraphInstantiateWithFlags",
            Call::GraphInstantiateWithParams => "cuGraphInstantiateWithParams",
            Call::GraphUpload => "cuGraphUpload",
            Call::GraphLaunch => "cuGraphLaunch",
            Call::MemPoolCreate => "cuMemPoolCreate",
        }
    }

    /// The call named `name`.
    pub fn from_name(name: &str) -> Option<Call> {
        Call::ALL.into_iter().find(|call| call.name() == name)
    }

    /// Whether the call loads a module or library (rather than looking a
    /// function up in one, or using one, where lazy loading loads code
    /// too).
    pub const fn is_load(self) -> bool {
        matches!(
            self,
            Call::ModuleLoad
                | Call::ModuleLoadData
                | Call::ModuleLoadDataEx
                | Call::ModuleLoadFatBinary
                | Call::LibraryLoadData
                | Call::LibraryLoadFromFile
        )
    }

    /// Whether the call makes a driver object (a stream, an event, an
    /// executable graph, a memory pool) or first uses one (a graph's first
    /// upload or launch): device memory such a call takes is the driver's,
    /// named apart from module code.
    pub const fn is_object(self) -> bool {
        matches!(
            self,
            Call::StreamCreate
                | Call::StreamCreateWithPriority
                | Call::EventCreate
                | Call::GraphInstantiateWithFlags
                | Call::GraphInstantiateWithParams
                | Call::GraphUpload
                | Call::GraphLaunch
                | Call::MemPoolCreate
        )
    }

    /// Whether the memory this call allocates is pinned host memory
    /// (counted apart from device memory).
    pub const fn is_host(self) -> bool {
        matches!(
            self,
            Call::MemHostAlloc | Call::MemAllocHost | Call::MemFreeHost
        )
    }
}

/// How a context came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextHow {
    /// `cuCtxCreate`.
    Create,
    /// `cuDevicePrimaryCtxRetain` (what the runtime and most frameworks do).
    Primary,
}

/// Which context limit (`CUlimit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// `CU_LIMIT_STACK_SIZE` (0): stack per thread, bytes.
    Stack,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE` (1), bytes.
    PrintfFifo,
    /// `CU_LIMIT_MALLOC_HEAP_SIZE` (2), bytes.
    MallocHeap,
    /// Any other limit, by its `CUlimit` value.
    Other(u32),
}

impl LimitKind {
    /// The limit of `CUlimit` value `value`.
    pub const fn from_cu(value: u32) -> LimitKind {
        match value {
            0 => LimitKind::Stack,
            1 => LimitKind::PrintfFifo,
            2 => LimitKind::MallocHeap,
            other => LimitKind::Other(other),
        }
    }

    /// The `CUlimit` value.
    pub const fn to_cu(self) -> u32 {
        match self {
            LimitKind::Stack => 0,
            LimitKind::PrintfFifo => 1,
            LimitKind::MallocHeap => 2,
            LimitKind::Other(value) => value,
        }
    }
}

/// Why free memory was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemInfoWhy {
    /// The program called `cuMemGetInfo`: what it saw.
    Program,
    /// A context was just made (the reading in its `context` record).
    Context,
    /// Live bytes reached a new peak.
    Peak,
    /// The process exits.
    Exit,
    /// A call returned out of memory.
    OutOfMemory,
}

impl MemInfoWhy {
    const ALL: [MemInfoWhy; 5] = [
        MemInfoWhy::Program,
        MemInfoWhy::Context,
        MemInfoWhy::Peak,
        MemInfoWhy::Exit,
        MemInfoWhy::OutOfMemory,
    ];

    /// The word in the log.
    pub const fn name(self) -> &'static str {
        match self {
            MemInfoWhy::Program => "program",
            MemInfoWhy::Context => "context",
            MemInfoWhy::Peak => "peak",
            MemInfoWhy::Exit => "exit",
            MemInfoWhy::OutOfMemory => "oom",
        }
    }
}

/// How a `cuGetProcAddress` answer for a function the interposer records
/// was handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveHow {
    /// The driver's pointer is the exported symbol of a recorded ABI: the
    /// program got the interposer's wrapper of it.
    Export,
    /// The pointer is no exported symbol, but the requested version names a
    /// recorded ABI (the driver's documented version table): wrapped.
    Table,
    /// Handed on unwrapped: an ABI the interposer does not record (a 32-bit
    /// `v1` one), or a pointer it cannot place. Calls through it are not
    /// seen.
    Unwrapped,
}

impl ResolveHow {
    const ALL: [ResolveHow; 3] = [ResolveHow::Export, ResolveHow::Table, ResolveHow::Unwrapped];

    /// The word in the log.
    pub const fn name(self) -> &'static str {
        match self {
            ResolveHow::Export => "export",
            ResolveHow::Table => "table",
            ResolveHow::Unwrapped => "unwrapped",
        }
    }
}

/// Free memory before and after a measured call, and how much the
/// interposer's live bytes moved in between. `None`: not readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Free bytes before the call.
    pub free_before: Option<u64>,
    /// Free bytes after the call.
    pub free_after: Option<u64>,
    /// Live bytes after minus live bytes before (other threads' allocations).
    pub live_change: i64,
}

impl Window {
    /// Device bytes the call itself took: the drop of free memory less what
    /// allocations took meanwhile; `None` when free memory was not read.
    pub fn taken_bytes(&self) -> Option<u64> {
        let (before, after) = (self.free_before?, self.free_after?);
        let dropped = i128::from(before) - i128::from(after) - i128::from(self.live_change);
        Some(u64::try_from(dropped.max(0)).unwrap_or(u64::MAX))
    }
}

/// One record of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Event<'a> {
    Process {
        version: u32,
        pid: u32,
        ppid: u32,
        exe: Cow<'a, str>,
    },
    Library {
        id: u32,
        path: Cow<'a, str>,
    },
    Alloc {
        call: Call,
        ptr: u64,
        size: u64,
        stream: u64,
        caller: u32,
        result: i32,
    },
    Free {
        call: Call,
        ptr: u64,
        stream: u64,
        caller: u32,
    },
    FreeFailed {
        call: Call,
        ptr: u64,
        size: u64,
        caller: u32,
        result: i32,
    },
    Reserve {
        ptr: u64,
        size: u64,
        result: i32,
    },
    AddressFree {
        ptr: u64,
        size: u64,
    },
    Create {
        handle: u64,
        size: u64,
        /// Device ordinal; -1 for host memory.
        device: i32,
        caller: u32,
        result: i32,
    },
    Release {
        handle: u64,
    },
    Map {
        ptr: u64,
        size: u64,
        offset: u64,
        handle: u64,
        result: i32,
    },
    Unmap {
        ptr: u64,
        size: u64,
    },
    Context {
        how: ContextHow,
        device: i32,
        ctx: u64,
        result: i32,
        sm_count: Option<u64>,
        threads_per_sm: Option<u64>,
        total: Option<u64>,
        free: Option<u64>,
        stack: Option<u64>,
        heap: Option<u64>,
        fifo: Option<u64>,
    },
    Limit {
        which: LimitKind,
        requested: u64,
        result: i32,
        value: Option<u64>,
        window: Window,
    },
    Module {
        call: Call,
        result: i32,
        window: Window,
    },
    Launch {
        call: Call,
        handle: u64,
        local_bytes: Option<u64>,
        stack_before: Option<u64>,
        stack_after: Option<u64>,
        window: Window,
        result: i32,
        name: Cow<'a, str>,
    },
    MemInfo {
        why: MemInfoWhy,
        device: i32,
        free: u64,
        total: u64,
        pool_reserved: Option<u64>,
    },
    Resolve {
        name: Cow<'a, str>,
        version: i32,
        flags: u64,
        how: ResolveHow,
    },
    Signal {
        number: i32,
    },
    Exit {
        dropped: u64,
    },
}

/// One line: when, which thread, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Nanoseconds since the process image started recording.
    pub time_ns: u64,
    /// Kernel thread id.
    pub thread: u32,
    /// What happened.
    pub event: Event<'a>,
}

/// A line being written: fixed capacity, no heap, so the interposer can
/// build one on its stack inside any driver call.
pub struct Line {
    bytes: [u8; MAX_LINE_BYTES],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Self::new()
    }
}

impl Line {
    /// An empty line (`const`, for a thread-local one).
    pub const fn new() -> Self {
        Self {
            bytes: [0; MAX_LINE_BYTES],
            len: 0,
        }
    }

    /// The bytes written so far, the line end included once finished.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Append `bytes` whole, or not at all when the line is full (fields
    /// are bounded so that a line always fits). Short runs are copied byte
    /// by byte: a call to `memcpy` per field costs more than the copy.
    fn put(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end > MAX_LINE_BYTES {
            return;
        }
        if bytes.len() <= 16 {
            for (slot, &byte) in self.bytes[self.len..end].iter_mut().zip(bytes) {
                *slot = byte;
            }
        } else {
            self.bytes[self.len..end].copy_from_slice(bytes);
        }
        self.len = end;
    }

    fn push(&mut self, byte: u8) {
        if self.len < MAX_LINE_BYTES {
            self.bytes[self.len] = byte;
            self.len += 1;
        }
    }

    fn tab(&mut self) {
        self.push(b'\t');
    }

    fn word(&mut self, word: &str) {
        self.put(word.as_bytes());
    }

    fn dec(&mut self, value: u64) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let digits = if value == 0 {
            1
        } else {
            value.ilog10() as usize + 1
        };
        let end = self.len + digits;
        if end > MAX_LINE_BYTES {
            return;
        }
        let out = &mut self.bytes[self.len..end];
        let mut at = digits;
        let mut rest = value;
        while rest >= 100 {
            let pair = (rest % 100) as usize * 2;
            rest /= 100;
            at -= 2;
            out[at] = PAIRS[pair];
            out[at + 1] = PAIRS[pair + 1];
        }
        if rest >= 10 {
            let pair = rest as usize * 2;
            out[at - 2] = PAIRS[pair];
            out[at - 1] = PAIRS[pair + 1];
        } else {
            out[at - 1] = b'0' + rest as u8;
        }
        self.len = end;
    }

    fn signed(&mut self, value: i64) {
        if value < 0 {
            self.push(b'-');
        }
        self.dec(value.unsigned_abs());
    }

    fn hex(&mut self, value: u64) {
        let nibbles = ((64 - value.leading_zeros()).div_ceil(4)).max(1) as usize;
        let end = self.len + 2 + nibbles;
        if end > MAX_LINE_BYTES {
            return;
        }
        let out = &mut self.bytes[self.len..end];
        out[0] = b'0';
        out[1] = b'x';
        for (index, digit) in out[2..].iter_mut().enumerate() {
            let shift = 4 * (nibbles - 1 - index);
            *digit = b"0123456789abcdef"[((value >> shift) & 15) as usize];
        }
        self.len = end;
    }

    fn maybe(&mut self, value: Option<u64>) {
        match value {
            Some(value) => self.dec(value),
            None => self.push(b'-'),
        }
    }

    fn text(&mut self, text: &str) {
        let text = cut(text, MAX_NAME_BYTES).as_bytes();
        if !text.iter().any(|&b| matches!(b, b'\\' | b'\t' | b'\n')) {
            self.put(text);
            return;
        }
        for &byte in text {
            match byte {
                b'\\' => self.word("\\\\"),
                b'\t' => self.word("\\t"),
                b'\n' => self.word("\\n"),
                other => self.push(other),
            }
        }
    }

    fn window(&mut self, window: &Window) {
        self.maybe(window.free_before);
        self.tab();
        self.maybe(window.free_after);
        self.tab();
        self.signed(window.live_change);
    }

    /// Write `record` as one finished line (line end included), replacing
    /// what the line held.
    pub fn encode(&mut self, record: &Record<'_>) {
        self.len = 0;
        self.word(kind_of(&record.event));
        self.tab();
        self.dec(record.time_ns);
        self.tab();
        self.dec(u64::from(record.thread));
        match &record.event {
            Event::Process {
                version,
                pid,
                ppid,
                exe,
            } => {
                self.fields(&[
                    Field::Dec(u64::from(*version)),
                    Field::Dec(u64::from(*pid)),
                    Field::Dec(u64::from(*ppid)),
                ]);
                self.tab();
                self.text(exe);
            }
            Event::Library { id, path } => {
                self.fields(&[Field::Dec(u64::from(*id))]);
                self.tab();
                self.text(path);
            }
            Event::Alloc {
                call,
                ptr,
                size,
                stream,
                caller,
                result,
            } => self.fields(&[
                Field::Word(call.name()),
                Field::Hex(*ptr),
                Field::Dec(*size),
                Field::Hex(*stream),
                Field::Dec(u64::from(*caller)),
                Field::Signed(i64::from(*result)),
            ]),
            Event::Free {
                call,
                ptr,
                stream,
                caller,
            } => self.fields(&[
                Field::Word(call.name()),
                Field::Hex(*ptr),
                Field::Hex(*stream),
                Field::Dec(u64::from(*caller)),
            ]),
            Event::FreeFailed {
                call,
                ptr,
                size,
                caller,
                result,
            } => self.fields(&[
                Field::Word(call.name()),
                Field::Hex(*ptr),
                Field::Dec(*size),
                Field::Dec(u64::from(*caller)),
                Field::Signed(i64::from(*result)),
            ]),
            Event::Reserve { ptr, size, result } => self.fields(&[
                Field::Hex(*ptr),
                Field::Dec(*size),
                Field::Signed(i64::from(*result)),
            ]),
            Event::AddressFree { ptr, size } | Event::Unmap { ptr, size } => {
                self.fields(&[Field::Hex(*ptr), Field::Dec(*size)]);
            }
            Event::Create {
                handle,
                size,
                device,
                caller,
                result,
            } => self.fields(&[
                Field::Hex(*handle),
                Field::Dec(*size),
                Field::Signed(i64::from(*device)),
                Field::Dec(u64::from(*caller)),
                Field::Signed(i64::from(*result)),
            ]),
            Event::Release { handle } => self.fields(&[Field::Hex(*handle)]),
            Event::Map {
                ptr,
                size,
                offset,
                handle,
                result,
            } => self.fields(&[
                Field::Hex(*ptr),
                Field::Dec(*size),
                Field::Dec(*offset),
                Field::Hex(*handle),
                Field::Signed(i64::from(*result)),
            ]),
            Event::Context {
                how,
                device,
                ctx,
                result,
                sm_count,
                threads_per_sm,
                total,
                free,
                stack,
                heap,
                fifo,
            } => self.fields(&[
                Field::Word(match how {
                    ContextHow::Create => "create",
                    ContextHow::Primary => "primary",
                }),
                Field::Signed(i64::from(*device)),
                Field::Hex(*ctx),
                Field::Signed(i64::from(*result)),
                Field::Maybe(*sm_count),
                Field::Maybe(*threads_per_sm),
                Field::Maybe(*total),
                Field::Maybe(*free),
                Field::Maybe(*stack),
                Field::Maybe(*heap),
                Field::Maybe(*fifo),
            ]),
            Event::Limit {
                which,
                requested,
                result,
                value,
                window,
            } => {
                self.fields(&[
                    Field::Dec(u64::from(which.to_cu())),
                    Field::Dec(*requested),
                    Field::Signed(i64::from(*result)),
                    Field::Maybe(*value),
                ]);
                self.tab();
                self.window(window);
            }
            Event::Module {
                call,
                result,
                window,
            } => {
                self.fields(&[Field::Word(call.name()), Field::Signed(i64::from(*result))]);
                self.tab();
                self.window(window);
            }
            Event::Launch {
                call,
                handle,
                local_bytes,
                stack_before,
                stack_after,
                window,
                result,
                name,
            } => {
                self.fields(&[
                    Field::Word(call.name()),
                    Field::Hex(*handle),
                    Field::Maybe(*local_bytes),
                    Field::Maybe(*stack_before),
                    Field::Maybe(*stack_after),
                ]);
                self.tab();
                self.window(window);
                self.fields(&[Field::Signed(i64::from(*result))]);
                self.tab();
                self.text(name);
            }
            Event::MemInfo {
                why,
                device,
                free,
                total,
                pool_reserved,
            } => self.fields(&[
                Field::Word(why.name()),
                Field::Signed(i64::from(*device)),
                Field::Dec(*free),
                Field::Dec(*total),
                Field::Maybe(*pool_reserved),
            ]),
            Event::Resolve {
                name,
                version,
                flags,
                how,
            } => {
                self.tab();
                self.text(name);
                self.fields(&[
                    Field::Signed(i64::from(*version)),
                    Field::Dec(*flags),
                    Field::Word(how.name()),
                ]);
            }
            Event::Signal { number } => self.fields(&[Field::Signed(i64::from(*number))]),
            Event::Exit { dropped } => self.fields(&[Field::Dec(*dropped)]),
        }
        // The line end always fits: fields are bounded, and the last byte
        // is kept for it.
        self.len = self.len.min(MAX_LINE_BYTES - 1);
        self.push(b'\n');
    }

    fn fields(&mut self, fields: &[Field<'_>]) {
        for field in fields {
            self.tab();
            match *field {
                Field::Word(word) => self.word(word),
                Field::Dec(value) => self.dec(value),
                Field::Signed(value) => self.signed(value),
                Field::Hex(value) => self.hex(value),
                Field::Maybe(value) => self.maybe(value),
            }
        }
    }
}

enum Field<'a> {
    Word(&'a str),
    Dec(u64),
    Signed(i64),
    Hex(u64),
    Maybe(Option<u64>),
}

/// `text` cut to at most `max` bytes on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn kind_of(event: &Event<'_>) -> &'static str {
    match event {
        Event::Process { .. } => "process",
        Event::Library { .. } => "library",
        Event::Alloc { .. } => "alloc",
        Event::Free { .. } => "free",
        Event::FreeFailed { .. } => "free-failed",
        Event::Reserve { .. } => "reserve",
        Event::AddressFree { .. } => "address-free",
        Event::Create { .. } => "create",
        Event::Release { .. } => "release",
        Event::Map { .. } => "map",
        Event::Unmap { .. } => "unmap",
        Event::Context { .. } => "context",
        Event::Limit { .. } => "limit",
        Event::Module { .. } => "module",
        Event::Launch { .. } => "launch",
        Event::MemInfo { .. } => "meminfo",
        Event::Resolve { .. } => "resolve",
        Event::Signal { .. } => "signal",
        Event::Exit { .. } => "exit",
    }
}

/// Why a line is not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The first field names no kind of record.
    #[error("unknown record kind {0:?}")]
    UnknownKind(String),
    /// Fewer or more fields than the kind has.
    #[error("{kind} record with {found} fields, expected {expected}")]
    FieldCount {
        /// The record's kind.
        kind: &'static str,
        /// Fields found (the kind, time and thread included).
        found: usize,
        /// Fields the kind has.
        expected: usize,
    },
    /// A field that does not parse.
    #[error("field {index} ({text:?}) is not {what}")]
    BadField {
        /// 0-based field index.
        index: usize,
        /// The field, cut to 40 characters.
        text: String,
        /// What it should be.
        what: &'static str,
    },
}

struct Fields<'a> {
    parts: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    fn bad(&self, index: usize, what: &'static str) -> LineError {
        LineError::BadField {
            index,
            text: cut(self.parts.get(index).copied().unwrap_or(""), 40).to_string(),
            what,
        }
    }

    fn get(&self, index: usize) -> &'a str {
        self.parts.get(index).copied().unwrap_or("")
    }

    fn dec(&self, index: usize) -> Result<u64, LineError> {
        self.get(index)
            .parse()
            .map_err(|_| self.bad(index, "a decimal number"))
    }

    fn dec32(&self, index: usize) -> Result<u32, LineError> {
        self.get(index)
            .parse()
            .map_err(|_| self.bad(index, "a 32-bit decimal number"))
    }

    fn signed(&self, index: usize) -> Result<i64, LineError> {
        self.get(index)
            .parse()
            .map_err(|_| self.bad(index, "a signed decimal number"))
    }

    fn int(&self, index: usize) -> Result<i32, LineError> {
        self.get(index)
            .parse()
            .map_err(|_| self.bad(index, "a 32-bit signed number"))
    }

    fn hex(&self, index: usize) -> Result<u64, LineError> {
        self.get(index)
            .strip_prefix("0x")
            .and_then(|digits| u64::from_str_radix(digits, 16).ok())
            .ok_or_else(|| self.bad(index, "a 0x hexadecimal number"))
    }

    fn maybe(&self, index: usize) -> Result<Option<u64>, LineError> {
        match self.get(index) {
            "-" => Ok(None),
            _ => self.dec(index).map(Some),
        }
    }

    fn call(&self, index: usize) -> Result<Call, LineError> {
        Call::from_name(self.get(index)).ok_or_else(|| self.bad(index, "a driver call name"))
    }

    fn text(&self, index: usize) -> Cow<'a, str> {
        unescape(self.get(index))
    }

    fn window(&self, index: usize) -> Result<Window, LineError> {
        Ok(Window {
            free_before: self.maybe(index)?,
            free_after: self.maybe(index + 1)?,
            live_change: self.signed(index + 2)?,
        })
    }
}

fn unescape(text: &str) -> Cow<'_, str> {
    if !text.contains('\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// Fields of each kind, the kind, time and thread included.
fn field_count(kind: &str) -> Option<(&'static str, usize)> {
    const KINDS: [(&str, usize); 19] = [
        ("process", 7),
        ("library", 5),
        ("alloc", 9),
        ("free", 7),
        ("free-failed", 8),
        ("reserve", 6),
        ("address-free", 5),
        ("create", 8),
        ("release", 4),
        ("map", 8),
        ("unmap", 5),
        ("context", 14),
        ("limit", 10),
        ("module", 8),
        ("launch", 13),
        ("meminfo", 8),
        ("resolve", 7),
        ("signal", 4),
        ("exit", 4),
    ];
    KINDS
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|&(name, count)| (name, count))
}

/// Parse one line (without its line end).
pub fn parse_line(line: &str) -> Result<Record<'_>, LineError> {
    let fields = Fields {
        parts: line.split('\t').collect(),
    };
    let kind_text = fields.get(0);
    let (kind, expected) =
        field_count(kind_text).ok_or_else(|| LineError::UnknownKind(cut(kind_text, 40).into()))?;
    if fields.parts.len() != expected {
        return Err(LineError::FieldCount {
            kind,
            found: fields.parts.len(),
            expected,
        });
    }
    let f = &fields;
    let event = match kind {
        "process" => Event::Process {
            version: f.dec32(3)?,
            pid: f.dec32(4)?,
            ppid: f.dec32(5)?,
            exe: f.text(6),
        },
        "library" => Event::Library {
            id: f.dec32(3)?,
            path: f.text(4),
        },
        "alloc" => Event::Alloc {
            call: f.call(3)?,
            ptr: f.hex(4)?,
            size: f.dec(5)?,
            stream: f.hex(6)?,
            caller: f.dec32(7)?,
            result: f.int(8)?,
        },
        "free" => Event::Free {
            call: f.call(3)?,
            ptr: f.hex(4)?,
            stream: f.hex(5)?,
            caller: f.dec32(6)?,
        },
        "free-failed" => Event::FreeFailed {
            call: f.call(3)?,
            ptr: f.hex(4)?,
            size: f.dec(5)?,
            caller: f.dec32(6)?,
            result: f.int(7)?,
        },
        "reserve" => Event::Reserve {
            ptr: f.hex(3)?,
            size: f.dec(4)?,
            result: f.int(5)?,
        },
        "address-free" => Event::AddressFree {
            ptr: f.hex(3)?,
            size: f.dec(4)?,
        },
        "create" => Event::Create {
            handle: f.hex(3)?,
            size: f.dec(4)?,
            device: f.int(5)?,
            caller: f.dec32(6)?,
            result: f.int(7)?,
        },
        "release" => Event::Release { handle: f.hex(3)? },
        "map" => Event::Map {
            ptr: f.hex(3)?,
            size: f.dec(4)?,
            offset: f.dec(5)?,
            handle: f.hex(6)?,
            result: f.int(7)?,
        },
        "unmap" => Event::Unmap {
            ptr: f.hex(3)?,
            size: f.dec(4)?,
        },
        "context" => Event::Context {
            how: match f.get(3) {
                "create" => ContextHow::Create,
                "primary" => ContextHow::Primary,
                _ => return Err(f.bad(3, "create or primary")),
            },
            device: f.int(4)?,
            ctx: f.hex(5)?,
            result: f.int(6)?,
            sm_count: f.maybe(7)?,
            threads_per_sm: f.maybe(8)?,
            total: f.maybe(9)?,
            free: f.maybe(10)?,
            stack: f.maybe(11)?,
            heap: f.maybe(12)?,
            fifo: f.maybe(13)?,
        },
        "limit" => Event::Limit {
            which: LimitKind::from_cu(f.dec32(3)?),
            requested: f.dec(4)?,
            result: f.int(5)?,
            value: f.maybe(6)?,
            window: f.window(7)?,
        },
        "module" => Event::Module {
            call: f.call(3)?,
            result: f.int(4)?,
            window: f.window(5)?,
        },
        "launch" => Event::Launch {
            call: f.call(3)?,
            handle: f.hex(4)?,
            local_bytes: f.maybe(5)?,
            stack_before: f.maybe(6)?,
            stack_after: f.maybe(7)?,
            window: f.window(8)?,
            result: f.int(11)?,
            name: f.text(12),
        },
        "meminfo" => Event::MemInfo {
            why: MemInfoWhy::ALL
                .into_iter()
                .find(|why| why.name() == f.get(3))
                .ok_or_else(|| f.bad(3, "a reason (program, context, peak, exit, oom)"))?,
            device: f.int(4)?,
            free: f.dec(5)?,
            total: f.dec(6)?,
            pool_reserved: f.maybe(7)?,
        },
        "resolve" => Event::Resolve {
            name: f.text(3),
            version: f.int(4)?,
            flags: f.dec(5)?,
            how: ResolveHow::ALL
                .into_iter()
                .find(|how| how.name() == f.get(6))
                .ok_or_else(|| f.bad(6, "export, table or unwrapped"))?,
        },
        "signal" => Event::Signal { number: f.int(3)? },
        "exit" => Event::Exit { dropped: f.dec(3)? },
        _ => unreachable!("field_count knows only these kinds"),
    };
    Ok(Record {
        time_ns: f.dec(1)?,
        thread: f.dec32(2)?,
        event,
    })
}

impl fmt::Display for Record<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = Line::default();
        line.encode(self);
        f.write_str(String::from_utf8_lossy(line.as_bytes()).trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_kind() -> Vec<Event<'static>> {
        let window = Window {
            free_before: Some(100),
            free_after: None,
            live_change: -7,
        };
        vec![
            Event::Process {
                version: FORMAT_VERSION,
                pid: 42,
                ppid: 1,
                exe: "/bin/with\ttab\\and\nline".into(),
            },
            Event::Library {
                id: 3,
                path: "/usr/lib/libtorch_cuda.so".into(),
            },
            Event::Alloc {
                call: Call::MemAllocAsync,
                ptr: 0x7f00_0000_0000,
                size: 1 << 20,
                stream: 0xdead,
                caller: 3,
                result: 0,
            },
            Event::Free {
                call: Call::MemFree,
                ptr: 0x10,
                stream: 0,
                caller: 1,
            },
            Event::FreeFailed {
                call: Call::MemFree,
                ptr: 0x10,
                size: 512,
                caller: 1,
                result: 700,
            },
            Event::Reserve {
                ptr: 0x1000,
                size: 1 << 40,
                result: 0,
            },
            Event::AddressFree {
                ptr: 0x1000,
                size: 1 << 40,
            },
            Event::Create {
                handle: 5,
                size: 2 << 20,
                device: -1,
                caller: 2,
                result: 2,
            },
            Event::Release { handle: 5 },
            Event::Map {
                ptr: 0x1000,
                size: 2 << 20,
                offset: 0,
                handle: 5,
                result: 0,
            },
            Event::Unmap {
                ptr: 0x1000,
                size: 2 << 20,
            },
            Event::Context {
                how: ContextHow::Primary,
                device: 0,
                ctx: 0xabc,
                result: 0,
                sm_count: Some(132),
                threads_per_sm: Some(2048),
                total: Some(150_109_880_320),
                free: Some(149_000_000_000),
                stack: Some(1024),
                heap: None,
                fifo: Some(8_650_752),
            },
            Event::Limit {
                which: LimitKind::Stack,
                requested: 16384,
                result: 0,
                value: Some(16384),
                window,
            },
            Event::Module {
                call: Call::LibraryLoadData,
                result: 0,
                window,
            },
            Event::Launch {
                call: Call::LaunchKernel,
                handle: 0x55,
                local_bytes: Some(16384),
                stack_before: Some(1024),
                stack_after: Some(16384),
                window,
                result: 0,
                name: "_Z9big_framePi".into(),
            },
            Event::MemInfo {
                why: MemInfoWhy::OutOfMemory,
                device: 0,
                free: 1,
                total: 2,
                pool_reserved: Some(0),
            },
            Event::Resolve {
                name: "cuMemAlloc".into(),
                version: 13000,
                flags: 0,
                how: ResolveHow::Export,
            },
            Event::Signal { number: 11 },
            Event::Exit { dropped: 0 },
        ]
    }

    #[test]
    fn every_kind_reads_back_as_written() {
        for (index, event) in every_kind().into_iter().enumerate() {
            let record = Record {
                time_ns: 1_000 + index as u64,
                thread: 4242,
                event,
            };
            let mut line = Line::default();
            line.encode(&record);
            let text = std::str::from_utf8(line.as_bytes()).unwrap();
            assert!(text.ends_with('\n'), "{text:?}");
            assert_eq!(text.matches('\n').count(), 1, "{text:?}");
            let back = parse_line(text.trim_end_matches('\n')).unwrap();
            assert_eq!(back, record, "{text:?}");
        }
    }

    #[test]
    fn numbers_of_every_width_read_back() {
        let mut values = vec![0, 1, 9, 10, 99, 100, 101, 999, 1000, u64::MAX, u64::MAX - 1];
        values.extend((0..64).map(|shift| 1u64 << shift));
        values.extend((1..20).map(|digits| 10u64.pow(digits) - 1));
        let mut line = Line::default();
        for value in values {
            let record = Record {
                time_ns: value,
                thread: 1,
                event: Event::Map {
                    ptr: value,
                    size: value,
                    offset: value / 3,
                    handle: value,
                    result: -1,
                },
            };
            line.encode(&record);
            let text = std::str::from_utf8(line.as_bytes()).unwrap();
            assert_eq!(parse_line(text.trim_end()).unwrap(), record, "{text}");
        }
    }

    #[test]
    fn long_names_are_cut_and_the_line_stays_whole() {
        let name = "é".repeat(MAX_NAME_BYTES);
        let record = Record {
            time_ns: 1,
            thread: 1,
            event: Event::Library {
                id: 1,
                path: name.as_str().into(),
            },
        };
        let mut line = Line::default();
        line.encode(&record);
        let text = std::str::from_utf8(line.as_bytes()).unwrap();
        let Event::Library { path, .. } = parse_line(text.trim_end()).unwrap().event else {
            panic!("not a library record: {text}");
        };
        assert!(path.len() <= MAX_NAME_BYTES && path.len() >= MAX_NAME_BYTES - 1);
        assert!(name.starts_with(path.as_ref()));
        // A name made of escaped bytes doubles, and still fits.
        let tabs = "\t".repeat(5 * MAX_NAME_BYTES);
        let record = Record {
            time_ns: 1,
            thread: 1,
            event: Event::Library {
                id: 1,
                path: tabs.as_str().into(),
            },
        };
        line.encode(&record);
        assert!(line.as_bytes().ends_with(b"\n"));
        assert!(parse_line(std::str::from_utf8(line.as_bytes()).unwrap().trim_end()).is_ok());
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        assert_eq!(
            parse_line("bogus\t1\t2"),
            Err(LineError::UnknownKind("bogus".into()))
        );
        assert!(matches!(
            parse_line("exit\t1\t2"),
            Err(LineError::FieldCount {
                kind: "exit",
                found: 3,
                expected: 4
            })
        ));
        assert!(matches!(
            parse_line("alloc\t1\t2\tcuMemAlloc\t12\t1\t0x0\t0\t0"),
            Err(LineError::BadField { index: 4, .. })
        ));
        assert!(matches!(
            parse_line("alloc\t1\t2\tcuMemBogus\t0x12\t1\t0x0\t0\t0"),
            Err(LineError::BadField { index: 3, .. })
        ));
    }

    #[test]
    fn a_window_subtracts_what_allocations_took_meanwhile() {
        let window = Window {
            free_before: Some(1000),
            free_after: Some(400),
            live_change: 100,
        };
        assert_eq!(window.taken_bytes(), Some(500));
        let freed = Window {
            free_before: Some(400),
            free_after: Some(1000),
            live_change: 0,
        };
        assert_eq!(freed.taken_bytes(), Some(0));
        assert_eq!(Window::default().taken_bytes(), None);
    }
}
