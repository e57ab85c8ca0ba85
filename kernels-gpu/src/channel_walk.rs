//! A walk along an `(outer, channels, inner)` tensor in memory order that knows each
//! element's channel without dividing per element: BatchNorm's apply pass steps it by a
//! pack, and back by the grid's stride. Plain integer code, so it is tested on the host.

use crate::abi::BatchNormArgs;
use crate::unroll::unrolled_array;

/// The channel of a walk along the tensor in memory order: element `(n, c, s)`, as `c` and
/// `s`, stepped without dividing.
#[derive(Clone, Copy)]
pub(crate) struct ChannelWalk {
    pub(crate) s: u32,
    pub(crate) c: u32,
}

/// The view's sizes as a walk steps through them.
#[derive(Clone, Copy)]
pub(crate) struct Extent {
    pub(crate) inner: u32,
    pub(crate) channels: u32,
}

impl Extent {
    #[inline(always)]
    pub(crate) fn of(args: &BatchNormArgs) -> Self {
        Extent { inner: args.inner as u32, channels: args.channels as u32 }
    }

    /// The walk at element `i` (two divisions: once per thread, or per tail element).
    #[inline(always)]
    pub(crate) fn at(self, i: u64) -> ChannelWalk {
        let row = i / self.inner.max(1) as u64;
        ChannelWalk { s: (i - row * self.inner as u64) as u32, c: (row % self.channels.max(1) as u64) as u32 }
    }

    /// The next element's walk.
    #[inline(always)]
    pub(crate) fn step(self, mut walk: ChannelWalk) -> ChannelWalk {
        walk.s += 1;
        if walk.s == self.inner {
            walk.s = 0;
            walk.c += 1;
            if walk.c == self.channels {
                walk.c = 0;
            }
        }
        walk
    }

    /// The channels of `P` consecutive elements from `walk`.
    #[inline(always)]
    pub(crate) fn channels<const P: usize>(self, walk: ChannelWalk) -> [u32; P] {
        let mut at = walk;
        unrolled_array(|j| {
            if j > 0 {
                at = self.step(at);
            }
            at.c
        })
    }
}

/// A fixed stride of a walk: `delta = rows * inner + s` elements, `rows % channels`
/// channels.
#[derive(Clone, Copy)]
pub(crate) struct Stride {
    pub(crate) s: u32,
    pub(crate) c: u32,
}

impl Extent {
    #[inline(always)]
    pub(crate) fn stride(self, delta: u64) -> Stride {
        let walk = self.at(delta);
        Stride { s: walk.s, c: walk.c }
    }

    /// `walk` moved back by `stride` (one compare per wrap: `s, c` stay below their
    /// extents).
    #[inline(always)]
    pub(crate) fn retreat(self, mut walk: ChannelWalk, stride: Stride) -> ChannelWalk {
        let borrow = if walk.s < stride.s {
            walk.s += self.inner - stride.s;
            1
        } else {
            walk.s -= stride.s;
            0
        };
        // At most `channels`: `stride.c` is below it.
        let back = stride.c + borrow;
        if walk.c < back {
            walk.c += self.channels - back;
        } else {
            walk.c -= back;
        }
        walk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Walking back by a stride lands where dividing for the element would.
    #[test]
    fn retreat_matches_the_walk_of_the_element_a_stride_back() {
        for (inner, channels) in [(1, 64), (1, 3), (12544, 32), (49, 2048), (7, 5), (1, 1)] {
            let extent = Extent { inner, channels };
            let len = 3 * (inner * channels) as u64 + 17;
            for delta in [1, 8, 256, 2048 * 8, len / 3, len - 1] {
                let stride = extent.stride(delta);
                for i in (delta..len).step_by(97) {
                    let (got, want) = (extent.retreat(extent.at(i), stride), extent.at(i - delta));
                    assert_eq!((got.s, got.c), (want.s, want.c), "{inner} x {channels}: {i} - {delta}");
                }
            }
        }
    }

    /// Stepping by one element, and a pack's channels, match dividing for each element.
    #[test]
    fn steps_and_pack_channels_match_the_walk_of_each_element() {
        for (inner, channels) in [(1, 64), (1, 3), (49, 5), (4, 1)] {
            let extent = Extent { inner, channels };
            for i in 0..3 * (inner * channels) as u64 {
                let (got, want) = (extent.step(extent.at(i)), extent.at(i + 1));
                assert_eq!((got.s, got.c), (want.s, want.c), "{inner} x {channels}: {i} + 1");
                let pack: [u32; 8] = extent.channels(extent.at(i));
                assert_eq!(pack, core::array::from_fn(|j| extent.at(i + j as u64).c), "{inner} x {channels}: {i}");
            }
        }
    }
}
