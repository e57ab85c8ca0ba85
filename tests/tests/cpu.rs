//! CPU-only checks: the device functors' f32 math (compiled for the host) against the f64
//! references, and the PTX the builder produced.

use rill::elementwise::ElementwiseOp;
use rill::{KernelKey, Module};
use rill_kernels_gpu::abi::Divisor;
use rill_kernels_gpu::functor::*;
use rill_tests::random::Rng;
use rill_tests::reference::ELEMENTWISE_OPS;

/// The f32 math of functor `name` on the host.
fn functor(name: &str) -> fn(&[f64]) -> f32 {
    fn args<const K: usize>(x: &[f64]) -> [f32; K] {
        std::array::from_fn(|k| x[k] as f32)
    }
    match name {
        "relu" => |x| Relu::apply(args(x)),
        "gelu" => |x| Gelu::apply(args(x)),
        "gelu_tanh" => |x| GeluTanh::apply(args(x)),
        "silu" => |x| Silu::apply(args(x)),
        "sigmoid" => |x| Sigmoid::apply(args(x)),
        "add" => |x| Add::apply(args(x)),
        "sub" => |x| Sub::apply(args(x)),
        "mul" => |x| Mul::apply(args(x)),
        "div" => |x| Div::apply(args(x)),
        "fma" => |x| Fma::apply(args(x)),
        "bias_add_gelu" => |x| BiasAddGelu::apply(args(x)),
        other => panic!("no functor for {other}"),
    }
}

#[test]
fn functor_math_matches_f64_references_within_f32_tolerance() {
    let mut rng = Rng::new(rill_tests::random::run_seed());
    for op in ELEMENTWISE_OPS {
        let f = functor(op.name);
        let mut worst = 0.0f64;
        for _ in 0..200_000 {
            // Round inputs to f32 first: the reference sees exactly what the functor sees.
            let x: Vec<f64> = op.domains.iter().map(|d| d.sample(&mut rng) as f32 as f64).collect();
            let want = (op.reference)(&x);
            let got = f(&x) as f64;
            worst = worst.max((got - want).abs() / want.abs().max(f32::MIN_POSITIVE as f64));
        }
        assert!(worst < 1e-5, "{}: max relative error {worst:e}", op.name);
    }
}

#[test]
fn functor_math_is_accurate_in_the_far_tails() {
    for x in [-12.0f64, -9.5, -7.25, 7.25, 12.0] {
        for op in ELEMENTWISE_OPS.iter().filter(|op| op.arity == 1) {
            let want = (op.reference)(&[x]);
            let got = functor(op.name)(&[x]) as f64;
            let err = (got - want).abs() / want.abs().max(f32::MIN_POSITIVE as f64);
            assert!(err < 1e-5 || want.abs() < 1e-30, "{} at {x}: got {got:e}, want {want:e}", op.name);
        }
    }
}

#[test]
fn launch_divisors_divide_exactly() {
    let mut rng = Rng::new(rill_tests::random::run_seed());
    let edges = [1, 2, 3, 5, 7, 1000, 4096, 50257, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1];
    let wide = [(1 << 62) + 3, (1 << 63) - 1, 1 << 63];
    let mut divisors: Vec<u64> = edges.iter().chain(&wide).copied().collect();
    // Divisors of every magnitude: a random bit width, then random bits below it.
    divisors.extend((0..2000).map(|_| {
        let bits = rng.next_u64() % 63 + 1;
        (rng.next_u64() >> (64 - bits)).max(1)
    }));
    for d in divisors {
        let divisor = Divisor::new(d);
        let mut numerators = vec![0, 1, d - 1, d, d + 1, (1 << 63) - 1, (1 << 63) - 2];
        numerators.extend((2..4).filter_map(|k: u64| k.checked_mul(d)).flat_map(|m| [m - 1, m]));
        numerators.extend((0..200).map(|_| rng.next_u64() >> (1 + rng.next_u64() % 63)));
        for n in numerators.into_iter().filter(|&n| n < 1 << 63) {
            assert_eq!(divisor.quotient(n), n / d, "{n} / {d}");
            assert_eq!(divisor.remainder(n), n % d, "{n} % {d}");
        }
    }
    assert_eq!(Divisor::new(0), Divisor::new(1), "0 stands in as 1");
    assert_eq!(Divisor::default(), Divisor::new(1));
}

