//! One module per op family: validate, dispatch, launch.

pub mod batch_norm;
mod columns;
pub mod elementwise;
pub mod norm;
/// The RMSNorm optimization ladder: the benchmark's naive comparators, not part of the
/// library (the `norm-ladder` feature).
#[cfg(feature = "norm-ladder")]
pub mod norm_ladder;
pub(crate) mod rows;
pub mod softmax;

/// The spans one call reads, or writes: inline, since rill's ops pass at most six, so a check
/// costs no allocation.
pub(crate) type Spans<'a> = smallvec::SmallVec<[Span<'a>; 6]>;

/// A named byte range of device memory a call reads or writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span<'a> {
    what: &'a str,
    start: u64,
    end: u64,
}

impl<'a> Span<'a> {
    /// The memory `array`'s view covers (a view is contiguous).
    pub(crate) fn of<T: crate::tensor::Element>(what: &'a str, array: &impl crate::tensor::AsView<T>) -> Self {
        let view = array.as_view();
        Span { what, start: view.address(), end: view.address() + (view.len() * size_of::<T>()) as u64 }
    }

    fn overlaps(&self, other: &Span<'_>) -> bool {
        self.start < other.end && other.start < self.end
    }

    fn same(&self, other: &Span<'_>) -> bool {
        (self.start, self.end) == (other.start, other.end)
    }
}

/// Checks that no array a call writes shares memory with another it writes or one it
/// reads: the kernels read and write in no order that would make an overlap mean anything.
/// `in_place` lets an output be exactly one of the inputs (same address and length), for
/// the elementwise kernels, whose threads each read their elements before writing them.
pub(crate) fn check_disjoint(op: &str, reads: &[Span<'_>], writes: &[Span<'_>], in_place: bool) -> crate::Result<()> {
    for (k, write) in writes.iter().enumerate() {
        if let Some(other) = writes[..k].iter().find(|other| write.overlaps(other)) {
            crate::error::invalid!(
                "`{op}`: {} and {} share memory; give each output its own memory",
                other.what,
                write.what
            );
        }
        if let Some(read) = reads.iter().find(|read| write.overlaps(read) && !(in_place && write.same(read))) {
            crate::error::invalid!(
                "`{op}`: {} shares memory with {}; give the output memory of its own{}",
                write.what,
                read.what,
                if in_place { " (or exactly the input's, to work in place)" } else { "" }
            );
        }
    }
    Ok(())
}
