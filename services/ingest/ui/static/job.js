/* The job page's charts, drawn by uPlot (vendor/): the training loss and the task score on one
   step axis with the best checkpoint marked, and the attempts on a time axis by provider. The
   page polls /ui/jobs/<id>/progress (only what is newer than it has, after the first look) until
   the job has ended. window.tuneloop holds the charts and their data for a person or a test. */
(function () {
  "use strict";
  const POLL_MS = 2000;
  const COLORS = { loss: "#1f77b4", score: "#d62728", best: "#2ca02c" };
  const PROVIDER_COLORS = ["#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f"];
  const progressEl = document.getElementById("progress");
  if (!progressEl) return;
  const attemptsEl = document.getElementById("attempts");
  const url = progressEl.dataset.progressUrl;
  const state = {
    loss: new Map(), score: new Map(), best: null, newest: null, facts: [], job: null, polls: 0,
  };
  const charts = {};
  window.tuneloop = { charts: charts, state: state };

  function text(id, value) {
    const el = document.getElementById(id);
    if (el) el.textContent = value;
  }

  function width(el) {
    return Math.max(320, (el.clientWidth || 800) - 8);
  }

  // --- loss and task score -----------------------------------------------------------------

  function progressData() {
    const scores = state.score;
    const steps = Array.from(new Set([...state.loss.keys(), ...scores.keys()]));
    steps.sort((a, b) => a - b);
    const value = (map, step) => (map.has(step) ? map.get(step) : null);
    return [
      steps,
      steps.map((s) => value(state.loss, s)),
      steps.map((s) => value(scores, s)),
      steps.map((s) => (s === state.best ? value(scores, s) : null)),
    ];
  }

  function progressChart() {
    const opts = {
      width: width(progressEl),
      height: 320,
      scales: { x: { time: false }, loss: { auto: true }, score: { range: [0, 1] } },
      axes: [
        { label: "step" },
        { scale: "loss", label: "training loss", stroke: COLORS.loss },
        { scale: "score", label: "task score", side: 1, stroke: COLORS.score, grid: { show: false } },
      ],
      series: [
        { label: "step" },
        { label: "training loss", scale: "loss", stroke: COLORS.loss, width: 2, spanGaps: true,
          points: { show: false } },
        { label: "task score", scale: "score", stroke: COLORS.score, width: 2, spanGaps: true,
          points: { show: true, size: 8, fill: COLORS.score } },
        { label: "best checkpoint", scale: "score", stroke: COLORS.best, paths: () => null,
          points: { show: true, size: 16, width: 3, fill: COLORS.best } },
      ],
    };
    return new uPlot(opts, progressData(), progressEl);
  }

  // --- attempts ----------------------------------------------------------------------------

  function attempts() {
    const byNumber = new Map();
    for (const fact of state.facts) {
      byNumber.set(fact.number, Object.assign(byNumber.get(fact.number) || {}, fact));
    }
    const list = Array.from(byNumber.values()).sort((a, b) => a.number - b.number);
    list.forEach((attempt, i) => {
      if (attempt.ended_at != null) return;
      const next = list[i + 1];
      if (next && next.started_at != null) {
        attempt.ended_at = next.started_at;
        attempt.outcome = attempt.outcome || "ended";
      } else if (state.job && state.job.terminal) {
        attempt.ended_at = state.job.finished_at;
        attempt.outcome = state.job.status;
      }
    });
    return list.filter((a) => a.started_at != null);
  }

  function attemptsData(list, providers) {
    const now = Date.now() / 1000;
    const times = new Set();
    list.forEach((a) => { times.add(a.started_at); times.add(a.ended_at != null ? a.ended_at : now); });
    const xs = Array.from(times).sort((a, b) => a - b);
    const lanes = list.map((a) => {
      const end = a.ended_at != null ? a.ended_at : now;
      const lane = providers.indexOf(a.provider);
      return xs.map((t) => (t === a.started_at || t === end ? lane : null));
    });
    return [xs, ...lanes];
  }

  function drawAttempts() {
    const list = attempts();
    renderAttemptTable(list);
    if (charts.attempts) { charts.attempts.destroy(); delete charts.attempts; }
    if (!list.length) { attemptsEl.textContent = "No attempt has started yet."; return; }
    attemptsEl.textContent = "";
    const providers = Array.from(new Set(list.map((a) => a.provider)));
    const series = [{ label: "time" }, ...list.map((a) => ({
      label: "attempt " + a.number + " (" + a.provider + ")",
      stroke: PROVIDER_COLORS[providers.indexOf(a.provider) % PROVIDER_COLORS.length],
      width: 12, spanGaps: true, points: { show: false },
    }))];
    const opts = {
      width: width(attemptsEl),
      height: 60 + 40 * providers.length,
      scales: { y: { range: [-0.5, providers.length - 0.5] } },
      axes: [
        {},
        { size: 90, splits: () => providers.map((_, i) => i), values: () => providers },
      ],
      series: series,
    };
    charts.attempts = new uPlot(opts, attemptsData(list, providers), attemptsEl);
  }

  function renderAttemptTable(list) {
    const body = document.querySelector("#attempt-table tbody");
    if (!body) return;
    body.replaceChildren(...list.map((a) => {
      const row = document.createElement("tr");
      const cells = [a.number, a.provider, when(a.started_at), when(a.ended_at),
        a.outcome || "running"];
      for (const value of cells) {
        const cell = document.createElement("td");
        cell.textContent = String(value);
        row.appendChild(cell);
      }
      return row;
    }));
  }

  function when(unix) {
    return unix == null ? "–" : new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  // --- polling -----------------------------------------------------------------------------

  function merge(p) {
    if (!p.complete && state.newest) {  // older events were left out: start over
      state.loss.clear(); state.score.clear(); state.facts = []; state.newest = null;
      return false;
    }
    for (const [step, loss] of p.loss) state.loss.set(step, loss);
    for (const [step, score] of p.score) state.score.set(step, score);
    state.facts.push(...p.attempts);
    state.best = p.best_step;
    state.newest = p.newest_event || state.newest;
    state.job = p;
    return true;
  }

  function addMessages(messages) {
    const body = document.querySelector("#events tbody");
    if (!body || !messages.length) return;
    const rows = messages.map((m) => {
      const row = document.createElement("tr");
      row.className = "level-" + m.level;
      for (const value of [when(m.created_at), m.level, m.message]) {
        const cell = document.createElement("td");
        cell.textContent = String(value);
        row.appendChild(cell);
      }
      return row;
    });
    body.prepend(...rows);
  }

  function show(p, first) {
    text("job-status", p.status);
    text("fine-tuned-model", p.fine_tuned_model || "–");
    text("gate", p.gate || "–");
    text("finished", when(p.finished_at));
    if (!first) addMessages(p.messages);  // the page came with the ones before
    document.getElementById("job-status").className = "status status-" + p.status;
    text("best-step", p.best_step == null ? "–" : String(p.best_step));
    if (charts.progress) charts.progress.setData(progressData());
    else charts.progress = progressChart();
    drawAttempts();
    progressEl.dataset.points = String(state.loss.size) + "/" + String(state.score.size);
    progressEl.dataset.state = p.terminal ? "ended" : "live";
  }

  async function poll() {
    state.polls += 1;
    let next = POLL_MS;
    try {
      const query = state.newest ? "?since=" + encodeURIComponent(state.newest) : "";
      const answer = await fetch(url + query, {
        headers: { Accept: "application/json" }, credentials: "same-origin",
      });
      if (answer.status === 401) { window.location.assign("/ui/sign-in"); return; }
      const body = await answer.json();
      if (!answer.ok) throw new Error(body.detail || answer.statusText);
      const first = state.newest === null;
      if (!merge(body)) { next = 0; } else {
        show(body, first);
        if (body.terminal) return;
      }
    } catch (error) {
      text("progress-note", "Could not update: " + error.message + " (retrying)");
    }
    window.setTimeout(poll, next);
  }

  poll();
})();