/// The body of kernel `symbol` in `ptx`.
fn kernel_body<'a>(ptx: &'a str, symbol: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {symbol}(")).unwrap_or_else(|| panic!("{symbol} not in PTX"));
    let rest = &ptx[start..];
    let end = rest.find("\n}\n").map_or(rest.len(), |e| e + 3);
    &rest[..end]
}

#[test]
fn elementwise_kernels_use_16_byte_accesses_and_no_local_memory() {
    let ptx = rill::ptx(Module::Elementwise).expect("embedded");
    let kernels =
        ElementwiseOp::ALL.iter().flat_map(|&op| op.dtypes().iter().map(move |&(input, output)| (op, input, output)));
    for (op, input, output) in kernels {
        let symbol = KernelKey::Elementwise { op, input, output }.symbol().expect("in the table");
        let body = kernel_body(ptx, symbol);
        assert!(body.contains("ld.global.nc.v4.u32") || input.size() < output.size(), "{symbol}: no 16-byte load");
        assert!(body.contains("st.global.v4.u32") || output.size() < input.size(), "{symbol}: no 16-byte store");
        assert!(!body.contains(".local"), "{symbol}: uses local memory");
        assert!(!calls_a_function(body), "{symbol}: calls a function (a panic path?)");
        assert!(!body.contains("div.rn.f32"), "{symbol}: IEEE division");
        // `div` and `silu` divide over the whole range (a reciprocal of a divisor past 2^126
        // flushes to 0); the other ops divide nowhere.
        let divides = matches!(op, ElementwiseOp::Div | ElementwiseOp::Silu);
        assert_eq!(body.contains("div.full.f32"), divides, "{symbol}: div.full.f32 is for div and silu only");
        assert!(!divides || !body.contains("rcp.approx"), "{symbol}: divides by a reciprocal, 0 past 2^126");
    }
}

#[test]
fn paired_16_bit_ops_use_half2_instructions() {
    let ptx = rill::ptx(Module::Elementwise).expect("embedded");
    for (symbol, instruction) in [
        ("rill_add_f16_f16", "fma.rn.f16x2"),
        ("rill_mul_bf16_bf16", "fma.rn.bf16x2"),
        ("rill_fma_f16_f16", "fma.rn.f16x2"),
        ("rill_relu_f16_f16", "max.NaN.f16x2"),
        ("rill_relu_bf16_bf16", "max.NaN.bf16x2"),
    ] {
        assert!(kernel_body(ptx, symbol).contains(instruction), "{symbol} lacks {instruction}");
    }
}

/// Every exported kernel of `module`: (symbol, body).
fn kernels_of(module: Module) -> Vec<(String, String)> {
    entries(rill::ptx(module).expect("embedded"))
}

/// Every exported kernel of `ptx`: (symbol, body).
fn entries(ptx: &str) -> Vec<(String, String)> {
    ptx.match_indices(".entry ")
        .map(|(at, _)| {
            let name: String = ptx[at + 7..].chars().take_while(|c| *c != '(').collect();
            (name.clone(), kernel_body(ptx, &name).to_string())
        })
        .collect()
}

/// The kernels the table caps carry their `.maxnreg` between their parameters and their
/// body, and no other kernel carries one.
#[test]
fn register_caps_reach_the_ptx() {
    for module in Module::ALL {
        let caps = KernelKey::register_caps(module);
        for (symbol, body) in kernels_of(module) {
            let header = &body[..body.find("\n{").expect("a kernel has a body")];
            let expected = caps.iter().find(|(capped, _)| *capped == symbol).map(|(_, cap)| format!(".maxnreg {cap}"));
            let found = header.lines().find(|line| line.starts_with(".maxnreg")).map(str::to_string);
            assert_eq!(found, expected, "{symbol}");
        }
    }
}

