//! The steps a program's records take, their strategies (pointers and
//! handles drawn from small sets, so frees, reuse and double frees happen),
//! and the rules a driver keeps (it never hands out a live pointer or
//! handle again).

use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;
use trace::event::Call;

use crate::model::{Held, Model};

/// One step: what one record (or a free and its failure) says.
#[derive(Debug, Clone)]
pub enum Step {
    /// An allocation returned `result`: on success `held` at `ptr`.
    Alloc { held: Held, ptr: u64, result: i32 },
    /// A free is made, on a stream for the stream-ordered one.
    Free { call: Call, ptr: u64, stream: u64 },
    /// A free of a live block is made and fails: the block stays.
    FailedFree { call: Call, ptr: u64 },
    /// `cuMemAddressReserve` returned.
    Reserve { ptr: u64, size: u64, result: i32 },
    /// `cuMemAddressFree`.
    AddressFree { ptr: u64 },
    /// `cuMemCreate` returned `result`: on success `held` (its call
    /// `cuMemCreate`, no stream) as `handle`, of host memory if `host`.
    Create {
        held: Held,
        handle: u64,
        host: bool,
        result: i32,
    },
    /// `cuMemRelease`.
    Release { handle: u64 },
    /// `cuMemMap` returned.
    Map { ptr: u64, size: u64, result: i32 },
    /// `cuMemUnmap`.
    Unmap { ptr: u64, size: u64 },
}

const ALLOCATING: [Call; 7] = [
    Call::MemAlloc,
    Call::MemAllocPitch,
    Call::MemAllocManaged,
    Call::MemAllocAsync,
    Call::MemAllocFromPoolAsync,
    Call::MemHostAlloc,
    Call::MemAllocHost,
];

/// The free that undoes `call`'s allocation.
pub fn free_of(call: Call) -> Call {
    match call {
        Call::MemHostAlloc | Call::MemAllocHost => Call::MemFreeHost,
        Call::MemAllocAsync | Call::MemAllocFromPoolAsync => Call::MemFreeAsync,
        _ => Call::MemFree,
    }
}

fn pointer() -> impl Strategy<Value = u64> {
    (1u64..24).prop_map(|slot| 0x7f00_0000_0000 + slot * 0x10_0000)
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![1u64..4096, (1u64..64).prop_map(|mib| mib << 20)]
}

fn result() -> impl Strategy<Value = i32> {
    prop_oneof![8 => Just(0), 1 => Just(ctx::driver::result::OUT_OF_MEMORY), 1 => Just(1)]
}

/// The reference state machine: the model and the steps it may take.
pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model::default()).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let live: Vec<(u64, Call, u64)> = state
            .device
            .iter()
            .chain(state.host.iter())
            .map(|(&ptr, held)| (ptr, held.call, held.stream))
            .collect();
        let handles: Vec<u64> = state
            .handles
            .keys()
            .chain(state.host_handles.keys())
            .copied()
            .collect();
        let held = (
            proptest::sample::select(&ALLOCATING[..]),
            size(),
            0u64..4,
            0u32..4,
        )
            .prop_map(|(call, size, stream, caller)| Held {
                size,
                caller,
                call,
                stream,
            });
        let alloc = (held, pointer(), result()).prop_map(|(held, ptr, result)| Step::Alloc {
            held,
            ptr,
            result,
        });
        // Any pointer, freed by any free: unknown frees and frees by the
        // wrong kind of call are records too.
        let stray_free = (
            proptest::sample::select(&[Call::MemFree, Call::MemFreeAsync, Call::MemFreeHost][..]),
            pointer(),
            0u64..4,
        )
            .prop_map(|(call, ptr, stream)| Step::Free { call, ptr, stream });
        let vmm = prop_oneof![
            (pointer(), size(), result()).prop_map(|(ptr, size, result)| Step::Reserve {
                ptr,
                size,
                result
            }),
            pointer().prop_map(|ptr| Step::AddressFree { ptr }),
            (1u64..12, size(), any::<bool>(), 0u32..4, result()).prop_map(
                |(handle, size, host, caller, result)| Step::Create {
                    held: Held {
                        size,
                        caller,
                        call: Call::MemCreate,
                        stream: 0,
                    },
                    handle,
                    host,
                    result,
                }
            ),
            (1u64..12).prop_map(|handle| Step::Release { handle }),
            (pointer(), size(), result()).prop_map(|(ptr, size, result)| Step::Map {
                ptr,
                size,
                result
            }),
            (pointer(), size()).prop_map(|(ptr, size)| Step::Unmap { ptr, size }),
        ];
        if live.is_empty() {
            return prop_oneof![4 => alloc, 1 => stray_free, 3 => vmm].boxed();
        }
        // A live block freed by its own free, on its stream or another
        // (stream-ordered frees need not use the allocating stream).
        let own_free = (
            proptest::sample::select(live.clone()),
            0u64..4,
            any::<bool>(),
        )
            .prop_map(|((ptr, call, stream), other, same)| Step::Free {
                call: free_of(call),
                ptr,
                stream: if same { stream } else { other },
            });
        let failed_free =
            proptest::sample::select(live).prop_map(|(ptr, call, _)| Step::FailedFree {
                call: free_of(call),
                ptr,
            });
        let release = if handles.is_empty() {
            (1u64..12)
                .prop_map(|handle| Step::Release { handle })
                .boxed()
        } else {
            proptest::sample::select(handles)
                .prop_map(|handle| Step::Release { handle })
                .boxed()
        };
        prop_oneof![
            4 => alloc,
            4 => own_free,
            1 => failed_free,
            1 => stray_free,
            2 => release,
            3 => vmm,
        ]
        .boxed()
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        match *step {
            // The driver hands out no live pointer or handle again.
            Step::Alloc { ptr, result, .. } => result != 0 || !state.is_live(ptr),
            Step::Create { handle, result, .. } => {
                result != 0
                    || !(state.handles.contains_key(&handle)
                        || state.host_handles.contains_key(&handle))
            }
            // Only the free of a live block (by a free of its kind: the
            // interposer reads the block first) is recorded as failed.
            Step::FailedFree { call, ptr } => {
                if call.is_host() {
                    state.host.contains_key(&ptr)
                } else {
                    state.device.contains_key(&ptr)
                }
            }
            _ => true,
        }
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        state.step(step);
        state
    }
}
