// A job's measurement activity, under its curve on the job page: the error breakdown with the latest messages,
// the timeline of measurement batches per worker, and its records one page at a time (filter by task and outcome).
// All three are paged or aggregated by the server, so a job of 20,000 records costs the browser one page of them.

import {get} from "../api.js";
import {timeline} from "../charts.js";
import {field, h, replace, section} from "../dom.js";
import {count, duration, latency, when} from "../format.js";
import {Pager, Table} from "../table.js";
import {badge, fail, show, slot} from "../ui.js";
import {TERMINAL} from "./jobs.js";

const REFRESH_MS = 3000; // while the job runs
const PAGE = 50;
const GROUPS = {build: "Build error", run: "Run error", timeout: "Timeout", wrong_answer: "Wrong answer"};
// how a record's kernel met the caches when it was timed (compiler.records.CACHE_CONDITIONS)
const CACHE_CONDITIONS = {"warm": "Warm", "cold-weights": "Weights cold", "flushed": "Caches flushed"};
const BATCH_STATES = ["sent", "running", "done", "lost", "failed", "cancelled"];

function taskLabel(position, tasks) {
  if (position === null || position === undefined) return "—";
  const task = tasks.find((t) => t.position === position);
  return task?.name ? `${position} · ${task.name}` : String(position);
}

/** The record's error group as a badge, with the stored code beside it when it says more (build_timeout). */
function outcome(record) {
  if (!record.error) return badge("ok");
  const group = record.group || record.error;
  return h("span", {}, badge(group), group === record.error ? null : h("small", {class: "muted"}, ` ${record.error}`));
}

function errorBreakdown(data, tasks) {
  const failed = Object.values(data.counts).reduce((a, b) => a + b, 0);
  const total = failed + data.ok;
  const rows = [...Object.entries(GROUPS).map(([group, label]) => [group, label, data.counts[group] || 0]),
    ["ok", "No error", data.ok]];
  const list = h("dl", {class: "breakdown"}, rows.flatMap(([group, label, n]) => [
    h("dt", {}, badge(group === "ok" ? "ok" : group), " ", label),
    h("dd", {}, h("meter", {min: 0, max: Math.max(total, 1), value: n, "aria-label": `${label}: ${n}`}),
      ` ${count(n)}${total ? ` (${((100 * n) / total).toFixed(1)} %)` : ""}`),
  ]));
  const latest = new Table([
    {key: "record_id", label: "Record", numeric: true},
    {key: "task", label: "Task", cell: (r) => taskLabel(r.task, tasks)},
    {key: "group", label: "Kind", cell: (r) => badge(r.group)},
    {key: "error", label: "Error"},
    {key: "error_message", label: "Message", cell: (r) => h("span", {class: "message", title: r.error_message},
      r.error_message || "—")},
    {key: "timestamp", label: "When", cell: (r) => when(new Date(r.timestamp * 1000).toISOString())},
  ], {caption: "Latest errors", empty: "No errors."});
  latest.update(data.latest);
  return [h("p", {}, `${count(failed)} of ${count(total)} measurements failed.`), list, latest.wrapper];
}

function batchTimeline({batches, total}) {
  const time = (iso) => (iso ? Date.parse(iso) / 1000 : null);
  const now = Date.now() / 1000;
  const workers = new Set(batches.filter((b) => b.worker).map((b) => b.worker));
  const lanes = [...new Set(batches.map((b) => b.worker || "(not taken yet)"))].sort();
  const bars = batches.map((b) => {
    const queued = time(b.sent_at), start = time(b.started_at) ?? queued;
    const end = time(b.finished_at) ?? (b.state === "sent" || b.state === "running" ? now : start);
    const errors = b.errors ? Object.entries(b.errors).map(([k, v]) => `${k} ${v}`).join(", ") : "";
    const title = `batch ${String(b.id).slice(0, 8)} · task ${b.task ?? "—"} · ${b.size} candidates · ${b.state}` +
      `${b.try_number > 1 ? ` · try ${b.try_number}` : ""} · ${duration(end - start)}${errors ? ` · ${errors}` : ""}`;
    return {lane: b.worker || "(not taken yet)", queued, start, end, state: b.state, title};
  });
  const shown = total > batches.length ? `the latest ${count(batches.length)} of ${count(total)}` : count(batches.length);
  return [h("p", {}, `${shown} batches on ${workers.size} worker${workers.size === 1 ? "" : "s"}.`),
    timeline(lanes, bars, {label: "Timeline of measurement batches per worker", xFormat: duration,
      states: BATCH_STATES})];
}