#[test]
fn softmax_kernels_shuffle_use_16_byte_loads_and_no_local_memory() {
    let kernels = kernels_of(Module::Softmax);
    // Kinds x (paths x dtypes x packs + phased block paths x dtypes at the widest pack), less
    // the block paths' pack-1 kernels of the two kinds that read a single row array.
    assert_eq!(kernels.len(), 7 * (6 * 3 * 2 + 2 * 3) - 2 * 2 * 3, "softmax kernels");
    for (name, body) in &kernels {
        assert!(!body.contains(".local"), "{name}: uses local memory");
        assert!(!calls_a_function(body), "{name}: calls a function (a panic path?)");
        assert!(body.contains("shfl.sync.bfly.b32"), "{name}: no butterfly shuffle");
        assert!(!body.contains("div.rn.f32") && !body.contains("div.full"), "{name}: IEEE division");
        // The masked kind's `row % mask_rows`, in 32 bits, is computed before each loop over a
        // row's packs; the causal kind divides by an `abi::Divisor`.
        let wide_division = ["div.u", "div.s", "rem.u64", "rem.s"].iter().any(|op| body.contains(op));
        assert!(!wide_division, "{name}: 64-bit or signed integer division");
        assert!(name.contains("_scale_mask_") || !body.contains("rem.u32"), "{name}: integer division");
        let widest_pack = !name.ends_with("_p1");
        // Every kind copies its rows to shared memory as memory holds them (the masked kind
        // adds its mask on every read of the cache).
        check_row_loads(name, body, widest_pack, true);
        // Cross entropy and logsumexp write a value per row; the pack-1 kernels move one
        // element per access; cross entropy's gradient stores through its own functor.
        if widest_pack && !name.contains("_cross_entropy_") && !name.contains("_logsumexp_") {
            let sixteen_bytes = body.contains("st.global.v4.u32") || body.contains("st.global.cs.v4.u32");
            assert!(sixteen_bytes, "{name}: no 16-byte store");
            check_row_stores(name, body);
        }
        let block_path = name.contains("_shared_") || name.contains("_uncached_");
        assert_eq!(body.contains("bar.sync"), block_path, "{name}: barriers only on the block paths");
        check_edges(name, body);
    }
}

/// A row kernel's output stores at the widest pack: vector stores (a pack of a narrower
/// output than the input is under 16 bytes), evict-first (`st.global.cs`) in the uncached
/// paths' last pass, which re-reads the rows from L2 as it stores, so the outputs do not push
/// those rows out (a residual add's sum, stored in the first pass, stays plain); plain on
/// the other paths.
fn check_row_stores(name: &str, body: &str) {
    let (hinted, plain) = (body.contains("st.global.cs.v"), body.contains("st.global.v"));
    if name.contains("_uncached_") || name.contains("_Uncached") {
        assert!(hinted, "{name}: the uncached path's outputs are not stored evict-first");
        assert!(!plain || name.contains("_add_forward_"), "{name}: a plain vector store on the uncached path");
    } else {
        assert!(plain && !hinted, "{name}: no plain vector store, or an evict-first one off the uncached path");
    }
}

/// Phased kernels (rows from their heads) read each row's unaligned edge elements one at
/// a time; the aligned kernels at the widest pack have no such loads.
fn check_edges(name: &str, body: &str) {
    let single = body.contains("ld.global.nc.u16") || body.contains("ld.global.nc.u32");
    if name.contains("_phased_") {
        assert!(single, "{name}: no single-element edge load");
    } else if !name.ends_with("_p1") && name.contains("_forward_") {
        assert!(!single, "{name}: single-element loads in an aligned kernel");
    }
}

/// A row kernel's loads with the widest pack: 16 bytes each. On the shared path, a load
/// with a source (`plain`: it caches the row as memory holds it) fills the row cache by
/// `cp.async` (global to shared, no registers), others through registers; the cache is read
/// back 16 bytes at a time.
fn check_row_loads(name: &str, body: &str, widest_pack: bool, plain: bool) {
    if !widest_pack {
        return;
    }
    // Cross entropy and logsumexp read each row once on every path: streamed, never cached.
    let cross_entropy = name.contains("_cross_entropy_") && !name.contains("_cross_entropy_backward_");
    if cross_entropy || name.contains("_logsumexp_") {
        assert!(!body.contains("cp.async") && !body.contains("ld.shared.v4"), "{name}: caches the row");
    } else if name.contains("_shared_") || name.contains("_cluster_") {
        assert!(body.contains("ld.shared.v4.u32"), "{name}: no 16-byte cache read");
        if plain {
            let waits = body.contains("cp.async.wait_all") || body.contains("cp.async.wait_group");
            assert!(body.contains("cp.async.cg.shared.global") && waits, "{name}: no cp.async fill");
            // The cluster forwards use each pack as it lands.
            if name.contains("_cluster_") && !name.contains("backward") && !name.contains("_norm_") {
                assert!(body.contains("cp.async.wait_group"), "{name}: waits for the whole row at once");
            }
            return;
        }
    }
    // f32 rows beside re-read weights bypass L1 (`StreamLoad`).
    let sixteen_bytes = body.contains("ld.global.nc.v4.u32") || body.contains("ld.global.nc.L1::no_allocate.v4.u32");
    assert!(sixteen_bytes, "{name}: no 16-byte load");
}

