//! The scenario corpus of issue 4: small, realistic decision sequences, each telling one
//! story the analysis must get right (a loop, an inconsistency, a handoff).
//!
//! `tally demo` and the workspace tests append them through the real ledger; the
//! verifier's tests feed them to [`Analysis`](super::Analysis) directly. Every decision
//! has `at_ms` set (the run's own clock), carries `args_digest` rather than raw `args`,
//! and passes [`Decision::validate`]. Run names are unique across scenarios, and so are
//! tool names where runs could otherwise meet in one ledger.

use serde_json::{json, Value};
use tally_ledger::decision::{args_digest, Budget, Scope};
use tally_ledger::{Decision, Effect, Kind, Reason, Status};

/// Every scenario: its name and its decisions in append order.
pub fn scenarios() -> Vec<(&'static str, Vec<Decision>)> {
    vec![
        ("retry_storm", retry_storm()),
        ("legit_polling", legit_polling()),
        ("polling_past_allowance", polling_past_allowance()),
        ("lost_post", lost_post()),
        ("retry_after", retry_after()),
        ("approval_deadline", approval_deadline()),
        ("spend_overrun", spend_overrun()),
        ("chain_depth", chain_depth()),
        ("override_used_up", override_used_up()),
        ("refund_refused", refund_refused()),
        ("eight_workers", eight_workers()),
        ("fleet_storm", fleet_storm()),
        ("normal_run", normal_run()),
    ]
}

/// One decision under construction.
struct Rec(Decision);

fn rec(run: &str, kind: Kind, at_ms: u64) -> Rec {
    Rec(Decision {
        run: run.to_owned(),
        kind: Some(kind),
        at_ms: Some(at_ms),
        ..Decision::default()
    })
}

fn start(run: &str, goal: &str, budget: Budget) -> Decision {
    let mut r = rec(run, Kind::Start, 0);
    r.0.goal = Some(goal.to_owned());
    r.0.budget = Some(budget);
    r.0
}

fn stop(run: &str, at_ms: u64, reason: Reason) -> Decision {
    rec(run, Kind::Stop, at_ms).reason(reason).0
}

/// An allow or deny of `tool`/`operation` with these arguments (digested) and effect.
fn call(run: &str, kind: Kind, at_ms: u64, tool: &str, operation: &str, args: Value) -> Rec {
    let mut r = rec(run, kind, at_ms);
    r.0.tool = Some(tool.to_owned());
    r.0.operation = Some(operation.to_owned());
    r.0.args_digest = Some(args_digest(&args));
    r
}

fn allow(run: &str, at_ms: u64, tool: &str, operation: &str, args: Value, attempt: u64) -> Rec {
    call(run, Kind::Allow, at_ms, tool, operation, args).attempt(attempt)
}

fn deny(run: &str, at_ms: u64, tool: &str, operation: &str, args: Value, reason: Reason) -> Rec {
    call(run, Kind::Deny, at_ms, tool, operation, args).reason(reason)
}

fn outcome(run: &str, at_ms: u64, attempt: u64, status: Status) -> Rec {
    let mut r = rec(run, Kind::Outcome, at_ms).attempt(attempt);
    r.0.status = Some(status);
    r
}

impl Rec {
    fn worker(mut self, w: &str) -> Rec {
        self.0.worker = Some(w.to_owned());
        self
    }
    fn effect(mut self, e: Effect) -> Rec {
        self.0.effect = Some(e);
        self
    }
    fn attempt(mut self, n: u64) -> Rec {
        self.0.attempt = Some(n);
        self
    }
    fn reserve(mut self, cents: u64) -> Rec {
        self.0.reserve_cents = Some(cents);
        self
    }
    fn depth(mut self, d: u64) -> Rec {
        self.0.depth = Some(d);
        self
    }
    fn reason(mut self, r: Reason) -> Rec {
        self.0.reason = Some(r);
        self
    }
    fn settled(mut self, cents: u64) -> Rec {
        self.0.settled_cents = Some(cents);
        self
    }
    fn remote(mut self, r: &str) -> Rec {
        self.0.remote_ref = Some(r.to_owned());
        self
    }
    fn observed(mut self, s: &str) -> Rec {
        self.0.observed = Some(s.to_owned());
        self
    }
    fn retry_after(mut self, ms: u64) -> Rec {
        self.0.retry_after_ms = Some(ms);
        self
    }
}

