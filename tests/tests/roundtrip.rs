//! Property: whatever is appended (any decisions, batch sizes, rotations) verifies
//! intact, and the auditor sees exactly what was appended, in seq order.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tally_ledger::keys::AuditorKey;
use tally_ledger::Rotation;
use tally_tests::*;
use tally_verify::Verdict::Intact;

#[derive(Clone, Debug)]
enum Op {
    Batch(Vec<u64>),
    Rotate,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec(0u64..1000, 1..6).prop_map(Op::Batch),
        1 => Just(Op::Rotate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn appended_decisions_verify_and_reach_the_auditor_in_order(
        ops in prop::collection::vec(op(), 1..8),
        records in prop::option::of(2u64..8),
    ) {
        let rotation = Rotation { records: records.unwrap_or(u64::MAX), ms: u64::MAX };
        let mut fx = Fixture::build(&AuditorKey::generate(), rotation, &[]);
        for op in &ops {
            match op {
                Op::Batch(ids) => fx.append_batch(ids.iter().copied().map(decision).collect()),
                Op::Rotate => fx.apply(&[Step::Rotate]),
            }
        }
        let (report, events) = verify_export_events(&fx.export(), &fx.auditor_options()).expect("export");
        prop_assert_eq!(report.verdict(), Intact, "{}", report.to_text());
        prop_assert_eq!(report.decisions, fx.appended.len() as u64);
        prop_assert_eq!(report.decrypted, Some(fx.appended.len() as u64));
        prop_assert_eq!(report.epochs, fx.ledger.epoch() + 1);
        prop_assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
        let got: Vec<_> = events.into_iter().map(|e| *e.decision).collect();
        prop_assert_eq!(got, fx.appended);
    }
}