class RecordsBrowser {
  constructor(jobId, view) {
    this.jobId = jobId;
    this.view = view;
    this.tasks = [];
    this.asked = 0;
    this.taskSelect = h("select", {name: "task", onchange: () => this.refilter()}, h("option", {value: ""}, "All tasks"));
    this.errorSelect = h("select", {name: "error", onchange: () => this.refilter()},
      [["", "Any outcome"], ["ok", "No error"], ["failed", "Any error"], ...Object.entries(GROUPS)]
        .map(([value, label]) => h("option", {value}, label)));
    this.orderSelect = h("select", {name: "order", onchange: () => this.refilter()},
      [["-id", "Newest first"], ["id", "Oldest first"], ["latency", "Fastest first"]]
        .map(([value, label]) => h("option", {value}, label)));
    this.pager = new Pager(PAGE, () => this.load(), "Record pages");
    this.table = new Table([
      {key: "id", label: "Record", numeric: true},
      {key: "task", label: "Task", cell: (r) => taskLabel(r.task, this.tasks)},
      {key: "mean_cost", label: "Latency", numeric: true, cell: (r) => latency(r.mean_cost)},
      {key: "cache", label: "Timed", cell: (r) => CACHE_CONDITIONS[r.cache] || r.cache},
      {key: "error", label: "Outcome", cell: outcome},
      {key: "error_message", label: "Message", cell: (r) => h("span", {class: "message", title: r.error_message},
        r.error_message || "—")},
      {key: "build_seconds", label: "Build", numeric: true, cell: (r) => duration(r.build_seconds)},
      {key: "run_seconds", label: "Run", numeric: true, cell: (r) => duration(r.run_seconds)},
      {key: "timestamp", label: "Measured", cell: (r) => when(new Date(r.timestamp * 1000).toISOString())},
      {key: "created_by", label: "By"},
    ], {caption: "Records of this job", empty: "No records match."});
    this.body = slot("the records");
    this.element = section("Records",
      h("div", {class: "filters"}, field("Task", this.taskSelect), field("Outcome", this.errorSelect),
        field("Order", this.orderSelect)),
      this.body);
  }

  setTasks(tasks) {
    if (tasks.length === this.tasks.length) return;
    this.tasks = tasks;
    const chosen = this.taskSelect.value;
    replace(this.taskSelect, h("option", {value: ""}, "All tasks"),
      tasks.map((t) => h("option", {value: String(t.position)}, taskLabel(t.position, tasks))));
    this.taskSelect.value = chosen;
  }

  refilter() {
    this.pager.reset();
    this.load();
  }

  async load() {
    const query = {offset: this.pager.offset, limit: PAGE, task: this.taskSelect.value,
      error: this.errorSelect.value, order: this.orderSelect.value};
    const asked = ++this.asked; // a slower answer to an older query (a refresh, the last filter) must not win
    try {
      const page = await get(`jobs/${this.jobId}/records`, query, {signal: this.view.signal});
      if (asked !== this.asked) return;
      this.table.update(page.records);
      this.pager.update(page.total);
      if (!this.body.contains(this.table.wrapper)) show(this.body, this.table.wrapper, this.pager.element);
    } catch (error) {
      if (error.name !== "AbortError" && asked === this.asked) fail(this.body, "the records", error);
    }
  }
}

/**
 * The three sections for job `jobId`: `elements` to place, `update(job)` with each new job object (the first one
 * starts the loading; they reload every REFRESH_MS while the job runs and once more as soon as it ends), `stop(reason)`
 * when the job itself cannot be loaded.
 */
export function activity(view, jobId) {
  const errors = slot("the error breakdown");
  const batches = slot("the batch timeline");
  const records = new RecordsBrowser(jobId, view);
  let job = null, loadedKey = null, refresh = null;

  const loadErrors = () => get(`jobs/${jobId}/errors`, {latest: 20}, {signal: view.signal}).then(
    (data) => show(errors, ...errorBreakdown(data, job?.tasks || [])),
    (error) => error.name !== "AbortError" && fail(errors, "the error breakdown", error));
  const loadBatches = () => get(`jobs/${jobId}/batches`, {limit: 2000}, {signal: view.signal}).then(
    (data) => show(batches, ...batchTimeline(data)),
    (error) => error.name !== "AbortError" && fail(batches, "the batch timeline", error));

  const key = () => `${job.state}:${job.trials_done}`;
  const final = () => TERMINAL.includes(job.state) && key() === loadedKey;
  function start() {
    refresh = view.every(REFRESH_MS, async () => {
      if (final()) return; // final already
      loadedKey = key();
      await Promise.all([loadErrors(), loadBatches(), records.load()]);
    });
  }

  return {
    elements: [section("Errors", errors), section("Measurement batches", batches), records.element],
    update(next) {
      job = next;
      records.setTasks(job.tasks);
      if (!refresh) start();
      else if (TERMINAL.includes(job.state) && !final()) refresh.now(); // the job ended: its last round at once
    },
    stop(reason) {
      for (const s of [errors, batches, records.body]) fail(s, "this job's activity", {message: reason});
    },
  };
}
