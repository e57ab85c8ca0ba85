//! BatchNorm in training, fused with ReLU and with Add + ReLU, at ResNet's shapes: forward,
//! backward, and both; and the mask-based ReLU backward against the one that reads `y`.
//!
//! Bytes moved are what the kernels actually read and write, passes included: the forward
//! reads x twice (the statistics, then the normalize) and writes y and the mask; the backward
//! reads dy, x and the mask twice (the sums, then dx) and writes dx (and d(addend)). The
//! path column states the passes. The per-channel statistics and parameters are not counted.

use crate::measure::Bench;
use rill::batch_norm::{self, Backward, Forward, Layout, Options, mask_words};
use rill::{DType, Element, Tensor};
use rill_tests::random::Rng;

/// The benchmark's shapes: `(N, C, L...)` for channels-first and `(N, L..., C)` for
/// channels-last, with their dtype.
const SHAPES: &[(&[usize], DType, Layout)] = &[
    (&[16, 32, 112, 112], DType::F32, Layout::ChannelsFirst),
    (&[256, 56, 56, 64], DType::F16, Layout::ChannelsLast),
    (&[256, 56, 56, 256], DType::BF16, Layout::ChannelsLast),
    (&[256, 7, 7, 2048], DType::F16, Layout::ChannelsLast),
    (&[256, 64, 56, 56], DType::F32, Layout::ChannelsFirst),
    (&[65536, 512], DType::BF16, Layout::ChannelsLast),
];

/// `--quick`: the article's shape.
const QUICK: usize = 1;

#[derive(Clone, Copy, PartialEq)]
enum Fusion {
    Relu,
    AddRelu,
}

#[derive(Clone, Copy, PartialEq)]
enum Pass {
    Forward,
    Backward,
    Both,
}

pub fn sweep<T: Element>(bench: &mut Bench) -> rill::Result<()> {
    let shapes = if bench.quick { &SHAPES[..QUICK] } else { SHAPES };
    let ops: Vec<(String, Fusion, Pass)> = [Fusion::Relu, Fusion::AddRelu]
        .into_iter()
        .flat_map(|fusion| [Pass::Forward, Pass::Backward, Pass::Both].map(|pass| (name(fusion, pass), fusion, pass)))
        .filter(|(name, ..)| bench.wants("batch_norm", name))
        .collect();
    let relu_ops: Vec<&str> =
        ["relu_backward_from_mask", "relu_backward"].into_iter().filter(|op| bench.wants("batch_norm", op)).collect();
    let shapes: Vec<_> = shapes.iter().filter(|(_, dtype, _)| *dtype == T::DTYPE).collect();
    if ops.is_empty() && relu_ops.is_empty() {
        return Ok(());
    }
    bench.plan(shapes.len() * (ops.len() + relu_ops.len() + 1));
    let gpu = bench.gpu.clone();
    for &&(shape, _, layout) in &shapes {
        let len: usize = shape.iter().product();
        let channels = if layout == Layout::ChannelsFirst { shape[1] } else { shape[shape.len() - 1] };
        let (size, words) = (size_of::<T>(), mask_words(len));
        let tensor = len * size;
        let mask = 4 * words;
        let sets = bench.buffer_sets(6 * tensor + mask);
        let mut rng = Rng::new(len as u64);
        let host: Vec<T> = (0..len).map(|_| T::from_f64(rng.uniform(-2.0, 2.0))).collect();
        let params: Vec<f32> = (0..channels).map(|_| rng.uniform(0.5, 1.5) as f32).collect();
        let (xs, addends, dys) =
            (bench.upload(sets, &host, shape)?, bench.upload(sets, &host, shape)?, bench.upload(sets, &host, shape)?);
        let (mut ys, mut dxs, mut daddends) =
            (bench.zeros(sets, shape)?, bench.zeros(sets, shape)?, bench.zeros(sets, shape)?);
        let mut masks = bench.zeros::<u32>(sets, &[words])?;
        let per_channel = || Tensor::<f32>::zeros(&gpu, &[channels]);
        let (weight, bias) =
            (Tensor::from_slice(&gpu, &params, &[channels])?, Tensor::from_slice(&gpu, &params, &[channels])?);
        let (mut running_mean, mut running_var, mut batches) = (per_channel()?, per_channel()?, 0u64);
        let (mut mean, mut invstd, mut dweight, mut dbias) =
            (per_channel()?, per_channel()?, per_channel()?, per_channel()?);
        let copy = bench.copy(&xs, &mut ys)?;
        let layout_name = if layout == Layout::ChannelsFirst { "channels-first" } else { "channels-last" };

        for (op, fusion, pass) in &ops {
            let add = if *fusion == Fusion::AddRelu { tensor } else { 0 };
            let forward_bytes = 3 * tensor + add + mask;
            let backward_bytes = 5 * tensor + add + 2 * mask;
            let (bytes, passes) = match pass {
                Pass::Forward => (forward_bytes, "x read twice"),
                Pass::Backward => (backward_bytes, "dy, x and mask read twice"),
                Pass::Both => (forward_bytes + backward_bytes, "forward then backward"),
            };
            let (micros, ()) = bench.time(sets, bytes, |stream, s| {
                if *pass != Pass::Backward {
                    let call = Forward::new(&xs[s], &mut ys[s], layout)
                        .weight(&weight)
                        .bias(&bias)
                        .running(&mut running_mean, &mut running_var, &mut batches)
                        .save(&mut mean, &mut invstd);
                    let call = match fusion {
                        Fusion::Relu => call.relu(Some(&mut masks[s])),
                        Fusion::AddRelu => call.add_relu(&addends[s], Some(&mut masks[s])),
                    };
                    batch_norm::forward(stream, Options::training(), call)?;
                }
                if *pass != Pass::Forward {
                    let call = Backward::new(&dys[s], &xs[s], &mut dxs[s], layout, (&mean, &invstd))
                        .weight(&weight)
                        .dweight(&mut dweight)
                        .dbias(&mut dbias);
                    let call = match fusion {
                        Fusion::Relu => call.relu(&masks[s]),
                        Fusion::AddRelu => call.add_relu(&masks[s], &mut daddends[s]),
                    };
                    batch_norm::backward(stream, call)?;
                }
                Ok(())
            })?;
            bench.record::<T>(op, shape, &format!("{layout_name}; {passes}"), bytes, micros, Some(copy));
        }
        for &op in &relu_ops {
            let from_mask = op == "relu_backward_from_mask";
            let bytes = if from_mask { 2 * tensor + mask } else { 3 * tensor };
            let (micros, ()) = bench.time(sets, bytes, |stream, s| {
                if from_mask {
                    batch_norm::relu_backward_from_mask(stream, &dys[s], &masks[s], &mut dxs[s])
                } else {
                    batch_norm::relu_backward(stream, &dys[s], &ys[s], &mut dxs[s])
                }
            })?;
            bench.record::<T>(op, shape, "-", bytes, micros, Some(copy));
        }
    }
    Ok(())
}

/// `batch_norm_relu`, `batch_norm_add_relu_backward`, `batch_norm_relu_fwd+bwd`, ...
fn name(fusion: Fusion, pass: Pass) -> String {
    let fusion = if fusion == Fusion::Relu { "relu" } else { "add_relu" };
    let pass = match pass {
        Pass::Forward => "",
        Pass::Backward => "_backward",
        Pass::Both => "_fwd+bwd",
    };
    format!("batch_norm_{fusion}{pass}")
}
