//! The simulation's random numbers: splitmix64, seeded per run, so a seed names one sequence
//! of steps on every machine.
//!
//! Nothing else in the simulation draws randomness: every choice of a step, a key, a value or
//! a fault point comes from the [`Rng`] of its seed.

/// A splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// Returns the generator of `seed`.
    pub fn new(seed: u64) -> Rng {
        // Mixed once, so seeds 1, 2, 3... do not start from neighbouring states.
        let mut rng = Rng {
            state: seed ^ 0x6a09_e667_f3bc_c909,
        };
        rng.next_u64();
        rng
    }

    /// Returns the next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Returns a number in `0..n` (`n > 0`); the modulo bias is negligible for the small `n`
    /// used here.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        self.next_u64() % n
    }

    /// Returns a number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// Returns true with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Returns an index chosen with the given weights (not all zero).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut pick = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if pick < *w {
                return i;
            }
            pick -= w;
        }
        unreachable!("pick below the total weight")
    }
}

#[test]
fn same_seed_same_sequence_and_bounds_hold() {
    let (mut a, mut b) = (Rng::new(7), Rng::new(7));
    let first: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
    assert_eq!(first, (0..100).map(|_| b.below(10)).collect::<Vec<_>>());
    assert!(first.iter().all(|n| *n < 10));
    assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    let mut c = Rng::new(3);
    let picks: Vec<usize> = (0..200).map(|_| c.weighted(&[0, 1, 3])).collect();
    assert!(!picks.contains(&0), "a zero weight is never picked");
    assert!(picks.contains(&1) && picks.contains(&2));
}
