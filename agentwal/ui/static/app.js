// agentwal ui: the page. Every value from the store is untrusted: it reaches the DOM
// only through textContent (el() below), never as HTML.
"use strict";

const POLL_MS = 1000;
const SHORT_TEXT = 160;  // characters of text shown before "more"
let lastLsn = null;
let storePath = "";
let storeStatuses = ["in_doubt", "failed", "pending", "done", "resolved", "not_applied"];

// -- DOM helpers -----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "onclick" || k === "onchange" || k === "oninput" || k === "onsubmit") {
      node.addEventListener(k.slice(2), v);
    } else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function link(href, ...children) { return el("a", { href }, ...children); }
function enc(s) { return encodeURIComponent(s); }

function size(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB"];
  let v = n, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

function age(ts) {
  if (!ts) return "-";
  const s = Math.max(0, Date.now() / 1000 - ts);
  if (s >= 86400) return `${Math.floor(s / 86400)}d ago`;
  if (s >= 3600) return `${Math.floor(s / 3600)}h ago`;
  if (s >= 60) return `${Math.floor(s / 60)}m ago`;
  return `${Math.floor(s)}s ago`;
}

async function api(path) {
  const res = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await res.json();
  if (!res.ok) throw new Error(body.error ? `${body.error.code}: ${body.error.message}` : res.statusText);
  return body;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.filter(n => n !== null && n !== undefined));
}

function errorBox(err) { return el("p", { class: "error" }, String(err.message || err)); }

// -- routing -----------------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query || "");
  return { parts, params };
}

async function render(live) {
  const { parts, params } = route();
  try {
    if (parts.length === 0) return await renderRuns(params, live);
    if (parts[0] === "effects") return await renderEffects(params, live);
    if (parts[0] === "outbox") return await renderOutbox(live);
    if (parts[0] === "health") return await renderHealth(live);
    if (parts[0] === "run" && parts.length >= 2) {
      const run = parts[1];
      if (parts[2] === "ckpt") return await renderRun(run, params, { ckpt: Number(parts[3]) }, live);
      if (parts[2] === "diff") return await renderRun(run, params, { diff: [Number(parts[3]), Number(parts[4])] }, live);
      return await renderRun(run, params, {}, live);
    }
    show(el("p", {}, "No such page. "), link("#/", "Back to the runs"));
  } catch (err) {
    if (!live) show(errorBox(err));
  }
}

// -- runs ----------------------------------------------------------------------------------

async function renderRuns(params, live) {
  const q = params.get("q") || "";
  const rows = await api(`/api/runs?q=${enc(q)}`);
  const existing = document.getElementById("run-search");
  const table = el("table", { id: "runs" },
    el("thead", {}, el("tr", {}, ["run", "head", "updated", "checkpoints", "in doubt / failed"].map(h => el("th", {}, h)))),
    el("tbody", {}, rows.map(r => el("tr", { "data-run": r.run },
      el("td", {}, link(`#/run/${enc(r.run)}`, r.run), r.origin ? el("span", { class: "muted" }, ` forked from ${r.origin[0]} #${r.origin[1]}`) : null),
      el("td", {}, r.head === null ? "-" : `#${r.head}`),
      el("td", {}, age(r.created_at)),
      el("td", { class: "num", title: r.checkpoints_more ? "counted up to this many; the run's page lists them all" : null }, r.checkpoints_more ? `${r.checkpoints}+` : String(r.checkpoints)),
      el("td", { class: "num" }, r.in_doubt ? el("span", { class: "badge bad" }, r.in_doubt) : "0")))));
  const body = el("div", { id: "runs-body" }, table,
    rows.length ? null : el("p", { class: "muted" }, q ? "No run matches." : "The store has no runs yet."));
  if (live && existing) {
    document.getElementById("runs-body").replaceWith(body);
    return;
  }
  const search = el("input", { id: "run-search", type: "search", placeholder: "Search runs", value: q,
    oninput: (ev) => { history.replaceState(null, "", `#/?q=${enc(ev.target.value)}`); render(true); } });
  show(el("h1", {}, "Runs"), search, body);
  search.focus();
  search.setSelectionRange(q.length, q.length);
}

// -- a run: its checkpoint tree, and a checkpoint or a diff beside it ------------------------

