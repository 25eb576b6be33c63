//! `tally top`: the live page in a terminal (ratatui), and the plain table `tally runs`
//! and a `tally top` without a terminal (a pipe, `TERM=dumb`) print once. Both read the
//! daemon's snapshot (`GET /v1/live` on the operator socket): the daemon orders the runs
//! by the policy core's closeness rule; nothing here counts a budget.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use tally_api::client::Method;
use tally_api::LimitKey;
use tally_verify::text::shown;
use tally_wire::{LiveRun, LiveSnapshot};

use crate::cli::TopArgs;
use crate::operator::{gate, refused};
use crate::output::{out, outln};
use crate::Exit;

/// One page of the daemon's snapshot.
pub(crate) async fn snapshot(socket: &Path, page: usize) -> Result<LiveSnapshot> {
    gate(socket)
        .await?
        .request(Method::GET, &format!("/v1/live?page={page}"), None)
        .await
        .map_err(refused)
}

/// Every run, nearest to a limit first (all pages).
pub(crate) async fn all_runs(socket: &Path) -> Result<Vec<LiveRun>> {
    let mut out = Vec::new();
    for page in 0.. {
        let snap = snapshot(socket, page).await?;
        let total = usize::try_from(snap.total_runs).unwrap_or(usize::MAX);
        let empty = snap.runs.is_empty();
        out.extend(snap.runs);
        if empty || out.len() >= total {
            break;
        }
    }
    Ok(out)
}

/// `used/limit` of a dimension in a run's closeness; spend in dollars.
fn used(r: &LiveRun, dim: LimitKey) -> String {
    let each = &r.closeness.each;
    match each.iter().find(|h| h.dimension == dim) {
        Some(h) if dim == LimitKey::SpendNanos => format!("{}/{}", usd(h.used), usd(h.limit)),
        Some(h) => format!("{}/{}", h.used, h.limit),
        None => "-".into(),
    }
}

/// Nanodollars as people read them (`$0.15`).
fn usd(nanos: u64) -> String {
    tally_ledger::money::Nanos(nanos).to_string()
}

/// A run's nearest limit as people read it: `attempts 90%`, `spend 40%`.
fn nearest(r: &LiveRun) -> String {
    match &r.closeness.nearest {
        Some(d) => format!("{} {}%", d.label(), r.closeness.permille / 10),
        None => "no limit".into(),
    }
}

/// A run's last refusal and its action.
fn refusal(r: &LiveRun) -> (String, String) {
    match &r.last_refusal {
        Some(l) => (
            l.reason.clone(),
            l.action.clone().unwrap_or_else(|| "-".into()),
        ),
        None => ("-".into(), "-".into()),
    }
}

/// The row of cells a run is shown as (every agent-chosen string escaped).
fn cells(r: &LiveRun) -> [String; 9] {
    let (reason, action) = refusal(r);
    let state = match r.stop_reason {
        Some(s) => format!("{} ({})", r.state.as_str(), s.as_str()),
        None => r.state.as_str().to_owned(),
    };
    [
        shown(&r.run).into_owned(),
        state,
        nearest(r),
        used(r, LimitKey::Attempts),
        used(r, LimitKey::SpendNanos),
        usd(r.held_nanos),
        reason,
        action,
        // The run's clock: how long ago it started, as a person reads it.
        format!("{} ago", tally_verify::text::duration(r.at_ms)),
    ]
}

const HEADERS: [&str; 9] = [
    "RUN",
    "STATE",
    "NEAREST",
    "ATTEMPTS",
    "SPEND",
    "HELD",
    "LAST REFUSAL",
    "ACTION",
    "STARTED",
];

/// A plain table of `runs`, columns padded to their widest cell.
pub(crate) fn table(runs: &[LiveRun]) -> String {
    let rows: Vec<[String; 9]> = runs.iter().map(cells).collect();
    let mut width = HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_owned()
    };
    let mut out = line(&HEADERS.map(String::from));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// `tally runs` in text: every run, nearest to a limit first, with its last refusal.
pub fn runs_text(socket: &Path) -> Result<Exit> {
    let runs = block_on(all_runs(socket))?;
    if runs.is_empty() {
        outln!("no runs");
    } else {
        out!("{}", table(&runs));
    }
    Ok(Exit::Success)
}

fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// Whether to draw: a terminal that is not `dumb` on stdout.
fn interactive() -> bool {
    std::io::stdout().is_terminal()
        && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
}

/// `tally top`.
pub fn top(args: &TopArgs) -> Result<Exit> {
    let (socket, once) = (args.operator_socket.as_path(), args.once);
    if once || !interactive() {
        let snap = block_on(snapshot(socket, 0))?;
        let waiting = block_on(crate::desk::pending(socket))?.len();
        out!("{}", summary(&snap, waiting));
        out!("{}", table(&snap.runs));
        return Ok(Exit::Success);
    }
    let desk = crate::desk::Desk::new(args.approver_key.clone(), args.approver.clone());
    tui::run(socket, desk)
}

/// The line above the table: runs, breakers, refusals in the last minutes, approval
/// requests `waiting`.
fn summary(snap: &LiveSnapshot, waiting: usize) -> String {
    let breakers: Vec<String> = snap
        .breakers
        .iter()
        .map(|b| format!("{} {}", shown(&b.tool), b.state.as_str()))
        .collect();
    let refusals: u64 = snap.refusals.iter().map(|r| r.count).sum();
    format!(
        "{} open of {} runs; breakers not closed: {}; refusals in the last 15 min: {refusals}; waiting for approval: {}\n",
        snap.open_runs,
        snap.total_runs,
        if breakers.is_empty() { "none".into() } else { breakers.join(", ") },
        waiting,
    )
}

/// Column widths for `room` characters: each column as wide as its widest cell; when
/// they do not all fit, RUN and LAST REFUSAL (long, agent-chosen names and reason codes)
/// give up width first, down to 12 each, then every column is cut evenly from the right.
fn fit(content: [usize; 9], room: usize) -> [u16; 9] {
    const FLEXIBLE: [usize; 2] = [0, 6];
    const FLOOR: usize = 12;
    let mut w = content;
    let mut over = w.iter().sum::<usize>().saturating_sub(room);
    for i in FLEXIBLE {
        let give = over.min(w[i].saturating_sub(FLOOR));
        w[i] -= give;
        over -= give;
    }
    for i in (0..w.len()).rev() {
        if over == 0 {
            break;
        }
        let give = over.min(w[i].saturating_sub(1));
        w[i] -= give;
        over -= give;
    }
    w.map(|x| u16::try_from(x).unwrap_or(u16::MAX))
}

mod tui {
    use super::*;
    use crate::desk::Desk;
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
    use ratatui::layout::{Constraint, Layout, Rect};
    use ratatui::style::{Modifier, Style};
    use ratatui::text::Line;
    use ratatui::widgets::{Block, Paragraph, Row, Table};
    use tally_api::ApprovalRequest;

