//! Tuning tables: which plan a GPU's row calls take, by bucket of calls, as its tuner
//! measured (`cargo xtask tune`). A table is text, one entry a line, so that a retune shows
//! in a diff entry by entry:
//!
//! ```text
//! gpu NVIDIA H100 80GB HBM3
//! compute-capability 9.0
//! # class          dtype   cols   rows  alignment  plan
//! softmax          16-bit  1024   *     aligned    warp 32 ahead
//! norm_backward    16-bit  2048   *     aligned    shared 64 blocks<=10
//! norm_backward_dw 32-bit  32768  *     heads      cluster 4x512
//! ```
//!
//! A call's bucket is its op's class ([`CLASSES`]), the bits of its rows'
//! elements, its width rounded up to a bucket bound ([`WIDTH_BUCKETS`]), [`RowsBucket`] and
//! [`Alignment`]; `*` matches any value. The entry that names the most of them wins, the
//! first of those on a tie. A plan's knobs ([`Knobs`]) are what generalizes over a bucket's
//! shapes: the chooser ([`super::choose`]) fits them to the call's shape and the device's
//! limits, and plans by its fallback (the rules, or the ladder) where they do not fit.

use super::dispatch::{BLOCK_SIZES, Path, Plan, Problem, SMALL_BLOCK, STREAMING_BLOCK_SIZES};
use super::spec::RowSpec;
use crate::DeviceInfo;
use crate::error::{Error, Result};
use rill_kernels_gpu::abi::{ROW_CACHE_STAGES, ROW_CLUSTER_SIZES};
use rill_kernels_gpu::table::RowPath;
use std::fmt;

/// The bounds of the width buckets: powers of two to 256 columns, then powers of two and
/// halfway between them (each 1.5 times the last power), to 262144; wider rows are one
/// bucket, `wider`. A call's bucket is the first bound at least its width.
pub const WIDTH_BUCKETS: [u64; 24] = [
    32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    65536, 98304, 131072, 196608, 262144,
];

/// The bucket of rows past [`WIDTH_BUCKETS`]' last bound.
pub const WIDER: u64 = u64::MAX;

/// Most rows of a [`RowsBucket::Few`] call: a decode step's batch, whose launch is too
/// small to fill the GPU with one row a block.
pub const FEW_ROWS: usize = 64;

/// The width bucket of a row of `cols` columns.
pub fn width_bucket(cols: usize) -> u64 {
    WIDTH_BUCKETS.into_iter().find(|&bound| cols as u64 <= bound).unwrap_or(WIDER)
}

/// How many rows a call has, as tables tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowsBucket {
    /// At most [`FEW_ROWS`].
    Few,
    Many,
}

impl RowsBucket {
    pub fn of(rows: usize) -> RowsBucket {
        if rows <= FEW_ROWS { RowsBucket::Few } else { RowsBucket::Many }
    }
}

/// Where a call's rows start, as tables tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Alignment {
    /// Every row in the widest pack.
    Aligned,
    /// Rows run from their heads on the block paths (arrays at one offset from 16 bytes);
    /// the warp path reads them an element at a time.
    Heads,
    /// An element at a time on every path.
    Unaligned,
}

impl Alignment {
    /// The alignment a block-path `plan` ran its rows in (a warp-path plan's packs say less:
    /// rows its block paths would run from their heads it reads an element at a time).
    pub fn of_block_plan(plan: &Plan) -> Alignment {
        if plan.phased {
            Alignment::Heads
        } else if plan.pack > 1 {
            Alignment::Aligned
        } else {
            Alignment::Unaligned
        }
    }

    /// The alignment of `problem`'s rows.
    pub(super) fn of(problem: &Problem) -> Alignment {
        if problem.pack > 1 {
            Alignment::Aligned
        } else if problem.block_phased() {
            Alignment::Heads
        } else {
            Alignment::Unaligned
        }
    }
}

/// The bucket of one row call: what a table entry's pattern is matched against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bucket {
    pub class: &'static str,
    /// Bits of the rows' elements.
    pub bits: u32,
    /// The width bucket's bound ([`width_bucket`]).
    pub cols: u64,
    pub rows: RowsBucket,
    pub alignment: Alignment,
}

impl Bucket {
    /// The bucket of `problem`.
    pub(super) fn of(problem: &Problem) -> Bucket {
        Bucket {
            class: problem.spec.tuning_class(),
            bits: problem.spec.element_bytes * 8,
            cols: width_bucket(problem.cols),
            rows: RowsBucket::of(problem.rows),
            alignment: Alignment::of(problem),
        }
    }
}

