//! BatchNorm against an f64 reference: every layout, dtype and activation; training (with
//! the running statistics and the saved ones), eval, the backward, the mask bits, offset
//! views, and bad input. Errors are measured against the output's RMS (normalized values
//! cross zero, so a relative error per element would measure nothing but the crossing).

use crate::harness::{Measured, Suite, view_at, view_mut_at};
use half::{bf16, f16};
use rill::batch_norm::{self, Backward, Forward, Layout, Options, mask_words};
use rill::{Element, Tensor};
use rill_tests::check::{max_error_with_floor, tolerance};
use rill_tests::random::{Domain, Rng};

pub fn run(suite: &mut Suite) {
    matrix::<f32>(suite);
    matrix::<f16>(suite);
    matrix::<bf16>(suite);
    mask_of_stored_y::<f32>(suite);
    mask_of_stored_y::<f16>(suite);
    mask_of_stored_y::<bf16>(suite);
    relu_ops::<f32>(suite);
    relu_ops::<bf16>(suite);
    finite_differences(suite);
    bad_input(suite);
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Act {
    None,
    Relu,
    AddRelu,
}

const SHAPES_FIRST: [&[usize]; 6] =
    [&[2, 3, 7, 7], &[1, 17, 56, 56], &[4, 64, 7, 7], &[3, 5], &[2, 1, 33], &[5, 2048, 1, 1]];
const SHAPES_LAST: [&[usize]; 5] = [&[2, 7, 7, 3], &[4, 17], &[2, 56, 56, 64], &[3, 1, 1, 2048], &[33, 1]];

fn matrix<T: Element>(suite: &mut Suite) {
    for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
        let shapes: &[&[usize]] = if layout == Layout::ChannelsFirst { &SHAPES_FIRST } else { &SHAPES_LAST };
        for &shape in shapes {
            for act in [Act::None, Act::Relu, Act::AddRelu] {
                for offset in [0, 1] {
                    let name = format!("batch_norm/{:?}/{}/{shape:?}/{act:?}/offset{offset}", layout, T::DTYPE.name());
                    suite.case(&name, tolerance(T::DTYPE) * 4.0, |suite, rng| {
                        train::<T>(suite, rng, layout, shape, act, offset)
                    });
                }
            }
            let name = format!("batch_norm/{:?}/{}/{shape:?}/eval", layout, T::DTYPE.name());
            suite.case(&name, tolerance(T::DTYPE) * 4.0, |suite, rng| eval::<T>(suite, rng, layout, shape));
        }
    }
}

/// `(outer, channels, inner)` and element `i`'s channel.
pub(crate) fn extent(shape: &[usize], layout: Layout) -> (usize, usize, usize) {
    let all: usize = shape.iter().product();
    match layout {
        Layout::ChannelsFirst => (shape[0], shape[1], all / (shape[0] * shape[1]).max(1)),
        Layout::ChannelsLast => (all / shape[shape.len() - 1], shape[shape.len() - 1], 1),
    }
}

pub(crate) fn channel_of(i: usize, (_, channels, inner): (usize, usize, usize)) -> usize {
    (i / inner) % channels
}

/// The worst of several comparisons, each against its own RMS floor.
fn worst(parts: &[(&str, Measured)]) -> Measured {
    let (name, m) = parts.iter().max_by(|a, b| a.1.error.total_cmp(&b.1.error)).expect("parts");
    Measured { error: m.error, detail: format!("{name}: {}", m.detail) }
}

fn rms(values: &[f64]) -> f64 {
    (values.iter().map(|w| w * w).sum::<f64>() / values.len().max(1) as f64).sqrt().max(1e-30)
}

fn against_rms<T: Element>(got: &[T], want: &[f64]) -> Measured {
    against_floor(got, want, rms(want))
}

