// One job: its summary, the convergence plot (estimated end-to-end latency against trials or wall time), the
// per-task table (sortable; a click shows that task's own curve), and below them the measurement activity
// (job-activity.js). While the job runs, server-sent events bring the job and its new points; the page never
// reloads and never fetches more than a page of records.

import {eventsUrl, get} from "../api.js";
import {lineChart} from "../charts.js";
import {h, message, replace, section} from "../dom.js";
import {count, duration, flops, gflops, latency, shortHost, targetKind, weight, when} from "../format.js";
import {Table} from "../table.js";
import {badge, errorText, fail, link, pageHeader, show, slot} from "../ui.js";
import {activity} from "./job-activity.js";
import {TERMINAL, elapsed, jobActions} from "./jobs.js";

export const title = "Job";
const POLL_MS = 2500; // the fallback when the event stream cannot be opened
const X_MODES = {
  trials: {label: "Trials", axis: "trials measured", x: (p) => p.trials, format: (v) => count(Math.round(v))},
  time: {label: "Wall time", axis: "wall time", x: (p) => p.elapsed_s, format: (v) => duration(v)},
};

/** A log y axis once the curve spans more than a decade, so the late improvements stay visible. */
function wantsLog(values) {
  const finite = values.filter((v) => Number.isFinite(v) && v > 0);
  return finite.length > 1 && Math.max(...finite) / Math.min(...finite) > 10;
}

function curve(points, mode, y, name, className) {
  const pts = points.map((p) => [X_MODES[mode].x(p), y(p)]).filter(([, v]) => v !== null && v !== undefined);
  return {name, className, points: pts};
}