/// Which buckets a table entry applies to: each field a value, or `None` for `*`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pattern {
    pub class: Option<String>,
    pub bits: Option<u32>,
    pub cols: Option<u64>,
    pub rows: Option<RowsBucket>,
    pub alignment: Option<Alignment>,
}

impl Pattern {
    /// The pattern naming exactly `bucket`.
    pub fn exactly(bucket: &Bucket) -> Pattern {
        Pattern {
            class: Some(bucket.class.to_string()),
            bits: Some(bucket.bits),
            cols: Some(bucket.cols),
            rows: Some(bucket.rows),
            alignment: Some(bucket.alignment),
        }
    }

    /// How many fields name a value, where every named one matches `bucket`.
    fn specificity(&self, bucket: &Bucket) -> Option<u32> {
        fn field<T: PartialEq>(named: &Option<T>, value: T) -> Option<u32> {
            match named {
                None => Some(0),
                Some(named) if *named == value => Some(1),
                Some(_) => None,
            }
        }
        let class = match &self.class {
            None => 0,
            Some(class) if class == bucket.class => 1,
            Some(_) => return None,
        };
        Some(
            class
                + field(&self.bits, bucket.bits)?
                + field(&self.cols, bucket.cols)?
                + field(&self.rows, bucket.rows)?
                + field(&self.alignment, bucket.alignment)?,
        )
    }
}

/// A plan as a table states it: its path and the knobs that carry over a bucket's shapes.
/// The grid, shared memory and rows requested ahead follow from them and the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Knobs {
    /// The warp path's tier of `elements` a lane; `ahead`: requesting a wave of rows ahead
    /// into L2, where the tier's kernel holds the request.
    Warp { elements: u32, ahead: bool },
    /// A block per row of `block` threads with the row in `stages` caches; with
    /// `most_blocks_an_sm`, its shared memory padded until at most that many share an SM.
    Shared { block: u32, stages: u32, most_blocks_an_sm: Option<u32> },
    /// `cluster` blocks of `block` threads per row, each caching a slice.
    Cluster { cluster: u32, block: u32 },
    /// A block per row of `block` threads, re-reading the row.
    Uncached { block: u32 },
}

/// The caps on blocks an SM the tuner tries a shared-path block at, below what its cache
/// alone allows.
pub const MOST_BLOCKS_AN_SM: [u32; 9] = [1, 2, 3, 4, 6, 8, 10, 12, 16];

impl Knobs {
    /// Every setting of the knobs the tuner tries: each warp tier with and without rows
    /// ahead; shared-path blocks of two warps and of each of the block sizes, in one cache
    /// or two, at the blocks an SM their cache allows and at each of [`MOST_BLOCKS_AN_SM`];
    /// each cluster size by each block size; uncached blocks of every size, from one warp.
    /// Which of them fit a call is the chooser's to find.
    pub fn all() -> Vec<Knobs> {
        let tiers = RowPath::WARP.map(|path| path.warp_elements() as u32);
        let warp = tiers.into_iter().flat_map(|elements| [false, true].map(|ahead| Knobs::Warp { elements, ahead }));
        let mut shared = Vec::new();
        for stages in [1, ROW_CACHE_STAGES] {
            for block in [SMALL_BLOCK].into_iter().chain(BLOCK_SIZES) {
                for most_blocks_an_sm in [None].into_iter().chain(MOST_BLOCKS_AN_SM.map(Some)) {
                    shared.push(Knobs::Shared { block, stages, most_blocks_an_sm });
                }
            }
        }
        let cluster = ROW_CLUSTER_SIZES
            .into_iter()
            .flat_map(|cluster| BLOCK_SIZES.map(|block| Knobs::Cluster { cluster, block }));
        let uncached_blocks = STREAMING_BLOCK_SIZES.into_iter().filter(|block| !BLOCK_SIZES.contains(block));
        let uncached = uncached_blocks.chain(BLOCK_SIZES).map(|block| Knobs::Uncached { block });
        warp.chain(shared).chain(cluster).chain(uncached).collect()
    }

    /// The knobs of `plan`; a shared-path plan's at the blocks an SM its cache allows (a
    /// padded plan's cap is not in the plan: the knobs that gave it name it).
    pub fn of(plan: &Plan) -> Knobs {
        match plan.path {
            Path::Warp { elements, .. } => Knobs::Warp { elements, ahead: plan.ahead > 0 },
            Path::Shared { block, .. } => Knobs::Shared { block, stages: plan.stages, most_blocks_an_sm: None },
            Path::Cluster { cluster, block, .. } => Knobs::Cluster { cluster, block },
            Path::Uncached { block } => Knobs::Uncached { block },
        }
    }
}