fn against_floor<T: Element>(got: &[T], want: &[f64], floor: f64) -> Measured {
    match max_error_with_floor(got, want, |_| floor) {
        Some(w) => {
            Measured { error: w.error, detail: format!("element {}: got {:e}, want {:e}", w.index, w.got, w.want) }
        }
        None => Measured { error: 0.0, detail: "empty".into() },
    }
}

pub(crate) struct Stats {
    pub(crate) mean: Vec<f64>,
    pub(crate) var: Vec<f64>,
}

pub(crate) fn batch_stats(x: &[f64], ext: (usize, usize, usize)) -> Stats {
    let (outer, channels, inner) = ext;
    let count = (outer * inner) as f64;
    let mut mean = vec![0.0; channels];
    for (i, &v) in x.iter().enumerate() {
        mean[channel_of(i, ext)] += v / count;
    }
    let mut var = vec![0.0; channels];
    for (i, &v) in x.iter().enumerate() {
        let c = channel_of(i, ext);
        var[c] += (v - mean[c]) * (v - mean[c]) / count;
    }
    Stats { mean, var }
}

fn to_f64<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|e| e.to_f64()).collect()
}

fn train<T: Element>(
    suite: &mut Suite,
    rng: &mut Rng,
    layout: Layout,
    shape: &[usize],
    act: Act,
    offset: usize,
) -> rill::Result<Measured> {
    let ext @ (_, channels, _) = extent(shape, layout);
    let len: usize = shape.iter().product();
    let eps = 1e-5;
    let x: Vec<T> = Suite::random(rng, Domain::Symmetric(2.0), len);
    let addend: Vec<T> = Suite::random(rng, Domain::Symmetric(1.0), len);
    let dy: Vec<T> = Suite::random(rng, Domain::Symmetric(1.0), len);
    let weight: Vec<f32> = Suite::random(rng, Domain::AwayFromZero(0.5, 1.5), channels);
    let bias: Vec<f32> = Suite::random(rng, Domain::Symmetric(0.5), channels);
    let running: Vec<f32> = Suite::random(rng, Domain::Symmetric(1.0), channels);
    let running_var: Vec<f32> =
        Suite::random::<f32>(rng, Domain::AwayFromZero(0.5, 2.0), channels).iter().map(|v| v.abs()).collect();

    let x_dev = suite.upload(&x, offset)?;
    let addend_dev = suite.upload(&addend, offset)?;
    let dy_dev = suite.upload(&dy, offset)?;
    let mut y_dev = suite.poisoned::<T>(len, offset)?;
    let mut mask_dev = Tensor::from_slice(&suite.gpu, &vec![0xA5A5_A5A5u32; mask_words(len)], &[mask_words(len)])?;
    let w_dev = Tensor::from_slice(&suite.gpu, &weight, &[channels])?;
    let b_dev = Tensor::from_slice(&suite.gpu, &bias, &[channels])?;
    let mut rm_dev = Tensor::from_slice(&suite.gpu, &running, &[channels])?;
    let mut rv_dev = Tensor::from_slice(&suite.gpu, &running_var, &[channels])?;
    let mut mean_dev = suite.poisoned::<f32>(channels, 0)?;
    let mut invstd_dev = suite.poisoned::<f32>(channels, 0)?;
    let mut batches = 0u64;
    {
        let xv = view_at(&x_dev, offset, shape)?;
        let av = view_at(&addend_dev, offset, shape)?;
        let mut yv = view_mut_at(&mut y_dev, offset, shape)?;
        let call = Forward::new(&xv, &mut yv, layout)
            .weight(&w_dev)
            .bias(&b_dev)
            .running(&mut rm_dev, &mut rv_dev, &mut batches)
            .save(&mut mean_dev, &mut invstd_dev);
        let call = match act {
            Act::None => call,
            Act::Relu => call.relu(Some(&mut mask_dev)),
            Act::AddRelu => call.add_relu(&av, Some(&mut mask_dev)),
        };
        batch_norm::forward(&suite.stream, Options { momentum: Some(0.1), ..Options::training() }, call)?;
    }
    let y_got = y_dev.to_vec()?[offset..].to_vec();
    let mask = mask_dev.to_vec()?;

    let xf = to_f64(&x);
    let stats = batch_stats(&xf, ext);
    let invstd: Vec<f64> = stats.var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
    let y_want = reference_forward(&xf, &to_f64(&addend), (&weight, &bias), ext, act);
    let count = (len / channels) as f64;
    let rm_want: Vec<f64> = (0..channels).map(|c| 0.9 * running[c] as f64 + 0.1 * stats.mean[c]).collect();
    let rv_want: Vec<f64> =
        (0..channels).map(|c| 0.9 * running_var[c] as f64 + 0.1 * stats.var[c] * count / (count - 1.0)).collect();
    // Means are measured against the data's spread (they are near 0 for centered data).
    let spread = (stats.var.iter().sum::<f64>() / channels as f64).sqrt();
    let mut parts = vec![
        ("y", against_rms(&y_got, &y_want)),
        ("saved mean", against_floor(&mean_dev.to_vec()?, &stats.mean, spread)),
        ("saved invstd", against_rms(&invstd_dev.to_vec()?, &invstd)),
        ("running mean", against_floor(&rm_dev.to_vec()?, &rm_want, spread)),
        ("running var", against_rms(&rv_dev.to_vec()?, &rv_want)),
    ];
    // The mask is exactly the GPU's own `y > 0`, every bit, and nothing past the last element.
    let bit = |i: usize| mask[i / 32] >> (i % 32) & 1 == 1;
    if act != Act::None {
        let wrong = (0..mask.len() * 32).find(|&i| bit(i) != (i < len && y_got[i].to_f64() > 0.0));
        if let Some(i) = wrong {
            return Ok(Measured { error: f64::INFINITY, detail: format!("mask bit {i} is {}", bit(i)) });
        }
    }

    // Backward through the same mask.
    let mut dx_dev = suite.poisoned::<T>(len, offset)?;
    let mut da_dev = suite.poisoned::<T>(len, offset)?;
    let mut dw_dev = suite.poisoned::<f32>(channels, 0)?;
    let mut db_dev = suite.poisoned::<f32>(channels, 0)?;
    {
        let xv = view_at(&x_dev, offset, shape)?;
        let dyv = view_at(&dy_dev, offset, shape)?;
        let mut dxv = view_mut_at(&mut dx_dev, offset, shape)?;
        let mut dav = view_mut_at(&mut da_dev, offset, shape)?;
        let call = Backward::new(&dyv, &xv, &mut dxv, layout, (&mean_dev, &invstd_dev))
            .weight(&w_dev)
            .dweight(&mut dw_dev)
            .dbias(&mut db_dev);
        let call = match act {
            Act::None => call,
            Act::Relu => call.relu(&mask_dev),
            Act::AddRelu => call.add_relu(&mask_dev, &mut dav),
        };
        batch_norm::backward(&suite.stream, call)?;
    }
    // The backward is a function of the saved statistics it is given (f32), not of the
    // exact ones: their rounding, amplified by invstd in a nearly constant channel, is the
    // forward's error, measured above.
    let saved_mean: Vec<f64> = mean_dev.to_vec()?.iter().map(|&v| v as f64).collect();
    let saved_invstd: Vec<f64> = invstd_dev.to_vec()?.iter().map(|&v| v as f64).collect();
    let g: Vec<f64> = (0..len).map(|i| if act == Act::None || bit(i) { dy[i].to_f64() } else { 0.0 }).collect();
    let (mut sum_g, mut sum_gx) = (vec![0.0; channels], vec![0.0; channels]);
    // Each channel's sum of squared terms: the scale of its sum for random data.
    let (mut squares_g, mut squares_gx) = (vec![0.0; channels], vec![0.0; channels]);
    for i in 0..len {
        let c = channel_of(i, ext);
        let gx = g[i] * (xf[i] - saved_mean[c]) * saved_invstd[c];
        sum_g[c] += g[i];
        sum_gx[c] += gx;
        squares_g[c] += g[i] * g[i];
        squares_gx[c] += gx * gx;
    }
    let dx_want: Vec<f64> = (0..len)
        .map(|i| {
            let c = channel_of(i, ext);
            let xhat = (xf[i] - saved_mean[c]) * saved_invstd[c];
            weight[c] as f64 * saved_invstd[c] / count * (count * g[i] - sum_g[c] - xhat * sum_gx[c])
        })
        .collect();
    // dx cancels its terms `weight invstd g` (the more so the fewer values a channel has), so
    // its error is measured against their RMS.
    let terms: Vec<f64> =
        (0..len).map(|i| weight[channel_of(i, ext)] as f64 * saved_invstd[channel_of(i, ext)] * g[i]).collect();
    parts.push(("dx", against_floor(&dx_dev.to_vec()?[offset..], &dx_want, rms(&terms).max(rms(&dx_want)))));
    // A channel's sum of random terms may cancel far below its terms (dbias of 33 values
    // summing to 4e-3), leaving f32 rounding alone above the tolerance: measure against the
    // sums' scale, sqrt of the squared terms, as well as their values.
    let scale = |squares: &[f64]| rms(&squares.iter().map(|s| s.sqrt()).collect::<Vec<_>>());
    parts.push(("dweight", against_floor(&dw_dev.to_vec()?, &sum_gx, rms(&sum_gx).max(scale(&squares_gx)))));
    parts.push(("dbias", against_floor(&db_dev.to_vec()?, &sum_g, rms(&sum_g).max(scale(&squares_g)))));
    if act == Act::AddRelu {
        parts.push(("d(addend)", against_rms(&da_dev.to_vec()?[offset..], &g)));
    }
    Ok(worst(&parts))
}