fn budget(attempts: u64) -> Budget {
    Budget {
        attempts: Some(attempts),
        ..Budget::default()
    }
}

/// A worker retries a failing CRM lookup six times, identically, until the gate's
/// circuit breaker refuses it and the run stops.
fn retry_storm() -> Vec<Decision> {
    let run = "storm";
    let args = || json!({"account": "acme"});
    let mut out = vec![start(
        run,
        "Sync CRM contacts for acme",
        Budget {
            attempts: Some(20),
            spend_cents: Some(500),
            ..Budget::default()
        },
    )];
    for i in 0..6 {
        let at = 100 + i * 300;
        out.push(
            allow(run, at, "crm.lookup", "crm.lookup:acme", args(), i + 1)
                .worker("w1")
                .effect(Effect::Read)
                .reserve(10)
                .0,
        );
        out.push(outcome(run, at + 50, i + 1, Status::Error).settled(0).0);
    }
    out.push(
        deny(
            run,
            2000,
            "crm.lookup",
            "crm.lookup:acme",
            args(),
            Reason::CircuitOpen,
        )
        .worker("w1")
        .effect(Effect::Read)
        .retry_after(30_000)
        .0,
    );
    out.push(stop(run, 2010, Reason::CircuitOpen));
    out
}

/// An export job polled at the pace the upstream asks for, its state advancing until
/// it finishes: polling, but not a loop.
fn legit_polling() -> Vec<Decision> {
    let run = "poll-ok";
    let mut out = vec![start(
        run,
        "Export the orders table",
        Budget {
            attempts: Some(10),
            polls: Some(6),
            ..Budget::default()
        },
    )];
    out.push(
        allow(
            run,
            100,
            "export.create",
            "export.create",
            json!({"table": "orders"}),
            1,
        )
        .effect(Effect::IdempotentWrite)
        .reserve(5)
        .0,
    );
    out.push(
        outcome(run, 400, 1, Status::Running)
            .remote("ea91")
            .observed("queued")
            .retry_after(2000)
            .0,
    );
    let states = [
        (Status::Running, "queued"),
        (Status::Running, "running 40%"),
        (Status::Running, "running 80%"),
        (Status::Ok, "done"),
    ];
    for (i, (status, state)) in (0u64..).zip(states) {
        let at = 2500 * (i + 1);
        out.push(
            allow(
                run,
                at,
                "export.status",
                "export.status:ea91",
                json!({"id": "ea91"}),
                i + 2,
            )
            .effect(Effect::Read)
            .0,
        );
        let o = outcome(run, at + 100, i + 2, status)
            .remote("ea91")
            .observed(state);
        out.push(if status == Status::Ok {
            o.0
        } else {
            o.retry_after(2000).0
        });
    }
    out.push(stop(run, 10_200, Reason::Completed));
    out
}

/// An export that never leaves "queued": the run polls it within Retry-After but past
/// its allowance of three polls, is refused, and stops with the job still running.
fn polling_past_allowance() -> Vec<Decision> {
    let run = "poll-over";
    let mut out = vec![start(
        run,
        "Export the invoices table",
        Budget {
            attempts: Some(10),
            polls: Some(3),
            ..Budget::default()
        },
    )];
    out.push(
        allow(
            run,
            100,
            "export.create",
            "export.create",
            json!({"table": "invoices"}),
            1,
        )
        .effect(Effect::IdempotentWrite)
        .0,
    );
    out.push(
        outcome(run, 300, 1, Status::Running)
            .remote("eb12")
            .observed("queued")
            .retry_after(1000)
            .0,
    );
    for i in 0..3 {
        let at = 1500 * (i + 1);
        out.push(
            allow(
                run,
                at,
                "export.status",
                "export.status:eb12",
                json!({"id": "eb12"}),
                i + 2,
            )
            .effect(Effect::Read)
            .0,
        );
        out.push(
            outcome(run, at + 100, i + 2, Status::Running)
                .remote("eb12")
                .observed("queued")
                .retry_after(1000)
                .0,
        );
    }
    out.push(
        deny(
            run,
            6000,
            "export.status",
            "export.status:eb12",
            json!({"id": "eb12"}),
            Reason::PollAllowanceExhausted,
        )
        .effect(Effect::Read)
        .0,
    );
    out.push(stop(run, 6010, Reason::PollAllowanceExhausted));
    out
}

