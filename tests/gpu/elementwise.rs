//! Elementwise ops: every op x dtype x length, misaligned views, and bad input.

use crate::harness::{Suite, measure, parallel_map, tolerance_of, view_at, view_mut_at};
use half::{bf16, f16};
use rill::elementwise as ew;
use rill::{Element, Tensor, View};
use rill_tests::random::Domain;
use rill_tests::reference::{ELEMENTWISE_OPS, ElementwiseOp};
use rill_tests::shapes::{BIAS_COLS, ELEMENTWISE_TEST_LENGTHS};

pub fn run(suite: &mut Suite) {
    for_dtype::<f32>(suite);
    for_dtype::<f16>(suite);
    for_dtype::<bf16>(suite);
    casts(suite);
    bad_input(suite);
}

/// Which inputs and the output start one element into their allocation.
const OFFSETS: &[(usize, usize)] = &[(0, 0), (1, 0), (0, 1)];

fn for_dtype<T: Element>(suite: &mut Suite) {
    for op in ELEMENTWISE_OPS {
        let shapes: Vec<Vec<usize>> = if op.broadcasts_last {
            BIAS_COLS.iter().flat_map(|&cols| [vec![1, cols], vec![3, cols], vec![1000, cols]]).collect()
        } else {
            ELEMENTWISE_TEST_LENGTHS.iter().filter(|&&n| n <= suite.options.max_len).map(|&n| vec![n]).collect()
        };
        for shape in &shapes {
            let len: usize = shape.iter().product();
            // Misaligned views on mid-size shapes; aligned everywhere.
            let offsets = if (1000..=(1 << 21)).contains(&len) { OFFSETS } else { &OFFSETS[..1] };
            for &(input_offset, output_offset) in offsets {
                let name = format!(
                    "elementwise/{}/{}/{shape:?}/offset={input_offset},{output_offset}",
                    op.name,
                    T::DTYPE.name()
                );
                suite.case(&name, tolerance_of::<T>(), |suite, rng| {
                    let inputs: Vec<Vec<T>> = (0..op.arity)
                        .map(|k| {
                            let n = if op.broadcasts_last && k == op.arity - 1 { *shape.last().unwrap() } else { len };
                            Suite::random(rng, op.domains[k], n)
                        })
                        .collect();
                    let got = launch_op(suite, op, &inputs, shape, input_offset, output_offset)?;
                    let cols = *shape.last().unwrap_or(&1);
                    let want = parallel_map(len, |i| {
                        let x: Vec<f64> = (0..op.arity)
                            .map(|k| {
                                if op.broadcasts_last && k == op.arity - 1 { inputs[k][i % cols] } else { inputs[k][i] }
                                    .to_f64()
                            })
                            .collect();
                        (op.reference)(&x)
                    });
                    Ok(measure(&got, &want))
                });
            }
        }
    }
}

/// Uploads `inputs`, runs `op` into a poisoned output of `shape`, returns the output.
pub(crate) fn launch_op<T: Element>(
    suite: &Suite,
    op: &ElementwiseOp,
    inputs: &[Vec<T>],
    shape: &[usize],
    input_offset: usize,
    output_offset: usize,
) -> rill::Result<Vec<T>> {
    let tensors: Vec<Tensor<T>> = inputs.iter().map(|x| suite.upload(x, input_offset)).collect::<rill::Result<_>>()?;
    let len: usize = shape.iter().product();
    let bias_shape = [*shape.last().unwrap_or(&1)];
    let views: Vec<View<'_, T>> = tensors
        .iter()
        .enumerate()
        .map(|(k, t)| {
            view_at(t, input_offset, if op.broadcasts_last && k == op.arity - 1 { &bias_shape } else { shape })
        })
        .collect::<rill::Result<_>>()?;
    let mut output = suite.poisoned::<T>(len, output_offset)?;
    {
        let mut y = view_mut_at(&mut output, output_offset, shape)?;
        rill_tests::ops::elementwise(&suite.stream, op.name, &views, &mut y)?;
    }
    suite.stream.synchronize()?;
    Ok(output.to_vec()?.split_off(output_offset))
}

/// Calls the library function named `name`.
fn casts(suite: &mut Suite) {
    cast_pair::<f32, f16>(suite);
    cast_pair::<f32, bf16>(suite);
    cast_pair::<f16, f32>(suite);
    cast_pair::<bf16, f32>(suite);
    cast_pair::<f16, bf16>(suite);
    cast_pair::<bf16, f16>(suite);
}

fn cast_pair<I: Element, O: Element>(suite: &mut Suite) {
    let max_len = suite.options.max_len;
    for &len in ELEMENTWISE_TEST_LENGTHS.iter().filter(|&&n| n <= max_len) {
        for &(input_offset, output_offset) in if (1000..=(1 << 21)).contains(&len) { OFFSETS } else { &OFFSETS[..1] } {
            let name = format!(
                "elementwise/cast/{}->{}/[{len}]/offset={input_offset},{output_offset}",
                I::DTYPE.name(),
                O::DTYPE.name()
            );
            suite.case(&name, tolerance_of::<O>(), |suite, rng| {
                let x: Vec<I> = Suite::random(rng, Domain::Symmetric(1000.0), len);
                let input = suite.upload(&x, input_offset)?;
                let mut output = suite.poisoned::<O>(len, output_offset)?;
                ew::cast(
                    &suite.stream,
                    &view_at(&input, input_offset, &[len])?,
                    &mut view_mut_at(&mut output, output_offset, &[len])?,
                )?;
                suite.stream.synchronize()?;
                let got = output.to_vec()?.split_off(output_offset);
                let want: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
                Ok(measure(&got, &want))
            });
        }
    }
}

fn bad_input(suite: &mut Suite) {
    let gpu = suite.gpu.clone();
    let make = move |shape: &[usize]| Tensor::<f32>::zeros(&gpu, shape);
    suite.rejects("elementwise/errors/length-mismatch", |s| {
        let (a, b, mut y) = (make(&[8])?, make(&[9])?, make(&[8])?);
        ew::add(&s.stream, &a, &b, &mut y)
    });
    suite.rejects("elementwise/errors/output-shape", |s| {
        let (x, mut y) = (make(&[2, 4])?, make(&[4, 2])?);
        ew::gelu(&s.stream, &x, &mut y)
    });
    suite.rejects("elementwise/errors/bias-shape", |s| {
        let (x, bias, mut y) = (make(&[3, 8])?, make(&[3])?, make(&[3, 8])?);
        ew::bias_add_gelu(&s.stream, &x, &bias, &mut y)
    });
    suite.rejects("elementwise/errors/cast-to-same-dtype", |s| {
        let (x, mut y) = (make(&[4])?, make(&[4])?);
        ew::cast::<f32, f32>(&s.stream, &x, &mut y)
    });
    suite.rejects("elementwise/errors/slice-out-of-range", |_| make(&[4])?.view().slice(2..9).map(|_| ()));
    suite.rejects("elementwise/errors/reshape-count", |_| make(&[4])?.view().reshape(&[3]).map(|_| ()));
}