/// `act(bn(x) [+ addend])` in training, in f64; the ReLU as PyTorch's, NaN at NaN.
pub(crate) fn reference_forward(
    x: &[f64],
    addend: &[f64],
    (weight, bias): (&[f32], &[f32]),
    ext: (usize, usize, usize),
    act: Act,
) -> Vec<f64> {
    let stats = batch_stats(x, ext);
    (0..x.len())
        .map(|i| {
            let c = channel_of(i, ext);
            let mut y = (x[i] - stats.mean[c]) / (stats.var[c] + 1e-5).sqrt() * weight[c] as f64 + bias[c] as f64;
            if act == Act::AddRelu {
                y += addend[i];
            }
            if act != Act::None && y <= 0.0 { 0.0 } else { y }
        })
        .collect()
}

/// The backward's dx against central differences of the f64 forward: `dL/dx_i` for
/// `L = sum(dy * y)`, a step of 1e-6 (far below any ReLU kink the data come near).
fn finite_differences(suite: &mut Suite) {
    for (layout, shape) in [(Layout::ChannelsFirst, &[2usize, 3, 5][..]), (Layout::ChannelsLast, &[7, 4][..])] {
        for act in [Act::None, Act::Relu, Act::AddRelu] {
            let name = format!("batch_norm/finite_differences/{layout:?}/{shape:?}/{act:?}");
            suite.case(&name, 1e-4, |suite, rng| {
                let ext @ (_, channels, _) = extent(shape, layout);
                let len: usize = shape.iter().product();
                let x: Vec<f32> = Suite::random(rng, Domain::Symmetric(2.0), len);
                let addend: Vec<f32> = Suite::random(rng, Domain::Symmetric(1.0), len);
                let dy: Vec<f32> = Suite::random(rng, Domain::Symmetric(1.0), len);
                let weight: Vec<f32> = Suite::random(rng, Domain::AwayFromZero(0.5, 1.5), channels);
                let bias: Vec<f32> = Suite::random(rng, Domain::Symmetric(0.5), channels);
                let (x_dev, a_dev, dy_dev) = (suite.upload(&x, 0)?, suite.upload(&addend, 0)?, suite.upload(&dy, 0)?);
                let (w_dev, b_dev) = (
                    Tensor::from_slice(&suite.gpu, &weight, &[channels])?,
                    Tensor::from_slice(&suite.gpu, &bias, &[channels])?,
                );
                let mut y_dev = Tensor::<f32>::zeros(&suite.gpu, shape)?;
                let mut mask = Tensor::<u32>::zeros(&suite.gpu, &[mask_words(len)])?;
                let (mut mean, mut invstd) = (suite.poisoned::<f32>(channels, 0)?, suite.poisoned::<f32>(channels, 0)?);
                let x_view = x_dev.view().reshape(shape)?;
                let call =
                    Forward::new(&x_view, &mut y_dev, layout).weight(&w_dev).bias(&b_dev).save(&mut mean, &mut invstd);
                let a_view = a_dev.view().reshape(shape)?;
                let call = match act {
                    Act::None => call,
                    Act::Relu => call.relu(Some(&mut mask)),
                    Act::AddRelu => call.add_relu(&a_view, Some(&mut mask)),
                };
                batch_norm::forward(&suite.stream, Options::training(), call)?;
                let mut dx = suite.poisoned::<f32>(len, 0)?;
                let mut da = Tensor::<f32>::zeros(&suite.gpu, shape)?;
                let dy_view = dy_dev.view().reshape(shape)?;
                let mut dx_view = view_mut_at(&mut dx, 0, shape)?;
                let call = Backward::new(&dy_view, &x_view, &mut dx_view, layout, (&mean, &invstd)).weight(&w_dev);
                let call = match act {
                    Act::None => call,
                    Act::Relu => call.relu(&mask),
                    Act::AddRelu => call.add_relu(&mask, &mut da),
                };
                batch_norm::backward(&suite.stream, call)?;
                let (xf, af, dyf) = (to_f64(&x), to_f64(&addend), to_f64(&dy));
                let loss = |x: &[f64]| -> f64 {
                    reference_forward(x, &af, (&weight, &bias), ext, act).iter().zip(&dyf).map(|(y, d)| y * d).sum()
                };
                let h = 1e-6;
                let want: Vec<f64> = (0..len)
                    .map(|i| {
                        let (mut up, mut down) = (xf.clone(), xf.clone());
                        up[i] += h;
                        down[i] -= h;
                        (loss(&up) - loss(&down)) / (2.0 * h)
                    })
                    .collect();
                Ok(against_rms(&dx.to_vec()?, &want))
            });
        }
    }
}