impl fmt::Display for Knobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Knobs::Warp { elements, ahead } => write!(f, "warp {elements}{}", if ahead { " ahead" } else { "" }),
            Knobs::Shared { block, stages, most_blocks_an_sm } => {
                write!(f, "shared {block}")?;
                if stages > 1 {
                    write!(f, " stages {stages}")?;
                }
                match most_blocks_an_sm {
                    Some(most) => write!(f, " blocks<={most}"),
                    None => Ok(()),
                }
            }
            Knobs::Cluster { cluster, block } => write!(f, "cluster {cluster}x{block}"),
            Knobs::Uncached { block } => write!(f, "uncached {block}"),
        }
    }
}

impl std::str::FromStr for Knobs {
    type Err = String;

    fn from_str(text: &str) -> Result<Knobs, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let number = |word: &str| word.parse::<u32>().map_err(|_| format!("`{word}` is not a number"));
        let usage = "a plan is `warp E [ahead]`, `shared B [stages S] [blocks<=N]`, `cluster CxB` or `uncached B`";
        match words.as_slice() {
            ["warp", elements] => Ok(Knobs::Warp { elements: number(elements)?, ahead: false }),
            ["warp", elements, "ahead"] => Ok(Knobs::Warp { elements: number(elements)?, ahead: true }),
            ["shared", block, rest @ ..] => {
                let (mut stages, mut most) = (1, None);
                let mut rest = rest.iter();
                while let Some(&word) = rest.next() {
                    match (word, word.strip_prefix("blocks<=")) {
                        ("stages", _) => stages = number(rest.next().ok_or(usage)?)?,
                        (_, Some(n)) => most = Some(number(n)?),
                        _ => return Err(format!("`{word}`: {usage}")),
                    }
                }
                Ok(Knobs::Shared { block: number(block)?, stages, most_blocks_an_sm: most })
            }
            ["cluster", shape] => {
                let (cluster, block) = shape.split_once('x').ok_or(usage)?;
                Ok(Knobs::Cluster { cluster: number(cluster)?, block: number(block)? })
            }
            ["uncached", block] => Ok(Knobs::Uncached { block: number(block)? }),
            _ => Err(format!("`{text}`: {usage}")),
        }
    }
}

/// One line of a table: the buckets it covers and the plan they take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pattern: Pattern,
    pub knobs: Knobs,
}

/// One GPU's tuning table: the GPU it was measured on and its entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TuningTable {
    /// The device name the table was measured on, as the driver reports it.
    pub gpu: String,
    pub compute_capability: (u32, u32),
    pub entries: Vec<Entry>,
}

/// The tables measured by the tuner and checked in, by file.
const BUILTIN: [(&str, &str); 1] = [("tuning/h100-sxm.table", include_str!("../../../tuning/h100-sxm.table"))];

/// The op classes a table may name: the ops' classes, the norm backward with parameter
/// gradients told apart by the sums it gathers (`norm_backward_dw` for RMSNorm's dweight,
/// `norm_backward_dw_db` for LayerNorm's dweight and dbias), and a user's fused family told
/// apart by whether its load transforms every cached read (`fused_transforming`).
pub const CLASSES: [&str; 13] = [
    "softmax",
    "masked_softmax",
    "causal_softmax",
    "softmax_backward",
    "row_statistics",
    "cross_entropy_backward",
    "norm",
    "add_norm",
    "norm_backward",
    "norm_backward_dw",
    "norm_backward_dw_db",
    "fused",
    "fused_transforming",
];

impl TuningTable {
    /// A table whose one entry sends every call to `knobs` (where they fit): what the tuner
    /// times a candidate with.
    pub fn uniform(knobs: Knobs) -> TuningTable {
        TuningTable { entries: vec![Entry { pattern: Pattern::default(), knobs }], ..TuningTable::default() }
    }

    /// The knobs of the entry that names the most of `bucket`'s fields.
    pub fn knobs(&self, bucket: &Bucket) -> Option<Knobs> {
        let mut best: Option<(u32, Knobs)> = None;
        for entry in &self.entries {
            if let Some(specificity) = entry.pattern.specificity(bucket)
                && best.is_none_or(|(most, _)| specificity > most)
            {
                best = Some((specificity, entry.knobs));
            }
        }
        best.map(|(_, knobs)| knobs)
    }

