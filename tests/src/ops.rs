//! Ops run by name, for the tests and the benchmarks that loop over the op tables.

use rill::elementwise as ew;
use rill::{Element, Stream, View, ViewMut};

/// Runs elementwise op `name` (a name in [`crate::reference::ELEMENTWISE_OPS`]) on `x`;
/// the broadcasting ops take `x` as `[rows, cols]` and the last input as `[cols]`.
pub fn elementwise<T: Element>(
    stream: &Stream,
    name: &str,
    x: &[View<'_, T>],
    y: &mut ViewMut<'_, T>,
) -> rill::Result<()> {
    match (name, x) {
        ("relu", [a]) => ew::relu(stream, a, y),
        ("gelu", [a]) => ew::gelu(stream, a, y),
        ("gelu_tanh", [a]) => ew::gelu_tanh(stream, a, y),
        ("silu", [a]) => ew::silu(stream, a, y),
        ("sigmoid", [a]) => ew::sigmoid(stream, a, y),
        ("add", [a, b]) => ew::add(stream, a, b, y),
        ("sub", [a, b]) => ew::sub(stream, a, b, y),
        ("mul", [a, b]) => ew::mul(stream, a, b, y),
        ("div", [a, b]) => ew::div(stream, a, b, y),
        ("fma", [a, b, c]) => ew::fma(stream, a, b, c, y),
        ("bias_add_gelu", [a, b]) => ew::bias_add_gelu(stream, a, b, y),
        _ => Err(rill::Error::Unsupported(format!("no elementwise op `{name}` with {} inputs", x.len()))),
    }
}