/// A y that is positive in f32 but rounds to 0 in `T` (weight 0, bias 1e-8: every element)
/// has its mask bit clear, as PyTorch's ReLU backward reads the stored y.
fn mask_of_stored_y<T: Element>(suite: &mut Suite) {
    let name = format!("batch_norm/mask_of_stored_y/{}", T::DTYPE.name());
    // Exact: the error is 0 or infinite.
    suite.case(&name, 1.0, |suite, rng| {
        let (shape, channels) = ([3, 7, 5, 16], 16);
        let len: usize = shape.iter().product();
        let x: Vec<T> = Suite::random(rng, Domain::Symmetric(2.0), len);
        let x_dev = suite.upload(&x, 0)?;
        let mut y_dev = suite.poisoned::<T>(len, 0)?;
        let mut mask_dev = Tensor::from_slice(&suite.gpu, &vec![0xA5A5_A5A5u32; mask_words(len)], &[mask_words(len)])?;
        let (zeros, tiny) = (vec![0.0f32; channels], vec![1e-8f32; channels]);
        let (w_dev, b_dev) =
            (Tensor::from_slice(&suite.gpu, &zeros, &[channels])?, Tensor::from_slice(&suite.gpu, &tiny, &[channels])?);
        let mut rm_dev = Tensor::from_slice(&suite.gpu, &zeros, &[channels])?;
        let mut rv_dev = Tensor::from_slice(&suite.gpu, &vec![1.0f32; channels], &[channels])?;
        let mut batches = 0;
        {
            let xv = view_at(&x_dev, 0, &shape)?;
            let mut yv = view_mut_at(&mut y_dev, 0, &shape)?;
            let call = Forward::new(&xv, &mut yv, Layout::ChannelsLast)
                .weight(&w_dev)
                .bias(&b_dev)
                .running(&mut rm_dev, &mut rv_dev, &mut batches)
                .relu(Some(&mut mask_dev));
            batch_norm::forward(&suite.stream, Options::eval(), call)?;
        }
        let (y, mask) = (y_dev.to_vec()?, mask_dev.to_vec()?);
        let wrong = (0..len).find(|&i| (mask[i / 32] >> (i % 32) & 1 == 1) != (y[i].to_f64() > 0.0));
        Ok(match wrong {
            Some(i) => Measured { error: f64::INFINITY, detail: format!("mask bit {i} against y = {}", y[i].to_f64()) },
            None => Measured { error: 0.0, detail: String::new() },
        })
    });
}

