//! The `two_services` example's scenario as a test: over real HTTP, with the payment API's faults and
//! customers who give up and retry, every order is charged once, under one callId.
#![cfg(all(feature = "axum", feature = "reqwest"))]

#[path = "../examples/two_services.rs"]
mod two_services;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_once_under_one_call_id() {
    for seed in [7, 42] {
        let report = two_services::scenario(seed, 40).await;
        assert_eq!(report.charged_twice, 0, "seed {seed}: {report:?}");
        assert_eq!(report.several_call_ids, 0, "seed {seed}: {report:?}");
        assert_eq!(report.paid_but_not_charged, 0, "seed {seed}: {report:?}");
        assert_eq!(report.paid, 40, "seed {seed}: every order paid: {report:?}");
        assert_eq!(report.charges, 40, "seed {seed}: {report:?}");
        assert!(
            report.faults.iter().map(|(_, n)| n).sum::<u64>() > 0,
            "seed {seed}: faults were injected"
        );
    }
}
