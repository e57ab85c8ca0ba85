//! NVTX ranges, so Nsight Systems and Nsight Compute show which op a kernel belongs to.
//!
//! NVTX v3 is a header-only C library: it does nothing until a tool injects itself. We speak
//! the same injection protocol, in Rust, so no library needs to be installed or linked:
//!
//! 1. On the first [`range`], read `NVTX_INJECTION64_PATH`. Unset (no tool attached): every
//!    range from then on is a no-op costing one atomic load.
//! 2. Otherwise `dlopen` that library (nsys and ncu point it at their injection library) and
//!    call its `InitializeInjectionNvtx2(getExportTable)`.
//! 3. The tool calls `getExportTable(NVTX_ETID_CALLBACKS)` and through its
//!    `GetModuleFunctionTable(module)` gets, per callback module, an array of pointers to our
//!    function-pointer slots, and writes its implementations into the slots it handles
//!    (`nvtxRangePushA` and `nvtxRangePop` are slots 9 and 11 of module CORE).
//! 4. A range calls the tool's `nvtxRangePushA` and, when its guard drops, `nvtxRangePop`.
//!
//! We provide the six modules and slot counts of the NVTX v3 headers (only CORE's push and pop
//! are ever called), and the version table (`NVTX_ETID_VERSIONINFO`, version 3). A missing
//! library, a library without the entry point or an entry point that returns 0 leaves NVTX
//! silently inactive, as in C; nothing here panics. Only Unix has `dlopen`; elsewhere ranges
//! are always no-ops.
//!
//! Why not a crate (checked 2026-11-23 with the pinned toolchain, gcc and no CUDA toolkit or
//! libclang): `nvtx` 2.0.0, NVIDIA's maintained release, does not build there, since its
//! `nvtx-sys` 2.0.0 always runs bindgen 0.72.1 in its build script ("Unable to find libclang").
//! `nvtx` 1.3.0 builds (a C shim, gcc only) and is a no-op without a tool, but it is the line
//! superseded when the name passed to NVIDIA (last release January 2024), and its range guard
//! carries 64-bit range ids through a C `int`. The other names tried (`nvtx-rs`, `nvtx3`,
//! `tracing-nvtx`) have no installable release.

use std::ffi::{c_char, c_int, c_void};
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A range on the calling thread's NVTX stack; it ends when dropped. It cannot leave its thread,
/// since NVTX push/pop nest per thread.
#[must_use = "the range ends when this guard is dropped"]
pub struct Range {
    pushed: bool,
    _thread: PhantomData<*const ()>,
}

impl Drop for Range {
    fn drop(&mut self) {
        if self.pushed {
            pop();
        }
    }
}

/// Starts a range named `name` (up to its first NUL) that ends when the guard drops. A no-op
/// unless an NVTX tool (nsys, ncu) is attached.
pub fn range(name: &str) -> Range {
    static ACTIVE: OnceLock<bool> = OnceLock::new();
    let active = *ACTIVE.get_or_init(|| load(std::env::var_os("NVTX_INJECTION64_PATH")));
    Range { pushed: active && push(name), _thread: PhantomData }
}

/// `NVTX_CBID_*_SIZE` of the callback modules 1 (CORE) to 6 (SYNC): CORE, CUDA, OPENCL,
/// CUDART, CORE2, SYNC. Slot 0 of each is the unused `*_INVALID`.
const MODULE_SIZES: [usize; 6] = [16, 9, 15, 7, 16, 7];
const TOTAL_SLOTS: usize = 70;
const _: () = {
    let (mut i, mut sum) = (0, 0);
    while i < MODULE_SIZES.len() {
        sum += MODULE_SIZES[i];
        i += 1;
    }
    assert!(sum == TOTAL_SLOTS);
};

/// `NVTX_CBID_CORE_RangePushA`, `NVTX_CBID_CORE_RangePop` (CORE's slots come first).
const RANGE_PUSH_A: usize = 9;
const RANGE_POP: usize = 11;

/// The function-pointer slots the tool fills, module after module. `AtomicPtr<c_void>` has the
/// layout of the C `NvtxFunctionPointer` a tool writes through.
static SLOTS: [AtomicPtr<c_void>; TOTAL_SLOTS] = [const { AtomicPtr::new(null_mut()) }; TOTAL_SLOTS];

/// Per module, the `NvtxFunctionTable` the tool gets: `size + 1` pointers, entry 0 and the
/// last null, the others the addresses of that module's slots (as in the C headers, the null
/// at the end makes a tool reading past the end crash rather than corrupt). Filled by `load`.
static TABLES: [AtomicPtr<AtomicPtr<c_void>>; TOTAL_SLOTS + 6] =
    [const { AtomicPtr::new(null_mut()) }; TOTAL_SLOTS + 6];

