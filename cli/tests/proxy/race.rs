use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_requests_never_settle_more_than_the_budget() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &policy(&upstream, 100));
    let token = served.start_run("race").await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (addr, auth) = (served.proxy, bearer(&token));
        tasks.push(tokio::spawn(async move {
            let stream = i % 2 == 0;
            call(
                addr,
                "/openai/v1/chat/completions",
                &[("authorization", &auth)],
                chat(
                    "fake-ok",
                    json!({"max_tokens": 50, "stream": stream, "user": i.to_string()}),
                ),
            )
            .await
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        let a = t.await.expect("task");
        let s = a.status;
        if s != 200 {
            eprintln!("{s} {}", a.text());
        }
        assert!(s == 200 || s == 403 || s == 429, "{s}");
        allowed += usize::from(s == 200);
    }
    let st = served.settled("race").await;
    let settled = st["settled_nanos"].as_u64().expect("settled");
    assert!(settled <= 100 * 10_000_000, "{st}");
    assert_eq!(settled, 51_000_000 * allowed as u64, "{st}");
    assert!(allowed >= 10, "{allowed} allowed");
    assert_eq!(st["held_nanos"], 0, "{st}");
    served.verifies_the_bill(&upstream, &prices(), 0);
    let h = served.handoff("race");
    assert_eq!(h["spend"]["settled_nanos"].as_u64(), Some(settled), "{h}");
}

/// The racers' model: with `tools`, the fake bills 5,000 tool-prompt tokens on top of 100
/// input (and 50 output), where the policy counts 100 for the tool prompt: every call
/// settles above what it reserved.
const RACER: &str = "fake-bill-tools-5000-0";

/// The test policy with [`RACER`] priced like the others, runs of 30 cents, and where
/// `principal_cents` is given a principal budget of that many cents for every uid (the
/// runs' own budget then 1,000 cents, so the principal's is the one that binds).
fn racing_policy(upstream: &FakeUpstream, principal_cents: Option<u64>) -> String {
    let run_cents = if principal_cents.is_some() { 1000 } else { 30 };
    let mut p = policy(upstream, run_cents);
    p.push_str(&format!(
        "[prices.anthropic.\"{RACER}\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\ntool_prompt_tokens = 100\n"
    ));
    if let Some(cents) = principal_cents {
        p.push_str(&format!("[principals.default]\nspend_cents = {cents}\n"));
    }
    p
}

/// Racer `i`'s message: a tool and a prompt of its own, streamed for odd `i`.
fn racer(i: usize) -> Vec<u8> {
    json!({"model": RACER, "max_tokens": 50, "stream": i % 2 == 1,
           "tools": [{"name": "get_weather", "description": "The weather in a city.",
                      "input_schema": {"type": "object"}}],
           "messages": [{"role": "user", "content": format!("{PROMPT} Racer {i:02}.")}]})
    .to_string()
    .into_bytes()
}

/// What a refused call's answer gives as the reason: the cause of an `approval_required`,
/// else the reason.
fn refused_for(a: &Answer) -> String {
    let v = a.json();
    let t = &v["tally"];
    t["cause"]
        .as_str()
        .or(t["reason"].as_str())
        .unwrap_or_else(|| panic!("no reason: {}", a.text()))
        .to_owned()
}

/// 64 calls at once on the last cents of a budget (a run's, or with `principal` its
/// owner's across 64 runs, one call each), each billed above its reservation. Every call
/// goes through or is refused for that budget; the bound is one call per slot: no more
/// calls went through than the reservations the budget had room for, and each overran by
/// exactly its own excess, so the settled total passes the limit by no more than the
/// overruns. `tally verify` lists each overrun with the seq of the outcome that records
/// it, and every later racer is refused: when a racer was refused, the budget's settled
/// and held spend left less room than a racer reserves, and every call then in flight
/// settled above its reservation, so less is left after the race. (A smaller call may
/// still fit: how many racers got a slot before others were refused depends on timing.)
async fn race_the_last_cents(principal: bool) {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let text = racing_policy(&upstream, principal.then_some(30));
    let mut served = Served::new_with(
        dir.path(),
        &text,
        &["--proxy-max-connections-per-peer", "128"],
    );
    let limit = 30 * 10_000_000;
    // The first call spends some of the budget, honestly billed: $0.051.
    let token = served.start_run("first").await;
    let a = call(
        served.proxy,
        "/anthropic/v1/messages",
        &[("x-api-key", &token)],
        chat("fake-ok", json!({"max_tokens": 50})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let prior = served.settled("first").await["settled_nanos"]
        .as_u64()
        .expect("settled");
    assert_eq!(prior, 51_000_000);
    let mut runs = vec!["first".to_owned()];
    let mut tokens = vec![];
    for i in 0..64 {
        if principal {
            let run = format!("p{i:02}");
            tokens.push(served.start_run(&run).await);
            runs.push(run);
        } else {
            tokens.push(token.clone());
        }
    }
    let tasks: Vec<_> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, token)| {
            let addr = served.proxy;
            tokio::spawn(async move {
                call(
                    addr,
                    "/anthropic/v1/messages",
                    &[("x-api-key", &token)],
                    racer(i),
                )
                .await
            })
        })
        .collect();
    let refusals: &[&str] = if principal {
        &["principal_budget_exceeded"]
    } else {
        &["reservation_insufficient", "budget_exceeded"]
    };
    let mut allowed = 0;
    for t in tasks {
        let a = t.await.expect("task");
        match a.status {
            200 => allowed += 1,
            // Anthropic's dialect answers a refusal 402 (docs/PROXY.md).
            402 => assert!(refusals.contains(&refused_for(&a).as_str()), "{}", a.text()),
            s => panic!("{s}: {}", a.text()),
        }
    }
    assert!(allowed >= 1, "no racer went through");
    // Every later racer is refused, for the budget, and nothing more is forwarded.
    if principal {
        let (status, v) = served
            .agent("POST", "/v1/runs", Some(json!({"run": "late"})))
            .await;
        if status == 201 {
            let token = v["token"].as_str().expect("token");
            let a = call(
                served.proxy,
                "/anthropic/v1/messages",
                &[("x-api-key", token)],
                racer(64),
            )
            .await;
            assert_eq!(a.status, 402, "{}", a.text());
            assert_eq!(refused_for(&a), "principal_budget_exceeded");
            runs.push("late".into());
        } else {
            assert_eq!(status, 403, "{v}");
            assert_eq!(v["error"]["code"], "principal_budget_exceeded", "{v}");
        }
    } else {
        let a = call(
            served.proxy,
            "/anthropic/v1/messages",
            &[("x-api-key", &token)],
            racer(64),
        )
        .await;
        assert_eq!(a.status, 402, "{}", a.text());
        assert!(refusals.contains(&refused_for(&a).as_str()), "{}", a.text());
    }
    assert_eq!(upstream.seen().len(), 1 + allowed);
    for run in &runs {
        served.settled(run).await;
    }
    let mut p = prices();
    p.push((RACER, Price::usd(10, 1000)));
    let report = served.verifies_the_bill(&upstream, &p, 0);
    assert_eq!(report["audit"]["findings"], json!([]), "{report}");
    // Each racer billed 5,100 in and 50 out: $0.101.
    let bill = 5100 * 10_000 + 50 * 1_000_000;
    let decisions: Vec<Value> = runs.iter().flat_map(|r| served.decisions(r)).collect();
    // The racers' reservations: every allow but the first call's.
    let reserved: Vec<u64> = decisions
        .iter()
        .filter(|d| d["decision"]["kind"] == "allow")
        .skip(1)
        .map(|d| d["decision"]["reserve_nanos"].as_u64().expect("reserve"))
        .collect();
    assert_eq!(reserved.len(), allowed);
    let least = *reserved.iter().min().expect("a racer went through");
    // One call per slot: the racers that went through had room for their reservations.
    let slots = (limit - prior) / least;
    assert!(
        allowed as u64 <= slots,
        "{allowed} went through, {slots} slots"
    );
    // Each overran by its own excess, and only the racers did.
    let overruns = report["audit"]["overruns"].as_array().expect("overruns");
    assert_eq!(overruns.len(), allowed, "{report}");
    let total: u64 = overruns
        .iter()
        .map(|o| {
            let r = o["reserved_nanos"].as_u64().expect("reserved");
            assert!(reserved.contains(&r) && r < bill, "{o}");
            assert_eq!(o["overrun_nanos"], bill - r, "{o}");
            bill - r
        })
        .sum();
    let (_, handoffs) = tally().report(served.dir(), "handoff", &[]);
    let settled = Ledger::handed_off(&handoffs).settled_nanos;
    assert_eq!(settled, prior + allowed as u64 * bill);
    assert!(settled <= limit + total, "{settled}");
    // Verify names each overrun by the seq of the outcome that records it.
    let listed: std::collections::BTreeSet<u64> = overruns
        .iter()
        .map(|o| o["seq"].as_u64().expect("seq"))
        .collect();
    let recorded: std::collections::BTreeSet<u64> = decisions
        .iter()
        .filter(|d| d["decision"]["overrun_nanos"].is_u64())
        .map(|d| d["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(listed, recorded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_calls_billed_past_their_reservations_race_the_last_cents_of_a_run() {
    race_the_last_cents(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_calls_billed_past_their_reservations_race_the_last_cents_of_a_principal() {
    race_the_last_cents(true).await;
}