/// A card charge whose response is lost; the agent charges again (the gate lets it
/// through), the retry succeeds, and the run calls itself complete.
fn lost_post() -> Vec<Decision> {
    let run = "post";
    let args = || json!({"customer": "c_17", "amount_cents": 1999});
    let op = "payments.charge:order-5512";
    vec![
        start(
            run,
            "Charge customer c_17 for order 5512",
            Budget {
                attempts: Some(5),
                spend_cents: Some(200),
                side_effects: Some(3),
                ..Budget::default()
            },
        ),
        allow(run, 100, "payments.charge", op, args(), 1)
            .effect(Effect::NonIdempotentWrite)
            .reserve(30)
            .0,
        outcome(run, 5100, 1, Status::Unknown).0,
        allow(run, 5200, "payments.charge", op, args(), 2)
            .effect(Effect::NonIdempotentWrite)
            .reserve(30)
            .0,
        outcome(run, 5900, 2, Status::Ok)
            .remote("ch_88")
            .observed("succeeded")
            .settled(30)
            .0,
        stop(run, 6000, Reason::Completed),
    ]
}

/// Two geocoding runs meet a 429 with Retry-After: one waits and succeeds, the other
/// retries at once, three times, until the gate refuses it.
fn retry_after() -> Vec<Decision> {
    let ok = "ra-honoured";
    let bad = "ra-ignored";
    let tool = "maps.geocode";
    let mut out = vec![
        start(ok, "Geocode Berlin", budget(5)),
        allow(ok, 100, tool, tool, json!({"q": "Berlin"}), 1)
            .effect(Effect::Read)
            .0,
        outcome(ok, 200, 1, Status::Error).retry_after(2000).0,
        allow(ok, 2300, tool, tool, json!({"q": "Berlin"}), 2)
            .effect(Effect::Read)
            .0,
        outcome(ok, 2400, 2, Status::Ok).0,
        stop(ok, 2500, Reason::Completed),
        start(bad, "Geocode Paris", budget(10)),
    ];
    for i in 0..3 {
        let at = 100 + 300 * i;
        out.push(
            allow(bad, at, tool, tool, json!({"q": "Paris"}), i + 1)
                .effect(Effect::Read)
                .0,
        );
        out.push(
            outcome(bad, at + 50, i + 1, Status::Error)
                .retry_after(5000)
                .0,
        );
    }
    out.push(
        deny(
            bad,
            1000,
            tool,
            tool,
            json!({"q": "Paris"}),
            Reason::UpstreamBackoff,
        )
        .effect(Effect::Read)
        .retry_after(4750)
        .0,
    );
    out.push(stop(bad, 1010, Reason::UpstreamBackoff));
    out
}

/// A refund needs a human's approval; none comes before the run's one-minute deadline.
fn approval_deadline() -> Vec<Decision> {
    let run = "approval";
    let args = || json!({"order": 7731, "amount_cents": 4500});
    let op = "payments.refund:7731";
    vec![
        start(
            run,
            "Refund order 7731",
            Budget {
                attempts: Some(5),
                deadline_ms: Some(60_000),
                ..Budget::default()
            },
        ),
        allow(
            run,
            1000,
            "orders.get",
            "orders.get:7731",
            json!({"id": 7731}),
            1,
        )
        .effect(Effect::Read)
        .0,
        outcome(run, 1200, 1, Status::Ok).observed("paid").0,
        deny(
            run,
            2000,
            "payments.refund",
            op,
            args(),
            Reason::ApprovalRequired,
        )
        .effect(Effect::NonIdempotentWrite)
        .0,
        deny(
            run,
            61_000,
            "payments.refund",
            op,
            args(),
            Reason::RunDeadlineExhausted,
        )
        .effect(Effect::NonIdempotentWrite)
        .0,
        stop(run, 61_010, Reason::RunDeadlineExhausted),
    ]
}

