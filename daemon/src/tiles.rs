//! The ledger as a C2SP tlog-tiles log, read only, on the operator socket:
//! `GET /v1/log/checkpoint` (the latest durable size, signed by the log key),
//! `GET /v1/log/tile/<L>/<N>[.p/<W>]` (Merkle tree tiles) and
//! `GET /v1/log/tile/entries/<N>[.p/<W>]` (entry bundles: the exact stored entries, each
//! prefixed by its length as a big-endian u16). Paths are parsed strictly (docs/DAEMON.md).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::App;

/// Add the tlog-tiles read paths to `router`.
pub(crate) fn log_routes(router: Router<Arc<App>>) -> Router<Arc<App>> {
    router
        .route("/v1/log/checkpoint", get(checkpoint))
        .route("/v1/log/tile/{*path}", get(tile))
}

async fn checkpoint(State(app): State<Arc<App>>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        app.ledger.signed_tree_head().to_text(),
    )
        .into_response()
}

/// A tile path: level (`None` for entry bundles), index, width.
fn parse_path(path: &str) -> Option<(Option<u8>, u64, u64)> {
    let (level, rest) = path.split_once('/')?;
    let level = match level {
        "entries" => None,
        l => {
            let n: u8 = canonical(l)?.try_into().ok()?;
            (n <= 63).then_some(n)?;
            Some(n)
        }
    };
    let (index, width) = match rest.split_once(".p/") {
        Some((i, w)) => {
            let w = canonical(w)?;
            ((1..=255).contains(&w)).then_some(())?;
            (i, w)
        }
        None => (rest, 256),
    };
    // `x001/x234/067`: 3-digit elements, all but the last with an `x`.
    let parts: Vec<&str> = index.split('/').collect();
    let mut n: u64 = 0;
    for (i, p) in parts.iter().enumerate() {
        let digits = if i + 1 < parts.len() {
            p.strip_prefix('x')?
        } else {
            p
        };
        if digits.len() != 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n = n.checked_mul(1000)?.checked_add(digits.parse().ok()?)?;
    }
    // One encoding per index: no leading `x000` element.
    if parts.len() > 1 && parts[0] == "x000" {
        return None;
    }
    Some((level, n, width))
}

fn canonical(s: &str) -> Option<u64> {
    tally_ledger::format::parse_decimal(s, "tile path").ok()
}

async fn tile(State(app): State<Arc<App>>, Path(path): Path<String>) -> Response {
    let Some((level, n, width)) = parse_path(&path) else {
        return (StatusCode::NOT_FOUND, "not a tile path\n").into_response();
    };
    let ledger = Arc::clone(&app.ledger);
    let size = ledger.checkpoint().size;
    let found = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, String> {
        match level {
            Some(l) => tally_ledger::tlog::tiles::Tiles::new(ledger.dir())
                .tile(size, l, n, width)
                .map_err(|e| e.to_string()),
            None => {
                let Some(end) = n.checked_mul(256).and_then(|s| s.checked_add(width)) else {
                    return Ok(None);
                };
                if end > size {
                    return Ok(None);
                }
                let seqs: BTreeSet<u64> = (n * 256..end).collect();
                let entries =
                    tally_ledger::prove::entries(ledger.dir(), &seqs).map_err(|e| e.to_string())?;
                let mut out = Vec::new();
                for (_, e) in entries {
                    let len = u16::try_from(e.len())
                        .map_err(|_| "an entry longer than an entry bundle holds".to_string())?;
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(&e);
                }
                Ok(Some(out))
            }
        }
    })
    .await;
    match found {
        Ok(Ok(Some(bytes))) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (header::CACHE_CONTROL, "max-age=31536000, immutable"),
            ],
            bytes,
        )
            .into_response(),
        Ok(Ok(None)) => (StatusCode::NOT_FOUND, "no such tile in this tree\n").into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_path;

    #[test]
    fn tile_paths_parse_one_way() {
        assert_eq!(parse_path("0/000"), Some((Some(0), 0, 256)));
        assert_eq!(
            parse_path("1/x001/x234/067.p/17"),
            Some((Some(1), 1_234_067, 17))
        );
        assert_eq!(parse_path("entries/005.p/3"), Some((None, 5, 3)));
        for bad in [
            "0/5",
            "0/0005",
            "00/000",
            "0/000.p/0",
            "0/000.p/256",
            "0/x000/005",
            "0/001/002",
            "64/000",
            "0/000.p/07",
        ] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }
}