    /// The checked-in table for `device`: the one measured on a GPU of its name, else on one
    /// of its compute capability, else none (the fallback plans every call).
    pub fn builtin(device: &DeviceInfo) -> Option<TuningTable> {
        let mut tables: Vec<TuningTable> =
            BUILTIN.iter().filter_map(|(_, text)| TuningTable::parse(text).ok()).collect();
        let named = tables.iter().position(|table| table.gpu == device.name);
        let same_arch = || tables.iter().position(|table| table.compute_capability == device.compute_capability);
        named.or_else(same_arch).map(|found| tables.swap_remove(found))
    }

    /// The table of `text` (this module's form); an `InvalidInput` error naming the line
    /// that is not.
    pub fn parse(text: &str) -> Result<TuningTable> {
        let mut table = TuningTable::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |what: String| Error::InvalidInput(format!("tuning table, line {}: {what}", number + 1));
            if let Some(name) = line.strip_prefix("gpu ") {
                table.gpu = name.trim().to_string();
            } else if let Some(version) = line.strip_prefix("compute-capability ") {
                let parsed = version.trim().split_once('.').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
                table.compute_capability = parsed.ok_or_else(|| bad(format!("`{version}` is not like 9.0")))?;
            } else {
                table.entries.push(parse_entry(line).map_err(bad)?);
            }
        }
        Ok(table)
    }
}

/// One entry's line: the five fields of its pattern, then its plan.
fn parse_entry(line: &str) -> Result<Entry, String> {
    let mut words = line.split_whitespace();
    let mut field = |what: &str| {
        words.next().ok_or_else(|| format!("no {what}: an entry is `class dtype cols rows alignment plan`"))
    };
    let any = |word: &str| word == "*";
    let class = field("class")?;
    let class = if any(class) {
        None
    } else if CLASSES.contains(&class) {
        Some(class.to_string())
    } else {
        return Err(format!("class `{class}` is none of {}", CLASSES.join(", ")));
    };
    let bits = match field("dtype")? {
        word if any(word) => None,
        word => Some(
            word.strip_suffix("-bit")
                .and_then(|b| b.parse().ok())
                .ok_or(format!("dtype `{word}` is not like 16-bit"))?,
        ),
    };
    let cols = match field("cols")? {
        word if any(word) => None,
        "wider" => Some(WIDER),
        word => match word.parse() {
            Ok(bound) if WIDTH_BUCKETS.contains(&bound) => Some(bound),
            _ => return Err(format!("cols `{word}` is not a width bucket ({WIDTH_BUCKETS:?} or wider)")),
        },
    };
    let rows = match field("rows")? {
        word if any(word) => None,
        "few" => Some(RowsBucket::Few),
        "many" => Some(RowsBucket::Many),
        word => return Err(format!("rows `{word}` is not few or many")),
    };
    let alignment = match field("alignment")? {
        word if any(word) => None,
        "aligned" => Some(Alignment::Aligned),
        "heads" => Some(Alignment::Heads),
        "unaligned" => Some(Alignment::Unaligned),
        word => return Err(format!("alignment `{word}` is not aligned, heads or unaligned")),
    };
    let knobs = words.collect::<Vec<_>>().join(" ").parse()?;
    Ok(Entry { pattern: Pattern { class, bits, cols, rows, alignment }, knobs })
}

impl fmt::Display for TuningTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        writeln!(f, "gpu {}\ncompute-capability {major}.{minor}", self.gpu)?;
        writeln!(f, "# {:<22} {:<7} {:<6} {:<5} {:<10} plan", "class", "dtype", "cols", "rows", "alignment")?;
        for Entry { pattern, knobs } in &self.entries {
            let any = || "*".to_string();
            let class = pattern.class.clone().unwrap_or_else(any);
            let bits = pattern.bits.map_or_else(any, |bits| format!("{bits}-bit"));
            let cols =
                pattern.cols.map_or_else(any, |cols| if cols == WIDER { "wider".into() } else { cols.to_string() });
            let rows = pattern.rows.map_or_else(any, |rows| format!("{rows:?}").to_lowercase());
            let alignment = pattern.alignment.map_or_else(any, |a| format!("{a:?}").to_lowercase());
            writeln!(f, "  {class:<22} {bits:<7} {cols:<6} {rows:<5} {alignment:<10} {knobs}")?;
        }
        Ok(())
    }
}

/// The checked-in tables, by file: for the tests that check each parses and fits its GPU.
#[cfg(test)]
pub(super) fn builtin_texts() -> impl Iterator<Item = (&'static str, &'static str)> {
    BUILTIN.into_iter()
}