/// A model call settles at more than twice its reservation; the gate still allows the
/// next call, which takes the run past its spend limit.
fn spend_overrun() -> Vec<Decision> {
    let run = "spend";
    let tool = "llm.complete";
    vec![
        start(
            run,
            "Summarise Q3 support tickets",
            Budget {
                attempts: Some(10),
                spend_cents: Some(100),
                ..Budget::default()
            },
        ),
        allow(
            run,
            100,
            tool,
            tool,
            json!({"prompt": "summarise batch 1"}),
            1,
        )
        .effect(Effect::Read)
        .reserve(40)
        .0,
        outcome(run, 3000, 1, Status::Ok)
            .remote("resp_1")
            .settled(85)
            .0,
        allow(
            run,
            3100,
            tool,
            tool,
            json!({"prompt": "summarise batch 2"}),
            2,
        )
        .effect(Effect::Read)
        .reserve(40)
        .0,
        outcome(run, 6000, 2, Status::Ok)
            .remote("resp_2")
            .settled(35)
            .0,
        deny(
            run,
            6100,
            tool,
            tool,
            json!({"prompt": "summarise batch 3"}),
            Reason::BudgetExceeded,
        )
        .effect(Effect::Read)
        .0,
        stop(run, 6110, Reason::BudgetExceeded),
    ]
}

/// An agent delegates the same task to a sub-agent, which delegates it again, one level
/// deeper each time; the gate lets depth 4 through and refuses depth 5.
fn chain_depth() -> Vec<Decision> {
    let run = "chain";
    let args = || json!({"task": "research competitor pricing"});
    let mut out = vec![start(
        run,
        "Research competitor pricing",
        Budget {
            attempts: Some(10),
            depth: Some(3),
            ..Budget::default()
        },
    )];
    for depth in 1..=4 {
        out.push(
            allow(
                run,
                100 * depth,
                "agent.delegate",
                "agent.delegate",
                args(),
                depth,
            )
            .depth(depth)
            .0,
        );
    }
    out.push(
        deny(
            run,
            500,
            "agent.delegate",
            "agent.delegate",
            args(),
            Reason::ChainDepthExceeded,
        )
        .depth(5)
        .0,
    );
    out.push(stop(run, 510, Reason::ChainDepthExceeded));
    out
}

/// A deployment runs out of attempts; a human approves two more for deploy.push, and the
/// gate allows a third beyond the approval.
fn override_used_up() -> Vec<Decision> {
    let run = "override";
    let tool = "deploy.push";
    let push = |at: u64, region: &str, attempt: u64| {
        allow(
            run,
            at,
            tool,
            &format!("{tool}:{region}"),
            json!({"release": "4.2", "region": region}),
            attempt,
        )
        .effect(Effect::IdempotentWrite)
        .0
    };
    let done = |at: u64, attempt: u64| {
        outcome(run, at, attempt, Status::Ok)
            .remote(&format!("dep_{attempt}"))
            .0
    };
    let mut approval = rec(run, Kind::Override, 5000).0;
    approval.approver = Some("dana@ops".to_owned());
    approval.scope = Some(Scope {
        attempts: Some(2),
        tool: Some(tool.to_owned()),
        ..Scope::default()
    });
    approval.expires_ms = Some(600_000);
    approval.note = Some("two more regions for 4.2".to_owned());
    vec![
        start(run, "Deploy release 4.2 to every region", budget(2)),
        push(100, "eu-1", 1),
        done(400, 1),
        push(500, "eu-2", 2),
        done(800, 2),
        deny(
            run,
            900,
            tool,
            "deploy.push:us-1",
            json!({"release": "4.2", "region": "us-1"}),
            Reason::AttemptsExhausted,
        )
        .effect(Effect::IdempotentWrite)
        .0,
        approval,
        push(5100, "us-1", 3),
        done(5400, 3),
        push(5500, "us-2", 4),
        done(5800, 4),
        push(5900, "ap-1", 5),
        done(6200, 5),
        stop(run, 6300, Reason::Completed),
    ]
}

