//! The RMSNorm optimization ladder (in progress).