fn eval<T: Element>(suite: &mut Suite, rng: &mut Rng, layout: Layout, shape: &[usize]) -> rill::Result<Measured> {
    let (_, channels, _) = extent(shape, layout);
    let ext = extent(shape, layout);
    let len: usize = shape.iter().product();
    let x: Vec<T> = Suite::random(rng, Domain::Symmetric(2.0), len);
    let running: Vec<f32> = Suite::random(rng, Domain::Symmetric(1.0), channels);
    let running_var: Vec<f32> =
        Suite::random::<f32>(rng, Domain::AwayFromZero(0.5, 2.0), channels).iter().map(|v| v.abs()).collect();
    let x_dev = suite.upload(&x, 0)?;
    let mut y_dev = suite.poisoned::<T>(len, 0)?;
    let mut rm_dev = Tensor::from_slice(&suite.gpu, &running, &[channels])?;
    let mut rv_dev = Tensor::from_slice(&suite.gpu, &running_var, &[channels])?;
    let mut batches = 0;
    {
        let xv = view_at(&x_dev, 0, shape)?;
        let mut yv = view_mut_at(&mut y_dev, 0, shape)?;
        let call = Forward::new(&xv, &mut yv, layout).running(&mut rm_dev, &mut rv_dev, &mut batches);
        batch_norm::forward(&suite.stream, Options::eval(), call)?;
    }
    let want: Vec<f64> = (0..len)
        .map(|i| {
            let c = channel_of(i, ext);
            (x[i].to_f64() - running[c] as f64) / (running_var[c] as f64 + 1e-5).sqrt()
        })
        .collect();
    let unchanged = rm_dev.to_vec()? == running && rv_dev.to_vec()? == running_var && batches == 0;
    if !unchanged {
        return Ok(Measured { error: f64::INFINITY, detail: "eval changed the running statistics".into() });
    }
    Ok(against_rms(&y_dev.to_vec()?, &want))
}