type PushA = unsafe extern "C" fn(*const c_char) -> c_int;
type Pop = unsafe extern "C" fn() -> c_int;
type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type InitializeInjection = unsafe extern "C" fn(GetExportTable) -> c_int;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct Callbacks {
    struct_size: usize,
    get_module_function_table: unsafe extern "C" fn(u32, *mut *mut AtomicPtr<AtomicPtr<c_void>>, *mut u32) -> c_int,
}

/// `NvtxExportTableVersionInfo`.
#[repr(C)]
struct VersionInfo {
    struct_size: usize,
    version: u32,
    reserved0: u32,
    set_injection_nvtx_version: unsafe extern "C" fn(u32),
}

static CALLBACKS: Callbacks = Callbacks { struct_size: size_of::<Callbacks>(), get_module_function_table };
static VERSION_INFO: VersionInfo =
    VersionInfo { struct_size: size_of::<VersionInfo>(), version: 3, reserved0: 0, set_injection_nvtx_version };

/// `nvtxGetExportTable`: `NVTX_ETID_CALLBACKS` (1) and `NVTX_ETID_VERSIONINFO` (3).
unsafe extern "C" fn get_export_table(id: u32) -> *const c_void {
    match id {
        1 => &CALLBACKS as *const Callbacks as *const c_void,
        3 => &VERSION_INFO as *const VersionInfo as *const c_void,
        _ => std::ptr::null(),
    }
}

/// `GetModuleFunctionTable`: module `module`'s table and its size (the module's slot count);
/// 0 for a module we do not have.
unsafe extern "C" fn get_module_function_table(
    module: u32,
    out_table: *mut *mut AtomicPtr<AtomicPtr<c_void>>,
    out_size: *mut u32,
) -> c_int {
    let Some(index) = (module as usize).checked_sub(1).filter(|&i| i < MODULE_SIZES.len()) else {
        return 0;
    };
    let start: usize = MODULE_SIZES[..index].iter().map(|size| size + 1).sum();
    // SAFETY: the tool passes null or valid pointers for the results, as the C protocol says;
    // the table is a static, so the pointer stays valid for the life of the process.
    unsafe {
        if !out_size.is_null() {
            *out_size = MODULE_SIZES[index] as u32;
        }
        if !out_table.is_null() {
            *out_table = std::ptr::from_ref(&TABLES[start]).cast_mut();
        }
    }
    1
}

/// `SetInjectionNvtxVersion`: reserved, ignored (as in the C headers).
unsafe extern "C" fn set_injection_nvtx_version(_version: u32) {}