/// The gate refuses an email (rate limit), the agent's wrapper refunds the refused
/// attempt anyway, and the gate honours the bogus slot: one send too many.
fn refund_refused() -> Vec<Decision> {
    let run = "refund";
    let tool = "mail.send";
    let send = |at: u64, to: &str, attempt: u64| {
        allow(
            run,
            at,
            tool,
            "mail.send:digest",
            json!({"to": to}),
            attempt,
        )
        .effect(Effect::NonIdempotentWrite)
        .0
    };
    let sent = |at: u64, attempt: u64| {
        outcome(run, at, attempt, Status::Ok)
            .remote(&format!("msg_{attempt}"))
            .0
    };
    let mut refund = rec(run, Kind::Refund, 710).0;
    refund.of = Some(3);
    refund.slots = Some(1);
    vec![
        start(run, "Send the weekly digest to four teams", budget(3)),
        send(100, "team-a", 1),
        sent(300, 1),
        send(400, "team-b", 2),
        sent(600, 2),
        deny(
            run,
            700,
            tool,
            "mail.send:digest",
            json!({"to": "team-c"}),
            Reason::RateLimitExceeded,
        )
        .effect(Effect::NonIdempotentWrite)
        .attempt(3)
        .retry_after(1000)
        .0,
        refund,
        send(1800, "team-c", 3),
        sent(2000, 3),
        send(2100, "team-d", 4),
        sent(2300, 4),
        stop(run, 2400, Reason::Completed),
    ]
}

/// Eight workers render pages on one budget of eight attempts; a racing ninth render is
/// allowed, a tenth refused.
fn eight_workers() -> Vec<Decision> {
    let run = "fleet";
    let tool = "render.page";
    let mut out = vec![start(
        run,
        "Render the eight pages of the annual report",
        Budget {
            attempts: Some(8),
            spend_cents: Some(400),
            ..Budget::default()
        },
    )];
    let render = |at: u64, page: u64, worker: &str| {
        allow(
            run,
            at,
            tool,
            &format!("{tool}:{page}"),
            json!({"page": page}),
            page,
        )
        .worker(worker)
        .effect(Effect::IdempotentWrite)
        .reserve(50)
        .0
    };
    let rendered = |at: u64, page: u64| {
        outcome(run, at, page, Status::Ok)
            .remote(&format!("page-{page}"))
            .settled(45)
            .0
    };
    for page in 1..=8 {
        out.push(render(100 + 5 * page, page, &format!("w{page}")));
    }
    for page in 1..=8 {
        out.push(rendered(2000 + 10 * page, page));
    }
    out.push(render(2100, 9, "w3"));
    out.push(rendered(2300, 9));
    out.push(
        deny(
            run,
            2400,
            tool,
            "render.page:10",
            json!({"page": 10}),
            Reason::AttemptsExhausted,
        )
        .worker("w5")
        .effect(Effect::IdempotentWrite)
        .0,
    );
    out.push(stop(run, 2410, Reason::AttemptsExhausted));
    out
}

/// Three runs hit the same failing billing API at the same time, each retrying twice:
/// no run alone is a storm, together they are.
fn fleet_storm() -> Vec<Decision> {
    let runs = ["sync-a", "sync-b", "sync-c"];
    let mut out: Vec<Decision> = runs
        .iter()
        .map(|r| start(r, "Sync invoices to billing", budget(5)))
        .collect();
    for round in 0..3 {
        for run in runs {
            let at = 1000 * round + 100;
            out.push(
                allow(
                    run,
                    at,
                    "billing.api",
                    "billing.api:sync",
                    json!({"account": run}),
                    round + 1,
                )
                .effect(Effect::IdempotentWrite)
                .0,
            );
            out.push(outcome(run, at + 100, round + 1, Status::Error).0);
        }
    }
    out.extend(runs.iter().map(|r| stop(r, 3500, Reason::KilledByOperator)));
    out
}