function summary(job) {
  const facts = [
    ["Model", link(`#/models/${job.model_id}`, job.model_name)],
    ["Target", `${job.target} (${targetKind(job)})`],
    ["Host", h("span", {title: job.host}, shortHost(job.host))],
    ["Trials", `${count(job.trials_done)} / ${count(job.trials)}`],
    ["Best est. latency", latency(job.estimated_latency_s)],
    ["Elapsed", duration(elapsed(job))],
    ["Per round", String(job.per_round)],
    ["Attempt", String(job.attempt)],
    ["Search worker", job.worker || "—"],
    ["Created", when(job.created_at)],
  ];
  return h("dl", {class: "facts"}, facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

const TASK_COLUMNS = [
  {key: "position", label: "ID", numeric: true},
  {key: "name", label: "Name"},
  {key: "flops", label: "FLOP", numeric: true, cell: (t) => flops(t.flops)},
  {key: "weight", label: "Weight", numeric: true, cell: (t) => weight(t.weight)},
  {key: "gflops", label: "GFLOP/s", numeric: true, cell: (t) => gflops(t.gflops)},
  {key: "latency_s", label: "Latency", numeric: true, cell: (t) => latency(t.latency_s)},
  {key: "weighted_latency_s", label: "Weighted latency", numeric: true, cell: (t) => latency(t.weighted_latency_s)},
  {key: "trials", label: "Trials", numeric: true},
  {key: "done", label: "Done", value: (t) => (t.done ? 1 : 0), cell: (t) => (t.done ? "yes" : "no")},
];

export function render(root, view, id) {
  const jobId = Number(id);
  const state = {job: null, points: [], mode: "trials", task: null};
  const report = h("div", {class: "report"});
  const head = h("div", {class: "job-head"});
  const facts = slot("the job");
  const plot = slot("the convergence plot", {class: "slot plot", "aria-label": "Convergence plot"});
  const taskPlot = h("div", {class: "task-plot"});
  const tasksSlot = slot("the tasks");
  const tasks = new Table(TASK_COLUMNS, {caption: "Per-task table (click a row for its convergence)", sortable: true,
    rowKey: (t) => t.position, onSelect: (t) => { state.task = t.position; drawTaskPlot(); },
    empty: "No tasks yet."});
  const toggles = Object.entries(X_MODES).map(([mode, m]) => h("button", {type: "button", class: "toggle",
    "aria-pressed": String(mode === state.mode), onclick: () => setMode(mode)}, `vs ${m.label.toLowerCase()}`));

  root.append(
    pageHeader(`Job ${jobId}`, head),
    report,
    facts,
    section("Convergence", h("div", {class: "toggles", role: "group", "aria-label": "x axis"}, toggles), plot,
      taskPlot),
    section("Tasks", tasksSlot),
  );
  const work = activity(view, jobId);
  root.append(...work.elements);

  function setMode(mode) {
    state.mode = mode;
    toggles.forEach((b, i) => b.setAttribute("aria-pressed", String(Object.keys(X_MODES)[i] === mode)));
    drawPlot();
    drawTaskPlot();
  }

  function drawPlot() {
    const m = X_MODES[state.mode];
    const series = [curve(state.points, state.mode, (p) => p.estimated_latency_s, "Estimated end-to-end latency",
      "series-0")];
    show(plot, lineChart(series, {label: `Convergence of job ${jobId}: estimated latency vs ${m.axis}`,
      xLabel: m.axis, yLabel: "estimated latency", xFormat: m.format, yFormat: latency, step: true,
      log: wantsLog(series[0].points.map((p) => p[1])),
      empty: "No round has finished yet: the curve starts after the first one."}));
  }

  function drawTaskPlot() {
    if (state.task === null) {
      replace(taskPlot, h("p", {class: "muted"}, "Click a task in the table below to see its own convergence."));
      return;
    }
    const task = (state.job?.tasks || []).find((t) => t.position === state.task);
    const m = X_MODES[state.mode];
    const series = [curve(state.points, state.mode, (p) => p.task_best?.[state.task] ?? null,
      `Task ${state.task}: best latency`, "series-1")];
    replace(taskPlot, h("h3", {}, `Task ${state.task}${task?.name ? `: ${task.name}` : ""}`),
      lineChart(series, {label: `Convergence of task ${state.task}`, xLabel: m.axis, yLabel: "best latency",
        xFormat: m.format, yFormat: latency, step: true, log: wantsLog(series[0].points.map((p) => p[1])),
        height: 240, empty: "This task has no valid measurement yet."}));
  }

  function merge(progress) {
    state.job = progress.job;
    const last = state.points.length ? state.points[state.points.length - 1].id : 0;
    const fresh = progress.points.filter((p) => p.id > last);
    if (fresh.length) state.points = state.points.concat(fresh);
    replace(head, badge(state.job.state), jobActions(state.job, report, (updated) => merge({job: updated,
      points: []})));
    show(facts, summary(state.job),
      state.job.error_message ? message(state.job.error_message, state.job.state === "failed" ? "error" : "info")
        : null,
      state.job.note ? message(state.job.note, "info") : null);
    tasks.update(state.job.tasks);
    if (!tasksSlot.contains(tasks.wrapper)) show(tasksSlot, tasks.wrapper);
    if (fresh.length || plot.getAttribute("aria-busy") !== "false") {
      drawPlot();
      drawTaskPlot();
    }
    work.update(state.job);
  }

  const lastPoint = () => (state.points.length ? state.points[state.points.length - 1].id : 0);

  function pollProgress() {
    view.every(POLL_MS, async () => {
      if (state.job && TERMINAL.includes(state.job.state)) return;
      merge(await get(`jobs/${jobId}/progress`, {after: lastPoint()}, {signal: view.signal}));
    });
  }

  async function stream() {
    let address;
    try {
      address = await eventsUrl(jobId, lastPoint(), {signal: view.signal});
    } catch (error) {
      if (error.name !== "AbortError" && view.open) pollProgress(); // (a 401 has gone to the login page already)
      return;
    }
    if (!view.open) return;
    const events = new EventSource(address);
    let opened = false;
    view.onClose(() => events.close());
    events.addEventListener("open", () => (opened = true));
    events.addEventListener("progress", (e) => view.open && merge(JSON.parse(e.data)));
    events.addEventListener("end", () => events.close()); // the job is over: the last progress came before
    events.addEventListener("error", () => {
      // a dropped connection reconnects by itself (Last-Event-ID) with the same URL; once its ticket has expired
      // that is refused and the stream closes: a stream that had opened starts again with a new ticket, one that
      // never opened (a 404) falls back to polling
      if (events.readyState !== EventSource.CLOSED || !view.open) return;
      if (opened) stream();
      else pollProgress();
    });
  }

  get(`jobs/${jobId}/progress`, undefined, {signal: view.signal}).then((progress) => {
    if (!view.open) return;
    merge(progress);
    if (!TERMINAL.includes(progress.job.state)) stream();
  }, (error) => {
    if (error.name === "AbortError") return;
    for (const s of [facts, plot, tasksSlot]) fail(s, error.status === 404 ? "this job" : "the job", error);
    work.stop(errorText(error));
  });
}