async function renderRun(run, params, detail, live) {
  const before = params.get("before");
  const page = await api(`/api/runs/${enc(run)}/checkpoints${before ? `?before=${enc(before)}` : ""}`);
  const treeCol = el("section", { id: "tree-col" }, runTree(run, page, before));
  if (live && document.getElementById("tree-col")) {
    document.getElementById("tree-col").replaceWith(treeCol);
    return;
  }
  const detailCol = el("section", { id: "detail" });
  show(el("h1", {}, "Run ", el("span", { class: "run-name" }, run)), diffForm(run, page, detail.diff),
       el("div", { class: "split" }, treeCol, detailCol));
  if (detail.ckpt) detailCol.replaceChildren(await checkpointView(run, detail.ckpt));
  else if (detail.diff) detailCol.replaceChildren(await diffView(run, detail.diff[0], detail.diff[1]));
  else detailCol.replaceChildren(el("p", { class: "muted" }, "Click a checkpoint to see its state."));
}

function runTree(run, page, before) {
  const { parts } = route();
  const selected = parts[2] === "ckpt" ? Number(parts[3]) : null;
  const list = el("ol", { class: "graph", id: "graph" }, page.rows.map(r => {
    const li = el("li", { class: `node${r.head ? " head" : ""}${r.rollback_to ? " rollback" : ""}${r.id === selected ? " selected" : ""}`, "data-id": r.id },
      el("span", { class: "dot" }),
      link(`#/run/${enc(run)}/ckpt/${r.id}`, `#${r.id}`),
      r.head ? el("span", { class: "badge head-badge" }, "HEAD") : null,
      r.rollback_to ? el("span", { class: "badge rollback-badge" }, `↺ rollback to #${r.rollback_to}`) : null,
      el("span", { class: "muted" }, ` lsn ${r.lsn} · ${age(r.created_at)}`),
      r.parent ? link(`#/run/${enc(run)}/diff/${r.parent}/${r.id}`, " Δ parent") : null);
    for (const f of r.forks) {
      li.append(el("div", { class: "fork" }, "↳ fork → ", link(`#/run/${enc(f)}`, f)));
    }
    if (r.origin) {
      li.append(el("div", { class: "origin" }, "forked from ",
        link(`#/run/${enc(r.origin[0])}/ckpt/${r.origin[1]}`, `${r.origin[0]} #${r.origin[1]}`)));
    }
    return li;
  }));
  const nav = el("p", { class: "pager" },
    before ? link(`#/run/${enc(run)}`, "← newest") : null, " ",
    page.next_before ? link(`#/run/${enc(run)}?before=${page.next_before}`, "older →") : null);
  return [list, nav];
}

function diffForm(run, page, current) {
  const ids = page.rows.map(r => r.id);
  const pick = (id, chosen) => el("select", { id }, ids.map(i => el("option", { value: i, selected: i === chosen }, `#${i}`)));
  const a = pick("diff-a", current ? current[0] : ids[1] ?? ids[0]);
  const b = pick("diff-b", current ? current[1] : ids[0]);
  return el("form", { class: "diff-form", id: "diff-form", onsubmit: (ev) => {
    ev.preventDefault();
    location.hash = `#/run/${enc(run)}/diff/${a.value}/${b.value}`;
  } }, "Diff ", a, " → ", b, " ", el("button", { type: "submit", id: "diff-go" }, "Diff"));
}

