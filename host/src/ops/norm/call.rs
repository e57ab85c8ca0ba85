//! A norm call's parts, as the caller builds them: the forward's and the backward's arrays
//! with their optional weight, bias, residual and saved statistics, typed so a weight and
//! bias of different dtypes do not compile.

use super::{NormKind, column, column_bytes, per_row};
use crate::error::{Result, invalid};
use crate::ops::rows::ColumnArrays;
use crate::ops::{Span, Spans};
use crate::tensor::{AsView, AsViewMut, Element, View, ViewMut};
use rill_kernels_gpu::abi::NormArgs;

/// A forward call: `y = norm(x)` or, with a residual, `sum = x + residual; y = norm(sum)`.
/// Built with [`Forward::new`] and the optional parts below, in any order, each kept. `P`
/// holds the weight and bias: [`NoParams`] until one of them is given, then [`Params`] of
/// its dtype, which the other must share.
///
/// ```no_run
/// # use rill::{Tensor, norm::Forward};
/// # fn demo(x: &Tensor<f32>, y: &mut Tensor<f32>, b: &Tensor<f32>, w: &Tensor<f32>) {
/// let call = Forward::new(x, y).bias(b).weight(w);
/// # }
/// ```
///
/// A weight of another dtype than the bias given before it does not compile:
///
/// ```compile_fail,E0277
/// # use rill::{Tensor, norm::Forward};
/// # fn demo(x: &Tensor<f32>, y: &mut Tensor<f32>, b: &Tensor<f32>, w: &Tensor<half::bf16>) {
/// let call = Forward::new(x, y).bias(b).weight(w);
/// # }
/// ```
pub struct Forward<'a, T: Element, U: Element, P = NoParams> {
    pub(super) x: View<'a, T>,
    pub(super) y: ViewMut<'a, U>,
    pub(super) residual: Option<(View<'a, T>, ViewMut<'a, T>)>,
    pub(super) mean: Option<ViewMut<'a, f32>>,
    pub(super) rstd: Option<ViewMut<'a, f32>>,
    pub(super) params: P,
}

/// No weight, bias or parameter gradient given yet: the parameter dtype is still open, and a
/// call run without any uses the f32 kernels.
#[derive(Clone, Copy, Debug)]
pub struct NoParams;

/// A forward's weight and bias, of one dtype `G` (f32 or the input's).
#[derive(Default)]
pub struct Params<'a, G> {
    pub(super) weight: Option<View<'a, G>>,
    pub(super) bias: Option<View<'a, G>>,
}

/// A backward's weight and the gradients it computes, of one dtype `G`.
#[derive(Default)]
pub struct GradParams<'a, G> {
    pub(super) weight: Option<View<'a, G>>,
    pub(super) dweight: Option<ViewMut<'a, G>>,
    pub(super) dbias: Option<ViewMut<'a, G>>,
}

/// A forward without weight or bias runs the f32 kernels with neither.
impl From<NoParams> for Params<'_, f32> {
    fn from(_: NoParams) -> Self {
        Params::default()
    }
}

/// A backward without weight or parameter gradients runs the f32 kernels with none.
impl From<NoParams> for GradParams<'_, f32> {
    fn from(_: NoParams) -> Self {
        GradParams::default()
    }
}

impl<'a, T: Element, U: Element> Forward<'a, T, U> {
    /// `y = norm(x)`, without weight or bias.
    pub fn new(x: &'a impl AsView<T>, y: &'a mut impl AsViewMut<U>) -> Self {
        Forward { x: x.as_view(), y: y.as_view_mut(), residual: None, mean: None, rstd: None, params: NoParams }
    }

    /// The per-column scale (gamma), `[cols]` of f32 or the input's dtype; a bias must then
    /// have the same dtype.
    pub fn weight<G: Element>(self, weight: &'a impl AsView<G>) -> Forward<'a, T, U, Params<'a, G>> {
        self.open_params().weight(weight)
    }

    /// The per-column shift (beta, LayerNorm only; PyTorch too takes it without a weight),
    /// `[cols]` of f32 or the input's dtype; a weight must then have the same dtype.
    pub fn bias<G: Element>(self, bias: &'a impl AsView<G>) -> Forward<'a, T, U, Params<'a, G>> {
        self.open_params().bias(bias)
    }

    /// This call, every part kept, ready for parameters of dtype `G`.
    pub(super) fn open_params<G: Element>(self) -> Forward<'a, T, U, Params<'a, G>> {
        let Forward { x, y, residual, mean, rstd, params: NoParams } = self;
        Forward { x, y, residual, mean, rstd, params: Params::default() }
    }
}

