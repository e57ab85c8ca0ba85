//! The host side of a user's fused kernel: `softmax(q * scale[row] + bias)` from int8
//! logits to bf16 probabilities in one launch, through rill's planner and launcher; and the
//! unfused chain it replaces (dequantize to bf16, then rill's softmax), for the benchmark.
//! The same dequantization fused into LayerNorm and RMSNorm, and a user's elementwise
//! functor (squared ReLU).

use half::bf16;
use rill::fuse::{FusedModule, FusedSoftmax, RowArray};
use rill::norm::{NormKind, NormParts};
use rill::softmax::{PathKind, Plan};
use rill::{AsView, AsViewMut, Element, Gpu, LaunchConfig, Result, Stream, View, ViewMut};
pub use rill_example_dequant_kernels::{Dequant, Dequantize, PACK};

/// The example's PTX, built from `kernels/` by `build.rs`.
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/dequant.ptx"));

/// The loaded kernels.
pub struct DequantKernels {
    module: FusedModule,
    force: Option<PathKind>,
}

impl DequantKernels {
    pub fn load(gpu: &Gpu) -> Result<DequantKernels> {
        Ok(DequantKernels { module: FusedModule::load(gpu, PTX)?, force: None })
    }

    /// The loaded module, for launching its kernels as they are.
    pub fn module(&self) -> &FusedModule {
        &self.module
    }

    /// Runs the fused kernel on `path` (an error where the shape does not fit it).
    pub fn forced(self, path: PathKind) -> DequantKernels {
        DequantKernels { force: Some(path), ..self }
    }

    fn fused(&self) -> Result<FusedSoftmax<'_, Dequant>> {
        let fused = self.module.softmax::<Dequant>("dequant_softmax")?;
        Ok(match self.force {
            Some(path) => fused.forced(path),
            None => fused,
        })
    }

    /// `out = softmax(logits * scale[row] + bias)` over the last axis, in one kernel.
    pub fn dequant_softmax(
        &self,
        stream: &Stream,
        logits: &impl AsView<i8>,
        scale: &impl AsView<f32>,
        bias: &impl AsView<bf16>,
        out: &mut impl AsViewMut<bf16>,
    ) -> Result<Plan> {
        let (arrays, rows, cols) = checked(logits, scale, bias, out)?;
        // SAFETY: `checked` matched every array to the view and its element alignment; the
        // views borrow them for the call, and the kernel runs in stream order.
        unsafe { self.fused()?.run(stream, (rows, cols), &along_rows(&arrays), arrays) }
    }

    /// `out = kind(logits * scale[row] + bias) * weight (+ norm_bias)` over the last axis, in
    /// one kernel: `parts` holds the norm's f32 weight and bias and the per-row outputs.
    pub fn dequant_norm(
        &self,
        stream: &Stream,
        kind: NormKind,
        (logits, scale, bias): (&impl AsView<i8>, &impl AsView<f32>, &impl AsView<bf16>),
        parts: NormParts<'_, f32>,
        out: &mut impl AsViewMut<bf16>,
    ) -> Result<Plan> {
        let (arrays, rows, cols) = checked(logits, scale, bias, out)?;
        let mut fused = self.module.norm::<Dequant, f32>("dequant_norm")?;
        if let Some(path) = self.force {
            fused = fused.forced(path);
        }
        // SAFETY: as in `dequant_softmax`.
        unsafe { fused.run(stream, kind, 1e-5, (rows, cols), &along_rows(&arrays), parts, arrays) }
    }

    /// `y = max(x, 0)^2`, the user's own elementwise functor (f32 or bf16 in; the input's
    /// dtype or, from f32, bf16 out).
    pub fn squared_relu<I: Element, O: Element>(
        &self,
        stream: &Stream,
        x: &impl AsView<I>,
        y: &mut impl AsViewMut<O>,
    ) -> Result<()> {
        let x: View<'_, I> = x.as_view();
        self.module.elementwise::<I, O>("squared_relu")?.run(stream, &[x], y)
    }

    /// The unfused chain: `dequantized = logits * scale[row] + bias` as bf16 (a kernel of
    /// its own), then rill's softmax of it into `out`.
    pub fn dequantize_then_softmax(
        &self,
        stream: &Stream,
        inputs: (&impl AsView<i8>, &impl AsView<f32>, &impl AsView<bf16>),
        dequantized: &mut impl AsViewMut<bf16>,
        out: &mut impl AsViewMut<bf16>,
    ) -> Result<Plan> {
        self.dequantize(stream, inputs, dequantized)?;
        rill::softmax::softmax(stream, &dequantized.as_view_mut(), out)
    }

    /// The unfused chain's first kernel: `dequantized = logits * scale[row] + bias` as bf16.
    pub fn dequantize(
        &self,
        stream: &Stream,
        (logits, scale, bias): (&impl AsView<i8>, &impl AsView<f32>, &impl AsView<bf16>),
        dequantized: &mut impl AsViewMut<bf16>,
    ) -> Result<()> {
        let (arrays, rows, cols) = checked(logits, scale, bias, dequantized)?;
        if cols % PACK != 0 || [arrays.logits, arrays.bias / 2, arrays.out / 2].iter().any(|a| a % PACK as u64 != 0) {
            return Err(rill::Error::Unsupported(format!(
                "the plain dequantize kernel takes rows of a multiple of {PACK} columns, aligned"
            )));
        }
        let config = LaunchConfig { grid: rows.min(65535) as u32, block: 256, shared_bytes: 0, cluster: 1 };
        let params = Dequantize { arrays, rows: rows as u64, cols: cols as u64 };
        // SAFETY: as in `dequant_softmax`, and the pack alignment the kernel needs is checked.
        unsafe { self.module.launch(stream, "dequantize", config, &params) }
    }
}

/// The arrays the fused kernels access in packs along the rows.
fn along_rows(arrays: &Dequant) -> [RowArray; 3] {
    [
        RowArray { address: arrays.logits, element_bytes: 1 },
        RowArray { address: arrays.bias, element_bytes: 2 },
        RowArray { address: arrays.out, element_bytes: 2 },
    ]
}

/// The device addresses, rows and columns of a call whose arrays all match: logits and
/// output `(..., cols)`, a scale per row, a bias per column.
fn checked(
    logits: &impl AsView<i8>,
    scale: &impl AsView<f32>,
    bias: &impl AsView<bf16>,
    out: &mut impl AsViewMut<bf16>,
) -> Result<(Dequant, usize, usize)> {
    let (logits, scale, bias, out): (_, _, _, ViewMut<'_, bf16>) =
        (logits.as_view(), scale.as_view(), bias.as_view(), out.as_view_mut());
    let invalid = |message: String| Err(rill::Error::InvalidInput(message));
    let Some((&cols, outer)) = logits.shape().split_last() else {
        return invalid("the logits need at least one axis".into());
    };
    let rows: usize = outer.iter().product();
    if out.shape() != logits.shape() {
        return invalid(format!(
            "the output has shape {:?}, the logits {:?}: give it theirs",
            out.shape(),
            logits.shape()
        ));
    }
    if scale.len() != rows || bias.len() != cols {
        return invalid(format!(
            "the scale has {} elements and the bias {}: give one f32 per row ({rows}) and one bf16 per column ({cols})",
            scale.len(),
            bias.len()
        ));
    }
    let arrays = Dequant { logits: logits.address(), scale: scale.address(), bias: bias.address(), out: out.address() };
    Ok((arrays, rows, cols))
}