/// A healthy, busy run: distinct reads, re-reads separated by writes, one retry that
/// succeeds, a build polled patiently to success. Nothing to report.
fn normal_run() -> Vec<Decision> {
    let run = "normal";
    let mut out = vec![start(
        run,
        "Fix the flaky login test",
        Budget {
            attempts: Some(100),
            spend_cents: Some(1000),
            side_effects: Some(10),
            polls: Some(10),
            deadline_ms: Some(600_000),
            ..Budget::default()
        },
    )];
    let mut attempt = 0;
    let mut next = || {
        attempt += 1;
        attempt
    };
    for i in 0..20u64 {
        let a = next();
        let at = 1000 * (i + 1);
        out.push(
            allow(
                run,
                at,
                "repo.read",
                "repo.read",
                json!({"path": format!("src/auth/{i}.rs")}),
                a,
            )
            .effect(Effect::Read)
            .0,
        );
        out.push(outcome(run, at + 50, a, Status::Ok).0);
    }
    // Read, edit, read again: the same read three times, but the world changed between.
    for i in 0..3u64 {
        let at = 30_000 + 2000 * i;
        let a = next();
        out.push(
            allow(
                run,
                at,
                "repo.read",
                "repo.read",
                json!({"path": "tests/login.rs"}),
                a,
            )
            .effect(Effect::Read)
            .0,
        );
        out.push(outcome(run, at + 50, a, Status::Ok).0);
        if i < 2 {
            let a = next();
            out.push(
                allow(
                    run,
                    at + 500,
                    "repo.write",
                    "repo.write",
                    json!({"path": "tests/login.rs", "rev": i}),
                    a,
                )
                .effect(Effect::IdempotentWrite)
                .0,
            );
            out.push(outcome(run, at + 600, a, Status::Ok).0);
        }
    }
    // One retry after a transient error, after the upstream's Retry-After.
    let a = next();
    out.push(
        allow(
            run,
            40_000,
            "ci.lint",
            "ci.lint",
            json!({"ref": "fix-login"}),
            a,
        )
        .effect(Effect::Read)
        .0,
    );
    out.push(outcome(run, 40_100, a, Status::Error).retry_after(1000).0);
    let a = next();
    out.push(
        allow(
            run,
            41_500,
            "ci.lint",
            "ci.lint",
            json!({"ref": "fix-login"}),
            a,
        )
        .effect(Effect::Read)
        .0,
    );
    out.push(outcome(run, 41_600, a, Status::Ok).0);
    // A build polled at the requested pace until it passes.
    let build = next();
    out.push(
        allow(
            run,
            50_000,
            "ci.build",
            "ci.build",
            json!({"ref": "fix-login"}),
            build,
        )
        .effect(Effect::IdempotentWrite)
        .reserve(20)
        .0,
    );
    out.push(
        outcome(run, 50_200, build, Status::Running)
            .remote("b7")
            .observed("queued")
            .retry_after(3000)
            .0,
    );
    for (i, (status, state)) in (0u64..).zip([
        (Status::Running, "running"),
        (Status::Running, "running"),
        (Status::Ok, "passed"),
    ]) {
        let at = 53_500 + 3500 * i;
        let a = next();
        let poll = allow(
            run,
            at,
            "ci.status",
            "ci.status:b7",
            json!({"build": "b7"}),
            a,
        )
        .effect(Effect::Read);
        // The last status read costs 15¢ (it fetches the logs): reserved before, as
        // every costed call must be (SPEC 3.1).
        out.push(if i == 2 { poll.reserve(15).0 } else { poll.0 });
        let o = outcome(run, at + 100, a, status)
            .remote("b7")
            .observed(state);
        out.push(if status == Status::Ok {
            o.settled(15).0
        } else {
            o.retry_after(3000).0
        });
    }
    out.push(stop(run, 70_000, Reason::Completed));
    out
}