/// The standalone ReLU with a mask, its backward from the mask, and the one from y.
fn relu_ops<T: Element>(suite: &mut Suite) {
    for len in [1usize, 31, 33, 1000, 4097, 1 << 20] {
        for offset in [0, 1] {
            let name = format!("batch_norm/relu_ops/{}/{len}/offset{offset}", T::DTYPE.name());
            suite.case(&name, tolerance(T::DTYPE), |suite, rng| {
                let x: Vec<T> = Suite::random(rng, Domain::Symmetric(1.0), len);
                let dy: Vec<T> = Suite::random(rng, Domain::Symmetric(1.0), len);
                let (x_dev, dy_dev) = (suite.upload(&x, offset)?, suite.upload(&dy, offset)?);
                let mut y_dev = suite.poisoned::<T>(len, offset)?;
                let mut mask_dev =
                    Tensor::from_slice(&suite.gpu, &vec![0xA5A5_A5A5u32; mask_words(len)], &[mask_words(len)])?;
                let (mut dx_mask, mut dx_y) = (suite.poisoned::<T>(len, offset)?, suite.poisoned::<T>(len, offset)?);
                let shape = [len];
                let view = |t| view_at(t, offset, &shape);
                {
                    let xv = view(&x_dev)?;
                    let mut yv = view_mut_at(&mut y_dev, offset, &[len])?;
                    batch_norm::relu_with_mask(&suite.stream, &xv, &mut yv, &mut mask_dev)?;
                }
                {
                    let (dyv, yv) = (view(&dy_dev)?, view(&y_dev)?);
                    let mut a = view_mut_at(&mut dx_mask, offset, &[len])?;
                    batch_norm::relu_backward_from_mask(&suite.stream, &dyv, &mask_dev, &mut a)?;
                    let mut b = view_mut_at(&mut dx_y, offset, &[len])?;
                    batch_norm::relu_backward(&suite.stream, &dyv, &yv, &mut b)?;
                }
                let mask = mask_dev.to_vec()?;
                let bit = |i: usize| mask[i / 32] >> (i % 32) & 1 == 1;
                if let Some(i) = (0..mask.len() * 32).find(|&i| bit(i) != (i < len && x[i].to_f64() > 0.0)) {
                    return Ok(Measured { error: f64::INFINITY, detail: format!("mask bit {i}") });
                }
                let y_want: Vec<f64> = x.iter().map(|v| v.to_f64().max(0.0)).collect();
                let dx_want: Vec<f64> =
                    (0..len).map(|i| if x[i].to_f64() > 0.0 { dy[i].to_f64() } else { 0.0 }).collect();
                Ok(worst(&[
                    ("y", against_rms(&y_dev.to_vec()?[offset..], &y_want)),
                    ("dx from mask", against_rms(&dx_mask.to_vec()?[offset..], &dx_want)),
                    ("dx from y", against_rms(&dx_y.to_vec()?[offset..], &dx_want)),
                ]))
            });
        }
    }
}