/// The softmax family's row maxima keep NaN (`max.NaN.f32`; `max.f32` drops a NaN, and a
/// row whose thread met only NaN came out finite), on every path, the cluster's included.
#[test]
fn softmax_row_maxima_keep_nan() {
    let kernels = kernels_of(Module::Softmax).into_iter().chain(kernels_of(Module::Cluster));
    for (name, body) in kernels.filter(|(name, _)| name.starts_with("rill_softmax_")) {
        assert!(!body.contains("max.f32"), "{name}: a max that drops NaN");
        // Every kind but the plain backward reduces its rows' maxima.
        if !name.starts_with("rill_softmax_backward_") {
            assert!(body.contains("max.NaN.f32"), "{name}: no NaN-propagating max");
        }
    }
}

/// BatchNorm keeps NaN where PyTorch does: the variance's clamp at 0 is a `max.NaN.f32`
/// (`max.f32` turned a NaN variance into 0), and every ReLU test is `!(y <= 0)`, an unordered
/// `setp.gtu` (an ordered `y > 0` stopped dy at a NaN y).
#[test]
fn batch_norm_clamps_and_relu_tests_keep_nan() {
    for (name, body) in kernels_of(Module::BatchNorm) {
        assert!(!body.contains("max.f32"), "{name}: a max that drops NaN");
        assert!(!body.contains("setp.gt.f"), "{name}: an ordered `>`, false at NaN");
        if name.starts_with("rill_batch_norm_finalize_forward_") {
            assert!(body.contains("max.NaN.f32"), "{name}: the variance's clamp drops NaN");
        }
        // The kernels that test y: the forwards with a ReLU, and the ReLU backward from y.
        let tests_y =
            name.contains("relu") && !name.contains("from_mask") && !name.starts_with("rill_batch_norm_backward_");
        if tests_y {
            assert!(body.contains("setp.gtu."), "{name}: no unordered ReLU test");
        }
    }
}

/// Whether a kernel's PTX has a `call` instruction, predicated or not. Labels and comments
/// do not count: an inlined closure's labels may name its `call_mut`.
fn calls_a_function(body: &str) -> bool {
    body.lines().any(|line| {
        let line = line.trim_start();
        let instruction = match line.strip_prefix('@') {
            Some(predicated) => predicated.split_once(char::is_whitespace).map_or("", |(_, rest)| rest.trim_start()),
            None => line,
        };
        instruction.starts_with("call")
    })
}

/// Whether `name` is a backward gathering the norms' parameter gradients; if so, checks
/// that its sums, shared by a block, are added 16 bytes at a time (in runs of 1, 2 and 4
/// words aligned to their bytes on rows run from their heads, whose packs start at any
/// column) and never atomically (the same bits every run).
fn check_gathering(name: &str, body: &str) -> bool {
    let gathers = name.starts_with("rill_norm_backward_params_");
    if gathers {
        let accesses: &[&str] = if name.contains("_phased_") {
            &["st.shared.u32", "st.shared.v2.u32", "st.shared.v4.u32"]
        } else {
            &["st.shared.v4.u32"]
        };
        for access in accesses {
            assert!(body.contains(access), "{name}: sums not added with {access}");
        }
        let atomic = body.contains("atom.") || body.contains("\tred.") || body.contains(" red.");
        assert!(!atomic, "{name}: atomic sums");
    }
    gathers
}

