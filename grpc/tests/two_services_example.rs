//! The `two_services` example's scenario as a test: over real gRPC, with the payment service's faults
//! and customers who give up and retry, every order is charged once, under one callId and the order's
//! traceId — and every kind of fault happened in each run.

#[path = "../examples/two_services.rs"]
mod two_services;

use two_services::Fault;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_is_charged_once_under_one_call_id_and_its_trace_id() {
    let (seven, three) = tokio::join!(two_services::scenario(7, 40), two_services::scenario(3, 40));
    for (seed, report) in [(7, seven), (3, three)] {
        assert_eq!(report.charged_twice, 0, "seed {seed}: {report:?}");
        assert_eq!(report.several_call_ids, 0, "seed {seed}: {report:?}");
        assert_eq!(
            report.other_trace_ids, 0,
            "seed {seed}: every charge under its order's traceId: {report:?}"
        );
        assert_eq!(report.paid_but_not_charged, 0, "seed {seed}: {report:?}");
        assert_eq!(report.paid, 40, "seed {seed}: every order paid: {report:?}");
        assert_eq!(report.charges, 40, "seed {seed}: {report:?}");
        for kind in Fault::ALL {
            assert!(
                report.faults_of(kind) > 0,
                "seed {seed}: no {kind:?} injected: {report:?}"
            );
        }
        assert!(
            report.disconnects > 0,
            "seed {seed}: no customer gave up mid-call: {report:?}"
        );
    }
}