async function checkpointView(run, id) {
  const data = await api(`/api/runs/${enc(run)}/checkpoints/${id}`);
  const c = data.checkpoint;
  const meta = el("table", { class: "kv", id: "ckpt-meta" }, [
    ["id", `#${c.id}`], ["parent", c.parent ? `#${c.parent}` : "-"], ["lsn", c.lsn],
    ["created", `${c.created} (${age(c.created_at)})`], ["hash", c.hash],
    ["origin", c.origin ? `${c.origin[0]} #${c.origin[1]}` : "-"],
    ["meta", JSON.stringify(c.meta)]].map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
  const keys = Object.keys(data.state);
  const state = el("div", { class: "state", id: "state" },
    keys.length ? keys.map(k => treeNode(k, data.state[k], 0)) : el("p", { class: "muted" }, "(empty state)"));
  return el("div", {}, el("h2", {}, `Checkpoint #${c.id}`), meta, el("h3", {}, "State"), state);
}

function serializedNote(node) {
  // A LangGraph payload: the tree shows its decoded view; say what it stands for.
  return node.serialized
    ? el("span", { class: "muted serialized" }, ` (LangGraph ${node.serialized.kind}, ${size(node.serialized.length)}, decoded)`)
    : null;
}

function treeNode(label, node, depth) {
  const key = el("span", { class: "key" }, label);
  if (node.type === "dict" || node.type === "list") {
    const n = node.length;
    const summary = el("summary", {}, key, el("span", { class: "muted" },
      node.type === "dict" ? ` {${n} key${n === 1 ? "" : "s"}}`
        : node.kind === "set" ? ` set of ${n}` : ` [${n} item${n === 1 ? "" : "s"}]`), serializedNote(node));
    const kids = node.type === "dict"
      ? node.items.map(([k, v]) => treeNode(k, v, depth + 1))
      : node.items.map((v, i) => treeNode(`[${i}]`, v, depth + 1));
    const det = el("details", { class: "branch", open: depth < 1 }, summary, el("div", { class: "kids" }, kids,
      node.truncated ? el("div", { class: "cut" }, `… ${n - node.items.length} more not shown`) : null));
    return det;
  }
  return el("div", { class: "leaf" }, key, ": ", leafValue(node), serializedNote(node));
}

function leafValue(node) {
  switch (node.type) {
    case "str": {
      const whole = el("span", { class: "str" }, JSON.stringify(node.value),
        node.truncated ? el("span", { class: "cut" }, ` … (${node.length.toLocaleString()} characters in all)`) : null);
      if (node.value.length <= SHORT_TEXT) return whole;
      return el("details", { class: "long-text" }, el("summary", {},
        el("span", { class: "str" }, JSON.stringify(node.value.slice(0, SHORT_TEXT))),
        el("span", { class: "cut" }, ` … ${node.length.toLocaleString()} characters`)), whole);
    }
    case "bytes": return el("span", { class: "bytes" }, `bytes ${size(node.length)} `, el("code", {}, node.base64),
      node.truncated ? el("span", { class: "cut" }, " …") : null);
    case "blob": return el("span", { class: "blob" }, `blob ${node.media_type || "application/octet-stream"}, ${size(node.size)} `,
      el("a", { href: node.url, download: "" }, "download"), el("span", { class: "muted" }, ` sha256 ${node.sha256.slice(0, 16)}…`));
    case "preview": return el("span", { class: "str" }, node.value,
      node.truncated ? el("span", { class: "cut" }, ` … (${node.length.toLocaleString()} characters)`) : null);
    case "null": return el("span", { class: "lit" }, "null");
    default: return el("span", { class: "lit" }, String(node.value),
      node.kind ? el("span", { class: "muted" }, ` ${node.kind}`) : null);
  }
}

function pv(p) {
  return el("code", { class: "val" }, p.json, p.truncated ? el("span", { class: "cut" }, ` … (${p.length.toLocaleString()} characters)`) : null);
}

async function diffView(run, a, b) {
  const d = await api(`/api/runs/${enc(run)}/diff?a=${a}&b=${b}`);
  const rows = [];
  for (const [k, v] of Object.entries(d.added)) rows.push(el("li", { class: "added" }, "+ ", el("span", { class: "key" }, k), ": ", pv(v)));
  for (const [k, v] of Object.entries(d.removed)) rows.push(el("li", { class: "removed" }, "− ", el("span", { class: "key" }, k), ": ", pv(v)));
  for (const [k, changes] of Object.entries(d.changed)) {
    rows.push(el("li", { class: "changed" }, "~ ", el("span", { class: "key" }, k),
      el("ul", {}, changes.map(c => changeLine(c)))));
  }
  return el("div", { id: "diff" }, el("h2", {}, `Diff #${a} → #${b}`),
    rows.length ? el("ul", { class: "diff" }, rows) : el("p", {}, `No change from #${a} to #${b}.`));
}

function changeLine(c) {
  const where = c.path ? el("span", { class: "key" }, `${c.path}: `) : null;
  switch (c.op) {
    case "added": return el("li", { class: "added" }, "+ ", where, pv(c.new));
    case "removed": return el("li", { class: "removed" }, "− ", where, pv(c.old));
    case "changed": return el("li", { class: "changed" }, "~ ", where, pv(c.old), " → ", pv(c.new));
    case "text_diff": return el("li", { class: "changed" }, "~ ", where, "text", el("pre", {}, c.lines.join("\n")));
    case "appended":
      if (c.items === undefined) return el("li", { class: "added" }, "+ ", where, `text appended at character ${c.at}: `, pv(c.new));
      // falls through: items appended to a list
    default: {
      const sign = c.op === "removed_items" ? "− " : "+ ";
      const verb = c.op === "removed_items" ? "removed" : c.op === "appended" ? "appended" : "inserted";
      return el("li", { class: c.op === "removed_items" ? "removed" : "added" }, sign, where,
        `${c.items_total} item(s) ${verb} at [${c.at}]`,
        el("ul", {}, c.items.map((v, i) => el("li", {}, `[${c.at + i}] `, pv(v)))),
        c.items_total > c.items.length ? el("span", { class: "cut" }, `… ${c.items_total - c.items.length} more`) : null);
    }
  }
}

// -- effects and the outbox ------------------------------------------------------------------

function effectsTable(rows, id) {
  return el("table", { id, class: "effects" },
    el("thead", {}, el("tr", {}, ["status", "name", "run", "committed", "key", "mode", "attempts", "args", "result / error", "age"].map(h => el("th", {}, h)))),
    el("tbody", {}, rows.map(r => [
      el("tr", { class: `status-${r.status}`, "data-effect": r.effect_id },
        el("td", {}, el("span", { class: `badge st-${r.status}` }, r.status)),
        el("td", {}, r.name, el("div", { class: "muted small" }, r.effect_id)),
        el("td", {}, link(`#/run/${enc(r.run)}/ckpt/${r.checkpoint}`, r.run)),
        el("td", {}, r.uncommitted ? el("span", { class: "badge st-pending", title: "the step that made it never committed" }, "uncommitted")
          : r.committed_in ? link(`#/run/${enc(r.run)}/ckpt/${r.committed_in}`, `#${r.committed_in}`) : "-"),
        el("td", {}, el("code", {}, r.key)),
        el("td", {}, r.mode),
        el("td", { class: "num" }, r.attempts),
        el("td", {}, pv(r.args)),
        el("td", {}, r.error ? el("span", { class: "error-text" }, r.error) : pv(r.result)),
        el("td", {}, age(r.updated_at))),
      r.resolve ? el("tr", { class: "resolve-row" }, el("td", { colspan: 10 },
        "Settle it by hand once you know what happened: ", el("code", { class: "resolve" }, r.resolve))) : null,
    ])));
}

async function renderEffects(params, live) {
  const run = params.get("run") || "", status = params.get("status") || "";
  const rows = await api(`/api/effects?run=${enc(run)}&status=${enc(status)}`);
  const table = effectsTable(rows, "effects");
  if (live && document.getElementById("effects")) {
    document.getElementById("effects").replaceWith(table);
    return;
  }
  const statuses = ["", ...storeStatuses];
  const apply = () => {
    location.hash = `#/effects?run=${enc(runInput.value)}&status=${enc(statusSel.value)}`;
  };
  const statusSel = el("select", { id: "effect-status", onchange: apply },
    statuses.map(s => el("option", { value: s, selected: s === status }, s || "any status")));
  const runInput = el("input", { id: "effect-run", type: "search", placeholder: "run", value: run, onchange: apply });
  show(el("h1", {}, "Effects"),
    el("p", { class: "muted" }, "In-doubt and failed entries first. This viewer never settles anything: it shows the command that does."),
    el("div", { class: "filters" }, runInput, " ", statusSel), table);
}

async function renderOutbox(live) {
  const rows = await api("/api/outbox");
  const table = effectsTable(rows, "outbox");
  if (live && document.getElementById("outbox")) {
    document.getElementById("outbox").replaceWith(table);
    return;
  }
  show(el("h1", {}, "Outbox"), el("p", { class: "muted" }, "Deferred effects a dispatch may still call, in commit order."),
    rows.length ? table : el("p", { id: "outbox" }, "The outbox is empty."));
}

// -- health: what `agentwal inspect` says, and verify on demand ------------------------------

const HEALTH_FACTS = [
  ["writer", "writer"], ["last commit", "last_commit_at"], ["visible LSN", "visible_lsn"],
  ["folded up to LSN", "applied_lsn"], ["log records not folded", "unfolded_records"],
  ["log size", "wal_bytes"], ["log limit (wal_max_bytes)", "wal_max_bytes"],
  ["last fold", "fold"], ["last retention pass", "retention"],
  ["log segments", "wal_segments"], ["snapshot size", "lmdb_bytes"],
  ["runs", "runs"], ["checkpoints", "checkpoints"], ["outbox pending", "outbox_pending"],
];
let healthShownAt = 0;

const LIMIT_FROM = { given: "given", recorded: "the writer's setting", default: "the default: the writer recorded none" };

// What the writer's HEALTH file says about one background job (fold, retention).
function recordedJob(record, job) {
  if (record === null || record === undefined) return "unknown (no HEALTH file: no writer has opened the store since agentwal wrote one)";
  if (record.unreadable) return `unknown (HEALTH file unreadable: ${record.unreadable})`;
  const failure = record[job];
  return failure ? `FAILED ${new Date(failure.at * 1000).toISOString()} (${age(failure.at)}): ${failure.error}` : "no failure recorded";
}

function healthFact(name, v, h) {
  if (name === "fold" || name === "retention") return "health_record" in h ? recordedJob(h.health_record, name) : "-";
  if (name === "wal_max_bytes" && v) return `${size(v)} (${LIMIT_FROM[h.wal_max_bytes_from] || "?"})`;
  if (name === "writer") {
    if (v.held) return `open for writing by process ${v.pid}`;
    return v.held === null ? "unknown (no lock table on this system)" : "none (no process has it open for writing)";
  }
  if (name.endsWith("_bytes")) return `${size(v)} (${v.toLocaleString()} bytes)`;
  if (name.endsWith("_at")) return v ? `${new Date(v * 1000).toISOString()} (${age(v)})` : "-";
  return v === null || v === undefined ? "-" : String(v);
}

async function renderHealth(live) {
  // The log's size is read from its segment files: while a writer commits, redraw at most every 5 s.
  if (live && Date.now() - healthShownAt < 5000) return;
  const h = await api("/api/health");
  healthShownAt = Date.now();
  const attention = h.attention.length
    ? el("ul", { id: "attention-list", class: "attention" }, h.attention.map(a => el("li", {}, a)))
    : el("p", { id: "attention-list", class: "ok-text" }, "Nothing needs attention.");
  const counts = Object.entries(h.effects).filter(([k, n]) => k !== "total" && n).map(([k, n]) => `${n} ${k}`).join(", ");
  const facts = el("table", { id: "health-facts", class: "facts" }, el("tbody", {},
    HEALTH_FACTS.map(([label, name]) => el("tr", {}, el("th", {}, label), el("td", {}, healthFact(name, h[name], h)))),
    el("tr", {}, el("th", {}, "effects"), el("td", {}, `${h.effects.total} ledger entries${counts ? ` (${counts})` : ""}`))));
  if (live && document.getElementById("health-body")) {
    document.getElementById("health-body").replaceChildren(attention, facts);
    return;
  }
  const result = el("div", { id: "verify-result" });
  const button = el("button", { id: "run-verify", type: "button", onclick: () => runVerify(button, result) }, "Run verify");
  show(el("h1", {}, "Health"),
    el("div", { id: "health-body" }, attention, facts),
    el("h2", { class: "section" }, "Verify"),
    el("p", { class: "muted" }, "Checks every checksum, hash chain and cross-reference (agentwal verify). It reads the whole store, so it runs only when asked."),
    button, result);
}

async function runVerify(button, result) {
  button.disabled = true;
  result.replaceChildren(el("p", { class: "muted" }, "Verifying…"));
  try {
    const v = await api("/api/verify");
    const checked = Object.entries(v.checked).map(([k, n]) => `${n.toLocaleString()} ${k}`).join(", ");
    result.replaceChildren(...[
      el("p", { id: "verify-verdict", class: v.ok ? "ok-text" : "error" },
        v.ok ? `OK: nothing is damaged (as of LSN ${v.visible_lsn}, in ${v.seconds} s).`
          : `${v.problems.length} problem(s) found: the store is damaged. Restore it from a backup, or copy out what still reads.`),
      v.problems.length ? el("table", { id: "verify-problems" },
        el("thead", {}, el("tr", {}, el("th", {}, "where"), el("th", {}, "problem"))),
        el("tbody", {}, v.problems.map(p => el("tr", {}, el("td", {}, el("code", {}, p.where)), el("td", {}, p.what))))) : null,
      v.notes.length ? el("ul", { class: "muted" }, v.notes.map(n => el("li", {}, `note: ${n}`))) : null,
      el("p", { class: "muted small" }, `checked: ${checked}`)].filter(Boolean));
  } catch (err) {
    result.replaceChildren(errorBox(err));
  } finally {
    button.disabled = false;
  }
}

// -- following the store ---------------------------------------------------------------------

async function poll() {
  try {
    const s = await api("/api/store");
    storePath = s.path;
    storeStatuses = s.statuses;
    document.getElementById("store-path").textContent = s.path;
    const live = document.getElementById("live");
    live.textContent = `LSN ${s.visible_lsn} · live`;
    live.className = "live ok";
    const bad = s.effects.in_doubt + s.effects.failed;
    const att = document.getElementById("attention");
    att.hidden = bad === 0;
    att.textContent = bad;
    const ob = document.getElementById("outbox-count");
    ob.hidden = s.outbox === 0;
    ob.textContent = s.outbox;
    if (lastLsn !== null && s.visible_lsn !== lastLsn) await render(true);
    lastLsn = s.visible_lsn;
  } catch (err) {
    const live = document.getElementById("live");
    live.textContent = "disconnected";
    live.className = "live bad";
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("hashchange", () => render(false));
window.addEventListener("DOMContentLoaded", () => { render(false); poll(); });
