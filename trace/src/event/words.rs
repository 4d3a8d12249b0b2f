//! The words the log writes for closed sets of values (driver calls, how a
//! context came to be, why free memory was read, how a `cuGetProcAddress`
//! answer was handed on), each set declared once with [`words!`]: the
//! enum, its list, its words, and its reading come from that declaration.

/// A closed set of values written as one word each.
pub trait Word: Sized + Copy + 'static {
    /// Every value, in declaration order.
    const ALL: &'static [Self];
    /// What a field of this set must be, for an error message.
    const WHAT: &'static str;
    /// The word in the log.
    fn word(self) -> &'static str;
    /// The value `word` names.
    fn from_word(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|value| value.word() == word)
    }
}

/// Declares an enum whose values are written as words:
/// `words! { /// doc  pub enum Name ("what a field must be") { /// doc Variant = "word", ... } }`;
/// with `-> Role` after the name, each variant also names its role
/// (`Variant = "word" [Role::X],`), which `role()` answers.
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) -> $role_ty:ty {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident = $word:literal [$role:expr],
            )*
        }
    ) => {
        $crate::event::words::words! {
            $(#[$meta])*
            pub enum $name ($what) {
                $($(#[$variant_meta])* $variant = $word,)*
            }
        }

        impl $name {
            /// What the call does, as far as reading the log needs.
            pub const fn role(self) -> $role_ty {
                match self {
                    $($name::$variant => $role,)*
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident = $word:literal,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The word in the log.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)*
                }
            }

            /// The value `word` names.
            pub fn from_name(word: &str) -> Option<$name> {
                <$name as $crate::event::words::Word>::from_word(word)
            }
        }

        impl $crate::event::words::Word for $name {
            const ALL: &'static [$name] = $name::ALL;
            const WHAT: &'static str = $what;
            fn word(self) -> &'static str {
                self.name()
            }
        }
    };
}
pub(crate) use words;

/// What a recorded driver call does, as far as reading the log needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallRole {
    /// Allocates, frees or measures device memory (or maps it).
    Device,
    /// Allocates or frees pinned host memory (counted apart from device
    /// memory).
    Host,
    /// Makes a context or sets its limits.
    Context,
    /// Loads a module or library.
    Load,
    /// Looks a function up in a module, queries or sets its attributes, or
    /// launches it (lazy loading loads code then).
    Code,
    /// Makes a driver object (a stream, an event, an executable graph, a
    /// memory pool) or first uses one (a graph's first upload or launch).
    Object,
}

