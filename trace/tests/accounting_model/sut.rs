//! The system under test: each step as the records the interposer writes
//! for it, applied to an [`Accounting`].

use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use trace::event::{Event, Record};
use trace::process::accounting::Accounting;

use crate::assertions::agree;
use crate::model::Model;
use crate::transitions::{Reference, Step};

/// The accounting, driven by records.
pub struct AccountingTest;

fn apply(accounting: &mut Accounting, event: Event<'static>) {
    accounting.apply(&Record {
        time_ns: 0,
        thread: 1,
        event,
    });
}

impl StateMachineTest for AccountingTest {
    type SystemUnderTest = Accounting;
    type Reference = Reference;

    fn init_test(_: &<Reference as ReferenceStateMachine>::State) -> Accounting {
        Accounting::default()
    }

    fn apply(mut accounting: Accounting, _: &Model, step: Step) -> Accounting {
        match step {
            Step::Alloc { held, ptr, result } => apply(
                &mut accounting,
                Event::Alloc {
                    call: held.call,
                    ptr: if result == 0 { ptr } else { 0 },
                    size: held.size,
                    stream: held.stream,
                    caller: held.caller,
                    result,
                },
            ),
            Step::Free { call, ptr, stream } => apply(
                &mut accounting,
                Event::Free {
                    call,
                    ptr,
                    stream,
                    caller: 0,
                },
            ),
            Step::FailedFree { call, ptr } => {
                // As the interposer does: the block's size and caller read
                // before the free, the free recorded, then its failure.
                let (size, caller) = accounting.block_of(call, ptr).expect("a live block");
                apply(
                    &mut accounting,
                    Event::Free {
                        call,
                        ptr,
                        stream: 0,
                        caller: 0,
                    },
                );
                apply(
                    &mut accounting,
                    Event::FreeFailed {
                        call,
                        ptr,
                        size,
                        caller,
                        result: 1,
                    },
                );
            }
            Step::Reserve { ptr, size, result } => {
                apply(&mut accounting, Event::Reserve { ptr, size, result })
            }
            Step::AddressFree { ptr } => {
                apply(&mut accounting, Event::AddressFree { ptr, size: 0 })
            }
            Step::Create {
                held,
                handle,
                host,
                result,
            } => apply(
                &mut accounting,
                Event::Create {
                    handle,
                    size: held.size,
                    device: if host { -1 } else { 0 },
                    caller: held.caller,
                    result,
                },
            ),
            Step::Release { handle } => apply(&mut accounting, Event::Release { handle }),
            Step::Map { ptr, size, result } => apply(
                &mut accounting,
                Event::Map {
                    ptr,
                    size,
                    offset: 0,
                    handle: 1,
                    result,
                },
            ),
            Step::Unmap { ptr, size } => apply(&mut accounting, Event::Unmap { ptr, size }),
        }
        accounting
    }

    fn check_invariants(accounting: &Accounting, model: &Model) {
        agree(accounting, model);
    }
}
