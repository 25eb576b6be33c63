//! The live page in a real headless Chromium.

use super::*;

/// A headless Chromium on the CDP driver (cli/tests/observe/cdp.py).
pub(crate) struct Browser {
    child: Child,
    /// Closed first on drop: the driver then kills Chromium itself (killing the driver
    /// alone would leave Chromium running).
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Browser {
    pub(crate) fn start() -> Option<Browser> {
        if !tally_testkit::have(
            "chromium",
            &[],
            "apt-get install chromium (README, Development)",
        ) || !python_has(
            "websocket",
            "pip install websocket-client==1.9.2 (README, Development)",
        ) {
            return None;
        }
        let mut child = Command::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/observe/cdp.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("cdp.py");
        let input = child.stdin.take().expect("stdin");
        let mut output = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        output.read_line(&mut line).expect("ready");
        assert!(
            line.contains("ready"),
            "the CDP driver did not start: {line:?}"
        );
        Some(Browser {
            child,
            input: Some(input),
            output,
        })
    }

    pub(crate) fn send(&mut self, cmd: Value) -> Value {
        writeln!(self.input.as_mut().expect("open"), "{cmd}").expect("send");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("answer");
        let v: Value = serde_json::from_str(&line).expect("json answer");
        assert!(v.get("error").is_none(), "{cmd}: {v}");
        v
    }

    pub(crate) fn eval(&mut self, js: &str) -> Value {
        self.send(json!({ "eval": js }))["value"].clone()
    }

    /// Evaluate `js` until `pred` holds of its value, for at most `within`; how long it
    /// took.
    pub(crate) fn until(
        &mut self,
        js: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Duration {
        let started = Instant::now();
        loop {
            let v = self.eval(js);
            if pred(&v) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "not within {within:?}: {js} is {v}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        drop(self.input.take());
        let started = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

const FIRST_RUN: &str = "(() => { const c = document.querySelector('#runs tbody tr td.run'); return c ? c.textContent : null; })()";

fn row_of(run: &str, col: &str) -> String {
    format!(
        "(() => {{ for (const tr of document.querySelectorAll('#runs tbody tr')) {{ if (tr.querySelector('td.run').textContent === {run}) {{ const c = tr.querySelector('td.{col}'); return c ? c.textContent : null; }} }} return null; }})()",
        run = json!(run)
    )
}

/// The page in a real headless Chromium: the run nearest its attempts is at the top, a
/// loop refusal shows within a second of the check, a breaker opening shows, and a run
/// name made of markup is shown as text and runs nothing. A screenshot under load is
/// written for docs/.
#[test]
fn the_live_page_in_chromium() {
    let Some(mut browser) = Browser::start() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path();
    ledger(dir);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _served = tally().serve(dir, &["--metrics-listen", &addr]);
    let served = &_served;
    let hostile =
        "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>";
    for (run, used) in [("calm", 1u64), ("busy", 3), (hostile, 2), ("nearly-out", 9)] {
        served.start_run(run, 10);
        for i in 0..used {
            served.check(run, "search", json!({"i": i}));
        }
    }
    browser.send(json!({"nav": format!("http://{addr}/live")}));
    browser.until(FIRST_RUN, Duration::from_secs(20), |v| v == "nearly-out");
    let title = browser.eval("document.title");
    assert_eq!(title, "tally: live");
    assert_eq!(browser.eval("typeof window.pwned"), "undefined");
    assert_eq!(
        browser.eval(&format!(
            "[...document.querySelectorAll('#runs td.run')].some(c => c.textContent === {})",
            json!(hostile)
        )),
        true,
        "the hostile run name is shown as text"
    );
    assert_eq!(
        browser.eval("document.querySelectorAll('#runs img, #runs script').length"),
        0
    );

    // A loop refusal: shown within two seconds of the check (the stream sends at most a
    // snapshot a second).
    for _ in 0..3 {
        served.call("calm", "search", json!({"q": "again"}));
    }
    let refused = served.call("calm", "search", json!({"q": "again"}));
    assert_eq!(refused["reason"], "loop_repeated_call", "{refused}");
    let took = browser.until(&row_of("calm", "last"), Duration::from_secs(2), |v| {
        v.as_str()
            .is_some_and(|s| s.starts_with("loop_repeated_call"))
    });
    assert!(took < Duration::from_secs(2), "{took:?}");
    let action = browser.eval(&row_of("calm", "action"));
    assert!(
        action.as_str().is_some_and(|a| a != "-" && !a.is_empty()),
        "{action}"
    );

    // A breaker opening: two failures of `flaky` in a row.
    served.start_run("breaks", 10);
    for i in 0..2 {
        let a = served.check("breaks", "flaky", json!({"i": i}));
        served.outcome("breaks", a["attempt"].as_u64().expect("attempt"), "error");
    }
    browser.until(
        "(() => { const r = document.querySelector('#breakers tbody tr'); return r ? r.textContent : null; })()",
        Duration::from_secs(5),
        |v| v.as_str().is_some_and(|s| s.starts_with("flakyopen")),
    );

    // Load: runs and refusals, then a screenshot for the docs.
    for r in 0..30 {
        let run = format!("agent-{r:02}");
        served.start_run(&run, 20);
        for i in 0..(r % 17) {
            served.check(&run, "search", json!({"i": i}));
        }
        if r % 5 == 0 {
            for _ in 0..5 {
                served.call(&run, "search", json!({"q": "stuck"}));
            }
        }
    }
    browser.until(
        "document.querySelectorAll('#runs tbody tr').length",
        Duration::from_secs(5),
        |v| v.as_u64() == Some(35),
    );
    let shot = std::env::var_os("TALLY_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("live.png"));
    browser.send(json!({"shot": shot}));
    assert!(std::fs::metadata(&shot).expect("screenshot").len() > 10_000);
    // The page on the agent socket: not there.
    let (status, _) = served.agent("GET", "/live", None);
    assert_eq!(status, 403);
}
