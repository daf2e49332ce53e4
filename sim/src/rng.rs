//! [`Draws`]: every choice the simulation makes, from one seed.
//!
//! # Guarantees
//!
//! * One seed gives one sequence of draws; the world draws in an order fixed by its (deterministic)
//!   schedule, so the same seed gives the same history.
//! * Faults are drawn only while the fault window is open ([`Draws::faulty`]): once it closes every
//!   component behaves, so that the invariants about "nothing lost" and "nothing hangs" can be judged.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::coverage::{Fault, Surface, Without};

/// The seeded source of every choice, and the end of the window in which faults may be drawn.
pub struct Draws {
    rng: Mutex<fastrand::Rng>,
    /// The lease renewals' own stream: how many renewals a call makes depends on how long its work
    /// runs, so their draws are kept apart from the others (a renewal more or fewer shifts nothing
    /// else).
    renewals: Mutex<fastrand::Rng>,
    faults_until: Instant,
    without: BTreeSet<Without>,
}

impl Draws {
    /// Draws from `seed`; faults may be drawn until `faults_until`.
    pub fn new(seed: u64, faults_until: Instant, without: BTreeSet<Without>) -> Draws {
        Draws {
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            renewals: Mutex::new(fastrand::Rng::with_seed(seed ^ 0x5eed_1ea5_e000_0000)),
            faults_until,
            without,
        }
    }

    /// `fault`, unless the run was told to go without it (everywhere, or at `surface`). The fault
    /// was drawn all the same, so the history is the seed's up to where it would have struck; after
    /// that the two histories part (a fault injected draws and waits where one left out does not).
    pub fn keep(&self, fault: Option<Fault>, surface: Surface) -> Option<Fault> {
        fault.filter(|f| !self.without.iter().any(|w| w.covers(*f, surface)))
    }

    fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rng)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.with(|r| r.u64(0..n))
    }

    /// A number in `lo..=hi`.
    pub fn between(&self, lo: u64, hi: u64) -> u64 {
        self.with(|r| r.u64(lo..=hi.max(lo)))
    }

    /// True with `percent` % odds.
    pub fn chance(&self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A duration of `lo..=hi` milliseconds.
    pub fn ms(&self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.between(lo, hi))
    }

    /// How long a lease renewal waits before it reaches the store, if it is drawn to wait (one in ten
    /// while the fault window is open: 1 to 8 s, as a renewal that waits on a row lock the work's own
    /// transaction holds until its `COMMIT`). From the renewals' own stream.
    pub fn renewal_wait(&self) -> Option<Duration> {
        if !self.faulty() {
            return None;
        }
        let mut rng = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        (rng.u64(0..10) == 0).then(|| Duration::from_millis(rng.u64(1_000..=8_000)))
    }

    /// Whether the fault window is still open.
    pub fn faulty(&self) -> bool {
        Instant::now() < self.faults_until
    }

    /// True with `percent` % odds while the fault window is open, else false (drawing nothing).
    pub fn fault(&self, percent: u64) -> bool {
        self.faulty() && self.chance(percent)
    }

    /// When the fault window closes.
    pub fn faults_until(&self) -> Instant {
        self.faults_until
    }

    /// Lets other ready tasks run first, a drawn number of times (0 to 2): the seeded part of the
    /// scheduler. Each component calls it at its boundaries (a store operation, a network hop, a
    /// delivery), so that the order in which ready tasks run is the seed's, not only tokio's FIFO.
    pub async fn shuffle(&self) {
        for _ in 0..self.below(3) {
            tokio::task::yield_now().await;
        }
    }
}
