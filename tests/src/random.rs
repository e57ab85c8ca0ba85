//! Seeded random inputs: fresh every run, reproducible from the printed seed.

/// SplitMix64: small, fast, and good enough for test data.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seed for this run: `RILL_SEED` if set, else drawn from the clock.
pub fn run_seed() -> u64 {
    std::env::var("RILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    })
}

/// The seed of one case: the run's seed mixed with the case's name.
pub fn case_seed(run_seed: u64, case: &str) -> u64 {
    case.bytes().fold(run_seed ^ 0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Where an op's inputs are drawn from: wide enough to reach both tails of every
/// activation, kept away from values whose result overflows a 16-bit type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Domain {
    /// Uniform in [-lo_hi, lo_hi].
    Symmetric(f64),
    /// Magnitude uniform in [lo, hi], random sign (divisors).
    AwayFromZero(f64, f64),
}

impl Domain {
    pub fn sample(self, rng: &mut Rng) -> f64 {
        match self {
            Domain::Symmetric(r) => rng.uniform(-r, r),
            Domain::AwayFromZero(lo, hi) => {
                let m = rng.uniform(lo, hi);
                if rng.next_u64() & 1 == 0 { m } else { -m }
            }
        }
    }
}