impl<'a, T: Element, U: Element, G: Element> Forward<'a, T, U, Params<'a, G>> {
    /// The weight, of the bias's dtype.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The bias, of the weight's dtype.
    pub fn bias(mut self, bias: &'a impl AsView<G>) -> Self {
        self.params.bias = Some(bias.as_view());
        self
    }
}

impl<'a, T: Element, U: Element, P> Forward<'a, T, U, P> {
    /// Normalizes `x + residual` instead of `x`, writing the sum (the residual stream) too.
    pub fn residual(mut self, residual: &'a impl AsView<T>, sum: &'a mut impl AsViewMut<T>) -> Self {
        self.residual = Some((residual.as_view(), sum.as_view_mut()));
        self
    }

    /// Writes each row's mean (LayerNorm only) and `rstd` (f32, `rows` each) for the backward.
    pub fn save_mean(mut self, mean: &'a mut impl AsViewMut<f32>) -> Self {
        self.mean = Some(mean.as_view_mut());
        self
    }

    pub fn save_rstd(mut self, rstd: &'a mut impl AsViewMut<f32>) -> Self {
        self.rstd = Some(rstd.as_view_mut());
        self
    }
}

/// A backward call: `dx` from `x`, `dy` and the forward's statistics; optionally the
/// weight's and bias's gradients. Its parts may come in any order, each kept; `P` holds the
/// weight, dweight and dbias as in [`Forward`]: the first of them fixes the dtype of the
/// others.
///
/// ```compile_fail,E0277
/// # use rill::{Tensor, norm::Backward};
/// # fn demo(x: &Tensor<f32>, dy: &Tensor<f32>, rstd: &Tensor<f32>, dx: &mut Tensor<f32>,
/// #         dw: &mut Tensor<f32>, w: &Tensor<half::bf16>) {
/// let call = Backward::new(x, dy, rstd, dx).dweight(dw).weight(w);
/// # }
/// ```
pub struct Backward<'a, T: Element, P = NoParams> {
    pub(super) x: View<'a, T>,
    pub(super) dy: View<'a, T>,
    pub(super) mean: Option<View<'a, f32>>,
    pub(super) rstd: View<'a, f32>,
    pub(super) dx: ViewMut<'a, T>,
    pub(super) params: P,
}

impl<'a, T: Element> Backward<'a, T> {
    /// `dx` of RMSNorm, or of LayerNorm once [`Backward::mean`] gives the mean.
    pub fn new(
        x: &'a impl AsView<T>,
        dy: &'a impl AsView<T>,
        rstd: &'a impl AsView<f32>,
        dx: &'a mut impl AsViewMut<T>,
    ) -> Self {
        Backward {
            x: x.as_view(),
            dy: dy.as_view(),
            mean: None,
            rstd: rstd.as_view(),
            dx: dx.as_view_mut(),
            params: NoParams,
        }
    }

    /// The forward's weight, if it had one; the gradients must then have its dtype.
    pub fn weight<G: Element>(self, weight: &'a impl AsView<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().weight(weight)
    }

    /// Also computes the weight's gradient, `[cols]` of the weight's dtype (f32 without one).
    pub fn dweight<G: Element>(self, dweight: &'a mut impl AsViewMut<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().dweight(dweight)
    }

    /// Also computes the bias's gradient (LayerNorm), of the weight's dtype (f32 without one).
    pub fn dbias<G: Element>(self, dbias: &'a mut impl AsViewMut<G>) -> Backward<'a, T, GradParams<'a, G>> {
        self.open_params().dbias(dbias)
    }

    /// This call, every part kept, ready for parameters of dtype `G`.
    pub(super) fn open_params<G: Element>(self) -> Backward<'a, T, GradParams<'a, G>> {
        let Backward { x, dy, mean, rstd, dx, params: NoParams } = self;
        Backward { x, dy, mean, rstd, dx, params: GradParams::default() }
    }
}

impl<'a, T: Element, G: Element> Backward<'a, T, GradParams<'a, G>> {
    /// The forward's weight, of the gradients' dtype.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The weight's gradient, of the weight's dtype.
    pub fn dweight(mut self, dweight: &'a mut impl AsViewMut<G>) -> Self {
        self.params.dweight = Some(dweight.as_view_mut());
        self
    }

    /// The bias's gradient, of the weight's dtype.
    pub fn dbias(mut self, dbias: &'a mut impl AsViewMut<G>) -> Self {
        self.params.dbias = Some(dbias.as_view_mut());
        self
    }
}