    pub fn run(socket: &Path, mut desk: Desk) -> Result<Exit> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut terminal = ratatui::init();
        let result = (|| -> Result<()> {
            let mut page = 0usize;
            loop {
                let snap = rt.block_on(snapshot(socket, page));
                let asks = rt
                    .block_on(crate::desk::pending(socket))
                    .unwrap_or_default();
                terminal.draw(|f| {
                    let [top, bottom] =
                        Layout::vertical([Constraint::Min(6), Constraint::Length(8)])
                            .areas(f.area());
                    draw(f, top, &snap, page, asks.len());
                    draw_desk(f, bottom, &desk, &asks);
                })?;
                if event::poll(Duration::from_millis(500))? {
                    if let Event::Key(k) = event::read()? {
                        if k.kind != KeyEventKind::Press {
                            continue;
                        }
                        if desk.noting() {
                            match k.code {
                                KeyCode::Enter => desk.deny(socket, &asks),
                                KeyCode::Esc => desk.cancel(),
                                KeyCode::Backspace => desk.erase(),
                                KeyCode::Char(c) => desk.type_char(c),
                                _ => {}
                            }
                            continue;
                        }
                        match k.code {
                            KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                            KeyCode::Char('n') | KeyCode::PageDown => page += 1,
                            KeyCode::Char('p') | KeyCode::PageUp => page = page.saturating_sub(1),
                            KeyCode::Char('j') | KeyCode::Down => desk.select(1, asks.len()),
                            KeyCode::Char('k') | KeyCode::Up => desk.select(-1, asks.len()),
                            KeyCode::Char('a') => desk.approve(socket, &asks),
                            KeyCode::Char('d') => desk.start_denial(&asks),
                            _ => {}
                        }
                    }
                }
            }
        })();
        ratatui::restore();
        result.map(|()| Exit::Success)
    }

    /// The approval requests waiting, the selected one marked, and what the last key did.
    fn draw_desk(f: &mut ratatui::Frame, area: Rect, desk: &Desk, asks: &[ApprovalRequest]) {
        let at = desk.selected(asks.len());
        let mut lines: Vec<Line> = Desk::lines(asks)
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                if i == at {
                    Line::styled(
                        format!("> {l}"),
                        Style::default().add_modifier(Modifier::REVERSED),
                    )
                } else {
                    Line::raw(format!("  {l}"))
                }
            })
            .collect();
        if lines.is_empty() {
            lines.push(Line::raw("no approval request is waiting"));
        }
        f.render_widget(
            Paragraph::new(lines).block(
                Block::bordered()
                    .title(format!("waiting for approval: {}", asks.len()))
                    .title_bottom(desk.said.clone()),
            ),
            area,
        );
    }

    fn draw(
        f: &mut ratatui::Frame,
        area: Rect,
        snap: &Result<LiveSnapshot>,
        page: usize,
        waiting: usize,
    ) {
        let [head, body] =
            Layout::vertical([Constraint::Length(3), Constraint::Min(3)]).areas(area);
        let snap = match snap {
            Ok(s) => s,
            Err(e) => {
                f.render_widget(
                    Paragraph::new(format!("tally top: {e:#}"))
                        .block(Block::bordered().title("tally top")),
                    area,
                );
                return;
            }
        };
        f.render_widget(
            Paragraph::new(summary(snap, waiting).trim_end().to_owned()).block(
                Block::bordered().title(format!("tally top: page {} (n/p, q quits)", page + 1)),
            ),
            head,
        );
        let runs = &snap.runs;
        let rows: Vec<Row> = runs.iter().map(|r| Row::new(cells(r).to_vec())).collect();
        let mut content = HEADERS.map(|h| h.chars().count());
        for r in runs {
            for (w, c) in content.iter_mut().zip(cells(r)) {
                *w = (*w).max(c.chars().count());
            }
        }
        // Inside the borders, one space between columns.
        let room = usize::from(body.width).saturating_sub(2 + HEADERS.len() - 1);
        let widths = super::fit(content, room).map(Constraint::Length);
        f.render_widget(
            Table::new(rows, widths)
                .header(
                    Row::new(HEADERS.to_vec()).style(Style::default().add_modifier(Modifier::BOLD)),
                )
                .block(Block::bordered().title("runs, nearest to a limit first")),
            body,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn columns_are_as_wide_as_their_cells_when_they_fit() {
        let content = [20, 27, 14, 8, 11, 5, 24, 6, 12];
        assert_eq!(fit(content, 200), content.map(|x| x as u16));
    }

    #[test]
    fn run_and_last_refusal_give_up_width_first() {
        // 160 columns of a terminal: 151 inside the borders and spaces; the cells want 171.
        let content = [60, 40, 14, 8, 11, 5, 19, 6, 8];
        let w = fit(content, 151);
        assert_eq!(w, [40, 40, 14, 8, 11, 5, 19, 6, 8]);
        assert_eq!(w.iter().map(|&x| usize::from(x)).sum::<usize>(), 151);
    }

    #[test]
    fn past_the_floors_every_column_is_cut_from_the_right() {
        let content = [30, 40, 14, 8, 11, 5, 30, 6, 12];
        let w = fit(content, 100);
        assert_eq!(w.iter().map(|&x| usize::from(x)).sum::<usize>(), 100);
        assert_eq!((w[0], w[6]), (12, 8));
        assert_eq!(&w[1..6], &[40, 14, 8, 11, 5]);
        assert_eq!(&w[7..], &[1, 1]);
    }
}