words! {
    /// The driver functions the interposer records, by the driver's name of
    /// the function (the ABI's base name: the `_v2`/`_ptsz` variants of one
    /// function share it). A new recorded function is one row here and its
    /// hook in the interposer.
    #[allow(missing_docs)]
    pub enum Call ("a driver call name") -> CallRole {
        MemAlloc = "cuMemAlloc" [CallRole::Device],
        MemAllocPitch = "cuMemAllocPitch" [CallRole::Device],
        MemAllocManaged = "cuMemAllocManaged" [CallRole::Device],
        MemAllocAsync = "cuMemAllocAsync" [CallRole::Device],
        MemAllocFromPoolAsync = "cuMemAllocFromPoolAsync" [CallRole::Device],
        MemFree = "cuMemFree" [CallRole::Device],
        MemFreeAsync = "cuMemFreeAsync" [CallRole::Device],
        MemHostAlloc = "cuMemHostAlloc" [CallRole::Host],
        MemAllocHost = "cuMemAllocHost" [CallRole::Host],
        MemFreeHost = "cuMemFreeHost" [CallRole::Host],
        MemGetInfo = "cuMemGetInfo" [CallRole::Device],
        MemCreate = "cuMemCreate" [CallRole::Device],
        MemRelease = "cuMemRelease" [CallRole::Device],
        MemMap = "cuMemMap" [CallRole::Device],
        MemUnmap = "cuMemUnmap" [CallRole::Device],
        MemAddressReserve = "cuMemAddressReserve" [CallRole::Device],
        MemAddressFree = "cuMemAddressFree" [CallRole::Device],
        CtxCreate = "cuCtxCreate" [CallRole::Context],
        DevicePrimaryCtxRetain = "cuDevicePrimaryCtxRetain" [CallRole::Context],
        CtxSetLimit = "cuCtxSetLimit" [CallRole::Context],
        ModuleLoad = "cuModuleLoad" [CallRole::Load],
        ModuleLoadData = "cuModuleLoadData" [CallRole::Load],
        ModuleLoadDataEx = "cuModuleLoadDataEx" [CallRole::Load],
        ModuleLoadFatBinary = "cuModuleLoadFatBinary" [CallRole::Load],
        LibraryLoadData = "cuLibraryLoadData" [CallRole::Load],
        LibraryLoadFromFile = "cuLibraryLoadFromFile" [CallRole::Load],
        ModuleGetFunction = "cuModuleGetFunction" [CallRole::Code],
        LibraryGetKernel = "cuLibraryGetKernel" [CallRole::Code],
        KernelGetFunction = "cuKernelGetFunction" [CallRole::Code],
        LaunchKernel = "cuLaunchKernel" [CallRole::Code],
        LaunchKernelEx = "cuLaunchKernelEx" [CallRole::Code],
        LaunchCooperativeKernel = "cuLaunchCooperativeKernel" [CallRole::Code],
        FuncGetAttribute = "cuFuncGetAttribute" [CallRole::Code],
        FuncSetAttribute = "cuFuncSetAttribute" [CallRole::Code],
        KernelGetAttribute = "cuKernelGetAttribute" [CallRole::Code],
        KernelSetAttribute = "cuKernelSetAttribute" [CallRole::Code],
        FuncLoad = "cuFuncLoad" [CallRole::Code],
        OccupancyMaxActiveBlocksPerMultiprocessor =
            "cuOccupancyMaxActiveBlocksPerMultiprocessor" [CallRole::Code],
        StreamCreate = "cuStreamCreate" [CallRole::Object],
        StreamCreateWithPriority = "cuStreamCreateWithPriority" [CallRole::Object],
        EventCreate = "cuEventCreate" [CallRole::Object],
        GraphInstantiateWithFlags = "cuGraphInstantiateWithFlags" [CallRole::Object],
        GraphInstantiateWithParams = "cuGraphInstantiateWithParams" [CallRole::Object],
        GraphUpload = "cuGraphUpload" [CallRole::Object],
        GraphLaunch = "cuGraphLaunch" [CallRole::Object],
        MemPoolCreate = "cuMemPoolCreate" [CallRole::Object],
    }
}

impl Call {
    /// Whether the call loads a module or library (rather than looking a
    /// function up in one, or using one, where lazy loading loads code
    /// too).
    pub const fn is_load(self) -> bool {
        matches!(self.role(), CallRole::Load)
    }

    /// Whether the call makes a driver object (a stream, an event, an
    /// executable graph, a memory pool) or first uses one (a graph's first
    /// upload or launch): device memory such a call takes is the driver's,
    /// named apart from module code.
    pub const fn is_object(self) -> bool {
        matches!(self.role(), CallRole::Object)
    }

    /// Whether the memory this call allocates is pinned host memory
    /// (counted apart from device memory).
    pub const fn is_host(self) -> bool {
        matches!(self.role(), CallRole::Host)
    }
}

words! {
    /// How a context came to be.
    pub enum ContextHow ("create or primary") {
        /// `cuCtxCreate`.
        Create = "create",
        /// `cuDevicePrimaryCtxRetain` (what the runtime and most frameworks do).
        Primary = "primary",
    }
}

words! {
    /// Why free memory was read.
    pub enum MemInfoWhy ("a reason (program, context, peak, exit, oom)") {
        /// The program called `cuMemGetInfo`: what it saw.
        Program = "program",
        /// A context was just made (the reading in its `context` record).
        Context = "context",
        /// Live bytes reached a new peak.
        Peak = "peak",
        /// The process exits.
        Exit = "exit",
        /// A call returned out of memory.
        OutOfMemory = "oom",
    }
}

words! {
    /// How a `cuGetProcAddress` answer for a function the interposer records
    /// was handed on.
    pub enum ResolveHow ("export, table or unwrapped") {
        /// The driver's pointer is the exported symbol of a recorded ABI: the
        /// program got the interposer's wrapper of it.
        Export = "export",
        /// The pointer is no exported symbol, but the requested version names a
        /// recorded ABI (the driver's documented version table): wrapped.
        Table = "table",
        /// Handed on unwrapped: an ABI the interposer does not record (a 32-bit
        /// `v1` one), or a pointer it cannot place. Calls through it are not
        /// seen.
        Unwrapped = "unwrapped",
    }
}
