//! Entropy sources for the sequence generator: a seeded PRNG and a byte string.

/// Where the generator's choices come from.
pub trait Source {
    /// Returns a number in `0..n` (0 if `n` is 0 or 1).
    fn below(&mut self, n: u64) -> u64;

    /// Returns true once a byte source has no bytes left; a PRNG never runs out.
    fn exhausted(&self) -> bool;
}

/// splitmix64 (Steele, Lea and Flood): tiny, fast and good enough to drive tests.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// Returns a generator seeded with `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// Returns the next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Source for SplitMix64 {
    fn below(&mut self, n: u64) -> u64 {
        if n <= 1 { 0 } else { self.next_u64() % n }
    }

    fn exhausted(&self) -> bool {
        false
    }
}

/// Reads choices from fuzzer bytes: one byte for a choice among at most 256, two for at most
/// 65536, eight otherwise; zeros once the bytes run out. Total: any input is usable.
#[derive(Debug, Clone)]
pub struct ByteSource<'a> {
    bytes: &'a [u8],
}

impl<'a> ByteSource<'a> {
    /// Returns a source reading `bytes` from the start.
    pub fn new(bytes: &'a [u8]) -> ByteSource<'a> {
        ByteSource { bytes }
    }

    fn take(&mut self, len: usize) -> u64 {
        let len = len.min(self.bytes.len());
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        head.iter().fold(0, |acc, b| (acc << 8) | u64::from(*b))
    }
}

impl Source for ByteSource<'_> {
    fn below(&mut self, n: u64) -> u64 {
        let raw = match n {
            0 | 1 => return 0,
            2..=256 => self.take(1),
            257..=65536 => self.take(2),
            _ => self.take(8),
        };
        raw % n
    }

    fn exhausted(&self) -> bool {
        self.bytes.is_empty()
    }
}
