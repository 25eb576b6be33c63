// tally's live page: one EventSource, each event a snapshot of one page of runs.
// Everything an agent chose (run and tool names) is written with textContent only.
"use strict";
(function () {
  var page = 0;
  var source = null;
  var SVG = "http://www.w3.org/2000/svg";

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function clear(tbody) {
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
  }

  function spark(s) {
    var td = el("td");
    if (!s) { td.textContent = "-"; return td; }
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", "0 0 80 20");
    var top = Math.max(s.limit, 1);
    var n = s.used.length;
    var pts = [];
    for (var i = 0; i < n; i++) {
      var x = n > 1 ? (i * 80) / (n - 1) : 80;
      var y = 20 - (Math.min(s.used[i], top) * 18) / top - 1;
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
    }
    var line = document.createElementNS(SVG, "line");
    line.setAttribute("x1", "0"); line.setAttribute("x2", "80");
    line.setAttribute("y1", "1"); line.setAttribute("y2", "1");
    svg.appendChild(line);
    var poly = document.createElementNS(SVG, "polyline");
    poly.setAttribute("points", pts.join(" "));
    svg.appendChild(poly);
    td.appendChild(svg);
    td.appendChild(el("span", " " + s.shown));
    return td;
  }

  function nearest(c) {
    var td = el("td");
    if (!c.nearest) { td.textContent = "no limit"; return td; }
    var bar = el("span", null, "bar" + (c.permille >= 1000 ? " reached" : c.permille >= 800 ? " near" : ""));
    var fill = el("span", null, "fill");
    fill.style.width = (c.permille / 10) + "%";
    bar.appendChild(fill);
    td.appendChild(bar);
    td.appendChild(el("span", c.nearest + " " + (c.permille / 10).toFixed(1) + "%"));
    return td;
  }

  function ago(ms, now) {
    var s = Math.max(0, Math.round((now - ms) / 1000));
    return s + " s ago";
  }

  function render(snap) {
    var runs = document.querySelector("#runs tbody");
    clear(runs);
    snap.runs.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.run, "run"));
      tr.appendChild(el("td", r.state + (r.stop_reason ? " (" + r.stop_reason + ")" : "")));
      tr.appendChild(nearest(r.closeness));
      ["attempts", "spend_nanos", "polls", "depth"].forEach(function (d) {
        tr.appendChild(spark(r.spark ? r.spark[d] : null));
      });
      var lr = r.last_refusal;
      tr.appendChild(el("td", lr ? lr.reason + " (" + lr.tool + ", " + ago(lr.at_ms, snap.at_ms) + ")" : "-", lr ? "refused last" : "last"));
      tr.appendChild(el("td", lr && lr.action ? lr.action : "-", "action"));
      runs.appendChild(tr);
    });
    var pages = Math.max(1, Math.ceil(snap.total_runs / snap.per_page));
    document.getElementById("pageno").textContent = "page " + (snap.page + 1) + " of " + pages;
    document.getElementById("totals").textContent = snap.open_runs + " open of " + snap.total_runs + " runs";
    document.getElementById("prev").disabled = snap.page === 0;
    document.getElementById("next").disabled = snap.page + 1 >= pages;

    var br = document.querySelector("#breakers tbody");
    clear(br);
    snap.breakers.forEach(function (b) {
      var tr = el("tr");
      tr.appendChild(el("td", b.tool));
      tr.appendChild(el("td", b.state));
      var when = b.half_opens_at_ms ? "in " + Math.max(0, Math.round((b.half_opens_at_ms - snap.at_ms) / 1000)) + " s" : "-";
      tr.appendChild(el("td", when));
      br.appendChild(tr);
    });

    var rf = document.querySelector("#refusals tbody");
    clear(rf);
    snap.refusals.slice().reverse().forEach(function (x) {
      var tr = el("tr");
      tr.appendChild(el("td", new Date(x.minute_ms).toISOString().slice(11, 16)));
      tr.appendChild(el("td", x.reason));
      tr.appendChild(el("td", x.count));
      rf.appendChild(tr);
    });

  }

  // An agent chose this text: control characters, bidi overrides and invisible marks
  // are written as \u{...}, then it is cut to 40 characters (as `tally approvals` does).
  function safe(s) {
    if (s === undefined || s === null) return "-";
    var t = String(s).replace(/[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]/g, function (c) {
      return "\\u{" + c.charCodeAt(0).toString(16) + "}";
    });
    var cs = Array.from(t);
    return cs.length > 40 ? cs.slice(0, 39).join("") + "\u2026" : t;
  }

  function span(ms) {
    var s = Math.max(0, Math.floor(ms / 1000));
    return s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : s + " s";
  }

  function usd(nanos) {
    return "$" + (nanos / 1e9).toFixed(2);
  }

  var EFFECT = { read: "read", idempotent_write: "idempotent write", non_idempotent_write: "write" };

  function call(r) {
    var w = [(r.effect ? EFFECT[r.effect] + " " : "") + safe(r.tool)];
    if (r.operation) w.push("op " + safe(r.operation));
    if (r.args_preview) w.push("args " + safe(r.args_preview));
    else if (r.args_digest) w.push("args " + String(r.args_digest).slice(0, 12));
    w.push("(" + r.cause + ")");
    return w.join(" ");
  }

  function cost(c) {
    var w = [];
    if (c.attempts) w.push(c.attempts + (c.attempts === 1 ? " attempt" : " attempts"));
    var n = c.nanos !== undefined && c.nanos !== null ? c.nanos : (c.cents ? c.cents * 1e7 : null);
    if (n) w.push(usd(n));
    if (c.tool) w.push((w.length ? "for " : "tool ") + safe(c.tool));
    if (c.operation && w.length === 1 && !c.attempts && !n) w.push(safe(c.operation));
    return w.join(" ") || "-";
  }

  function stood(r) {
    var w = [];
    var a = r.limits && r.limits.attempts, s = r.limits && r.limits.spend_nanos;
    if (a) w.push("attempts " + a.used + "/" + a.limit);
    if (s) w.push("spend " + usd(s.used) + "/" + usd(s.limit));
    w.push(r.calls + " calls");
    if (r.left_ms !== undefined && r.left_ms !== null) w.push(span(r.left_ms) + " to deadline");
    return w.join(", ");
  }

  function who(r) {
    var w = [];
    if (r.uid !== undefined && r.uid !== null) w.push("uid " + r.uid);
    if (r.worker) w.push("worker " + safe(r.worker));
    if (r.credential) w.push("cred " + safe(r.credential));
    return w.join(" ") || "-";
  }

  // The commands an approver runs with their own key: the page never holds one.
  function commands(r, socket) {
    var td = el("td", null, "commands");
    var id = /^[0-9a-f]{16}$/.test(r.id) ? r.id : "(bad id)";
    var sock = socket ? " --operator-socket " + socket : " --operator-socket PATH";
    td.appendChild(el("code", "tally approve " + id + sock + " --key APPROVER.key", "approve"));
    td.appendChild(el("code", "tally deny " + id + sock + " --key APPROVER.key --note WHY", "deny"));
    return td;
  }

  function renderDesk(desk) {
    var tb = document.querySelector("#requests tbody");
    clear(tb);
    var n = desk.requests.length;
    document.getElementById("asks").textContent = desk.pending > n ? "(" + n + " of " + desk.pending + ", nearest deadline first)" : "(" + n + ")";
    desk.requests.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", r.id, "id"));
      var left = r.expires_in_ms !== undefined && r.expires_in_ms !== null ? span(r.expires_in_ms) + " left" : "no deadline";
      tr.appendChild(el("td", left, "expires"));
      tr.appendChild(el("td", safe(r.run), "run"));
      tr.appendChild(el("td", call(r), "call"));
      tr.appendChild(el("td", safe(r.target)));
      tr.appendChild(el("td", cost(r.cost), "cost"));
      tr.appendChild(el("td", stood(r)));
      tr.appendChild(el("td", who(r)));
      tr.appendChild(commands(r, desk.operator_socket));
      tb.appendChild(tr);
    });
  }

  function connect() {
    if (source) source.close();
    var status = document.getElementById("status");
    source = new EventSource("/v1/live/events?page=" + page);
    source.addEventListener("snapshot", function (e) {
      status.textContent = "live";
      status.className = "live";
      render(JSON.parse(e.data));
    });
    source.addEventListener("requests", function (e) {
      renderDesk(JSON.parse(e.data));
    });
    source.onerror = function () {
      status.textContent = "reconnecting";
      status.className = "lost";
      // Refused (the daemon serves a bounded number of streams, 503): the browser does
      // not retry by itself, so try again a little later.
      if (source.readyState === EventSource.CLOSED) {
        var mine = source;
        setTimeout(function () { if (source === mine) connect(); }, 5000);
      }
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.getElementById("prev").addEventListener("click", function () {
      if (page > 0) { page--; connect(); }
    });
    document.getElementById("next").addEventListener("click", function () {
      page++; connect();
    });
    connect();
  });
})();
