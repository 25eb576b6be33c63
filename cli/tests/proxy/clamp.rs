//! `clamp_max_tokens` end to end: with it, a request whose own limit the run cannot pay
//! is forwarded with the limit lowered to what the run can pay, and the agent sees the
//! upstream's own answer cut at that limit; without it (the default), it is refused.

use super::*;

/// [`policy`] with `clamp_max_tokens` on `openai` (Chat and Responses) and `anthropic`,
/// an upstream `plain` as `openai` without it, and no approvals asked: a refusal is the
/// gate's own reason.
fn clamp_policy(upstream: &FakeUpstream) -> String {
    let mut text = policy(upstream, 1000)
        .replacen(
            "paths = [\"/v1/chat/completions\"]",
            "paths = [\"/v1/chat/completions\", \"/v1/responses\"]\nclamp_max_tokens = true",
            1,
        )
        .replacen(
            "paths = [\"/v1/messages\"]",
            "paths = [\"/v1/messages\"]\nclamp_max_tokens = true",
            1,
        );
    text.push_str(&format!(
        "[upstreams.plain]\nurl = \"{}\"\nkind = \"openai\"\ncredential = \"openai\"\n\
         paths = [\"/v1/chat/completions\"]\n\
         [prices.plain.\"fake-ok\"]\ninput_per_mtok = 10\noutput_per_mtok = \"1000\"\nmax_output_tokens = 100\n\
         [approvals]\nask_on = []\n",
        upstream.url()
    ));
    text
}

/// A run with 5 cents: fake-ok's 100 output tokens ($0.001 each) it cannot pay.
const BUDGET: u64 = 50_000_000;

async fn poor_run(served: &Served, run: &str) -> String {
    let (status, v) = served
        .agent(
            "POST",
            "/v1/runs",
            Some(json!({"run": run, "budget": {"spend_cents": BUDGET / 10_000_000}})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    v["token"].as_str().expect("token").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_the_run_cannot_pay_is_clamped_and_the_agent_sees_the_answer_cut_there() {
    let upstream = FakeUpstream::start(FakeOptions::default());
    let dir = tempfile::tempdir().expect("dir");
    let mut served = Served::new(dir.path(), &clamp_policy(&upstream));
    let message = json!({"model": "fake-ok", "max_tokens": 100,
                         "messages": [{"role": "user", "content": PROMPT}]});
    let calls = [
        (
            "chat",
            "/openai/v1/chat/completions",
            chat("fake-ok", json!({"max_tokens": 100})),
            "max_tokens",
        ),
        (
            "messages",
            "/anthropic/v1/messages",
            message.to_string().into_bytes(),
            "max_tokens",
        ),
        (
            "responses",
            "/openai/v1/responses",
            json!({"model": "fake-ok", "input": PROMPT, "max_output_tokens": 100})
                .to_string()
                .into_bytes(),
            "max_output_tokens",
        ),
    ];
    let mut limits = Vec::new();
    for (run, path, body, field) in calls {
        let token = poor_run(&served, run).await;
        let auth = bearer(&token);
        let h = if run == "messages" {
            [("x-api-key", token.as_str())]
        } else {
            [("authorization", auth.as_str())]
        };
        let a = call(served.proxy, path, &h, body).await;
        assert_eq!(a.status, 200, "{run}: {}", a.text());
        // The upstream's own words for an answer cut at the limit, and no error.
        let v = a.json();
        match run {
            "chat" => assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}"),
            "messages" => assert_eq!(v["stop_reason"], "max_tokens", "{v}"),
            _ => assert_eq!(
                (&v["status"], &v["incomplete_details"]["reason"]),
                (&json!("incomplete"), &json!("max_output_tokens")),
                "{v}"
            ),
        }
        let seen = upstream.seen().pop().expect("forwarded");
        assert_eq!(seen.limit_fields, [field], "{seen:?}");
        let limit = seen.max_tokens.expect("a limit");
        // Fewer than the 50 tokens fake-ok would say: the answer is cut there.
        assert!(limit < 50, "{run}: {limit}");
        assert_eq!(
            v["usage"]["output_tokens"]
                .as_u64()
                .or(v["usage"]["completion_tokens"].as_u64()),
            Some(limit),
            "{v}"
        );
        served.settled(run).await;
        limits.push((run, limit, seen.body_len as u64));
    }
    // Without the option: refused for what it can cost, nothing forwarded.
    let token = poor_run(&served, "plain").await;
    let before = upstream.seen().len();
    let a = call(
        served.proxy,
        "/plain/v1/chat/completions",
        &[("authorization", &bearer(&token))],
        chat("fake-ok", json!({"max_tokens": 100})),
    )
    .await;
    assert_eq!(a.status, 403, "{}", a.text());
    assert_eq!(
        a.json()["error"]["code"],
        "reservation_insufficient",
        "{}",
        a.text()
    );
    assert_eq!(
        upstream.seen().len(),
        before,
        "a refused call was forwarded"
    );
    served.verifies_the_bill(&upstream, &prices(), 0);
    // What each clamped call reserved is what it can cost: the forwarded body's bytes
    // (measured with the 20 digits of the longest limit) at the input price and the
    // lowered limit at the output price; the most the run can pay, to the token.
    for (run, limit, body_len) in limits {
        let reserved = served
            .decisions(run)
            .iter()
            .find(|d| d["decision"]["kind"] == "allow")
            .and_then(|d| d["decision"]["reserve_nanos"].as_u64())
            .expect("an allow");
        let input_bound = body_len - limit.to_string().len() as u64 + 20;
        assert_eq!(reserved, input_bound * 10_000 + limit * 1_000_000, "{run}");
        assert!(
            reserved <= BUDGET && reserved + 1_000_000 > BUDGET,
            "{run}: {reserved}"
        );
    }
}
