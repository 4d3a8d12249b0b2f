//! Accounting record by record: unit cases.

use super::*;
use crate::event::{LimitKind, Window};
use crate::image::Answer;

fn apply(accounting: &mut Accounting, event: Event<'static>) {
    accounting.apply(&Record {
        time_ns: 0,
        thread: 1,
        event,
    });
}

#[test]
fn vmm_physical_memory_is_live_and_address_space_is_not() {
    let mut a = Accounting::default();
    apply(
        &mut a,
        Event::Reserve {
            ptr: 0x1000_0000,
            size: 1 << 40,
            result: 0,
        },
    );
    apply(
        &mut a,
        Event::Create {
            handle: 9,
            size: 2 << 20,
            device: 0,
            caller: 2,
            result: 0,
        },
    );
    apply(
        &mut a,
        Event::Map {
            ptr: 0x1000_0000,
            size: 2 << 20,
            offset: 0,
            handle: 9,
            result: 0,
        },
    );
    assert_eq!(a.live_device_bytes(), 2 << 20);
    assert_eq!(a.vmm_bytes(), (1 << 40, 2 << 20, 2 << 20));
    assert_eq!(a.callers()[0].1.device_bytes, 2 << 20);
    apply(
        &mut a,
        Event::Unmap {
            ptr: 0x1000_0000,
            size: 1 << 30,
        },
    );
    apply(&mut a, Event::Release { handle: 9 });
    apply(
        &mut a,
        Event::AddressFree {
            ptr: 0x1000_0000,
            size: 1 << 40,
        },
    );
    assert_eq!(a.vmm_bytes(), (0, 0, 0));
    assert_eq!(a.live_device_bytes(), 0);
    assert!(a.callers().is_empty());
}

#[test]
fn pinned_host_memory_is_counted_apart() {
    let mut a = Accounting::default();
    apply(
        &mut a,
        Event::Alloc {
            call: Call::MemHostAlloc,
            ptr: 0x55,
            size: 4096,
            stream: 0,
            caller: 1,
            result: 0,
        },
    );
    assert_eq!((a.live_device_bytes(), a.live_host_bytes()), (0, 4096));
    apply(
        &mut a,
        Event::Free {
            call: Call::MemFreeHost,
            ptr: 0x55,
            stream: 0,
            caller: 1,
        },
    );
    assert_eq!(a.live_host_bytes(), 0);
}

#[test]
fn a_failed_free_keeps_the_block_and_unknown_frees_are_counted() {
    let mut a = Accounting::default();
    apply(
        &mut a,
        Event::Alloc {
            call: Call::MemAlloc,
            ptr: 0x10,
            size: 512,
            stream: 0,
            caller: 1,
            result: 0,
        },
    );
    let block = a.block_of(Call::MemFree, 0x10).unwrap();
    apply(
        &mut a,
        Event::Free {
            call: Call::MemFree,
            ptr: 0x10,
            stream: 0,
            caller: 1,
        },
    );
    assert_eq!(a.live_device_bytes(), 0);
    apply(
        &mut a,
        Event::FreeFailed {
            call: Call::MemFree,
            ptr: 0x10,
            size: block.0,
            caller: block.1,
            result: 700,
        },
    );
    assert_eq!(a.live_device_bytes(), 512);
    assert_eq!((a.counts.allocations, a.counts.frees), (1, 0));
    apply(
        &mut a,
        Event::Free {
            call: Call::MemFree,
            ptr: 0x99,
            stream: 0,
            caller: 1,
        },
    );
    assert_eq!(a.counts.unknown_frees, 1);
    apply(
        &mut a,
        Event::Alloc {
            call: Call::MemAlloc,
            ptr: 0,
            size: 1 << 40,
            stream: 0,
            caller: 1,
            result: 2,
        },
    );
    assert_eq!(a.counts.out_of_memory, 1);
}

#[test]
fn limits_and_loads_fill_the_measured_items() {
    let mut a = Accounting::default();
    apply(
        &mut a,
        Event::Context {
            how: crate::event::ContextHow::Create,
            device: 3,
            ctx: 1,
            result: 0,
            sm_count: Some(2),
            threads_per_sm: Some(1024),
            total: Some(1 << 30),
            free: Some((1 << 30) - (10 << 20)),
            stack: Some(1024),
            heap: None,
            fifo: None,
        },
    );
    let window = |taken: u64| Window {
        free_before: Some(1 << 29),
        free_after: Some((1 << 29) - taken),
        live_change: 0,
    };
    apply(
        &mut a,
        Event::Limit {
            which: LimitKind::Stack,
            requested: 4096,
            result: 0,
            value: Some(4096),
            window: window(6 << 20),
        },
    );
    apply(
        &mut a,
        Event::Module {
            call: Call::LibraryLoadData,
            result: 0,
            window: window(1 << 20),
        },
    );
    let device = &a.devices()[0];
    assert_eq!(device.facts.ordinal, 3);
    assert_eq!(device.facts.used_at_context, Some(10 << 20));
    assert_eq!(
        (device.stack, device.stack_source.clone()),
        (Some(4096), StackSource::SetLimit)
    );
    assert_eq!(device.local_change_measured, 6 << 20);
    assert_eq!((device.module_measured, device.module_loads), (1 << 20, 1));
}

/// Free memory that dropped by `bytes` around a call.
fn took(bytes: u64) -> Window {
    Window {
        free_before: Some(1 << 40),
        free_after: Some((1 << 40) - bytes),
        live_change: 0,
    }
}

