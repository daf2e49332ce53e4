//! The seeds reach every surface and draw every fault: a fault that silently stopped being drawn, or
//! a surface the world no longer reaches, fails here instead of leaving a blind spot.

use samekey_sim::coverage::{Coverage, Fault, Surface};
use samekey_sim::{held_back, run};

#[test]
fn a_hundred_seeds_draw_every_fault_and_reach_every_surface() {
    let mut coverage = Coverage::default();
    for seed in 0..100 {
        coverage.merge(&run(seed).expect("a runtime").coverage);
    }
    for fault in Fault::ALL {
        let drawn: u64 = Surface::ALL.iter().map(|s| coverage.count(fault, *s)).sum();
        assert!(
            drawn > 0,
            "{fault:?} was never drawn in 100 seeds: {coverage}"
        );
    }
    for surface in Surface::ALL {
        let hit: u64 = Fault::ALL.iter().map(|f| coverage.count(*f, surface)).sum();
        assert!(
            hit > 0,
            "no fault ever hit {surface:?} in 100 seeds: {coverage}"
        );
    }
    assert!(coverage.pairs() >= 60, "{coverage}");
}

#[test]
fn every_held_back_fault_is_one_the_simulation_knows() {
    assert_eq!(held_back().len(), samekey_sim::HELD_BACK.len());
}