#[test]
fn cluster_kernels_reduce_through_distributed_shared_memory() {
    let ptx = rill::ptx(Module::Cluster).expect("embedded");
    assert!(ptx.contains(".target sm_90"), "the cluster module must target sm_90");
    let kernels = kernels_of(Module::Cluster);
    // Softmax: 7 kinds x 3 dtypes x (2 packs + phased), less pack 1 for the 2 kinds that read
    // a single row array; norms: (7 + 7 + 5) dtype triples x 2 packs, the 3 kinds phased
    // for the 5 triples whose rows share a dtype, and the gathering backward's 5 triples at
    // the widest pack, phased for f32.
    assert_eq!(kernels.len(), 7 * 3 * 3 - 2 * 3 + (7 + 7 + 5) * 2 + 3 * 5 + 5 * 2, "cluster kernels");
    for (name, body) in &kernels {
        assert!(name.contains("_cluster_"), "{name}: only cluster-path kernels belong here");
        assert!(!body.contains(".local"), "{name}: uses local memory");
        assert!(!calls_a_function(body), "{name}: calls a function (a panic path?)");
        // The start's and the exit's (which the compiler may merge into one), none per row.
        let cluster_barriers = body.matches("barrier.cluster.wait").count();
        assert!(cluster_barriers <= 2, "{name}: {cluster_barriers} cluster barriers");
        for instruction in [
            "barrier.cluster.arrive.aligned",
            "barrier.cluster.wait.aligned",
            "mbarrier.init.shared::cta.b64",
            "fence.mbarrier_init.release.cluster",
            "mapa.shared::cluster",
            "st.async.shared::cluster.mbarrier::complete_tx::bytes",
            "mbarrier.arrive.expect_tx",
            "mbarrier.try_wait.parity",
        ] {
            assert!(body.contains(instruction), "{name}: no {instruction}");
        }
        let widest_pack = !name.ends_with("_p1");
        // The masked kind's f32 clusters cache the sum they compute (its `Staged` load).
        let staged = name.contains("_scale_mask_") && name.contains("_f32_");
        let plain = !staged && !name.contains("_add_forward_");
        check_row_loads(name, body, widest_pack, plain);
        check_edges(name, body);
        check_gathering(name, body);
        // The softmax backward holds a pack of y and of dy a thread in registers, loaded for
        // the row and prefetched for the next.
        if name.contains("_softmax_backward_cluster_") && widest_pack {
            let held = body.matches("ld.global.nc.v4.u32").count();
            assert!(held >= 4, "{name}: {held} 16-byte register loads, not the 4 of its held packs");
        }
        // The engine's backwards (softmax's and the norms') take each pack of their first
        // pass as its copies land: they wait for copy groups, never for a whole row at once.
        let engine_backward = name.starts_with("rill_softmax_backward_") || name.starts_with("rill_norm_backward");
        let copies = body.contains("cp.async.cg.shared.global") || body.contains("cp.async.ca.shared.global");
        if engine_backward && copies {
            assert!(body.contains("cp.async.wait_group"), "{name}: no wait for a pack's copies");
            assert!(!body.contains("cp.async.wait_all"), "{name}: waits for the whole row's copies");
        }
    }
}

#[test]
fn norm_ladder_kernels_are_one_per_rung_and_dtype_and_climb_as_the_article() {
    use rill::norm_ladder::Rung;
    let ptx = rill::ptx(Module::NormLadder).expect("the tests enable norm-ladder");
    assert_eq!(ptx.matches(".entry ").count(), Rung::ALL.len() * 3, "rungs x dtypes");
    for rung in Rung::ALL {
        for dtype in [rill::DType::F32, rill::DType::F16, rill::DType::BF16] {
            let name = KernelKey::NormLadder { rung, dtype }.symbol().expect("in the table");
            let body = kernel_body(ptx, name);
            assert!(!body.contains(".local"), "{name}: uses local memory");
            assert!(!calls_a_function(body), "{name}: calls a function (a panic path?)");
            let vectorized = rung == Rung::WarpVectorized;
            assert_eq!(body.contains("ld.global.nc.v4.u32"), vectorized, "{name}: 16-byte loads on rung 4 only");
            assert_eq!(body.contains("st.global.v4.u32"), vectorized, "{name}: 16-byte stores on rung 4 only");
            let shuffles = matches!(rung, Rung::WarpStrided | Rung::WarpVectorized);
            assert_eq!(body.contains("shfl.sync.bfly.b32"), shuffles, "{name}: shuffles on rungs 3 and 4 only");
            assert_eq!(body.contains("bar.sync"), rung != Rung::ThreadPerRow, "{name}: barriers");
        }
    }
}