impl<'a, T: Element, P> Backward<'a, T, P> {
    /// The forward's per-row mean (LayerNorm).
    pub fn mean(mut self, mean: &'a impl AsView<f32>) -> Self {
        self.mean = Some(mean.as_view());
        self
    }
}

/// A forward's parts beside its rows: the weight and bias, and the per-row outputs. A user's
/// fused norm (`rill::fuse::FusedNorm`) takes them alone, as its own functors read and
/// write the rows.
///
/// ```no_run
/// # use rill::{Tensor, norm::NormParts};
/// # fn demo(w: &Tensor<f32>, rstd: &mut Tensor<f32>) {
/// let parts = NormParts::new().weight(w).save_rstd(rstd);
/// # }
/// ```
pub struct NormParts<'a, G> {
    pub(super) params: Params<'a, G>,
    pub(super) mean: Option<ViewMut<'a, f32>>,
    pub(super) rstd: Option<ViewMut<'a, f32>>,
}

impl<G> Default for NormParts<'_, G> {
    fn default() -> Self {
        NormParts { params: Params { weight: None, bias: None }, mean: None, rstd: None }
    }
}

impl<'a, G: Element> NormParts<'a, G> {
    /// No weight, bias or per-row output.
    pub fn new() -> Self {
        NormParts::default()
    }

    /// The per-column scale (gamma), `[cols]` of `G`.
    pub fn weight(mut self, weight: &'a impl AsView<G>) -> Self {
        self.params.weight = Some(weight.as_view());
        self
    }

    /// The per-column shift (beta, LayerNorm only), `[cols]` of `G`.
    pub fn bias(mut self, bias: &'a impl AsView<G>) -> Self {
        self.params.bias = Some(bias.as_view());
        self
    }

    /// Writes each row's mean (LayerNorm only), f32, `rows` of them.
    pub fn save_mean(mut self, mean: &'a mut impl AsViewMut<f32>) -> Self {
        self.mean = Some(mean.as_view_mut());
        self
    }

    /// Writes each row's `rstd`, f32, `rows` of them.
    pub fn save_rstd(mut self, rstd: &'a mut impl AsViewMut<f32>) -> Self {
        self.rstd = Some(rstd.as_view_mut());
        self
    }

    /// Adds the memory these parts read (weight, bias) and write (mean, rstd).
    pub(super) fn spans(&self, reads: &mut Spans<'static>, writes: &mut Spans<'static>) {
        let Params { weight, bias } = &self.params;
        for (what, view) in [("the weight", weight), ("the bias", bias)] {
            reads.extend(view.as_ref().map(|v| Span::of(what, v)));
        }
        for (what, view) in [("the mean", &self.mean), ("rstd", &self.rstd)] {
            writes.extend(view.as_ref().map(|v| Span::of(what, v)));
        }
    }

