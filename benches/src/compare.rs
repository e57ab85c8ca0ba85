//! `rill-bench --compare BASE NEW`: two recorded runs of the same sweep (one build against
//! another, or a table against none), rill's figures only: per op and dtype the distribution
//! of new / base effective bandwidth over the shapes both measured, and every shape slower
//! than [`SLOWER`], worst first.

use crate::report::{RILL, Record, Section};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A shape is slower where new / base falls below this.
pub const SLOWER: f64 = 0.98;

/// The comparison of `new` against `base`, as text.
pub fn compare(base: &Section, new: &Section) -> String {
    let rill = |section: &Section| -> BTreeMap<(String, String, Vec<usize>), Record> {
        let records = section.records.iter().filter(|r| r.implementation == RILL && r.op != "copy");
        records.map(|r| ((r.op.clone(), r.dtype.clone(), r.shape.clone()), r.clone())).collect()
    };
    let (base, new) = (rill(base), rill(new));
    let mut ratios: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut slower = Vec::new();
    for (key, b) in &base {
        let Some(n) = new.get(key) else { continue };
        let ratio = n.gbps / b.gbps;
        ratios.entry((key.0.clone(), key.1.clone())).or_default().push(ratio);
        if ratio < SLOWER {
            slower.push((ratio, key.clone(), b, n));
        }
    }
    let mut text = String::new();
    let _ = writeln!(text, "{:<34} {:<5} {:>6} {:>7} {:>7} {:>7}", "op", "dtype", "shapes", "min", "median", "max");
    let mut all = Vec::new();
    for ((op, dtype), mut values) in ratios {
        values.sort_by(f64::total_cmp);
        let (min, median, max) = (values[0], values[values.len() / 2], values[values.len() - 1]);
        let _ = writeln!(text, "{op:<34} {dtype:<5} {:>6} {min:>7.3} {median:>7.3} {max:>7.3}", values.len());
        all.extend(values);
    }
    all.sort_by(f64::total_cmp);
    if let (Some(first), Some(last)) = (all.first(), all.last()) {
        let median = all[all.len() / 2];
        let _ = writeln!(text, "all: {} shapes, new / base {first:.3} to {last:.3}, median {median:.3}", all.len());
    }
    slower.sort_by(|a, b| a.0.total_cmp(&b.0));
    let _ = writeln!(text, "{} shapes slower than {SLOWER}", slower.len());
    for (ratio, (op, dtype, shape), b, n) in slower {
        let (was, is) = (100.0 * b.of_copy, 100.0 * n.of_copy);
        let _ = writeln!(
            text,
            "  {ratio:.3} {op} {dtype} {shape:?}: {was:.1}% -> {is:.1}% of copy; {} -> {}",
            b.path, n.path
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Header, Run};

    fn record(op: &str, cols: usize, gbps: f64, implementation: &str) -> Record {
        Record {
            op: op.into(),
            dtype: "bf16".into(),
            shape: vec![49152, cols],
            path: format!("plan at {cols}"),
            micros: 1.0,
            gbps,
            of_copy: gbps / 3000.0,
            implementation: implementation.into(),
        }
    }

    fn section(records: Vec<Record>) -> Section {
        Section::new("run", vec![Run { header: Header::default(), records }])
    }

    #[test]
    fn ratios_by_op_and_the_slower_shapes_worst_first() {
        let base = section(vec![
            record("softmax", 1024, 3000.0, RILL),
            record("softmax", 2048, 3000.0, RILL),
            record("softmax", 4096, 3000.0, RILL),
            record("softmax", 8192, 3000.0, "QuACK"),
            record("copy", 1024, 3000.0, RILL),
        ]);
        let new = section(vec![
            record("softmax", 1024, 3030.0, RILL),
            record("softmax", 2048, 2700.0, RILL),
            record("softmax", 4096, 2850.0, RILL),
            record("softmax", 8192, 1000.0, "QuACK"),
        ]);
        let text = compare(&base, &new);
        assert!(text.contains("softmax                            bf16       3   0.900   0.950   1.010"), "{text}");
        assert!(text.contains("all: 3 shapes, new / base 0.900 to 1.010, median 0.950"), "{text}");
        assert!(text.contains("2 shapes slower than 0.98"), "{text}");
        let worst = text.find("0.900 softmax bf16 [49152, 2048]").unwrap();
        assert!(worst < text.find("0.950 softmax bf16 [49152, 4096]").unwrap(), "{text}");
        assert!(!text.contains("8192") && !text.contains("\ncopy"), "{text}");
    }
}
