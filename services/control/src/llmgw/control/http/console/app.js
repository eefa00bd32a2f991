// The llmgw web console. Plain JavaScript, no framework, no build step.
//
// Data comes from two places: one server-sent event stream (/api/v1/events)
// pushes the fleet's state (status, models, nodes, replicas, keys) whenever
// it changes, and every table renders from the last state received; changes
// and on-demand reads (a model's document, logs, settings history) are calls
// to the REST API (/api/v1/..., see /openapi.json). The session is an
// HttpOnly cookie; the CSRF token lives in this closure only, never in
// storage or URLs. Every value from the server reaches the page through
// textContent (the h() helper), never as HTML.
"use strict";

(() => {
  let csrf = "";
  let state = null;
  let events = null;
  let view = "overview";
  let settingsSeen = -1;
  const ui = { modelForm: null, routing: null, keySecret: null, logs: null, explain: null, settings: null };

  // -- DOM helpers -------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const $ = (id) => document.getElementById(id);
  const num = (v) => Number(v || 0);

  function badge(text, kind) {
    return h("span", { class: `badge ${kind || text}` }, text);
  }

  function table(headers, rows, empty) {
    if (!rows.length) return h("p", { class: "empty" }, empty || "Nothing here yet.");
    return h("table", {},
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows));
  }

  function errorBox(message) {
    return h("div", { class: "error", role: "alert" }, message);
  }

  function ago(seconds) {
    const s = Math.max(0, Math.round(Date.now() / 1000 - seconds));
    if (s < 60) return `${s}s ago`;
    if (s < 3600) return `${Math.round(s / 60)}m ago`;
    if (s < 86400) return `${Math.round(s / 3600)}h ago`;
    return `${Math.round(s / 86400)}d ago`;
  }

  // -- the REST API --------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const headers = { "X-CSRF-Token": csrf };
    const init = { method, headers, credentials: "same-origin" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    let data = {};
    try { data = await resp.json(); } catch (e) { data = {}; }
    if (!resp.ok) {
      const err = data.error || {};
      if (resp.status === 401) showLogin("Your session has ended; sign in again.");
      throw new ApiError(resp.status, err.status || "UNKNOWN", err.message || `HTTP ${resp.status}`);
    }
    return data;
  }

  // -- session -------------------------------------------------------------------

  function showLogin(message) {
    if (events) { events.close(); events = null; }
    csrf = "";
    $("login").hidden = false;
    $("view").replaceChildren();
    $("nav").hidden = true;
    $("logout").hidden = true;
    $("live").hidden = true;
    const err = $("login-error");
    err.hidden = !message;
    err.textContent = message || "";
    $("token").focus();
  }

  async function login(ev) {
    ev.preventDefault();
    const input = $("token");
    try {
      const resp = await fetch("/api/v1/session", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ token: input.value }),
        credentials: "same-origin",
      });
      const data = await resp.json();
      if (!resp.ok) throw new Error((data.error || {}).message || `HTTP ${resp.status}`);
      csrf = data.csrf_token;
      input.value = "";
      start();
    } catch (e) {
      $("login-error").hidden = false;
      $("login-error").textContent = e.message;
    }
  }

  async function logout() {
    try { await api("DELETE", "/api/v1/session"); } catch (e) { /* already gone */ }
    showLogin("Signed out.");
  }

  function start() {
    $("login").hidden = true;
    $("nav").hidden = false;
    $("logout").hidden = false;
    connect();
    route();
  }

  function connect() {
    if (events) events.close();
    events = new EventSource("/api/v1/events");
    events.addEventListener("state", (ev) => {
      state = JSON.parse(ev.data);
      $("live").hidden = false;
      $("live").classList.remove("down");
      render(true);
    });
    events.addEventListener("error", async (ev) => {
      $("live").classList.add("down");
      if (ev.data) { showLogin(JSON.parse(ev.data).error.message); return; }
      // The stream broke: find out whether the session is still good (EventSource retries by itself).
      const resp = await fetch("/api/v1/session", { credentials: "same-origin" });
      if (resp.status === 401) showLogin("Your session has ended; sign in again.");
    });
  }

  // -- routing -------------------------------------------------------------------

  function route() {
    const want = (location.hash || "#overview").slice(1);
    view = VIEWS[want] ? want : "overview";
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === view);
    render();
  }

  // A pushed state does not redraw under someone typing: it waits until they leave the field.
  let deferred = false;
  function render(pushed) {
    if (!csrf) return;
    const active = document.activeElement;
    if (pushed && active && $("view").contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) {
      deferred = true;
      return;
    }
    deferred = false;
    if (!state) { $("view").replaceChildren(h("p", { class: "muted" }, "Connecting …")); return; }
    $("cluster").textContent = state.status ? `· ${state.status.cluster}` : "";
    const scroll = window.scrollY;
    const focused = document.activeElement && document.activeElement.id;
    const fresh = VIEWS[view]();
    $("view").replaceChildren(fresh);
    if (focused && $(focused)) $(focused).focus();
    window.scrollTo(0, scroll);
  }

  // -- overview --------------------------------------------------------------------

  function overview() {
    const s = state.status || {};
    const nodes = (state.nodes.nodes || []);
    const models = (state.models.models || []);
    let gpus = 0, used = 0;
    for (const n of nodes) { gpus += (n.gpus || []).length; used += (n.used_gpu_indices || []).length; }
    const wanted = models.reduce((a, m) => a + num(m.desired_replicas ?? m.min_replicas), 0);
    const ready = models.reduce((a, m) => a + num(m.ready_replicas), 0);
    const readyNodes = nodes.filter((n) => n.state === "ready").length;
    const card = (title, value, sub, id) =>
      h("div", { class: "card stat", id }, h("div", { class: "stat-title" }, title),
        h("div", { class: "stat-value" }, value), h("div", { class: "muted" }, sub));
    const problems = (s.placement_problems || []);
    const r = state.routers || {};
    const routers = r.routers || [];
    const traffic = {};
    for (const m of (r.models || [])) traffic[m.model] = m;
    const rps = routers.reduce((a, x) => a + x.requests_per_second, 0);
    const eps = routers.reduce((a, x) => a + x.server_errors_per_second, 0);
    const inFlight = routers.reduce((a, x) => a + x.in_flight, 0);
    return h("div", {},
      h("div", { class: "grid" },
        card("Nodes", `${readyNodes} / ${nodes.length}`, "ready / registered", "stat-nodes"),
        card("GPUs", `${used} / ${gpus}`, `used / total · ${gpus - used} free`, "stat-gpus"),
        card("Replicas", `${ready} / ${wanted}`, "ready / desired", "stat-replicas"),
        card("Routers", r.error ? "–" : String(routers.length), r.error ? "reports go to the leader"
          : `${inFlight} in flight · ${rate(rps)} req/s`, "stat-routers"),
        card("Router errors", r.error ? "–" : percent(eps, rps), r.error ? "reports go to the leader"
          : `5xx of requests, last minute · ${rate(eps)}/s`, "stat-errors"),
        card("Control plane", s.leader ? "leader" : "standby",
          `${s.control_id || ""} · leader ${s.leader_id || "none"} · settings v${s.settings_version || 0}`)),
      problems.length ? h("div", { class: "card warn" }, h("h3", {}, "Placement problems"),
        h("ul", {}, problems.map((p) => h("li", {}, p)))) : null,
      h("h2", {}, "Models"),
      table(["Model", "Engine", "Ready", "Desired", "Router load", "Req/s", "Errors (5xx · 4xx)", "Why"], models.map((m) => {
        const t = traffic[m.name];
        return h("tr", { "data-model": m.name },
          h("td", {}, h("strong", {}, m.name)),
          h("td", {}, m.engine),
          h("td", {}, bar(num(m.ready_replicas), num(m.desired_replicas ?? m.min_replicas))),
          h("td", {}, String(m.desired_replicas ?? m.min_replicas)),
          h("td", { class: "load" }, t ? String(t.load) : "–"),
          h("td", { class: "rps" }, t ? rate(t.requests_per_second) : "–"),
          h("td", { class: "errors" }, t ? errors(t) : "–"),
          h("td", { class: "muted" }, m.scaling_reason || m.placement_message || ""));
      })),
      h("h2", {}, "Routers"),
      r.error ? h("p", { class: "muted", id: "routers-error" }, r.error.message)
        : table(["Router", "Last report", "In flight", "Waiting", "Req/s", "Errors (5xx · 4xx)", "Since start"], routers.map((x) =>
          h("tr", { "data-router": x.router_id },
            h("td", {}, h("strong", {}, x.router_id)),
            h("td", { class: "small" }, `${x.last_report_seconds_ago.toFixed(1)}s ago · every ${x.interval_seconds}s`),
            h("td", {}, String(x.in_flight)),
            h("td", {}, String(x.pending)),
            h("td", { class: "rps" }, rate(x.requests_per_second)),
            h("td", { class: "errors" }, errors(x)),
            h("td", { class: "small totals" }, `${x.requests} requests · ${x.server_errors} 5xx · ${x.client_errors} 4xx`))),
          "No router reports to this control plane."),
      h("h2", {}, "Nodes"),
      table(["Node", "State", "GPUs used", "Engines"], nodes.map((n) =>
        h("tr", {},
          h("td", {}, h("strong", {}, n.node_id)),
          h("td", {}, badge(n.state)),
          h("td", {}, bar((n.used_gpu_indices || []).length, (n.gpus || []).length)),
          h("td", { class: "muted" }, (n.engines || []).map((e) => e.kind).join(", "))))));
  }

  function rate(x) {
    return x >= 10 ? x.toFixed(0) : x.toFixed(x ? 2 : 0);
  }

  function percent(part, whole) {
    return whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "0%";
  }

  // A router's or model's error rates over the last minute, as shares of its requests.
  function errors(x) {
    const text = `${percent(x.server_errors_per_second, x.requests_per_second)} · ${percent(x.client_errors_per_second, x.requests_per_second)}`;
    return h("span", { class: x.server_errors_per_second > 0 ? "bad" : "", title: `${rate(x.server_errors_per_second)} 5xx/s, ${rate(x.client_errors_per_second)} 4xx/s` }, text);
  }

  function bar(value, total) {
    const pct = total ? Math.min(100, Math.round((100 * value) / total)) : 0;
    const fill = h("div", { class: "fill" });
    fill.style.width = `${pct}%`; // through the CSSOM: the page's CSP refuses style attributes
    return h("div", { class: "bar", title: `${value} of ${total}` }, fill, h("span", {}, `${value}/${total}`));
  }

  // -- models ----------------------------------------------------------------------

  const TEMPLATE = { name: "my-model", scaling: { min: 1 }, profile: { engine: "simulator", gpus: 1 } };

  function models() {
    const list = state.models.models || [];
    const rows = list.map((m) => h("tr", { "data-model": m.name },
      h("td", {}, h("strong", {}, m.name), m.aliases && m.aliases.length ? h("div", { class: "muted" }, m.aliases.join(", ")) : null),
      h("td", {}, `${m.engine} · ${m.gpus} GPU`),
      h("td", {}, bar(num(m.ready_replicas), num(m.desired_replicas ?? m.min_replicas))),
      h("td", {}, scaleControl(m)),
      h("td", {}, badge(m.capacity_class || "standard", "plain"), " ", badge(m.origin, "plain")),
      h("td", { class: "muted small notes" }, [m.placement_message,
        m.fallbacks && m.fallbacks.length ? `fallbacks: ${m.fallbacks.join(", ")}` : "",
        m.canary ? `canary: ${m.canary_percent}% to ${m.canary}` : ""].filter(Boolean).join(" · ")),
      h("td", { class: "actions" },
        h("button", { class: "ghost", onclick: () => openModel(m.name) }, "Edit"),
        h("button", { class: "ghost", onclick: () => openRouting(m) }, "Canary & fallbacks"),
        h("button", { class: "ghost", onclick: () => explain(m.name) }, "Explain"),
        m.origin === "runtime" ? h("button", { class: "ghost danger", onclick: () => removeModel(m.name) }, "Remove") : null)));
    return h("div", {},
      h("div", { class: "toolbar" }, h("h2", {}, "Models"),
        h("button", { class: "primary", id: "add-model", onclick: () => { ui.modelForm = { mode: "add", text: JSON.stringify(TEMPLATE, null, 2) }; render(); } }, "Add model")),
      ui.modelForm ? modelForm() : null,
      ui.routing ? routingForm() : null,
      ui.explain ? explainPanel() : null,
      table(["Model", "Profile", "Ready", "Min replicas", "Class", "Notes", ""], rows, "No models yet: add one."));
  }

  function scaleControl(m) {
    const id = `scale-${m.name}`;
    return h("form", { class: "inline", onsubmit: (ev) => { ev.preventDefault(); scale(m.name, Number($(id).value)); } },
      h("input", { id, type: "number", min: "0", max: "1024", value: String(m.min_replicas), class: "small-input", "aria-label": `min replicas of ${m.name}` }),
      h("button", { class: "ghost", type: "submit" }, "Scale"),
      ui.scaleError && ui.scaleError.model === m.name ? h("div", { class: "error" }, ui.scaleError.message) : null);
  }

  function modelForm() {
    const f = ui.modelForm;
    return h("form", { class: "card", id: "model-form", onsubmit: (ev) => { ev.preventDefault(); saveModel(); } },
      h("h3", {}, f.mode === "add" ? "Add a model" : `Edit ${f.name}`),
      h("p", { class: "muted" }, "The model document as JSON (docs/models.md). The whole catalog is validated before anything is stored."),
      f.note ? h("p", { class: "note" }, f.note) : null,
      h("textarea", { id: "model-doc", rows: "12", spellcheck: "false", oninput: (ev) => { f.text = ev.target.value; } }, f.text),
      f.error ? errorBox(f.error) : null,
      h("div", { class: "row" },
        h("button", { class: "primary", type: "submit" }, f.mode === "add" ? "Add" : "Save"),
        h("button", { class: "ghost", type: "button", onclick: () => { ui.modelForm = null; render(); } }, "Cancel")));
  }

  async function openModel(name) {
    ui.routing = null;
    try {
      const doc = await api("GET", `/api/v1/models/${encodeURIComponent(name)}`);
      ui.modelForm = { mode: "edit", name, revision: doc.revision, origin: doc.origin, text: JSON.stringify(JSON.parse(doc.document), null, 2),
        note: doc.origin === "declared" ? "Declared in the cluster settings: change it on the Settings page (Scale here writes a settings version)." : null };
    } catch (e) {
      ui.modelForm = { mode: "edit", name, text: "", error: e.message };
    }
    render();
  }

  async function saveModel() {
    const f = ui.modelForm;
    f.text = $("model-doc").value;
    try {
      JSON.parse(f.text);
    } catch (e) {
      f.error = `not valid JSON: ${e.message}`;
      render();
      return;
    }
    try {
      if (f.mode === "add") await api("POST", "/api/v1/models", { document: f.text });
      else await api("PUT", "/api/v1/models", { document: f.text, if_revision: String(f.revision || 0) });
      ui.modelForm = null;
    } catch (e) {
      f.error = `${e.code}: ${e.message}`;
    }
    render();
  }

  // A runtime model's document is changed in place (UpdateModel, guarded by the
  // revision read, as `llmgw model set` does); a declared one is part of the
  // cluster settings, so the change writes a new settings version (history,
  // rollback). Either way the control plane validates the whole catalog and
  // refuses with what to fix; nothing is checked here that it does not check.
  async function changeModel(name, change, reason) {
    const model = (state.models.models || []).find((m) => m.name === name);
    if (model && model.origin === "declared") {
      const current = await api("GET", "/api/v1/settings");
      const doc = JSON.parse(current.document || "{}");
      const spec = (doc.models || []).find((m) => m.name === name);
      if (!spec) throw new ApiError(404, "NOT_FOUND", `${name} is not among the cluster settings' models`);
      change(spec);
      await api("PUT", "/api/v1/settings", {
        document: JSON.stringify(doc), if_version: String(current.version), author: "console", reason,
      });
      return;
    }
    const got = await api("GET", `/api/v1/models/${encodeURIComponent(name)}`);
    const doc = JSON.parse(got.document);
    change(doc);
    await api("PUT", "/api/v1/models", { document: JSON.stringify(doc), if_revision: String(got.revision) });
  }

  async function scale(name, n) {
    ui.scaleError = null;
    try {
      await changeModel(name, (doc) => {
        delete doc.min_replicas;
        doc.scaling = Object.assign({}, doc.scaling, { min: n });
      }, `scale ${name} to ${n}`);
    } catch (e) {
      ui.scaleError = { model: name, message: `${e.code}: ${e.message}` };
    }
    render();
  }

  // -- canary and fallbacks ----------------------------------------------------------

  function openRouting(m) {
    ui.modelForm = null;
    ui.routing = { model: m.name, origin: m.origin, loading: true };
    render();
    api("GET", `/api/v1/models/${encodeURIComponent(m.name)}`).then((got) => {
      const doc = JSON.parse(got.document);
      Object.assign(ui.routing, {
        loading: false,
        fallbacks: (doc.fallbacks || []).join(", "),
        canary: doc.canary ? doc.canary.model : "",
        percent: doc.canary ? String(doc.canary.percent) : "",
      });
      render();
    }, (e) => { Object.assign(ui.routing, { loading: false, error: `${e.code}: ${e.message}` }); render(); });
  }

  function routingForm() {
    const f = ui.routing;
    const names = (state.models.models || []).filter((m) => m.name !== f.model).map((m) => m.name);
    const input = (id, key, attrs) => h("input", Object.assign({ id, value: f[key] || "", oninput: (ev) => { f[key] = ev.target.value; } }, attrs));
    return h("form", { class: "card", id: "routing-form", onsubmit: (ev) => { ev.preventDefault(); saveRouting(); } },
      h("h3", {}, `Canary and fallbacks of ${f.model}`),
      h("p", { class: "muted" }, f.origin === "declared"
        ? "Declared in the cluster settings: saving writes a new settings version (history, rollback)."
        : "Saved as an update of the model document, guarded by the revision read; the whole catalog is validated first."),
      f.loading ? h("p", { class: "muted" }, "Loading …") : h("div", { class: "fields" },
        field("Fallbacks, in order", input("routing-fallbacks", "fallbacks", { placeholder: names.slice(0, 2).join(", ") || "model, model", list: "routing-models" })),
        field("Canary model", input("routing-canary", "canary", { placeholder: "none", list: "routing-models" })),
        field("Canary share (%)", input("routing-percent", "percent", { type: "number", step: "any", placeholder: "5" }))),
      h("datalist", { id: "routing-models" }, names.map((n) => h("option", { value: n }))),
      f.error ? errorBox(f.error) : null,
      h("div", { class: "row" },
        h("button", { class: "primary", type: "submit", disabled: f.loading }, "Save"),
        h("button", { class: "ghost", type: "button", onclick: () => { ui.routing = null; render(); } }, "Cancel")));
  }

  async function saveRouting() {
    const f = ui.routing;
    const fallbacks = (f.fallbacks || "").split(",").map((x) => x.trim()).filter(Boolean);
    const canary = (f.canary || "").trim();
    const percent = (f.percent || "").trim();
    try {
      await changeModel(f.model, (doc) => {
        if (fallbacks.length) doc.fallbacks = fallbacks; else delete doc.fallbacks;
        // An empty canary removes it; a share without a model is sent as it is, for the control plane to refuse.
        if (canary || percent) doc.canary = { model: canary, percent: percent === "" ? 0 : Number(percent) };
        else delete doc.canary;
      }, `canary and fallbacks of ${f.model}`);
      ui.routing = null;
    } catch (e) {
      f.error = `${e.code}: ${e.message}`;
    }
    render();
  }

  async function removeModel(name) {
    if (!confirm(`Remove model ${name}? Its replicas are stopped.`)) return;
    try { await api("DELETE", `/api/v1/models/${encodeURIComponent(name)}`); } catch (e) { alert(e.message); }
  }

  async function explain(model) {
    try {
      ui.explain = await api("GET", `/api/v1/models/${encodeURIComponent(model)}/placement`);
    } catch (e) {
      ui.explain = { model, error: e.message };
    }
    render();
  }

  function explainPanel() {
    const x = ui.explain;
    return h("div", { class: "card", id: "explain" },
      h("div", { class: "toolbar" }, h("h3", {}, `Why ${x.model} runs where it does`),
        h("button", { class: "ghost", onclick: () => { ui.explain = null; render(); } }, "Close")),
      x.error ? errorBox(x.error) : h("div", {},
        h("p", { class: "muted" }, `${x.ready_replicas}/${x.wanted} ready · policy ${x.policy} · ${x.placement_message || "all placed"}`),
        (x.profiles || []).map((p) => h("div", {},
          h("h4", {}, `Profile ${p.profile}: ${p.description}`),
          table(["Node", "Fits", "Reason"], (p.nodes || []).map((n) =>
            h("tr", {}, h("td", {}, n.node_id), h("td", {}, badge(n.fits ? "fits" : "no", n.fits ? "ready" : "lost")), h("td", {}, n.reason))), "No nodes registered.")))));
  }

  // -- nodes -----------------------------------------------------------------------

  function nodes() {
    const list = state.nodes.nodes || [];
    const modelNames = (state.models.models || []).map((m) => m.name);
    return h("div", {},
      h("div", { class: "toolbar" }, h("h2", {}, "Nodes"),
        modelNames.length ? h("form", { class: "inline", onsubmit: (ev) => { ev.preventDefault(); explain($("explain-model").value); } },
          h("label", { for: "explain-model", class: "muted" }, "Explain placement of"),
          h("select", { id: "explain-model" }, modelNames.map((n) => h("option", { value: n }, n))),
          h("button", { class: "ghost", type: "submit" }, "Explain")) : null),
      ui.explain ? explainPanel() : null,
      ui.nodeError ? errorBox(ui.nodeError) : null,
      table(["Node", "State", "GPUs", "Labels", "Agent", ""], list.map((n) => h("tr", { "data-node": n.node_id },
        h("td", {}, h("strong", {}, n.node_id), h("div", { class: "muted small" }, n.address)),
        h("td", {}, badge(n.state), n.held && n.hold_reason ? h("div", { class: "muted small" }, n.hold_reason) : null),
        h("td", {}, bar((n.used_gpu_indices || []).length, (n.gpus || []).length),
          h("div", { class: "muted small" }, (n.gpus || [])[0] ? n.gpus[0].name : "")),
        h("td", {}, Object.entries(n.labels || {}).map(([k, v]) => h("span", { class: "chip" }, `${k}=${v}`)),
          h("form", { class: "inline", onsubmit: (ev) => { ev.preventDefault(); label(n.node_id, ev.target.elements[0].value); ev.target.reset(); } },
            h("input", { placeholder: "key=value or -key", class: "small-input wide", "aria-label": `label ${n.node_id}` }),
            h("button", { class: "ghost", type: "submit" }, "Label"))),
        h("td", { class: "muted small" }, `v${n.version || "?"} · ${(n.engines || []).map((e) => `${e.kind}@${e.version || "?"}${e.build ? `[${e.build}]` : ""}`).join(", ")}`,
          n.driver_version || n.cuda_version ? h("div", {}, `driver ${n.driver_version || "?"} · CUDA ${n.cuda_version || "?"}`) : null),
        h("td", { class: "actions" }, n.held
          ? h("button", { class: "ghost", onclick: () => nodeCall(n.node_id, "release", {}) }, "Release")
          : h("button", { class: "ghost danger", onclick: () => { const r = prompt(`Hold and drain ${n.node_id}: why?`, "maintenance"); if (r !== null) nodeCall(n.node_id, "hold", { reason: r }); } }, "Hold & drain")))),
      "No node has registered yet."));
  }

  async function nodeCall(node, verb, body) {
    ui.nodeError = null;
    try { await api("POST", `/api/v1/nodes/${encodeURIComponent(node)}/${verb}`, body); } catch (e) { ui.nodeError = e.message; render(); }
  }

  function label(node, text) {
    const set = {}, remove = [];
    for (const part of text.split(",").map((x) => x.trim()).filter(Boolean)) {
      if (part.startsWith("-")) remove.push(part.slice(1));
      else { const i = part.indexOf("="); set[i < 0 ? part : part.slice(0, i)] = i < 0 ? "" : part.slice(i + 1); }
    }
    nodeCall(node, "labels", { set, remove });
  }

  // -- replicas --------------------------------------------------------------------

  function replicas() {
    const r = state.replicas;
    if (r.error) return errorBox(r.error.message);
    const list = r.replicas || [];
    return h("div", {},
      h("h2", {}, "Replicas"),
      table(["Replica", "Model", "Node", "State", "GPUs", "Message", ""], list.map((x) => h("tr", { "data-replica": x.replica_id },
        h("td", { class: "mono" }, x.replica_id),
        h("td", {}, x.model),
        h("td", {}, x.node_id),
        h("td", {}, badge((x.state || "").replace("REPLICA_STATE_", "").toLowerCase())),
        h("td", {}, (x.gpu_indices || []).join(", ")),
        h("td", { class: "muted small" }, x.message),
        h("td", {}, h("button", { class: "ghost", onclick: () => logs(x.replica_id, x.node_id) }, "Logs")))),
      "No replicas."),
      (r.failures || []).length ? h("div", {}, h("h3", {}, "Backing off after failures"),
        table(["Model", "Failures", "Retry in", "Last error"], r.failures.map((f) => h("tr", {},
          h("td", {}, f.model), h("td", {}, String(f.failures)), h("td", {}, `${Math.round(f.retry_in_seconds)}s`),
          h("td", {}, h("pre", { class: "log small" }, f.last_error)))))) : null,
      ui.logs ? h("div", { class: "card", id: "logs" },
        h("div", { class: "toolbar" }, h("h3", {}, `Engine log of ${ui.logs.replica}`),
          h("div", {}, h("button", { class: "ghost", onclick: () => logs(ui.logs.replica, ui.logs.node) }, "Refresh"),
            h("button", { class: "ghost", onclick: () => { ui.logs = null; render(); } }, "Close"))),
        ui.logs.error ? errorBox(ui.logs.error) : h("pre", { class: "log" }, ui.logs.lines.join("\n") || "(empty)")) : null);
  }

  async function logs(replica, node) {
    try {
      const got = await api("GET", `/api/v1/replicas/${encodeURIComponent(replica)}/logs?lines=200&node_id=${encodeURIComponent(node)}`);
      ui.logs = { replica, node, lines: got.lines || [] };
    } catch (e) {
      ui.logs = { replica, node, error: e.message };
    }
    render();
  }

  // -- settings --------------------------------------------------------------------

  async function loadSettings() {
    try {
      const [current, history] = await Promise.all([
        api("GET", "/api/v1/settings"), api("GET", "/api/v1/settings/versions?limit=50")]);
      ui.settings = Object.assign(ui.settings || {}, { current, history: history.versions || [], loadError: null });
      if (ui.settings.text === undefined || !ui.settings.dirty) ui.settings.text = pretty(current.document);
    } catch (e) {
      ui.settings = Object.assign(ui.settings || {}, { loadError: e.message });
    }
    render();
  }

  function pretty(doc) {
    try { return JSON.stringify(JSON.parse(doc || "{}"), null, 2); } catch (e) { return doc; }
  }

  function settings() {
    const version = num(state.status.settings_version);
    if (!ui.settings || settingsSeen !== version) { settingsSeen = version; loadSettings(); }
    const s = ui.settings;
    if (!s || !s.current) return h("p", { class: "muted" }, s && s.loadError ? s.loadError : "Loading …");
    const selected = s.selected ? s.history.find((v) => v.version === s.selected) : null;
    return h("div", {},
      h("div", { class: "toolbar" }, h("h2", {}, `Cluster settings · version ${s.current.version}`),
        (s.current.restart_pending || []).length ? badge(`restart pending: ${s.current.restart_pending.join(", ")}`, "held") : null),
      h("div", { class: "split" },
        h("form", { class: "card", onsubmit: (ev) => { ev.preventDefault(); saveSettings(); } },
          h("h3", {}, "Edit"),
          h("p", { class: "muted" }, "Only the keys someone set (docs/settings.md). Saved as a new version; a concurrent change is refused."),
          h("textarea", { id: "settings-doc", rows: "16", spellcheck: "false", oninput: (ev) => { s.text = ev.target.value; s.dirty = true; } }, s.text),
          h("input", { id: "settings-reason", placeholder: "why (kept with the version)", value: s.reason || "", oninput: (ev) => { s.reason = ev.target.value; } }),
          s.error ? errorBox(s.error) : null,
          h("div", { class: "row" }, h("button", { class: "primary", type: "submit" }, "Save new version"),
            s.dirty ? h("button", { class: "ghost", type: "button", onclick: () => { s.text = pretty(s.current.document); s.dirty = false; s.error = null; render(); } }, "Discard") : null)),
        h("div", { class: "card" },
          h("h3", {}, "History"),
          table(["Version", "When", "Who", "Changed", ""], s.history.map((v) => h("tr", { class: v.version === s.selected ? "selected" : "", "data-version": v.version },
            h("td", { class: "nowrap" }, `v${v.version} `, v.in_force ? badge("in force", "ready") : null),
            h("td", { class: "small" }, ago(v.created_at)),
            h("td", { class: "small wrap who" }, v.author, v.reason ? h("div", { class: "muted" }, v.reason) : null),
            h("td", { class: "small" }, (v.changed || []).join(", ")),
            h("td", { class: "actions" },
              h("button", { class: "ghost", onclick: () => { s.selected = v.version; render(); } }, "Diff"),
              v.version !== s.current.version ? h("button", { class: "ghost", onclick: () => rollback(v.version) }, "Roll back") : null)))))),
      selected ? h("div", { class: "card", id: "diff" },
        h("div", { class: "toolbar" }, h("h3", {}, `Version ${selected.version} against the current version ${s.current.version}`),
          h("button", { class: "ghost", onclick: () => { s.selected = null; render(); } }, "Close")),
        diffView(pretty(selected.document), pretty(s.current.document))) : null);
  }

  async function saveSettings() {
    const s = ui.settings;
    s.text = $("settings-doc").value;
    try {
      await api("PUT", "/api/v1/settings", { document: s.text, if_version: String(s.current.version), author: "console", reason: s.reason || "" });
      s.dirty = false; s.error = null; s.reason = "";
    } catch (e) {
      s.error = `${e.code}: ${e.message}`;
      render();
    }
  }

  async function rollback(version) {
    const s = ui.settings;
    try {
      await api("POST", "/api/v1/settings/rollback", { version: String(version), if_version: String(s.current.version), author: "console", reason: `rollback to v${version}` });
      s.dirty = false; s.error = null;
    } catch (e) {
      s.error = `${e.code}: ${e.message}`;
      render();
    }
  }

  // A line diff (longest common subsequence): old version's lines against the current ones.
  function diffView(before, after) {
    const a = before.split("\n"), b = after.split("\n");
    const n = a.length, m = b.length;
    const lcs = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--)
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    const out = [];
    let i = 0, j = 0;
    while (i < n || j < m) {
      if (i < n && j < m && a[i] === b[j]) { out.push(h("div", { class: "same" }, "  " + a[i])); i++; j++; }
      else if (j < m && (i >= n || lcs[i][j + 1] >= lcs[i + 1][j])) { out.push(h("div", { class: "add" }, "+ " + b[j])); j++; }
      else { out.push(h("div", { class: "del" }, "- " + a[i])); i++; }
    }
    return h("pre", { class: "diff" }, out);
  }

  // -- keys ------------------------------------------------------------------------

  function keys() {
    const k = state.keys;
    if (k.error) return errorBox(k.error.message);
    const list = k.keys || [];
    return h("div", {},
      h("div", { class: "toolbar" }, h("h2", {}, "API keys")),
      ui.keySecret ? h("div", { class: "card secret", id: "key-secret" },
        h("h3", {}, `Key ${ui.keySecret.name || ui.keySecret.id} created`),
        h("p", {}, "Copy it now: it is shown once and stored nowhere (only its hash is kept)."),
        h("code", { class: "secret-value", id: "secret-value" }, ui.keySecret.secret),
        h("div", { class: "row" },
          h("button", { class: "ghost", onclick: () => navigator.clipboard && navigator.clipboard.writeText(ui.keySecret.secret) }, "Copy"),
          h("button", { class: "ghost", onclick: () => { ui.keySecret = null; render(); } }, "Done"))) : null,
      h("form", { class: "card", id: "key-form", onsubmit: (ev) => { ev.preventDefault(); createKey(ev.target); } },
        h("h3", {}, "Create a key"),
        h("div", { class: "fields" },
          field("Name", h("input", { name: "name", id: "key-name", placeholder: "ci-bot" })),
          field("Owner", h("input", { name: "owner", placeholder: "team or email" })),
          field("Models", h("input", { name: "models", placeholder: "all; or demo, llama" })),
          field("Requests / min", h("input", { name: "requests_per_minute", type: "number", min: "0", placeholder: "no limit" })),
          field("Tokens / min", h("input", { name: "tokens_per_minute", type: "number", min: "0", placeholder: "no limit" })),
          field("Expires after (s)", h("input", { name: "ttl_seconds", type: "number", min: "0", placeholder: "never" }))),
        ui.keyError ? errorBox(ui.keyError) : null,
        h("button", { class: "primary", type: "submit" }, "Create key")),
      table(["Key", "Owner", "Models", "Limits", "Created", "Expires", ""], list.map((x) => h("tr", { "data-key": x.name || x.id },
        h("td", {}, h("strong", {}, x.name || "(unnamed)"), h("div", { class: "mono muted small" }, `${x.id} · ${x.prefix}…`)),
        h("td", {}, x.owner),
        h("td", {}, (x.models || []).length ? x.models.join(", ") : h("span", { class: "muted" }, "all")),
        h("td", { class: "small" }, `${num(x.requests_per_minute) || "∞"} req/min · ${num(x.tokens_per_minute) || "∞"} tok/min`),
        h("td", { class: "small" }, ago(num(x.created))),
        h("td", { class: "small" }, num(x.expires) ? new Date(num(x.expires) * 1000).toLocaleString() : "never"),
        h("td", {}, h("button", { class: "ghost danger", onclick: () => revoke(x.id, x.name) }, "Revoke")))),
      "No keys. Routers with auth: keys refuse every request until one exists."));
  }

  function field(name, input) {
    return h("label", { class: "field" }, h("span", {}, name), input);
  }

  async function createKey(form) {
    ui.keyError = null;
    const v = (n) => form.elements[n].value.trim();
    const body = {
      name: v("name"), owner: v("owner"),
      models: v("models") ? v("models").split(",").map((x) => x.trim()).filter(Boolean) : [],
      requests_per_minute: v("requests_per_minute") || "0",
      tokens_per_minute: v("tokens_per_minute") || "0",
      ttl_seconds: v("ttl_seconds") || "0",
    };
    try {
      const got = await api("POST", "/api/v1/keys", body);
      ui.keySecret = { id: got.key.id, name: got.key.name, secret: got.secret };
      form.reset();
    } catch (e) {
      ui.keyError = `${e.code}: ${e.message}`;
    }
    render();
  }

  async function revoke(id, name) {
    if (!confirm(`Revoke key ${name || id}? Routers refuse it within a moment.`)) return;
    try { await api("DELETE", `/api/v1/keys/${encodeURIComponent(id)}`); } catch (e) { ui.keyError = e.message; render(); }
  }

  const VIEWS = { overview, models, nodes, replicas, settings, keys };

  // -- start -------------------------------------------------------------------------

  window.addEventListener("hashchange", route);
  $("view").addEventListener("focusout", () => setTimeout(() => { if (deferred) render(true); }, 0));
  $("login-form").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  fetch("/api/v1/session", { credentials: "same-origin" }).then(async (resp) => {
    if (resp.ok) { csrf = (await resp.json()).csrf_token; start(); }
    else showLogin(resp.status === 403 ? (await resp.json()).error.message : "");
  }, () => showLogin("The control plane does not answer."));
})();
