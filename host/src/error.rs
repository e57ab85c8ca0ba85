//! The one error type of the library.

use crate::driver::sys::{self, CUresult};

/// What went wrong, in three kinds: the input is not acceptable, the device or build cannot
/// do it, or the driver failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The arguments are wrong; the message says what to change.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Valid arguments this library or this device does not support; the message says what is.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver call `{call}` failed with error {code}: {message}")]
    Driver { call: &'static str, code: u32, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An `Unsupported` error said in the caller's terms; any other error (the driver's) as
    /// it is, so a failing driver is never reported as a missing kernel.
    pub(crate) fn reword_unsupported(self, message: impl FnOnce() -> String) -> Error {
        match self {
            Error::Unsupported(_) => Error::Unsupported(message()),
            other => other,
        }
    }
}

/// Attaches the name of the driver call to a driver result.
pub(crate) trait DriverContext<T> {
    fn during(self, call: &'static str) -> Result<T>;
}

impl DriverContext<()> for CUresult {
    fn during(self, call: &'static str) -> Result<()> {
        if self == CUresult::CUDA_SUCCESS {
            return Ok(());
        }
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string, or leaves it null.
        let message = unsafe {
            sys::cuGetErrorString(self, &mut text);
            if text.is_null() {
                "unknown error".to_string()
            } else {
                std::ffi::CStr::from_ptr(text).to_string_lossy().into_owned()
            }
        };
        Err(Error::Driver { call, code: self as u32, message })
    }
}

/// Returns `Error::InvalidInput` with the formatted message from the enclosing function.
macro_rules! invalid {
    ($($message:tt)+) => {
        return Err($crate::error::Error::InvalidInput(format!($($message)+)))
    };
}
pub(crate) use invalid;