impl RowSpec {
    /// The op's class as tuning tables name it ([`CLASSES`]): its [`super::spec::OpClass`],
    /// the norm backward with parameter gradients told apart by the sums it gathers (one
    /// for RMSNorm's dweight, two for LayerNorm's dweight and dbias), a user's fused family
    /// by whether it transforms its cache.
    pub fn tuning_class(&self) -> &'static str {
        use super::spec::OpClass::*;
        match self.class {
            Softmax => "softmax",
            MaskedSoftmax => "masked_softmax",
            CausalSoftmax => "causal_softmax",
            SoftmaxBackward => "softmax_backward",
            RowStatistics => "row_statistics",
            CrossEntropyBackward => "cross_entropy_backward",
            Norm => "norm",
            AddNorm => "add_norm",
            NormBackward => "norm_backward",
            NormBackwardParams if self.column_sums > 1 => "norm_backward_dw_db",
            NormBackwardParams => "norm_backward_dw",
            Fused if self.cache_transformed => "fused_transforming",
            Fused => "fused",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_read_back_as_written() {
        let all = [
            Knobs::Warp { elements: 16, ahead: false },
            Knobs::Warp { elements: 32, ahead: true },
            Knobs::Shared { block: 64, stages: 1, most_blocks_an_sm: None },
            Knobs::Shared { block: 256, stages: 2, most_blocks_an_sm: Some(10) },
            Knobs::Cluster { cluster: 4, block: 512 },
            Knobs::Uncached { block: 128 },
        ];
        for knobs in all {
            assert_eq!(knobs.to_string().parse::<Knobs>(), Ok(knobs), "{knobs}");
        }
        for bad in ["warp", "warp x", "shared 64 stages", "shared 64 blocks<=x", "cluster 4", "uncached", "fast"] {
            assert!(bad.parse::<Knobs>().is_err(), "{bad}");
        }
    }

    #[test]
    fn tables_read_back_as_written_and_bad_lines_are_named() {
        let text = "gpu Some GPU\ncompute-capability 9.0\n# comment\n\
                    softmax 16-bit 1024 * aligned warp 32 ahead # trailing\n\
                    * * wider few * cluster 16x1024\n";
        let table = TuningTable::parse(text).unwrap();
        assert_eq!((table.gpu.as_str(), table.compute_capability, table.entries.len()), ("Some GPU", (9, 0), 2));
        assert_eq!(TuningTable::parse(&table.to_string()).unwrap(), table);
        for (bad, says) in [
            ("softmax 16-bit 1000 * aligned warp 32", "line 1: cols `1000`"),
            ("\nlayernorm 16-bit 1024 * aligned warp 32", "line 2: class `layernorm`"),
            ("softmax bf16 1024 * aligned warp 32", "dtype `bf16`"),
            ("softmax 16-bit 1024 some aligned warp 32", "rows `some`"),
            ("softmax 16-bit 1024 * odd warp 32", "alignment `odd`"),
            ("softmax 16-bit 1024 * aligned", "a plan is"),
            ("compute-capability nine", "`nine`"),
        ] {
            let error = TuningTable::parse(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn the_entry_naming_the_most_fields_wins_the_first_on_a_tie() {
        let text = "* * * * * uncached 1024\n\
                    softmax * * * * uncached 512\n\
                    softmax 16-bit 4096 * aligned shared 256\n\
                    softmax 16-bit 4096 few aligned cluster 4x512\n\
                    softmax 16-bit 4096 many * shared 128\n";
        let table = TuningTable::parse(text).unwrap();
        let bucket = |class, cols, rows, alignment| Bucket {
            class,
            bits: 16,
            cols: width_bucket(cols),
            rows: RowsBucket::of(rows),
            alignment,
        };
        let knobs = |b| table.knobs(&b).unwrap().to_string();
        assert_eq!(knobs(bucket("norm", 4096, 1, Alignment::Aligned)), "uncached 1024");
        assert_eq!(knobs(bucket("softmax", 8192, 1, Alignment::Aligned)), "uncached 512");
        assert_eq!(knobs(bucket("softmax", 4000, 49152, Alignment::Aligned)), "shared 256");
        assert_eq!(knobs(bucket("softmax", 4096, 8, Alignment::Aligned)), "cluster 4x512");
        assert_eq!(knobs(bucket("softmax", 4096, 49152, Alignment::Heads)), "shared 128");
        assert_eq!(TuningTable::default().knobs(&bucket("softmax", 4096, 1, Alignment::Aligned)), None);
    }

    #[test]
    fn widths_fall_in_the_first_bucket_they_fit() {
        assert_eq!(
            [1, 32, 33, 257, 1000, 1024, 1025, 32001, 50257, 262144, 262145].map(width_bucket),
            [32, 32, 64, 384, 1024, 1024, 1536, 32768, 65536, 262144, WIDER]
        );
    }
}