fn bad_input(suite: &mut Suite) {
    suite.rejects("batch_norm/bad/one value per channel", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[1, 4])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[1, 4])?;
        batch_norm::forward(&suite.stream, Options::training(), Forward::new(&x, &mut y, Layout::ChannelsFirst))
    });
    suite.rejects("batch_norm/bad/weight length", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 3])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 3])?;
        let w = Tensor::<f32>::zeros(&suite.gpu, &[3])?;
        batch_norm::forward(
            &suite.stream,
            Options::training(),
            Forward::new(&x, &mut y, Layout::ChannelsFirst).weight(&w),
        )
    });
    suite.rejects("batch_norm/bad/mask size", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 33])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 33])?;
        let mut mask = Tensor::<u32>::zeros(&suite.gpu, &[8])?;
        let call = Forward::new(&x, &mut y, Layout::ChannelsFirst).relu(Some(&mut mask));
        batch_norm::forward(&suite.stream, Options::training(), call)
    });
    suite.rejects("batch_norm/bad/eval without running statistics", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[2, 4])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[2, 4])?;
        batch_norm::forward(&suite.stream, Options::eval(), Forward::new(&x, &mut y, Layout::ChannelsLast))
    });
    suite.rejects("batch_norm/bad/one dimension", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[8])?;
        batch_norm::forward(&suite.stream, Options::training(), Forward::new(&x, &mut y, Layout::ChannelsFirst))
    });
    suite.rejects("batch_norm/bad/addend shape", |suite| {
        let x = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 3])?;
        let a = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 2])?;
        let mut y = Tensor::<f32>::zeros(&suite.gpu, &[2, 4, 3])?;
        let call = Forward::new(&x, &mut y, Layout::ChannelsFirst).add_relu(&a, None::<&mut Tensor<u32>>);
        batch_norm::forward(&suite.stream, Options::training(), call)
    });
}