fn context(a: &mut Accounting, heap: u64) {
    apply(
        a,
        Event::Context {
            how: crate::event::ContextHow::Primary,
            device: 0,
            ctx: 1,
            result: 0,
            sm_count: Some(4),
            threads_per_sm: Some(2048),
            total: Some(1 << 30),
            free: Some(1 << 29),
            stack: Some(1024),
            heap: Some(heap),
            fifo: Some(1 << 20),
        },
    );
}

fn load(a: &mut Accounting, image: Option<(u64, Answer)>, code: u64) {
    if let Some((bytes, malloc)) = image {
        apply(
            a,
            Event::Image {
                call: Call::ModuleLoadData,
                format: crate::image::ImageFormat::Ptx,
                bytes: Some(bytes),
                malloc,
                printf: Answer::No,
                note: "".into(),
            },
        );
    }
    apply(
        a,
        Event::Module {
            call: Call::ModuleLoadData,
            result: 0,
            window: took(code),
        },
    );
}

fn launch(a: &mut Accounting, stack: (u64, u64), bytes: u64) -> Option<UnexplainedDrop> {
    apply(
        a,
        Event::Launch {
            call: Call::LaunchKernel,
            handle: 7,
            local_bytes: Some(stack.1),
            stack_before: Some(stack.0),
            stack_after: Some(stack.1),
            window: took(bytes),
            result: 0,
            name: "k".into(),
        },
    );
    a.take_unexplained()
}

#[test]
fn the_heap_is_taken_whole_at_the_first_launch_of_an_image_calling_malloc() {
    let mut a = Accounting::default();
    context(&mut a, 256 << 20);
    load(&mut a, Some((600, Answer::Yes)), 2 << 20);
    assert_eq!(launch(&mut a, (1024, 1024), (256 << 20) + (1 << 20)), None);
    let device = &a.devices()[0];
    assert_eq!(device.heap_measured, 256 << 20);
    assert_eq!(device.module_measured, 3 << 20);
    assert!(!device.heap_pending);
    // Taken once: a later drop at a first launch is not the heap again.
    let drop = launch(&mut a, (1024, 1024), 256 << 20).expect("said");
    assert_eq!(drop.bytes, (256 << 20) - (1 << 20));
    assert!(drop.why.contains("taken already"), "{}", drop.why);
}

#[test]
fn an_unread_image_gets_the_heap_only_for_a_drop_that_holds_it() {
    let mut a = Accounting::default();
    context(&mut a, 64 << 20);
    load(&mut a, Some((600, Answer::Unknown)), 2 << 20);
    // Smaller than the heap: lazily loaded code, within the image's bound.
    assert_eq!(launch(&mut a, (1024, 1024), 1 << 20), None);
    assert_eq!(a.devices()[0].heap_measured, 0);
    let mut a = Accounting::default();
    context(&mut a, 64 << 20);
    load(&mut a, Some((600, Answer::Unknown)), 2 << 20);
    assert_eq!(launch(&mut a, (1024, 1024), 64 << 20), None);
    assert_eq!(a.devices()[0].heap_measured, 64 << 20);
}

#[test]
fn a_stack_raise_is_local_memory_not_heap() {
    let mut a = Accounting::default();
    context(&mut a, 8 << 20);
    load(&mut a, Some((600, Answer::Unknown)), 2 << 20);
    // 4 SMs x 2048 threads x (16384 - 1024) bytes: the raise alone.
    let local = 4 * 2048 * (16384 - 1024);
    assert_eq!(launch(&mut a, (1024, 16384), local), None);
    let device = &a.devices()[0];
    assert_eq!(
        (device.heap_measured, device.local_change_measured),
        (0, local as i64)
    );
    // With an image calling malloc, a raise and the heap in one drop.
    let mut a = Accounting::default();
    context(&mut a, 8 << 20);
    load(&mut a, Some((600, Answer::Yes)), 2 << 20);
    assert_eq!(launch(&mut a, (1024, 16384), local + (8 << 20)), None);
    let device = &a.devices()[0];
    assert_eq!(
        (device.heap_measured, device.local_change_measured),
        (8 << 20, local as i64)
    );
}

#[test]
fn code_beyond_what_the_images_hold_is_an_unexplained_drop_but_not_in_old_logs() {
    let mut a = Accounting::default();
    context(&mut a, 8 << 20);
    load(&mut a, Some((600, Answer::No)), 2 << 20);
    let drop = launch(&mut a, (1024, 1024), 100 << 20).expect("said at once");
    assert_eq!(drop.call, Call::LaunchKernel);
    assert_eq!(drop.kernel.as_deref(), Some("k"));
    assert_eq!(
        drop.bytes,
        (100 << 20) - (code_bound_bytes(600) - (2 << 20))
    );
    assert!(
        drop.to_string()
            .starts_with("cuLaunchKernel (first launch of k) took")
    );
    assert_eq!(a.devices()[0].unexplained_drops, [drop]);
    assert_eq!(a.take_unexplained(), None, "said once");
    // A log without image records (an older interposer): loads are not
    // bounded, as before.
    let mut a = Accounting::default();
    context(&mut a, 8 << 20);
    load(&mut a, None, 2 << 20);
    assert_eq!(launch(&mut a, (1024, 1024), 100 << 20), None);
    assert_eq!(a.devices()[0].module_measured, 102 << 20);
}