#[test]
fn norm_kernels_shuffle_use_16_byte_loads_and_no_local_memory() {
    let kernels = kernels_of(Module::Norm);
    // Forward and residual-add forward for 7 dtype triples, the backward for 5, on 6 paths
    // with 2 packs each; the 3 kinds on the 2 phased block paths for the 5 triples whose
    // rows share a dtype; the backward gathering the parameter gradients for the 5 on 3
    // paths at the widest pack, and for f32 on the phased shared path; then the parameter
    // gradients' 6 stage-1 and 3 stage-2 kernels, and the 3 that write a weight's shifted
    // copies.
    assert_eq!(
        kernels.len(),
        (2 * 7 + 5) * 6 * 2 + 3 * 2 * 5 + 5 * 4 + 6 + 3 + 3,
        "kinds x dtypes x paths x packs + phased + gathering + param grads + copies"
    );
    let per_column =
        |name: &str| name.starts_with("rill_norm_param_grad") || name.starts_with("rill_norm_column_copies");
    assert_eq!(kernels.iter().filter(|(name, _)| per_column(name)).count(), 6 + 3 + 3);
    for (name, body) in &kernels {
        assert!(!body.contains(".local"), "{name}: uses local memory");
        assert!(!calls_a_function(body), "{name}: calls a function (a panic path?)");
        assert!(!body.contains("div.rn.f32") && !body.contains("div.full"), "{name}: IEEE division");
        if per_column(name) {
            continue;
        }
        assert!(body.contains("shfl.sync.bfly.b32"), "{name}: no butterfly shuffle");
        // The residual add computes what it caches; the others copy rows to shared memory.
        check_row_loads(name, body, name.ends_with("_p4") || name.ends_with("_p8"), !name.contains("_add_forward_"));
        let block_path = name.contains("_shared_") || name.contains("_uncached_");
        let gathers = check_gathering(name, body);
        let barriers = block_path || gathers;
        assert_eq!(body.contains("bar.sync"), barriers, "{name}: barriers only on the block paths and gathers");
        // Rows from their heads: f32 rows read the weight an element at a time; 16-bit rows
        // read its packs whole from the shifted copies, so their only single-element loads
        // are the edges' and the per-row statistics' (a pack read by element is 8 loads, at
        // 2-4 places a kernel).
        if name.contains("_phased_") {
            let scalar_loads = body.matches("ld.global.nc.u16").count() + body.matches("ld.global.nc.u32").count();
            if name.ends_with("_p4") {
                assert!(body.contains("ld.global.nc.u32"), "{name}: the weight is not read an element at a time");
            } else {
                assert!(scalar_loads < 16, "{name}: {scalar_loads} single-element loads; the weight's copies unread?");
            }
        }
        if name.starts_with("rill_norm_forward_") || name.starts_with("rill_norm_add_forward_") {
            assert!(body.contains("rsqrt.approx"), "{name}: no rsqrt.approx");
        }
        if name.ends_with("_p4") || name.ends_with("_p8") {
            check_row_stores(name, body);
        }
    }
}

/// A user's fused kernels, as the example's own `build.rs` built them from rill's bodies
/// and its int8 Load: every path and pack the planner may ask for is exported, under the
/// symbol the host asks for (`<family>_<path:?>_p<pack>`), and each keeps the row engine's
/// accesses (int8 rows 8 bytes a pack, bf16 16) without local memory.
#[test]
fn a_users_fused_kernels_keep_the_row_engines_accesses() {
    use rill_example_fused_dequant_softmax::{PACK, PTX};
    use rill_kernels_gpu::table::RowPath;
    let kernels = entries(PTX);
    for (name, body) in &kernels {
        assert!(!body.contains(".local"), "{name}: uses local memory");
        assert!(!calls_a_function(body), "{name}: calls a function (a panic path?)");
        assert!(!body.contains("div.rn.f32"), "{name}: IEEE division");
        if name.starts_with("squared_relu_") {
            assert!(body.contains("ld.global.nc.v4.u32"), "{name}: no 16-byte load");
            // From f32 to bf16 a pack of 16 bytes in writes 8.
            assert!(body.contains("st.global.v4.u32") || name.ends_with("_f32_bf16"), "{name}: no 16-byte store");
        }
    }
    let families = ["dequant_softmax", "dequant_norm"];
    let paths = RowPath::WARP.into_iter().chain([RowPath::Shared, RowPath::Uncached]);
    // Phased kernels are exported where the family has rows that run from their heads.
    let paths = paths.chain([RowPath::SharedPhased, RowPath::UncachedPhased]);
    let mut checked = 0;
    for (family, path) in families.into_iter().flat_map(|family| paths.clone().map(move |path| (family, path))) {
        for pack in [1, PACK] {
            let symbol = format!("{family}_{path:?}_p{pack}");
            let Some((_, body)) = kernels.iter().find(|(name, _)| *name == symbol) else {
                assert!(path.phased(), "{symbol} not exported");
                continue;
            };
            checked += 1;
            assert!(body.contains("shfl.sync.bfly.b32"), "{symbol}: no butterfly shuffle");
            let block_path = path.warp_elements() == 0;
            assert_eq!(body.contains("bar.sync"), block_path, "{symbol}: barriers only on the block paths");
            if pack == 1 {
                continue;
            }
            // The int8 logits in 8-byte packs (copied into the row cache by `cp.async` on
            // the shared path), the bf16 bias read and the bf16 output written 16 bytes at a
            // time (as the engine's own kernels store); single int8 loads only at the edges of
            // rows run from their heads.
            let shared = matches!(path, RowPath::Shared | RowPath::SharedPhased);
            let logits = if shared { "cp.async.ca.shared.global" } else { "ld.global.nc.v2.u32" };
            for access in [logits, "ld.global.nc.v4.u32"] {
                assert!(body.contains(access), "{symbol}: no {access}");
            }
            check_row_stores(&symbol, body);
            assert_eq!(body.contains("ld.global.nc.u8"), path.phased(), "{symbol}: single int8 loads");
        }
    }
    // Every row kernel of the PTX is one of those checked.
    let row_kernels = kernels.iter().filter(|(name, _)| families.iter().any(|f| name.starts_with(&format!("{f}_"))));
    assert_eq!(row_kernels.count(), checked, "row kernels under symbols the host does not ask for");
}

