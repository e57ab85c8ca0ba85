//! LayerNorm and RMSNorm (in progress).