/// Attaches to the injection library at `path`, if any; whether a tool is now attached.
fn load(path: Option<std::ffi::OsString>) -> bool {
    let Some(path) = path else { return false };
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let Ok(path) = std::ffi::CString::new(path.as_bytes()) else { return false };
        unsafe extern "C" {
            fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
            fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
            fn dlclose(handle: *mut c_void) -> c_int;
        }
        const RTLD_LAZY: c_int = 1;
        // SAFETY: `path` is a NUL-terminated string; loading a library runs its initializers,
        // which is what the user asked for by naming it in NVTX_INJECTION64_PATH.
        let handle = unsafe { dlopen(path.as_ptr(), RTLD_LAZY) };
        if handle.is_null() {
            return false;
        }
        // SAFETY: `handle` is a library we opened; the name is NUL-terminated.
        let entry = unsafe { dlsym(handle, c"InitializeInjectionNvtx2".as_ptr()) };
        if entry.is_null() {
            // SAFETY: nothing from the library is in use.
            unsafe { dlclose(handle) };
            return false;
        }
        // SAFETY: the NVTX protocol gives `InitializeInjectionNvtx2` this signature.
        let init = unsafe { std::mem::transmute::<*mut c_void, InitializeInjection>(entry) };
        // SAFETY: `init` follows the NVTX injection protocol that `handshake` implements.
        let attached = unsafe { handshake(init) };
        if !attached {
            // SAFETY: the entry point returned 0 and `handshake` emptied the slots, so nothing
            // of the library is reachable any more; as in C, it is unloaded.
            unsafe { dlclose(handle) };
        }
        // On success the library stays loaded for the life of the process.
        attached
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// Fills the tables, calls the tool's entry point and, if it returns 0, empties the slots it
/// may have filled (all NVTX calls are then no-ops, as in C).
///
/// # Safety
/// `init` must behave as an NVTX injection entry point: it may use the export tables it is
/// given and store, in the slots, functions of the signatures the NVTX headers give them.
unsafe fn handshake(init: InitializeInjection) -> bool {
    let mut table = 0;
    let mut slot = 0;
    for size in MODULE_SIZES {
        TABLES[table].store(null_mut(), Ordering::Relaxed);
        for i in 1..size {
            TABLES[table + i].store(std::ptr::from_ref(&SLOTS[slot + i]).cast_mut(), Ordering::Relaxed);
        }
        TABLES[table + size].store(null_mut(), Ordering::Relaxed);
        table += size + 1;
        slot += size;
    }
    // SAFETY: the caller vouches for `init`; the tables it reaches are statics.
    let attached = unsafe { init(get_export_table) } != 0;
    if !attached {
        SLOTS.iter().for_each(|slot| slot.store(null_mut(), Ordering::Relaxed));
    }
    attached
}

/// Calls the tool's `nvtxRangePushA`, if it set one; whether it did.
fn push(name: &str) -> bool {
    let function = SLOTS[RANGE_PUSH_A].load(Ordering::Acquire);
    if function.is_null() {
        return false;
    }
    let mut text: Vec<u8> = name.bytes().take_while(|&b| b != 0).collect();
    text.push(0);
    // SAFETY: a non-null slot holds the tool's `nvtxRangePushA` (the handshake's contract); it
    // reads the NUL-terminated string during the call only.
    unsafe {
        let push_a = std::mem::transmute::<*mut c_void, PushA>(function);
        push_a(text.as_ptr().cast());
    }
    true
}

/// Calls the tool's `nvtxRangePop`, if it set one.
fn pop() {
    let function = SLOTS[RANGE_POP].load(Ordering::Acquire);
    if !function.is_null() {
        // SAFETY: a non-null slot holds the tool's `nvtxRangePop` (the handshake's contract).
        unsafe { std::mem::transmute::<*mut c_void, Pop>(function)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn without_a_tool_ranges_are_no_ops() {
        assert!(!load(None));
        let outer = range("outer");
        let inner = range("inner\0ignored");
        drop(inner);
        drop(outer);
    }

    #[test]
    fn a_missing_or_foreign_library_leaves_nvtx_inactive() {
        assert!(!load(Some("/nonexistent/libToolsInjection64.so".into())));
        // Loads, but has no InitializeInjectionNvtx2.
        #[cfg(target_os = "linux")]
        assert!(!load(Some("libc.so.6".into())));
        let _range = range("still fine");
    }

    static EVENTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    unsafe extern "C" fn tool_push(name: *const c_char) -> c_int {
        // SAFETY: NVTX passes a NUL-terminated string.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
        EVENTS.lock().unwrap().push(format!("push {name}"));
        0
    }

    unsafe extern "C" fn tool_pop() -> c_int {
        EVENTS.lock().unwrap().push("pop".into());
        0
    }

    /// A tool's `InitializeInjectionNvtx2` as the C ones are written: checks the version table
    /// and every module's size, then fills CORE's push and pop.
    unsafe extern "C" fn tool_init(get_export_table: GetExportTable) -> c_int {
        // SAFETY: the test drives the protocol exactly as a C tool does.
        unsafe {
            let version = get_export_table(3).cast::<VersionInfo>();
            assert_eq!(((*version).struct_size, (*version).version), (size_of::<VersionInfo>(), 3));
            assert!(get_export_table(2).is_null());
            let callbacks = get_export_table(1).cast::<Callbacks>();
            assert_eq!((*callbacks).struct_size, size_of::<Callbacks>());
            let get = (*callbacks).get_module_function_table;
            for (module, expected) in (1..=6).zip(MODULE_SIZES) {
                let (mut table, mut size) = (null_mut(), 0u32);
                assert_eq!(get(module, &mut table, &mut size), 1);
                assert_eq!(size as usize, expected);
                assert!((*table).load(Ordering::Relaxed).is_null());
                assert!((*table.add(expected)).load(Ordering::Relaxed).is_null());
                assert!((1..expected).all(|i| !(*table.add(i)).load(Ordering::Relaxed).is_null()));
            }
            assert_eq!(get(7, null_mut(), null_mut()), 0);
            let (mut core, mut size) = (null_mut(), 0u32);
            get(1, &mut core, &mut size);
            let slot = |id: usize| (*core.add(id)).load(Ordering::Relaxed);
            // What C does: `*table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push;`.
            *slot(RANGE_PUSH_A).cast::<PushA>() = tool_push;
            *slot(RANGE_POP).cast::<Pop>() = tool_pop;
        }
        1
    }

    #[test]
    fn the_handshake_gives_a_tool_the_push_and_pop_slots() {
        // SAFETY: `tool_init` is a well-behaved injection entry point.
        assert!(unsafe { handshake(tool_init) });
        assert!(push("rill_gelu_f32\0tail"));
        pop();
        assert_eq!(*EVENTS.lock().unwrap(), ["push rill_gelu_f32", "pop"]);
    }
}