    /// Checks these parts against a forward of `kind` over `rows x cols`, and writes them
    /// into `args` (with `1 / cols`) and their per-column arrays into `columns`; returns the
    /// bytes of weight and bias every row reads.
    pub(crate) fn fill(
        &self,
        op: &str,
        kind: NormKind,
        (rows, cols): (usize, usize),
        args: &mut NormArgs,
        columns: &mut ColumnArrays,
    ) -> Result<u32> {
        let Params { weight, bias } = &self.params;
        if !(args.eps.is_finite() && args.eps >= 0.0) {
            invalid!("`{op}`: eps must be finite and not negative; got {}", args.eps);
        }
        args.rms = (kind == NormKind::RmsNorm) as u32;
        args.inv_cols = (1.0 / cols as f64) as f32;
        if let Some(weight) = weight {
            args.gamma = column(op, "the weight", weight, cols)?;
            columns.push((args.gamma, size_of::<G>()));
        }
        if let Some(bias) = bias {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` has no bias; drop it (RMSNorm only scales)");
            }
            args.beta = column(op, "the bias", bias, cols)?;
            columns.push((args.beta, size_of::<G>()));
        }
        if let Some(mean) = &self.mean {
            if kind == NormKind::RmsNorm {
                invalid!("`{op}` computes no mean; save only rstd");
            }
            args.mean = per_row(op, "the mean", mean, rows)?;
        }
        if let Some(rstd) = &self.rstd {
            args.rstd = per_row(op, "rstd", rstd, rows)?;
        }
        Ok(column_bytes(weight, bias))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;
    use half::bf16;

    /// The parameter dtype and the addresses a forward call holds: weight, bias, residual,
    /// sum, mean, rstd (0 where absent).
    fn forward_parts<'a, G: Element>(call: Forward<'a, bf16, bf16, impl Into<Params<'a, G>>>) -> (DType, [u64; 6]) {
        let Params { weight, bias } = call.params.into();
        let (residual, sum) = call.residual.map_or((0, 0), |(r, s)| (r.address(), s.address()));
        let (mean, rstd) = (call.mean.map_or(0, |v| v.address()), call.rstd.map_or(0, |v| v.address()));
        (G::DTYPE, [weight.map_or(0, |v| v.address()), bias.map_or(0, |v| v.address()), residual, sum, mean, rstd])
    }

    /// The parameter dtype and the addresses a backward call holds: weight, dweight, dbias,
    /// mean (0 where absent).
    fn backward_parts<'a, G: Element>(call: Backward<'a, bf16, impl Into<GradParams<'a, G>>>) -> (DType, [u64; 4]) {
        let GradParams { weight, dweight, dbias } = call.params.into();
        let mean = call.mean.map_or(0, |v| v.address());
        (
            G::DTYPE,
            [
                weight.map_or(0, |v| v.address()),
                dweight.map_or(0, |v| v.address()),
                dbias.map_or(0, |v| v.address()),
                mean,
            ],
        )
    }

    #[test]
    fn forward_keeps_every_part_whatever_the_order() {
        let x = View::<bf16>::detached(0x10, &[4, 8]);
        let mut y = ViewMut::<bf16>::detached(0x20, &[4, 8]);
        let (w, b) = (View::<bf16>::detached(0x30, &[8]), View::<bf16>::detached(0x40, &[8]));
        let r = View::<bf16>::detached(0x50, &[4, 8]);
        let mut sum = ViewMut::<bf16>::detached(0x60, &[4, 8]);
        let mut mean = ViewMut::<f32>::detached(0x70, &[4]);
        let mut rstd = ViewMut::<f32>::detached(0x80, &[4]);
        let all = (DType::BF16, [0x30, 0x40, 0x50, 0x60, 0x70, 0x80]);
        let call = Forward::new(&x, &mut y).weight(&w).bias(&b).residual(&r, &mut sum);
        assert_eq!(forward_parts(call.save_mean(&mut mean).save_rstd(&mut rstd)), all);
        let call = Forward::new(&x, &mut y).save_rstd(&mut rstd).residual(&r, &mut sum).save_mean(&mut mean);
        assert_eq!(forward_parts(call.bias(&b).weight(&w)), all);
        // The bias alone fixes the dtype; without weight or bias the f32 kernels run.
        assert_eq!(forward_parts(Forward::new(&x, &mut y).bias(&b)), (DType::BF16, [0, 0x40, 0, 0, 0, 0]));
        assert_eq!(forward_parts(Forward::new(&x, &mut y).save_rstd(&mut rstd)), (DType::F32, [0, 0, 0, 0, 0, 0x80]));
    }

    #[test]
    fn backward_keeps_every_part_whatever_the_order() {
        let (x, dy) = (View::<bf16>::detached(0x10, &[4, 8]), View::<bf16>::detached(0x20, &[4, 8]));
        let (mean, rstd) = (View::<f32>::detached(0x30, &[4]), View::<f32>::detached(0x40, &[4]));
        let mut dx = ViewMut::<bf16>::detached(0x50, &[4, 8]);
        let w = View::<bf16>::detached(0x60, &[8]);
        let mut dw = ViewMut::<bf16>::detached(0x70, &[8]);
        let mut db = ViewMut::<bf16>::detached(0x80, &[8]);
        let all = (DType::BF16, [0x60, 0x70, 0x80, 0x30]);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).weight(&w).dweight(&mut dw).dbias(&mut db);
        assert_eq!(backward_parts(call.mean(&mean)), all);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).dbias(&mut db).mean(&mean).dweight(&mut dw);
        assert_eq!(backward_parts(call.weight(&w)), all);
        let call = Backward::new(&x, &dy, &rstd, &mut dx).dweight(&mut dw).weight(&w);
        assert_eq!(backward_parts(call.dbias(&mut db).mean(&mean)), all);
        // Gradients without a weight fix the dtype; without any the f32 kernels run.
        assert_eq!(
            backward_parts(Backward::new(&x, &dy, &rstd, &mut dx).dbias(&mut db)),
            (DType::BF16, [0, 0, 0x80, 0])
        );
        assert_eq!(backward_parts(Backward::new(&x, &dy, &rstd, &mut dx).mean(&mean)), (DType::F32, [0, 0, 0, 0x30]));
    }
}