/// An H100 as the planner knows it, for calls checked on an offline GPU.
fn offline_h100() -> rill::Gpu {
    rill::Gpu::offline(rill::DeviceInfo {
        name: "an offline H100".into(),
        ordinal: 0,
        compute_capability: (9, 0),
        multiprocessors: 132,
        max_threads_per_multiprocessor: 2048,
        max_shared_bytes_per_block_optin: 232_448,
        max_shared_bytes_per_multiprocessor: 233_472,
        l2_bytes: 52_428_800,
        dram_bytes_per_second: 3_352_320_000_000,
        driver_api: (13, 0),
    })
}

/// Calls the fuzz checks without a device, on an offline GPU.
const OFFLINE_FUZZ_CALLS: usize = 20_000;

/// The fuzz's calls on an offline GPU (views over made-up addresses, 4 GiB apart): each one
/// with a planted defect fails with a typed error, each other one passes every check and
/// fails only at the first driver call (or, empty, does nothing), and none panics.
#[test]
fn fuzzed_calls_are_refused_exactly_where_they_are_bad() {
    use rill_tests::fuzz::{addresses, call, generate};
    let seed = rill_tests::random::run_seed();
    println!("fuzz seed {seed} (RILL_SEED={seed} repeats it)");
    let gpu = offline_h100();
    let stream = gpu.stream().unwrap();
    let mut rng = rill_tests::random::Rng::new(seed);
    let (mut failures, mut refused) = (Vec::new(), 0);
    for _ in 0..OFFLINE_FUZZ_CALLS {
        let case = generate(&mut rng);
        let at = addresses(&case, |k| {
            (0x7f00_0000_0000 + ((k as u64) << 32)) + (case.arrays[k].offset * case.arrays[k].dtype.size()) as u64
        });
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(&stream, &case, at)));
        let verdict = match (&case.defect, outcome) {
            (_, Err(_)) => Some("panicked".to_string()),
            (Some(_), Ok(Err(rill::Error::InvalidInput(_) | rill::Error::Unsupported(_)))) => {
                refused += 1;
                None
            }
            (Some(_), Ok(other)) => Some(format!("was not refused: {other:?}")),
            (None, Ok(Ok(()) | Err(rill::Error::Driver { code: 100, .. }))) => None,
            (None, Ok(Err(error))) => Some(format!("failed: {error}")),
        };
        if let Some(verdict) = verdict {
            failures.push(format!("{} {verdict}", case.describe()));
        }
    }
    println!("{OFFLINE_FUZZ_CALLS} calls, {refused} refused as planted");
    assert!(
        failures.is_empty(),
        "{} of {OFFLINE_FUZZ_CALLS} calls (seed {seed}):\n{}",
        failures.len(),
        failures[..failures.len().min(20)].join("\n")
    );
}
